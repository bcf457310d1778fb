"""What ``gateway ops`` prints: safe terminal text, tables, times, ages, costs and lane lines."""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import quote

__all__ = [
    "Json",
    "age",
    "attempts",
    "call_line",
    "clean",
    "clip",
    "cost",
    "seg",
    "state_line",
    "table_lines",
    "time_of",
    "when",
    "why",
]

_CONTROL = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064"
    r"\u2066-\u206f\ufeff\ufff9-\ufffb]"
)
"""Control characters, and the format characters the channels show as escapes where a value is
judged (`adapters.visible`'s set, with the joiners; not imported from there: the client never
loads the adapters package, 0.4 s of imports)."""

Json = dict[str, Any]


def clean(value: Any) -> str:
    """`value` as text safe for one terminal line (control characters shown, not obeyed)."""
    text = "" if value is None else str(value)

    def shown(match: re.Match[str]) -> str:
        char = match.group()
        if char == "\n":
            return "\\n"
        if char == "\t":
            return " "
        return f"\\u{ord(char):04x}" if ord(char) > 0xFF else f"\\x{ord(char):02x}"

    return _CONTROL.sub(shown, text)


def clip(text: str, size: int) -> str:
    """`text` cut to `size` characters, an ellipsis saying so."""
    return text if len(text) <= size else text[: size - 1] + "…"


def table_lines(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """The header and the rows in aligned columns, cells cleaned (no rows: no lines)."""
    cells = [[clean(cell) for cell in row] for row in rows]
    if not cells:
        return []
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]

    def line(row: Sequence[str]) -> str:
        return "  ".join(
            cell.ljust(width) for cell, width in zip(row, widths, strict=True)
        ).rstrip()

    return [line(headers), *(line(row) for row in cells)]


def revoked_line(revoked: Json) -> str:
    """A revocation in one line: why, what it covers, by whom, when (UTC)."""
    return (
        f"revoked: {clean(revoked.get('why'))} ({clean(revoked.get('scope_name'))}; by "
        f"{clean(revoked.get('by'))}, {when(revoked.get('at_ms'))} UTC)"
    )


def why(view: Json) -> str:
    """Why a lane is in its status, in a few words (a table's WHY column)."""
    status = view.get("status")
    error = view.get("error") or {}
    revoked = view.get("revoked")
    if revoked:
        return f"revoked: {revoked.get('why')}"
    if status == "faulted":
        return str(view.get("fault") or "")
    if status == "failed" and error:
        return f"{error.get('code')}: {error.get('message')}"
    if view.get("suspended"):
        return str(view["suspended"])
    if view.get("pending_approvals"):
        return "approval"
    if status == "idle" and view.get("last_outcome"):
        return f"last: {view['last_outcome']}"
    return ""


def attempts(view: Json) -> str:
    """``ATTEMPTS/MAX`` of a lane's attempt, or nothing when none counts."""
    count = view.get("attempts") or 0
    return f"{count}/{view.get('max_attempts')}" if count else ""


def state_line(view: Json) -> str:
    """Where a lane stands, in one line (said before an action asks to proceed)."""
    status = clean(view.get("status"))
    if view.get("suspended"):
        status += f" ({clean(view.get('suspended'))})"
    parts = [f"{clean(view.get('session'))}/{clean(view.get('lane'))} is {status}"]
    if view.get("attempts"):
        parts.append(f"attempt {view.get('attempts')} of {view.get('max_attempts')}")
    if view.get("activity"):
        parts.append(f"last doing: {clean(view.get('activity'))}")
    error = view.get("error")
    if error:
        parts.append(f"error: {clean(error.get('code'))}: {clean(error.get('message'))}")
    if view.get("revoked"):
        parts.append(revoked_line(view["revoked"]))
    return ", ".join(parts)


def call_line(call: Json) -> str:
    """A pending tool call: its id, tool and (clipped) arguments."""
    arguments = json.dumps(call.get("arguments", {}), ensure_ascii=False, separators=(",", ":"))
    return clean(f"{call.get('tool_call_id')} {call.get('tool_name')}({clip(arguments, 80)})")


def time_of(ms: Any) -> str:
    """A time of day (UTC) of epoch milliseconds; ``?`` if it is not one."""
    stamp = _stamp(ms)
    return stamp.strftime("%H:%M:%S") if stamp else "?"


def when(ms: Any) -> str:
    """A date and time (UTC) of epoch milliseconds; ``?`` if it is not one."""
    stamp = _stamp(ms)
    return stamp.strftime("%Y-%m-%d %H:%M:%S") if stamp else "?"


def _stamp(ms: Any) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromtimestamp(int(ms) / 1000, tz=datetime.UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return None


def age(ms: Any) -> str:
    """An age in milliseconds, in seconds, minutes or hours."""
    seconds = int(ms or 0) // 1000
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def cost(usage: Json) -> str:
    """A usage's total cost, or nothing when it has none."""
    found = usage.get("cost") or {}
    total = found.get("total") if isinstance(found, dict) else None
    return f"{float(total):.4f}" if isinstance(total, int | float) else ""


def seg(value: str) -> str:
    """A path segment (ids are opaque: nothing in them may change the path)."""
    return quote(value, safe="")
