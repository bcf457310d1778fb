"""The SQLite backend: the embedded default. One database file holds many sessions.

Every mutation is one ``BEGIN IMMEDIATE`` transaction that checks the writer's fencing token
against `writer_leases`, allocates `seq` from the session row, writes the item and updates the
projections (lane leaves, open operations, names, labels, running stats), so a write either
happened completely or not at all. WAL mode; ``synchronous=effects`` by default: every commit
survives a process crash, and a durability point (an acknowledgement, a tool that must not run
twice, a decision, an operation's end: `SqliteSessionStorage.sync`, a write durable on return)
fsyncs the WAL, so power loss loses nothing anything outside depends on (D233). ``normal`` never
fsyncs (power loss may lose the last transactions), ``full`` fsyncs every commit. All SQLite
calls run one at a time in submission order, so concurrent writes from many lanes resolve in
commit order: on one thread per repository, except deferred writes and a storage's reads while
that thread is idle, which run on the event loop (they never wait: D113, D115, D117, D118);
commits always run on the thread. While it works, a read of a session holding no deferred write
runs on the loop on a second, read-only connection (D121). The thread, the connection's policy
and those reads are the plumbing the broker and the web mailbox use too
(`harness_core.backends.sqlite`, D191).

Restore reads are index seeks plus bounded scans: open operations come from their own table,
an operation's records from ``(session_id, lane, seq)``, a lane's records of one type (or
operation kind) from ``(session_id, lane, type, seq)``, a lane's own entries along parent links
(by primary-key lookups, or by the seq index where the path holds at least half of the entries
it passes: `_walk`); none of them touches more than that of other lanes' traffic or older
history. Usage
sums per lane and per entry are running projections (`usage_sums`), like the session's.

A new database gets 1 KiB pages (`PAGE_SIZE`; SQLite's default is 4 KiB). A commit writes
every page it dirtied to the WAL in full, and a turn's small appends dirty a page of each index
they touch: with 1 KiB pages a turn writes about a third of the bytes (276 -> 102 KiB measured)
at the same turn time, and a 4,000-entry path reads about 20% slower. An existing database keeps
the page size it was created with.

Schema version 2 changed the type indexes and added `usage_sums`; version 3 (this module) added
a `checksum` column to the four log tables (D240). An older database is upgraded in place on
first use (one transaction; rows written before keep a NULL checksum and are validated in full
when read), and a newer one refuses older code, which would not maintain what it added.

Every row of the log tables carries the CRC32C of its payload and its own columns
(`codec.checksum`): a read verifies it, then builds the item with the trusted decoders (no
validation of what the write already validated); a mismatch raises `StoreCorrupted` naming the
session, the table and the seq.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from harness_core.backends.batch import WriteQueue
from harness_core.backends.sqlite import (
    ConnectionPolicy,
    Database,
    SqliteExecutor,
    Synchronous,
    open_read_only,
)
from harness_core.clock import Clock, SystemClock
from harness_core.errors import SessionError, StoreCorrupted
from harness_core.frozen import JsonValue
from harness_core.ids import IdGenerator, Uuid7Ids
from harness_core.messages import TokenUsage
from harness_core.session.codec import (
    checksum,
    corrupted,
    decode,
    decode_entry,
    decode_record,
    encode,
    encode_entry,
    encode_fact,
    encode_record,
    fact_adapter,
    fact_set,
    lane_move,
    stored_entry,
    stored_record,
    trusted_entry,
    trusted_fact,
    trusted_record,
)
from harness_core.session.collector import collector_paused
from harness_core.session.durability import durability_deferred
from harness_core.session.entries import CustomEntry, Entry, MessageEntry
from harness_core.session.names import check_lane_name, check_session_id
from harness_core.session.records import OperationFinished, OperationStarted, Record, Usage
from harness_core.session.types import (
    BranchQuery,
    EntryQuery,
    Fact,
    FactSet,
    LabelFact,
    LaneMove,
    LanePointer,
    LaneSlice,
    LeaseHolder,
    LogItem,
    NameFact,
    RecordQuery,
    SessionMetadata,
    SessionStats,
    StoredEntry,
    StoredRecord,
    WriterLease,
)
from harness_core.storage._branch import BranchNode, BranchScan, SinceScan, drive
from harness_core.storage._leases import LeaseRow, check_acquire, check_current, check_ttl
from harness_core.storage._projections import new_metadata, record_run_id, replay_log
from harness_core.storage._rules import (
    add_usage,
    stats_from_counters,
    usage_from_values,
    usage_values,
)
from harness_core.storage._slice import (
    QUEUE_TYPES,
    assemble_lane_slice,
    entries_anchor,
    leaf_mismatch,
    single_open_operation,
)

__all__ = ["SqliteSessionRepo", "SqliteSessionStorage", "Synchronous"]

SCHEMA_VERSION = 3
PAGE_SIZE = 1024
"""The page size of a database this backend creates (see the module docstring)."""
CHECKPOINT_EVERY = 48
"""Under ``effects`` the store checkpoints its WAL itself, on its I/O thread, once this many
commits passed since the last checkpoint (SQLite's automatic checkpoint is off on its
connection: a commit on the loop must never run one, D251)."""
_T = TypeVar("_T")

_USAGE_COLUMNS = (
    "u_input", "u_output", "u_cache_read", "u_cache_write", "u_total_tokens", "c_input",
    "c_output", "c_cache_read", "c_cache_write", "c_total",
)  # fmt: skip
_STAT_COLUMNS = ("n_entries", "n_messages", "n_records", *_USAGE_COLUMNS)
_USAGE_SUM_SQL = (
    f"SELECT {', '.join(_USAGE_COLUMNS)} FROM usage_sums WHERE session_id=? AND scope=? AND key=?"
)
_PUT_USAGE_SUM_SQL = f"INSERT OR REPLACE INTO usage_sums VALUES (?,?,?,{','.join('?' * 10)})"


_SESSION_TABLES = (
    "entries", "records", "lanes", "open_operations", "lane_moves", "facts", "labels",
    "usage_sums", "writer_leases", "sessions",
)  # fmt: skip


_Op = tuple[str, "WriterLease | None", Callable[["_Tx"], Any], bool]
"""A queued mutation: session id, the writer's lease, the work on a `_Tx`, and whether its
commit may wait for `sync` (deferred durability)."""


class _Tx:
    """The writes of one session within one transaction (on the loop or the I/O thread).

    It lives as long as the transaction (`_Db.txs`): the batches of deferred writes that join an
    open transaction continue from its counters, lease and lane leaves instead of reading them
    again, since nobody else can write while this connection holds the write lock (D253).
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        session_id: str,
        last_seq: int,
        now: int,
        counters: Sequence[float] = (0,) * len(_STAT_COLUMNS),
    ) -> None:
        self.conn = conn
        self.sid = session_id
        self.seq = last_seq
        self.now = now
        """When this transaction runs: the time checked against leases and given to items."""
        self.counters = list(counters)
        """The session's running counters after the writes so far (written by `finish`)."""
        self.wrote = False
        """This batch wrote (its `finish` stores the counters)."""
        self.leaves: dict[str, str | None] = {}
        """The leaf of each lane read or moved in this transaction."""

    @property
    def next_seq(self) -> int:
        return self.seq + 1

    def one(self, sql: str, *args: Any) -> Any:
        return self.conn.execute(sql, (self.sid, *args)).fetchone()

    def lane_leaf(self, lane: str) -> str | None:
        if lane in self.leaves:
            return self.leaves[lane]
        check_lane_name(lane)
        row = self.one("SELECT leaf_id FROM lanes WHERE session_id=? AND lane=?", lane)
        if row is None:
            raise SessionError("unknown_lane", f"lane {lane!r} does not exist")
        leaf: str | None = row[0]
        self.leaves[lane] = leaf
        return leaf

    def require_unused(self, item_id: str) -> None:
        if self.conn.execute(_USED_SQL, (self.sid, item_id, self.sid, item_id)).fetchone():
            raise SessionError("already_exists", f"id {item_id!r} is already used in this session")

    def require_target(self, target: str | None) -> None:
        if target is not None and not self.one(
            "SELECT 1 FROM entries WHERE session_id=? AND id=?", target
        ):
            raise SessionError("not_found", f"entry {target!r} does not exist")

    def apply(self, item: LogItem, payload: str | None = None) -> None:
        """Write a checked item and its projections (`payload` is its canonical encoding)."""
        c, sid = self.conn, self.sid
        if isinstance(item, StoredEntry):
            entry = item.entry
            custom = entry.custom_type if isinstance(entry, CustomEntry) else None
            payload = payload or encode_entry(entry)
            crc = checksum(payload, item.seq, item.timestamp, item.lane, item.parent_id)
            c.execute(
                "INSERT INTO entries VALUES (?,?,?,?,?,?,?,?,?,?)",
                (sid, entry.id, item.seq, item.timestamp, item.lane, item.parent_id, entry.type,
                 custom, payload, crc),
            )  # fmt: skip
            if item.lane is not None:
                c.execute(
                    "UPDATE lanes SET leaf_id=? WHERE session_id=? AND lane=?",
                    (entry.id, sid, item.lane),
                )
                self.leaves[item.lane] = entry.id
        elif isinstance(item, StoredRecord):
            record = item.record
            kind = record.intent.kind if isinstance(record, OperationStarted) else None
            if isinstance(record, Usage):  # first: a sum out of range refuses the write
                self.add_usage(record)
            payload = payload or encode_record(record)
            c.execute(
                "INSERT INTO records VALUES (?,?,?,?,?,?,?,?,?,?)",
                (sid, item.seq, record.id, record.lane, record_run_id(record), record.type, kind,
                 item.timestamp, payload, checksum(payload, item.seq, item.timestamp)),
            )  # fmt: skip
            if isinstance(record, OperationStarted):
                c.execute(
                    "INSERT INTO open_operations VALUES (?,?,?,?)",
                    (sid, record.lane, item.seq, record.id),
                )
            elif isinstance(record, OperationFinished):
                c.execute(
                    "DELETE FROM open_operations WHERE session_id=? AND lane=? AND run_id=?",
                    (sid, record.lane, record.run_id),
                )
        elif isinstance(item, LaneMove):
            crc = checksum("", item.seq, item.timestamp, item.lane, item.leaf_id, int(item.created))
            c.execute(
                "INSERT INTO lane_moves VALUES (?,?,?,?,?,?,?)",
                (sid, item.seq, item.timestamp, item.lane, item.leaf_id, int(item.created), crc),
            )
            c.execute("INSERT OR REPLACE INTO lanes VALUES (?,?,?)", (sid, item.lane, item.leaf_id))
            self.leaves[item.lane] = item.leaf_id
        else:
            fact = item.fact
            payload = payload or encode_fact(fact)
            c.execute(
                "INSERT INTO facts VALUES (?,?,?,?,?)",
                (
                    sid,
                    item.seq,
                    item.timestamp,
                    payload,
                    checksum(payload, item.seq, item.timestamp),
                ),
            )
            if isinstance(fact, NameFact):
                c.execute("UPDATE sessions SET name=? WHERE session_id=?", (fact.name, sid))
            elif fact.label is None:
                c.execute(
                    "DELETE FROM labels WHERE session_id=? AND target_id=?", (sid, fact.target_id)
                )
            else:
                c.execute(
                    "INSERT OR REPLACE INTO labels VALUES (?,?,?)",
                    (sid, fact.target_id, fact.label),
                )
        self.seq = item.seq
        self.wrote = True
        if isinstance(item, StoredEntry):
            self.counters[0] += 1
            self.counters[1] += isinstance(item.entry, MessageEntry)
        elif isinstance(item, StoredRecord):
            self.counters[2] += 1

    def add_usage(self, record: Usage) -> None:
        """Add a usage record to the session's, its lane's and its entry's running sums.

        Each sum gets one addition per record, in seq order, as in the memory reference.
        Raises ``SessionError("invalid_payload")`` (before anything changed) if a sum would
        leave its range.
        """
        session = add_usage(usage_from_values(self.counters[3:]), record.usage, "the session")
        scopes = [("lane", record.lane)]
        if record.entry_id is not None:
            scopes.append(("entry", record.entry_id))
        sums = []
        for scope, key in scopes:
            row = self.conn.execute(_USAGE_SUM_SQL, (self.sid, scope, key)).fetchone()
            current = TokenUsage() if row is None else usage_from_values(row)
            sums.append((scope, key, add_usage(current, record.usage, f"{scope} {key!r}")))
        for scope, key, total in sums:
            self.conn.execute(_PUT_USAGE_SUM_SQL, (self.sid, scope, key, *usage_values(total)))
        self.counters[3:] = usage_values(session)

    def finish(self, lease: LeaseRow | None) -> int | None:
        """Store the counters and renew the lease if past half-life; return its new expiry."""
        if not self.wrote:
            return None
        self.conn.execute(_UPDATE_STATS_SQL, (self.seq, *self.counters, self.sid))
        expires = None if lease is None else lease.renewed_by_write(self.now)
        if expires is not None:
            self.conn.execute(
                "UPDATE writer_leases SET expires_at_ms=? WHERE session_id=?", (expires, self.sid)
            )
        return expires


