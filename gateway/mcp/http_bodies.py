"""An HTTP MCP server's answers read as a stdio line is: bounded, and large ones parsed aside.

The SDK reads an answer's body whole (a JSON response, or each event of an event stream) and
parses it on the event loop: 450,000 one-letter content blocks held every thread of the
gateway about 2 s there, a body without end grew without bound, and a gzip body was inflated
whole. This transport hands the SDK each body, and each event's data, as the stdio reader
(`gateway.mcp.stdio`) hands it a line: inflated and read to at most `MAX_MESSAGE_BYTES` (past
that, the request it answers is told its answer was too large, and the rest is not read); one
of more than a MiB parsed in a thread with its content blocks bounded (`MAX_BLOCKS`), then
written again for the SDK to read small. What is smaller passes as it came.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import anyio.to_thread
import httpx2
from mcp.shared.message import SessionMessage

from adapters import whole_number
from gateway.mcp.stdio import (
    MAX_MESSAGE_BYTES,
    THREAD_BYTES,
    answered_id,
    read_message,
    too_large_answer,
)

__all__ = ["BoundedBodies"]

_INFLATE_CHUNK = 1024 * 1024
"""The most bytes one step of inflating a compressed body gives (a bomb is read in steps)."""
_HEAD_BYTES = 4096
_LINE_END = re.compile(rb"\r\n|\r|\n")


class BoundedBodies(httpx2.AsyncBaseTransport):
    """Wraps a transport: JSON and event-stream answers bounded, large ones parsed aside."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, max_bytes: int = MAX_MESSAGE_BYTES):
        self._inner = inner
        self._max = max_bytes

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        """The inner transport's response, its JSON or event-stream body read as above."""
        response = await self._inner.handle_async_request(request)
        kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        coding = response.headers.get("content-encoding", "identity").strip().lower()
        if kind not in ("application/json", "text/event-stream"):
            return response
        if coding not in ("identity", "gzip", "deflate"):  # not asked for: left to the SDK
            return response
        chunks = _inflated(response.stream, coding)
        ident = _request_id(request)
        body: httpx2.AsyncByteStream
        if kind == "application/json":
            declared = response.headers.get("content-length", "")
            length = whole_number(declared, 2**63) if coding == "identity" else None
            body = _JsonBody(chunks, response.stream, ident, self._max, length)
        else:
            body = _EventsBody(chunks, response.stream, ident, self._max)
        headers = [
            (name, value)
            for name, value in response.headers.raw
            if name.lower() not in (b"content-length", b"content-encoding")
        ]
        return httpx2.Response(
            response.status_code,
            headers=headers,
            stream=body,
            request=request,
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        """Close the inner transport."""
        await self._inner.aclose()


def _request_id(request: httpx2.Request) -> int | str | None:
    """The JSON-RPC id of the request (None: a notification, a GET, a batch)."""
    try:
        ident = json.loads(request.content).get("id")
    except (ValueError, AttributeError, httpx2.RequestNotRead):
        return None
    return ident if isinstance(ident, int | str) and not isinstance(ident, bool) else None


async def _inflated(stream: Any, coding: str) -> AsyncGenerator[bytes, None]:
    """The body's bytes as sent (gzip and deflate inflated in bounded steps)."""
    if coding == "identity":
        async for chunk in stream:
            yield chunk
        return
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS if coding == "gzip" else zlib.MAX_WBITS)
    begun = False  # a deflate body that fails at once may be raw deflate, as some servers send
    async for chunk in stream:
        data = chunk
        while data:
            try:
                out = inflate.decompress(data, _INFLATE_CHUNK)
            except zlib.error:
                if coding == "deflate" and not begun:
                    inflate, begun = zlib.decompressobj(-zlib.MAX_WBITS), True
                    continue
                raise httpx2.DecodingError("the body's deflate or gzip data is corrupt") from None
            begun = True
            if out:
                yield out
            data = inflate.unconsumed_tail
    if rest := inflate.flush():
        yield rest


def _written(message: SessionMessage) -> bytes:
    return message.message.model_dump_json(by_alias=True, exclude_unset=True).encode()


def _read_aside(text: str) -> bytes | None:
    """A long message parsed and bounded (in a thread), then written again; None: unreadable."""
    found = read_message(text)
    return _written(found) if isinstance(found, SessionMessage) else None


def _refusal(head: bytes, length: int | None, limit: int, ident: int | str | None) -> bytes | None:
    """The error answer for a body past `limit` (None: it names no request to tell)."""
    text = head.decode("utf-8", "replace")
    if answered_id(text) is None and ident is not None:
        text = json.dumps({"jsonrpc": "2.0", "id": ident, "result": {}})
    found = too_large_answer(text, length, limit)
    return _written(found) if isinstance(found, SessionMessage) else None


class _Body(httpx2.AsyncByteStream):
    """A body read from `chunks` (the inner stream's, inflated) for the request `ident`."""

    def __init__(
        self, chunks: AsyncGenerator[bytes, None], inner: Any, ident: int | str | None, limit: int
    ) -> None:
        self._chunks, self._inner, self._ident, self._limit = chunks, inner, ident, limit

    async def aclose(self) -> None:
        close = getattr(self._inner, "aclose", None)
        if close is not None:
            await close()


