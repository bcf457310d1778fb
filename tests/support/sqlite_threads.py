"""Watching and steering a SQLite repository's I/O thread in tests (D117, D118, D121).

`count_hops` records every call handed to the thread, `hold_the_thread` keeps it busy as a
commit's fsync would, and `LockedOnTheLoop` refuses statements on the loop's thread as another
connection's lock would.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest


def count_hops(executor: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The calls submitted to `executor` from now on (a list that grows)."""
    hops: list[object] = []
    submit = executor.submit

    def counted(fn: Any, *args: Any) -> Any:
        hops.append(fn)
        return submit(fn, *args)

    monkeypatch.setattr(executor, "submit", counted)
    return hops


async def hold_the_thread(
    call: Callable[[Callable[[Any], None]], Awaitable[Any]],
) -> tuple[asyncio.Future[Any], asyncio.Event]:
    """Keep the thread `call` runs on busy until the event is set; returns once it is held."""
    entered, release = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()

    def hold(db: Any) -> None:
        loop.call_soon_threadsafe(entered.set)
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result()

    held = asyncio.ensure_future(call(hold))
    await entered.wait()
    return held, release


class LockedOnTheLoop:
    """The connection as seen while another connection's lock stands in a reader's way.

    A WAL reader meets one only in rare moments (another connection recovering the WAL), which
    a test cannot bring about on demand: here every statement run on the loop's thread is
    refused as SQLite refuses it then, until `locked` is set to False.
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