@dataclass(frozen=True, slots=True)
class _Written:
    """A committed mutation's result, and the lease expiry its batch set (None: unchanged)."""

    value: Any
    lease_expires_at_ms: int | None


def _upgrade_from_1(conn: sqlite3.Connection, path: Path) -> None:
    """Schema 1 -> 2, inside the caller's transaction: new type indexes, usage sums backfilled.

    The sums are rebuilt from the stored usage records in seq order, each one addition per
    record as a write would have done, so they equal what version 2 would have kept.
    """
    conn.execute("DROP INDEX IF EXISTS records_by_lane_type")
    conn.execute("DROP INDEX IF EXISTS records_by_type")
    conn.execute("DELETE FROM usage_sums")
    sums: dict[tuple[str, str, str], TokenUsage] = {}
    rows = conn.execute(
        "SELECT session_id, seq, payload FROM records WHERE type='usage' ORDER BY session_id, seq"
    )
    for sid, seq, payload in rows:
        record = decode_record(payload, f"{path}: session {sid!r} seq {seq}")
        assert isinstance(record, Usage)
        keys = [(sid, "lane", record.lane)]
        if record.entry_id is not None:
            keys.append((sid, "entry", record.entry_id))
        for key in keys:
            sums[key] = add_usage(sums.get(key, TokenUsage()), record.usage, f"{key}")
    conn.executemany(
        _PUT_USAGE_SUM_SQL, [(*key, *usage_values(total)) for key, total in sums.items()]
    )
    conn.execute("UPDATE schema_version SET version=2")


def _upgrade_from_2(conn: sqlite3.Connection) -> None:
    """Schema 2 -> 3, inside the caller's transaction: the log tables get a `checksum` column.

    Adding a column rewrites nothing: the rows already stored keep a NULL checksum, and a read
    of such a row validates it in full, as version 2 did. No checksum is computed for them here:
    one would vouch for bytes this version never checked.
    """
    for table in ("entries", "records", "lane_moves", "facts"):
        columns = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        if "checksum" not in columns:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN checksum INTEGER")
    conn.execute("UPDATE schema_version SET version=?", (SCHEMA_VERSION,))


def _refuse_foreign(path: Path) -> None:
    """Refuse another program's database: a mistyped store URL must not add our tables to it.

    Looked at read-only, before anything is written. A file that cannot be read that way is
    left to the open, which says what is wrong with it.

    Raises:
        SessionError: ``storage``: the file holds tables and none of them is ours.
    """
    if str(path) == ":memory:" or not path.is_file() or path.stat().st_size == 0:
        return
    try:
        conn = open_read_only(path)
    except (sqlite3.Error, OSError):
        return
    try:
        rows = conn.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' "
            "ORDER BY name"
        ).fetchall()
    except sqlite3.Error:
        return
    finally:
        conn.close()
    tables = [str(row[0]) for row in rows]
    if tables and "schema_version" not in tables:
        shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
        raise SessionError(
            "storage",
            f"{path} is not a gateway session store: it holds other tables ({shown}); nothing was "
            "written to it",
        )


