"""Waiting for another connection's lock, or not: one SQLite connection used from two threads.

A repository's connection runs on its I/O thread, where a statement may wait up to the busy
timeout for another process's lock, and, while that thread is idle, on the event loop, where
nothing may wait (D117, D118). `BusyTimeout` switches the timeout between the two; `is_busy`
tells a refusal for a lock from any other error. While the I/O thread works, reads of what is
committed can run on the loop on a second connection (`open_reader`, `read_committed`: D121).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Final, TypeVar

__all__ = ["BusyTimeout", "is_busy", "open_reader", "read_committed"]

_T = TypeVar("_T")

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


def open_reader(path: Path) -> sqlite3.Connection:
    """A read-only connection for the loop: it never waits for a lock, and cannot write."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA busy_timeout=0")
    conn.execute("PRAGMA query_only=1")
    return conn


def read_committed(
    conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], _T]
) -> tuple[bool, _T | None]:
    """Run `fn` in one snapshot of what is committed, never waiting.

    (True, its result), or (False, None) if another connection's lock stood in the way: the
    caller reads on its I/O thread instead, which waits.
    """
    try:
        conn.execute("BEGIN")
        try:
            return True, fn(conn)
        finally:
            conn.execute("COMMIT")
    except sqlite3.OperationalError as exc:
        if is_busy(exc):
            return False, None
        raise
