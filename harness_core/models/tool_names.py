"""Provider-safe tool names: a harness tool's name on the wire, and the model's calls back (D209).

OpenAI (Chat Completions, Responses) and Anthropic accept only tool names matching
``^[a-zA-Z0-9_-]{1,64}$``; harness tools may be named anything (an MCP tool is
``<server>.<tool>``). `wire_name` is a pure function of the name, so a history is encoded the
same on every request whatever the tool table is then: a valid name stays as it is, any other
becomes its sanitized form (each other character an underscore, cut to fit) plus an underscore
and ten hex digits of the name's SHA-256, within 64 characters. Two names that sanitize alike
differ in their hash. `ToolNames` is one request's table, to read the model's calls back.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping

__all__ = ["MAX_WIRE_NAME", "ToolNameClash", "ToolNames", "is_wire_safe", "wire_name"]

MAX_WIRE_NAME = 64
"""The longest tool name every supported provider accepts."""

_SAFE = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_UNSAFE_CHAR = re.compile(r"[^a-zA-Z0-9_-]")
_HASH_DIGITS = 10


def is_wire_safe(name: str) -> bool:
    """Whether every supported provider takes `name` as it is."""
    return _SAFE.fullmatch(name) is not None


def wire_name(name: str) -> str:
    """The name `name` has on the wire: itself when safe, else sanitized plus a short hash."""
    if is_wire_safe(name):
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_DIGITS]
    stem = _UNSAFE_CHAR.sub("_", name)[: MAX_WIRE_NAME - _HASH_DIGITS - 1]
    return f"{stem}_{digest}"


class ToolNameClash(ValueError):
    """Two tools of one request would have the same wire name."""


class ToolNames:
    """One request's tools by wire name: decodes the model's tool calls to harness names.

    Raises:
        ToolNameClash: two distinct names share a wire name (only a safe name shaped exactly
            like another's encoding, hash included, can do that).
    """

    def __init__(self, names: Iterable[str]) -> None:
        self._harness: dict[str, str] = {}
        for name in names:
            wire = wire_name(name)
            known = self._harness.setdefault(wire, name)
            if known != name:
                raise ToolNameClash(
                    f"tools {known!r} and {name!r} would both be called {wire!r} by the model"
                )

    @classmethod
    def from_encoded(cls, encoded: Mapping[str, str]) -> ToolNames:
        """The table again from `encoded` (wire name -> harness name, as kept in a handle)."""
        table = cls(())
        table._harness = dict(encoded)
        return table

    def decode(self, wire: str) -> str:
        """The harness name the model meant; a name not in the table passes through unchanged."""
        return self._harness.get(wire, wire)

    @property
    def encoded(self) -> dict[str, str]:
        """Wire name -> harness name, only for the names that changed on the wire."""
        return {wire: name for wire, name in self._harness.items() if wire != name}