class _Db(Database):
    """The store's connection, its schema, and the deferred writes' open transaction.

    Used on the repository's I/O thread and, for deferred writes and reads that never wait, on
    the event loop while that thread is idle, never both at once (`SqliteExecutor.on_loop`).
    """

    def __init__(self, path: Path, policy: ConnectionPolicy) -> None:
        self.in_tx = False
        """A write transaction holding deferred writes is open (see `write_batch`)."""
        self.txs: dict[str, tuple[_Tx, LeaseRow | None]] = {}
        """The open transaction's sessions: their writes so far and their lease (D253)."""
        self.pending: set[str] = set()
        """Sessions with deferred writes in the open transaction."""
        self.lost: set[str] = set()
        """Sessions whose deferred writes were rolled back: their next `sync` raises."""
        self.since_checkpoint = 0
        """Commits since this connection's last WAL checkpoint (``effects``, D251)."""
        _refuse_foreign(path)  # before the open, whose WAL pragma writes the file's header
        super().__init__(path, policy)

    def setup(self) -> None:
        """Create the tables (each ``CREATE ... IF NOT EXISTS``); check the schema version.

        A file already at this version is only read: no schema script, no write transaction
        (an open neither waits for another connection's writer nor fsyncs, D252).
        """
        if self.points:  # checkpoints run on the I/O thread only (`checkpoint_if_due`, D251)
            self.conn.execute("PRAGMA wal_autocheckpoint=0")
        version = self._version()
        if version == SCHEMA_VERSION:
            return
        if self.read_only or self.reads_only:  # a reader creates and upgrades nothing
            what = "no sessions table" if version is None else f"schema version {version}"
            raise SessionError(
                "storage",
                f"{self.path} has {what}, expected {SCHEMA_VERSION}; nothing was written to "
                "it, and a gateway that can write it creates or upgrades it",
            )
        schema = resources.files("harness_core.storage").joinpath("sqlite_schema.sql").read_text()
        self.conn.executescript(schema)
        with self.transaction():
            row = self.conn.execute("SELECT version FROM schema_version").fetchone()
            if row is None:
                self.conn.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION,))
            elif row[0] in (1, 2):
                if row[0] == 1:
                    _upgrade_from_1(self.conn, self.path)
                _upgrade_from_2(self.conn)
            elif row[0] != SCHEMA_VERSION:
                raise SessionError(
                    "storage",
                    f"{self.path} has schema version {row[0]}, expected {SCHEMA_VERSION}",
                )

    def _version(self) -> int | None:
        """The file's schema version; None for a new file (or one without the table)."""
        try:
            row = self.conn.execute("SELECT version FROM schema_version").fetchone()
        except sqlite3.OperationalError:  # no such table: a new file
            return None
        return None if row is None else int(row[0])

    def read(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run reads in one transaction (a consistent snapshot).

        Inside an open transaction of deferred writes the reads run in it: a storage sees its
        own writes, as with every other backend.
        """
        if self.in_tx:
            return fn(self.conn)
        return super().read(fn)

    def write_batch(self, ops: Sequence[_Op], now: int) -> list[Any]:
        """Run queued mutations in one transaction (group commit); one result or error each.

        Every mutation runs after its writer's token is checked, and refuses (a `SessionError`)
        before it changes anything: a refused one leaves no trace while the others commit (no
        savepoint is needed; one that changed a row before refusing rolls the whole
        transaction back, D253). Any other failure rolls the whole transaction back and
        raises: none of them happened (nor did the deferred writes the transaction held: their
        sessions' next `sync` raises). A result is a `_Written` (the value and the lease expiry
        the batch set, if it renewed).

        When every mutation of the batch is deferred, the transaction stays open: the next
        batch continues it, and `commit` (a `sync`, a durable write, any other use of the
        connection) commits them all at once: one commit, one fsync under ``FULL``. While it is
        open this connection holds the database's write lock, so it is open only between
        writes that no effect separates, and never when it holds no deferred write (a batch
        whose every write was refused ends it at once).
        """
        conn = self.conn
        results: list[Any] = []
        written: list[tuple[int, str]] = []
        sessions = self.txs  # empty unless this batch joins an open transaction
        for carried, _ in sessions.values():
            carried.now, carried.wrote = now, False
        # A lone write in a transaction of its own is refused by raising: the whole transaction
        # rolls back. An open transaction holding no deferred write holds nothing (one whose
        # batch left nothing pending was committed), so it counts as its own: the first write
        # of a batch opened on the loop (`begin_unless_busy`) is alone too.
        alone = len(ops) == 1 and not self.pending
        deferred = all(op[3] for op in ops)
        if not self.in_tx:
            conn.execute("BEGIN IMMEDIATE")
            self.in_tx = True
        try:
            for session_id, lease, fn, _ in ops:
                changes = conn.total_changes
                try:
                    if session_id not in sessions:
                        row = conn.execute(_SESSION_AND_LEASE_SQL, (session_id,)).fetchone()
                        if row is None:
                            raise SessionError(
                                "not_found", f"session {session_id!r} does not exist"
                            )
                        counters, lease_cols = row[1 : 1 + len(_STAT_COLUMNS)], row[-4:]
                        current = LeaseRow(*lease_cols) if lease_cols[0] is not None else None
                        tx = _Tx(conn, session_id, row[0], now, counters)
                        sessions[session_id] = (tx, current)
                    tx, current = sessions[session_id]
                    if lease is None:
                        raise SessionError(
                            "read_only", f"session {session_id!r} was opened without a lease"
                        )
                    check_current(current, lease, now)
                    written.append((len(results), session_id))
                    results.append(fn(tx))
                except SessionError as exc:
                    if alone:
                        raise
                    # nothing changed, so neither did the session's `_Tx` (`apply` moves it only
                    # after its first statement); a write that changed a row is rolled back whole
                    if conn.total_changes != changes:
                        raise SessionError(
                            "storage", f"a write changed the store before it was refused: {exc}"
                        ) from exc
                    if written and written[-1][0] == len(results):
                        written.pop()
                    results.append(exc)
            renewed: dict[str, int | None] = {}
            for sid, (tx, current) in sessions.items():
                renewed[sid] = expires = tx.finish(current)
                if expires is not None and current is not None:  # what the next batch checks
                    sessions[sid] = (tx, replace(current, expires_at_ms=expires))
        except BaseException:
            self.rollback()
            raise
        if deferred:
            self.pending.update(sid for _, sid in written)
        if not deferred:  # a write durable on return: its caller may acknowledge it
            self.commit(point=True)
        elif not self.pending:  # an empty transaction (all refused) holds no lock
            self.commit()
        for index, session_id in written:
            results[index] = _Written(results[index], renewed[session_id])
        return results

    def begin_unless_busy(self) -> bool:
        """Open the write transaction if the lock is free this instant; whether it did.

        Never waits (the busy timeout is zero on the loop): where another connection holds the
        write lock, the caller goes to the I/O thread, which waits the configured time.
        """
        self.busy.waits(False)
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return False
        self.in_tx = True
        return True

    def commit(self, *, point: bool = False) -> None:
        """Commit the open transaction, if any (its deferred writes survive a process crash).

        `point`: a durability point (`Database.durable`), even when nothing was open: every
        commit so far then survives power loss too.
        """
        if self.in_tx:
            try:
                self.conn.execute("COMMIT")
            except BaseException:
                self.rollback()
                raise
            self.in_tx = False
            self.pending.clear()
            self.txs.clear()
            self.committed(point=point)
        elif point:
            self.durable()

    def rollback(self) -> None:
        """Roll the open transaction back; sessions with deferred writes in it lose them."""
        with contextlib.suppress(sqlite3.Error):
            self.conn.execute("ROLLBACK")
        self.in_tx = False
        self.txs.clear()
        self.lost.update(self.pending)
        self.pending.clear()

    def committed(self, *, point: bool) -> None:
        """Note a commit (and count it towards the next checkpoint)."""
        self.since_checkpoint += 1
        super().committed(point=point)

    def durable(self) -> None:
        """A durability point (`Database.durable`), then the WAL checkpoint if one is due."""
        super().durable()
        self.checkpoint_if_due()

    def checkpoint_if_due(self) -> None:
        """Checkpoint the WAL (passive) if `CHECKPOINT_EVERY` commits passed: I/O thread only.

        Under ``effects`` SQLite's automatic checkpoint is off, so that a commit on the loop
        (`sync_on_loop`) never runs one: a checkpoint writes the database and fsyncs it. The
        I/O thread's commits run it instead, as often as the automatic one would (about a
        thousand 1 KiB pages). A passive checkpoint never waits for readers.
        """
        if self.points and not self.in_tx and self.since_checkpoint >= CHECKPOINT_EVERY:
            self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self.since_checkpoint = 0

    def sync(self, session_id: str, *, point: bool) -> None:
        """Commit the open transaction; raise if `session_id`'s deferred writes were lost.

        `point`: a durability point (see `SqliteSessionStorage.sync`). On the I/O thread.
        """
        self._commit_for(session_id, point=point)
        self.checkpoint_if_due()

    def sync_on_loop(self, session_id: str) -> bool:
        """`sync` of a commit that is not a durability point, on the loop; False: not here.

        Only under ``effects``, where such a commit writes the WAL and never fsyncs (it
        survives a process crash, the next point makes it survive power loss) and never
        checkpoints (`checkpoint_if_due`): a few writes to the page cache, cheaper than the
        hop to the I/O thread and back (D251). False when a checkpoint is due: the thread's
        commit runs it.
        """
        if not self.points or self.since_checkpoint >= CHECKPOINT_EVERY:
            return False
        self.busy.waits(False)  # a commit in WAL mode takes no lock it does not hold
        self._commit_for(session_id, point=False)
        return True

    def _commit_for(self, session_id: str, *, point: bool) -> None:
        if session_id in self.lost:
            self.lost.discard(session_id)
            raise SessionError(
                "storage", f"deferred writes of session {session_id!r} were rolled back"
            )
        self.commit(point=point)

    def lease_row(self, session_id: str) -> LeaseRow | None:
        return _lease_row(self.conn, session_id)

    def close(self) -> None:
        """Commit the deferred writes (they were applied and acknowledged), then close."""
        with contextlib.suppress(sqlite3.Error, OSError):
            self.commit(point=True)
        super().close()


def _lease_row(c: sqlite3.Connection, session_id: str) -> LeaseRow | None:
    row = c.execute(
        "SELECT owner, token, ttl_ms, expires_at_ms FROM writer_leases WHERE session_id=?",
        (session_id,),
    ).fetchone()
    return LeaseRow(*row) if row else None


def _entry_sum(payload: str, seq: int, timestamp: int, lane: str | None, parent: str | None) -> int:
    """`checksum(payload, seq, timestamp, lane, parent)`, built as one string.

    A context window reads thousands of entries: one formatted string is the cheaper way.
    """
    lane_text = "" if lane is None else lane
    parent_text = "" if parent is None else parent
    return checksum(f"{payload}\t{seq}\t{timestamp}\t{lane_text}\t{parent_text}")


def _entry_from_row(row: tuple[Any, ...], where: str) -> StoredEntry:
    """An entry row (`_ENTRY_COLS`): trusted when its checksum matches, else checked in full."""
    seq, timestamp, lane, parent_id, payload, crc = row
    if crc is not None and crc == _entry_sum(payload, seq, timestamp, lane, parent_id):
        return stored_entry(seq, timestamp, lane, parent_id, trusted_entry(payload, where))
    location = f"{where} entry seq {seq}"
    if crc is not None:
        raise corrupted(location, crc, checksum(payload, seq, timestamp, lane, parent_id))
    return StoredEntry(
        seq=seq,
        timestamp=timestamp,
        lane=lane,
        parent_id=parent_id,
        entry=decode_entry(payload, location),
    )


def _record_from_row(row: tuple[Any, ...], where: str) -> StoredRecord:
    """A record row (`_RECORD_COLS`): trusted when its checksum matches, else checked in full."""
    seq, timestamp, payload, crc = row
    if crc is not None and crc == checksum(payload, seq, timestamp):
        return stored_record(seq, timestamp, trusted_record(payload, where))
    location = f"{where} record seq {seq}"
    if crc is not None:
        raise corrupted(location, crc, checksum(payload, seq, timestamp))
    return StoredRecord(seq=seq, timestamp=timestamp, record=decode_record(payload, location))


def _fact_from_row(row: tuple[Any, ...], where: str) -> FactSet:
    seq, timestamp, payload, crc = row
    if crc is not None and crc == checksum(payload, seq, timestamp):
        return fact_set(seq, timestamp, trusted_fact(payload, where))
    location = f"{where} fact seq {seq}"
    if crc is not None:
        raise corrupted(location, crc, checksum(payload, seq, timestamp))
    return FactSet(seq=seq, timestamp=timestamp, fact=decode(fact_adapter, payload, location))


def _lane_move_from_row(row: tuple[Any, ...], where: str) -> LaneMove:
    seq, timestamp, lane, leaf_id, created, crc = row
    if crc is not None and crc == checksum("", seq, timestamp, lane, leaf_id, created):
        return lane_move(seq, timestamp, lane, leaf_id, bool(created))
    location = f"{where} lane move seq {seq}"
    if crc is not None:
        raise corrupted(location, crc, checksum("", seq, timestamp, lane, leaf_id, created))
    try:
        return LaneMove(
            seq=seq, timestamp=timestamp, lane=lane, leaf_id=leaf_id, created=bool(created)
        )
    except ValueError as exc:
        raise StoreCorrupted(f"{location} is invalid: {exc}", location=location) from exc


_ENTRY_COLS = "seq, timestamp, lane, parent_id, payload, checksum"
_SESSION_AND_LEASE_SQL = (
    f"SELECT s.last_seq, {', '.join('s.' + c for c in _STAT_COLUMNS)}, "
    "l.owner, l.token, l.ttl_ms, l.expires_at_ms FROM sessions s "
    "LEFT JOIN writer_leases l ON l.session_id = s.session_id WHERE s.session_id=?"
)
_UPDATE_STATS_SQL = (
    f"UPDATE sessions SET last_seq=?, {', '.join(c + '=?' for c in _STAT_COLUMNS)} "
    "WHERE session_id=?"
)
_USED_SQL = (
    "SELECT 1 FROM entries WHERE session_id=? AND id=? "
    "UNION ALL SELECT 1 FROM records WHERE session_id=? AND id=? LIMIT 1"
)
_LOG_SQL = """
SELECT seq, 'e', timestamp, lane, parent_id, payload, NULL, checksum FROM entries
 WHERE session_id=? AND seq>?
