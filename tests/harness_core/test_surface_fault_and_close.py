"""Fault and close: a failed storage write faults the harness (every later call raises the same
fault; a reopen resumes), and `close()` during a run (Err(Closed) or HarnessClosed, no write,
the run resumable by a new harness).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness_core.errors import HarnessClosed, HarnessFault, SessionError
from harness_core.harness import AgentHarness, AgentLane
from harness_core.messages import TokenUsage
from harness_core.models.scripted import text, tool_call
from harness_core.session.records import OperationFinished, Record
from harness_core.tools import Tool, ToolContext
from tests.support.harness_kit import Kit, make_kit
from tests.support.surface import Waiter, collect, err, in_flight, log_size, ok, records_of, reopen

# -- a failed write faults the harness ----------------------------------------------------------


@dataclass
class Faulted:
    """A harness whose run failed to write `tool_started` (the storage raised `failure`)."""

    kit: Kit
    fault: HarnessFault
    failure: SessionError
    faults: list[Any]
    """The ``fault`` events emitted."""
    calls: list[str]
    """The run ids the tool ran for."""


async def faulted(backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Faulted:
    calls: list[str] = []

    async def execute(args: Any, ctx: ToolContext) -> str:
        calls.append(ctx.run_id)
        return "ran"

    tool = Tool(name="echo", description="echo", execute=execute)
    kit = await make_kit(backend, tmp_path, [tool_call("echo")], tools=[tool])
    recording = kit.recording
    assert recording is not None
    append_record = recording.append_record
    failure = SessionError("storage", "disk full")

    async def failing(record: Record) -> Any:
        if record.type == "tool_started":
            raise failure
        return await append_record(record)

    monkeypatch.setattr(recording, "append_record", failing)
    faults = collect(kit, "fault")
    with pytest.raises(HarnessFault) as caught:
        await kit.harness.prompt("go")
    return Faulted(kit, caught.value, failure, faults, calls)


async def test_a_storage_write_failure_faults_the_harness(backend, tmp_path, monkeypatch) -> None:
    run = await faulted(backend, tmp_path, monkeypatch)
    assert run.fault.__cause__ is run.failure
    assert [e.message for e in run.faults] == ["disk full"]
    assert run.calls == []  # the durability point failed: the tool never started


async def test_a_procedure_s_failure_after_a_fault_is_not_asyncio_s_to_report(
    backend, tmp_path, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis died under 25 runs: each run's procedure task failed with the fault after its
    caller stopped waiting, and asyncio printed "Task exception was never retrieved" 25
    times, tracebacks in the JSON log. The fault is the harness's to report, and is."""
    run = await faulted(backend, tmp_path, monkeypatch)

    async def fails() -> None:
        raise run.fault

    task = run.kit.harness._rt.spawn(fails())
    await asyncio.wait([task])
    del task
    gc.collect()
    await asyncio.sleep(0)
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


async def _lane_main(harness: AgentHarness) -> Any:
    return await harness.lane("main")


CALLS_AFTER_A_FAULT: dict[str, Callable[[AgentHarness], Awaitable[Any]]] = {
    "prompt": lambda harness: harness.prompt("again"),
    "steer": lambda harness: harness.steer("x"),
    "abort": lambda harness: harness.abort(),
    "get_model": lambda harness: harness.get_model(),
    "lanes": lambda harness: harness.lanes(),
    "info": lambda harness: harness.info(),
    "watch": lambda harness: harness.watch(),
    "session.get_entry": lambda harness: harness.session.get_entry("x"),
    "lane": _lane_main,
}


@pytest.mark.parametrize("member", list(CALLS_AFTER_A_FAULT))
async def test_after_a_fault_every_call_raises_the_same_fault(
    member: str, backend, tmp_path, monkeypatch
) -> None:
    run = await faulted(backend, tmp_path, monkeypatch)
    with pytest.raises(HarnessFault) as again:
        await CALLS_AFTER_A_FAULT[member](run.kit.harness)
    assert again.value is run.fault


