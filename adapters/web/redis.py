"""The web mailbox in Redis: shared by every `gateway serve` process, on one server or a cluster.

Keys (prefix P, default ``gww``), hash-tagged per thread so one thread lives in one cluster slot:

* ``P:{<space>:<thread>}:items`` - a stream, one entry per item, entry id ``<seq>-0``, field
  ``b`` the item as JSON (without its seq, which is the entry id).
* ``P:{<space>:<thread>}:keys`` - a hash: item identity -> seq, and ``#`` -> the last seq.
* ``P:{index:<space>}:threads`` - a sorted set: thread -> last update (ms), for listings;
  written before the item, so every thread with items is listed.

An append is one Lua script (on a server, move the thread up the index; look the identity up;
else take the next seq, ``XADD``, record the identity; a cluster's index is in another slot, so
there it is its own ``ZADD`` first), atomic on the server, run by sha (loaded again if the
server lost it). Clients, keys and scripts are made as the store's and the broker's are
(`harness_core.backends.redis`):
redis-py's automatic retries are off, so a write whose reply was lost raises
`MailboxUnavailable` with ``unknown_outcome`` (retrying it is safe: the identity makes the
second append a no-op). Waiters block in ``XREAD BLOCK`` on the thread's
stream, each on its own connection, so a client connected to one process sees at once what
another process delivered.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any, Protocol, cast

from redis.exceptions import RedisError

from adapters.web.mailbox import (
    MailboxError,
    MailboxUnavailable,
    NewWebItem,
    WebAppend,
    WebItem,
    WebItemKind,
    WebThread,
    check_name,
    item_key,
)
from harness_core.backends.redis import (
    KeySpace,
    Once,
    ScriptPipeline,
    Scripts,
    close_clients,
    connect,
    discover,
    split_cluster,
)

__all__ = ["RedisMailbox"]

_APPEND = """
if KEYS[3] then redis.call('ZADD', KEYS[3], 'GT', ARGV[4], ARGV[3]) end
local seq = redis.call('HGET', KEYS[2], ARGV[1])
if seq then
  local found = redis.call('XRANGE', KEYS[1], seq .. '-0', seq .. '-0')
  if #found == 0 then
    return redis.error_reply('GWW corrupt: ' .. ARGV[1] .. ' names a missing item ' .. seq)
  end
  return {0, tonumber(seq), found[1][2][2]}