UNION ALL SELECT seq, 'r', timestamp, NULL, NULL, payload, NULL, checksum FROM records
 WHERE session_id=? AND seq>?
UNION ALL SELECT seq, 'l', timestamp, lane, leaf_id, NULL, created, checksum FROM lane_moves
 WHERE session_id=? AND seq>?
UNION ALL SELECT seq, 'f', timestamp, NULL, NULL, payload, NULL, checksum FROM facts
 WHERE session_id=? AND seq>?
ORDER BY seq LIMIT ?
"""
_WALK_SQL = (
    "WITH RECURSIVE path(id, type, custom_type, seq, timestamp, lane, parent_id, payload,"
    " checksum, depth) AS (SELECT id, type, custom_type, seq, timestamp, lane, parent_id,"
    " payload, checksum, 0 FROM entries WHERE session_id=?1 AND id=?2"
    " UNION ALL SELECT e.id, e.type, e.custom_type, e.seq, e.timestamp, e.lane, e.parent_id,"
    " e.payload, e.checksum, path.depth + 1 FROM path JOIN entries e"
    " ON e.session_id=?1 AND e.id=path.parent_id WHERE path.depth + 1 < ?3)"
    " SELECT id, type, custom_type, seq, timestamp, lane, parent_id, payload, checksum FROM path"
    " ORDER BY depth"
)
"""Up to ?3 entries of a path from ?2 toward the root, in one statement (a recursive CTE)."""
_SEQ_WALK_SQL = (
    "SELECT id, type, custom_type, seq, timestamp, lane, parent_id, payload, checksum"
    " FROM entries WHERE session_id=? AND seq<=? ORDER BY seq DESC LIMIT ?"
)
"""Up to ?3 of the session's entries, newest first from seq ?2 (the `entries_by_seq` range)."""
_SPAN_SQL = "SELECT COUNT(*) FROM entries WHERE session_id=? AND seq BETWEEN ? AND ?"
_WALK_BATCH = (32, 256, 2048)
"""Entries per walk statement: a short first read (most scans stop early), then longer ones."""
_RECORD_COLS = "seq, timestamp, payload, checksum"


