"""An HTTP MCP server's bodies as the gateway hands them to the SDK: bounded, long ones rewritten.

The wire forms are the Streamable HTTP transport's: a JSON body, or an event stream whose events
carry a JSON-RPC message in their ``data`` (``tests/gateway/mcp/test_http.py`` runs the SDK's
own server in each form). Here the byte-level cases: lines cut between chunks, CRLF cut in two,
comments and ids kept, an event past the bound, a gzip bomb.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncGenerator

import httpx2
import pytest

from gateway.mcp.http_bodies import BoundedBodies
from gateway.mcp.stdio import MAX_BLOCKS, TOO_LARGE_CODE

LIMIT = 4 * 1024 * 1024


def _answer(ident: int, blocks: list[dict[str, str]]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": ident, "result": {"content": blocks}}).encode()


async def _through(
    body: bytes, kind: str, *, chunk: int = 65536, coding: str | None = None, limit: int = LIMIT
) -> bytes:
    """`body` answered to a ``tools/call`` with id 5, in chunks of `chunk`, as handed on."""

    async def chunks() -> AsyncGenerator[bytes, None]:
        for at in range(0, len(body), chunk):
            yield body[at : at + chunk]

    class Inner(httpx2.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            headers = {"content-type": kind, "content-length": str(len(body))}
            if coding is not None:
                headers["content-encoding"] = coding
            return httpx2.Response(200, headers=headers, stream=_Stream(chunks()))

    request = httpx2.Request(
        "POST", "http://mcp.test/mcp", json={"jsonrpc": "2.0", "id": 5, "method": "tools/call"}
    )
    response = await BoundedBodies(Inner(), max_bytes=limit).handle_async_request(request)
    if kind != "text/html":
        assert "content-length" not in response.headers  # the body may be rewritten
    return b"".join([part async for part in response.stream])  # type: ignore[union-attr]


class _Stream(httpx2.AsyncByteStream):
    def __init__(self, chunks: AsyncGenerator[bytes, None]) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> AsyncGenerator[bytes, None]:
        async for chunk in self._chunks:
            yield chunk


def _events(wire: bytes) -> list[list[bytes]]:
    return [event.split(b"\n") for event in wire.strip(b"\n").split(b"\n\n")]


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"])
@pytest.mark.parametrize("chunk", [1, 2, 7, 65536])
async def test_small_events_pass_as_they_came_whatever_their_line_ends(
    ending: bytes, chunk: int
) -> None:
    small = _answer(5, [{"type": "text", "text": "caf\u00e9"}])
    wire = ending.join(
        [b": a comment", b"event: message", b"id: 7", b"data: " + small, b"", b"data:{}", b"", b""]
    )
    assert _events(await _through(wire, "text/event-stream", chunk=chunk)) == [
        [b": a comment", b"event: message", b"id: 7", b"data: " + small],
        [b"data:{}"],
    ]


@pytest.mark.parametrize("chunk", [4096, 65536])
async def test_a_long_event_is_rewritten_with_its_blocks_joined_and_its_id_kept(
    chunk: int,
) -> None:
    many = _answer(5, [{"type": "text", "text": "c"}] * 100_000)  # 2.7 MB: past a MiB
    wire = b"id: 9\r\ndata: " + many + b"\r\n\r\n"
    [[ident, data]] = _events(await _through(wire, "text/event-stream", chunk=chunk))
    assert ident == b"id: 9"
    assert json.loads(data.removeprefix(b"data: "))["result"]["content"] == [
        {"type": "text", "text": "\n".join("c" * 100_000)}
    ]


async def test_an_event_past_the_bound_answers_its_request_and_the_next_is_read() -> None:
    huge = _answer(5, [{"type": "text", "text": "z" * (LIMIT + 10)}])
    wire = b"event: message\ndata: " + huge + b"\n\ndata: " + _answer(6, []) + b"\n\n"
    [[kind, refused], [after]] = _events(await _through(wire, "text/event-stream"))
    assert kind == b"event: message"
    error = json.loads(refused.removeprefix(b"data: "))
    assert error["id"] == 5 and error["error"]["code"] == TOO_LARGE_CODE
    assert error["error"]["message"].startswith("its answer (4.0 MiB) is larger than the 4 MiB")
    assert json.loads(after.removeprefix(b"data: "))["id"] == 6


async def test_a_json_body_past_a_mib_is_bounded_and_a_small_one_passes_untouched() -> None:
    many = [{"type": "image", "data": "aGk=", "mimeType": "image/png"}] * (MAX_BLOCKS + 40_000)
    rewritten = json.loads(await _through(_answer(5, many), "application/json"))
    content = rewritten["result"]["content"]
    assert len(content) == MAX_BLOCKS and "40,001 more content blocks" in content[-1]["text"]
    small = _answer(5, [{"type": "text", "text": "ok"}])
    assert await _through(small, "application/json", chunk=3) == small


async def test_a_gzip_bomb_is_inflated_only_to_the_bound() -> None:
    """64 MiB of zeros gzip to 64 KiB; the SDK's client inflated all of it."""
    bomb = gzip.compress(b'{"jsonrpc": "2.0", "id": 5, "result": {"x": "' + b"0" * (64 << 20))
    assert len(bomb) < 100_000
    refused = json.loads(await _through(bomb, "application/json", coding="gzip"))
    assert refused["id"] == 5 and refused["error"]["code"] == TOO_LARGE_CODE
    assert refused["error"]["message"].startswith("its answer is larger than the 4 MiB")
    small = _answer(5, [{"type": "text", "text": "ok"}])
    assert await _through(gzip.compress(small), "application/json", coding="gzip") == small


async def test_a_body_of_another_kind_is_left_to_the_sdk() -> None:
    assert await _through(b"<html>no</html>", "text/html") == b"<html>no</html>"
