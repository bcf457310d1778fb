"""The web mailbox in one SQLite file (the embedded default; one process).

Every append is one ``BEGIN IMMEDIATE`` transaction: look the identity up, else take the
thread's next sequence number and insert the item. The file is opened as the store's and the
broker's are (`harness_core.backends.sqlite`): WAL mode, ``synchronous=effects``, and every
append is a durability point (D233): a visitor's message is acknowledged by it, and a reply
written here is the web channel's send, so both survive power loss before they return. All
SQLite calls run on one thread, in submission order. Waiters of this process wake at once;
another process writing the same file is seen by polling (`poll_s`).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from adapters.web.mailbox import (
    MailboxUnavailable,
    NewWebItem,
    Signals,
    WebAppend,
    WebItem,
    WebItemKind,
    WebThread,
    check_name,
    item_key,
    wait_with_signals,
)
from harness_core.backends.sqlite import ConnectionPolicy, Database, SqliteExecutor

__all__ = ["SqliteMailbox"]

_T = TypeVar("_T")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS web_threads (
    space TEXT NOT NULL,
    thread TEXT NOT NULL,
    last_seq INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (space, thread)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS web_threads_recent ON web_threads (space, updated_at_ms);
CREATE TABLE IF NOT EXISTS web_items (
    space TEXT NOT NULL,
    thread TEXT NOT NULL,
    seq INTEGER NOT NULL,
    key TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (space, thread, seq),
    UNIQUE (space, thread, key)
) WITHOUT ROWID;
"""


_POLICY = ConnectionPolicy(busy_timeout_ms=5_000)
"""WAL, ``synchronous=effects`` (each append fsynced); a request waits at most 5 s for a lock."""


def _item(seq: int, body: str) -> WebItem:
    return WebItem.model_validate({**json.loads(body), "seq": seq})


class _Db(Database):
    """The mailbox's connection and tables."""

    def setup(self) -> None:
        """Create the tables (every statement is ``CREATE ... IF NOT EXISTS``)."""
        self.conn.executescript(_SCHEMA)


class SqliteMailbox:
    """Threads in a SQLite file, created (with its directory) on first use."""

    def __init__(self, path: str | Path, *, poll_s: float = 1.0) -> None:
        self.path = Path(path)
        self.poll_s = poll_s
        self._io = SqliteExecutor(
            self.path,
            lambda: _Db(self.path, _POLICY),
            name="web-mailbox",
            failed=lambda exc: MailboxUnavailable(f"sqlite: {type(exc).__name__}: {exc}"),
            closed_error=lambda: MailboxUnavailable("the web mailbox is closed"),
        )
        self._signals = Signals()

    async def _run(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        return await self._io.call(lambda db: work(db.conn))

    async def append(self, space: str, thread: str, item: NewWebItem) -> WebAppend:
        """Append `item` unless the thread holds its identity (one transaction)."""
        check_name(space, "space")
        check_name(thread, "thread")
        key = item.key
        body = item.model_dump_json()

        def work(db: _Db) -> WebAppend:
            with db.transaction() as conn:
                row = conn.execute(
                    "SELECT seq, body FROM web_items WHERE space=? AND thread=? AND key=?",
                    (space, thread, key),
                ).fetchone()
                if row is not None:
                    return WebAppend(item=_item(row[0], row[1]), created=False)
                last = conn.execute(
                    "SELECT last_seq FROM web_threads WHERE space=? AND thread=?",
                    (space, thread),
                ).fetchone()
                seq = (last[0] if last else 0) + 1
                conn.execute(
                    "INSERT INTO web_threads VALUES (?,?,?,?) ON CONFLICT (space, thread) "
                    "DO UPDATE SET last_seq=excluded.last_seq, "
                    "updated_at_ms=max(updated_at_ms, excluded.updated_at_ms)",
                    (space, thread, seq, item.at_ms),
                )
                conn.execute(
                    "INSERT INTO web_items VALUES (?,?,?,?,?)", (space, thread, seq, key, body)
                )
            return WebAppend(item=_item(seq, body), created=True)

        appended = await self._io.call(work)
        if appended.created:
            self._signals.notify(space, thread)
        return appended

    async def find(
        self, space: str, thread: str, kind: WebItemKind, identity: str
    ) -> WebItem | None:
        """The thread's item of that family and identity, if any."""
        key = item_key(kind, identity)

        def work(conn: sqlite3.Connection) -> WebItem | None:
            row = conn.execute(
                "SELECT seq, body FROM web_items WHERE space=? AND thread=? AND key=?",
                (space, thread, key),
            ).fetchone()
            return None if row is None else _item(row[0], row[1])

        return await self._run(work)

    async def read(
        self, space: str, thread: str, *, after: int = 0, limit: int = 100
    ) -> tuple[WebItem, ...]:
        """The thread's items after `after`, oldest first."""

        def work(conn: sqlite3.Connection) -> tuple[WebItem, ...]:
            rows = conn.execute(
                "SELECT seq, body FROM web_items WHERE space=? AND thread=? AND seq>? "
                "ORDER BY seq LIMIT ?",
                (space, thread, after, max(0, limit)),
            ).fetchall()
            return tuple(_item(seq, body) for seq, body in rows)

        return await self._run(work)

    async def wait(
        self, space: str, thread: str, *, after: int, timeout_s: float, limit: int = 100
    ) -> tuple[WebItem, ...]:
        """The items after `after`, waiting up to `timeout_s` (polling every `poll_s`)."""
        return await wait_with_signals(
            self, self._signals, space, thread, after=after, timeout_s=timeout_s, limit=limit,
            poll_s=self.poll_s,
        )  # fmt: skip

    async def threads(self, space: str, *, limit: int = 100) -> tuple[WebThread, ...]:
        """The space's threads, most recently updated first."""

        def work(conn: sqlite3.Connection) -> tuple[WebThread, ...]:
            rows = conn.execute(
                "SELECT thread, updated_at_ms FROM web_threads WHERE space=? "
                "ORDER BY updated_at_ms DESC, thread DESC LIMIT ?",
                (space, max(0, limit)),
            ).fetchall()
            return tuple(WebThread(space=space, thread=t, updated_at_ms=at) for t, at in rows)

        return await self._run(work)

    async def close(self) -> None:
        """Close the file after the calls in flight (idempotent); waiters return."""
        self._signals.close()
        await self._io.close()
