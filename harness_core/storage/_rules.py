"""Checks every backend applies to caller-supplied names, and the running-stats arithmetic."""

from __future__ import annotations

import re

from harness_core.errors import SessionError
from harness_core.messages import TokenUsage
from harness_core.session.entries import MessageEntry
from harness_core.session.records import Usage
from harness_core.session.types import LogItem, SessionStats, StoredEntry, StoredRecord

__all__ = ["apply_stats", "check_lane_name", "check_session_id"]

_LANE = re.compile(r"^[^\x00-\x1f\x7f]{1,512}$")
_SESSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,199}$")


def check_lane_name(lane: str) -> None:
    """Raise ``SessionError("invalid_lane")`` unless `lane` is 1-512 characters without controls."""
    if not isinstance(lane, str) or not _LANE.match(lane):
        raise SessionError(
            "invalid_lane", f"invalid lane name {lane!r}: 1-512 characters, no control characters"
        )


def check_session_id(session_id: str) -> None:
    """Raise ``SessionError("invalid_session_id")`` unless the id fits files and Redis keys."""
    if not isinstance(session_id, str) or not _SESSION.match(session_id):
        raise SessionError(
            "invalid_session_id",
            f"invalid session id {session_id!r}: 1-200 of letters, digits and . _ : @ + = -, "
            "starting with a letter or digit",
        )


def apply_stats(stats: SessionStats, item: LogItem) -> SessionStats:
    """Return `stats` after `item` was committed."""
    entries, messages, records, usage = stats.entries, stats.messages, stats.records, stats.usage
    if isinstance(item, StoredEntry):
        entries += 1
        if isinstance(item.entry, MessageEntry):
            messages += 1
    elif isinstance(item, StoredRecord):
        records += 1
        if isinstance(item.record, Usage):
            usage = usage + item.record.usage
    return SessionStats(
        last_seq=item.seq, entries=entries, messages=messages, records=records, usage=usage
    )


def usage_or_zero(item: LogItem) -> TokenUsage | None:
    """The usage a log item adds to the ledger, if any."""
    if isinstance(item, StoredRecord) and isinstance(item.record, Usage):
        return item.record.usage
    return None
