"""Attempts and stuck lanes: every resume of an interrupted operation is a counted, durable
attempt; at `max_attempts` the lane is parked stuck for an operator; `lanes()` says which lanes
failed, are stuck or cannot be restored (faulted) and why."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from harness_core.errors import HarnessFault
from harness_core.models.scripted import deferred, error, text, tool_calls
from harness_core.options import RetryPolicy
from harness_core.result import Err, Ok
from harness_core.session.records import OperationResumed, QueueCancelled
from harness_core.session.types import StoredRecord
from harness_core.testing.builders import operation_started
from harness_core.tools import Tool, ToolContext
from tests.support.harness_kit import Kit, make_kit


class CrashingTool:
    """A ``replay="safe"`` tool that 'kills its process' (hangs forever) the first `n` times."""

    def __init__(self, crashes: int) -> None:
        self.crashes = crashes
        self.runs = 0
        self.started = asyncio.Event()

    def tool(self) -> Tool:
        async def work(args: Any, ctx: ToolContext) -> str:
            self.runs += 1
            if self.runs <= self.crashes:
                self.started.set()
                await asyncio.Event().wait()  # the process dies here
            return "worked"

        return Tool(name="work", description="work", execute=work, replay="safe")


async def crash_in_tool(kit: Kit, crashing: CrashingTool, start: Any) -> tuple[Kit, Any]:
    """Start `start` on `kit`, wait until the tool 'kills the process', open a new process."""
    crashing.started.clear()
    task = asyncio.ensure_future(start(kit))
    await crashing.started.wait()
    reopened = await kit.reopen(script=[text("done")], tools=[crashing.tool()])
    return reopened, task


async def resumed_records(kit: Kit) -> list[OperationResumed]:
    return [
        i.record
        for i in await kit.storage.get_log()
        if isinstance(i, StoredRecord) and isinstance(i.record, OperationResumed)
    ]


async def test_a_crash_looping_safe_tool_parks_the_lane_stuck_after_max_attempts(
    backend: str, tmp_path: Path
) -> None:
    crashing = CrashingTool(crashes=3)
    kit = await make_kit(
        backend, tmp_path, [tool_calls(("work", {}, "c1"))], tools=[crashing.tool()]
    )
    tasks = []
    kit, task = await crash_in_tool(kit, crashing, lambda k: k.harness.prompt("go"))
    tasks.append(task)
    for attempt in (2, 3):
        (suspended,) = kit.suspended
        assert (suspended.reason, suspended.attempts, suspended.stuck) == (
            "crash",
            attempt - 1,
            False,
        )
        kit, task = await crash_in_tool(kit, crashing, lambda k: k.harness.resume())
        tasks.append(task)
        assert [r.attempt for r in await resumed_records(kit)][-1] == attempt
    assert crashing.runs == 3  # the first execution and two counted resumes

    (suspended,) = kit.suspended
    assert (suspended.attempts, suspended.stuck) == (3, True)
    (info,) = await kit.harness.lanes()
    assert (info.status, info.suspended, info.attempts) == ("stuck", "crash", 3)
    before = len(await kit.storage.get_log())
    refused = await kit.harness.resume()
    assert isinstance(refused, Err) and refused.error.tag == "LaneStuck"
    stuck = refused.error
    assert (stuck.attempts, stuck.max_attempts) == (3, 3)  # type: ignore[union-attr]
    assert stuck.last_activity == "running tool 'work'"  # type: ignore[union-attr]
    assert "interrupted 3 times" in stuck.message and "unstick=True" in stuck.message
    assert len(await kit.storage.get_log()) == before and crashing.runs == 3  # nothing ran

    fixed = await kit.harness.resume(unstick=True)  # the operator fixed the cause
    assert isinstance(fixed, Ok) and fixed.value.kind == "completed"
    assert crashing.runs == 4
    last = (await resumed_records(kit))[-1]
    assert (last.attempt, last.unstick) == (1, True)
    assert (await kit.harness.lanes())[0].status == "idle"
    for task in tasks:
        task.cancel()


async def test_max_attempts_is_an_option_and_abort_always_works_on_a_stuck_lane(
    backend: str, tmp_path: Path
) -> None:
    crashing = CrashingTool(crashes=5)
    kit = await make_kit(
        backend, tmp_path, [tool_calls(("work", {}, "c1"))], tools=[crashing.tool()],
        max_attempts=1,
    )  # fmt: skip
    kit, task = await crash_in_tool(kit, crashing, lambda k: k.harness.prompt("go"))
    (suspended,) = kit.suspended
    assert suspended.stuck and suspended.attempts == 1
    assert isinstance(await kit.harness.resume(), Err)
    assert isinstance(await kit.harness.abort(), Ok)
    await kit.harness.wait_for_idle()
    (info,) = await kit.harness.lanes()
    assert (info.status, info.last_outcome) == ("idle", "aborted")
    assert await resumed_records(kit) == []  # an abort is not an attempt
    task.cancel()


async def test_waiting_for_a_provider_or_a_person_is_not_an_attempt(
    backend: str, tmp_path: Path
) -> None:
    kit = await make_kit(backend, tmp_path, [deferred("resp_1")], max_attempts=1)
    parked = await kit.harness.prompt("slow")
    assert isinstance(parked, Ok) and parked.value.kind == "suspended"
    for _ in range(3):  # polls of a pending background request
        reopened = await kit.reopen()
        (suspended,) = reopened.suspended
        assert (suspended.reason, suspended.stuck) == ("deferred", False)
        polled = await reopened.harness.resume()
        assert isinstance(polled, Ok) and polled.value.kind == "suspended"
        kit = reopened
    assert await resumed_records(kit) == []


async def test_lanes_report_failed_with_the_error_until_the_next_operation(
    backend: str, tmp_path: Path
) -> None:
    kit = await make_kit(
        backend,
        tmp_path,
        [error("auth", retryable=False, message="bad key"), text("fine now")],
    )
    failed = await kit.harness.prompt("hello")
    assert isinstance(failed, Ok) and failed.value.kind == "failed"
    (info,) = await kit.harness.lanes()
    assert (info.status, info.last_outcome) == ("failed", "failed")
    assert info.error is not None and info.error.code == "auth"
    restored = await kit.reopen()
    (again,) = await restored.harness.lanes()
    assert (again.status, again.error) == ("failed", info.error)  # restore reads it back
    assert isinstance(await restored.harness.prompt("retry"), Ok)
    (now,) = await restored.harness.lanes()
    assert (now.status, now.last_outcome, now.error) == ("idle", "completed", None)


async def test_a_lane_whose_log_is_impossible_is_faulted_and_the_others_keep_working(
    backend: str, tmp_path: Path
) -> None:
    kit = await make_kit(backend, tmp_path, [text("a1")])
    lane = await kit.harness.create_lane("slack:C1:1.0", None)
    assert isinstance(lane, Ok)
    # another writer retracted a queue item that never existed on that lane
    await kit.storage.append_record(
        QueueCancelled(id="bad", lane="slack:C1:1.0", run_id=None, entry_id="nothing")
    )
    reopened = await kit.reopen(script=[text("main still answers")])
    infos = {i.name: i for i in await reopened.harness.lanes()}
    broken = infos["slack:C1:1.0"]
    assert broken.status == "faulted" and broken.fault is not None
    assert "cancel_unknown_item" in broken.fault
    assert infos["main"].status == "idle"
    faulted = await reopened.harness.lane("slack:C1:1.0")
    assert faulted is not None
    with pytest.raises(HarnessFault):
        await faulted.prompt("hello")
    with pytest.raises(HarnessFault):
        await faulted.get_leaf_id()
    answered = await reopened.harness.prompt("hello main")
    assert isinstance(answered, Ok) and answered.value.kind == "completed"


async def test_a_lane_whose_open_operation_started_from_a_lost_entry_is_faulted(
    backend: str, tmp_path: Path
) -> None:
    """A store that went back in time (Redis restarted empty while a stale writer wrote) held
    an open run started from an entry it no longer had: its restore failed the whole session,
    every lane of it, at every take."""
    kit = await make_kit(backend, tmp_path, [text("a1")])
    lane = await kit.harness.create_lane("web:t4", None)
    assert isinstance(lane, Ok)
    await kit.storage.append_record(
        operation_started("run-lost", lane="web:t4", source_leaf_id="lost-entry")
    )
    reopened = await kit.reopen(script=[text("main still answers")])
    infos = {i.name: i for i in await reopened.harness.lanes()}
    assert infos["web:t4"].status == "faulted"
    assert "leaf_mismatch" in (infos["web:t4"].fault or "")
    answered = await reopened.harness.prompt("hello main")
    assert isinstance(answered, Ok) and answered.value.kind == "completed"


async def test_the_reducer_refuses_attempts_that_do_not_follow(
    backend: str, tmp_path: Path
) -> None:
    crashing = CrashingTool(crashes=1)
    kit = await make_kit(
        backend, tmp_path, [tool_calls(("work", {}, "c1"))], tools=[crashing.tool()]
    )
    kit, task = await crash_in_tool(kit, crashing, lambda k: k.harness.prompt("go"))
    (suspended,) = kit.suspended
    await kit.storage.append_record(
        OperationResumed(id="skip", lane="main", run_id=suspended.id, attempt=5)
    )
    reopened = await kit.reopen()
    (info,) = await reopened.harness.lanes()
    assert info.status == "faulted" and "attempts_not_consecutive" in (info.fault or "")
    task.cancel()


async def test_max_attempts_may_be_a_function_of_the_lane(backend: str, tmp_path: Path) -> None:
    crashing = CrashingTool(crashes=2)
    caps = {"main": 3, "strict": 1}
    kit = await make_kit(
        backend, tmp_path, [tool_calls(("work", {}, "c1")), tool_calls(("work", {}, "c2"))],
        tools=[crashing.tool()], max_attempts=caps.__getitem__,
    )  # fmt: skip
    strict = await kit.harness.create_lane("strict", None)
    assert isinstance(strict, Ok)
    tasks = [asyncio.ensure_future(kit.harness.prompt("go"))]
    await crashing.started.wait()
    crashing.started.clear()
    tasks.append(asyncio.ensure_future(strict.value.prompt("go")))
    await crashing.started.wait()  # both lanes are inside the tool: the process dies
    kit = await kit.reopen(script=[text("done")], tools=[crashing.tool()])
    by_lane = {op.lane: op for op in kit.suspended}
    assert (by_lane["strict"].attempts, by_lane["strict"].stuck) == (1, True)
    assert (by_lane["main"].attempts, by_lane["main"].stuck) == (1, False)
    assert {i.name: i.status for i in await kit.harness.lanes()} == {
        "main": "suspended",
        "strict": "stuck",
    }
    lane = await kit.harness.lane("strict")
    assert lane is not None
    refused = await lane.resume()
    assert isinstance(refused, Err) and refused.error.tag == "LaneStuck"
    assert refused.error.max_attempts == 1  # type: ignore[union-attr]
    resumed = await kit.harness.resume()
    assert isinstance(resumed, Ok) and resumed.value.kind == "completed"
    for task in tasks:
        task.cancel()


def test_a_spread_policy_spreads_lanes_refused_together() -> None:
    """Six lanes refused 503 together came back within 70 ms of each other, and six told
    Retry-After: 20 at the same instant (D312)."""
    policy = RetryPolicy(jitter=0.2)
    backoffs = {policy.delay_ms(1, spread=f"run-{n}:assistant") for n in range(50)}
    assert all(800 <= d <= 1000 for d in backoffs) and max(backoffs) - min(backoffs) > 100
    hinted = {policy.delay_ms(1, 20_000, spread=f"run-{n}:assistant") for n in range(50)}
    assert all(20_000 <= d <= 24_000 for d in hinted) and max(hinted) - min(hinted) > 2_000
    # fixed per run and attempt: a replay after a crash waits as long; no randomness recorded
    assert policy.delay_ms(2, spread="run-1:assistant") == policy.delay_ms(
        2, spread="run-1:assistant"
    )
    assert RetryPolicy().delay_ms(1, spread="run-1:assistant") == 1_000  # none by default
    assert policy.delay_ms(1, 10**9, spread="x") == 60_000  # the cap still holds
