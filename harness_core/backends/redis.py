"""The Redis family, written once: clients from a URL, the key rule, scripts run by sha.

The session store, the broker and the web mailbox each keep their own keys and scripts; how
they reach a server and run scripts on it is the same for all three (D191):

* `connect`: a client of a server or of a Redis Cluster (through one startup node) from a
  ``redis://``, ``rediss://`` (TLS) or ``unix://`` URL, ``+cluster`` after the scheme for a
  cluster; replies decoded (RESP2), redis-py's automatic retries off (a write whose reply was
  lost is never sent twice behind its caller's back).
* `KeySpace`: every key is ``<prefix>:{<tag>}:<name>``; one tag, one Cluster slot.
* `Scripts`: Lua scripts run by sha (``EVALSHA``), loaded again into a server that lost them
  (``NOSCRIPT``: a restart, a failover, ``SCRIPT FLUSH``): a call refused so did not run, and is
  sent again once.
* `Once` (setup before first use: a cluster's topology, the scripts) and `close_clients`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from importlib import resources
from typing import Any, Final, Protocol

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import (
    ConnectionError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
)

from harness_core.backends.redis_connection import lean_connection_class
from harness_core.backends.urls import without_password

__all__ = [
    "close_clients",
    "CLUSTER_MAX_CONNECTIONS",
    "connect",
    "discover",
    "KeySpace",
    "Once",
    "package_scripts",
    "ScriptCall",
    "ScriptClient",
    "ScriptPipeline",
    "Scripts",
    "server_config",
    "split_cluster",
]

CLUSTER_MAX_CONNECTIONS: Final = 10_000
"""Connections per cluster node: redis-py's cluster client raises past its pool size rather
than wait for a connection, and its default (100) is met under load."""

_PREFIX = re.compile(r"[^{}\s]+")  # matched whole: ``$`` would take a trailing newline

Arg = str | int | bytes
ScriptCall = tuple[str, Sequence[str], Sequence[Arg]]
"""One script call: the script's name, its keys, its arguments."""


class ScriptPipeline(Protocol):
    """The pipeline calls `Scripts` makes."""

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Arg) -> Any:
        """Queue a script call."""
        ...

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        """Send the queued calls; their replies (errors as replies unless `raise_on_error`)."""
        ...


class ScriptClient(Protocol):
    """The client calls `Scripts` makes (a server's client or a cluster's)."""

    async def evalsha(self, sha: str, numkeys: int, *keys_and_args: Arg) -> Any:
        """Run the script of that sha; ``NOSCRIPT`` if the server does not have it."""
        ...

    async def script_load(self, script: str) -> str:
        """Put a script into the server's cache (every primary's); its sha."""
        ...

    def pipeline(self, transaction: bool = True) -> ScriptPipeline:
        """A pipeline (a cluster client's refuses scripts)."""
        ...


class _Closable(Protocol):
    async def aclose(self) -> None: ...


def split_cluster(url: str) -> tuple[str, bool]:
    """`url` without the ``+cluster`` after its scheme, and whether it had one.

    Raises:
        ValueError: not a ``redis://``, ``rediss://`` or ``unix://`` URL (``+cluster`` or not).
    """
    scheme, separator, rest = url.partition("://")
    if not separator:
        raise ValueError(f"not a redis URL: {without_password(url)!r}")
    base, _, variant = scheme.partition("+")
    if variant not in ("", "cluster") or base not in ("redis", "rediss", "unix"):
        raise ValueError(f"unknown redis URL scheme {scheme!r}")
    return f"{base}://{rest}", variant == "cluster"


def connect(
    url: str,
    *,
    cluster: bool | None = None,
    socket_timeout: float = 10.0,
    read_timeout: float | None = None,
    single_connection: bool = False,
) -> aioredis.Redis | RedisCluster:
    """A client of the server at `url`, or of the cluster `url`'s node belongs to.

    `cluster` None: the URL's scheme says (``redis+cluster://``, ``rediss+cluster://``). Nothing
    is contacted here. Connecting waits up to `socket_timeout`, a reply up to `read_timeout`
    (default: `socket_timeout`; a blocking read needs longer). `single_connection` keeps one
    connection, so commands go out in the order they were sent (a server only). A cluster
    client holds up to `CLUSTER_MAX_CONNECTIONS` per node. A server's client sends without a
    task per command (`redis_connection`, D272).

    Raises:
        ValueError: not a redis URL (`split_cluster`), or one redis-py refuses.
    """
    target, variant = split_cluster(url)
    is_cluster = variant if cluster is None else cluster
    options: dict[str, Any] = {
        "decode_responses": True,
        "socket_timeout": socket_timeout if read_timeout is None else read_timeout,
        "socket_connect_timeout": socket_timeout,
        "retry": Retry(NoBackoff(), 0),
        "protocol": 2,
    }
    try:
        if is_cluster:
            return RedisCluster.from_url(target, max_connections=CLUSTER_MAX_CONNECTIONS, **options)
        if single_connection:
            options["single_connection_client"] = True
        options["connection_class"] = lean_connection_class(target)
        return aioredis.Redis.from_url(target, **options)
    except (ValueError, TypeError, RedisError) as exc:
        raise ValueError(f"redis URL {without_password(url)!r}: {type(exc).__name__}") from exc


