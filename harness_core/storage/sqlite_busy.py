"""Waiting for another connection's lock, or not: one SQLite connection used from two threads.

A repository's connection runs on its I/O thread, where a statement may wait up to the busy
timeout for another process's lock, and, while that thread is idle, on the event loop, where
nothing may wait (D117, D118). `BusyTimeout` switches the timeout between the two; `is_busy`
tells a refusal for a lock from any other error.
"""

from __future__ import annotations

import sqlite3
from typing import Final

__all__ = ["BusyTimeout", "is_busy"]

_SQLITE_BUSY: Final = 5
_SQLITE_LOCKED: Final = 6


def is_busy(exc: sqlite3.Error) -> bool:
    """Whether SQLite refused for a lock another connection holds (busy or locked)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)


class BusyTimeout:
    """The connection's busy timeout: the configured one on the I/O thread, zero on the loop.

    The pragma runs only when the setting changes: a lane whose writes and reads run on the
    loop and whose commits run on the thread pays two per batch.
    """

    def __init__(self, conn: sqlite3.Connection, ms: int) -> None:
        self._conn = conn
        self.ms = int(ms)
        self._now = -1

    def waits(self, wait: bool) -> None:
        """Let the next statements wait for another connection's lock (I/O thread), or not."""
        ms = self.ms if wait else 0
        if self._now != ms:
            self._conn.execute(f"PRAGMA busy_timeout={ms}")
            self._now = ms