async def test_after_a_fault_a_reopen_resumes_the_run(backend, tmp_path, monkeypatch) -> None:
    run = await faulted(backend, tmp_path, monkeypatch)
    # the store is a valid prefix: a new process restores it and resume completes the run
    fresh_kit = await reopen(run.kit, "r-", script=[text("recovered")])
    [suspended] = fresh_kit.suspended
    assert (suspended.reason, suspended.missing_tools) == ("crash", ())
    outcome = ok(await fresh_kit.harness.resume())
    assert outcome.kind == "completed" and outcome.run_id == suspended.id
    assert run.calls == [suspended.id]  # no tool_started existed: the call ran in full, once
    assert [r.outcome for r in await records_of(fresh_kit, OperationFinished)] == ["completed"]


# -- close during a run -------------------------------------------------------------------------


@dataclass
class Closed:
    """A harness closed while its run's tool was in flight (and a side lane)."""

    kit: Kit
    side: AgentLane
    waiter: Waiter
    before: int
    """The log's size when the harness was closed."""


async def closed_mid_run(backend: str, tmp_path: Path) -> Closed:
    waiter = Waiter()
    kit = await make_kit(backend, tmp_path, [tool_call("wait")], tools=[waiter.tool])
    side = ok(await kit.harness.create_lane("side", None))
    task = await in_flight(kit, waiter)
    before = await log_size(kit)
    await kit.harness.close()
    with pytest.raises(HarnessClosed):
        await task
    return Closed(kit, side, waiter, before)


async def test_close_during_a_run(backend, tmp_path) -> None:
    closed = await closed_mid_run(backend, tmp_path)  # the run's caller saw HarnessClosed
    await closed.kit.harness.close()  # a second close is a no-op
    assert await log_size(closed.kit) == closed.before, "closing wrote nothing"
    # the operation stays open and resumable by a new harness
    fresh_kit = await reopen(closed.kit, "r-", script=[text("recovered")])
    [suspended] = fresh_kit.suspended
    assert (suspended.lane, suspended.reason) == ("main", "crash")
    assert ok(await fresh_kit.harness.resume()).kind == "completed"
    assert closed.waiter.calls == 1


ClosedCall = Callable[[AgentHarness, AgentLane], Awaitable[Any]]

RESULT_CALLS_AFTER_CLOSE: dict[str, ClosedCall] = {
    "prompt": lambda harness, side: harness.prompt("x"),
    "resume": lambda harness, side: harness.resume(),
    "abort": lambda harness, side: harness.abort(),
    "compact": lambda harness, side: harness.compact(),
    "navigate_tree": lambda harness, side: harness.navigate_tree(None),
    "steer": lambda harness, side: harness.steer("x"),
    "follow_up": lambda harness, side: harness.follow_up("x"),
    "next_run": lambda harness, side: harness.next_run("x"),
    "cancel_queued": lambda harness, side: harness.cancel_queued("x"),
    "record_usage": lambda harness, side: harness.record_usage(TokenUsage()),
    "create_lane": lambda harness, side: harness.create_lane("third", None),
    "side.prompt": lambda harness, side: side.prompt("x"),
}


@pytest.mark.parametrize("member", list(RESULT_CALLS_AFTER_CLOSE))
async def test_after_close_result_returning_calls_resolve_err_closed(
    member: str, backend, tmp_path
) -> None:
    closed = await closed_mid_run(backend, tmp_path)
    err(await RESULT_CALLS_AFTER_CLOSE[member](closed.kit.harness, closed.side), "Closed")
    assert await log_size(closed.kit) == closed.before


