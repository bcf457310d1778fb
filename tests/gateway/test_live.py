"""The live publisher: harness events -> a thread's progress and streamed text, never in the way.

Real harnesses (SQLite store, the scripted model streaming its answer in chunks) and a real
`EventBus` fed by hand where the exact order of events matters; the channels are small `LiveView`s
that record, hang or raise. Time is a `ManualClock`: the throttle is checked by moving it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from adapters import LiveUpdate, ThreadRef
from gateway.live import THINKING, LivePublisher, _status, live_views
from harness_core import AgentLane, AssistantMessage, Ok, TextPart, TokenUsage
from harness_core.events import (
    EventBus,
    MessageUpdate,
    RetryScheduled,
    RunEnd,
    ToolStart,
    TurnStart,
)
from harness_core.models.scripted import Reply, streamed, text, tool_call
from harness_core.testing import ManualClock
from harness_core.tools import Tool
from tests.support.harness_kit import Kit, make_kit

pytestmark = pytest.mark.timeout(30)

WEB = ThreadRef(channel="web", space="default", thread="t1")
MAIL = ThreadRef(channel="email", space="bot@example.com", thread="<root@example.com>")
ANSWER = "Deploys are open Tuesday to Thursday; the next window opens at 10:00."


class Recorder:
    """A channel that shows every update at once and remembers them."""

    def __init__(self) -> None:
        self.updates: list[LiveUpdate] = []

    async def show(self, update: LiveUpdate) -> None:
        self.updates.append(update)

    def kinds(self) -> list[str]:
        return [u.kind for u in self.updates]

    def statuses(self) -> list[str | None]:
        return [u.status for u in self.updates if u.kind == "progress"]

    def text(self) -> str:
        """The answer as a page would assemble it from the text updates."""
        shown = ""
        step = -1
        for u in self.updates:
            if u.kind != "text":
                continue
            if u.step != step:
                step, shown = u.step, ""
            assert u.offset <= len(shown)
            shown = shown[: u.offset] + u.text
        return shown


class Gated(Recorder):
    """A channel whose `show` waits for `gate` (a slow channel)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.entered = 0

    async def show(self, update: LiveUpdate) -> None:
        self.entered += 1
        await self.gate.wait()
        await super().show(update)


class Broken:
    """A channel whose `show` always raises."""

    def __init__(self) -> None:
        self.calls = 0

    async def show(self, update: LiveUpdate) -> None:
        self.calls += 1
        raise RuntimeError("the channel is down")


async def new_lane(kit: Kit, thread: ThreadRef) -> AgentLane:
    created = await kit.harness.create_lane(thread.lane, None)
    assert isinstance(created, Ok)
    return created.value


async def until(condition: Callable[[], bool]) -> None:
    while not condition():  # noqa: ASYNC110 - polled: the condition has no event
        await asyncio.sleep(0.001)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def threads(*refs: ThreadRef) -> Callable[[str], asyncio.Future[ThreadRef | None]]:
    by_lane = {ref.lane: ref for ref in refs}

    def thread_of(lane: str) -> asyncio.Future[ThreadRef | None]:
        future: asyncio.Future[ThreadRef | None] = asyncio.get_running_loop().create_future()
        future.set_result(by_lane.get(lane))
        return future

    return thread_of


def update(lane: str, written: str, run_id: str = "r1") -> MessageUpdate:
    message = AssistantMessage(
        content=(TextPart(text=written),), stop_reason="stop", usage=TokenUsage()
    )
    return MessageUpdate(lane=lane, run_id=run_id, message=message)


def tool(lane: str, name: str) -> ToolStart:
    return ToolStart(lane=lane, run_id="r1", tool_call_id=f"c-{name}", tool_name=name, args={})


async def test_a_streamed_run_shows_progress_then_its_text_in_order_then_done(
    tmp_path: Path,
) -> None:
    kit = await make_kit("sqlite", tmp_path, [streamed(ANSWER, chunk_chars=5, pause_ms=1)])
    view = Recorder()
    live = LivePublisher({"web": view}, kit.clock)
    off = live.watch(kit.harness.events, threads(WEB))
    lane = await new_lane(kit, WEB)
    outcome = await lane.prompt("when can I deploy?")
    assert isinstance(outcome, Ok) and outcome.value.kind == "completed"
    await until(lambda: "done" in view.kinds())
    off()

    assert view.updates[0].kind == "progress" and view.updates[0].status == THINKING
    assert view.kinds()[-1] == "done"
    assert view.text() == ANSWER
    texts = [u for u in view.updates if u.kind == "text"]
    assert len(texts) > 1  # streamed: more than one update before the end
    assert {u.thread for u in view.updates} == {WEB}
    assert {u.run_id for u in view.updates} == {outcome.value.run_id}
    await live.close()


async def test_progress_is_throttled_to_one_a_second_per_thread_and_the_latest_wins() -> None:
    clock = ManualClock()
    bus = EventBus()
    view = Recorder()
    live = LivePublisher({"web": view}, clock)
    live.watch(bus, threads(WEB))

    bus.emit(tool(WEB.lane, "tickets.search"))
    await until(lambda: len(view.updates) == 1)
    bus.emit(tool(WEB.lane, "tickets.get"))
    bus.emit(tool(WEB.lane, "tickets.create"))
    await settle()
    assert view.statuses() == ["is running tickets.search…"]  # within the second: held
    clock.advance(999)
    await settle()
    assert view.statuses() == ["is running tickets.search…"]
    clock.advance(1)
    await until(lambda: len(view.updates) == 2)
    assert view.statuses() == ["is running tickets.search…", "is running tickets.create…"]
    assert view.updates[1].at_ms - view.updates[0].at_ms >= 1000
    await live.close()


