"""What a channel's JSON request body did wrong, in one plain line (the web and webhook routes)."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Container, Mapping
from typing import Any, Literal, Protocol

from pydantic import ValidationError

from harness_core.session.records import MAX_SUPPLIED_CHARS

__all__ = [
    "SuppliedDecision",
    "blank",
    "body_problem",
    "read_json",
    "result_problem",
    "text_problem",
]

_BOM = b"\xef\xbb\xbf"
_KEY_TWICE = "the request body gives a key twice in one object"


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise ValueError(_KEY_TWICE)
    return found


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def read_json(body: bytes) -> Any:
    """`body` as strict JSON.

    UTF-8 (a leading byte-order mark is ignored, as RFC 8259 §8.1 allows), no NaN or Infinity,
    and no key given twice in one object. Two values for one key would be read as the last by
    this gateway and as the first by another reader of the same bytes (a proxy's filter):
    refusing them leaves one meaning (RFC 8259 §4 leaves duplicate names to the reader).

    Raises:
        ValueError: why `body` is not such JSON, in one plain line.
    """
    try:
        text = body.removeprefix(_BOM).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the request body is not UTF-8") from None
    try:
        return json.loads(text, object_pairs_hook=_unique, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("the request body is nested too deep") from None
    except ValueError as exc:
        if str(exc) == _KEY_TWICE:
            raise
        raise ValueError("the request body is not valid JSON") from None


def body_problem(
    exc: ValidationError, *, pattern: str | Mapping[str, str], skip: Container[str] = ()
) -> str:
    """The body's most specific error, named plainly (``'text' is required``).

    `pattern`: how a field with a pattern is described when it does not match (by the field's
    name, ``""`` for the rest); `skip`: parts of an error's location that are not the body's
    own names (a union's tags).
    """
    first = max(exc.errors(), key=lambda e: len(e["loc"]))  # in a union: the furthest branch
    parts = [p for p in first["loc"] if not (isinstance(p, str) and p in skip)]
    where = ".".join(str(part) for part in parts) or "body"
    if first["type"] == "extra_forbidden":
        return f"unknown field {where!r}"
    if first["type"] == "missing":
        return f"{where!r} is required"
    if first["type"] == "string_pattern_mismatch":
        if not isinstance(pattern, str):
            field = str(parts[-1]) if parts else ""
            pattern = pattern.get(field, pattern[""])
        return f"{where!r} must be {pattern}"
    return f"{where!r}: {first['msg']}"


def blank(value: str) -> bool:
    """Whether `value` shows nothing: only spaces, controls and invisible format characters.

    ``str.strip`` keeps a zero-width space, a joiner or a byte-order mark: a text of those is
    as empty to the person reading the thread (and to the model) as one of spaces.
    """
    return all(char.isspace() or unicodedata.category(char) in ("Cc", "Cf") for char in value)


def text_problem(value: str, what: str) -> str | None:
    """Why no store should hold `value` (NUL characters, unpaired surrogates), or None."""
    if "\x00" in value:
        return f"{what} must not contain NUL characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return f"{what} is not valid Unicode text"
    return None


class SuppliedDecision(Protocol):
    """The part of a decision that may carry the result of an action its sender did (D263)."""

    approved: bool
    result: str | None
    is_error: bool


def result_problem(
    item: SuppliedDecision,
) -> tuple[Literal["invalid_request", "empty_text", "text_too_long", "invalid_text"], str] | None:
    """Why a decision's supplied result is refused (its code and line), or None.

    A result goes with ``approved: true``, ``is_error`` goes with a result, and the result is
    non-blank text of at most `MAX_SUPPLIED_CHARS` characters that a store can hold.
    """
    if item.result is None:
        return ("invalid_request", "'is_error' goes with a 'result'") if item.is_error else None
    if not item.approved:
        return "invalid_request", "a 'result' goes with approved: true"
    if blank(item.result):
        return "empty_text", "'result' is empty: say what the action did"
    if len(item.result) > MAX_SUPPLIED_CHARS:
        return (
            "text_too_long",
            f"'result' has {len(item.result)} characters; at most {MAX_SUPPLIED_CHARS} are "
            "accepted",
        )
    if (problem := text_problem(item.result, "'result'")) is not None:
        return "invalid_text", problem
    return None
