"""The Redis Streams backend: the distributed default (any number of processes, one writer each).

Keys of session S (prefix P) all carry the hash tag ``{S}`` so that one session lives in one
Redis Cluster slot: ``P:{S}:meta`` (metadata, the seq allocator, the fence counter, running
stats), ``:lease``, ``:lanes`` (lane -> leaf), ``:ep``/``:en`` (entry payloads and tree nodes),
``:eseq``/``:ec:<custom_type>`` (entry indexes), ``:rid`` (record ids), ``:lr:<lane>`` (one
stream per lane: the lane's records, stream id = seq, for bounded restore), ``:lt:<type>:<lane>``
and ``:lt:operation_started.<kind>:<lane>`` (per lane and record type or operation kind: the
seqs of those records, so "the lane's newest operation_finished" or "its queue records since
seq N" is one short range read), ``:runs`` (every record of a run: one sorted set read by lex
range, members ``<run> TAB <seq, 16 digits> TAB <lane>``), ``:open:<lane>`` and ``:opens`` (open
operations of the lane and of the session: run ids scored by seq),
``:ul``/``:ue`` (running usage sums per lane and per entry id), ``:log`` (the session stream:
one item per mutation, stream id = seq) and ``:labels``. ``P:sessions`` lists the sessions.
The meta field ``layout`` says which layout a session has; `open` upgrades a session of an older
one in one script.

Mutations go through `lua/mutate.lua`, which checks each writer's fencing token, allocates
`seq`, appends to the session log stream and updates every projection; Redis runs a call
atomically. Writes queued while a call is in flight are group-committed: each session's are
one call (a refused write in it leaves no trace, the others apply), different sessions' calls
are pipelined on one connection, so writes commit and resolve in submission order.
A write made under `deferred_durability` on an injected clock may be answered here and sent
with the storage's next write, read or barrier, chained so that what lands is a prefix (D283).
redis-py's automatic retries are off (a retried write whose reply was lost could apply
twice); a write whose reply is lost raises ``SessionError("storage")``: its outcome is unknown
and the caller must reopen.

On a Redis Cluster (``cluster=True``; ``redis+cluster://`` in `open_repo`) the same scripts run
unchanged: every script and every command touches keys of one slot, the session's, and the
session index ``P:sessions`` is read and written by commands of its own, never inside a script.
redis-py's cluster pipeline refuses ``EVALSHA``, so the sessions' calls of a batch go
concurrently; a session's writes are still one call, in submission order (writes to different
sessions, which may live on different nodes, have no common order).

Checksums (D240): every entry payload (``:ek``, entry id -> CRC32C), record (its lane stream's
``crc`` field), fact and lane move (the session stream's ``crc`` field) carries the CRC32C of
its payload (a lane move: of its lane, leaf and created flag), computed here before the write;
seq and timestamp are the server's and are not covered. A read verifies it and decodes with the
trusted decoders; a mismatch raises `StoreCorrupted`; an item written before checksums has none
and is validated in full.

Durability is the server's AOF setting (Redis 7.0 has no WAITAOF): ``appendonly yes`` with
``appendfsync always`` loses no acknowledged write even on power loss; ``everysec`` may lose
up to about a second of acknowledged writes on power loss, none on a process crash.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast, get_args

from redis.exceptions import RedisError, ResponseError

from harness_core.backends.batch import WriteQueue
from harness_core.backends.redis import (
    KeySpace,
    Once,
    ScriptCall,
    Scripts,
    close_clients,
    connect,
    discover,
    package_scripts,
    split_cluster,
)
from harness_core.clock import Clock
from harness_core.errors import LeaseHeld, LeaseLost, SessionError, StoreCorrupted
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
from harness_core.session.entries import CustomEntry, Entry
from harness_core.session.names import check_lane_name, check_session_id
from harness_core.session.records import (
    OperationKind,
    OperationStarted,
    Record,
    RecordType,
    Usage,
)
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
from harness_core.storage._branch import BranchNode, BranchScan, PathScan, SinceScan
from harness_core.storage._leases import check_ttl
from harness_core.storage._projections import (
    new_metadata,
    record_matches,
    record_run_id,
    replay_log,
)
from harness_core.storage._rules import stats_from_counters, usage_from_values, usage_values
from harness_core.storage._slice import (
    appended_entries,
    assemble_lane_slice,
    single_open_operation,
)

__all__ = ["RedisSessionRepo", "RedisSessionStorage"]

_LAYOUT = "3"
_SCRIPT_NAMES = (
    "create", "mutate", "acquire", "check_lease", "renew", "release", "delete", "walk",
    "read_entries", "lane_slice", "records_page", "upgrade",
)  # fmt: skip
_SCRIPTS = package_scripts("harness_core.storage", _SCRIPT_NAMES)
"""The Lua scripts (``lua/<name>.lua`` after ``lua/prelude.lua``); a group commit is one call.

