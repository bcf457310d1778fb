"""What the adapter tests share: a test sink, a real HTTP server, an SSE reader."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from adapters.channel import (
    Acceptance,
    Attachment,
    AuthorityChange,
    DecisionInbound,
    Inbound,
    IncomingFile,
    KnownThread,
    NotRouted,
    Outbound,
    ThreadRef,
    Unavailable,
)
from adapters.files import FileLimits, take_in
from tests.support.redis_server import free_port


class TestSink:
    """An `InboundSink` like the gateway's: routes spaces to sessions, dedupes by key.

    `error` makes every call raise it; `gate` (an event) holds every call until it is set.
    """

    __test__ = False

    def __init__(self, routes: dict[str, str] | None = None) -> None:
        self.routes = {"default": "s1"} if routes is None else routes
        self.accepted: dict[str, Acceptance] = {}
        self.inbound: list[Inbound] = []
        self.decisions: list[DecisionInbound] = []
        self.marks: dict[str, str] = {}
        self.authority_changes: list[AuthorityChange] = []
        self.files: dict[str, bytes] = {}
        """The files taken in, by their channel's key."""
        self.file_limits = FileLimits()
        self.error: Exception | None = None
        self.gate: asyncio.Event | None = None

    async def _hold(self, space: str, lane: str, key: str) -> Acceptance:
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        session = self.routes.get(space)
        if session is None:
            raise NotRouted(f"no session serves space {space!r}")
        known = self.accepted.get(key)
        if known is not None:
            return known.model_copy(update={"duplicate": True})
        acceptance = Acceptance(
            item_id=f"item-{len(self.accepted) + 1}", session=session, lane=lane
        )
        self.accepted[key] = acceptance
        return acceptance

    async def accept(self, inbound: Inbound) -> Acceptance:
        self.inbound.append(inbound)
        key = inbound.dedupe_key
        first = next((m for m in self.inbound if m.dedupe_key == key), inbound)
        acceptance = await self._hold(inbound.thread.space, inbound.thread.lane, key)
        digests = (first.content_digest, inbound.content_digest)
        if acceptance.duplicate and None not in digests and digests[0] != digests[1]:
            return acceptance.model_copy(update={"reused": True})  # as the gateway says (D382)
        return acceptance

    async def take_files(
        self, thread: ThreadRef, files: Sequence[IncomingFile]
    ) -> tuple[Attachment, ...]:
        if self.error is not None:
            raise self.error

        async def find(key: str) -> tuple[str, int] | None:
            data = self.files.get(key)
            return None if data is None else (f"mem:{key}", len(data))

        async def put(key: str, data: bytes) -> str:
            self.files[key] = data
            return f"mem:{key}"

        return await take_in(files, self.file_limits, find=find, put=put)

    async def decide(self, decision: DecisionInbound) -> Acceptance:
        self.decisions.append(decision)
        ref = decision.thread
        return await self._hold(ref.space, ref.lane, f"decision:{decision.idempotency_key}")

    async def known(self, thread: ThreadRef) -> KnownThread | None:
        found = [m for m in self.inbound if m.thread == thread]
        if not found:
            return None
        session = self.routes.get(thread.space, "s1")
        return KnownThread(thread=thread, session=session, reply_context=found[-1].reply_context)

    async def threads(self, channel: str, space: str) -> tuple[KnownThread, ...]:
        refs = dict.fromkeys(
            m.thread for m in self.inbound if (m.thread.channel, m.thread.space) == (channel, space)
        )
        found = [await self.known(ref) for ref in refs]
        return tuple(known for known in found if known is not None)

    async def read_file(self, channel: str, space: str, blob: str) -> bytes | None:
        if self.error is not None:
            raise self.error
        return self.files.get(blob.removeprefix("mem:"))

    async def authority(self, change: AuthorityChange) -> None:
        """Hold an authority change the channel reported (in order, repeats included)."""
        self.authority_changes.append(change)

    async def get_mark(self, name: str) -> str | None:
        if self.error is not None:
            raise self.error
        return self.marks.get(name)

    async def put_mark(self, name: str, value: str, *, expect: str | None) -> bool:
        if self.error is not None:
            raise self.error
        if self.marks.get(name) != expect:
            return False
        self.marks[name] = value
        return True


def unavailable() -> Unavailable:
    return Unavailable("inbox is down")


def outbound(
    thread: str = "t1",
    delivery_id: str = "reply:run-1",
    *,
    text: str = "hello",
    kind: str = "reply",
    space: str = "default",
    channel: str = "web",
    **extra: object,
) -> Outbound:
    return Outbound.model_validate(
        {
            "delivery_id": delivery_id,
            "thread": ThreadRef(channel=channel, space=space, thread=thread),
            "kind": kind,
            "text": text,
            **extra,
        }
    )


@dataclass
class Server:
    """A real uvicorn server on a free port (streaming responses need a real one)."""

    app: FastAPI
    port: int = field(default_factory=free_port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.asynccontextmanager
async def serve(app: FastAPI, **config_more: Any) -> AsyncIterator[Server]:
    """`app` on a real uvicorn server (`config_more`: more `uvicorn.Config` arguments)."""
    server = Server(app)
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=server.port,
        log_level="warning",
        lifespan="off",
        ws="none",
        timeout_graceful_shutdown=2,
        **config_more,
    )
    running = uvicorn.Server(config)
    task = asyncio.create_task(running.serve())
    try:
        async with asyncio.timeout(10):
            while not running.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.01)
        yield server
    finally:
        running.should_exit = True
        await task


@dataclass
class Event:
    id: str | None
    data: str | None
    comment: str | None = None

    def item(self) -> dict[str, object]:
        assert self.data is not None
        value = json.loads(self.data)
        assert isinstance(value, dict)
        return value


class EventReader:
    """Reads a ``text/event-stream`` response event by event (comments included)."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.lines = response.aiter_lines()
        self.retry: int | None = None

    async def next(self, timeout_s: float = 5.0) -> Event:
        event_id: str | None = None
        data: list[str] = []
        async with asyncio.timeout(timeout_s):
            while True:
                line = await anext(self.lines)
                if line == "":
                    if data or event_id is not None:
                        return Event(event_id, "\n".join(data) if data else None)
                    continue
                if line.startswith(":"):
                    return Event(None, None, comment=line[1:].strip())
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "id":
                    event_id = value
                elif name == "data":
                    data.append(value)
                elif name == "retry":
                    self.retry = int(value)

    async def next_item(self, timeout_s: float = 5.0) -> tuple[int, dict[str, object]]:
        """The next event that carries an item (keepalive comments skipped)."""
        async with asyncio.timeout(timeout_s):
            while True:
                event = await self.next(timeout_s)
                if event.data is not None:
                    assert event.id is not None
                    return int(event.id), event.item()

    async def end(self, timeout_s: float = 5.0) -> None:
        """Wait for the server to end the stream."""
        async with asyncio.timeout(timeout_s):
            async for _ in self.lines:
                pass
