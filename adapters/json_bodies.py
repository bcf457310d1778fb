"""What a channel's JSON request body did wrong, in one plain line (the web and webhook routes)."""

from __future__ import annotations

from collections.abc import Container

from pydantic import ValidationError

__all__ = ["body_problem", "text_problem"]


def body_problem(exc: ValidationError, *, pattern: str, skip: Container[str] = ()) -> str:
    """The body's most specific error, named plainly (``'text' is required``).

    `pattern`: how a field with a pattern is described when it does not match; `skip`: parts
    of an error's location that are not the body's own names (a union's tags).
    """
    first = max(exc.errors(), key=lambda e: len(e["loc"]))  # in a union: the furthest branch
    parts = [p for p in first["loc"] if not (isinstance(p, str) and p in skip)]
    where = ".".join(str(part) for part in parts) or "body"
    if first["type"] == "extra_forbidden":
        return f"unknown field {where!r}"
    if first["type"] == "missing":
        return f"{where!r} is required"
    if first["type"] == "string_pattern_mismatch":
        return f"{where!r} must be {pattern}"
    return f"{where!r}: {first['msg']}"


def text_problem(value: str, what: str) -> str | None:
    """Why no store should hold `value` (NUL characters, unpaired surrogates), or None."""
    if "\x00" in value:
        return f"{what} must not contain NUL characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return f"{what} is not valid Unicode text"
    return None
