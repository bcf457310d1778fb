"""Numbers from outside (headers, query strings, cursors): ASCII digits, bounded before read.

``str.isdigit`` takes ``²`` and ``٣``, which ``int()`` refuses, and ``int()`` raises past 4,300
digits: either was a 500 where a clear refusal belonged (outside probes: ``after``, ``limit``,
``Last-Event-ID``). A number is taken here only when it is written in ASCII digits and no longer
than its bound, and read only then.
"""

from __future__ import annotations

__all__ = ["whole_number"]


def whole_number(raw: str, most: int) -> int | None:
    """`raw` as a whole number from 0 to `most`; None when it is not one, or is larger."""
    if not raw or not (raw.isascii() and raw.isdigit()):
        return None
    digits = raw.lstrip("0") or "0"
    if len(digits) > len(str(most)):
        return None
    value = int(digits)
    return value if value <= most else None