class SqliteSessionStorage:
    """One session in a SQLite database."""

    def __init__(self, repo: SqliteSessionRepo, session_id: str, lease: WriterLease | None) -> None:
        self._repo = repo
        self._sid = session_id
        self._lease = lease
        self._closed = False
        self._where = f"sqlite session {session_id!r}"

    @property
    def session_id(self) -> str:
        """The session's id."""
        return self._sid

    @property
    def lease(self) -> WriterLease | None:
        """The writer lease, with the newest expiry this storage set; None when read-only."""
        return self._lease

    async def _read(self, fn: Callable[[sqlite3.Connection], _T], *, whole: bool = False) -> _T:
        """Run a read; `whole`: of the whole session (unbounded), kept off the loop."""
        if self._closed:
            raise SessionError("closed", f"storage of session {self._sid!r} is closed")
        return await self._repo.read(fn, inline=not whole, session=self._sid)

    async def _write(self, fn: Callable[[_Tx], _T]) -> _T:
        if self._closed:
            raise SessionError("closed", f"storage of session {self._sid!r} is closed")
        op = (self._sid, self._lease, fn, durability_deferred())
        done: _Written = await self._repo.writes.submit(op)
        if done.lease_expires_at_ms is not None and self._lease is not None:
            self._lease = self._lease.model_copy(update={"expires_at_ms": done.lease_expires_at_ms})
        result: _T = done.value
        return result

    async def renew_lease(self) -> WriterLease:
        """Extend this storage's lease by its ttl."""
        if self._closed:
            raise SessionError("closed", f"storage of session {self._sid!r} is closed")
        if self._lease is None:
            raise SessionError("read_only", f"session {self._sid!r} was opened without a lease")
        self._lease = await self._repo.renew_lease(self._lease)
        return self._lease

    async def sync(self, *, point: bool = True) -> None:
        """Commit this repository's open transaction of deferred writes (one commit for all).

        Under ``synchronous=effects`` a durability point then fsyncs the WAL once for every
        commit since the last point (`Database.durable`); otherwise the commit survives a
        process crash and the next point makes it survive power loss, and it runs on the loop
        while the I/O thread is idle (it never fsyncs nor checkpoints, D251).
        """
        if self._closed:
            raise SessionError("closed", f"storage of session {self._sid!r} is closed")
        await self._repo.sync(self._sid, point=point)

    async def get_metadata(self) -> SessionMetadata:
        """Return the session's metadata with its newest name."""
        metas = await self._read(lambda c: _metadata(c, self._sid))
        if not metas:
            raise SessionError("not_found", f"session {self._sid!r} does not exist")
        return metas[0]

    async def get_lanes(self) -> tuple[LanePointer, ...]:
        """Every lane, sorted by name."""
        rows = await self._read(
            lambda c: c.execute(
                "SELECT lane, leaf_id FROM lanes WHERE session_id=? ORDER BY lane", (self._sid,)
            ).fetchall(),
            whole=True,  # a session may hold 100,000 lanes
        )
        return tuple(LanePointer(lane=lane, leaf_id=leaf) for lane, leaf in rows)

    async def get_lane(self, lane: str) -> LanePointer | None:
        """One lane, or None."""
        row = await self._read(
            lambda c: c.execute(
                "SELECT leaf_id FROM lanes WHERE session_id=? AND lane=?", (self._sid, lane)
            ).fetchone()
        )
        return None if row is None else LanePointer(lane=lane, leaf_id=row[0])

    def _lane_move(
        self, lane: str, leaf_id: str | None, *, create: bool
    ) -> Callable[[_Tx], LaneMove]:
        check_lane_name(lane)

        def op(tx: _Tx) -> LaneMove:
            exists = tx.one("SELECT 1 FROM lanes WHERE session_id=? AND lane=?", lane) is not None
            if create and exists:
                raise SessionError("already_exists", f"lane {lane!r} already exists")
            if not create and not exists:
                raise SessionError("unknown_lane", f"lane {lane!r} does not exist")
            tx.require_target(leaf_id)
            item = LaneMove(
                seq=tx.next_seq,
                timestamp=tx.now,
                lane=lane,
                leaf_id=leaf_id,
                created=create,
            )
            tx.apply(item)
            return item

        return op

    async def create_lane(self, lane: str, at: str | None) -> LaneMove:
        """Create a lane at an entry (or the root)."""
        return await self._write(self._lane_move(lane, at, create=True))

    async def move_lane(self, lane: str, to: str | None) -> LaneMove:
        """Move a lane's leaf."""
        return await self._write(self._lane_move(lane, to, create=False))

    def _append(self, entry: Entry, lane: str, payload: str) -> Callable[[_Tx], StoredEntry]:
        def op(tx: _Tx) -> StoredEntry:
            parent = tx.lane_leaf(lane)
            tx.require_unused(entry.id)
            item = StoredEntry(
                seq=tx.next_seq,
                timestamp=tx.now,
                lane=lane,
                parent_id=parent,
                entry=entry,
            )
            tx.apply(item, payload)
            return item

        return op

    async def append_entry(self, entry: Entry, lane: str) -> StoredEntry:
        """Append an entry at the lane's leaf."""
        payload = encode_entry(entry)
        return await self._write(self._append(entry, lane, payload))

    async def append_entry_if_missing(self, entry: Entry, lane: str) -> tuple[StoredEntry, bool]:
        """Append unless the id exists with equal content."""
        payload = encode_entry(entry)
        append = self._append(entry, lane, payload)

        def op(tx: _Tx) -> tuple[StoredEntry, bool]:
            tx.lane_leaf(lane)  # an unknown lane is an error even when the append is a no-op
            row = tx.one(f"SELECT {_ENTRY_COLS} FROM entries WHERE session_id=? AND id=?", entry.id)
            if row is not None:
                if row[4] != payload:
                    raise SessionError(
                        "content_mismatch",
                        f"entry {entry.id!r} exists with different content "
                        "(provisioned-id corruption)",
                    )
                return _entry_from_row(row, self._where), False
            return append(tx), True

        return await self._write(op)

    async def append_record(self, record: Record) -> StoredRecord:
        """Append a record (operation starts are conditional)."""
        payload = encode_record(record)

        def op(tx: _Tx) -> StoredRecord:
            tx.lane_leaf(record.lane)
            tx.require_unused(record.id)
            if isinstance(record, OperationStarted):
                busy = tx.one(
                    "SELECT run_id FROM open_operations WHERE session_id=? AND lane=? "
                    "ORDER BY seq DESC LIMIT 1",
                    record.lane,
                )
                if busy is not None:
                    raise SessionError(
                        "lane_busy", f"lane {record.lane!r} already has open operation {busy[0]!r}"
                    )
            item = StoredRecord(seq=tx.next_seq, timestamp=tx.now, record=record)
            tx.apply(item, payload)
            return item

        return await self._write(op)

    async def _set_fact(self, fact: Fact) -> FactSet:
        payload = encode_fact(fact)

        def op(tx: _Tx) -> FactSet:
            if isinstance(fact, LabelFact):
                tx.require_target(fact.target_id)
            item = FactSet(seq=tx.next_seq, timestamp=tx.now, fact=fact)
            tx.apply(item, payload)
            return item

        return await self._write(op)

    async def set_name(self, name: str) -> FactSet:
        """Set the session name."""
        return await self._set_fact(NameFact(name=name))

    async def set_label(self, target_id: str, label: str | None) -> FactSet:
        """Set or clear an entry's label."""
        return await self._set_fact(LabelFact(target_id=target_id, label=label))

    async def get_entry(self, entry_id: str) -> StoredEntry | None:
        """Point lookup."""
        row = await self._read(
            lambda c: c.execute(
                f"SELECT {_ENTRY_COLS} FROM entries WHERE session_id=? AND id=?",
                (self._sid, entry_id),
            ).fetchone()
        )
        return None if row is None else _entry_from_row(row, self._where)

    async def get_record(self, record_id: str) -> StoredRecord | None:
        """Point lookup (the id index)."""
        row = await self._read(
            lambda c: c.execute(
                f"SELECT {_RECORD_COLS} FROM records WHERE session_id=? AND id=?",
                (self._sid, record_id),
            ).fetchone()
        )
        return None if row is None else _record_from_row(row, self._where)

    async def find_entries(self, query: EntryQuery | None = None) -> tuple[StoredEntry, ...]:
        """Session-wide entry query."""
        q = query or EntryQuery()
        sql = [f"SELECT {_ENTRY_COLS} FROM entries WHERE session_id=?"]
        args: list[Any] = [self._sid]
        if q.custom_type is not None:
            sql.append("AND custom_type=?")
            args.append(q.custom_type)
        elif q.type is not None:
            sql.append("AND type=?")
            args.append(q.type)
        _window(sql, args, q.after_seq, q.before_seq, q.order, q.limit)
        rows = await self._read(
            lambda c: c.execute(" ".join(sql), args).fetchall(), whole=q.limit is None
        )
        with collector_paused(len(rows)):
            return tuple(_entry_from_row(row, self._where) for row in rows)

    async def find_entries_on_branch(self, query: BranchQuery) -> tuple[StoredEntry, ...]:
        """Path query: parent-link point lookups from `start`."""

        def run(c: sqlite3.Connection) -> tuple[StoredEntry, ...]:
            if query.stop_at_id is not None and not _exists(c, self._sid, query.stop_at_id):
                raise SessionError("not_found", f"entry {query.stop_at_id!r} does not exist")
            rows: dict[str, tuple[Any, ...]] = {}
            nodes = drive(BranchScan(query), _walk(c, self._sid, query.start, rows))
            with collector_paused(len(nodes)):
                return tuple(_entry_from_row(rows[node.id], self._where) for node in nodes)

        return await self._read(run)

    async def find_records(self, query: RecordQuery | None = None) -> tuple[StoredRecord, ...]:
        """Record query: one index range in seq order (by run, kind, type or lane), filtered."""
        sql, args = _records_sql(self._sid, query or RecordQuery())
        rows = await self._read(lambda c: c.execute(sql, args).fetchall())
        with collector_paused(len(rows)):
            return tuple(_record_from_row(row, self._where) for row in rows)

    async def find_open_operations(
        self, lane: str | None, *, limit: int | None = None
    ) -> tuple[StoredRecord, ...]:
        """Open operations of a lane (None: of the session), newest first (the projection)."""
        if limit is not None and limit < 1:
            raise SessionError("invalid_query", f"limit must be positive, got {limit}")
        rows = await self._read(lambda c: _open_rows(c, self._sid, lane, limit))
        return tuple(_record_from_row(row, self._where) for row in rows)

    async def read_operation_records(self, lane: str, run_id: str) -> tuple[StoredRecord, ...]:
        """Records of the lane since an operation's start."""

        def run(c: sqlite3.Connection) -> tuple[StoredRecord, ...]:
            _require_lane(c, self._sid, lane)
            start = c.execute(
                "SELECT seq FROM records WHERE session_id=? AND id=? AND lane=? "
                "AND type='operation_started'",
                (self._sid, run_id, lane),
            ).fetchone()
            if start is None:
                raise SessionError("not_found", f"lane {lane!r} has no operation {run_id!r}")
            return self._records_since(c, lane, start[0])

        return await self._read(run)

    def _records_since(
        self, c: sqlite3.Connection, lane: str, seq: int
    ) -> tuple[StoredRecord, ...]:
        rows = c.execute(
            f"SELECT {_RECORD_COLS} FROM records "
            "WHERE session_id=? AND lane=? AND seq>=? ORDER BY seq",
            (self._sid, lane, seq),
        ).fetchall()
        return tuple(_record_from_row(row, self._where) for row in rows)

    async def read_lane_entries(self, lane: str, *, after: str | None) -> tuple[StoredEntry, ...]:
        """The lane's path back to an anchor."""
        return await self._read(
            lambda c: self._lane_entries(c, lane, _require_lane(c, self._sid, lane), after)
        )

    def _lane_entries(
        self, c: sqlite3.Connection, lane: str, leaf: str | None, after: str | None
    ) -> tuple[StoredEntry, ...]:
        after_seq = 0
        if after is not None:
            row = c.execute(
                "SELECT seq FROM entries WHERE session_id=? AND id=?", (self._sid, after)
            ).fetchone()
            if row is None:
                raise SessionError("not_found", f"entry {after!r} does not exist")
            after_seq = row[0]
        if leaf is None:
            if after is not None:
                raise SessionError("invalid_query", f"entry {after!r} is not on the lane's path")
            return ()
        rows: dict[str, tuple[Any, ...]] = {}
        nodes = drive(SinceScan(after, after_seq), _walk(c, self._sid, leaf, rows))
        with collector_paused(len(nodes)):
            return tuple(_entry_from_row(rows[node.id], self._where) for node in nodes)

    async def read_lane_slice(self, lane: str) -> LaneSlice:
        """The restore read: the same reads as `compose_lane_slice`, in one transaction.

        Kept in step with it by the conformance suite, which compares the two on every shape.
        """
        sid = self._sid

        def records(c: sqlite3.Connection, query: RecordQuery) -> list[StoredRecord]:
            return [
                _record_from_row(row, self._where) for row in c.execute(*_records_sql(sid, query))
            ]

        def run(c: sqlite3.Connection) -> LaneSlice:
            leaf = _require_lane(c, sid, lane)
            opened = [_record_from_row(row, self._where) for row in _open_rows(c, sid, lane, 2)]
            start = single_open_operation(lane, opened)
            newest_run = records(
                c,
                RecordQuery(lane=lane, type="operation_started", operation_kind="run", limit=1),
            )
            after = newest_run[0].seq if newest_run else 0
            queued: list[StoredRecord] = []
            for record_type in QUEUE_TYPES:
                queued += records(
                    c,
                    RecordQuery(lane=lane, type=record_type, after_seq=after, order="oldest_first"),
                )
            operation: tuple[StoredRecord, ...] = ()
            entries: tuple[StoredEntry, ...] = ()
            if start is not None:
                operation = self._records_since(c, lane, opened[0].seq)
                appended, anchor = entries_anchor(start, leaf)
                if appended:
                    try:
                        entries = self._lane_entries(c, lane, leaf, anchor)
                    except SessionError as exc:
                        corruption = leaf_mismatch(lane, leaf, start, exc)
                        if corruption is None:
                            raise
                        raise corruption from exc
            finished = records(c, RecordQuery(lane=lane, type="operation_finished", limit=1))
            return assemble_lane_slice(
                lane, leaf, opened, queued, operation, entries, finished[0] if finished else None
            )

        return await self._read(run)

    async def get_log(self, *, after_seq: int = 0, limit: int | None = None) -> tuple[LogItem, ...]:
        """Log items after a seq, merged from the four tables."""
        EntryQuery(after_seq=after_seq, limit=limit)
        args = (self._sid, after_seq) * 4 + (-1 if limit is None else limit,)
        rows = await self._read(lambda c: c.execute(_LOG_SQL, args).fetchall(), whole=limit is None)
        return tuple(self._log_item(row) for row in rows)

    def _log_item(self, row: tuple[Any, ...]) -> LogItem:
        seq, kind, timestamp, lane, other, payload, created, crc = row
        if kind == "e":
            return _entry_from_row((seq, timestamp, lane, other, payload, crc), self._where)
        if kind == "r":
            return _record_from_row((seq, timestamp, payload, crc), self._where)
        if kind == "l":
            return _lane_move_from_row((seq, timestamp, lane, other, created, crc), self._where)
        return _fact_from_row((seq, timestamp, payload, crc), self._where)

    async def get_name(self) -> str | None:
        """Newest session name."""
        return (await self.get_metadata()).name

    async def get_label(self, target_id: str) -> str | None:
        """Newest label of an entry."""
        row = await self._read(
            lambda c: c.execute(
                "SELECT label FROM labels WHERE session_id=? AND target_id=?",
                (self._sid, target_id),
            ).fetchone()
        )
        return None if row is None else str(row[0])

    async def get_usage(
        self, *, entry_id: str | None = None, lane: str | None = None
    ) -> TokenUsage:
        """The usage sum of an entry or of a lane (one primary-key read)."""
        if (entry_id is None) == (lane is None):
            raise SessionError("invalid_query", "get_usage takes exactly one of entry_id, lane")

        def run(c: sqlite3.Connection) -> TokenUsage:
            if lane is not None:
                _require_lane(c, self._sid, lane)
            scope, key = ("lane", lane) if lane is not None else ("entry", entry_id)
            row = c.execute(_USAGE_SUM_SQL, (self._sid, scope, key)).fetchone()
            return TokenUsage() if row is None else usage_from_values(row)

        return await self._read(run)

    async def get_stats(self) -> SessionStats:
        """Running counters."""
        row = await self._read(
            lambda c: c.execute(
                f"SELECT last_seq, {', '.join(_STAT_COLUMNS)} FROM sessions WHERE session_id=?",
                (self._sid,),
            ).fetchone()
        )
        if row is None:
            raise SessionError("not_found", f"session {self._sid!r} does not exist")
        return stats_from_counters(row)

    async def close(self) -> None:
        """Close this storage."""
        self._closed = True