class _JsonBody(_Body):
    """A JSON answer: read to the bound, handed on as it came, parsed aside, or refused.

    `length`: the body's declared length (None: not declared, or compressed), said in a refusal.
    """

    def __init__(
        self,
        chunks: AsyncGenerator[bytes, None],
        inner: Any,
        ident: int | str | None,
        limit: int,
        length: int | None,
    ) -> None:
        super().__init__(chunks, inner, ident, limit)
        self._length = length

    async def __aiter__(self) -> AsyncIterator[bytes]:
        kept = bytearray()
        length = 0
        async for chunk in self._chunks:
            length += len(chunk)
            if length > self._limit:
                if len(kept) < _HEAD_BYTES:
                    kept.extend(chunk[: _HEAD_BYTES - len(kept)])
                break  # the rest is not read
            kept.extend(chunk)
        if length > self._limit:
            await self._chunks.aclose()
            await self.aclose()
            head = bytes(kept[:_HEAD_BYTES])
            refused = _refusal(head, self._length, self._limit, self._ident)
            yield refused if refused is not None else b""
            return
        if len(kept) > THREAD_BYTES:
            text = kept.decode("utf-8", "replace")
            rewritten = await anyio.to_thread.run_sync(_read_aside, text)
            if rewritten is not None:
                yield rewritten
                return
        yield bytes(kept)


class _EventsBody(_Body):
    """An event stream: each event's data bounded and, when long, parsed aside.

    Lines end in CR, LF or CRLF (one cut between two chunks included); an event ends at a
    blank line. An event is kept to the bound; past it, it is refused as a JSON body is.
    """

    def __init__(
        self, chunks: AsyncGenerator[bytes, None], inner: Any, ident: int | str | None, limit: int
    ) -> None:
        super().__init__(chunks, inner, ident, limit)
        self._line = bytearray()  # the current line's bytes (while the event is within bound)
        self._length = 0  # the current line's length, kept or not
        self._cr = False  # the last chunk ended in CR: an LF first in the next ends nothing
        self._lines: list[bytes] = []  # the event's lines so far
        self._size = 0  # and their bytes
        self._over = 0  # the event's bytes once past the bound (0: within it)
        self._head = b""  # the start of its data then

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._chunks:
            for event in self._feed(chunk):
                yield await self._handed(event)
        if self._length:
            self._line_ended()
        if self._lines or self._over:  # the stream ended mid-event: what came is handed on
            yield await self._handed(self._event())

    def _feed(self, chunk: bytes) -> list[_Event]:
        events: list[_Event] = []
        at = 1 if self._cr and chunk.startswith(b"\n") else 0
        self._cr = False
        while (end := _LINE_END.search(chunk, at)) is not None:
            self._take(chunk[at : end.start()])
            self._cr = end.group() == b"\r" and end.end() == len(chunk)
            at = end.end()
            if self._length:
                self._line_ended()
            elif self._lines or self._over:  # a blank line ends the event
                events.append(self._event())
        self._take(chunk[at:])
        return events

    def _take(self, piece: bytes) -> None:
        self._length += len(piece)
        if self._over:
            self._over += len(piece)
        elif self._size + len(self._line) + len(piece) > self._limit:
            self._over = self._size + len(self._line) + len(piece)
            current = bytes(self._line) + piece[:_HEAD_BYTES]
            values = [_data_value(line) for line in self._lines if _is_data(line)]
            if _is_data(current):
                values.append(_data_value(current))
            self._head = b"\n".join(values)[:_HEAD_BYTES]
            self._lines = [line for line in self._lines if not _is_data(line)]  # event:, id:
            self._size = 0
            self._line.clear()
        else:
            self._line.extend(piece)

    def _line_ended(self) -> None:
        if not self._over:
            self._lines.append(bytes(self._line))
            self._size += len(self._line)
        self._line.clear()
        self._length = 0

    def _event(self) -> _Event:
        event = _Event(self._lines, self._over, self._head)
        self._lines, self._size, self._over, self._head = [], 0, 0, b""
        return event

    async def _handed(self, event: _Event) -> bytes:
        others = [line for line in event.lines if not _is_data(line)]
        if event.over:
            refused = _refusal(event.head, event.over, self._limit, self._ident)
            if refused is None:
                return b""  # it names no request to tell: dropped, as the stdio reader does
            return b"".join(line + b"\n" for line in others) + b"data: " + refused + b"\n\n"
        lines = event.lines
        data = [_data_value(line) for line in lines if _is_data(line)]
        if sum(map(len, data)) > THREAD_BYTES:
            text = b"\n".join(data).decode("utf-8", "replace")
            rewritten = await anyio.to_thread.run_sync(_read_aside, text)
            if rewritten is not None:
                lines = [*others, b"data: " + rewritten]
        return b"".join(line + b"\n" for line in lines) + b"\n"


class _Event:
    """One event as read: its lines (none once past the bound), its length past it, its head."""

    def __init__(self, lines: list[bytes], over: int, head: bytes) -> None:
        self.lines, self.over, self.head = lines, over, head


def _is_data(line: bytes) -> bool:
    return line.startswith(b"data") and (len(line) == 4 or line[4:5] == b":")


def _data_value(line: bytes) -> bytes:
    value = line[5:]
    return value[1:] if value.startswith(b" ") else value
