"""redis-py connections whose command sends are timed without a task per send (D272).

redis-py's asyncio connection bounds each send with ``asyncio.wait_for``, which on Python 3.11
wraps the send in a new task (a task, a future, a timer and their callbacks per command): a
seventh of the gateway's event-loop work on Redis went there. These connections bound the send
with ``asyncio.timeout`` instead, which times the same await in the caller's own task. What a
send does and how it fails is redis-py's: connect when not connected, the health check, the
write, the drain, and on a timeout or an OS error the connection is dropped and redis-py's
own ``TimeoutError`` or ``ConnectionError`` raised, so no caller sees a difference.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = [
    "LEAN_CONNECTIONS",
    "lean_connection_class",
]


class _TimedSend(AbstractConnection):
    """`send_packed_command` timed by ``asyncio.timeout`` rather than ``asyncio.wait_for``."""

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        reader = self._reader
        if reader is not None and self.is_connected and reader.at_eof():
            # the server closed this connection while it was idle (its `timeout`, CLIENT
            # KILL, a restart): nothing was sent, so a new one is safe. A single-connection
            # client (a store's writer) is never checked out of a pool, which would see it;
            # without this the next write failed and its session waited out a lease
            await self.disconnect(nowait=True)
        timeout = self.socket_timeout
        if not timeout:  # untimed: redis-py's own path has no wait_for either
            await super().send_packed_command(command, check_health)
            return
        if not self.is_connected:
            await self.connect_check_health(check_health=False)
        if check_health:
            await self.check_health()  # type: ignore[no-untyped-call]
        if isinstance(command, str):
            command = command.encode()
        parts = [command] if isinstance(command, bytes) else command
        try:
            async with asyncio.timeout(timeout):
                await self._send_packed_command(parts)
        except TimeoutError as exc:
            await self.disconnect(nowait=True)
            if exc.errno is not None:  # the OS's ETIMEDOUT: a dead connection, not a slow one
                raise RedisConnectionError(f"Error {exc.errno} while writing to socket.") from exc
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as exc:
            await self.disconnect(nowait=True)
            raise RedisConnectionError(f"Error while writing to socket: {exc}") from exc
        except BaseException:
            # a send cut short (a cancellation) leaves the stream mid-command: never reuse it
            await self.disconnect(nowait=True)
            raise


class LeanConnection(_TimedSend, Connection):
    """A TCP connection (``redis://``)."""


class LeanSSLConnection(_TimedSend, SSLConnection):
    """A TLS connection (``rediss://``)."""


class LeanUnixConnection(_TimedSend, UnixDomainSocketConnection):
    """A unix socket connection (``unix://``)."""


LEAN_CONNECTIONS: dict[str, type[AbstractConnection]] = {
    "redis": LeanConnection,
    "rediss": LeanSSLConnection,
    "unix": LeanUnixConnection,
}
"""The lean connection class for each URL scheme."""


def lean_connection_class(url: str) -> type[AbstractConnection]:
    """The lean connection class for a server's ``redis://``, ``rediss://`` or ``unix://`` URL."""
    return LEAN_CONNECTIONS[url.partition("://")[0]]