async def server_config(url: str, *names: str) -> dict[str, str]:
    """The server's settings `names` (``maxmemory-policy``, ``appendonly``), those it gave.

    Managed services often refuse ``CONFIG``: those two are then read from ``INFO``. Empty
    when neither answers.
    """
    try:
        client = connect(url, socket_timeout=2.0)
    except ValueError:
        return {}
    found: dict[str, str] = {}
    try:
        await discover(client)
        for name in names:
            answer: Any
            try:
                answer = await client.config_get(name)
            except Exception:  # CONFIG renamed or forbidden: INFO may still say it
                answer = await _from_info(client, name)
            value = answer.get(name) if isinstance(answer, dict) else None
            if isinstance(value, str):
                found[name] = value
    except Exception:  # unreachable, INFO refused too: unknown
        return found
    finally:
        await close_clients(client)
    return found


_INFO = {
    "appendonly": ("persistence", "aof_enabled", {0: "no", 1: "yes"}),
    "maxmemory-policy": ("memory", "maxmemory_policy", None),
}
"""A setting's INFO section and field, and how its values read as CONFIG's."""


async def _from_info(client: Any, name: str) -> dict[str, str]:
    """`name` as ``INFO`` reports it (empty: it does not, or not as one server)."""
    if name not in _INFO:
        return {}
    section, field, values = _INFO[name]
    answer = await client.info(section)
    value = answer.get(field) if isinstance(answer, dict) else None
    if values is not None:
        value = values.get(value) if isinstance(value, int) else None
    return {name: value} if isinstance(value, str) else {}


async def discover(client: object) -> None:
    """Learn a cluster's topology now (a server's client: nothing to do).

    redis-py's cluster client fails commands that race its first discovery: a backend runs
    this once before its first command (`Once`).

    Raises:
        ConnectionError: no startup node answered. redis-py raises its own
            `RedisClusterException` there, which is no `RedisError`: every backend's handler
            missed it, and an unreachable cluster read "unexpected error" at the command line.
    """
    if isinstance(client, RedisCluster):
        try:
            await client.initialize()
        except RedisClusterException as exc:
            raise ConnectionError(str(exc)) from exc


async def close_clients(*clients: _Closable) -> None:
    """Close each client once (the same one given twice is closed once).

    A server already gone is nothing to report: its connections are closed all the same.
    """
    closed: list[_Closable] = []
    for client in clients:
        if any(client is done for done in closed):
            continue
        closed.append(client)
        with contextlib.suppress(RedisError):
            await client.aclose()


class KeySpace:
    """The keys of one backend: ``<prefix>:{<tag>}:<name>`` (what a thing's data is keyed by).

    Redis Cluster places a key by its hash tag (the text between the first ``{`` and the next
    ``}``): the keys of one tag live in one slot, so one script may touch them all, on a server
    or a cluster alike. A tag holds no ``}`` (the caller's names guarantee it). The prefix
    holds no braces (it would become the tag) and no white space; each backend sharing a
    server has its own (the store ``gw``, the broker ``gwb``, the mailbox ``gww`` by default).

    Raises:
        ValueError: the prefix is empty or holds braces or white space.
    """

    def __init__(self, prefix: str) -> None:
        if not _PREFIX.fullmatch(prefix):
            raise ValueError(f"invalid redis key prefix {prefix!r} (no braces or spaces)")
        self.prefix = prefix

    def key(self, tag: str, name: str) -> str:
        """``<prefix>:{<tag>}:<name>``."""
        return f"{self.prefix}:{{{tag}}}:{name}"

    def untagged(self, name: str) -> str:
        """``<prefix>:<name>``: a key of its own slot (never touched by a script with others)."""
        return f"{self.prefix}:{name}"


