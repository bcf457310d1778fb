"""A SQLite connection that refuses, on the loop's thread, as another connection's lock would."""

from __future__ import annotations

import sqlite3
import threading
from typing import Any


class LockedOnTheLoop:
    """The connection as seen while another connection's lock stands in a reader's way.

    A WAL reader meets one only in rare moments (another connection recovering the WAL), which
    a test cannot bring about on demand: here every statement run on the loop's thread is
    refused as SQLite refuses it then, until `lift`.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.loop_thread = threading.get_ident()
        self.locked = True

    def execute(self, sql: str, *args: Any) -> Any:
        if (
            self.locked
            and threading.get_ident() == self.loop_thread
            and "pragma" not in sql.lower()
        ):
            refused = sqlite3.OperationalError("database is locked")
            refused.sqlite_errorcode = 5  # SQLITE_BUSY
            raise refused
        return self.conn.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)
