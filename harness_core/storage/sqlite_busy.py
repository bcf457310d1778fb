"""Waiting for another connection's lock, or not: one SQLite connection used from two threads.

A repository's connection runs on its I/O thread, where a statement may wait up to the busy
timeout for another process's lock, and, while that thread is idle, on the event loop, where
nothing may wait (D117, D118). `BusyTimeout` switches the timeout between the two; `is_busy`
tells a refusal for a lock from any other error. While the I/O thread works, reads of what is
committed can run on the loop on a second connection (`CommittedReader`: D121).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Final, TypeVar

__all__ = ["BusyTimeout", "CommittedReader", "is_busy", "unless_busy"]

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


def unless_busy(read: Callable[[], _T]) -> tuple[bool, _T | None]:
    """Run `read`, never waiting: (True, its result) or (False, None).

    (False, None) when another connection's lock stood in the way: the caller then reads on its
    I/O thread, which waits.
    """
    try:
        return True, read()
    except sqlite3.OperationalError as exc:
        if is_busy(exc):
            return False, None
        raise


class CommittedReader:
    """A second, read-only connection for the loop: snapshots of what is committed (D121).

    Opened on first use; it never waits for a lock and cannot write. An in-memory database has
    none (a second connection would open another database): every read is refused.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._conn: sqlite3.Connection | None = None

    def read(self, fn: Callable[[sqlite3.Connection], _T]) -> tuple[bool, _T | None]:
        """`fn` in one snapshot, never waiting: as `unless_busy`."""
        if str(self._path) == ":memory:":
            return False, None
        if self._conn is None:
            self._conn = sqlite3.connect(self._path, isolation_level=None)
            self._conn.execute("PRAGMA busy_timeout=0")
            self._conn.execute("PRAGMA query_only=1")
        conn = self._conn

        def snapshot() -> _T:
            conn.execute("BEGIN")
            try:
                return fn(conn)
            finally:
                conn.execute("COMMIT")

        return unless_busy(snapshot)

    def close(self) -> None:
        """Close the connection (a later read opens it again)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