def _records_sql(sid: str, q: RecordQuery) -> tuple[str, list[Any]]:
    """One index range in seq order (by run, kind, type or lane), filtered."""
    sql = [f"SELECT {_RECORD_COLS} FROM records WHERE session_id=?"]
    args: list[Any] = [sid]
    # Only operation starts have a kind, so a kind implies its type; and a run's records are
    # few, so with a run id the other terms are marked (unary +) as filters, not seeks.
    by_run = "+" if q.run_id is not None else ""
    for column, value in (
        ("run_id", q.run_id),
        (f"{by_run}lane", q.lane),
        (f"{by_run}type", q.type if q.operation_kind is None else None),
        (f"{by_run}op_kind", q.operation_kind),
    ):
        if value is not None:
            sql.append(f"AND {column}=?")
            args.append(value)
    _window(sql, args, q.after_seq, None, q.order, q.limit)
    return " ".join(sql), args


def _open_rows(
    c: sqlite3.Connection, sid: str, lane: str | None, limit: int | None
) -> list[tuple[Any, ...]]:
    """The open-operation projection's starts, newest first.

    The projection holds open operations only, so the session-wide form reads its
    (session_id, ...) key prefix: as many rows as are open, whatever the lane count.
    """
    by_lane = "" if lane is None else " AND o.lane=?"
    args = (sid,) if lane is None else (sid, lane)
    rows: list[tuple[Any, ...]] = c.execute(
        "SELECT r.seq, r.timestamp, r.payload, r.checksum FROM open_operations o JOIN records r "
        f"ON r.session_id=o.session_id AND r.seq=o.seq WHERE o.session_id=?{by_lane} "
        "ORDER BY o.seq DESC LIMIT ?",
        (*args, -1 if limit is None else limit),
    ).fetchall()
    return rows


