"""The naming rules of the session contract: session ids, lane names and entry/record ids.

Every backend and the runtime apply the same rules (D16): session ids name files and Redis
keys, lane names carry permanent thread keys such as ``slack:C123:1719432.0021`` or
``email:<abc@example.com>``, and entry/record ids are the `Id` type of the entries.
"""

from __future__ import annotations

import re

from harness_core.errors import SessionError

__all__ = ["check_lane_name", "check_session_id"]

# matched whole (`fullmatch`): a pattern ending in ``$`` would also take a trailing newline
_LANE = re.compile(r"[^\x00-\x1f\x7f]{1,512}")
_SESSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,199}")


def check_lane_name(lane: str) -> None:
    """Raise ``SessionError("invalid_lane")`` unless `lane` is 1-512 characters without controls."""
    if not isinstance(lane, str) or not _LANE.fullmatch(lane):
        raise SessionError(
            "invalid_lane",
            f"invalid lane name {_shown(lane)}: 1-512 characters, no control characters",
        )


def check_session_id(session_id: str) -> None:
    """Raise ``SessionError("invalid_session_id")`` unless the id fits files and Redis keys."""
    if not isinstance(session_id, str) or not _SESSION.fullmatch(session_id):
        raise SessionError(
            "invalid_session_id",
            f"invalid session id {_shown(session_id)}: 1-200 of ASCII letters, digits and "
            ". _ : @ + = -, "
            "starting with a letter or digit",
        )


def _shown(name: object) -> str:
    """A refused name as an error shows it: quoted, and cut.

    A 5,000-character one was echoed whole.
    """
    text = repr(name)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(str(name)):,} characters)"