def package_scripts(
    package: str, names: Iterable[str], *, prelude: str | None = "prelude.lua"
) -> dict[str, str]:
    """Script name -> source: ``<package>/lua/<name>.lua``, each after the folder's `prelude`."""
    folder = resources.files(package).joinpath("lua")
    first = folder.joinpath(prelude).read_text() if prelude is not None else ""
    return {name: first + folder.joinpath(f"{name}.lua").read_text() for name in names}


class Scripts:
    """Lua scripts run by sha, loaded into a server's script cache when it lacks them.

    A server's cache is empty after a restart, a failover or ``SCRIPT FLUSH``; a call it
    answers ``NOSCRIPT`` did not run, so loading the scripts and sending that call again runs
    it exactly once. On a cluster client a load reaches every primary.
    """

    def __init__(self, sources: Mapping[str, str]) -> None:
        self.sources = dict(sources)
        self.shas = {
            name: hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()
            for name, source in self.sources.items()
        }
        """Script name -> sha1 of its source (what the server names it by)."""

    async def load(self, client: ScriptClient) -> None:
        """Load every script into `client`'s server (each primary of a cluster)."""
        for name, source in self.sources.items():
            self.shas[name] = await client.script_load(source)

    async def run(
        self, client: ScriptClient, name: str, keys: Sequence[str], args: Sequence[Arg]
    ) -> Any:
        """Run script `name`; on ``NOSCRIPT`` (it did not run) load the scripts, run it again.

        Raises:
            RedisError: what the server or the connection raised (a ``ResponseError`` for an
                error the script returned).
        """
        try:
            return await client.evalsha(self.shas[name], len(keys), *keys, *args)
        except NoScriptError:
            await self.load(client)
            return await client.evalsha(self.shas[name], len(keys), *keys, *args)

    async def run_all(
        self,
        client: ScriptClient,
        calls: Sequence[ScriptCall],
        *,
        cluster: bool,
        concurrency: int | None = None,
    ) -> list[Any]:
        """Run many script calls; their replies in order, an error the server answered as a reply.

        A call answered ``NOSCRIPT`` (it did not run) is sent again, once, after a load. On a
        server the calls go in one pipeline (a lone call alone): one round trip, and a lost
        connection raises for all (their outcomes unknown). On a cluster, whose pipeline
        refuses scripts, each call goes on its own, `concurrency` at a time (None: all at
        once), and one that could not be sent has its `RedisError` as its reply.

        Raises:
            RedisError: on a server, the connection failed (nothing says which calls ran).
        """
        replies = await self._send(client, calls, cluster, concurrency)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            await self.load(client)
            again = await self._send(client, [calls[i] for i in missing], cluster, concurrency)
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        return replies

    async def _send(
        self,
        client: ScriptClient,
        calls: Sequence[ScriptCall],
        cluster: bool,
        concurrency: int | None,
    ) -> list[Any]:
        if cluster:

            async def one(call: ScriptCall) -> Any:
                name, keys, args = call
                try:
                    return await client.evalsha(self.shas[name], len(keys), *keys, *args)
                except RedisError as exc:
                    return exc

            step = concurrency or max(1, len(calls))
            replies: list[Any] = []
            for start in range(0, len(calls), step):
                replies += await asyncio.gather(*(one(c) for c in calls[start : start + step]))
            return replies
        if len(calls) == 1:  # one call skips the pipeline machinery
            name, keys, args = calls[0]
            try:
                return [await client.evalsha(self.shas[name], len(keys), *keys, *args)]
            except ResponseError as exc:
                return [exc]
        pipe = client.pipeline(transaction=False)
        for name, keys, args in calls:
            pipe.evalsha(self.shas[name], len(keys), *keys, *args)
        return await pipe.execute(raise_on_error=False)


class Once:
    """Setup a backend runs before its first command, by its first caller while others wait.

    What it does: discover a cluster's topology (`discover`), load scripts, create consumer
    groups. A setup that raised is tried again by the next caller; `forget` makes the next
    caller run it again (the data it made was deleted).
    """

    def __init__(self, setup: Callable[[], Awaitable[None]]) -> None:
        self._setup = setup
        self._done = False
        self._lock = asyncio.Lock()

    async def __call__(self) -> None:
        """Run the setup unless it ran (waiting for a caller that runs it now)."""
        if self._done:
            return
        async with self._lock:
            if not self._done:
                await self._setup()
                self._done = True

    def forget(self) -> None:
        """Run the setup again before the next command."""
        self._done = False