def _window(
    sql: list[str],
    args: list[Any],
    after: int | None,
    before: int | None,
    order: str,
    limit: int | None,
) -> None:
    if after is not None:
        sql.append("AND seq>?")
        args.append(after)
    if before is not None:
        sql.append("AND seq<?")
        args.append(before)
    sql.append("ORDER BY seq " + ("ASC" if order == "oldest_first" else "DESC"))
    if limit is not None:
        sql.append("LIMIT ?")
        args.append(limit)


def _exists(c: sqlite3.Connection, sid: str, entry_id: str) -> bool:
    return (
        c.execute("SELECT 1 FROM entries WHERE session_id=? AND id=?", (sid, entry_id)).fetchone()
        is not None
    )


def _require_lane(c: sqlite3.Connection, sid: str, lane: str) -> str | None:
    row = c.execute(
        "SELECT leaf_id FROM lanes WHERE session_id=? AND lane=?", (sid, lane)
    ).fetchone()
    if row is None:
        raise SessionError("unknown_lane", f"lane {lane!r} does not exist")
    leaf: str | None = row[0]
    return leaf


def _walk(
    c: sqlite3.Connection, sid: str, start: str, rows: dict[str, tuple[Any, ...]]
) -> Iterator[BranchNode]:
    """The path from `start` toward the root (D241); each node's row is kept in `rows`.

    The first batch follows parent links (`_WALK_SQL`: most scans stop within it). A longer
    path goes on by the cheaper read where it can: a parent is older than its child, so a path
    is a subsequence of the session's entries read newest first, one index range
    (`_SEQ_WALK_SQL`, measured 15 vs 22 ms of a 4,000-entry path). That read also passes over
    what is not on the path (other lanes' entries, abandoned branches), so it is used only while
    the path holds at least half of the entries it passes: the first batch's span says so (a
    count of the index), and each later batch again.
    """
    found = c.execute(_WALK_SQL, (sid, start, _WALK_BATCH[0])).fetchall()
    if not found:
        raise SessionError("not_found", f"entry {start!r} does not exist")
    for entry_id, type_, custom, seq, timestamp, lane, parent, payload, crc in found:
        rows[entry_id] = (seq, timestamp, lane, parent, payload, crc)
        yield BranchNode(entry_id, parent, seq, type_, custom)
    at: str | None = found[-1][6]
    if len(found) < _WALK_BATCH[0] or at is None:
        return
    low, high = found[-1][3], found[0][3]
    passed = c.execute(_SPAN_SQL, (sid, low, high)).fetchone()[0]
    if passed <= 2 * len(found):
        yield from _seq_walk(c, sid, at, low - 1, rows)
    else:
        yield from _link_walk(c, sid, at, rows, 1)


def _seq_walk(
    c: sqlite3.Connection, sid: str, at: str, bound: int, rows: dict[str, tuple[Any, ...]]
) -> Iterator[BranchNode]:
    """The rest of a path from `at` (seq at most `bound`), reading the entries newest first."""
    current: str | None = at
    batch = 1
    while current is not None:
        size = _WALK_BATCH[min(batch, len(_WALK_BATCH) - 1)]
        batch += 1
        scanned = c.execute(_SEQ_WALK_SQL, (sid, bound, size)).fetchall()
        kept = 0
        for entry_id, type_, custom, seq, timestamp, lane, parent, payload, crc in scanned:
            if entry_id == current:
                kept += 1
                rows[entry_id] = (seq, timestamp, lane, parent, payload, crc)
                yield BranchNode(entry_id, parent, seq, type_, custom)
                current = parent
        if current is None or len(scanned) < size:
            return  # the root, or a parent that does not exist: the path ends, as a link walk
        bound = scanned[-1][3] - 1
        if 2 * kept < len(scanned):
            yield from _link_walk(c, sid, current, rows, batch)
            return


def _link_walk(
    c: sqlite3.Connection, sid: str, at: str, rows: dict[str, tuple[Any, ...]], batch: int
) -> Iterator[BranchNode]:
    """The rest of a path from `at`, following parent links (`_WALK_SQL`) in growing batches."""
    current: str | None = at
    while current is not None:
        size = _WALK_BATCH[min(batch, len(_WALK_BATCH) - 1)]
        found = c.execute(_WALK_SQL, (sid, current, size)).fetchall()
        for entry_id, type_, custom, seq, timestamp, lane, parent, payload, crc in found:
            rows[entry_id] = (seq, timestamp, lane, parent, payload, crc)
            yield BranchNode(entry_id, parent, seq, type_, custom)
        current = found[-1][6] if found and len(found) == size else None
        batch += 1


def _metadata(c: sqlite3.Connection, session_id: str | None) -> list[SessionMetadata]:
    sql = "SELECT session_id, created_at, parent_session_id, metadata, name FROM sessions"
    rows = (
        c.execute(sql + " WHERE session_id=?", (session_id,)).fetchall()
        if session_id is not None
        else c.execute(sql + " ORDER BY created_at, session_id").fetchall()
    )
    return [
        SessionMetadata.model_validate_json(meta).model_copy(
            update={"id": sid, "created_at": created, "parent_session_id": parent, "name": name}
        )
        for sid, created, parent, meta, name in rows
    ]


