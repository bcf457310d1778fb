"""Warm sessions: a worker keeps the session it served for a linger, and lets it go when it must.

The whole service runs in the test's process (SQLite files, or a real redis-server). A take is
seen in the log ("session taken"); what a worker holds in `Worker.active`; the session's lease
and ticket in the store and the broker. Each race of the linger is run in both orders: a message
during the linger and just after it; another worker's claim during it and after it; a drain
during it and a message as the drain begins; another session needing the slot. The SIGKILL of a
process while its session lingers is `test_warm_sessions_kill.py`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import httpx
import pytest

from adapters.channel import Author, Inbound, ThreadRef
from gateway.broker import open_broker
from gateway.broker.contract import NewInboxItem
from gateway.channels import gateway_settings
from gateway.replies import replies_mark, watermark_of
from gateway.service import Service
from harness_core import open_repo
from tests.support.ops_rig import backend_urls
from tests.support.service_rig import ServiceRig

SESSION = "web-default"


class Rig(ServiceRig):
    """A service, what its log said, and the session's state in the store and the broker."""

    def __init__(self, service: Service, http: httpx.AsyncClient, log: list[str]) -> None:
        super().__init__(service, http)
        self.log = log

    @property
    def takes(self) -> int:
        return self.log.count("session taken")

    @property
    def releases(self) -> int:
        return self.log.count("session released")

    def holds(self) -> bool:
        assert self.service.worker is not None
        return SESSION in self.service.worker.active

    async def until(self, check: Callable[[], bool], what: str, timeout_s: float = 15) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not check():
            assert asyncio.get_running_loop().time() < deadline, what
            await asyncio.sleep(0.01)

    async def replied(self, thread: str, count: int) -> list[str]:
        """The texts of the thread's first `count` replies (waits for them)."""
        return [item["text"] for item in await self.answers(thread, count)][:count]

    async def lease_holder(self) -> str | None:
        holder = await self.repo.lease_holder(SESSION)
        return None if holder is None else holder.owner

    async def ticket_holders(self) -> list[str]:
        return [held.worker for held in await self.broker.inbox.held() if held.session == SESSION]


class _Said(logging.Handler):
    def __init__(self, said: list[str]) -> None:
        super().__init__(logging.INFO)
        self.said = said

    def emit(self, record: logging.LogRecord) -> None:
        self.said.append(str(record.msg))


@pytest.fixture(params=["sqlite", "redis"])
def urls(request: pytest.FixtureRequest, tmp_path: Any) -> dict[str, str]:
    return backend_urls(request.param, request, tmp_path)


@pytest.fixture
async def started() -> AsyncIterator[Callable[..., Any]]:
    """Start services (their settings: the URLs and any changes); each is stopped after."""
    rigs: list[Rig] = []
    handlers: list[logging.Handler] = []
    logger = logging.getLogger("gateway.worker")
    level = logger.level
    logger.setLevel(logging.INFO)

    async def start(urls: dict[str, str], **changes: Any) -> Rig:
        said: list[str] = []
        handler = _Said(said)
        handlers.append(handler)
        settings = gateway_settings(**{"lease_seconds": 30, "renew_seconds": 2, **urls, **changes})
        service = Service(settings)
        logger.addHandler(handler)
        await service.start()
        assert service.app is not None
        http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=service.app), base_url="http://localhost"
        )
        rigs.append(Rig(service, http, said))
        return rigs[-1]

    yield start
    for rig in rigs:
        await rig.http.aclose()
        await rig.service.stop(drain_seconds=2)
    for handler in handlers:
        logger.removeHandler(handler)
    logger.setLevel(level)


async def test_the_next_message_during_the_linger_is_served_without_a_take(
    urls: dict[str, str], started: Callable[..., Any]
) -> None:
    rig = await started(urls, linger_seconds=10)
    await rig.post("t1", "one")
    assert await rig.replied("t1", 1) == ["You said: one"]
    assert rig.holds()  # idle, and kept
    await rig.post("t1", "two")
    await rig.post("t2", "three")  # another thread of the session: the same warm session
    assert await rig.replied("t1", 2) == ["You said: one", "You said: two"]
    assert await rig.replied("t2", 1) == ["You said: three"]
    assert rig.takes == 1
    assert rig.releases == 0


async def test_a_message_the_linger_found_is_not_read_from_the_inbox_again(
    urls: dict[str, str], started: Callable[..., Any]
) -> None:
    rig = await started(urls, linger_seconds=10)
    await rig.post("t1", "one")
    assert await rig.replied("t1", 1) == ["You said: one"]
    inbox = rig.broker.inbox
    read = inbox.pending
    reads: list[tuple[str, ...]] = []

    async def counted(session: str, *, limit: int = 100) -> Any:
        found = await read(session, limit=limit)
        reads.append(tuple(item.dedupe_key for item in found))
        return found

    inbox.pending = counted
    await rig.post("t1", "two")
    assert await rig.replied("t1", 2) == ["You said: one", "You said: two"]
    await rig.until(lambda: len(reads) >= 2, "the read after the run")
    await asyncio.sleep(0.2)
    # the linger's read found it; the next read is the one after its run (it finds nothing)
    assert len(reads) == 2 and len(reads[0]) == 1 and reads[1] == (), reads
    assert rig.takes == 1


