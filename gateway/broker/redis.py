"""The Redis broker: the distributed engine any number of `gateway serve` processes share.

Keys (prefix ``P``, default ``gwb``). Every Lua script is given every key it touches in
``KEYS``, all under one hash tag, so the broker runs on Redis Cluster unchanged:

* session ``S`` (tag ``{S}``): ``P:{S}:inbox`` (stream of its pending items; item ``n`` has
  stream id ``<n>-0`` and id ``n`` in 16 digits), ``:st`` (hash: ``seq`` the item counter,
  ``sig`` when a ready signal was last sent), ``:dd:<dedupe key>`` (the item; no expiry while it
  is pending or rejected, ``ack`` lets it expire ``dedupe_ttl_ms`` after the append), ``:claim``
  (hash: the ticket's token, worker, anchoring ready entry and expiry), ``:rej`` / ``:rejitem``
  (rejected items: reason, item), ``:threads`` (hash: ``t:<lane>`` thread, ``c:<lane>`` reply
  context, ``r:<lane>`` replied-through) and ``:audit`` (the session's events by number);
* ready shard ``n`` of ``shards`` (tag ``{rdy-n}``; a session's shard is ``crc32(S) % shards``):
  ``:ready`` (stream, consumer group ``workers``: "session S may have work"), ``:claims``
  (sorted set of ``"<token> <entry> <session>"`` by claim expiry) and ``:sessions`` (every
  session that ever had an item: the backlog and the sweep read it);
* outbox shard ``n`` (tag ``{obx-n}``; by ``crc32(delivery id)``): ``:o:<id>`` (hash per
  delivery), ``:due`` (unleased pending deliveries by due time), ``:leased`` (by lease expiry),
  ``:pend`` (every pending delivery by due time: the backlog), ``:ls:<status>`` (ids by status:
  `list`), ``:settled`` / ``:deadat`` (settle times: retention);
* ``P:{ibx-wake}:wake`` and ``P:{obx-wake}:wake``: capped streams that wake waiting workers and
  deliverers (one listener per broker reads each); ``P:{audit}:seq`` and ``P:{audit}:log``: the
  audit trail, one capped stream numbered by one counter, so record order is a total order.

Each step on a session is one script in its slot (append: dedupe, XADD, "needs a ready
signal?"; take; renew; done), then one script on its ready shard (XADD a ready entry, XACK the
consumed one, index or unindex the claim). A crash between the two is repaired: a claim whose
index entry is missing still has its anchor entry in the group's pending list (`XAUTOCLAIM`
once it is idle for the visibility timeout), and a lost ready signal goes stale after the
visibility timeout (the next append, or the sweep that runs every few seconds, sends another).
Claims, dedupe windows and waits run on the injected clock; the `XAUTOCLAIM` backstop on the
server's. A shard read empty is not read again until its bell rings (or the next full scan).
Likewise a deliverer looks only at the outbox shards where something may be claimable: those
whose first due time or lease expiry has come, or which were rung (an enqueue, a retry, a
redelivery) since it read them, and all of them every poll interval.

redis-py's automatic retries are off (a retried write whose reply was lost could apply twice):
a failed call raises ``BrokerError("storage")`` and its outcome is unknown. Durability is the
server's AOF setting. ``redis+cluster://host:port`` (``rediss+cluster://``, or
``cluster=True``) connects to a Redis Cluster through that startup node.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import zlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar, cast

from redis.exceptions import RedisError, ResponseError

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
    InboxStatus,
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
from harness_core.frozen import FrozenJsonObject

__all__ = ["SCRIPTS", "RedisBroker"]

_T = TypeVar("_T")

_SCRIPTS = (
    "inbox_append",
    "inbox_ack",
    "inbox_reject",
    "inbox_take",
    "inbox_renew",
    "inbox_done",
    "inbox_sweep",
    "ready_apply",
    "outbox_enqueue",
    "outbox_peek",
    "outbox_claim",
    "outbox_take",
    "outbox_settle",
    "outbox_redeliver",
    "outbox_discard",
    "outbox_purge",
    "outbox_release",
    "outbox_holders",
    "threads_mark",
    "threads_rebase",
    "marks_put",
    "audit_record",
    "audit_index",
    "blob_put",
)
_GROUP = "workers"
_BLOCK_MS = 5_000
"""The longest blocking read (kept well under the socket timeout)."""
_WAKE_CAP = 1_000
_SCAN_PER_SHARD = 8
"""Ready entries one scan reads from a shard before moving on."""
_RECOVER_PER_SHARD = 8
_BATCH = 256
_CONCURRENT = 32
_POLL_MS = 1_000
_TAKE_MAX = 64
"""The most deliveries a one-shard claim leases in one script call (a token each in ARGV)."""
_LISTED_CAP = 10_000
"""Items whose dedupe key `pending` remembers for their `ack` (the oldest are forgotten)."""
_CLAIMS_HINT = "c"
"""Rung on the inbox bell when a claim was indexed to lapse before a visibility timeout."""
_BLOB_KEYS_SLACK_MS = 86_400_000
"""A session's blob keys outlive its newest blob's retention by this much (server time)."""
_CONSUMER_IDLE_MS = 3_600_000
"""A consumer (worker name) with nothing pending is forgotten after this long (server time)."""
"""A waiting `take_session` looks again at least this often (on the injected clock)."""
"""Script calls in flight at once where a pipeline cannot carry them (Redis Cluster)."""
_STATUSES: tuple[DeliveryStatus, ...] = ("pending", "delivered", "dead", "discarded")


SCRIPTS: dict[str, str] = package_scripts("gateway.broker", _SCRIPTS)
"""Script name -> full Lua source (the shared prelude, then the script)."""


class _Pipe(Protocol):
    """The pipeline calls this backend makes (replies are decoded strings)."""

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: str | int | bytes) -> Any: ...
    def xlen(self, name: str) -> Any: ...
    def xrange(self, name: str, min: str, max: str, count: int | None = None) -> Any: ...
    def xrevrange(self, name: str, max: str, min: str, count: int | None = None) -> Any: ...
    def hlen(self, name: str) -> Any: ...
    def hgetall(self, name: str) -> Any: ...
    def hmget(self, name: str, keys: Sequence[str]) -> Any: ...
    def hset(self, name: str, key: str, value: str) -> Any: ...
    def hsetnx(self, name: str, key: str, value: str) -> Any: ...
    def smembers(self, name: str) -> Any: ...
    def zcard(self, name: str) -> Any: ...
    def zrange(self, name: str, start: int, end: int, withscores: bool = False) -> Any: ...
    def zrangebyscore(
        self,
        name: str,
        min: str | float,
        max: str | float,
        start: int | None = None,
        num: int | None = None,
        withscores: bool = False,
    ) -> Any: ...
    def zrangebylex(
        self, name: str, min: str, max: str, start: int | None = None, num: int | None = None
    ) -> Any: ...
    def xgroup_create(self, name: str, groupname: str, id: str, mkstream: bool) -> Any: ...
    async def execute(self, raise_on_error: bool = True) -> list[Any]: ...


_Stream = list[tuple[str, dict[str, str]]]


class _Client(Protocol):
    """The subset of redis-py's asyncio clients (plain and cluster) this backend uses.

    redis-py's own annotations cover sync and async, bytes and str at once; this Protocol states
    what the calls return here (``decode_responses=True``, RESP2) so the module is checked.
    """

    async def evalsha(self, sha: str, numkeys: int, *keys_and_args: str | int | bytes) -> Any: ...
    async def script_load(self, script: str) -> str: ...
    async def xadd(
        self,
        name: str,
        fields: Mapping[str, str | int],
        maxlen: int | None = None,
        approximate: bool = True,
    ) -> str: ...
    async def xdel(self, name: str, *ids: str) -> int: ...
    async def xrange(self, name: str, min: str, max: str, count: int | None = None) -> _Stream: ...
    async def xrevrange(
        self, name: str, max: str, min: str, count: int | None = None
    ) -> _Stream: ...
    async def xread(
        self, streams: Mapping[str, str], count: int | None = None, block: int | None = None
    ) -> list[tuple[str, _Stream]] | None: ...
    async def xreadgroup(
        self,
        groupname: str,
        consumername: str,
        streams: Mapping[str, str],
        count: int | None = None,
        block: int | None = None,
    ) -> list[tuple[str, _Stream]] | None: ...
    async def xautoclaim(
        self,
        name: str,
        groupname: str,
        consumername: str,
        min_idle_time: int,
        start_id: str = "0-0",
        count: int | None = None,
    ) -> list[Any]: ...
    async def xgroup_create(
        self, name: str, groupname: str, id: str = "$", mkstream: bool = False
    ) -> Any: ...
    async def xinfo_consumers(self, name: str, groupname: str) -> list[dict[str, Any]]: ...
    async def xgroup_delconsumer(self, name: str, groupname: str, consumername: str) -> int: ...
    async def sadd(self, name: str, *values: str) -> int: ...
    async def hset(self, name: str, mapping: Mapping[str, str]) -> int: ...
    async def hget(self, name: str, key: str) -> str | None: ...
    async def hmget(self, name: str, keys: list[str]) -> list[str | None]: ...
    async def hgetall(self, name: str) -> dict[str, str]: ...
    async def zrangebyscore(
        self,
        name: str,
        min: str | float,
        max: str | float,
        start: int | None = None,
        num: int | None = None,
        withscores: bool = False,
    ) -> list[Any]: ...
    async def aclose(self) -> None: ...
    def pipeline(self, transaction: bool = True) -> _Pipe: ...


def _crc(text: str) -> int:
    return zlib.crc32(text.encode())


def _stream_id(text: str) -> tuple[int, int]:
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def _position(stream_id: tuple[int, int]) -> int:
    """A stream id as one number, ordered as the ids are (what `Inbox.position` returns)."""
    ms, seq = stream_id
    return (ms << 32) | min(seq, 0xFFFFFFFF)


def _item_number(item_id: str) -> int | None:
    """The counter behind an item or event id (16 digits), or None if it is not one."""
    if not (item_id.isascii() and item_id.isdigit()) or len(item_id) > 18:
        return None
    return int(item_id)


def _first_number_after(cursor: str) -> int:
    """The smallest number whose 16-digit id sorts after `cursor` as a string (any string)."""
    low, high = 0, 10**16
    while low < high:
        middle = (low + high) // 2
        if f"{middle:016d}" > cursor:
            high = middle
        else:
            low = middle + 1
    return low


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _operated(flat: Sequence[Any]) -> Operated:
    """An operator script's answer: 1 or 0 (changed), then the delivery's fields."""
    return Operated(delivery=_delivery(_pairs(flat[1:])), changed=int(flat[0]) == 1)


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat), 2)}


def _check_session(session: str) -> None:
    if not session:
        raise ValueError("a session id must not be empty (it is the Redis hash tag)")


async def _sleep_until(clock: Clock, at_ms: int) -> None:
    """Sleep until `at_ms` on `clock`, measured when the sleep starts.

    Measured then, not when it was asked for: the two are separate steps of the loop, and a
    clock that moved between them (a test's manual clock) would otherwise be slept past.
    """
    await clock.sleep(max(at_ms - clock.now_ms(), 0) / 1000)


async def _first(*waits: Awaitable[Any]) -> None:
    """Return when the first of `waits` ends (the others are cancelled)."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _Bell:
    """A wake-up stream read by one listener per broker: waiters learn what was rung after them.

    Ringing is an ``XADD`` to a capped stream; a waiter first notes the stream's newest id, then
    does its work, then waits until the listener has seen a newer entry (so a ring between the
    two is not missed, and one from before is not mistaken for a new one). A waiter may note the
    listener's own position instead (`mark`, no round trip): it may lag the stream, which can
    only wake the waiter early for a ring it had seen already, never late. A ring names a hint
    (a ready shard, the claims hint) and, for news a session's holder must look at, the session
    (``s``: `news`).
    """

    def __init__(self, core: _Core, key: str) -> None:
        self._core = core
        self.key = key
        self.seen: tuple[int, int] = (0, 0)
        self.latest: dict[str, tuple[int, int]] = {}
        """Each hint's newest ring seen."""
        self.news = SessionNews()
        """Each session's newest ring seen (positions: `_position`)."""
        self._rung = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def ring(self, hint: str = "", *, session: str = "") -> None:
        fields = {"h": hint, "s": session} if session else {"h": hint}
        await self._core.client.xadd(self.key, fields, maxlen=_WAKE_CAP, approximate=True)

    def rung(self) -> asyncio.Event:
        """Set once the listener reads its next batch (take it before looking at `news`)."""
        return self._rung

    async def mark(self) -> tuple[int, int]:
        """The listener's position (started, and the stream's newest id, if it is not running)."""
        if self.listening:
            return self.seen
        return await self.position()

    @property
    def listening(self) -> bool:
        return self._task is not None and not self._task.done()

    async def position(self) -> tuple[int, int]:
        """The newest id rung so far (start the listener from there if it is not running)."""
        rows = await self._core.client.xrevrange(self.key, "+", "-", count=1)
        newest = rows[0][0] if rows else "0-0"
        if self._task is None or self._task.done():
            self.seen = max(self.seen, _stream_id(newest))
            self._task = asyncio.ensure_future(self._listen(f"{self.seen[0]}-{self.seen[1]}"))
        return _stream_id(newest)

    async def _listen(self, last: str) -> None:
        client = self._core.client
        while not self._core.closed:
            try:
                rows = await client.xread({self.key: last}, count=256, block=self._core.block_ms)
            except asyncio.CancelledError:
                raise
            except Exception:  # the server is away: waiters fall back on their deadlines
                await asyncio.sleep(0.5)
                continue
            entries = [entry for _, stream in rows or () for entry in stream]
            if not entries:
                continue
            for entry_id, fields in entries:
                self.latest[fields.get("h", "")] = _stream_id(entry_id)
                if session := fields.get("s"):
                    self.news.note(session, _position(_stream_id(entry_id)))
            last = entries[-1][0]
            self.seen = _stream_id(last)
            rung, self._rung = self._rung, asyncio.Event()
            rung.set()

    async def after(self, since: tuple[int, int]) -> None:
        """Return once something was rung after `since`."""
        while self.seen <= since:
            await self._rung.wait()

    async def close(self) -> None:
        """Stop the listener (before the client closes)."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=0.1)
        if not done:
            # redis-py (cluster) can swallow a cancellation that lands in its read timeout's
            # bookkeeping; the read then runs to its end: ring to end it now
            with contextlib.suppress(Exception):
                await self.ring()
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class _Core:
    """The connection, the scripts and the key layout shared by the four parts."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str,
        clock: Clock,
        ids: IdGenerator,
        shards: int,
        visibility_timeout_ms: int,
        dedupe_ttl_ms: int,
        cluster: bool | None,
        socket_timeout: float,
    ) -> None:
        try:
            self.keys = KeySpace(prefix)
            self.cluster = split_cluster(url)[1] if cluster is None else cluster
            self.client = cast(
                _Client, connect(url, cluster=self.cluster, socket_timeout=socket_timeout)
            )
        except ValueError as exc:
            raise BrokerError("invalid_url", str(exc)) from None
        self.prefix = prefix
        self.clock = clock
        self.ids = ids
        self.shards = shards
        self.visibility_ms = visibility_timeout_ms
        self.dedupe_ttl_ms = dedupe_ttl_ms
        self.block_ms = max(50, min(_BLOCK_MS, int(socket_timeout * 500)))
        """The longest blocking read: half the socket timeout (at most 5 s)."""
        self.scripts = Scripts(SCRIPTS)
        self.closed = False
        self._set_up = Once(self._setup)
        self.inbox_bell = _Bell(self, self.keys.key("ibx-wake", "wake"))
        self.clean: dict[int, tuple[int, int]] = {}
        """Ready shards read empty, and the inbox bell's position before that read."""
        self.outbox_bell = _Bell(self, self.keys.key("obx-wake", "wake"))

    # -- keys ---------------------------------------------------------------------------------

    def skey(self, session: str, name: str) -> str:
        """A key of a session: ``<prefix>:{<session>}:<name>``."""
        return self.keys.key(session, name)

    def ready_shard(self, session: str) -> int:
        return _crc(session) % self.shards

    def rkey(self, shard: int, name: str) -> str:
        return self.keys.key(f"rdy-{shard}", name)

    def outbox_shard(self, delivery_id: str) -> int:
        return _crc(delivery_id) % self.shards

    def okey(self, shard: int, name: str) -> str:
        return self.keys.key(f"obx-{shard}", name)

    # -- calls --------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def guard(self, what: str) -> AsyncIterator[None]:
        """Map redis-py's errors to ``BrokerError("storage")``."""
        if self.closed:
            raise BrokerError("closed", "the broker is closed")
        try:
            yield
        except RedisError as exc:
            raise BrokerError("storage", f"redis {what} failed: {exc}") from exc

    async def ready(self) -> None:
        if self.closed:
            raise BrokerError("closed", "the broker is closed")
        async with self.guard("setup"):
            await self._set_up()

    async def _setup(self) -> None:
        """Discover a cluster's topology, load the scripts, create the ready shards' groups."""
        await discover(self.client)
        await self.scripts.load(self.client)
        pipe = self.client.pipeline(transaction=False)
        for shard in range(self.shards):
            pipe.xgroup_create(self.rkey(shard, "ready"), _GROUP, id="0", mkstream=True)
        for reply in await pipe.execute(raise_on_error=False):
            if isinstance(reply, Exception) and "BUSYGROUP" not in str(reply):
                raise reply

    def forget_setup(self) -> None:
        """Set up again on next use (a ready stream and its group were deleted)."""
        self._set_up.forget()

    async def eval(self, name: str, keys: Sequence[str], args: Sequence[str | int]) -> Any:
        """Run one script (`Scripts.run` loads the scripts again if the server lost them)."""
        return await self.grouped(name, lambda: self.scripts.run(self.client, name, keys, args))

    async def grouped(self, what: str, call: Callable[[], Awaitable[_T]]) -> _T:
        """Run `call`, repairing once what a deleted stream took.

        ``NOGROUP``: a ready stream was deleted with its consumer group (the command did not
        run, or a script stopped there; its steps are idempotent): create the groups again
        and call again.
        """
        await self.ready()
        async with self.guard(what):
            try:
                return await call()
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                self.forget_setup()
        await self.ready()
        async with self.guard(what):
            return await call()

    async def evals(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Run script calls pipelined (for idempotent steps: peeks, sweeps); their replies."""
        await self.ready()
        if not calls:
            return []
        async with self.guard("pipeline"):
            replies = await self.scripts.run_all(
                self.client, calls, cluster=self.cluster, concurrency=_CONCURRENT
            )
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            return replies

    async def reads(self, build: Any) -> list[Any]:
        """Run the read commands `build(pipe)` queues, in one pipeline."""
        await self.ready()
        async with self.guard("read"):
            pipe = self.client.pipeline(transaction=False)
            build(pipe)
            return await pipe.execute()

    async def apply(
        self,
        shard: int,
        *,
        signal: str = "",
        ack: str = "",
        unindex: str = "",
        index: str = "",
        expires: int = 0,
        move: str = "",
        consumer: str = "",
    ) -> None:
        """One step on a ready shard (see ``ready_apply.lua``); a signal also rings the bell.

        On a server the ring goes in the same script; a cluster's bell is in another slot.
        """
        keys = [self.rkey(shard, "ready"), self.rkey(shard, "claims")]
        if not self.cluster:
            keys.append(self.inbox_bell.key)
        await self.eval(
            "ready_apply",
            keys,
            [signal, ack, unindex, index, expires, move, consumer, shard, _WAKE_CAP],
        )
        if signal:
            self.clean.pop(shard, None)
            if self.cluster:
                async with self.guard("wake"):
                    await self.inbox_bell.ring(str(shard))

    def dirty(self, shard: int) -> bool:
        """Whether a ready shard may hold entries no read of this broker has seen."""
        read_empty = self.clean.get(shard)
        rung = self.inbox_bell.latest.get(str(shard))
        return read_empty is None or (rung is not None and rung > read_empty)

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        await self.inbox_bell.close()
        await self.outbox_bell.close()
        await close_clients(self.client)


class _RedisInbox:
    def __init__(self, core: _Core) -> None:
        self._c = core
        self._listed: OrderedDict[tuple[str, int], str] = OrderedDict()
        """Items `pending` listed, by session and number: their dedupe key (what `ack` needs
        to name the key it starts the expiry of; the script checks it is still the item's)."""
        self._registered: set[str] = set()
        self._next_shard = 0
        self._next_autoclaim = 0.0
        self._autoclaim_from: dict[int, str] = {}
        self._next_sweep = 0
        self._sweep_shard = 0
        self._recover_at = 0
        """When (clock) expired claims must be looked for next."""
        self._scanning = asyncio.Lock()
        self._recovered: tuple[int, int] = (0, 0)
        """The inbox bell's position at the last look for expired claims."""
        self._full_scan_at = 0

    def _keys(self, session: str, *names: str) -> list[str]:
        return [self._c.skey(session, name) for name in names]

    async def _register(self, session: str) -> None:
        """Add the session to its shard's list before its first item (for backlog and sweep)."""
        if session in self._registered:
            return
        await self._c.ready()
        async with self._c.guard("register"):
            await self._c.client.sadd(
                self._c.rkey(self._c.ready_shard(session), "sessions"), session
            )
        self._registered.add(session)

    async def append(
        self,
        item: NewInboxItem,
        *,
        thread: FrozenJsonObject | None = None,
        reply_context: FrozenJsonObject | None = None,
        read_mark: str | None = None,
    ) -> InboxAppend:
        c = self._c
        _check_session(item.session)
        await self._register(item.session)
        body = _json(
            {
                "lane": item.lane,
                "dedupe_key": item.dedupe_key,
                "kind": item.kind,
                "payload": item.payload,
            }
        )
        keys = self._keys(
            item.session, "st", "inbox", f"dd:{item.dedupe_key}", "claim", "rej", "threads"
        )
        shard = c.ready_shard(item.session)
        if not c.cluster:  # one call: the signal, the ring and the mark too (a cluster's are
            # elsewhere)
            keys += [c.rkey(shard, "ready"), c.inbox_bell.key, _marks_key(c)]
        args: list[str | int] = [
            c.clock.now_ms(),
            item.dedupe_key,
            c.visibility_ms,
            body,
            item.session,
            shard,
            _WAKE_CAP,
            item.lane,
            "" if thread is None else _json(thread),
            "" if thread is None else _json(reply_context or {}),
            read_mark or "",
        ]
        reply = await c.eval("inbox_append", keys, args)
        if reply[0] == 2:
            raise LaneTaken(item.session, item.lane, str(reply[1]))
        duplicate, item_id, at, stored, status, reason, signal, ring, sent, mark = reply
        if signal:
            c.clean.pop(shard, None)
        if signal and not sent:
            await c.apply(shard, signal=item.session)
        if ring and not sent:  # the session is held: its holder waits for news of it
            async with c.guard("wake"):
                await c.inbox_bell.ring(session=item.session)
        if read_mark is not None and c.cluster:  # the marks are in another slot
            async with c.guard("read"):
                mark = await c.client.hget(_marks_key(c), read_mark)
        return InboxAppend(
            item=_item(item.session, item_id, at, stored, status, reason),
            duplicate=bool(duplicate),
            mark=mark,
        )

    async def pending(
        self, session: str, *, limit: int = 100, after: str | None = None
    ) -> tuple[InboxItem, ...]:
        if limit <= 0 or not session:
            return ()
        since = _item_number(after) if after is not None else None
        start = f"({since}-0" if since else "-"  # exclusive: the items after that one
        await self._c.ready()
        async with self._c.guard("read"):
            rows = await self._c.client.xrange(
                self._c.skey(session, "inbox"), start, "+", count=limit
            )
        listed = self._listed
        for sid, f in rows:
            listed[(session, _stream_id(sid)[0])] = f["k"]
            listed.move_to_end((session, _stream_id(sid)[0]))
        while len(listed) > _LISTED_CAP:
            listed.popitem(last=False)
        return tuple(
            _item(session, f"{_stream_id(sid)[0]:016d}", f["a"], f["j"]) for sid, f in rows
        )

    async def ack(self, session: str, item_id: str) -> None:
        number = _item_number(item_id)
        if number is None or not session:
            return
        c = self._c
        dedupe_key = self._listed.pop((session, number), None)
        if dedupe_key is not None and await self._ack(session, number, dedupe_key) >= 0:
            return
        # not listed by this broker (or the note is stale): its dedupe key is read first
        await c.ready()
        async with c.guard("ack"):
            rows = await c.client.xrange(
                c.skey(session, "inbox"), f"{number}-0", f"{number}-0", count=1
            )
        if rows:
            await self._ack(session, number, rows[0][1]["k"])

    async def _ack(self, session: str, number: int, dedupe_key: str) -> int:
        c = self._c
        keys = self._keys(session, "inbox", f"dd:{dedupe_key}")
        args: list[str | int] = [f"{number}-0", dedupe_key, c.clock.now_ms(), c.dedupe_ttl_ms]
        return int(await c.eval("inbox_ack", keys, args))

    async def reject(self, session: str, item_id: str, reason: str) -> None:
        number = _item_number(item_id)
        if number is None or not session:
            return
        keys = self._keys(session, "inbox", "rej", "rejitem")
        await self._c.eval("inbox_reject", keys, [f"{number}-0", f"{number:016d}", reason])

    # -- sessions -----------------------------------------------------------------------------

    async def take_session(self, worker: str, *, wait_ms: int = 0) -> SessionTicket | None:
        c = self._c
        bell = c.inbox_bell
        deadline = c.clock.now_ms() + max(wait_ms, 0)
        while not c.closed:  # a closed broker hands out nothing (a draining worker stops)
            await c.ready()
            if not bell.listening:
                async with c.guard("take"):
                    await bell.position()
            since = bell.seen
            async with self._scanning:  # one scan at a time: woken waiters do not all read
                ticket = await whole_take(self._scan(worker, since), self._hand_back)
            if ticket is not None:
                return ticket
            now = c.clock.now_ms()
            if now >= deadline or c.closed:
                return None
            if self._recover_at <= now:
                continue  # more expired claims than one pass looks at
            # wake on a ring, at the next claim expiry, and at least every poll interval (the
            # full scan, the XAUTOCLAIM backstop and the sweep run on their own schedules)
            bound = min(deadline, now + _POLL_MS, self._recover_at)
            await _first(bell.after(since), _sleep_until(c.clock, bound))
        return None

    async def _scan(self, worker: str, since: tuple[int, int]) -> SessionTicket | None:
        """Hand out a session: expired claims first, then new ready entries, shard by shard.

        A shard read empty is skipped until something is rung for it after that read (or it
        was signalled by this broker), except by the full scan every poll interval.
        """
        c = self._c
        now = c.clock.now_ms()
        deferred = c.inbox_bell.latest.get(_CLAIMS_HINT)
        if now >= self._recover_at or (deferred is not None and deferred > self._recovered):
            self._recovered = since
            ticket = await self._recover(worker, now)
            if ticket is not None:
                return ticket
        full = now >= self._full_scan_at
        if full:
            self._full_scan_at = now + _POLL_MS
            ticket = await self._maintain(worker, now)
            if ticket is not None:
                return ticket
        start = self._next_shard
        self._next_shard = (start + 1) % c.shards
        for shard in ((start + i) % c.shards for i in range(c.shards)):
            if not full and not c.dirty(shard):
                continue
            ready = c.rkey(shard, "ready")

            def read(ready: str = ready) -> Awaitable[list[tuple[str, _Stream]] | None]:
                return c.client.xreadgroup(_GROUP, worker, {ready: ">"}, count=1)

            for _ in range(_SCAN_PER_SHARD):
                rows = await c.grouped("take", read)
                entries = [entry for _, stream in rows or () for entry in stream]
                if not entries:
                    c.clean[shard] = since
                    break
                entry_id, fields = entries[0]
                ticket = await self._consider(shard, entry_id, fields.get("s", ""), worker, "")
                if ticket is not None:
                    return ticket
        return None

    async def _recover(self, worker: str, now: int) -> SessionTicket | None:
        """Hand out a session whose claim expired on the clock (its worker died or stalled)."""
        c = self._c

        def build(pipe: _Pipe) -> None:
            for shard in range(c.shards):
                claims = c.rkey(shard, "claims")
                pipe.zrangebyscore(claims, "-inf", now, start=0, num=_RECOVER_PER_SHARD)
                pipe.zrangebyscore(claims, f"({now}", "+inf", start=0, num=1, withscores=True)

        replies = await c.reads(build)
        expired, later = replies[0::2], replies[1::2]
        scores = [int(score) for rows in later for _, score in rows]
        # every claim indexed after these reads expires a visibility timeout from now or later
        self._recover_at = min([now + c.visibility_ms, *scores])
        if any(len(members) >= _RECOVER_PER_SHARD for members in expired):
            self._recover_at = now  # more to look at
        for shard, members in enumerate(expired):
            for member in members:
                token, entry, session = str(member).split(" ", 2)
                ticket = await self._consider(shard, entry, session, worker, token, member)
                if ticket is not None:
                    self._recover_at = now
                    return ticket
        return None

    async def _maintain(self, worker: str, now: int) -> SessionTicket | None:
        """The XAUTOCLAIM backstop (server time) and a step of the sweep, each on its schedule."""
        c = self._c
        loop = asyncio.get_running_loop()
        if loop.time() >= self._next_autoclaim:
            self._next_autoclaim = loop.time() + min(c.visibility_ms / 4000, 1.0)
            ticket = await self._autoclaim(worker)
            if ticket is not None:
                return ticket
        if now >= self._next_sweep:
            self._next_sweep = now + max(1_000, c.visibility_ms // c.shards)
            shard, self._sweep_shard = self._sweep_shard, (self._sweep_shard + 1) % c.shards
            await self.sweep(shard)
        return None

    async def _autoclaim(self, worker: str) -> SessionTicket | None:
        """Ready entries idle beyond the visibility timeout (server time): a dead worker's."""
        c = self._c
        for shard in range(c.shards):

            def claim(shard: int = shard) -> Awaitable[list[Any]]:
                return c.client.xautoclaim(
                    c.rkey(shard, "ready"),
                    _GROUP,
                    worker,
                    min_idle_time=c.visibility_ms,
                    start_id=self._autoclaim_from.get(shard, "0-0"),
                    count=_RECOVER_PER_SHARD,
                )

            reply = await c.grouped("autoclaim", claim)
            self._autoclaim_from[shard] = str(reply[0])
            for entry_id, fields in reply[1]:
                if fields is None:
                    continue
                ticket = await self._consider(shard, entry_id, fields.get("s", ""), worker, "")
                if ticket is not None:
                    return ticket
        return None

    async def sweep(self, shard: int | None = None) -> int:
        """Signal sessions whose ready signal may have been lost (all shards, or one).

        A session qualifies with pending items, no live claim and no signal within the
        visibility timeout; returns how many were signalled.
        """
        c = self._c
        shards = range(c.shards) if shard is None else [shard]
        signalled = 0
        for each in shards:
            (members,) = await c.reads(lambda pipe, n=each: pipe.smembers(c.rkey(n, "sessions")))
            sessions = sorted(str(s) for s in members)
            now = c.clock.now_ms()
            for start in range(0, len(sessions), _BATCH):
                batch = sessions[start : start + _BATCH]
                calls = [
                    ("inbox_sweep", self._keys(s, "st", "inbox", "claim"), [now, c.visibility_ms])
                    for s in batch
                ]
                for session, wanted in zip(batch, await c.evals(calls), strict=True):
                    if wanted:
                        await c.apply(each, signal=session)
                        signalled += 1
            await self._forget_idle_consumers(each)
        return signalled

    async def _forget_idle_consumers(self, shard: int) -> None:
        """Drop the group's consumers (worker names) with nothing pending, idle for an hour."""
        c = self._c
        ready = c.rkey(shard, "ready")
        async with c.guard("sweep"):
            consumers = await c.client.xinfo_consumers(ready, _GROUP)
            for consumer in consumers:
                if int(consumer["pending"]) == 0 and int(consumer["idle"]) > _CONSUMER_IDLE_MS:
                    await c.client.xgroup_delconsumer(ready, _GROUP, str(consumer["name"]))

    async def _consider(
        self,
        shard: int,
        entry: str,
        session: str,
        worker: str,
        old_token: str,
        old_member: str = "",
    ) -> SessionTicket | None:
        """Run the take script on one ready entry and the matching step on its shard."""
        c = self._c
        if not session:  # not an entry this broker wrote
            await c.apply(shard, ack=entry, unindex=old_member)
            return None
        token = c.ids.next()
        keys = self._keys(session, "st", "inbox", "claim")
        if not c.cluster:
            keys.append(c.inbox_bell.key)
        args: list[str | int] = [
            entry,
            token,
            worker,
            c.clock.now_ms(),
            c.visibility_ms,
            old_token,
            session,
        ]
        outcome, expires, over = await c.eval("inbox_take", keys, [*args, _WAKE_CAP])
        if over:  # its old holder may still wait on the session: it is no longer theirs
            async with c.guard("wake"):
                await c.inbox_bell.ring(session=session)
        if outcome == "taken":
            await c.apply(
                shard,
                unindex=old_member,
                index=f"{token} {entry} {session}",
                expires=int(expires),
                move=entry if old_token else "",
                consumer=worker,
            )
            return SessionTicket(session=session, ticket=f"{token} {entry} {worker}")
        if outcome in ("drop", "empty"):
            await c.apply(shard, ack=entry, unindex=old_member)
        elif outcome == "stale":
            await c.apply(shard, unindex=old_member)
        elif outcome == "live":
            await c.apply(shard, index=old_member, expires=int(expires))
        return None  # park: the entry anchors a live claim; it stays pending

    def _parse(self, ticket: SessionTicket) -> tuple[str, str, str] | None:
        parts = ticket.ticket.split(" ", 2)
        if len(parts) != 3 or not ticket.session:
            return None
        return parts[0], parts[1], parts[2]

    async def renew(self, ticket: SessionTicket) -> bool:
        c = self._c
        parsed = self._parse(ticket)
        if parsed is None:
            return False
        token, entry, worker = parsed
        expires = await c.eval(
            "inbox_renew",
            [c.skey(ticket.session, "claim")],
            [token, c.clock.now_ms(), c.visibility_ms],
        )
        if not expires:
            return False
        await c.apply(
            c.ready_shard(ticket.session),
            index=f"{token} {entry} {ticket.session}",
            expires=int(expires),
            move=entry,
            consumer=worker,
        )
        return True

    async def _hand_back(self, ticket: SessionTicket) -> None:
        """Hand back what a cancelled take took: ready for the next take at once.

        Pending items or not: nobody looked at the session (a lapsed ticket's operation is open).
        """
        await self.done(ticket, again_in_ms=0)

    async def done(self, ticket: SessionTicket, *, again_in_ms: int | None = None) -> None:
        c = self._c
        parsed = self._parse(ticket)
        if parsed is None:
            return
        token, entry, _ = parsed
        deferred_token = c.ids.next()
        outcome, signal, expires, anchor = await c.eval(
            "inbox_done",
            self._keys(ticket.session, "st", "inbox", "claim"),
            [
                token,
                c.clock.now_ms(),
                c.visibility_ms,
                "" if again_in_ms is None else again_in_ms,
                deferred_token,
            ],
        )
        shard = c.ready_shard(ticket.session)
        if outcome == 2:  # deferred: index the lapsing claim, and tell every broker's takers
            await c.apply(
                shard,
                unindex=f"{token} {entry} {ticket.session}",
                index=f"{deferred_token} {anchor} {ticket.session}",
                expires=int(expires),
            )
            self._recover_at = min(self._recover_at, int(expires))
            async with c.guard("wake"):  # and the ticket's holder, if it waits on the session
                await c.inbox_bell.ring(_CLAIMS_HINT, session=ticket.session)
        elif outcome == 1 or signal:
            await c.apply(
                shard,
                signal=ticket.session if signal else "",
                ack=entry if outcome == 1 else "",
                unindex=f"{token} {entry} {ticket.session}" if outcome == 1 else "",
            )

    async def _tickets(self) -> list[tuple[str, str, str, str, int]]:
        """Every indexed claim that is its session's: (session, token, entry, worker, expiry).

        A claim whose index entry a crash lost is not found here (it lapses and is recovered
        by `XAUTOCLAIM`, as ever).
        """
        c = self._c
        indexed = await c.reads(
            lambda pipe: [pipe.zrange(c.rkey(shard, "claims"), 0, -1) for shard in range(c.shards)]
        )
        members = [str(member).split(" ", 2) for rows in indexed for member in rows]
        members = [m for m in members if len(m) == 3]
        found: list[tuple[str, str, str, str, int]] = []
        for start in range(0, len(members), _BATCH):
            batch = members[start : start + _BATCH]

            def build(pipe: _Pipe, batch: list[list[str]] = batch) -> None:
                for _, _, session in batch:
                    pipe.hmget(c.skey(session, "claim"), ["token", "worker", "exp"])

            for (token, entry, session), (held_token, worker, exp) in zip(
                batch, await c.reads(build), strict=True
            ):
                if held_token == token and worker and exp:
                    found.append((session, token, entry, str(worker), int(exp)))
        return sorted(found)

    async def held(self) -> tuple[TicketHeld, ...]:
        now = self._c.clock.now_ms()
        return tuple(
            TicketHeld(session=session, worker=worker, expires_at_ms=exp)
            for session, _, _, worker, exp in await self._tickets()
            if exp > now
        )

    async def release(self, worker: str) -> tuple[str, ...]:
        released = []
        for session, token, entry, holder, _ in await self._tickets():
            if holder == worker:  # `done` checks the token again, atomically
                ticket = SessionTicket(session=session, ticket=f"{token} {entry} {holder}")
                await self.done(ticket, again_in_ms=0)
                released.append(session)
        return tuple(released)

    async def position(self) -> int:
        c = self._c
        await c.ready()
        async with c.guard("position"):
            return _position(await c.inbox_bell.mark())

    async def wait(self, session: str, *, since: int, timeout_ms: int) -> bool:
        c = self._c
        bell = c.inbox_bell
        deadline = c.clock.now_ms() + max(timeout_ms, 0)
        while not c.closed:
            rung = bell.news.waiter(session)
            if bell.news.since(session, since):
                return True
            if not bell.listening:  # nobody read the rings: what they said is unknown
                async with c.guard("position"):
                    await bell.mark()  # listening from now on
                return True
            if c.clock.now_ms() >= deadline:
                return False
            await _first(rung.wait(), _sleep_until(c.clock, deadline))
        return True

    async def backlog(self) -> Backlog:
        c = self._c
        registries = await c.reads(
            lambda pipe: [pipe.smembers(c.rkey(shard, "sessions")) for shard in range(c.shards)]
        )
        sessions = sorted({str(s) for members in registries for s in members})
        pending = dead = 0
        oldest: int | None = None
        for start in range(0, len(sessions), _BATCH):
            batch = sessions[start : start + _BATCH]

            def build(pipe: _Pipe, batch: list[str] = batch) -> None:
                for s in batch:
                    pipe.xlen(c.skey(s, "inbox"))
                    pipe.xrange(c.skey(s, "inbox"), "-", "+", count=1)
                    pipe.hlen(c.skey(s, "rej"))

            replies = await c.reads(build)
            for i in range(0, len(replies), 3):
                count, first, rejected = replies[i : i + 3]
                pending += int(count)
                dead += int(rejected)
                if first:
                    at = int(first[0][1]["a"])
                    oldest = at if oldest is None else min(oldest, at)
        age = 0 if oldest is None else max(0, c.clock.now_ms() - oldest)
        return Backlog(pending=pending, oldest_age_ms=age, dead=dead)


def _item(
    session: str,
    item_id: str,
    appended_at: str | int,
    body: str,
    status: str = "pending",
    reason: str | None = None,
) -> InboxItem:
    data = json.loads(body)
    return InboxItem(
        session=session,
        lane=data["lane"],
        dedupe_key=data["dedupe_key"],
        kind=data["kind"],
        payload=data["payload"],
        id=item_id,
        appended_at_ms=int(appended_at),
        status=cast(InboxStatus, status),
        reason=reason,
    )


def _delivery(fields: Mapping[str, str]) -> Delivery:
    settled = fields.get("set")
    return Delivery(
        id=fields["id"],
        session=fields["s"],
        lane=fields["l"],
        outbound=json.loads(fields["o"]),
        status=cast(DeliveryStatus, fields["st"]),
        attempts=int(fields["n"]),
        due_at_ms=int(fields["due"]),
        unknown_outcome=fields.get("u") == "1",
        last_error=fields.get("err"),
        created_at_ms=int(fields["c"]),
        settled_at_ms=None if settled is None else int(settled),
    )


def _claimed(fields: Mapping[str, str]) -> ClaimedDelivery:
    return ClaimedDelivery(
        delivery=_delivery(fields), token=fields["tok"], lease_expires_at_ms=int(fields["lx"])
    )


class _RedisOutbox:
    def __init__(
        self, core: _Core, settled_retention_ms: int | None, dead_retention_ms: int | None
    ) -> None:
        self._c = core
        self._settled_retention_ms = settled_retention_ms
        self._dead_retention_ms = dead_retention_ms
        self._next_purge = 0
        self._next: list[float | None] = [None] * core.shards
        """Per shard: when something in it may next be claimable (its first due time or lease
        expiry; inf: nothing), as `wait` read it; None: unknown (a claim changed it, or it
        was never read)."""
        self._read_at: list[tuple[int, int]] = [(0, 0)] * core.shards
        """The outbox bell's position before each shard's `_next` was read."""
        self._full_at = 0
        """When `wait` last read every shard (a ring that was lost is found by the next one)."""

    def _k(self, delivery_id: str, *names: str) -> list[str]:
        shard = self._c.outbox_shard(delivery_id)
        return [self._c.okey(shard, f"o:{delivery_id}" if name == "o" else name) for name in names]

    async def enqueue(
        self, delivery_id: str, session: str, lane: str, outbound: FrozenJsonObject, *, now_ms: int
    ) -> bool:
        c = self._c
        keys = self._k(delivery_id, "o", "due", "pend", "ls:pending")
        args: list[str | int] = [delivery_id, session, lane, _json(outbound), now_ms]
        new = await c.eval("outbox_enqueue", *self._ringing(delivery_id, keys, args))
        if new:
            await self._ring(delivery_id)
        return bool(new)

    def _ringing(
        self, delivery_id: str, keys: list[str], args: list[str | int]
    ) -> tuple[list[str], list[str | int]]:
        """A script's keys and args, with the outbox bell's on a server (the script rings it)."""
        c = self._c
        if c.cluster:  # the bell is in another slot: `_ring` rings it after the script
            return keys, args
        return [*keys, c.outbox_bell.key], [*args, c.outbox_shard(delivery_id), _WAKE_CAP]

    async def _ring(self, delivery_id: str) -> None:
        """Wake the deliverers: something in this delivery's shard may be due sooner.

        On a server the script that made it due rang the bell already.
        """
        shard = self._c.outbox_shard(delivery_id)
        self._next[shard] = None
        if self._c.cluster:
            async with self._c.guard("wake"):
                await self._c.outbox_bell.ring(str(shard))

    def _may_be_due(self, now_ms: int) -> list[int]:
        """The shards a claim looks at: every one unless `wait`'s reading is fresh and heard.

        A shard is skipped while its reading says nothing is claimable before a later time and
        nothing was rung for it since (an enqueue, a retry, a redelivery ring it; a claim or a
        settle only makes its reading early, which costs a look, never a miss). Without a
        listener on the bell, or once a reading is older than the poll interval, all of them.
        """
        c = self._c
        if not c.outbox_bell.listening or now_ms - self._full_at >= _POLL_MS:
            return list(range(c.shards))
        rung = c.outbox_bell.latest
        return [
            n
            for n, at in enumerate(self._next)
            if at is None or at <= now_ms or rung.get(str(n), (0, 0)) > self._read_at[n]
        ]

    async def claim(
        self, worker: str, *, now_ms: int, limit: int, lease_ms: int
    ) -> tuple[ClaimedDelivery, ...]:
        c = self._c
        if limit <= 0:
            return ()
        await self._maybe_purge(now_ms)
        claimed: list[ClaimedDelivery] = []
        shards = self._may_be_due(now_ms)
        if not shards:  # every reading is fresh and says nothing is claimable yet
            return ()
        if len(shards) == 1 and limit <= _TAKE_MAX:
            return await self._take(
                shards[0], worker, now_ms=now_ms, limit=limit, lease_ms=lease_ms
            )
        for n in shards:
            self._next[n] = None  # this claim may change it: `wait` reads it again
        for _ in range(3):  # another deliverer may win some candidates: look again
            want = limit - len(claimed)
            peeks = await c.evals(
                [
                    (
                        "outbox_peek",
                        [c.okey(n, "due"), c.okey(n, "leased"), c.okey(n, "pend")],
                        [now_ms, want],
                    )
                    for n in shards
                ]
            )
            candidates = sorted(
                (float(flat[i + 1]), str(flat[i])) for flat in peeks for i in range(0, len(flat), 2)
            )[:want]
            if not candidates:
                break
            by_shard: dict[int, list[str]] = {}
            for _, delivery_id in candidates:
                by_shard.setdefault(c.outbox_shard(delivery_id), []).append(delivery_id)
            got = 0
            for shard, ids in by_shard.items():
                args: list[str | int] = [now_ms, lease_ms, worker]
                for delivery_id in ids:
                    args += [delivery_id, c.ids.next()]
                keys = [c.okey(shard, "due"), c.okey(shard, "leased")]
                keys += [c.okey(shard, f"o:{delivery_id}") for delivery_id in ids]
                for flat in await c.eval("outbox_claim", keys, args):
                    claimed.append(_claimed(_pairs(flat)))
                    got += 1
            if got == len(candidates) or len(claimed) >= limit:
                break
        claimed.sort(key=lambda cd: (cd.delivery.due_at_ms, cd.delivery.id))
        return tuple(claimed)

    async def _take(
        self, shard: int, worker: str, *, now_ms: int, limit: int, lease_ms: int
    ) -> tuple[ClaimedDelivery, ...]:
        """A claim from one shard in one script call (`outbox_take.lua`).

        The script also says when the shard may next hold something claimable, so `wait` need
        not read it again unless it is rung.
        """
        c = self._c
        bell = c.outbox_bell
        listening, since = bell.listening, bell.seen  # before the script: a later ring is news
        self._next[shard] = None
        keys = [c.okey(shard, "due"), c.okey(shard, "leased"), c.okey(shard, "pend")]
        tokens = [c.ids.next() for _ in range(limit)]
        next_at, *rows = await c.eval("outbox_take", keys, [now_ms, lease_ms, worker, *tokens])
        if listening:  # else `wait` reads every shard, as it starts the listener
            self._next[shard] = float("inf") if next_at is None else float(next_at)
            self._read_at[shard] = since
        claimed = [_claimed(_pairs(flat)) for flat in rows]
        claimed.sort(key=lambda cd: (cd.delivery.due_at_ms, cd.delivery.id))
        return tuple(claimed)

    async def _settle(
        self,
        claimed: ClaimedDelivery,
        mode: str,
        *,
        now_ms: int,
        due_at_ms: int = 0,
        reason: str = "",
        unknown_outcome: bool = False,
    ) -> bool:
        delivery_id = claimed.delivery.id
        target = {"retry": "pending", "dead": "dead", "delivered": "delivered"}[mode]
        index = "deadat" if mode == "dead" else "settled"
        keys = self._k(
            delivery_id, "o", "due", "leased", "pend", "ls:pending", f"ls:{target}", index
        )
        args: list[str | int] = [
            mode,
            claimed.token,
            now_ms,
            due_at_ms,
            reason,
            "1" if unknown_outcome else "0",
            delivery_id,
        ]
        settled = bool(await self._c.eval("outbox_settle", *self._ringing(delivery_id, keys, args)))
        if settled and mode == "retry":
            await self._ring(delivery_id)
        return settled

    async def settle_delivered(self, claimed: ClaimedDelivery, *, now_ms: int) -> bool:
        return await self._settle(claimed, "delivered", now_ms=now_ms)

    async def holders(self, *, now_ms: int) -> tuple[str, ...]:
        c = self._c
        found = await c.evals(
            [("outbox_holders", [c.okey(n, "leased")], [now_ms]) for n in range(c.shards)]
        )
        return tuple(sorted({str(worker) for names in found for worker in names}))

    async def release(self, worker: str, *, now_ms: int) -> tuple[str, ...]:
        c = self._c
        found = await c.evals(
            [("outbox_release", [c.okey(n, "leased")], [now_ms, worker]) for n in range(c.shards)]
        )
        released = sorted(str(delivery_id) for ids in found for delivery_id in ids)
        for shard in sorted({c.outbox_shard(delivery_id) for delivery_id in released}):
            self._next[shard] = None
            async with c.guard("wake"):
                await c.outbox_bell.ring(str(shard))
        return tuple(released)

    async def settle_retry(
        self,
        claimed: ClaimedDelivery,
        *,
        due_at_ms: int,
        reason: str,
        unknown_outcome: bool,
        now_ms: int,
    ) -> bool:
        return await self._settle(
            claimed,
            "retry",
            now_ms=now_ms,
            due_at_ms=due_at_ms,
            reason=reason,
            unknown_outcome=unknown_outcome,
        )

    async def settle_dead(self, claimed: ClaimedDelivery, *, reason: str, now_ms: int) -> bool:
        return await self._settle(claimed, "dead", now_ms=now_ms, reason=reason)

    async def get(self, delivery_id: str) -> Delivery | None:
        c = self._c
        await c.ready()
        async with c.guard("read"):
            fields = await c.client.hgetall(self._k(delivery_id, "o")[0])
        return _delivery(fields) if fields else None

    async def list(
        self, status: DeliveryStatus, *, after: str | None = None, limit: int = 100
    ) -> tuple[Delivery, ...]:
        c = self._c
        if limit <= 0 or status not in _STATUSES:
            return ()
        low = "-" if after is None else f"({after}"
        pages = await c.reads(
            lambda pipe: [
                pipe.zrangebylex(c.okey(n, f"ls:{status}"), low, "+", start=0, num=limit)
                for n in range(c.shards)
            ]
        )
        ids = sorted(str(i) for page in pages for i in page)[:limit]
        rows = await c.reads(lambda pipe: [pipe.hgetall(self._k(i, "o")[0]) for i in ids])
        return tuple(_delivery(row) for row in rows if row)

    async def redeliver(self, delivery_id: str, *, now_ms: int) -> Operated | None:
        keys = self._k(delivery_id, "o", "due", "pend", "ls:dead", "ls:pending", "deadat")
        args: list[str | int] = [now_ms, delivery_id]
        flat = await self._c.eval("outbox_redeliver", *self._ringing(delivery_id, keys, args))
        if not flat:
            return None
        operated = _operated(flat)
        if operated.changed:
            await self._ring(delivery_id)
        return operated

    async def discard(self, delivery_id: str, *, now_ms: int) -> Operated | None:
        keys = self._k(
            delivery_id,
            "o",
            "due",
            "leased",
            "pend",
            "ls:pending",
            "ls:dead",
            "deadat",
            "ls:discarded",
            "settled",
        )
        flat = await self._c.eval("outbox_discard", keys, [now_ms, delivery_id])
        return _operated(flat) if flat else None

    async def backlog(self, *, now_ms: int) -> Backlog:
        c = self._c

        def build(pipe: _Pipe) -> None:
            for n in range(c.shards):
                pipe.zcard(c.okey(n, "pend"))
                pipe.zrange(c.okey(n, "pend"), 0, 0, withscores=True)
                pipe.zcard(c.okey(n, "ls:dead"))

        replies = await c.reads(build)
        pending = dead = 0
        oldest: int | None = None
        for i in range(0, len(replies), 3):
            count, first, dead_count = replies[i : i + 3]
            pending += int(count)
            dead += int(dead_count)
            if first:
                due = int(first[0][1])
                oldest = due if oldest is None else min(oldest, due)
        age = 0 if oldest is None or oldest > now_ms else now_ms - oldest
        return Backlog(pending=pending, oldest_age_ms=age, dead=dead)

    async def wait(self, timeout_ms: int) -> None:
        c = self._c
        if c.closed:
            return
        await c.ready()
        now = c.clock.now_ms()
        deadline = now + max(timeout_ms, 0)
        async with c.guard("wait"):
            listening = c.outbox_bell.listening
            since = await c.outbox_bell.mark()
        # the shards a claim would look at (all of them now and then): read when each may
        # next have something claimable
        shards = self._may_be_due(now) if listening else list(range(c.shards))

        def build(pipe: _Pipe) -> None:
            for n in shards:
                pipe.zrange(c.okey(n, "due"), 0, 0, withscores=True)
                pipe.zrange(c.okey(n, "leased"), 0, 0, withscores=True)

        firsts = await c.reads(build)
        for i, n in enumerate(shards):
            times = [float(score) for rows in firsts[2 * i : 2 * i + 2] for _, score in rows]
            self._next[n] = min(times, default=float("inf"))
            self._read_at[n] = since
        if len(shards) == c.shards:
            self._full_at = now
        now = c.clock.now_ms()
        # every shard is known now: those just read, and those `_may_be_due` left out
        bound = min([deadline, *(at for at in self._next if at is not None)])
        if bound <= now:
            return
        await _first(c.outbox_bell.after(since), _sleep_until(c.clock, int(bound)))

    async def purge(self, *, now_ms: int) -> int:
        """Delete settled deliveries past their retention; returns how many."""
        c = self._c
        deleted = 0
        for index, retention in (
            ("settled", self._settled_retention_ms),
            ("deadat", self._dead_retention_ms),
        ):
            if retention is None:
                continue
            cutoff = now_ms - retention
            for n in range(c.shards):
                while True:
                    (ids,) = await c.reads(
                        lambda pipe, n=n, index=index, cutoff=cutoff: pipe.zrangebyscore(
                            c.okey(n, index), "-inf", cutoff, start=0, num=_BATCH
                        )
                    )
                    if not ids:
                        break
                    keys = [c.okey(n, index), *(c.okey(n, f"ls:{s}") for s in _STATUSES[1:])]
                    keys += [c.okey(n, f"o:{i}") for i in ids]
                    deleted += int(await c.eval("outbox_purge", keys, [cutoff, *ids]))
                    if len(ids) < _BATCH:
                        break
        return deleted

    async def _maybe_purge(self, now_ms: int) -> None:
        if now_ms < self._next_purge:
            return
        self._next_purge = now_ms + 60_000
        await self.purge(now_ms=now_ms)


class _RedisThreads:
    def __init__(self, core: _Core) -> None:
        self._c = core

    async def remember(
        self, session: str, lane: str, thread: FrozenJsonObject, reply_context: FrozenJsonObject
    ) -> None:
        c = self._c
        _check_session(session)
        await c.ready()
        key = c.skey(session, "threads")
        async with c.guard("remember"):
            pipe = c.client.pipeline(transaction=False)  # one key: one round trip
            pipe.hset(key, f"c:{lane}", _json(reply_context))
            pipe.hsetnx(key, f"t:{lane}", _json(thread))  # its first thread stays
            await pipe.execute()

    async def get(self, session: str, lane: str) -> ThreadState | None:
        c = self._c
        if not session:
            return None
        await c.ready()
        async with c.guard("read"):
            thread, context, replied = await c.client.hmget(
                c.skey(session, "threads"), [f"t:{lane}", f"c:{lane}", f"r:{lane}"]
            )
        if thread is None:
            return None
        return _thread(session, lane, thread, context, replied)

    async def list(self, session: str) -> tuple[ThreadState, ...]:
        c = self._c
        if not session:
            return ()
        await c.ready()
        async with c.guard("read"):
            fields = await c.client.hgetall(c.skey(session, "threads"))
        lanes = sorted(name[2:] for name in fields if name.startswith("t:"))
        return tuple(
            _thread(
                session, lane, fields[f"t:{lane}"], fields.get(f"c:{lane}"), fields.get(f"r:{lane}")
            )
            for lane in lanes
        )

    async def mark_replied(self, session: str, lane: str, seq: int) -> None:
        if not session:
            return
        await self._c.eval("threads_mark", [self._c.skey(session, "threads")], [lane, seq])

    async def rebase(self, session: str, seq: int) -> int:
        if not session:
            return 0
        lanes = await self._c.eval("threads_rebase", [self._c.skey(session, "threads")], [seq])
        return int(lanes)


class _RedisBlobs:
    """A session's blobs in three hashes under its tag: sizes and retention, bytes, names.

    The bytes are base64 (this backend's connection decodes replies as text, D222).
    """

    def __init__(self, core: _Core, limits: BlobLimits) -> None:
        self._c = core
        self._limits = limits

    @property
    def max_blob_bytes(self) -> int:
        return self._limits.max_blob_bytes

    def _keys(self, session: str) -> list[str]:
        c = self._c
        return [
            c.skey(session, "blobs"),
            c.skey(session, "blob-data"),
            c.skey(session, "blob-names"),
        ]

    async def put(self, session: str, data: bytes, *, key: str | None = None) -> BlobInfo:
        limits = self._limits
        limits.check_size(len(data))
        id_ = blob_id(data)
        now = self._c.clock.now_ms()
        until = now + limits.retention_ms
        args: list[str | int] = [
            id_,
            base64.b64encode(data).decode("ascii"),
            len(data),
            now,
            until,
            limits.max_session_bytes,
            key or "",
            limits.retention_ms + _BLOB_KEYS_SLACK_MS,
        ]
        status, value = await self._c.eval("blob_put", self._keys(session), args)
        if status == "full":
            limits.check_room(int(value), len(data))
        return BlobInfo(id=id_, size=len(data), keep_until_ms=int(value))

    async def _info(self, session: str, id_: str) -> BlobInfo | None:
        c = self._c
        async with c.guard("read"):
            entry = await c.client.hget(self._keys(session)[0], id_)
        return self._kept(id_, entry)

    def _kept(self, id_: str, entry: str | None) -> BlobInfo | None:
        if entry is None:
            return None
        size, _, until = entry.partition(":")
        if int(until) <= self._c.clock.now_ms():
            return None
        return BlobInfo(id=id_, size=int(size), keep_until_ms=int(until))

    async def find(self, session: str, key: str) -> BlobInfo | None:
        c = self._c
        await c.ready()
        async with c.guard("read"):
            id_ = await c.client.hget(self._keys(session)[2], key)
        return None if id_ is None else await self._info(session, str(id_))

    async def get(self, session: str, blob_id: str) -> bytes | None:
        c = self._c
        await c.ready()
        index, data, _ = self._keys(session)
        async with c.guard("read"):
            entry = await c.client.hget(index, blob_id)
            if self._kept(blob_id, entry) is None:
                return None
            encoded = await c.client.hget(data, blob_id)
        return None if encoded is None else base64.b64decode(encoded)


def _marks_key(core: _Core) -> str:
    return core.keys.key("marks", "marks")


class _RedisMarks:
    def __init__(self, core: _Core) -> None:
        self._c = core

    @property
    def _key(self) -> str:
        return _marks_key(self._c)

    async def get(self, name: str) -> str | None:
        c = self._c
        await c.ready()
        async with c.guard("read"):
            value = await c.client.hget(self._key, name)
        return None if value is None else str(value)

    async def put(self, name: str, value: str, *, expect: str | None) -> bool:
        args = [name, value, "" if expect is None else expect, "0" if expect is None else "1"]
        return bool(await self._c.eval("marks_put", [self._key], args))


def _thread(
    session: str, lane: str, thread: str, context: str | None, replied: str | None
) -> ThreadState:
    return ThreadState(
        session=session,
        lane=lane,
        thread=json.loads(thread),
        reply_context=json.loads(context) if context else {},
        replied_through=int(replied or 0),
    )


class _RedisAudit:
    def __init__(self, core: _Core, cap: int, session_cap: int) -> None:
        self._c = core
        self._cap = cap
        self._session_cap = session_cap

    async def record(self, event: NewAuditEvent) -> AuditEvent:
        c = self._c
        at = c.clock.now_ms()
        body = _json({**event.model_dump(mode="json"), "at_ms": at})
        keys = [c.keys.key("audit", "seq"), c.keys.key("audit", "log")]
        number = int(await c.eval("audit_record", keys, [self._cap, body]))
        event_id = f"{number:016d}"
        if event.session:
            await c.eval(
                "audit_index",
                [c.skey(event.session, "audit")],
                [number, f"{event_id}\t{body}", self._session_cap],
            )
        return _event(event_id, body)

    async def list(
        self,
        *,
        session: str | None = None,
        lane: str | None = None,
        after: str | None = None,
        limit: int = 100,
    ) -> tuple[AuditEvent, ...]:
        c = self._c
        if limit <= 0:
            return ()
        start = 0 if after is None else max(0, _first_number_after(after) - 1)
        await c.ready()
        found: list[AuditEvent] = []
        while len(found) < limit:
            async with c.guard("read"):
                if session is not None:
                    if not session:
                        return ()
                    members = await c.client.zrangebyscore(
                        c.skey(session, "audit"), f"({start}", "+inf", start=0, num=_BATCH
                    )
                    page = [tuple(str(m).split("\t", 1)) for m in members]
                else:
                    rows = await c.client.xrange(
                        c.keys.key("audit", "log"), f"({start}-0", "+", count=_BATCH
                    )
                    page = [(f"{_stream_id(sid)[0]:016d}", f["j"]) for sid, f in rows]
            for event_id, body in page:
                event = _event(event_id, body)
                if lane is None or event.lane == lane:
                    found.append(event)
                    if len(found) >= limit:
                        break
            if len(page) < _BATCH:
                break
            start = int(page[-1][0])
        return tuple(found)


def _event(event_id: str, body: str) -> AuditEvent:
    data = json.loads(body)
    return AuditEvent(id=event_id, **data)


class RedisBroker(BrokerParts):
    """Inbox, outbox, thread state and audit trail in Redis (7.0 or newer, or a Redis Cluster).

    Nothing is contacted until the first call. `clock` times items, claims and waits; `ids`
    mints ticket and lease tokens; a session ticket lasts `visibility_timeout_ms` unless
    renewed; an acked item's dedupe key expires `dedupe_ttl_ms` after its append (a pending or
    rejected item keeps it). Delivered and discarded deliveries are purged
    `settled_retention_ms` after settling, dead letters `dead_retention_ms` after (None keeps
    them; pending ones never go); the audit stream keeps about `audit_max_events`, each
    session's index the newest `audit_max_events_per_session`. `shards` spreads the shared
    queues over that many hash tags: every process sharing the data must use the same number.
    """

    _inbox: _RedisInbox
    _outbox: _RedisOutbox

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "gwb",
        clock: Clock | None = None,
        ids: IdGenerator | None = None,
        shards: int = 16,
        visibility_timeout_ms: int = 30_000,
        dedupe_ttl_ms: int = 86_400_000,
        settled_retention_ms: int | None = 86_400_000,
        dead_retention_ms: int | None = 14 * 86_400_000,
        audit_max_events: int = 1_000_000,
        audit_max_events_per_session: int = 10_000,
        cluster: bool | None = None,
        socket_timeout: float = 10.0,
        blob_limits: BlobLimits | None = None,
    ) -> None:
        for name, value in (
            ("shards", shards),
            ("visibility_timeout_ms", visibility_timeout_ms),
            ("dedupe_ttl_ms", dedupe_ttl_ms),
            ("audit_max_events", audit_max_events),
            ("audit_max_events_per_session", audit_max_events_per_session),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if socket_timeout <= 0:
            raise ValueError(f"socket_timeout must be positive, got {socket_timeout}")
        clock = clock or SystemClock()
        self._core = _Core(
            url,
            prefix=prefix,
            clock=clock,
            ids=ids or Uuid7Ids(clock),
            shards=shards,
            visibility_timeout_ms=visibility_timeout_ms,
            dedupe_ttl_ms=dedupe_ttl_ms,
            cluster=cluster,
            socket_timeout=socket_timeout,
        )
        self._inbox = _RedisInbox(self._core)
        self._outbox = _RedisOutbox(self._core, settled_retention_ms, dead_retention_ms)
        self._threads = _RedisThreads(self._core)
        self._audit = _RedisAudit(self._core, audit_max_events, audit_max_events_per_session)
        self._marks = _RedisMarks(self._core)
        self._blobs = _RedisBlobs(self._core, blob_limits or BlobLimits())

    @property
    def cluster(self) -> bool:
        """Whether this broker talks to a Redis Cluster."""
        return self._core.cluster

    async def sweep(self) -> int:
        """Signal every session whose ready signal may have been lost (see `_RedisInbox.sweep`)."""
        return await self._inbox.sweep()

    async def purge(self, *, now_ms: int) -> int:
        """Delete settled deliveries past their retention now (claims also do it lazily)."""
        return await self._outbox.purge(now_ms=now_ms)

    async def close(self) -> None:
        """Release connections (idempotent)."""
        await self._core.close()