Every script gets the session's ``meta`` key as KEYS[1] and derives the session's other keys
from it: they all share the ``{session}`` hash tag, so they live in one Redis Cluster slot.
Errors come back as ``GW <code> <message>`` and are mapped to `SessionError` codes."""
_WALK_BATCHES = (256, 2048)
"""Nodes per path-walk call: most scans stop within the first; a long path goes on in bigger."""
_ENTRY_BATCH = 2048
"""Entries per payload read (one script call; a few ms of the server's time at most)."""
_READ_BATCH = 512
_TYPE_INDEXES = (
    *get_args(RecordType),
    *(f"operation_started.{kind}" for kind in get_args(OperationKind)),
)
"""The name of every per-lane type index (what `delete` removes for each lane)."""
_STAT_FIELDS = (
    "seq", "n_entries", "n_messages", "n_records", "u_input", "u_output", "u_cache_read",
    "u_cache_write", "u_total_tokens", "c_input", "c_output", "c_cache_read", "c_cache_write",
    "c_total",
)  # fmt: skip


async def _stream_range(
    c: _Client, key: str, low: str, high: str, newest_first: bool, count: int
) -> Any:
    """One page of a stream between two ids, in the asked order."""
    if newest_first:
        return await c.xrevrange(key, high, low, count=count)
    return await c.xrange(key, low, high, count=count)


Stream = list[tuple[str, dict[str, str]]]


class _Pipe(Protocol):
    """The pipeline calls this backend makes (replies are decoded strings)."""

    def xrange(self, name: str, min: str, max: str) -> Any: ...
    def hexists(self, name: str, key: str) -> Any: ...
    def hget(self, name: str, key: str) -> Any: ...
    def hmget(self, name: str, keys: list[str]) -> Any: ...
    def evalsha(self, sha: str, numkeys: int, *keys_and_args: str | int | bytes) -> Any: ...
    async def execute(self, raise_on_error: bool = True) -> list[Any]: ...


class _Client(Protocol):
    """The subset of redis-py's asyncio client this backend uses, typed for ``decode_responses``.

    redis-py's own annotations cover sync and async, bytes and str at once; this Protocol states
    what the calls return here so the rest of the module is checked.
    """

    async def hget(self, name: str, key: str) -> str | None: ...
    async def hgetall(self, name: str) -> dict[str, str]: ...
    async def hexists(self, name: str, key: str) -> bool: ...
    async def hmget(self, name: str, keys: list[str]) -> list[str | None]: ...
    async def hdel(self, name: str, *keys: str) -> int: ...
    async def zadd(self, name: str, mapping: Mapping[str, float], nx: bool = False) -> int: ...
    async def zrem(self, name: str, *values: str) -> int: ...
    async def zrange(self, name: str, start: int, end: int) -> list[str]: ...
    async def zrevrange(
        self, name: str, start: int, end: int, withscores: bool = False
    ) -> list[Any]: ...
    async def zrangebyscore(
        self, name: str, min: str, max: str, start: int | None = None, num: int | None = None
    ) -> list[str]: ...
    async def zrevrangebyscore(
        self, name: str, max: str, min: str, start: int | None = None, num: int | None = None
    ) -> list[str]: ...
    async def zrangebylex(
        self, name: str, min: str, max: str, start: int | None = None, num: int | None = None
    ) -> list[str]: ...
    async def zrevrangebylex(
        self, name: str, max: str, min: str, start: int | None = None, num: int | None = None
    ) -> list[str]: ...
    async def xrange(self, name: str, min: str, max: str, count: int | None = None) -> Stream: ...
    async def xrevrange(
        self, name: str, max: str, min: str, count: int | None = None
    ) -> Stream: ...
    async def evalsha(self, sha: str, numkeys: int, *keys_and_args: str | int | bytes) -> Any: ...
    async def script_load(self, script: str) -> str: ...
    async def time(self) -> tuple[int, int]: ...
    async def aclose(self) -> None: ...
    def pipeline(self, transaction: bool = True) -> _Pipe: ...


def _session_error(exc: ResponseError) -> SessionError:
    return _refusal(str(exc))


def _refusal(text: str) -> SessionError:
    """The error a script's ``GW <code> <message>`` refusal (or any other error text) stands for."""
    if not text.startswith("GW "):
        return SessionError("storage", f"redis refused the command: {text}")
    code, _, message = text[3:].partition(" ")
    if code == "lease_held":
        expires, _, owner = message.partition("\t")
        return LeaseHeld(
            f"session is held by {owner!r} until {expires}",
            owner=owner,
            expires_at_ms=int(float(expires)),
        )
    if code == "lease_lost":
        return LeaseLost(message)
    if code == "corrupt":
        return StoreCorrupted(message, location="redis")
    return SessionError(code, message)  # type: ignore[arg-type]


_Write = tuple[str, tuple[str, ...]]
"""A queued mutation: its session's meta key, then its `mutate` arguments (op, token, now, ...)."""


@dataclass(frozen=True, slots=True)
class _Deferred:
    """A write a storage answered before sending it (D283): what it promised its caller."""

    write: _Write
    """Sent chained (``+op``): refused once an earlier write of its call was refused."""
    seq: int
    entry: bool
    parent: str | None
    """An entry's parent: the lane's leaf it was appended at."""


def _chained(write: _Write) -> _Write:
    key, (op, *rest) = write
    return key, (op if op.startswith("+") else "+" + op, *rest)


def _framed(args: Sequence[str]) -> bytes:
    """One mutation's arguments as one script argument: ``<byte length>:<bytes>`` each.

    redis-py packs every argument of a command on its own, at about a microsecond each; a
    mutation has up to twenty.
    """
    parts: list[bytes] = []
    for arg in args:
        data = arg.encode()
        parts.append(b"%d:" % len(data))
        parts.append(data)
    return b"".join(parts)


async def _send_writes(repo: RedisSessionRepo, writes: Sequence[_Write]) -> list[Any]:
    """Send queued mutations: one `mutate` call per session, in submission order; map replies.

    A session's mutations of the batch are its group commit: one script call, which Redis runs
    atomically. Different sessions' calls are pipelined (or, on a cluster, sent concurrently:
    redis-py's cluster pipeline refuses scripts; a session's writes of the batch are still one
    call, so they commit in submission order).
    """
    results: list[Any] = [None] * len(writes)
    sessions: dict[str, tuple[list[int], list[bytes]]] = {}  # meta key -> write indexes, args
    for index, (key, args) in enumerate(writes):
        try:
            framed = _framed(args)
        except UnicodeEncodeError as exc:  # a lone surrogate: this write alone is refused
            results[index] = SessionError("invalid_payload", f"text redis cannot store: {exc}")
            continue
        indexes, framed_args = sessions.setdefault(key, ([], []))
        indexes.append(index)
        framed_args.append(framed)
    calls: list[ScriptCall] = [
        ("mutate", [key], framed_args) for key, (_, framed_args) in sessions.items()
    ]
    try:
        # a call answered NOSCRIPT (the server lost its script cache after a restart) did not
        # run: `run_all` loads the scripts and resends exactly those calls; nothing runs twice
        replies = await repo.scripts.run_all(repo.writer, calls, cluster=repo.cluster)
    except RedisError as exc:
        raise SessionError("storage", f"redis write failed, outcome unknown: {exc}") from exc
    for (indexes, _), reply in zip(sessions.values(), replies, strict=True):
        if isinstance(reply, Exception):
            failure = (
                _session_error(reply)
                if isinstance(reply, ResponseError)
                else SessionError("storage", f"redis write failed, outcome unknown: {reply}")
            )
            for index in indexes:
                results[index] = failure
            continue
        for index, one in zip(indexes, reply, strict=True):
            results[index] = _refusal(one[1]) if one[0] == "error" else one
    return results


def _lost(cause: BaseException) -> SessionError:
    if isinstance(cause, LeaseLost):
        return cause
    error = SessionError("storage", f"deferred writes were not stored: {cause}")
    error.__cause__ = cause
    return error


def _node(node: str) -> tuple[int, int, str | None, str | None, str, str | None]:
    seq, ts, parent, lane, type_, custom = node.split("\t", 5)
    return int(seq), int(ts), parent or None, lane or None, type_, custom or None


class RedisSessionStorage:
    """One session in Redis."""

    def __init__(self, repo: RedisSessionRepo, session_id: str, lease: WriterLease | None) -> None:
        self._repo = repo
        self._sid = session_id
        self._lease = lease
        self._closed = False
        self._base = repo.key(session_id, "")
        self._meta = self._base + "meta"
        self._where = f"redis session {session_id!r}"
        # deferred writes (D283): answered here, sent with the next write, read or barrier
        self._deferred: list[_Deferred] = []
        self._seq: int | None = None
        """The newest seq this storage's own writes were told (the lease makes it the session's)."""
        self._leaves: dict[str, str | None] = {}
        """Lanes' leaves as this storage's own writes left them."""
        self._sending = 0
        self._landing: asyncio.Future[Any] | None = None
        """The newest send carrying deferred writes, done once it was answered: a read or a
        write waits for it (calls resolve in order, so every earlier one is done too)."""
        self._lost: SessionError | None = None
        """Why deferred writes were not stored: every later write and barrier raises it."""

    @property
    def session_id(self) -> str:
        """The session's id."""
        return self._sid

    @property
    def lease(self) -> WriterLease | None:
        """The writer lease, with the newest expiry this storage set; None when read-only."""
        return self._lease

    async def renew_lease(self) -> WriterLease:
        """Extend this storage's lease by its ttl (on the server's clock unless one is injected)."""
        self._client()
        if self._lease is None:
            raise SessionError("read_only", f"session {self._sid!r} was opened without a lease")
        self._lease = await self._repo.renew_lease(self._lease)
        return self._lease

    def _client(self) -> _Client:
        if self._closed:
            raise SessionError("closed", f"storage of session {self._sid!r} is closed")
        return self._repo.reader()

    async def _read(self, fn: Callable[[_Client], Any]) -> Any:
        client = self._client()
        await self._landed()  # this storage's reads see its deferred writes
        try:
            return await fn(client)
        except ResponseError as exc:
            raise _session_error(exc) from exc
        except RedisError as exc:
            raise SessionError("storage", f"redis read failed: {exc}") from exc

    def _write(self, op: str, args: Sequence[str]) -> _Write:
        self._client()
        if self._lease is None:
            raise SessionError("read_only", f"session {self._sid!r} was opened without a lease")
        if self._lost is not None:
            raise self._lost
        return (self._meta, (op, str(self._lease.token), self._repo.now_arg(), *args))

    async def _mutate(self, op: str, *args: str) -> list[Any]:
        """Send one write (after the deferred ones, chained to them) and return its reply."""
        await self._wait_landing()  # a write lands only after the deferred ones before it
        write = self._write(op, args)
        pending, self._deferred = self._deferred, []
        if pending:
            reply = (await self._send_deferred(pending, write))[-1]
            if isinstance(reply, BaseException):
                raise reply
        else:
            self._sending += 1
            try:
                reply = await self._repo.writes.submit(write)
            except BaseException:
                self._seq = None  # what landed is unknown
                raise
            finally:
                self._sending -= 1
        self._learn(reply)
        return cast(list[Any], reply)

    def _learn(self, reply: list[Any]) -> None:
        if reply[0] != "ok":
            return
        self._seq = max(self._seq or 0, int(reply[1]))
        if reply[3] and self._lease is not None:  # the write renewed the lease
            self._lease = self._lease.model_copy(update={"expires_at_ms": int(reply[3])})

    def _defers(self) -> bool:
        """Whether a write made now may be answered before it is sent (D283).

        Inside `deferred_durability` on an injected clock (the timestamp is chosen here), once
        this storage's own replies told it the session's seq and with nothing of it in flight.
        Every argument of such a write frames (no lone surrogate, which `_send_writes` would
        refuse outside the script's chain): its payload and ids passed the codec and the
        models, and an entry's lane was sent before (it is in `_leaves`).
        """
        return (
            self._seq is not None
            and not self._sending
            and self._lost is None
            and self._repo.clock is not None
            and durability_deferred()
        )

    def _defer(self, write: _Write, *, entry: bool, parent: str | None = None) -> int:
        """Keep `write` for the next send; its seq."""
        assert self._seq is not None
        seq = self._seq + len(self._deferred) + 1
        self._deferred.append(_Deferred(_chained(write), seq, entry, parent))
        return seq

    async def _send_deferred(self, pending: list[_Deferred], write: _Write | None) -> list[Any]:
        """Send the deferred writes (and `write`, chained after them) in one batch.

        The batch is a task of its own, checked when it is answered whoever waits for it: a
        caller that stops waiting does not withdraw the writes, nor their check.
        """
        writes = [d.write for d in pending] + ([] if write is None else [_chained(write)])
        batch = asyncio.ensure_future(self._repo.writes.submit_many(writes))
        self._landing = batch
        self._sending += 1
        batch.add_done_callback(lambda done: self._answered(pending, done))
        results = await asyncio.shield(batch)
        if self._lost is not None:
            raise self._lost
        return results

    def _answered(self, pending: Sequence[_Deferred], batch: asyncio.Future[list[Any]]) -> None:
        """Check that deferred writes were stored as they were answered; else lose them all."""
        self._sending -= 1
        if batch.cancelled() or batch.exception() is not None:
            self._seq = None
            self._lost = self._lost or SessionError(
                "storage", f"deferred writes of session {self._sid!r}: outcome unknown"
            )
            return
        failure: SessionError | None = None
        for deferred, result in zip(pending, batch.result(), strict=False):
            if isinstance(result, BaseException):
                failure = failure or _lost(result)
                continue
            if result[0] != "ok":
                if result[0] == "error" and not result[1].startswith("GW skipped "):
                    failure = failure or _lost(_refusal(result[1]))
                continue
            self._learn(result)
            seq = int(result[1])
            parent = _node(result[4])[2] if deferred.entry else deferred.parent
            if seq != deferred.seq or parent != deferred.parent:
                failure = failure or SessionError(
                    "storage",
                    f"a deferred write of session {self._sid!r} was stored at seq {seq}, "
                    f"answered as {deferred.seq}",
                )
        if failure is not None:
            self._seq = None
            self._lost = self._lost or failure

    async def _wait_landing(self) -> None:
        landing = self._landing
        if landing is not None and not landing.done():
            await asyncio.shield(landing)
        if self._lost is not None:
            raise self._lost

    async def _landed(self) -> None:
        """Until every deferred write was answered by the server (sending those kept here)."""
        pending, self._deferred = self._deferred, []
        if pending:
            await self._send_deferred(pending, None)
        await self._wait_landing()

    # -- metadata and lanes ----------------------------------------------------------------

    async def get_metadata(self) -> SessionMetadata:
        """Return the session's metadata with its newest name."""
        metas = await self._read(lambda c: self._repo.read_metas(c, [self._sid]))
        if not metas:
            raise SessionError("not_found", f"session {self._sid!r} does not exist")
        meta: SessionMetadata = metas[0]
        return meta

    async def get_lanes(self) -> tuple[LanePointer, ...]:
        """Every lane, sorted by name."""
        lanes: dict[str, str] = await self._read(lambda c: c.hgetall(self._base + "lanes"))
        return tuple(LanePointer(lane=lane, leaf_id=lanes[lane] or None) for lane in sorted(lanes))

    async def get_lane(self, lane: str) -> LanePointer | None:
        """One lane, or None."""
        leaf = await self._read(lambda c: c.hget(self._base + "lanes", lane))
        return None if leaf is None else LanePointer(lane=lane, leaf_id=leaf or None)

    async def _lane(self, lane: str, leaf: str | None, created: bool) -> LaneMove:
        check_lane_name(lane)
        reply = await self._mutate("lane", *_lane_args(lane, leaf, created))
        self._leaves[lane] = leaf
        return LaneMove(
            seq=reply[1], timestamp=int(reply[2]), lane=lane, leaf_id=leaf, created=created
        )

    async def create_lane(self, lane: str, at: str | None) -> LaneMove:
        """Create a lane at an entry (or the root)."""
        return await self._lane(lane, at, True)

    async def move_lane(self, lane: str, to: str | None) -> LaneMove:
        """Move a lane's leaf."""
        return await self._lane(lane, to, False)

    # -- writes -------------------------------------------------------------------------------

    async def _append(self, entry: Entry, lane: str, if_missing: bool) -> tuple[StoredEntry, bool]:
        payload = encode_entry(entry)
        check_lane_name(lane)
        custom = entry.custom_type if isinstance(entry, CustomEntry) else ""
        args = (
            lane,
            entry.id,
            entry.type,
            custom,
            payload,
            "1" if if_missing else "0",
            str(checksum(payload)),
        )
        if not if_missing and lane in self._leaves and self._defers():
            write = self._write("entry", args)
            parent = self._leaves[lane]
            seq = self._defer(write, entry=True, parent=parent)
            self._leaves[lane] = entry.id
            ts = int(write[1][2])
            return StoredEntry(
                seq=seq, timestamp=ts, lane=lane, parent_id=parent, entry=entry
            ), True
        reply = await self._mutate("entry", *args)
        if reply[0] == "ok":
            self._leaves[lane] = entry.id
        if reply[0] == "existing":
            seq, ts, parent, stored_lane, _, _ = _node(reply[1])
            stored = StoredEntry(
                seq=seq, timestamp=ts, lane=stored_lane, parent_id=parent, entry=entry
            )
            return stored, False
        seq, ts, parent, _, _, _ = _node(reply[4])
        return StoredEntry(seq=seq, timestamp=ts, lane=lane, parent_id=parent, entry=entry), True

    async def append_entry(self, entry: Entry, lane: str) -> StoredEntry:
        """Append an entry at the lane's leaf."""
        stored, _ = await self._append(entry, lane, False)
        return stored

    async def append_entry_if_missing(self, entry: Entry, lane: str) -> tuple[StoredEntry, bool]:
        """Append unless the id exists with equal content."""
        return await self._append(entry, lane, True)

    async def append_record(self, record: Record) -> StoredRecord:
        """Append a record (operation starts are conditional, inside the script)."""
        payload = encode_record(record)
        args = _record_args(record, payload)
        # an operation's start is refused on a busy lane: its caller must hear so at once
        if record.type != "operation_started" and self._defers():
            write = self._write("record", args)
            seq = self._defer(write, entry=False)
            return StoredRecord(seq=seq, timestamp=int(write[1][2]), record=record)
        reply = await self._mutate("record", *args)
        return StoredRecord(seq=reply[1], timestamp=int(reply[2]), record=record)

    async def _fact(self, fact: Fact) -> FactSet:
        payload = encode_fact(fact)
        reply = await self._mutate("fact", *_fact_args(fact, payload))
        return FactSet(seq=reply[1], timestamp=int(reply[2]), fact=fact)

    async def set_name(self, name: str) -> FactSet:
        """Set the session name."""
        return await self._fact(NameFact(name=name))

    async def set_label(self, target_id: str, label: str | None) -> FactSet:
        """Set or clear an entry's label."""
        return await self._fact(LabelFact(target_id=target_id, label=label))

    # -- entry reads ----------------------------------------------------------------------------

    async def _entries(self, client: _Client, ids: Sequence[str]) -> list[StoredEntry | None]:
        out: list[StoredEntry | None] = []
        for start in range(0, len(ids), _ENTRY_BATCH):
            chunk = list(ids[start : start + _ENTRY_BATCH])
            flat = await self._repo.scripts.run(client, "read_entries", [self._meta], chunk)
            with collector_paused(len(chunk)):  # never across an await: the loop runs on
                for payload, node, crc in zip(flat[::3], flat[1::3], flat[2::3], strict=True):
                    if payload is None or node is None:
                        out.append(None)
                        continue
                    out.append(self._entry(payload, node, crc))
        return out

    def _entry(self, payload: str, node: str, crc: str | None) -> StoredEntry:
        """A stored entry: trusted when its checksum matches, else validated in full."""
        seq, ts, parent, lane, _, _ = _node(node)
        if crc is not None and int(crc) == checksum(payload):
            return stored_entry(seq, ts, lane, parent, trusted_entry(payload, self._where))
        location = f"{self._where} entry seq {seq}"
        if crc is not None:
            raise corrupted(location, int(crc), checksum(payload))
        entry = decode_entry(payload, location)
        return StoredEntry(seq=seq, timestamp=ts, lane=lane, parent_id=parent, entry=entry)

    async def get_entry(self, entry_id: str) -> StoredEntry | None:
        """Point lookup."""
        found: list[StoredEntry | None] = await self._read(lambda c: self._entries(c, [entry_id]))
        return found[0]

    async def get_record(self, record_id: str) -> StoredRecord | None:
        """Point lookup: the id index gives the record's seq and lane, its lane stream the rest."""

        async def run(c: _Client) -> list[StoredRecord]:
            located = await c.hget(self._base + "rid", record_id)
            if located is None:
                return []
            seq, _, lane = located.split("\t", 2)
            return await self._records_at(c, [(int(seq), lane)])

        found: list[StoredRecord] = await self._read(run)
        return found[0] if found else None

    async def find_entries(self, query: EntryQuery | None = None) -> tuple[StoredEntry, ...]:
        """Session-wide entry query: the seq index (or a custom type's), filtered in batches."""
        q = query or EntryQuery()
        index = self._base + ("eseq" if q.custom_type is None else "ec:" + q.custom_type)
        newest = q.order == "newest_first"
        kept: list[StoredEntry] = []

        async def run(c: _Client) -> None:
            low = f"({q.after_seq}" if q.after_seq is not None else "-inf"
            high = f"({q.before_seq}" if q.before_seq is not None else "+inf"
            while True:
                if newest:
                    ids = await c.zrevrangebyscore(index, high, low, start=0, num=_READ_BATCH)
                else:
                    ids = await c.zrangebyscore(index, low, high, start=0, num=_READ_BATCH)
                batch = [e for e in await self._entries(c, ids) if e is not None]
                for stored in batch:
                    if q.type is None or stored.type == q.type:
                        kept.append(stored)
                        if q.limit is not None and len(kept) >= q.limit:
                            return
                if len(ids) < _READ_BATCH or not batch:
                    return
                if newest:
                    high = f"({batch[-1].seq}"
                else:
                    low = f"({batch[-1].seq}"

        await self._read(run)
        return tuple(kept)

    async def _scan(self, client: _Client, start: str, scan: PathScan) -> list[StoredEntry]:
        """Walk the path server-side, a batch per call, until the scan has what it needs."""
        cursor: str | None = start
        calls = 0
        while cursor is not None:
            size = _WALK_BATCHES[min(calls, len(_WALK_BATCHES) - 1)]
            calls += 1
            flat = await self._repo.scripts.run(client, "walk", [self._meta], [cursor, size])
            parent: str | None = None
            wanted = True
            for entry_id, raw in zip(flat[::2], flat[1::2], strict=True):
                seq, _, parent, _, type_, custom = _node(raw)
                wanted = scan.feed(BranchNode(entry_id, parent, seq, type_, custom))
                if not wanted:
                    break
            # A short batch ended at the root; a full one continues from its last node's parent.
            cursor = parent if wanted and len(flat) == 2 * size else None
        selected = scan.result()
        found = await self._entries(client, [node.id for node in selected])
        return [entry for entry in found if entry is not None]

    async def find_entries_on_branch(self, query: BranchQuery) -> tuple[StoredEntry, ...]:
        """Path query: the walk runs server-side in batches."""

        async def run(c: _Client) -> list[StoredEntry]:
            if query.stop_at_id is not None and not await c.hexists(
                self._base + "en", query.stop_at_id
            ):
                raise SessionError("not_found", f"entry {query.stop_at_id!r} does not exist")
            return await self._scan(c, query.start, BranchScan(query))

        return tuple(await self._read(run))

    async def read_lane_entries(self, lane: str, *, after: str | None) -> tuple[StoredEntry, ...]:
        """The lane's path back to an anchor."""

        async def run(c: _Client) -> list[StoredEntry]:
            leaf = await c.hget(self._base + "lanes", lane)
            if leaf is None:
                raise SessionError("unknown_lane", f"lane {lane!r} does not exist")
            after_seq = 0
            if after is not None:
                node = await c.hget(self._base + "en", after)
                if node is None:
                    raise SessionError("not_found", f"entry {after!r} does not exist")
                after_seq = _node(node)[0]
            if not leaf:
                if after is not None:
                    raise SessionError(
                        "invalid_query", f"entry {after!r} is not on the lane's path"
                    )
                return []
            return await self._scan(c, leaf, SinceScan(after, after_seq))

        return tuple(await self._read(run))

    # -- record reads ---------------------------------------------------------------------------

    async def _lane_records(
        self, c: _Client, lane: str, low: str, high: str, *, newest_first: bool, count: int
    ) -> list[StoredRecord]:
        key = self._base + "lr:" + lane
        if newest_first:
            rows = await c.xrevrange(key, high, low, count=count)
        else:
            rows = await c.xrange(key, low, high, count=count)
        return [self._record(stream_id, fields) for stream_id, fields in rows]

    def _record(self, stream_id: str, fields: Mapping[str, str]) -> StoredRecord:
        return self._stored_record(
            int(stream_id.split("-", 1)[0]), int(fields["t"]), fields["d"], fields.get("crc")
        )

    def _stored_record(self, seq: int, ts: int, payload: str, crc: str | None) -> StoredRecord:
        """A stored record: trusted when its checksum matches, else validated in full."""
        if crc is not None and int(crc) == checksum(payload):
            return stored_record(seq, ts, trusted_record(payload, self._where))
        location = f"{self._where} record seq {seq}"
        if crc is not None:
            raise corrupted(location, int(crc), checksum(payload))
        return StoredRecord(seq=seq, timestamp=ts, record=decode_record(payload, location))

    async def _records_at(
        self, c: _Client, located: Sequence[tuple[int, str]]
    ) -> list[StoredRecord]:
        if not located:
            return []
        pipe = c.pipeline(transaction=False)
        for seq, lane in located:
            pipe.xrange(self._base + "lr:" + lane, f"{seq}-0", f"{seq}-0")
        rows = await pipe.execute()
        return [self._record(*found[0]) for found in rows if found]

    async def _record_page(
        self, c: _Client, q: RecordQuery, after: int, before: int | None, count: int
    ) -> tuple[list[int], list[StoredRecord]]:
        """Up to `count` records of `q`'s narrowest index with after < seq < before, in order.

        Returns the seqs read (to move the window) and the records (some may not match `q`).
        The narrowest index: the run index for a run, the lane's type (or kind) index for a lane
        and a type, the lane's stream for a lane, else the session log.
        """
        newest = q.order == "newest_first"
        located: list[tuple[int, str]]
        if q.run_id is not None:
            key, prefix = self._base + "runs", q.run_id + "\t"
            low = f"({prefix}{after:016d}"
            high = f"({prefix}{before:016d}" if before is not None else f"({prefix}:"
            if newest:
                members = await c.zrevrangebylex(key, high, low, start=0, num=count)
            else:
                members = await c.zrangebylex(key, low, high, start=0, num=count)
            located = [(int(seq), lane) for _, seq, lane in (m.split("\t", 2) for m in members)]
            return [seq for seq, _ in located], await self._records_at(c, located)
        low_id, high_id = f"({after}-0", "+" if before is None else f"({before}-0"
        if q.lane is not None and q.type is not None:
            index = _type_index(q.type, q.operation_kind, q.lane)
            seqs_read, flat = await self._repo.scripts.run(
                c,
                "records_page",
                [self._meta],
                [index, q.lane, low_id, high_id, int(newest), count],
            )
            return [int(seq) for seq in seqs_read], self._flat_records(flat)
        if q.lane is not None:
            key = self._base + "lr:" + q.lane
            rows = await _stream_range(c, key, low_id, high_id, newest, count)
            seqs = [int(stream_id.split("-", 1)[0]) for stream_id, _ in rows]
            return seqs, [self._record(stream_id, fields) for stream_id, fields in rows]
        rows = await _stream_range(c, self._base + "log", low_id, high_id, newest, count)
        seqs = [int(stream_id.split("-", 1)[0]) for stream_id, _ in rows]
        located = [
            (int(stream_id.split("-", 1)[0]), fields["lane"])
            for stream_id, fields in rows
            if fields["k"] == "r"
        ]
        return seqs, await self._records_at(c, located)

    async def find_records(self, query: RecordQuery | None = None) -> tuple[StoredRecord, ...]:
        """Record query: pages of the narrowest index (see `_record_page`), filtered."""
        q = query or RecordQuery()
        kept: list[StoredRecord] = []

        async def run(c: _Client) -> None:
            after, before = q.after_seq or 0, None
            # A limited query usually matches near where it starts (the newest run start of a
            # lane): read small batches first and grow, so its cost does not track history.
            count = _READ_BATCH if q.limit is None else min(_READ_BATCH, max(16, 4 * q.limit))
            while True:
                seqs, batch = await self._record_page(c, q, after, before, count)
                for record in batch:
                    if record_matches(q, record):
                        kept.append(record)
                        if q.limit is not None and len(kept) >= q.limit:
                            return
                if len(seqs) < count:
                    return
                count = min(_READ_BATCH, count * 4)
                if q.order == "newest_first":
                    before = seqs[-1]
                else:
                    after = seqs[-1]

        await self._read(run)
        return tuple(kept)

    async def find_open_operations(
        self, lane: str | None, *, limit: int | None = None
    ) -> tuple[StoredRecord, ...]:
        """Open operations of a lane (None: of the session), newest first (the projection)."""
        if limit is not None and limit < 1:
            raise SessionError("invalid_query", f"limit must be positive, got {limit}")

        async def run(c: _Client) -> list[StoredRecord]:
            if lane is None:
                opened = await c.zrevrange(
                    self._base + "opens", 0, -1 if limit is None else limit - 1
                )
                located = await c.hmget(self._base + "rid", opened) if opened else []
                # rid values are "<seq> TAB <type> TAB <lane>"
                found = [value.split("\t", 2) for value in located if value is not None]
                return await self._records_at(c, [(int(seq), owner) for seq, _, owner in found])
            opened = await c.zrevrange(
                self._base + "open:" + lane, 0, -1 if limit is None else limit - 1, withscores=True
            )
            return await self._records_at(c, [(int(score), lane) for _, score in opened])

        return tuple(await self._read(run))

    async def read_operation_records(self, lane: str, run_id: str) -> tuple[StoredRecord, ...]:
        """Records of the lane since an operation's start (one stream range)."""

        async def run(c: _Client) -> list[StoredRecord]:
            pipe = c.pipeline(transaction=False)
            pipe.hexists(self._base + "lanes", lane)
            pipe.hget(self._base + "rid", run_id)
            exists, located = await pipe.execute()
            if not exists:
                raise SessionError("unknown_lane", f"lane {lane!r} does not exist")
            if located is None:
                raise SessionError("not_found", f"lane {lane!r} has no operation {run_id!r}")
            seq, rtype, owner = located.split("\t", 2)
            if rtype != "operation_started" or owner != lane:
                raise SessionError("not_found", f"lane {lane!r} has no operation {run_id!r}")
            records: list[StoredRecord] = []
            low = f"{seq}-0"
            while True:
                batch = await self._lane_records(
                    c, lane, low, "+", newest_first=False, count=_READ_BATCH
                )
                records.extend(batch)
                if len(batch) < _READ_BATCH:
                    return records
                low = f"({batch[-1].seq}-0"

        return tuple(await self._read(run))

    def _flat_records(self, flat: Sequence[str]) -> list[StoredRecord]:
        """Records from a script's flat ``seq, timestamp, payload, checksum`` list."""
        with collector_paused(len(flat) // 4):
            return [
                self._stored_record(int(seq), int(ts), payload, crc)
                for seq, ts, payload, crc in zip(
                    flat[::4], flat[1::4], flat[2::4], flat[3::4], strict=True
                )
            ]

    async def read_lane_slice(self, lane: str) -> LaneSlice:
        """The restore read: one script call, then the path walk when an operation is open."""

        async def run(c: _Client) -> list[Any]:
            reply: list[Any] = await self._repo.scripts.run(c, "lane_slice", [self._meta], [lane])
            return reply

        leaf, *parts = await self._read(run)
        opened, queued, operation, finished = (self._flat_records(part) for part in parts)
        leaf_id = leaf or None
        start = single_open_operation(lane, opened)
        entries: tuple[StoredEntry, ...] = ()
        if start is not None:
            entries = await appended_entries(self, lane, start, leaf_id)
        return assemble_lane_slice(
            lane, leaf_id, opened, queued, operation, entries, finished[0] if finished else None
        )

    # -- log, facts, stats ------------------------------------------------------------------------

    async def get_log(self, *, after_seq: int = 0, limit: int | None = None) -> tuple[LogItem, ...]:
        """Log items after a seq, resolved from the session stream."""
        EntryQuery(after_seq=after_seq, limit=limit)
        items: list[LogItem] = []

        async def run(c: _Client) -> None:
            low = f"{after_seq + 1}-0"
            while limit is None or len(items) < limit:
                want = _READ_BATCH if limit is None else min(_READ_BATCH, limit - len(items))
                rows = await c.xrange(self._base + "log", low, "+", count=want)
                entry_ids = [fields["id"] for _, fields in rows if fields["k"] == "e"]
                located = [
                    (int(sid.split("-", 1)[0]), fields["lane"])
                    for sid, fields in rows
                    if fields["k"] == "r"
                ]
                entries = {e.id: e for e in await self._entries(c, entry_ids) if e is not None}
                records = {r.seq: r for r in await self._records_at(c, located)}
                for stream_id, fields in rows:
                    seq, ts = int(stream_id.split("-", 1)[0]), int(fields["t"])
                    kind = fields["k"]
                    if kind == "e":
                        items.append(entries[fields["id"]])
                    elif kind == "r":
                        items.append(records[seq])
                    elif kind == "l":
                        items.append(self._lane_move_item(seq, ts, fields))
                    else:
                        items.append(self._fact_item(seq, ts, fields))
                if len(rows) < want:
                    return
                low = f"({rows[-1][0]}"

        await self._read(run)
        return tuple(items)

    def _lane_move_item(self, seq: int, ts: int, fields: Mapping[str, str]) -> LaneMove:
        lane, leaf, created, crc = fields["lane"], fields["leaf"], fields["c"], fields.get("crc")
        if crc is not None and int(crc) == checksum("", lane, leaf, created):
            return lane_move(seq, ts, lane, leaf or None, created == "1")
        location = f"{self._where} lane move seq {seq}"
        if crc is not None:
            raise corrupted(location, int(crc), checksum("", lane, leaf, created))
        try:
            return LaneMove(
                seq=seq, timestamp=ts, lane=lane, leaf_id=leaf or None, created=created == "1"
            )
        except ValueError as exc:
            raise StoreCorrupted(f"{location} is invalid: {exc}", location=location) from exc

    def _fact_item(self, seq: int, ts: int, fields: Mapping[str, str]) -> FactSet:
        payload, crc = fields["d"], fields.get("crc")
        if crc is not None and int(crc) == checksum(payload):
            return fact_set(seq, ts, trusted_fact(payload, self._where))
        location = f"{self._where} fact seq {seq}"
        if crc is not None:
            raise corrupted(location, int(crc), checksum(payload))
        return FactSet(seq=seq, timestamp=ts, fact=decode(fact_adapter, payload, location))

    async def get_name(self) -> str | None:
        """Newest session name."""
        name: str | None = await self._read(lambda c: c.hget(self._meta, "name"))
        return name

    async def get_label(self, target_id: str) -> str | None:
        """Newest label of an entry."""
        label: str | None = await self._read(lambda c: c.hget(self._base + "labels", target_id))
        return label

    async def get_usage(
        self, *, entry_id: str | None = None, lane: str | None = None
    ) -> TokenUsage:
        """The usage sum of an entry or of a lane (one hash field)."""
        if (entry_id is None) == (lane is None):
            raise SessionError("invalid_query", "get_usage takes exactly one of entry_id, lane")

        async def run(c: _Client) -> str | None:
            if entry_id is not None:
                return await c.hget(self._base + "ue", entry_id)
            assert lane is not None
            pipe = c.pipeline(transaction=False)
            pipe.hexists(self._base + "lanes", lane)
            pipe.hget(self._base + "ul", lane)
            exists, packed = await pipe.execute()
            if not exists:
                raise SessionError("unknown_lane", f"lane {lane!r} does not exist")
            return cast(str | None, packed)

        packed = await self._read(run)
        return TokenUsage() if packed is None else usage_from_values(packed.split(" "))

    async def get_stats(self) -> SessionStats:
        """Running counters."""
        values = await self._read(lambda c: c.hmget(self._meta, list(_STAT_FIELDS)))
        if values[0] is None:
            raise SessionError("not_found", f"session {self._sid!r} does not exist")
        return stats_from_counters(values)

    async def sync(self, *, point: bool = True) -> None:
        """Nothing to do: every write is one script call, applied by the server on return.

        A durability point has nothing more to ask for: Redis 7.0 has no ``WAITAOF``, so
        power-loss durability is the server's ``appendfsync`` for every write alike
        (``always``: every write; ``everysec``: up to a second may be lost; D233).
        """
        if self._closed:
            raise SessionError("closed", f"storage of session {self._sid!r} is closed")
        await self._landed()

    async def close(self) -> None:
        """Send the deferred writes (they were answered), then close this storage."""
        try:
            if not self._closed and self._lost is None:
                await self._landed()
        finally:
            self._closed = True


def _type_index(record_type: str, kind: str | None, lane: str) -> str:
    """The key suffix of a lane's index of one record type (or operation kind)."""
    return f"lt:{record_type}.{kind}:{lane}" if kind else f"lt:{record_type}:{lane}"


def _record_args(record: Record, payload: str) -> tuple[str, ...]:
    run = record_run_id(record) or ""
    kind = record.intent.kind if isinstance(record, OperationStarted) else ""
    crc = str(checksum(payload))
    args: tuple[str, ...] = (record.lane, record.id, record.type, run, payload, kind, crc)
    if isinstance(record, Usage):
        # repr() of a float reads back exactly (tonumber in the script parses it with strtod)
        amounts = usage_values(record.usage)
        args += (record.entry_id or "", *(str(v) for v in amounts[:5]))
        args += tuple(repr(float(v)) for v in amounts[5:])
    return args


def _fact_args(fact: Fact, payload: str) -> tuple[str, ...]:
    crc = str(checksum(payload))
    if isinstance(fact, NameFact):
        return (payload, crc, "name", fact.name)
    clears = "1" if fact.label is None else "0"
    return (payload, crc, "label", fact.target_id, fact.label or "", clears)


def _lane_args(lane: str, leaf: str | None, created: bool) -> tuple[str, ...]:
    fields = (lane, leaf or "", "1" if created else "0")
    return (*fields, str(checksum("", *fields)))


class RedisSessionRepo:
    """Sessions in a Redis server (7.0 or newer); `cluster`: a Redis Cluster through `url`'s node.

    `url` is a ``redis://`` or ``rediss://`` URL (of one startup node for a cluster, database
    0); `cluster` None: a ``+cluster`` after the scheme says (`harness_core.backends.redis`).
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "gw",
        cluster: bool | None = None,
        clock: Clock | None = None,
        ids: IdGenerator | None = None,
        socket_timeout: float = 10.0,
    ) -> None:
        try:
            self.keys = KeySpace(prefix)
            self.cluster = split_cluster(url)[1] if cluster is None else cluster
            if self.cluster:
                # one client: writes keep their order per session (see `_send_writes`)
                self._reader = cast(
                    _Client, connect(url, cluster=True, socket_timeout=socket_timeout)
                )
                self.writer = self._reader
            else:
                self.writer = cast(
                    _Client,
                    connect(
                        url, cluster=False, socket_timeout=socket_timeout, single_connection=True
                    ),
                )
                self._reader = cast(
                    _Client, connect(url, cluster=False, socket_timeout=socket_timeout)
                )
        except ValueError as exc:
            raise SessionError("invalid_query", str(exc)) from None
        self.prefix = prefix
        self.clock = clock
        self._ids = ids or Uuid7Ids(clock)
        self.scripts = Scripts(_SCRIPTS)
        self.writes: WriteQueue[_Write] = WriteQueue(lambda calls: _send_writes(self, calls))
        self._set_up = Once(self._setup)
        self.closed = False

    def key(self, session_id: str, name: str) -> str:
        """A key of a session: ``<prefix>:{<session_id>}:<name>``."""
        return self.keys.key(session_id, name)

    def now_arg(self) -> str:
        """The time scripts use: the injected clock, or '' for the server's clock."""
        return "" if self.clock is None else str(self.clock.now_ms())

    def reader(self) -> _Client:
        """The client for reads (writes go through the ordered write pipe)."""
        if self.closed:
            raise SessionError("closed", "repository is closed")
        return self._reader

    async def _setup(self) -> None:
        """Before the first command: a cluster's topology, the scripts."""
        try:
            await discover(self._reader)
            await self.scripts.load(self._reader)
        except RedisError as exc:
            raise SessionError("storage", f"cannot reach redis: {exc}") from exc

    async def _ready(self) -> None:
        if self.closed:
            raise SessionError("closed", "repository is closed")
        await self._set_up()

    async def _script(self, name: str, session_id: str, *args: str) -> Any:
        await self._ready()
        try:
            return await self.scripts.run(self._reader, name, [self.key(session_id, "meta")], args)
        except ResponseError as exc:
            raise _session_error(exc) from exc
        except RedisError as exc:
            raise SessionError("storage", f"redis call failed, outcome unknown: {exc}") from exc

    async def read_metas(
        self, client: _Client, session_ids: Sequence[str]
    ) -> list[SessionMetadata]:
        """Metadata of the given sessions (skipping missing ones and unfinished imports)."""
        pipe = client.pipeline(transaction=False)
        for session_id in session_ids:
            pipe.hmget(
                self.key(session_id, "meta"),
                ["id", "created_at", "parent", "metadata", "name", "importing"],
            )
        metas: list[SessionMetadata] = []
        for row in await pipe.execute():
            sid, created, parent, metadata, name, importing = row
            if sid is None or importing == "1":
                continue
            meta = SessionMetadata.model_validate_json(metadata)
            metas.append(
                meta.model_copy(
                    update={
                        "id": sid,
                        "created_at": int(created),
                        "parent_session_id": parent or None,
                        "name": name,
                    }
                )
            )
        return metas

    async def create(
        self,
        session_id: str | None = None,
        *,
        metadata: Mapping[str, JsonValue] | None = None,
        parent_session_id: str | None = None,
    ) -> SessionMetadata:
        """Create an empty session."""
        await self._ready()
        session_id = session_id if session_id is not None else self._ids.next()
        check_session_id(session_id)
        now = self.clock.now_ms() if self.clock is not None else await self._server_ms()
        meta = new_metadata(session_id, now, metadata, parent_session_id)
        await self._create(meta, importing=False)
        return meta

    async def _server_ms(self) -> int:
        seconds, micros = await self._reader.time()
        return int(seconds) * 1000 + int(micros) // 1000

    async def _create(self, meta: SessionMetadata, *, importing: bool) -> None:
        # Index first: a crash between the two leaves a listed id without a session (skipped by
        # list), never a session missing from the list.
        try:
            await self._reader.zadd(
                self.keys.untagged("sessions"), {meta.id: meta.created_at}, nx=True
            )
        except RedisError as exc:
            raise SessionError("storage", f"redis call failed: {exc}") from exc
        body = encode(meta.model_copy(update={"name": None}), "session metadata")
        await self._script(
            "create",
            meta.id,
            meta.id,
            str(meta.created_at),
            meta.parent_session_id or "",
            body,
            "1" if importing else "0",
        )

    async def open(
        self, session_id: str, *, lease: WriterLease | None = None
    ) -> RedisSessionStorage:
        """Open a session (for writing with a current lease)."""
        await self._ready()
        check_session_id(session_id)
        if lease is not None and lease.session_id != session_id:
            raise SessionError("invalid_query", "the lease is for another session")
        if not await self.read_metas(self._reader, [session_id]):
            raise SessionError("not_found", f"session {session_id!r} does not exist")
        if await self._reader.hget(self.key(session_id, "meta"), "layout") != _LAYOUT:
            await self._script("upgrade", session_id)
        if lease is not None:
            await self._script("check_lease", session_id, str(lease.token), self.now_arg())
        return RedisSessionStorage(self, session_id, lease)

    async def list(self) -> tuple[SessionMetadata, ...]:
        """Every session's metadata."""
        await self._ready()
        ids = await self._reader.zrange(self.keys.untagged("sessions"), 0, -1)
        metas = await self.read_metas(self._reader, ids)
        return tuple(sorted(metas, key=lambda m: (m.created_at, m.id)))

    async def delete(self, session_id: str, *, lease: WriterLease | None = None) -> bool:
        """Delete a session unless another writer holds it."""
        check_session_id(session_id)
        deleted = await self._script(
            "delete",
            session_id,
            "" if lease is None else str(lease.token),
            self.now_arg(),
            *_TYPE_INDEXES,
        )
        await self._reader.zrem(self.keys.untagged("sessions"), session_id)
        return bool(deleted)

    async def acquire_lease(self, session_id: str, *, owner: str, ttl_ms: int) -> WriterLease:
        """Acquire the session's writer lease."""
        check_ttl(ttl_ms, owner)
        check_session_id(session_id)
        token, expires = await self._script(
            "acquire", session_id, owner, str(ttl_ms), self.now_arg()
        )
        return WriterLease(
            session_id=session_id,
            owner=owner,
            token=int(token),
            ttl_ms=ttl_ms,
            expires_at_ms=int(expires),
        )

    async def lease_holder(self, session_id: str) -> LeaseHolder | None:
        """Who holds the live lease (None: nobody), on the lease clock (server ``TIME``)."""
        await self._ready()
        check_session_id(session_id)
        try:
            owner, expires = await self._reader.hmget(
                self.key(session_id, "lease"), ["owner", "expires"]
            )
            if owner is None or expires is None:
                return None
            if self.clock is not None:
                now = self.clock.now_ms()
            else:
                seconds, micros = await self._reader.time()
                now = int(seconds) * 1000 + int(micros) // 1000
        except RedisError as exc:
            raise SessionError("storage", f"redis call failed: {exc}") from exc
        if int(expires) <= now:
            return None
        return LeaseHolder(owner=str(owner), expires_at_ms=int(expires))

    async def renew_lease(self, lease: WriterLease) -> WriterLease:
        """Extend a current lease."""
        expires = await self._script("renew", lease.session_id, str(lease.token), self.now_arg())
        return lease.model_copy(update={"expires_at_ms": int(expires)})

    async def release_lease(self, lease: WriterLease) -> bool:
        """Release a lease if it is current."""
        return bool(await self._script("release", lease.session_id, str(lease.token)))

    async def import_session(
        self, metadata: SessionMetadata, items: Iterable[LogItem]
    ) -> SessionMetadata:
        """Create a session from an exported log (invisible until the last item is stored)."""
        await self._ready()
        check_session_id(metadata.id)
        state = replay_log(metadata, items)
        await self._create(state.metadata, importing=True)
        meta_key = self.key(metadata.id, "meta")
        for start in range(0, len(state.log), _READ_BATCH):
            calls = [_import_args(item) for item in state.log[start : start + _READ_BATCH]]
            await asyncio.gather(*(self.writes.submit((meta_key, args)) for args in calls))
        await self._reader.hdel(meta_key, "importing")
        return state.metadata

    async def close(self) -> None:
        """Close both connections."""
        if self.closed:
            return
        await self.writes.drain()
        self.closed = True
        await close_clients(self.writer, self._reader)


def _import_args(item: LogItem) -> tuple[str, ...]:
    ts = str(item.timestamp)
    if isinstance(item, StoredEntry):
        entry = item.entry
        custom = entry.custom_type if isinstance(entry, CustomEntry) else ""
        payload = encode_entry(entry)
        return (
            "entry",
            "",
            ts,
            item.lane or "",
            entry.id,
            entry.type,
            custom,
            payload,
            "0",
            str(checksum(payload)),
            item.parent_id or "",
        )
    if isinstance(item, StoredRecord):
        return ("record", "", ts, *_record_args(item.record, encode_record(item.record)))
    if isinstance(item, LaneMove):
        return ("lane", "", ts, *_lane_args(item.lane, item.leaf_id, item.created))
    return ("fact", "", ts, *_fact_args(item.fact, encode_fact(item.fact)))
