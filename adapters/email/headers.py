"""`POLICY`: the email package's modern policy, with a bounded cost for any header a mail carries.

Python's structured header parser (addresses, ``Content-Type`` and its parameters, dates) is
quadratic in the defects a header holds: 20 KB of ``;`` in a ``Content-Type`` took 12 s to
read, 100 KB 8 minutes, 100 KB of commas in ``From`` 99 s, and the policy parses a header again
at every access (a part's type is asked for several times, ``From`` three). One such mail held
up every mail after it, and decoding its attachments froze the event loop (an outside probe).

Here a structured header longer than `MAX_STRUCTURED_CHARS` is kept as written, as text: the
string methods every reader here uses (`Message.get_content_type`, `get_param`,
`get_filename`, `email.utils.getaddresses`) read it in linear time, with the same results for
well-formed values. A parsed structured header is kept for the next access of the same text.
"""

from __future__ import annotations

import functools
from email import policy
from email.headerregistry import BaseHeader, HeaderRegistry, UnstructuredHeader
from typing import Any

__all__ = ["MAX_STRUCTURED_CHARS", "POLICY", "eight_bit"]

MAX_STRUCTURED_CHARS = 512
"""Past this, a structured header is read as written (at 512 characters, the worst a hostile
value costs the structured parser is about 2 ms; well-formed ones are far shorter, except long
``To``/``Cc`` lists, which `getaddresses` reads as well)."""


class _AsWritten(UnstructuredHeader):
    """A structured header too long to parse: its value as the sender wrote it."""

    @classmethod
    def parse(cls, value: str, kwds: dict[str, Any]) -> None:
        """The value itself, not decoded: a display name's encoded comma stays inside it."""
        super().parse(value, kwds)
        kwds["decoded"] = value


class _Bounded(HeaderRegistry):
    """The default registry, with long structured values read as written, and reuse."""

    def __init__(self) -> None:
        super().__init__()
        self._as_written = type("AsWrittenHeader", (_AsWritten, BaseHeader), {})

    def __call__(self, name: str, value: str) -> Any:
        """The header `name` with `value` (a long structured one as written)."""
        value = eight_bit(value)
        structured = self.registry.get(name.lower(), self.default_class)
        if structured is self.default_class:
            return super().__call__(name, value)  # unstructured: linear already
        if len(value) > MAX_STRUCTURED_CHARS:
            return self._as_written(name, value)
        return _parsed(self, name, value)


def eight_bit(value: str) -> str:
    """`value` with raw 8-bit bytes (lone surrogates as the parser gives them) as text.

    Read as UTF-8, else as Windows-1252, as a body's undeclared 8-bit text is for Latin
    scripts (D335); the parser made each such byte U+FFFD, so a Latin-1 ``Subject: Café``
    was answered as ``Re: Caf\ufffd`` (an outside probe).
    """
    if not any("\udc80" <= char <= "\udcff" for char in value):
        return value
    raw = value.encode("utf-8", "surrogateescape")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("cp1252", "replace")


@functools.lru_cache(maxsize=1024)
def _parsed(registry: HeaderRegistry, name: str, value: str) -> Any:
    # header objects are immutable strings: one parse serves every access to the same text
    return HeaderRegistry.__call__(registry, name, value)


POLICY = policy.default.clone(header_factory=_Bounded())
"""`email.policy.default` with the bounded header registry."""
