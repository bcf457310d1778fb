"""The web channel's Server-Sent Events, over a real HTTP server (uvicorn on a free port)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from adapters import LiveUpdate, ThreadRef
from adapters.web import MemoryMailbox, WebChannel, WebLimits, WebMailbox
from adapters.web.login import WebLogin
from adapters.web.mailbox import WebItem
from adapters.web.redis import RedisMailbox
from harness_core.testing import ManualClock
from tests.adapters.kit import EventReader, Server, TestSink, outbound, serve
from tests.support.redis_server import RedisServer


@pytest.fixture
async def server(app: FastAPI) -> AsyncIterator[Server]:
    async with serve(app) as running:
        yield running


@pytest.fixture
async def http(server: Server) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        yield client


async def test_a_reply_delivered_after_the_client_connected_arrives(
    http: httpx.AsyncClient, channel: WebChannel
) -> None:
    async with http.stream("GET", "/web/threads/t1/events") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-store"
        events = EventReader(response)
        posted = await http.post(
            "/web/threads/t1/messages", json={"text": "hi", "client_message_id": "m-1"}
        )
        assert posted.status_code == 202
        seq, item = await events.next_item()
        assert (seq, item["kind"], item["id"]) == (1, "message", "m-1")
        await channel.deliver(outbound("t1", "reply:run-1", text="line one\nline two"))
        seq, item = await events.next_item()
        assert (seq, item["kind"], item["text"]) == (2, "reply", "line one\nline two")
        assert events.retry == 2000


async def test_history_is_sent_first_then_live_items(
    http: httpx.AsyncClient, channel: WebChannel
) -> None:
    for n in range(1, 4):
        await channel.deliver(outbound("t1", f"reply:{n}", text=f"r{n}"))
    async with http.stream("GET", "/web/threads/t1/events") as response:
        events = EventReader(response)
        assert [(await events.next_item())[0] for _ in range(3)] == [1, 2, 3]
        await channel.deliver(outbound("t1", "reply:4"))
        assert (await events.next_item())[0] == 4


async def test_last_event_id_resumes_without_missing_anything(
    http: httpx.AsyncClient, channel: WebChannel
) -> None:
    await channel.deliver(outbound("t1", "reply:1"))
    async with http.stream("GET", "/web/threads/t1/events") as response:
        events = EventReader(response)
        last, _ = await events.next_item()
    # disconnected: replies delivered meanwhile are not lost
    await channel.deliver(outbound("t1", "reply:2"))
    await channel.deliver(outbound("t1", "reply:3"))
    headers = {"Last-Event-ID": str(last)}
    async with http.stream("GET", "/web/threads/t1/events?after=0", headers=headers) as response:
        events = EventReader(response)  # the header wins over the page's first `after`
        resumed = [(await events.next_item())[1]["id"] for _ in range(2)]
        assert resumed == ["reply:2", "reply:3"]
        await channel.deliver(outbound("t1", "reply:4"))
        assert (await events.next_item())[1]["id"] == "reply:4"


async def test_after_starts_the_stream_later(http: httpx.AsyncClient, channel: WebChannel) -> None:
    for n in range(1, 4):
        await channel.deliver(outbound("t1", f"reply:{n}"))
    async with http.stream("GET", "/web/threads/t1/events?after=2") as response:
        assert (await EventReader(response).next_item())[0] == 3


async def test_kinds_filter_the_stream_but_ids_still_resume(
    http: httpx.AsyncClient, channel: WebChannel
) -> None:
    await http.post("/web/threads/t1/messages", json={"text": "q"})
    await channel.deliver(outbound("t1", "reply:1"))
    url = "/web/threads/t1/events?kinds=reply,failure_notice"
    async with http.stream("GET", url) as response:
        events = EventReader(response)
        seq, item = await events.next_item()
        assert (seq, item["kind"]) == (2, "reply")
        await http.post("/web/threads/t1/messages", json={"text": "q2"})
        await channel.deliver(outbound("t1", "notice:2", kind="failure_notice"))
        seq, item = await events.next_item()
        assert (seq, item["kind"]) == (4, "failure_notice")
    status = (await http.get("/web/threads/t1/events?kinds=reply,nonsense")).status_code
    assert status == 400
    status = (await http.get("/web/threads/t1/events?kinds=,,")).status_code
    assert status == 400  # was a stream that never sent anything


async def test_an_idle_stream_sends_keepalives(http: httpx.AsyncClient) -> None:
    async with http.stream("GET", "/web/threads/t1/events") as response:
        events = EventReader(response)
        event = await events.next(timeout_s=3)
        assert event.comment == "keepalive"


@pytest.mark.parametrize("resume", [b"abc", b"\xb2", "\u0663".encode(), b"9" * 5000])
async def test_a_bad_last_event_id_is_400(http: httpx.AsyncClient, resume: bytes) -> None:
    response = await http.get("/web/threads/t1/events", headers={b"Last-Event-ID": resume})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"
    response = await http.get("/web/threads/t1/events?after=%C2%B2")
    assert response.status_code == 400


async def test_stopping_the_channel_ends_open_streams(
    http: httpx.AsyncClient, channel: WebChannel
) -> None:
    async with http.stream("GET", "/web/threads/t1/events") as response:
        events = EventReader(response)
        await events.next(timeout_s=3)  # connected (a keepalive)
        await channel.stop()
        await events.end()


async def test_many_clients_each_get_every_reply(
    http: httpx.AsyncClient, channel: WebChannel
) -> None:
    async def listen() -> list[str]:
        async with http.stream("GET", "/web/threads/t1/events") as response:
            events = EventReader(response)
            return [str((await events.next_item())[1]["id"]) for _ in range(3)]

    listeners = [asyncio.create_task(listen()) for _ in range(5)]
    await asyncio.sleep(0.2)
    for n in range(3):
        await channel.deliver(outbound("t1", f"reply:{n}"))
        await channel.deliver(outbound("t1", f"reply:{n}"))  # a repeat is not sent again
    async with asyncio.timeout(10):
        results = await asyncio.gather(*listeners)
    assert results == [["reply:0", "reply:1", "reply:2"]] * 5


async def test_a_disconnecting_client_does_not_disturb_the_channel(
    http: httpx.AsyncClient, channel: WebChannel
) -> None:
    await channel.deliver(outbound("t1", "reply:1"))
    for _ in range(10):
        async with http.stream("GET", "/web/threads/t1/events") as response:
            assert (await EventReader(response).next_item())[1]["id"] == "reply:1"
    await channel.deliver(outbound("t1", "reply:2"))
    async with http.stream("GET", "/web/threads/t1/events?after=1") as response:
        assert (await EventReader(response).next_item())[1]["id"] == "reply:2"


@pytest.mark.parametrize("backend", ["sqlite", "redis", "redis-cluster"])
async def test_streams_on_durable_mailboxes(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, sink: TestSink
) -> None:
    from tests.adapters.conftest import open_test_mailbox

    mailbox: WebMailbox = await open_test_mailbox(backend, request, tmp_path)
    web = WebChannel(mailbox, clock=ManualClock(), limits=WebLimits(keepalive_s=0.5))
    await web.start(sink)
    app = FastAPI()
    app.include_router(web.router)
    try:
        async with serve(app) as running, httpx.AsyncClient(base_url=running.url) as http:
            await web.deliver(outbound("t1", "reply:1"))
            async with http.stream("GET", "/web/threads/t1/events") as response:
                events = EventReader(response)
                assert (await events.next_item())[0] == 1
                await web.deliver(outbound("t1", "reply:2"))
                assert (await events.next_item())[0] == 2
    finally:
        await web.close()


async def test_a_client_of_process_a_sees_a_reply_delivered_by_process_b(
    redis_server: RedisServer, redis_prefix: str, sink: TestSink
) -> None:
    """Two channels, two mailboxes, two HTTP servers on one Redis: two `gateway serve`s."""
    channels = [
        WebChannel(
            RedisMailbox(redis_server.url, prefix=redis_prefix),
            clock=ManualClock(),
            limits=WebLimits(keepalive_s=5),
        )
        for _ in range(2)
    ]
    apps = []
    for web in channels:
        await web.start(sink)
        app = FastAPI()
        app.include_router(web.router)
        apps.append(app)
    process_a, process_b = channels
    try:
        async with (
            serve(apps[0]) as server_a,
            serve(apps[1]) as server_b,
            httpx.AsyncClient(base_url=server_a.url) as client_a,
            httpx.AsyncClient(base_url=server_b.url) as client_b,
            client_a.stream("GET", "/web/threads/t1/events") as response,
        ):
            events = EventReader(response)
            await client_b.post("/web/threads/t1/messages", json={"text": "via b"})
            assert (await events.next_item(timeout_s=3))[1]["text"] == "via b"
            loop = asyncio.get_running_loop()
            sent = loop.time()
            await process_b.deliver(outbound("t1", "reply:run-1", text="from b"))
            seq, item = await events.next_item(timeout_s=3)
            assert (seq, item["text"]) == (2, "from b")
            assert loop.time() - sent < 2  # pushed, well before the 5 s keepalive
            assert await process_a.reconcile(outbound("t1", "reply:run-1")) == "delivered"
    finally:
        for web in channels:
            await web.close()


async def test_a_reply_process_b_delivered_ends_what_process_a_shows_live(
    http: httpx.AsyncClient, channel: WebChannel, sink: TestSink
) -> None:
    """Run run-1 streamed in process A (its live board holds the text); process B delivered
    its reply (B's board was cleared, not A's). A page opening A's stream gets the reply and
    no "writing..." text of run-1 after it, and a late update of run-1 shows nothing (D282)."""
    thread = ThreadRef(channel="web", space="default", thread="t1")
    await channel.show(
        LiveUpdate(thread=thread, run_id="run-1", kind="text", text="Half", offset=0)
    )
    await channel.show(LiveUpdate(thread=thread, run_id="run-1", kind="done"))
    process_b = WebChannel(channel.mailbox, clock=ManualClock(), limits=WebLimits(keepalive_s=0.2))
    await process_b.start(sink)
    try:
        await process_b.deliver(outbound("t1", "reply:s:run-1", text="The whole answer."))
    finally:
        await process_b.close()
    async with http.stream("GET", "/web/threads/t1/events?live=1") as response:
        events = EventReader(response)
        _, item = await events.next_item()
        assert (item["kind"], item["text"]) == ("reply", "The whole answer.")
        late = LiveUpdate(
            thread=thread, run_id="run-1", kind="text", text="Half an answer", offset=0
        )
        await channel.show(late)
        shown = [await events.next(timeout_s=2) for _ in range(3)]
    assert all(event.comment == "keepalive" for event in shown), shown


async def test_a_burst_of_streams_is_held_to_the_bound(
    http: httpx.AsyncClient, channel: WebChannel
) -> None:
    """A stream was counted only once its body began: a burst passed the check together
    (1,100 of 1,000 when only the body counted, then 1,001)."""
    channel.limits = WebLimits(max_streams=3, max_client_streams=3, keepalive_s=0.2)
    async with contextlib.AsyncExitStack() as stack:

        async def open_one(n: int) -> int:
            response = await stack.enter_async_context(
                http.stream("GET", f"/web/threads/b{n}/events")
            )
            return response.status_code

        codes = await asyncio.gather(*(open_one(n) for n in range(12)))
        assert sorted(codes) == [200] * 3 + [503] * 9, codes
        assert channel.streams == 3
    for _ in range(100):
        if channel.streams == 0:
            break
        await asyncio.sleep(0.02)
    assert channel.streams == 0


async def test_one_client_holds_at_most_half_the_streams(
    server: Server, http: httpx.AsyncClient, channel: WebChannel
) -> None:
    """One client that opened every place and read nothing held every thread page of every
    space dead (503) for as long as it liked (an outside probe)."""
    channel.limits = WebLimits(max_streams=4, keepalive_s=0.2)
    other = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
    async with (
        httpx.AsyncClient(base_url=server.url, timeout=10, transport=other) as someone,
        http.stream("GET", "/web/threads/t1/events") as one,
        http.stream("GET", "/web/threads/t2/events") as two,
    ):
        assert (one.status_code, two.status_code) == (200, 200)
        refused = await http.get("/web/threads/t3/events")
        assert refused.status_code == 503, refused.text
        assert "this client has 2 event streams open already" in refused.json()["error"]["message"]
        async with someone.stream("GET", "/web/threads/t3/events") as theirs:
            assert theirs.status_code == 200  # another person's page still lives


async def test_with_tokens_each_person_has_a_share_whatever_their_address(
    http: httpx.AsyncClient, channel: WebChannel
) -> None:
    """Behind a proxy every user is one address: shared by address, one person's two tabs
    held everyone's share. With tokens, the share is the signed-in name's (D380)."""
    alice, bob = "alice-secret-0123456789abcdef", "bob-secret-0123456789abcdefgh"
    channel.limits = WebLimits(max_streams=4, keepalive_s=0.2)
    channel.login = WebLogin({alice: "alice", bob: "bob"})
    as_alice = {"authorization": f"Bearer {alice}"}
    async with (
        http.stream("GET", "/web/threads/t1/events", headers=as_alice) as one,
        http.stream("GET", "/web/threads/t2/events", headers=as_alice) as two,
    ):
        assert (one.status_code, two.status_code) == (200, 200)
        refused = await http.get("/web/threads/t3/events", headers=as_alice)
        assert refused.status_code == 503, refused.text
        as_bob = {"authorization": f"Bearer {bob}"}  # the same address, another person
        async with http.stream("GET", "/web/threads/t3/events", headers=as_bob) as theirs:
            assert theirs.status_code == 200


async def test_streams_past_the_bound_are_refused_until_one_closes(
    http: httpx.AsyncClient, channel: WebChannel
) -> None:
    """2,000 open streams were all taken, each re-reading the mailbox every few seconds."""
    channel.limits = WebLimits(max_streams=2, max_client_streams=2, keepalive_s=0.2)
    async with (
        http.stream("GET", "/web/threads/t1/events") as one,
        http.stream("GET", "/web/threads/t2/events") as two,
    ):
        assert (one.status_code, two.status_code) == (200, 200)
        for _ in range(100):
            if channel.streams == 2:
                break
            await asyncio.sleep(0.02)
        refused = await http.get("/web/threads/t3/events")
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "unavailable"
        assert refused.headers["retry-after"] == "2"
    for _ in range(100):
        if channel.streams == 0:
            break
        await asyncio.sleep(0.02)
    assert channel.streams == 0  # each stream that ended let its place go
    async with http.stream("GET", "/web/threads/t3/events") as again:
        assert again.status_code == 200


class _Copies(MemoryMailbox):
    """Reads give fresh objects, as a stored mailbox's do (SQLite, Redis); `wait` reads too."""

    async def read(
        self, space: str, thread: str, *, after: int = 0, limit: int = 100
    ) -> tuple[WebItem, ...]:
        found = await super().read(space, thread, after=after, limit=limit)
        return tuple(item.model_copy() for item in found)