async def test_the_linger_ends_by_letting_the_session_go_cleanly(
    urls: dict[str, str], started: Callable[..., Any]
) -> None:
    rig = await started(urls, linger_seconds=0.3)
    await rig.post("t1", "one")
    await rig.replied("t1", 1)
    await rig.until(lambda: not rig.holds(), "the linger ends")
    deadline = asyncio.get_running_loop().time() + 5
    while await rig.ticket_holders():  # its ticket ends last (after the lease, the mark)
        assert asyncio.get_running_loop().time() < deadline, "the ticket stayed taken"
        await asyncio.sleep(0.01)
    assert await rig.lease_holder() is None
    storage = await rig.repo.open(SESSION)
    try:
        last = (await storage.get_stats()).last_seq
    finally:
        await storage.close()
    assert watermark_of(await rig.broker.marks.get(replies_mark(SESSION))) == last
    assert (rig.takes, rig.releases) == (1, 1)


async def test_the_default_linger_is_cut_to_a_third_of_a_short_lease(
    urls: dict[str, str], started: Callable[..., Any]
) -> None:
    rig = await started(urls, lease_seconds=3, renew_seconds=0.5)  # the linger as shipped
    await rig.post("t1", "one")
    assert await rig.replied("t1", 1) == ["You said: one"]
    assert rig.holds()  # lingering
    began = time.monotonic()
    await rig.until(lambda: not rig.holds(), "let go after a third of the lease", timeout_s=10)
    assert time.monotonic() - began < 2.5  # about 1 s, not the default's 5 s
    await rig.until(lambda: rig.releases == 1, "released")


async def test_no_linger_lets_the_session_go_at_once(
    urls: dict[str, str], started: Callable[..., Any]
) -> None:
    rig = await started(urls, linger_seconds=0)
    await rig.post("t1", "one")
    await rig.replied("t1", 1)
    await rig.until(lambda: rig.releases == 1, "released", timeout_s=2)
    await rig.post("t1", "two")
    assert await rig.replied("t1", 2) == ["You said: one", "You said: two"]
    assert rig.takes == 2


@pytest.mark.parametrize("offset_ms", [-40, -10, 0, 10, 40])
async def test_a_message_around_the_end_of_the_linger_is_answered_once(
    urls: dict[str, str], started: Callable[..., Any], offset_ms: int
) -> None:
    """The next message lands just before the linger ends, as it ends, or just after."""
    linger_ms = 300
    rig = await started(urls, linger_seconds=linger_ms / 1000)
    await rig.post("t1", "one")
    await rig.replied("t1", 1)
    await asyncio.sleep((linger_ms + offset_ms) / 1000)
    await rig.post("t1", "two")
    assert await rig.replied("t1", 2) == ["You said: one", "You said: two"]
    await asyncio.sleep(linger_ms / 1000 + 0.2)
    items = (await rig.http.get("/web/threads/t1")).json()["items"]
    assert [i["kind"] for i in items] == ["message", "reply", "message", "reply"]
    assert await rig.broker.inbox.pending(SESSION) == ()
    assert rig.takes in (1, 2)  # warm, or taken again after the linger let it go


@pytest.mark.parametrize("how", ["released", "lapsed"])
async def test_another_workers_claim_during_the_linger_lets_the_session_go_at_once(
    urls: dict[str, str], started: Callable[..., Any], how: str
) -> None:
    """Its ticket handed to another worker, the lingering one gives up the lease at once."""
    rig = await started(urls, linger_seconds=10)
    await rig.post("t1", "one")
    await rig.replied("t1", 1)
    assert rig.holds()
    worker_id = rig.service.worker_id
    if how == "released":  # as a process that found this worker gone would
        assert await rig.broker.inbox.release(worker_id) == (SESSION,)
    else:  # its ticket lapsed (a stall): another worker took the session over
        [ticket] = [h for h in await rig.broker.inbox.held() if h.session == SESSION]
        assert ticket.worker == worker_id
        assert await rig.broker.inbox.release(worker_id) == (SESSION,)
    taken = await rig.broker.inbox.take_session("another")
    assert taken is not None and taken.session == SESSION
    began = asyncio.get_running_loop().time()
    await rig.until(lambda: not rig.holds(), "let go", timeout_s=5)
    assert asyncio.get_running_loop().time() - began < 2  # not the 10 s linger
    assert await rig.lease_holder() is None
    lease = await rig.repo.acquire_lease(SESSION, owner="another", ttl_ms=30_000)
    assert await rig.repo.release_lease(lease)
    await rig.broker.inbox.done(taken)
    await rig.post("t1", "two")  # the session is anybody's again: this worker takes it
    assert await rig.replied("t1", 2) == ["You said: one", "You said: two"]


