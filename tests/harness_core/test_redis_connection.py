"""A server client's sends run in the caller's task, and still time out and fail as redis-py's do
(D272): against a real redis-server, and a peer that stops reading."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import Connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from harness_core.backends.redis import close_clients, connect
from harness_core.backends.redis_connection import (
    LeanConnection,
    LeanSSLConnection,
    LeanUnixConnection,
    lean_connection_class,
)
from tests.support.redis_server import RedisServer


@contextlib.contextmanager
def counting_tasks() -> Iterator[list[int]]:
    """Count the tasks the running loop creates inside the block."""
    loop = asyncio.get_running_loop()
    before = loop.get_task_factory()
    made = [0]

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        made[0] += 1
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)
    try:
        yield made
    finally:
        loop.set_task_factory(before)


def test_each_scheme_has_its_lean_connection() -> None:
    assert lean_connection_class("redis://h:1/0") is LeanConnection
    assert lean_connection_class("rediss://h:1/0") is LeanSSLConnection
    assert lean_connection_class("unix:///tmp/r.sock") is LeanUnixConnection


async def test_commands_of_a_server_client_make_no_task(redis_server: RedisServer) -> None:
    client = connect(redis_server.url)
    assert isinstance(client, Redis)
    assert client.connection_pool.connection_class is LeanConnection
    plain = Redis(port=redis_server.port, socket_timeout=10)  # redis-py's own, for contrast
    try:
        await client.set("lean:key", "v")
        await plain.get("lean:key")
        with counting_tasks() as lean:
            for _ in range(50):
                assert await client.get("lean:key") == "v"
        with counting_tasks() as stock:
            for _ in range(50):
                assert await plain.get("lean:key") == b"v"
        assert lean[0] == 0
        assert stock[0] >= 50  # one wait_for task per send: what D272 removes
    finally:
        await close_clients(client, plain)


async def test_a_single_connection_client_sends_without_a_task(redis_server: RedisServer) -> None:
    client = connect(redis_server.url, single_connection=True)
    try:
        await client.ping()
        with counting_tasks() as made:
            for n in range(20):
                await client.set(f"lean:one:{n}", n)
        assert made[0] == 0
        assert await client.get("lean:one:19") == "19"
    finally:
        await close_clients(client)


async def test_a_connection_the_server_closed_while_idle_is_opened_again(
    redis_server: RedisServer,
) -> None:
    """A store's writer holds one connection; Redis closing it while idle (its `timeout`, a
    CLIENT KILL) failed the next write, and its session waited out a whole lease."""
    client = connect(redis_server.url, single_connection=True)
    admin = connect(redis_server.url)
    try:
        await client.client_setname("the-writer")
        await client.set("idle:k", "1")
        listed = await admin.client_list()
        [writer] = [c for c in listed if c["name"] == "the-writer"]
        assert await admin.client_kill_filter(_id=writer["id"]) == 1
        await asyncio.sleep(0.2)  # the close reaches the client's socket
        await client.set("idle:k", "2")  # on a new connection: nothing failed
        assert await admin.get("idle:k") == "2"
    finally:
        await close_clients(client, admin)


@contextlib.asynccontextmanager
async def stops_reading(after: bytes) -> AsyncIterator[int]:
    """A peer that answers ``+OK`` to every command until it sees `after`, then reads nothing."""

    held: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        seen = b""
        while after not in seen:
            chunk = await reader.read(65536)
            if not chunk:
                return
            seen = seen[-len(after) :] + chunk
            if after not in seen:
                writer.write(b"+OK\r\n" * chunk.count(b"*"))
                await writer.drain()
        await asyncio.Event().wait()  # never read again: the client's socket buffer fills

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        for writer in held:
            writer.close()
        server.close()
        await asyncio.sleep(0.2)  # the client's closing transport sees the close and lets go
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 1)


async def test_a_send_that_cannot_finish_times_out_and_drops_the_connection() -> None:
    async with stops_reading(b"STUCK") as port:
        client = connect(f"redis://127.0.0.1:{port}/0", socket_timeout=0.5)
        assert isinstance(client, Redis)
        try:
            connection = await client.connection_pool.get_connection()  # type: ignore[no-untyped-call]
            assert isinstance(connection, LeanConnection)
            await connection.send_command("SET", "STUCK", "x")
            started = asyncio.get_running_loop().time()

            async def flood() -> None:
                for _ in range(200):  # 8 MiB each: the buffers fill within a few sends
                    await connection.send_command("SET", "more", "x" * (8 << 20))

            with pytest.raises(RedisTimeoutError, match="Timeout writing to socket"):
                await flood()
            assert asyncio.get_running_loop().time() - started < 5
            assert not connection.is_connected
        finally:
            await close_clients(client)


async def test_a_send_to_a_closed_server_fails_as_a_connection_error(
    redis_server: RedisServer,
) -> None:
    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = connect(f"redis://127.0.0.1:{port}/0", socket_timeout=1)
    try:

        async def keep_setting() -> None:
            for _ in range(20):  # the first write may land before the close is seen
                await client.set("k", "v")
                await asyncio.sleep(0.05)

        with pytest.raises(RedisConnectionError):
            await keep_setting()
    finally:
        await close_clients(client)
        server.close()


async def test_a_cancelled_send_leaves_no_half_command_on_a_reused_connection(
    redis_server: RedisServer,
) -> None:
    client = connect(redis_server.url)
    assert isinstance(client, Redis)
    try:
        connection = await client.connection_pool.get_connection()  # type: ignore[no-untyped-call]
        send = asyncio.ensure_future(connection.send_command("SET", "lean:cut", "x" * (32 << 20)))
        await asyncio.sleep(0)
        send.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await send
        assert send.cancelled()  # cut mid-write (32 MiB outruns the socket's buffers)
        assert not connection.is_connected  # dropped: the half command is never followed
        await client.connection_pool.release(connection)
        assert await client.ping()
    finally:
        await close_clients(client)
        await asyncio.sleep(0.2)  # the dropped transport flushes what it holds and closes


def test_the_stock_class_is_what_the_lean_one_extends() -> None:
    assert issubclass(LeanConnection, Connection)