async def test_an_idle_stream_holds_none_of_what_it_sent(
    clock: ManualClock, sink: TestSink
) -> None:
    """An open page's stream kept its first page of items for its whole life: 60 idle pages
    of a thread of long replies held 820 MB (an outside probe)."""
    mailbox = _Copies()
    web = WebChannel(mailbox, clock=clock, limits=WebLimits(keepalive_s=0.2))
    await web.start(sink)
    app = FastAPI()
    app.include_router(web.router)
    for n in range(1, 121):
        await web.deliver(outbound("t1", f"reply:{n}", text=f"held-{n} " + "x" * 1000))
    kept = {id(item) for item in await MemoryMailbox.read(mailbox, "default", "t1", limit=500)}

    def held() -> int:
        return sum(
            1
            for o in gc.get_objects()
            if isinstance(o, WebItem) and o.text.startswith("held-") and id(o) not in kept
        )

    try:
        async with (
            serve(app) as running,
            httpx.AsyncClient(base_url=running.url) as http,
            http.stream("GET", "/web/threads/t1/events") as response,
        ):
            events = EventReader(response)
            assert [(await events.next_item())[0] for _ in range(120)][-1] == 120
            assert (await events.next(timeout_s=3)).comment == "keepalive"  # idle now
            gc.collect()
            assert held() == 0
    finally:
        await web.close()