async def test_threads_are_throttled_apart() -> None:
    clock = ManualClock()
    bus = EventBus()
    view = Recorder()
    other = WEB.model_copy(update={"thread": "t2"})
    live = LivePublisher({"web": view}, clock)
    live.watch(bus, threads(WEB, other))
    bus.emit(tool(WEB.lane, "a"))
    bus.emit(tool(other.lane, "b"))
    await until(lambda: len(view.updates) == 2)
    assert {(u.thread.thread, u.status) for u in view.updates} == {
        ("t1", "is running a…"),
        ("t2", "is running b…"),
    }
    await live.close()


async def test_text_written_while_the_channel_is_busy_goes_as_one_update_from_its_offset() -> None:
    bus = EventBus()
    view = Gated()
    live = LivePublisher({"web": view}, ManualClock())
    live.watch(bus, threads(WEB))
    bus.emit(update(WEB.lane, "He"))
    await until(lambda: view.entered == 1)
    for written in ("Hell", "Hello", "Hello, wor", "Hello, world"):
        bus.emit(update(WEB.lane, written))
    bus.emit(RunEnd(lane=WEB.lane, run_id="r1", outcome="completed", leaf_id=None))
    view.gate.set()
    await until(lambda: "done" in view.kinds())
    texts = [(u.offset, u.text) for u in view.updates if u.kind == "text"]
    assert texts == [(0, "He"), (2, "llo, world")]
    assert view.kinds() == ["text", "text", "done"]
    await live.close()


async def test_a_new_model_request_starts_its_text_again() -> None:
    bus = EventBus()
    view = Recorder()
    live = LivePublisher({"web": view}, ManualClock())
    live.watch(bus, threads(WEB))
    bus.emit(update(WEB.lane, "Let me look that up."))
    await until(lambda: len(view.updates) == 1)
    bus.emit(TurnStart(lane=WEB.lane, run_id="r1", turn_id="turn-2"))
    bus.emit(update(WEB.lane, "Found it"))
    await until(lambda: view.text() == "Found it")
    first, *_, last = [u for u in view.updates if u.kind == "text"]
    assert last.offset == 0 and last.step > first.step
    await live.close()


async def test_a_channel_that_hangs_never_slows_the_run(tmp_path: Path) -> None:
    view = Gated()  # its gate never opens

    async def lookup(args: object, ctx: object) -> str:
        await until(lambda: view.entered == 1)  # the run goes on while the channel hangs
        return "found"

    tools = [Tool(name="lookup", description="d", execute=lookup)]
    script: list[Reply] = [tool_call("lookup", {}), streamed(ANSWER, chunk_chars=4, pause_ms=0)]
    kit = await make_kit("sqlite", tmp_path, script, tools)
    live = LivePublisher({"web": view}, kit.clock, show_timeout_s=3600)
    live.watch(kit.harness.events, threads(WEB))
    lane = await new_lane(kit, WEB)
    outcome = await lane.prompt("look it up")
    assert isinstance(outcome, Ok) and outcome.value.kind == "completed"
    assert view.entered == 1 and view.updates == []  # still stuck in its first show
    await live.close()


async def test_a_channel_that_raises_never_fails_the_run(tmp_path: Path) -> None:
    kit = await make_kit("sqlite", tmp_path, [streamed(ANSWER, chunk_chars=6, pause_ms=1)])
    view = Broken()
    live = LivePublisher({"web": view}, kit.clock)
    live.watch(kit.harness.events, threads(WEB))
    lane = await new_lane(kit, WEB)
    outcome = await lane.prompt("hi")
    assert isinstance(outcome, Ok) and outcome.value.kind == "completed"
    await until(lambda: live.failed >= 2)
    assert live.failed == view.calls and live.shown == 0
    await live.close()


async def test_a_thread_whose_channel_shows_nothing_live_is_sent_nothing(tmp_path: Path) -> None:
    kit = await make_kit("sqlite", tmp_path, [text("a reply by email")])
    web = Recorder()
    live = LivePublisher(live_views({"web": web, "email": object()}), kit.clock)
    live.watch(kit.harness.events, threads(MAIL))
    lane = await new_lane(kit, MAIL)
    outcome = await lane.prompt("hi")
    assert isinstance(outcome, Ok) and outcome.value.kind == "completed"
    await settle()
    assert web.updates == [] and live.shown == 0 and live.failed == 0


def test_a_retry_says_how_long_it_waits_and_nothing_when_it_does_not() -> None:
    def retry(delay_ms: int) -> RetryScheduled:
        return RetryScheduled(
            lane="l",
            run_id="r",
            step="assistant",
            attempt=1,
            max_attempts=3,
            delay_ms=delay_ms,
            error_message="",
        )

    assert _status(retry(4000)) == "is retrying in 4 s (attempt 2 of 3)…"
    assert _status(retry(0)) == "is retrying (attempt 2 of 3)…"
    assert _status(retry(500)) == "is retrying in 1 s (attempt 2 of 3)…"  # never "in 0 s"