async def test_another_workers_claim_after_the_linger_finds_the_session_free(
    urls: dict[str, str], started: Callable[..., Any]
) -> None:
    rig = await started(urls, linger_seconds=0.2)
    await rig.post("t1", "one")
    await rig.replied("t1", 1)
    await rig.until(lambda: not rig.holds(), "the linger ends")
    await rig.broker.inbox.append(_inbox_item("t1", "from elsewhere"))
    assert rig.service.worker is not None
    rig.service.worker.stop_taking()  # this worker takes no more
    taken = await rig.broker.inbox.take_session("another", wait_ms=5_000)
    assert taken is not None and taken.session == SESSION
    lease = await rig.repo.acquire_lease(SESSION, owner="another", ttl_ms=30_000)  # at once
    assert await rig.repo.release_lease(lease)


async def test_a_drain_lets_a_lingering_session_go_at_once(
    urls: dict[str, str], started: Callable[..., Any]
) -> None:
    rig = await started(urls, linger_seconds=10)
    await rig.post("t1", "one")
    await rig.replied("t1", 1)
    assert rig.holds()
    began = asyncio.get_running_loop().time()
    await rig.service.stop(drain_seconds=5)
    assert asyncio.get_running_loop().time() - began < 3  # neither the linger nor the drain
    assert not rig.holds()
    assert rig.releases == 1
    repo, broker = open_repo(urls["store_url"]), open_broker(urls["broker_url"])
    try:
        assert await repo.lease_holder(SESSION) is None
        assert [h for h in await broker.inbox.held() if h.session == SESSION] == []
    finally:
        await repo.close()
        await broker.close()


async def test_a_message_as_the_drain_begins_is_left_for_the_next_worker(
    urls: dict[str, str], started: Callable[..., Any]
) -> None:
    rig = await started(urls, linger_seconds=10)
    await rig.post("t1", "one")
    await rig.replied("t1", 1)
    worker = rig.service.worker
    assert worker is not None
    worker.stop_taking()
    await rig.broker.inbox.append(_inbox_item("t1", "as the drain began"))
    await rig.until(lambda: not rig.holds(), "let go")
    [pending] = await rig.broker.inbox.pending(SESSION)  # not lost: ready for the next take
    assert pending.payload["text"] == "as the drain began"
    taken = await rig.broker.inbox.take_session("next", wait_ms=5_000)
    assert taken is not None and taken.session == SESSION


async def test_a_lingering_session_holds_no_slot(
    urls: dict[str, str], started: Callable[..., Any]
) -> None:
    """With one slot, another session is served while the first lingers, and both stay warm."""
    other = "web-other"
    rig = await started(urls, linger_seconds=10, worker_slots=1)
    await rig.post("t1", "one")
    await rig.replied("t1", 1)
    began = asyncio.get_running_loop().time()
    response = await rig.http.post(
        "/web/threads/u1/messages", json={"text": "elsewhere", "space": "other"}
    )
    assert response.status_code == 202, response.text
    deadline = asyncio.get_running_loop().time() + 10
    while not [i for i in (await _items(rig, "u1", "other")) if i["kind"] == "reply"]:
        assert asyncio.get_running_loop().time() < deadline, "the other session was not served"
        await asyncio.sleep(0.01)
    assert asyncio.get_running_loop().time() - began < 3  # not after the 10 s linger
    worker = rig.service.worker
    assert worker is not None
    assert {SESSION, other} <= set(worker.active)
    await rig.post("t1", "two")
    assert await rig.replied("t1", 2) == ["You said: one", "You said: two"]
    assert rig.takes == 2  # one per session


async def _items(rig: Rig, thread: str, space: str) -> list[dict[str, Any]]:
    response = await rig.http.get(f"/web/threads/{thread}", params={"space": space})
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def _inbox_item(thread: str, text: str) -> NewInboxItem:
    inbound = Inbound(
        thread=ThreadRef(channel="web", space="default", thread=thread),
        message_id=f"m-{text}",
        author=Author(id="someone"),
        text=text,
        received_at_ms=int(time.time() * 1000),
    )
    return NewInboxItem(
        session=SESSION,
        lane=inbound.thread.lane,
        dedupe_key=inbound.dedupe_key,
        kind="message",
        payload=inbound.model_dump(mode="json"),
    )


async def test_past_the_cap_the_session_lingering_longest_is_let_go(
    urls: dict[str, str], started: Callable[..., Any]
) -> None:
    """With room for one lingering session, the second one to linger sends the first away."""
    other = "web-other"
    rig = await started(urls, linger_seconds=10, worker_slots=1)
    worker = rig.service.worker
    assert worker is not None
    worker.config = replace(worker.config, warm_per_slot=1)
    await rig.post("t1", "one")
    await rig.replied("t1", 1)
    await rig.until(rig.holds, "the first session lingers")
    response = await rig.http.post(
        "/web/threads/u1/messages", json={"text": "elsewhere", "space": "other"}
    )
    assert response.status_code == 202, response.text
    await rig.until(lambda: rig.releases == 1, "the first session is let go", timeout_s=5)
    assert not rig.holds() and other in worker.active  # the newer one lingers in its place
    assert await rig.lease_holder() is None
    await rig.post("t1", "two")
    assert await rig.replied("t1", 2) == ["You said: one", "You said: two"]
    assert rig.takes == 3  # the first session was taken again