RAISING_CALLS_AFTER_CLOSE: dict[str, ClosedCall] = {
    "get_model": lambda harness, side: harness.get_model(),
    "get_leaf_id": lambda harness, side: harness.get_leaf_id(),
    "set_thinking_level": lambda harness, side: harness.set_thinking_level("high"),
    "wait_for_idle": lambda harness, side: harness.wait_for_idle(),
    "watch": lambda harness, side: harness.watch(),
    "lanes": lambda harness, side: harness.lanes(),
    "side.info": lambda harness, side: side.info(),
    "session.get_entry": lambda harness, side: harness.session.get_entry("x"),
    "side.get_active_tools": lambda harness, side: side.get_active_tools(),
}


@pytest.mark.parametrize("member", list(RAISING_CALLS_AFTER_CLOSE))
async def test_after_close_other_calls_raise_harness_closed(member: str, backend, tmp_path) -> None:
    closed = await closed_mid_run(backend, tmp_path)
    with pytest.raises(HarnessClosed):
        await RAISING_CALLS_AFTER_CLOSE[member](closed.kit.harness, closed.side)
    assert await log_size(closed.kit) == closed.before


# -- close while a write or a commit is in flight -----------------------------------------------


async def _ran(args: Any, ctx: ToolContext) -> str:
    return "ran"


ECHO = Tool(name="echo", description="echo", execute=_ran)


async def closed_during(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str
) -> tuple[Kit, list[Any]]:
    """Close the harness while its run's procedure waits in `method` (a slow disk)."""
    kit = await make_kit(backend, tmp_path, [tool_call("echo"), text("done")], tools=[ECHO])
    recording = kit.recording
    assert recording is not None
    original = getattr(recording, method)
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(*args: Any, **kwargs: Any) -> Any:
        blocks = method == "sync" or args[0].type == "tool_started"  # inside the procedure
        if blocks and not entered.is_set():
            entered.set()
            await release.wait()
        return await original(*args, **kwargs)

    monkeypatch.setattr(recording, method, slow)
    faults = collect(kit, "fault")
    task = asyncio.create_task(kit.harness.prompt("go"))
    async with asyncio.timeout(10):
        await entered.wait()
    await kit.harness.close()
    release.set()
    with pytest.raises(HarnessClosed):
        await task
    monkeypatch.setattr(recording, method, original)
    return kit, faults


@pytest.mark.parametrize("method", ["append_record", "sync"])
async def test_closing_while_a_write_or_commit_is_in_flight_is_not_a_fault(
    method: str, backend, tmp_path, monkeypatch
) -> None:
    kit, faults = await closed_during(backend, tmp_path, monkeypatch, method)
    assert faults == []  # a close is not a storage failure
    with pytest.raises(HarnessClosed):  # not HarnessFault
        await kit.harness.get_model()
    fresh_kit = await reopen(kit, "r-", script=[text("recovered")])
    [suspended] = fresh_kit.suspended  # the operation stays open and resumable
    outcome = ok(await fresh_kit.harness.resume())
    assert (outcome.kind, outcome.run_id) == ("completed", suspended.id)


async def test_a_caller_cancelling_its_create_lane_mid_write_is_not_a_fault(
    backend, tmp_path, monkeypatch
) -> None:
    kit = await make_kit(backend, tmp_path, [text("still here")])
    recording = kit.recording
    assert recording is not None
    original, entered = recording.create_lane, asyncio.Event()

    async def slow(*args: Any) -> Any:
        entered.set()
        await asyncio.Event().wait()  # a disk that never answers; the caller gives up
        return await original(*args)

    monkeypatch.setattr(recording, "create_lane", slow)
    faults = collect(kit, "fault")
    task = asyncio.create_task(kit.harness.create_lane("side", None))
    async with asyncio.timeout(10):
        await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    monkeypatch.setattr(recording, "create_lane", original)
    assert faults == []  # the write never landed: nothing failed, nothing to fault
    assert ok(await kit.harness.create_lane("side", None)).name == "side"
    assert ok(await kit.harness.prompt("go")).kind == "completed"
