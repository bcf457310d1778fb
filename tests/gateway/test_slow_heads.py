"""A request head that never ends holds no connection (`gateway.slow_heads`), over real sockets.

Half-sent heads were held for good: twenty thousand of them took every file descriptor of the
process, and `/healthz`, the channels and the operator page all failed, with nothing logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import pytest
from fastapi import FastAPI

from gateway import slow_heads
from gateway.slow_heads import HeadTimedProtocol
from tests.adapters.kit import serve

HEAD_S = 0.5


class _Quick(HeadTimedProtocol):
    head_timeout_s = HEAD_S


@contextlib.asynccontextmanager
async def _server() -> AsyncIterator[int]:
    app = FastAPI()

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    async with serve(app, http=_Quick) as server:
        yield server.port


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Whether the server closed the connection within `seconds` (nothing else came)."""
    try:
        async with asyncio.timeout(seconds):
            return await reader.read() == b""
    except TimeoutError:
        return False


GET = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@pytest.mark.parametrize(
    "sent", [b"", b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-a: "], ids=["nothing", "half"]
)
async def test_a_head_that_does_not_arrive_in_time_is_closed(
    sent: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    async with _server() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(sent)
        slow_heads._Tally.said_at = 0.0  # said at most once a minute: this one is said
        with caplog.at_level(logging.WARNING, logger="gateway.http"):
            assert await _closed_within(reader, HEAD_S + 3)
        writer.close()
        assert any("no request head in time" in r.getMessage() for r in caplog.records)


async def test_a_whole_request_and_a_kept_alive_connection_are_not_cut() -> None:
    async with _server() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(2):  # two requests on one connection, a pause between them
            writer.write(GET)
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            assert await reader.readexactly(length) == b'{"status":"ok"}'
            await asyncio.sleep(HEAD_S / 2)
        # the next request's head, begun and never ended, is timed too
        writer.write(b"GET /healthz HTTP/1.1\r\n")
        assert await _closed_within(reader, HEAD_S + 3)
        writer.close()
