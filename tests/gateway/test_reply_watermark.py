"""The replies watermark: a take looks at the lanes that may owe a reply, not at every thread.

A whole `Service` on SQLite with the test agent (tests/support/gateway_agent.py); messages go
in through the web channel. Spies on the broker's thread reads only count calls (they prove a
look did *not* happen); every reply is checked where users see it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.broker.contract import SessionTicket
from gateway.channels import gateway_settings
from gateway.replies import replies_mark, watermark_of
from gateway.service import Service
from gateway.worker import Worker, _Session
from harness_core import AgentHarness, Ok
from tests.support.service_rig import ServiceRig

AGENT = "tests.support.gateway_agent"
SESSION = "web-default"


class Rig(ServiceRig):
    @property
    def worker(self) -> Worker:
        assert self.service.worker is not None
        return self.service.worker

    async def stop(self) -> None:
        await self.http.aclose()
        await self.service.stop(drain_seconds=2)

    async def until(self, check: Callable[[], Any], what: str) -> Any:
        deadline = asyncio.get_running_loop().time() + 15
        while not (found := await check()):
            assert asyncio.get_running_loop().time() < deadline, what
            await asyncio.sleep(0.02)
        return found

    async def released(self) -> int:
        """Wait until the session is let go and its watermark is set; return the watermark."""

        async def check() -> int | None:
            if SESSION in self.worker.active:
                return None
            # the worker lets the session go (`active`) before it moves the mark: a read in
            # between sees the previous take's mark, so wait for the mark to reach the store
            mark = watermark_of(await self.broker.marks.get(replies_mark(SESSION)))
            return mark if mark is not None and mark >= await self.last_seq() else None

        seq: int = await self.until(check, "a clean release sets the watermark")
        return seq

    async def last_seq(self) -> int:
        storage = await self.repo.open(SESSION)
        try:
            return (await storage.get_stats()).last_seq
        finally:
            await storage.close()


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    settings = gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"sqlite:///{tmp_path}/web.db",
        plugin=AGENT,
    )
    service = Service(settings)
    await service.start()
    assert service.app is not None
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=service.app), base_url="http://localhost"
    )
    running = Rig(service, http)
    yield running
    await running.stop()


def spy(target: Any, name: str, calls: list[Any]) -> None:
    real = getattr(target, name)

    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return await real(*args, **kwargs)

    setattr(target, name, counted)


async def test_a_take_after_a_clean_release_looks_only_at_lanes_with_new_replies(
    rig: Rig,
) -> None:
    threads = [f"thread-{n:02d}" for n in range(30)]
    for thread in threads:
        await rig.post(thread, f"hello {thread}")
    for thread in threads:
        await rig.answers(thread, 1)
    assert await rig.released() == await rig.last_seq()

    listed: list[Any] = []
    looked_up: list[Any] = []
    spy(rig.broker.threads, "list", listed)
    spy(rig.broker.threads, "get", looked_up)
    await rig.post("thread-07", "once more")
    second = await rig.answers("thread-07", 2)
    assert second[-1]["text"] == "You said: once more"
    watermark = await rig.released()
    assert watermark == await rig.last_seq()
    assert listed == []  # not every thread of the session
    assert {args[1] for args in looked_up} == {"web:thread-07"}


async def test_a_reply_left_unsent_after_the_watermark_is_sent_at_the_next_take(
    rig: Rig,
) -> None:
    await rig.post("thread-a", "first")
    await rig.post("thread-b", "first")
    await rig.answers("thread-a", 1)
    await rig.answers("thread-b", 1)
    watermark = await rig.released()

    # a holder that died after its run finished and before it enqueued the reply: the run's
    # records are in the store after the watermark, its reply nowhere
    lease = await rig.repo.acquire_lease(SESSION, owner="crashed", ttl_ms=60_000)
    storage = await rig.repo.open(SESSION, lease=lease)
    harness, _ = await AgentHarness.create(rig.worker._options(storage))
    lane = await harness.lane("web:thread-b")
    assert lane is not None
    result = await lane.prompt("left behind")
    assert isinstance(result, Ok) and result.value.kind == "completed"
    await harness.close()
    await storage.close()
    await rig.repo.release_lease(lease)

    await rig.post("thread-a", "second")  # the next take of the session
    answers = await rig.answers("thread-b", 2)
    assert answers[-1]["text"] == "You said: left behind"
    assert (await rig.answers("thread-a", 2))[-1]["text"] == "You said: second"
    assert await rig.released() > watermark


async def test_the_watermark_moves_only_from_the_value_its_take_read(rig: Rig) -> None:
    await rig.post("thread-a", "first")
    await rig.answers("thread-a", 1)
    first = await rig.released()
    marks = rig.broker.marks
    name = replies_mark(SESSION)
    assert await marks.put(name, str(first + 50), expect=str(first))  # a newer holder's value

    stale = _Session(
        ticket=SessionTicket(session=SESSION, ticket="t"),
        harness=None,  # type: ignore[arg-type]
        storage=None,  # type: ignore[arg-type]
        watermark=str(first),
    )
    await rig.worker._advance_watermark(stale, first + 10)
    assert await marks.get(name) == str(first + 50)  # neither moved back nor overwritten

    newest = _Session(
        ticket=SessionTicket(session=SESSION, ticket="t"),
        harness=None,  # type: ignore[arg-type]
        storage=None,  # type: ignore[arg-type]
        watermark=str(first + 50),
    )
    await rig.worker._advance_watermark(newest, first + 20)
    assert await marks.get(name) == str(first + 50)  # a lower seq never lowers it


async def test_a_release_that_finds_the_lease_gone_leaves_the_watermark(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    await rig.post("thread-a", "first")
    await rig.answers("thread-a", 1)
    first = await rig.released()
    real = rig.repo.release_lease

    async def lost(lease: Any) -> bool:
        await real(lease)
        return False  # as if another writer had taken the session meanwhile

    monkeypatch.setattr(rig.repo, "release_lease", lost)
    await rig.post("thread-a", "second")
    await rig.answers("thread-a", 2)
    # the session is taken again only once the previous holder returned its ticket, which it
    # does after its release (and after any watermark move)
    await rig.post("thread-a", "third")
    await rig.answers("thread-a", 3)
    assert await rig.last_seq() > first  # two runs wrote after the watermark
    assert watermark_of(await rig.broker.marks.get(replies_mark(SESSION))) == first


async def test_without_a_watermark_every_thread_is_looked_at(rig: Rig) -> None:
    await rig.post("thread-a", "first")
    await rig.post("thread-b", "first")
    await rig.answers("thread-a", 1)
    await rig.answers("thread-b", 1)
    await rig.released()
    # an unreadable mark (hand-edited, or an older layout): the full look, nothing skipped
    marks = rig.broker.marks
    name = replies_mark(SESSION)
    assert await marks.put(name, "not a seq", expect=await marks.get(name))
    listed: list[Any] = []
    spy(rig.broker.threads, "list", listed)
    await rig.post("thread-a", "second")
    await rig.answers("thread-a", 2)
    assert await rig.released() == await rig.last_seq()
    assert listed == [(SESSION,)]


def test_a_watermark_is_a_seq_or_nothing() -> None:
    assert watermark_of(None) is None
    assert watermark_of("") is None
    assert watermark_of("12") == 12
    assert watermark_of("-3") is None
    assert watermark_of("1e3") is None
    assert watermark_of("9" * 40) is None
    assert watermark_of("²") is None  # a digit to str.isdigit, not to int()
    assert watermark_of("١٢") is None
