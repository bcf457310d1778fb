"""The SQLite broker: the embedded default (one file, one process).

Like the store's SQLite backend (D13), on the same plumbing (`harness_core.backends.sqlite`,
D191): stdlib `sqlite3`, one connection on one thread per broker, WAL, ``synchronous=effects``
by default (an acceptance, a delivery's claim, a mark and an operator's action are fsynced before
they return; bookkeeping commits survive a process crash: `SqliteBroker.write`, D233; ``full``
fsyncs every commit, ``normal`` none). Every mutation is
a function run on that thread; mutations queued while a transaction is in flight join the next
one (group commit), each in its own savepoint, so a failed one leaves no trace while the others
commit. A call returns once its transaction committed. Reads run on the event loop instead,
never waiting for a lock: on that connection while the thread is idle (D118), else on a second,
read-only one (D121).

Tables: `inbox` (one row per item, its dedupe key unique), `session_claims` (a row per session
that may have pending items: ready since ``available_at_ms``, or handed to ``owner`` under
``ticket`` until ``available_at_ms``), `outbox` (one row per delivery with its lease), `threads`,
`audit`, and the blob area: `blobs` (a row per session and content hash, its bytes inline) and
`blob_keys` (a channel's name of a file -> its blob; D222). Inbox and audit ids are the rows'
AUTOINCREMENT numbers as 16-digit strings, so they sort as strings in append order and are
never reused.

SQLite serves one process, so `take_session(wait_ms=...)` and `Outbox.wait` wake early on an
`asyncio.Event` set by this broker's own writes; they also re-read at least every
`poll_interval_ms` (a write by another process on the same file, an operator's CLI) and when the
next claim expiry or due time comes. Waits run on the injected clock.

Retention (lazy, at most once per `purge_interval_ms`, bounded per pass; `purge()` runs a full
pass): an acked item is deleted once its dedupe window passed; a pending or rejected item keeps
its key as long as it is kept. Delivered and discarded deliveries go `settled_retention_ms`
after settling, dead letters `dead_retention_ms` after (None keeps them); pending deliveries are
never purged.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from gateway.broker.contract import (
    AuditEvent,
    Backlog,
    BlobInfo,
    BrokerError,
    BrokerParts,
    ClaimedDelivery,
    Delivery,
    DeliveryStatus,
    InboxAppend,
    InboxItem,
    LaneTaken,
    NewAuditEvent,
    NewInboxItem,
    Operated,
    SessionTicket,
    ThreadState,
    TicketHeld,
)
from gateway.broker.limits import BlobLimits, blob_id
from gateway.broker.news import SessionNews, whole_take
from harness_core import Clock, IdGenerator, SystemClock, Uuid7Ids
from harness_core.backends.batch import WriteQueue
from harness_core.backends.sqlite import ConnectionPolicy, Database, SqliteExecutor, Synchronous
from harness_core.frozen import FrozenJsonObject

__all__ = ["SqliteBroker", "Synchronous"]

SCHEMA_VERSION = 1
ID_DIGITS = 16
_T = TypeVar("_T")
_Op = Callable[[sqlite3.Connection, int], Any]
"""A queued mutation: runs on the I/O thread with the connection and the batch's clock time."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS broker_schema (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS inbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session TEXT NOT NULL,
    lane TEXT NOT NULL,
    dedupe_key TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    appended_at_ms INTEGER NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending',
    reason TEXT,
    settled_at_ms INTEGER,
    dedupe_until_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS inbox_pending ON inbox (session, id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS inbox_pending_age ON inbox (appended_at_ms) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS inbox_rejected ON inbox (id) WHERE status = 'rejected';
CREATE INDEX IF NOT EXISTS inbox_acked ON inbox (dedupe_until_ms) WHERE status = 'acked';
CREATE TABLE IF NOT EXISTS session_claims (
    session TEXT PRIMARY KEY,
    available_at_ms INTEGER NOT NULL,
    owner TEXT,
    ticket TEXT,
    claimed_at_ms INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS claims_by_time ON session_claims (available_at_ms, session);
CREATE TABLE IF NOT EXISTS outbox (
    id TEXT PRIMARY KEY,
    session TEXT NOT NULL,
    lane TEXT NOT NULL,
    outbound TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0,
    due_at_ms INTEGER NOT NULL,
    unknown_outcome INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    created_at_ms INTEGER NOT NULL,
    settled_at_ms INTEGER,
    lease_owner TEXT,
    lease_token TEXT,
    lease_expires_at_ms INTEGER
);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox (due_at_ms, id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS outbox_leases ON outbox (lease_expires_at_ms)
    WHERE status = 'pending' AND lease_token IS NOT NULL;
CREATE INDEX IF NOT EXISTS outbox_by_status ON outbox (status, id);
CREATE INDEX IF NOT EXISTS outbox_settled ON outbox (status, settled_at_ms)
    WHERE status <> 'pending';
CREATE TABLE IF NOT EXISTS threads (
    session TEXT NOT NULL,
    lane TEXT NOT NULL,
    thread TEXT NOT NULL,
    reply_context TEXT NOT NULL,
    replied_through INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (session, lane)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS marks (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms INTEGER NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    session TEXT,
    lane TEXT,
    target TEXT,
    outcome TEXT NOT NULL,
    details TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_by_session ON audit (session, id);
CREATE INDEX IF NOT EXISTS audit_by_lane ON audit (lane, id);
CREATE TABLE IF NOT EXISTS blobs (
    session TEXT NOT NULL,
    id TEXT NOT NULL,
    size INTEGER NOT NULL,
    keep_until_ms INTEGER NOT NULL,
    data BLOB NOT NULL,
    UNIQUE (session, id)
);
CREATE INDEX IF NOT EXISTS blobs_expiry ON blobs (session, keep_until_ms);
CREATE TABLE IF NOT EXISTS blob_keys (
    session TEXT NOT NULL,
    key TEXT NOT NULL,
    blob TEXT NOT NULL,
    PRIMARY KEY (session, key)
) WITHOUT ROWID;
"""

_INBOX_COLUMNS = "id, session, lane, dedupe_key, kind, payload, appended_at_ms, status, reason"
_OUTBOX_COLUMNS = (
    "id, session, lane, outbound, status, attempts, due_at_ms, unknown_outcome, last_error, "
    "created_at_ms, settled_at_ms"
)
_AUDIT_COLUMNS = "id, at_ms, actor, action, session, lane, target, outcome, details"
_CLEAR_LEASE = "lease_owner = NULL, lease_token = NULL, lease_expires_at_ms = NULL"
_PURGE_BATCH = 1000


def _json(value: FrozenJsonObject) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _format_id(number: int) -> str:
    return f"{number:0{ID_DIGITS}d}"


def _parse_id(text: str) -> int | None:
    """The row number of an id this broker issued (None: not one of ours)."""
    if len(text) == ID_DIGITS and text.isascii() and text.isdigit():
        return int(text)
    return None


def _first_id_after(cursor: str) -> int:
    """The smallest row number whose id sorts after `cursor` as a string (any string works)."""
    low, high = 0, 10**ID_DIGITS  # ids of equal length: string order is number order
    while low < high:
        middle = (low + high) // 2
        if _format_id(middle) > cursor:
            high = middle
        else:
            low = middle + 1
    return low


def _item(row: Sequence[Any]) -> InboxItem:
    number, session, lane, key, kind, payload, appended_at, status, reason = row
    return InboxItem(
        id=_format_id(number),
        session=session,
        lane=lane,
        dedupe_key=key,
        kind=kind,
        payload=json.loads(payload),
        appended_at_ms=appended_at,
        status=status,
        reason=reason,
    )


def _delivery(row: Sequence[Any]) -> Delivery:
    (id_, session, lane, outbound, status, attempts, due, unknown, error, created, settled) = row
    return Delivery(
        id=id_,
        session=session,
        lane=lane,
        outbound=json.loads(outbound),
        status=status,
        attempts=attempts,
        due_at_ms=due,
        unknown_outcome=bool(unknown),
        last_error=error,
        created_at_ms=created,
        settled_at_ms=settled,
    )


def _event(row: Sequence[Any]) -> AuditEvent:
    number, at_ms, actor, action, session, lane, target, outcome, details = row
    return AuditEvent(
        id=_format_id(number),
        at_ms=at_ms,
        actor=actor,
        action=action,
        session=session,
        lane=lane,
        target=target,
        outcome=outcome,
        details=json.loads(details),
    )


def _has_pending(conn: sqlite3.Connection, session: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM inbox WHERE session = ? AND status = 'pending' LIMIT 1", (session,)
    ).fetchone()
    return row is not None


class _Db(Database):
    """The broker's connection and schema.

    A `Database`: used on the broker's I/O thread, and for reads on the loop while that thread
    is idle.
    """

    def setup(self) -> None:
        """Create the tables (each ``CREATE ... IF NOT EXISTS``); check the schema version."""
        self.conn.executescript(_SCHEMA)
        with self.transaction():
            row = self.conn.execute("SELECT version FROM broker_schema").fetchone()
            if row is None:
                self.conn.execute("INSERT INTO broker_schema VALUES (?)", (SCHEMA_VERSION,))
            elif row[0] != SCHEMA_VERSION:
                raise BrokerError(
                    "storage", f"{self.path} has broker schema {row[0]}, expected {SCHEMA_VERSION}"
                )


class _Signal:
    """An in-process wake-up: `wait` returns once `fire` was called after `arm` handed it out."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def arm(self) -> asyncio.Event:
        """The event the next `fire` sets (take it before reading, wait on it after)."""
        return self._event

    def fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()


class SqliteBroker(BrokerParts):
    """Inbox, outbox, thread state and audit trail in one SQLite file.

    Nothing is created until the first call. `clock` times items, claims, dedupe windows and
    waits; `ids` mints session tickets and delivery lease tokens.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: Synchronous = "effects",
        clock: Clock | None = None,
        ids: IdGenerator | None = None,
        visibility_timeout_ms: int = 30_000,
        dedupe_ttl_ms: int = 86_400_000,
        settled_retention_ms: int = 86_400_000,
        dead_retention_ms: int | None = 14 * 86_400_000,
        purge_interval_ms: int = 60_000,
        poll_interval_ms: int = 1_000,
        busy_timeout_ms: int = 10_000,
        blob_limits: BlobLimits | None = None,
    ) -> None:
        policy = ConnectionPolicy(synchronous=synchronous, busy_timeout_ms=busy_timeout_ms)
        for name, value in (
            ("visibility_timeout_ms", visibility_timeout_ms),
            ("dedupe_ttl_ms", dedupe_ttl_ms),
            ("poll_interval_ms", poll_interval_ms),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        self.path = Path(path)
        self.clock: Clock = clock or SystemClock()
        self.ids: IdGenerator = ids or Uuid7Ids(self.clock)
        self.visibility_timeout_ms = visibility_timeout_ms
        self.dedupe_ttl_ms = dedupe_ttl_ms
        self.settled_retention_ms = settled_retention_ms
        self.dead_retention_ms = dead_retention_ms
        self.purge_interval_ms = purge_interval_ms
        self.poll_interval_ms = poll_interval_ms
        self._io = SqliteExecutor(
            self.path,
            lambda: _Db(self.path, policy),
            name="sqlite-broker",
            failed=lambda exc: BrokerError("storage", f"sqlite error on {self.path}: {exc}"),
            closed_error=lambda: BrokerError("closed", "the broker is closed"),
        )
        self._writes = WriteQueue[tuple[_Op, bool]](self._send)
        self._next_inbox_purge_ms = 0
        self._next_outbox_purge_ms = 0
        self.sessions_ready = _Signal()
        self.deliveries_due = _Signal()
        self.closed = False
        self._inbox = _Inbox(self)
        self._outbox = _Outbox(self)
        self._threads = _Threads(self)
        self._audit = _Audit(self)
        self._marks = _Marks(self)
        self._blobs = _Blobs(self, blob_limits or BlobLimits())

    async def _send(self, ops: Sequence[tuple[_Op, bool]]) -> list[Any]:
        """One batch of queued mutations: one group-committed transaction on the I/O thread.

        The commit is a durability point (D233) when any of them is one.
        """
        point = any(is_point for _, is_point in ops)

        def run(db: _Db) -> list[Any]:
            now = self.clock.now_ms()  # on the I/O thread, right before the batch's transaction

            def at_now(op: _Op) -> Callable[[sqlite3.Connection], Any]:
                return lambda conn: op(conn, now)

            return db.group([at_now(op) for op, _ in ops], point=point)

        return await self._io.call(run)

    async def read(self, fn: Callable[[sqlite3.Connection], _T], *, whole: bool = False) -> _T:
        """Run reads in one snapshot: on the loop when it can, else on the broker's thread.

        As the store's reads (`SqliteExecutor.read`, D118, D121): a read of a few rows costs
        less than the hop to the thread and back. While the thread works it runs on a second,
        read-only connection: every mutation of this broker is committed before it returns,
        so what is committed is all that was acknowledged. `whole` (every thread of a session)
        keeps an unbounded read on the thread.
        """
        return await self._io.read(fn, inline=not whole)

    async def write(self, op: Callable[[sqlite3.Connection, int], _T], *, point: bool = True) -> _T:
        """Run a mutation in the next group-committed transaction; return once committed.

        `point` (the default): a durability point (D233), something outside depends on it
        (an accepted message's acknowledgement, a delivery's claim before its send, a mark
        before what it guards, an operator's action): under ``synchronous=effects`` its
        commit is fsynced. ``False`` for the bookkeeping a power loss may roll back to the
        last point (session tickets, settlements, purges, an outbox enqueue that a rerun of
        its acknowledged message makes again): each such state is one a process crash at
        that point leaves, which the service already recovers from.
        """
        if self.closed:
            raise BrokerError("closed", "the broker is closed")
        try:
            result: _T = await self._writes.submit((op, point))
        except sqlite3.Error as exc:
            raise BrokerError("storage", f"sqlite error on {self.path}: {exc}") from exc
        return result

    async def _sleep_to(self, at_ms: int) -> None:
        # measured when the sleep starts: a clock moved in between is not slept past
        await self.clock.sleep(max(at_ms - self.clock.now_ms(), 0) / 1000)

    async def sleep_until(
        self, signal: asyncio.Event, wake_at_ms: int | None, deadline_ms: int
    ) -> None:
        """Sleep on the clock until `signal`, `wake_at_ms`, `deadline_ms` or the poll interval."""
        now = self.clock.now_ms()
        until = deadline_ms if wake_at_ms is None else min(deadline_ms, wake_at_ms)
        wake = now + max(0, min(until - now, self.poll_interval_ms))
        sleeper = asyncio.ensure_future(self._sleep_to(wake))
        waker = asyncio.ensure_future(signal.wait())
        try:
            await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waker.cancel()

    def purge_inbox(self, conn: sqlite3.Connection, now: int, limit: int) -> int:
        """Delete up to `limit` acked items whose dedupe window passed (on the I/O thread)."""
        cursor = conn.execute(
            "DELETE FROM inbox WHERE id IN (SELECT id FROM inbox WHERE status = 'acked' "
            "AND dedupe_until_ms <= ? ORDER BY dedupe_until_ms LIMIT ?)",
            (now, limit),
        )
        return cursor.rowcount

    def purge_outbox(self, conn: sqlite3.Connection, now: int, limit: int) -> int:
        """Delete up to `limit` settled deliveries past their retention (on the I/O thread)."""
        done = 0
        cutoffs: list[tuple[str, int]] = [
            ("delivered", now - self.settled_retention_ms),
            ("discarded", now - self.settled_retention_ms),
        ]
        if self.dead_retention_ms is not None:
            cutoffs.append(("dead", now - self.dead_retention_ms))
        for status, cutoff in cutoffs:
            cursor = conn.execute(
                "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE status = ? "
                "AND settled_at_ms <= ? ORDER BY settled_at_ms LIMIT ?)",
                (status, cutoff, limit - done),
            )
            done += cursor.rowcount
            if done >= limit:
                break
        return done

    def lazy_purge_inbox(self, conn: sqlite3.Connection, now: int) -> None:
        """`purge_inbox` a batch if the purge interval passed since the last one."""
        if now >= self._next_inbox_purge_ms:
            self._next_inbox_purge_ms = now + self.purge_interval_ms
            self.purge_inbox(conn, now, _PURGE_BATCH)

    def lazy_purge_outbox(self, conn: sqlite3.Connection, now: int) -> None:
        """`purge_outbox` a batch if the purge interval passed since the last one."""
        if now >= self._next_outbox_purge_ms:
            self._next_outbox_purge_ms = now + self.purge_interval_ms
            self.purge_outbox(conn, now, _PURGE_BATCH)

    async def purge(self, *, now_ms: int | None = None) -> int:
        """Delete everything past its retention now (see the module docstring); the count."""
        total = 0
        while True:
            at = self.clock.now_ms() if now_ms is None else now_ms

            def op(conn: sqlite3.Connection, _: int, at: int = at) -> int:
                return self.purge_inbox(conn, at, _PURGE_BATCH) + self.purge_outbox(
                    conn, at, _PURGE_BATCH
                )

            deleted = await self.write(op, point=False)
            total += deleted
            if deleted < _PURGE_BATCH:
                return total

    async def close(self) -> None:
        """Finish queued writes, close the connection and the I/O thread (idempotent)."""
        if self.closed:
            return
        await self._writes.drain()
        self.closed = True
        self.sessions_ready.fire()  # waiters see `closed` and return
        self.deliveries_due.fire()
        await self._io.close()


_REMEMBER = (
    "INSERT INTO threads (session, lane, thread, reply_context) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (session, lane) DO UPDATE SET reply_context = excluded.reply_context"
)
"""A lane's thread is the one it was first remembered with; its reply context the newest."""


def _other_space(
    conn: sqlite3.Connection, session: str, lane: str, thread: FrozenJsonObject, text: str
) -> str | None:
    """The space `lane` belongs to when it is not `thread`'s (None: a new lane, or its own).

    `text` is `thread` as stored: the same thread again (every message of a thread) is told
    by its text, without decoding the stored one.
    """
    row = conn.execute(
        "SELECT thread FROM threads WHERE session = ? AND lane = ?", (session, lane)
    ).fetchone()
    if row is None or row[0] == text:
        return None
    space = json.loads(row[0]).get("space")
    return None if space == thread.get("space") else ("" if space is None else str(space))


def _remembered(
    item: NewInboxItem, thread: FrozenJsonObject, reply_context: FrozenJsonObject | None
) -> tuple[str, str, str, str]:
    """The `_REMEMBER` arguments of an append that records its lane's thread."""
    return (item.session, item.lane, _json(thread), _json(reply_context or {}))


def _mark(conn: sqlite3.Connection, name: str) -> str | None:
    """A mark's value (None: unset)."""
    row = conn.execute("SELECT value FROM marks WHERE name = ?", (name,)).fetchone()
    return None if row is None else str(row[0])


class _Inbox:
    def __init__(self, broker: SqliteBroker) -> None:
        self._b = broker
        self._news = SessionNews()
        self._at = 0
        """This broker's news position: one more per piece of news."""

    def _tell(self, *sessions: str) -> None:
        """News for `sessions` (an item appended, a ticket taken over or handed back)."""
        for session in sessions:
            self._at += 1
            self._news.note(session, self._at)

    async def append(
        self,
        item: NewInboxItem,
        *,
        thread: FrozenJsonObject | None = None,
        reply_context: FrozenJsonObject | None = None,
        read_mark: str | None = None,
    ) -> InboxAppend:
        payload = _json(item.payload)
        ttl = self._b.dedupe_ttl_ms
        remembered = None if thread is None else _remembered(item, thread, reply_context)

        def op(
            conn: sqlite3.Connection, now: int
        ) -> tuple[tuple[tuple[Any, ...], bool, bool], str | None]:
            if thread is not None and remembered is not None:
                taken = _other_space(conn, item.session, item.lane, thread, remembered[2])
                if taken is not None:
                    raise LaneTaken(item.session, item.lane, taken)  # nothing was written
            held = hold(conn, now)
            if remembered is not None and not held[1]:  # a duplicate changes nothing (D318)
                conn.execute(_REMEMBER, remembered)
            # in the append's transaction: as of the append
            mark = None if read_mark is None else _mark(conn, read_mark)
            return held, mark

        def hold(conn: sqlite3.Connection, now: int) -> tuple[tuple[Any, ...], bool, bool]:
            self._b.lazy_purge_inbox(conn, now)
            row = conn.execute(
                f"SELECT {_INBOX_COLUMNS}, dedupe_until_ms FROM inbox WHERE dedupe_key = ?",
                (item.dedupe_key,),
            ).fetchone()
            if row is not None:
                if row[7] != "acked" or row[9] > now:
                    return row[:9], True, False
                conn.execute("DELETE FROM inbox WHERE id = ?", (row[0],))  # window passed
            cursor = conn.execute(
                "INSERT INTO inbox (session, lane, dedupe_key, kind, payload, appended_at_ms, "
                "dedupe_until_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (item.session, item.lane, item.dedupe_key, item.kind, payload, now, now + ttl),
            )
            conn.execute(
                "INSERT OR IGNORE INTO session_claims (session, available_at_ms) VALUES (?, ?)",
                (item.session, now),
            )
            # held (a live ticket, or one deferred): its holder is told, the takers are not
            (available_at,) = conn.execute(
                "SELECT available_at_ms FROM session_claims WHERE session = ?", (item.session,)
            ).fetchone()
            new = (cursor.lastrowid, item.session, item.lane, item.dedupe_key, item.kind)
            return (*new, payload, now, "pending", None), False, available_at <= now

        (row, duplicate, ready), mark = await self._b.write(op)
        if not duplicate:
            self._tell(item.session)
            if ready:
                self._b.sessions_ready.fire()
        return InboxAppend(item=_item(row), duplicate=duplicate, mark=mark)

    async def pending(
        self, session: str, *, limit: int = 100, after: str | None = None
    ) -> tuple[InboxItem, ...]:
        since = (_parse_id(after) if after is not None else None) or 0
        rows = await self._b.read(
            lambda c: c.execute(
                f"SELECT {_INBOX_COLUMNS} FROM inbox WHERE session = ? AND status = 'pending' "
                "AND id > ? ORDER BY id LIMIT ?",
                (session, since, max(limit, 0)),
            ).fetchall()
        )
        return tuple(_item(row) for row in rows)

    async def _settle(self, session: str, item_id: str, status: str, reason: str | None) -> None:
        number = _parse_id(item_id)
        if number is None:
            return

        def op(conn: sqlite3.Connection, now: int) -> None:
            conn.execute(
                "UPDATE inbox SET status = ?, reason = ?, settled_at_ms = ? "
                "WHERE id = ? AND session = ? AND status = 'pending'",
                (status, reason, now, number, session),
            )

        await self._b.write(op, point=False)

    async def ack(self, session: str, item_id: str) -> None:
        await self._settle(session, item_id, "acked", None)

    async def reject(self, session: str, item_id: str, reason: str) -> None:
        await self._settle(session, item_id, "rejected", reason)

    async def take_session(self, worker: str, *, wait_ms: int = 0) -> SessionTicket | None:
        b = self._b
        deadline = b.clock.now_ms() + max(wait_ms, 0)
        visibility = b.visibility_timeout_ms
        while True:
            signal = b.sessions_ready.arm()
            ticket = b.ids.next()

            def op(
                conn: sqlite3.Connection, now: int, ticket: str = ticket
            ) -> tuple[str | None, int | None, bool]:
                while True:
                    row = conn.execute(
                        "SELECT session, available_at_ms, ticket FROM session_claims "
                        "ORDER BY available_at_ms, session LIMIT 1"
                    ).fetchone()
                    if row is None:
                        return None, None, False
                    session, available_at, lapsed = row
                    if available_at > now:
                        return None, available_at, False  # the next claim to expire
                    # a lapsed ticket: its worker died or deferred the session, so it is handed
                    # out again with nothing pending (an operation may be left open)
                    if lapsed is None and not _has_pending(conn, session):
                        conn.execute("DELETE FROM session_claims WHERE session = ?", (session,))
                        continue
                    conn.execute(
                        "UPDATE session_claims SET owner = ?, ticket = ?, available_at_ms = ?, "
                        "claimed_at_ms = ? WHERE session = ?",
                        (worker, ticket, now + visibility, now, session),
                    )
                    return session, None, bool(lapsed)

            if b.closed:
                return None
            taken = await whole_take(self._take_step(op, ticket), self._hand_back)
            if isinstance(taken, SessionTicket):
                return taken
            if b.closed or b.clock.now_ms() >= deadline:
                return None
            await b.sleep_until(signal, taken, deadline)

    async def _take_step(
        self,
        op: Callable[[sqlite3.Connection, int], tuple[str | None, int | None, bool]],
        ticket: str,
    ) -> SessionTicket | int | None:
        """Run a take's transaction: a ticket, else when the next claim expires (None: none)."""
        session, next_at, over = await self._b.write(op, point=False)
        if session is None:
            return next_at
        if over:  # a ticket that lapsed or was handed back: its holder may be waiting
            self._tell(session)
        return SessionTicket(session=session, ticket=ticket)

    async def renew(self, ticket: SessionTicket) -> bool:
        visibility = self._b.visibility_timeout_ms

        def op(conn: sqlite3.Connection, now: int) -> bool:
            cursor = conn.execute(
                "UPDATE session_claims SET available_at_ms = ? WHERE session = ? AND ticket = ?",
                (now + visibility, ticket.session, ticket.ticket),
            )
            return cursor.rowcount == 1

        result: bool = await self._b.write(op, point=False)
        return result

    async def _hand_back(self, ticket: SessionTicket) -> None:
        """Hand back what a cancelled take took: ready for the next take at once.

        Pending items or not: nobody looked at the session (a lapsed ticket's operation is open).
        """
        await self.done(ticket, again_in_ms=0)

    async def done(self, ticket: SessionTicket, *, again_in_ms: int | None = None) -> None:
        def op(conn: sqlite3.Connection, now: int) -> bool:
            row = conn.execute(
                "SELECT ticket FROM session_claims WHERE session = ?", (ticket.session,)
            ).fetchone()
            if row is None or row[0] != ticket.ticket:
                return False
            if again_in_ms is not None:  # the ticket lapses then, as if its worker had died
                conn.execute(
                    "UPDATE session_claims SET owner = NULL, ticket = '', available_at_ms = ? "
                    "WHERE session = ?",
                    (now + max(again_in_ms, 0), ticket.session),
                )
                return again_in_ms <= 0
            if _has_pending(conn, ticket.session):
                conn.execute(
                    "UPDATE session_claims SET owner = NULL, ticket = NULL, available_at_ms = ?, "
                    "claimed_at_ms = NULL WHERE session = ?",
                    (now, ticket.session),
                )
                return True
            conn.execute("DELETE FROM session_claims WHERE session = ?", (ticket.session,))
            return False

        if await self._b.write(op, point=False):
            self._b.sessions_ready.fire()

    async def held(self) -> tuple[TicketHeld, ...]:
        now = self._b.clock.now_ms()
        rows = await self._b.read(
            lambda c: c.execute(
                "SELECT session, owner, available_at_ms FROM session_claims "
                "WHERE owner IS NOT NULL AND available_at_ms > ? ORDER BY session",
                (now,),
            ).fetchall()
        )
        return tuple(TicketHeld(session=s, worker=w, expires_at_ms=at) for s, w, at in rows)

    async def release(self, worker: str) -> tuple[str, ...]:
        def op(conn: sqlite3.Connection, now: int) -> tuple[str, ...]:
            sessions = tuple(
                row[0]
                for row in conn.execute(
                    "SELECT session FROM session_claims WHERE owner = ? ORDER BY session",
                    (worker,),
                )
            )
            # as `done(again_in_ms=0)`: held by nobody, handed out now, pending items or not
            conn.execute(
                "UPDATE session_claims SET owner = NULL, ticket = '', available_at_ms = ? "
                "WHERE owner = ?",
                (now, worker),
            )
            return sessions

        released: tuple[str, ...] = await self._b.write(op, point=False)
        if released:
            self._tell(*released)
            self._b.sessions_ready.fire()
        return released

    async def position(self) -> int:
        return self._at

    async def wait(self, session: str, *, since: int, timeout_ms: int) -> bool:
        b = self._b
        deadline = b.clock.now_ms() + max(timeout_ms, 0)
        while not b.closed:
            told = self._news.waiter(session)
            if self._news.since(session, since):
                return True
            if b.clock.now_ms() >= deadline:
                return False
            polled = b.clock.now_ms() + b.poll_interval_ms
            await b.sleep_until(told, None, deadline)
            if b.clock.now_ms() >= polled:  # another process's change is not told here
                return True
        return True

    async def backlog(self) -> Backlog:
        def run(c: sqlite3.Connection) -> tuple[int, int | None, int]:
            pending, oldest = c.execute(
                "SELECT COUNT(*), MIN(appended_at_ms) FROM inbox WHERE status = 'pending'"
            ).fetchone()
            (rejected,) = c.execute(
                "SELECT COUNT(*) FROM inbox WHERE status = 'rejected'"
            ).fetchone()
            return pending, oldest, rejected

        pending, oldest, rejected = await self._b.read(run)
        age = 0 if oldest is None else max(0, self._b.clock.now_ms() - oldest)
        return Backlog(pending=pending, oldest_age_ms=age, dead=rejected)


class _Outbox:
    def __init__(self, broker: SqliteBroker) -> None:
        self._b = broker

    async def enqueue(
        self, delivery_id: str, session: str, lane: str, outbound: FrozenJsonObject, *, now_ms: int
    ) -> bool:
        body = _json(outbound)

        def op(conn: sqlite3.Connection, _: int) -> bool:
            cursor = conn.execute(
                "INSERT OR IGNORE INTO outbox (id, session, lane, outbound, due_at_ms, "
                "created_at_ms) VALUES (?, ?, ?, ?, ?, ?)",
                (delivery_id, session, lane, body, now_ms, now_ms),
            )
            return cursor.rowcount == 1

        created: bool = await self._b.write(op, point=False)
        if created:
            self._b.deliveries_due.fire()
        return created

    async def claim(
        self, worker: str, *, now_ms: int, limit: int, lease_ms: int
    ) -> tuple[ClaimedDelivery, ...]:
        if lease_ms <= 0:
            raise ValueError(f"lease_ms must be positive, got {lease_ms}")
        if limit <= 0:
            return ()
        expires = now_ms + lease_ms
        b = self._b

        def op(conn: sqlite3.Connection, _: int) -> list[tuple[tuple[Any, ...], str]]:
            b.lazy_purge_outbox(conn, now_ms)
            ids = [
                row[0]
                for row in conn.execute(
                    "SELECT id FROM outbox WHERE status = 'pending' AND due_at_ms <= ? AND "
                    "(lease_expires_at_ms IS NULL OR lease_expires_at_ms <= ?) "
                    "ORDER BY due_at_ms, id LIMIT ?",
                    (now_ms, now_ms, limit),
                )
            ]
            claimed = []
            for delivery_id in ids:
                token = b.ids.next()
                conn.execute(
                    "UPDATE outbox SET attempts = attempts + 1, lease_owner = ?, lease_token = ?, "
                    "lease_expires_at_ms = ?, unknown_outcome = CASE WHEN lease_token IS NULL "
                    "THEN unknown_outcome ELSE 1 END WHERE id = ?",
                    (worker, token, expires, delivery_id),
                )
                row = conn.execute(
                    f"SELECT {_OUTBOX_COLUMNS} FROM outbox WHERE id = ?", (delivery_id,)
                ).fetchone()
                claimed.append((row, token))
            return claimed

        rows = await b.write(op)
        return tuple(
            ClaimedDelivery(delivery=_delivery(row), token=token, lease_expires_at_ms=expires)
            for row, token in rows
        )

    async def _settle(self, claimed: ClaimedDelivery, sql: str, *args: Any) -> bool:
        def op(conn: sqlite3.Connection, _: int) -> bool:
            cursor = conn.execute(
                f"UPDATE outbox SET {sql}, {_CLEAR_LEASE} "
                "WHERE id = ? AND status = 'pending' AND lease_token = ?",
                (*args, claimed.delivery.id, claimed.token),
            )
            return cursor.rowcount == 1

        settled: bool = await self._b.write(op, point=False)
        return settled

    async def settle_delivered(self, claimed: ClaimedDelivery, *, now_ms: int) -> bool:
        return await self._settle(claimed, "status = 'delivered', settled_at_ms = ?", now_ms)

    async def settle_retry(
        self,
        claimed: ClaimedDelivery,
        *,
        due_at_ms: int,
        reason: str,
        unknown_outcome: bool,
        now_ms: int,
    ) -> bool:
        settled = await self._settle(
            claimed,
            "due_at_ms = ?, last_error = ?, unknown_outcome = ?",
            due_at_ms,
            reason,
            int(unknown_outcome),
        )
        if settled:
            self._b.deliveries_due.fire()
        return settled

    async def settle_dead(self, claimed: ClaimedDelivery, *, reason: str, now_ms: int) -> bool:
        return await self._settle(
            claimed, "status = 'dead', last_error = ?, settled_at_ms = ?", reason, now_ms
        )

    async def get(self, delivery_id: str) -> Delivery | None:
        row = await self._b.read(
            lambda c: c.execute(
                f"SELECT {_OUTBOX_COLUMNS} FROM outbox WHERE id = ?", (delivery_id,)
            ).fetchone()
        )
        return None if row is None else _delivery(row)

    async def list(
        self, status: DeliveryStatus, *, after: str | None = None, limit: int = 100
    ) -> tuple[Delivery, ...]:
        rows = await self._b.read(
            lambda c: c.execute(
                f"SELECT {_OUTBOX_COLUMNS} FROM outbox WHERE status = ? AND id > ? "
                "ORDER BY id LIMIT ?",
                (status, after or "", max(limit, 0)),
            ).fetchall()
        )
        return tuple(_delivery(row) for row in rows)

    async def _operate(self, delivery_id: str, sql: str, when: str, now_ms: int) -> Operated | None:
        """Change a delivery where `when` holds; return it as it is after, and whether it did.

        `now_ms` is every ``:now`` of `sql` and `when`.
        """

        def op(conn: sqlite3.Connection, _: int) -> tuple[tuple[Any, ...] | None, bool]:
            changed = conn.execute(
                f"UPDATE outbox SET {sql}, {_CLEAR_LEASE} WHERE id = :id AND ({when})",
                {"id": delivery_id, "now": now_ms},
            ).rowcount
            row: tuple[Any, ...] | None = conn.execute(
                f"SELECT {_OUTBOX_COLUMNS} FROM outbox WHERE id = ?", (delivery_id,)
            ).fetchone()
            return row, changed > 0

        row, changed = await self._b.write(op)
        return None if row is None else Operated(delivery=_delivery(row), changed=changed)

    async def redeliver(self, delivery_id: str, *, now_ms: int) -> Operated | None:
        operated = await self._operate(
            delivery_id,
            "status = 'pending', attempts = 0, due_at_ms = :now, settled_at_ms = NULL",
            "status = 'dead'",
            now_ms,
        )
        if operated is not None and operated.changed:
            self._b.deliveries_due.fire()
        return operated

    async def discard(self, delivery_id: str, *, now_ms: int) -> Operated | None:
        return await self._operate(
            delivery_id,
            "status = 'discarded', settled_at_ms = :now",
            # a pending one a deliverer holds is being sent: not while its attempt lasts
            "status = 'dead' OR (status = 'pending' AND (lease_token IS NULL "
            "OR lease_expires_at_ms <= :now))",
            now_ms,
        )

    async def holders(self, *, now_ms: int) -> tuple[str, ...]:
        def run(c: sqlite3.Connection) -> tuple[str, ...]:
            rows = c.execute(
                "SELECT DISTINCT lease_owner FROM outbox WHERE status = 'pending' AND "
                "lease_token IS NOT NULL AND lease_expires_at_ms > ? ORDER BY lease_owner",
                (now_ms,),
            )
            return tuple(str(row[0]) for row in rows if row[0] is not None)

        return await self._b.read(run)

    async def release(self, worker: str, *, now_ms: int) -> tuple[str, ...]:
        live = (
            "status = 'pending' AND lease_owner = ? AND lease_token IS NOT NULL "
            "AND lease_expires_at_ms > ?"
        )

        def op(conn: sqlite3.Connection, _: int) -> tuple[str, ...]:
            ids = tuple(
                str(row[0])
                for row in conn.execute(
                    f"SELECT id FROM outbox WHERE {live} ORDER BY id", (worker, now_ms)
                )
            )
            # lapsed now: the token stays, so the next claim sets `unknown_outcome`
            conn.execute(
                f"UPDATE outbox SET lease_expires_at_ms = ? WHERE {live}", (now_ms, worker, now_ms)
            )
            return ids

        released: tuple[str, ...] = await self._b.write(op)
        if released:
            self._b.deliveries_due.fire()
        return released

    async def backlog(self, *, now_ms: int) -> Backlog:
        def run(c: sqlite3.Connection) -> tuple[int, int | None, int]:
            (pending,) = c.execute(
                "SELECT COUNT(*) FROM outbox WHERE status = 'pending'"
            ).fetchone()
            (oldest,) = c.execute(
                "SELECT MIN(due_at_ms) FROM outbox WHERE status = 'pending' AND due_at_ms <= ?",
                (now_ms,),
            ).fetchone()
            (dead,) = c.execute("SELECT COUNT(*) FROM outbox WHERE status = 'dead'").fetchone()
            return pending, oldest, dead

        pending, oldest, dead = await self._b.read(run)
        age = 0 if oldest is None else now_ms - oldest
        return Backlog(pending=pending, oldest_age_ms=age, dead=dead)

    async def wait(self, timeout_ms: int) -> None:
        b = self._b
        deadline = b.clock.now_ms() + max(timeout_ms, 0)

        def next_due(c: sqlite3.Connection) -> int | None:
            """When the first pending delivery can be claimed (due, and no live lease)."""
            (free,) = c.execute(
                "SELECT MIN(due_at_ms) FROM outbox WHERE status = 'pending' AND lease_token IS NULL"
            ).fetchone()
            (leased,) = c.execute(
                "SELECT MIN(MAX(due_at_ms, lease_expires_at_ms)) FROM outbox "
                "WHERE status = 'pending' AND lease_token IS NOT NULL"
            ).fetchone()
            times = [t for t in (free, leased) if t is not None]
            return min(times) if times else None

        while not b.closed:
            signal = b.deliveries_due.arm()
            due = await b.read(next_due)
            now = b.clock.now_ms()
            if (due is not None and due <= now) or now >= deadline:
                return
            await b.sleep_until(signal, due, deadline)


class _Threads:
    def __init__(self, broker: SqliteBroker) -> None:
        self._b = broker

    async def remember(
        self, session: str, lane: str, thread: FrozenJsonObject, reply_context: FrozenJsonObject
    ) -> None:
        args = (session, lane, _json(thread), _json(reply_context))

        def op(conn: sqlite3.Connection, _: int) -> None:
            conn.execute(_REMEMBER, args)

        await self._b.write(op)

    async def get(self, session: str, lane: str) -> ThreadState | None:
        rows = await self._select("session = ? AND lane = ?", session, lane)
        return rows[0] if rows else None

    async def list(self, session: str) -> tuple[ThreadState, ...]:
        return await self._select("session = ? ORDER BY lane", session, whole=True)

    async def _select(self, where: str, *args: Any, whole: bool = False) -> tuple[ThreadState, ...]:
        rows = await self._b.read(
            lambda c: c.execute(
                "SELECT session, lane, thread, reply_context, replied_through FROM threads "
                f"WHERE {where}",
                args,
            ).fetchall(),
            whole=whole,
        )
        return tuple(
            ThreadState(
                session=session,
                lane=lane,
                thread=json.loads(thread),
                reply_context=json.loads(context),
                replied_through=through,
            )
            for session, lane, thread, context, through in rows
        )

    async def mark_replied(self, session: str, lane: str, seq: int) -> None:
        def op(conn: sqlite3.Connection, _: int) -> None:
            conn.execute(
                "UPDATE threads SET replied_through = MAX(replied_through, ?) "
                "WHERE session = ? AND lane = ?",
                (seq, session, lane),
            )

        await self._b.write(op)

    async def rebase(self, session: str, seq: int) -> int:
        def op(conn: sqlite3.Connection, _: int) -> int:
            return conn.execute(
                "UPDATE threads SET replied_through = ? WHERE session = ?", (seq, session)
            ).rowcount

        lanes: int = await self._b.write(op)
        return lanes


class _Marks:
    def __init__(self, broker: SqliteBroker) -> None:
        self._b = broker

    async def get(self, name: str) -> str | None:
        value: str | None = await self._b.read(lambda c: _mark(c, name))
        return value

    async def put(self, name: str, value: str, *, expect: str | None) -> bool:
        def op(conn: sqlite3.Connection, _: int) -> bool:
            if _mark(conn, name) != expect:
                return False
            conn.execute(
                "INSERT INTO marks (name, value) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                (name, value),
            )
            return True

        return await self._b.write(op)


class _Audit:
    def __init__(self, broker: SqliteBroker) -> None:
        self._b = broker

    async def record(self, event: NewAuditEvent) -> AuditEvent:
        details = _json(event.details)

        def op(conn: sqlite3.Connection, now: int) -> tuple[int, int]:
            cursor = conn.execute(
                "INSERT INTO audit (at_ms, actor, action, session, lane, target, outcome, "
                "details) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (now, event.actor, event.action, event.session, event.lane, event.target,
                 event.outcome, details),
            )  # fmt: skip
            assert cursor.lastrowid is not None
            return cursor.lastrowid, now

        number, at_ms = await self._b.write(op)
        return AuditEvent(**event.model_dump(), id=_format_id(number), at_ms=at_ms)

    async def list(
        self,
        *,
        session: str | None = None,
        lane: str | None = None,
        after: str | None = None,
        limit: int = 100,
    ) -> tuple[AuditEvent, ...]:
        where = ["id >= ?"]
        args: list[Any] = [0 if after is None else _first_id_after(after)]
        if session is not None:
            where.append("session = ?")
            args.append(session)
        if lane is not None:
            where.append("lane = ?")
            args.append(lane)
        args.append(max(limit, 0))
        sql = f"SELECT {_AUDIT_COLUMNS} FROM audit WHERE {' AND '.join(where)} ORDER BY id LIMIT ?"
        rows = await self._b.read(lambda c: c.execute(sql, args).fetchall())
        return tuple(_event(row) for row in rows)


class _Blobs:
    def __init__(self, broker: SqliteBroker, limits: BlobLimits) -> None:
        self._b = broker
        self._limits = limits

    @property
    def max_blob_bytes(self) -> int:
        return self._limits.max_blob_bytes

    async def put(self, session: str, data: bytes, *, key: str | None = None) -> BlobInfo:
        limits = self._limits
        limits.check_size(len(data))
        id_ = blob_id(data)

        def op(conn: sqlite3.Connection, now: int) -> BlobInfo:
            # only blobs past their retention go, and only to make room (D222)
            conn.execute(
                "DELETE FROM blob_keys WHERE session = ? AND blob IN (SELECT id FROM blobs "
                "WHERE session = ? AND keep_until_ms <= ?)",
                (session, session, now),
            )
            conn.execute(
                "DELETE FROM blobs WHERE session = ? AND keep_until_ms <= ?", (session, now)
            )
            until = now + limits.retention_ms
            held = conn.execute(
                "SELECT 1 FROM blobs WHERE session = ? AND id = ?", (session, id_)
            ).fetchone()
            if held is None:
                total = conn.execute(
                    "SELECT COALESCE(SUM(size), 0) FROM blobs WHERE session = ?", (session,)
                ).fetchone()[0]
                limits.check_room(int(total), len(data))
                conn.execute(
                    "INSERT INTO blobs (session, id, size, keep_until_ms, data) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (session, id_, len(data), until, data),
                )
            else:
                conn.execute(
                    "UPDATE blobs SET keep_until_ms = ? WHERE session = ? AND id = ?",
                    (until, session, id_),
                )
            if key is not None:
                conn.execute(
                    "INSERT INTO blob_keys (session, key, blob) VALUES (?, ?, ?) "
                    "ON CONFLICT (session, key) DO UPDATE SET blob = excluded.blob",
                    (session, key, id_),
                )
            return BlobInfo(id=id_, size=len(data), keep_until_ms=until)

        return await self._b.write(op)

    async def find(self, session: str, key: str) -> BlobInfo | None:
        now = self._b.clock.now_ms()
        rows = await self._b.read(
            lambda c: c.execute(
                "SELECT b.id, b.size, b.keep_until_ms FROM blob_keys k JOIN blobs b "
                "ON b.session = k.session AND b.id = k.blob "
                "WHERE k.session = ? AND k.key = ? AND b.keep_until_ms > ?",
                (session, key, now),
            ).fetchall()
        )
        if not rows:
            return None
        id_, size, until = rows[0]
        return BlobInfo(id=id_, size=size, keep_until_ms=until)

    async def get(self, session: str, blob_id: str) -> bytes | None:
        now = self._b.clock.now_ms()
        rows = await self._b.read(
            lambda c: c.execute(
                "SELECT data FROM blobs WHERE session = ? AND id = ? AND keep_until_ms > ?",
                (session, blob_id, now),
            ).fetchall()
        )
        return bytes(rows[0][0]) if rows else None
