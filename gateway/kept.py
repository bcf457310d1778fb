"""Whether a Redis still holds the gateway's data: a mark each process looks for every 10 s.

A Redis restarted with nothing on disk, flushed (``FLUSHALL``), or failed over to an empty
replica answers again as if nothing had happened: the messages it had accepted, the sessions
and the replies are gone, and the gateway went on without a word (an outside probe). Each
Redis the gateway keeps its state in holds the mark ``<prefix>:gateway:kept`` (a random token,
written once with ``SET NX``); a process remembers the token it saw, and a later look that finds
none (it writes a new one) or another (a process that looked first wrote it) means the data was
lost since: said as an error, once per loss and process (D348).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from gateway.logs import event
from harness_core.backends.redis import close_clients, connect, discover
from harness_core.backends.urls import REDIS_SCHEMES, RedisUrl, RedisUrls, without_password

__all__ = ["EVERY_S", "KeptWatch", "MARK", "READY", "first_words"]

MARK = "gateway:kept"
"""The mark's name under each Redis's key prefix."""
READY = "gateway:ready"
"""The key `writable` writes, by a script, under each Redis's key prefix."""
_WRITE = "return redis.call('SET', KEYS[1], ARGV[1], 'PX', 60000)"
"""A write as the gateway's own are made (a script): refused without EVAL, or when full."""

EVERY_S = 10.0
"""How often a process looks for the mark."""

log = logging.getLogger("gateway.kept")


@dataclass
class _Redis:
    """One Redis to watch: where, the mark's key, the token last seen there."""

    url: RedisUrl
    key: str
    shown: str
    client: Any = None
    seen: str | None = None


class KeptWatch:
    """Looks for the mark in each Redis the gateway keeps state in (store, broker)."""

    def __init__(self, redises: Sequence[RedisUrl], rng: random.Random) -> None:
        """`redises`: the Redis URLs of the store and the broker.

        One mark per server (under the first URL's prefix): the store and the broker on one
        Redis lose their data together, and are said once.
        """
        first: dict[tuple[str, bool], RedisUrl] = {}
        for url in redises:
            first.setdefault((url.server, url.cluster), url)
        self._redises = [
            _Redis(url, f"{url.prefix}:{MARK}", without_password(url.server))
            for url in first.values()
        ]
        self._rng = rng

    @classmethod
    def of(cls, urls: Sequence[tuple[str, str]], rng: random.Random) -> KeptWatch | None:
        """The watch of the Redis among `urls`, (URL, default key prefix) pairs; None if none."""
        redises = [
            RedisUrls(default_prefix=prefix).parse(url, _refused)
            for url, prefix in urls
            if url.partition("://")[0] in REDIS_SCHEMES
        ]
        return cls(redises, rng) if redises else None

    async def check(self) -> list[str]:
        """Look once in every Redis; the ones (as shown) found to have lost the data since.

        The first look only learns the token (a Redis that lost its data before this process
        started is not told apart from a new one). A Redis that does not answer is skipped:
        the outage is said elsewhere (`gateway.outage`), and the next look after it tells.
        """
        lost = []
        for redis in self._redises:
            try:
                token = await self._look(redis)
            except Exception as exc:  # unreachable: said by the outage, looked at again later
                log.debug(event("redis mark unread", url=redis.shown, error=type(exc).__name__))
                continue
            if redis.seen is not None and token != redis.seen:
                lost.append(redis.shown)
                log.error(
                    event(
                        "redis lost the gateway's data",
                        url=redis.shown,
                        why="the mark written at the first start is gone: Redis restarted "
                        "with nothing on disk, was flushed, or failed over to an empty replica",
                        lost="messages accepted and not yet answered, sessions' history, "
                        "replies not yet sent",
                        fix="keep Redis with appendonly yes and noeviction; threads go on "
                        "from what is left",
                    )
                )
            redis.seen = token
        return lost

    async def _look(self, redis: _Redis) -> str:
        client = await _client(redis)
        token = f"{self._rng.getrandbits(64):016x}"
        # one command: the token there, or (none was) the one written now
        found = await client.set(redis.key, token, nx=True, get=True)
        return token if found is None else str(found)

    async def writable(self) -> Exception | None:
        """Write once, by a script, in every Redis: None, or why one refused it.

        The gateway writes by scripts: a Redis user without EVAL, or a Redis full under
        ``noeviction``, answered every read while no message could be taken, and ``/readyz``
        said ok (an outside probe).
        """
        for redis in self._redises:
            try:
                client = await _client(redis)
                ready = f"{redis.url.prefix}:{READY}"
                await client.eval(_WRITE, 1, ready, str(self._rng.getrandbits(32)))
            except Exception as exc:
                return exc
        return None

    async def run(self, every_s: float = EVERY_S) -> None:
        """Look every `every_s` until cancelled (after a first `check`)."""
        while True:
            await asyncio.sleep(every_s)
            await self.check()

    async def close(self) -> None:
        """Close the connections."""
        await close_clients(*(r.client for r in self._redises if r.client is not None))


async def _client(redis: _Redis) -> Any:
    """`redis`'s client, connected at its first use."""
    if redis.client is None:
        redis.client = connect(redis.url.server, cluster=redis.url.cluster, socket_timeout=5.0)
        await discover(redis.client)
    return redis.client


def _refused(url: str, why: str | None) -> Exception:
    return ValueError(f"{without_password(url)}: {why}")


async def first_words(url: str, within_s: float = 0.5) -> str | None:
    """What a Redis at `url` says to a client that has sent nothing: an error line, or None.

    A Redis in protected mode (no password, reached from another host), or one at its
    ``maxclients``, writes one error line on accept and closes. A client that sent its first
    command meanwhile is reset by the close, and the line is lost: the gateway said only
    "Connection lost". Read without writing, it is kept. TLS servers are not asked (None).
    """
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "redis+cluster") or not parts.hostname:
        return None
    try:
        port = parts.port or 6379
    except ValueError:
        return None
    writer = None
    try:
        async with asyncio.timeout(within_s):
            reader, writer = await asyncio.open_connection(parts.hostname, port)
            said = await reader.readline()
    except (OSError, TimeoutError, ValueError):
        return None
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
    if not said.startswith(b"-"):
        return None
    return " ".join(said[1:].decode("utf-8", "replace").split())[:300] or None