end
seq = redis.call('HINCRBY', KEYS[2], '#', 1)
redis.call('XADD', KEYS[1], seq .. '-0', 'b', ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], seq)
return {1, seq, ARGV[2]}
"""

_MAX_BLOCK_S = 30.0
_CLOSE_WAIT_S = 10.0
"""How long `close` waits for the blocked reads it cancelled to end (their connections' own
cleanup), so a waiter is woken by the time `close` returns."""

Stream = list[tuple[str, dict[str, str]]]


class _Client(Protocol):
    """The calls this mailbox makes, typed for ``decode_responses`` (replies are strings)."""

    async def zadd(self, name: str, mapping: Mapping[str, float], gt: bool = False) -> int: ...
    async def zrevrange(
        self, name: str, start: int, end: int, withscores: bool = False
    ) -> list[tuple[str, float]]: ...
    async def hget(self, name: str, key: str) -> str | None: ...
    async def xrange(self, name: str, min: str, max: str, count: int | None = None) -> Stream: ...
    async def xread(
        self, streams: Mapping[str, str], count: int | None = None, block: int | None = None
    ) -> list[tuple[str, Stream]]: ...
    async def evalsha(self, sha: str, numkeys: int, *keys_and_args: str | int | bytes) -> Any: ...
    async def script_load(self, script: str) -> str: ...
    def pipeline(self, transaction: bool = True) -> ScriptPipeline: ...
    async def aclose(self) -> None: ...


def _item(entry_id: str, fields: dict[str, str]) -> WebItem:
    seq = int(entry_id.split("-", 1)[0])
    return WebItem.model_validate({**json.loads(fields["b"]), "seq": seq})


class RedisMailbox:
    """Threads in Redis (7.0 or newer); `cluster`: a Redis Cluster through one startup node.

    `cluster` None: the URL says (``redis+cluster://``). Every script and every command touches
    keys of one slot, so a cluster needs nothing else.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "gww",
        cluster: bool | None = None,
        socket_timeout: float = 10.0,
    ) -> None:
        try:
            self._keys = KeySpace(prefix)
            self.cluster = split_cluster(url)[1] if cluster is None else cluster
            self._client = cast(
                _Client, connect(url, cluster=self.cluster, socket_timeout=socket_timeout)
            )
            # waiters hold a connection each while blocked: their own pool, a longer read timeout
            self._blocking = cast(
                _Client,
                connect(
                    url,
                    cluster=self.cluster,
                    socket_timeout=socket_timeout,
                    read_timeout=_MAX_BLOCK_S + socket_timeout,
                ),
            )
        except ValueError as exc:
            raise MailboxError(str(exc)) from None
        self.url = url
        self.prefix = prefix
        self._scripts = Scripts({"append": _APPEND})
        self._set_up = Once(self._setup)
        self._closed = False
        self._reads: set[asyncio.Future[list[tuple[str, Stream]]]] = set()

    def thread_key(self, space: str, thread: str, name: str) -> str:
        """A key of a thread: ``<prefix>:{<space>:<thread>}:<name>``."""
        return self._keys.key(f"{space}:{thread}", name)

    def index_key(self, space: str) -> str:
        """The sorted set listing a space's threads."""
        return self._keys.key(f"index:{space}", "threads")

    async def _setup(self) -> None:
        """Before the first command: a cluster's topology, for both pools."""
        try:
            await discover(self._client)
            await discover(self._blocking)
        except RedisError as exc:
            raise MailboxUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc
        finally:
            if self._closed:  # closed while discovering: the nodes discovery connected to, too
                await close_clients(self._blocking, self._client)

    async def _ready(self) -> None:
        if self._closed:
            raise MailboxUnavailable("the web mailbox is closed")
        await self._set_up()

    async def append(self, space: str, thread: str, item: NewWebItem) -> WebAppend:
        """Append `item` unless the thread holds its identity (one script)."""
        check_name(space, "space")
        check_name(thread, "thread")
        await self._ready()
        keys = [self.thread_key(space, thread, "items"), self.thread_key(space, thread, "keys")]
        args: list[str | int] = [item.key, item.model_dump_json()]
        try:
            if self.cluster:  # the index is in another slot: its own call, first
                await self._client.zadd(self.index_key(space), {thread: item.at_ms}, gt=True)
            else:
                keys.append(self.index_key(space))
                args += [thread, item.at_ms]
            reply = await self._scripts.run(self._client, "append", keys, args)
        except RedisError as exc:
            raise MailboxUnavailable(
                f"redis: {type(exc).__name__}: {exc}", unknown_outcome=True
            ) from exc
        created, seq, body = cast(list[Any], reply)
        stored = WebItem.model_validate({**json.loads(body), "seq": int(seq)})
        return WebAppend(item=stored, created=bool(created))

    async def find(
        self, space: str, thread: str, kind: WebItemKind, identity: str
    ) -> WebItem | None:
        """The thread's item of that family and identity, if any."""
        await self._ready()
        try:
            seq = await self._client.hget(
                self.thread_key(space, thread, "keys"), item_key(kind, identity)
            )
            if seq is None:
                return None
            found = await self._client.xrange(
                self.thread_key(space, thread, "items"), f"{seq}-0", f"{seq}-0"
            )
        except RedisError as exc:
            raise MailboxUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc
        if not found:
            raise MailboxError(f"web mailbox: {identity!r} names a missing item {seq}")
        entry_id, fields = found[0]
        return _item(entry_id, fields)

    async def read(
        self, space: str, thread: str, *, after: int = 0, limit: int = 100
    ) -> tuple[WebItem, ...]:
        """The thread's items after `after`, oldest first."""
        await self._ready()
        if limit <= 0:
            return ()
        try:
            found = await self._client.xrange(
                self.thread_key(space, thread, "items"), f"({max(0, after)}-0", "+", count=limit
            )
        except RedisError as exc:
            raise MailboxUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc
        return tuple(_item(entry_id, fields) for entry_id, fields in found)

    async def wait(
        self, space: str, thread: str, *, after: int, timeout_s: float, limit: int = 100
    ) -> tuple[WebItem, ...]:
        """The items after `after`, blocking in ``XREAD`` up to `timeout_s` (at most 30 s)."""
        await self._ready()
        block_ms = round(min(max(0.0, timeout_s), _MAX_BLOCK_S) * 1000)
        if block_ms <= 0 or limit <= 0:
            return await self.read(space, thread, after=after, limit=limit)
        if self._closing():  # closed while this waiter discovered the cluster: it sent nothing
            return ()
        key = self.thread_key(space, thread, "items")
        # its own future, which `close` cancels: a client closed before the command reached the
        # server would connect again and block for the whole timeout
        read = asyncio.ensure_future(self._xread(key, after, limit, block_ms))
        self._reads.add(read)
        try:
            await asyncio.wait((read,))
        except asyncio.CancelledError:
            read.cancel()
            raise
        finally:
            self._reads.discard(read)
        if read.cancelled():
            return ()
        try:
            reply = read.result()
        except RedisError as exc:
            if self._closing():
                return ()
            raise MailboxUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc
        if not reply:
            return ()
        _, entries = reply[0]
        return tuple(_item(entry_id, fields) for entry_id, fields in entries)

    def _closing(self) -> bool:
        # a call, not the attribute: the type checker would take it as unchanged across awaits
        return self._closed

    async def _xread(
        self, key: str, after: int, limit: int, block_ms: int
    ) -> list[tuple[str, Stream]]:
        # the command is made inside the task: one cancelled before it ran leaves nothing unawaited
        return await self._blocking.xread({key: f"{max(0, after)}-0"}, count=limit, block=block_ms)

    async def threads(self, space: str, *, limit: int = 100) -> tuple[WebThread, ...]:
        """The space's threads, most recently updated first."""
        await self._ready()
        if limit <= 0:
            return ()
        try:
            rows = await self._client.zrevrange(
                self.index_key(space), 0, limit - 1, withscores=True
            )
        except RedisError as exc:
            raise MailboxUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc
        return tuple(
            WebThread(space=space, thread=thread, updated_at_ms=int(score))
            for thread, score in rows
        )

    async def close(self) -> None:
        """Close both connection pools (idempotent); blocked waiters return."""
        if self._closed:
            return
        self._closed = True
        reads = tuple(self._reads)
        for read in reads:
            read.cancel()
        await close_clients(self._blocking, self._client)
        if reads:  # woken when this returns: a cancelled XREAD's cleanup took seconds under load
            await asyncio.wait(reads, timeout=_CLOSE_WAIT_S)