class SqliteSessionRepo:
    """Sessions in one SQLite database file.

    `reads_only`: the caller only reads (``gateway store``); a file it cannot write is opened
    read-only instead of refused, and nothing is created (`ConnectionPolicy.reads_only`).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: Synchronous = "effects",
        clock: Clock | None = None,
        ids: IdGenerator | None = None,
        busy_timeout_ms: int = 10_000,
        page_size: int = PAGE_SIZE,
        reads_only: bool = False,
    ) -> None:
        try:
            policy = ConnectionPolicy(
                synchronous=synchronous,
                busy_timeout_ms=busy_timeout_ms,
                page_size=page_size,
                reads_only=reads_only,
            )
        except ValueError as exc:
            raise SessionError("invalid_query", str(exc)) from None
        self.path = Path(path)
        self.clock = clock or SystemClock()
        self._ids = ids or Uuid7Ids(self.clock)
        self._io = SqliteExecutor(
            self.path,
            lambda: _Db(self.path, policy),
            name="sqlite-store",
            failed=self._failed,
            closed_error=lambda: SessionError("closed", "repository is closed"),
        )
        self.writes: WriteQueue[_Op] = WriteQueue(self._write, self._inline)

    @property
    def closed(self) -> bool:
        """Whether `close` was called (every call since raises ``SessionError("closed")``)."""
        return self._io.closed

    def _inline(self, ops: Sequence[_Op]) -> list[Any] | None:
        """Run a batch of deferred writes on the loop: into the open transaction, or a new one.

        Such a batch does no I/O that waits (no commit, no fsync) and is a few statements,
        cheaper than the hop to the I/O thread and back, which a single lane pays at every
        write. A new transaction is opened here only if the write lock is free this instant
        (`_Db.begin_unless_busy`); a lock another process holds is waited for on the I/O
        thread. It runs on the loop only while the I/O thread has nothing to do, so the
        connection is never used by both at once. None: the batch needs the I/O thread.
        """
        if not all(op[3] for op in ops):
            return None

        def write(db: _Db) -> list[Any] | None:
            if not db.in_tx and not db.begin_unless_busy():
                return None
            return db.write_batch(ops, self.clock.now_ms())

        return self._io.on_loop(write)

    async def read(
        self,
        fn: Callable[[sqlite3.Connection], _T],
        *,
        inline: bool = True,
        session: str | None = None,
    ) -> _T:
        """Run reads in one snapshot: on the loop when it can, else on the I/O thread.

        As `SqliteExecutor.read` (D118, D121): while the thread is idle the read runs on the
        loop on the connection itself, under the rule of the deferred writes (`_inline`). While
        the thread works, a read of `session` runs on the loop on a second, read-only
        connection if `session` holds no deferred write in the open transaction: then what is
        committed is all that was acknowledged, which is what that connection sees.
        `inline=False` keeps a read of a whole session (a log export, a session-wide query) on
        the thread.
        """
        db = self._io.db
        committed = session is not None and db is not None and session not in db.pending
        return await self._io.read(fn, inline=inline, committed=committed)

    async def _write(self, ops: Sequence[_Op]) -> list[Any]:
        """Run a batch of writes: inline when it can (`_inline`), else on the I/O thread."""
        inline = self._inline(ops)
        if inline is not None:
            return inline
        # the clock is read on the I/O thread, right before the batch's transaction
        return await self.call(lambda db: db.write_batch(ops, self.clock.now_ms()), keep_open=True)

    def _failed(self, exc: Exception) -> SessionError:
        return SessionError("storage", f"sqlite error on {self.path}: {exc}")

    async def call(self, fn: Callable[[_Db], _T], *, keep_open: bool = False) -> _T:
        """Run `fn` with the connection on the repository's thread (FIFO).

        An open transaction of deferred writes is committed first unless `keep_open` (the
        reads and writes that run inside it).
        """
        if keep_open:
            return await self._io.call(fn)

        def committed_first(db: _Db) -> _T:
            db.commit()
            return fn(db)

        return await self._io.call(committed_first)

    async def sync(self, session_id: str, *, point: bool = True) -> None:
        """Make `session_id`'s deferred writes durable (see `SqliteSessionStorage.sync`)."""
        db = self._io.db
        if db is None or (not db.in_tx and session_id not in db.lost and not db.owes_point(point)):
            return  # read on the loop thread: a returned deferred write already set `in_tx`
        if not point and self._io.on_loop(lambda db: db.sync_on_loop(session_id)):
            return
        await self.call(lambda db: db.sync(session_id, point=point), keep_open=True)

    async def create(
        self,
        session_id: str | None = None,
        *,
        metadata: Mapping[str, JsonValue] | None = None,
        parent_session_id: str | None = None,
    ) -> SessionMetadata:
        """Create an empty session."""
        session_id = session_id if session_id is not None else self._ids.next()
        check_session_id(session_id)
        meta = new_metadata(session_id, self.clock.now_ms(), metadata, parent_session_id)

        def run(db: _Db) -> None:
            with db.transaction():
                _insert_session(db.conn, meta)

        await self.call(run)
        return meta

    async def open(
        self, session_id: str, *, lease: WriterLease | None = None
    ) -> SqliteSessionStorage:
        """Open a session (for writing with a current lease)."""
        check_session_id(session_id)
        if lease is not None and lease.session_id != session_id:
            raise SessionError("invalid_query", "the lease is for another session")
        now = self.clock.now_ms()

        def check(c: sqlite3.Connection) -> None:
            if not _metadata(c, session_id):
                raise SessionError("not_found", f"session {session_id!r} does not exist")
            if lease is not None:
                check_current(_lease_row(c, session_id), lease, now)

        await self.read(check)
        return SqliteSessionStorage(self, session_id, lease)

    async def list(self) -> tuple[SessionMetadata, ...]:
        """Every session's metadata."""
        return tuple(await self.call(lambda db: db.read(lambda c: _metadata(c, None))))

    async def delete(self, session_id: str, *, lease: WriterLease | None = None) -> bool:
        """Delete a session unless another writer holds it."""
        check_session_id(session_id)
        now = self.clock.now_ms()

        def run(db: _Db) -> bool:
            with db.transaction():
                if not _metadata(db.conn, session_id):
                    return False
                current = db.lease_row(session_id)
                held = current is not None and current.live(now)
                if held and (lease is None or lease.token != current.token):  # type: ignore[union-attr]
                    check_acquire(session_id, current, "\x00delete", now)
                for table in _SESSION_TABLES:
                    db.conn.execute(f"DELETE FROM {table} WHERE session_id=?", (session_id,))
                return True

        return await self.call(run)

    async def acquire_lease(self, session_id: str, *, owner: str, ttl_ms: int) -> WriterLease:
        """Acquire the session's writer lease (a new, larger fencing token)."""
        check_ttl(ttl_ms, owner)
        check_session_id(session_id)
        now = self.clock.now_ms()

        def run(db: _Db) -> int:
            with db.transaction():
                row = db.conn.execute(
                    "SELECT fence FROM sessions WHERE session_id=?", (session_id,)
                ).fetchone()
                if row is None:
                    raise SessionError("not_found", f"session {session_id!r} does not exist")
                check_acquire(session_id, db.lease_row(session_id), owner, now)
                token = int(row[0]) + 1
                db.conn.execute(
                    "UPDATE sessions SET fence=? WHERE session_id=?", (token, session_id)
                )
                db.conn.execute(
                    "INSERT OR REPLACE INTO writer_leases VALUES (?,?,?,?,?)",
                    (session_id, owner, token, ttl_ms, now + ttl_ms),
                )
                return token

        token = await self.call(run)
        return WriterLease(
            session_id=session_id,
            owner=owner,
            token=token,
            ttl_ms=ttl_ms,
            expires_at_ms=now + ttl_ms,
        )

    async def lease_holder(self, session_id: str) -> LeaseHolder | None:
        """Who holds the live lease (None: nobody)."""
        now = self.clock.now_ms()
        row = await self.call(lambda db: db.lease_row(session_id))
        if row is None or not row.live(now):
            return None
        return LeaseHolder(owner=row.owner, expires_at_ms=row.expires_at_ms)

    async def renew_lease(self, lease: WriterLease) -> WriterLease:
        """Extend a current lease by its ttl."""
        now = self.clock.now_ms()

        def run(db: _Db) -> int:
            with db.transaction():
                current = db.lease_row(lease.session_id)
                check_current(current, lease, now)
                assert current is not None
                db.conn.execute(
                    "UPDATE writer_leases SET expires_at_ms=? WHERE session_id=?",
                    (now + current.ttl_ms, lease.session_id),
                )
                return now + current.ttl_ms

        expires = await self.call(run)
        return lease.model_copy(update={"expires_at_ms": expires})

    async def release_lease(self, lease: WriterLease) -> bool:
        """Release a lease if it is current."""

        def run(db: _Db) -> bool:
            cursor = db.conn.execute(
                "DELETE FROM writer_leases WHERE session_id=? AND token=?",
                (lease.session_id, lease.token),
            )
            return cursor.rowcount == 1

        return await self.call(run)

    async def import_session(
        self, metadata: SessionMetadata, items: Iterable[LogItem]
    ) -> SessionMetadata:
        """Create a session from an exported log, in one transaction."""
        check_session_id(metadata.id)
        state = replay_log(metadata, items)
        meta = state.metadata

        def run(db: _Db) -> None:
            with db.transaction():
                _insert_session(db.conn, meta)
                tx = _Tx(db.conn, meta.id, 0, 0)
                for item in state.log:
                    tx.apply(item)
                tx.finish(None)

        await self.call(run)
        return meta

    async def close(self) -> None:
        """Send the queued writes, then close the connection and the I/O thread (idempotent).

        Calls already submitted finish first; every later call raises ``SessionError("closed")``
        (`SqliteExecutor.close`).
        """
        if not self.closed:
            await self.writes.drain()
        await self._io.close()


def _insert_session(conn: sqlite3.Connection, meta: SessionMetadata) -> None:
    metadata_json = encode(meta.model_copy(update={"name": None}), "session metadata")
    try:
        conn.execute(
            "INSERT INTO sessions (session_id, created_at, parent_session_id, metadata) "
            "VALUES (?,?,?,?)",
            (meta.id, meta.created_at, meta.parent_session_id, metadata_json),
        )
    except sqlite3.IntegrityError:
        raise SessionError("already_exists", f"session {meta.id!r} already exists") from None
    conn.execute("INSERT INTO lanes VALUES (?,?,?)", (meta.id, "main", None))
