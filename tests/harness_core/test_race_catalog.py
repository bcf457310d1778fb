"""Tier C race catalog: both orders of every row of reference §10.3, built with manual drive.

Each test parks the procedure at the action the race is about, calls the lane surface before or
after releasing it, and asserts the one legal history of that order (and nothing else).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness_core import ScriptedModel
from harness_core._runtime.gate import ActionInfo
from harness_core.approvals import approve, deny
from harness_core.harness import AgentLane
from harness_core.hooks import BeforeRunEndEvent, BeforeRunEndResult
from harness_core.messages import UserMessage, message_text
from harness_core.models import ModelRef
from harness_core.models.scripted import text, tool_call
from harness_core.result import Err, Ok, Outcome
from harness_core.session.entries import CustomEntry, MessageEntry
from harness_core.session.records import (
    AbortRequested,
    ApprovalDecided,
    OperationFinished,
    OperationResumed,
    OperationStarted,
    QueueEnqueued,
    RunIntent,
    WriteDeferred,
)
from harness_core.session.types import LogItem, RecordQuery, StoredEntry, StoredRecord
from harness_core.tools import Tool, ToolContext
from tests.support.harness_kit import Kit, make_kit
from tests.support.manual import started
from tests.support.matrix_coverage import RACE_ORDERS

ORDERS = ["surface first", "effect first"]
"""Surface first: the lane call lands before the parked action is released; effect first: after."""


def covered(row: str, order: str) -> None:
    RACE_ORDERS.setdefault(row, set()).add(order)


async def until(lane: AgentLane, wanted: Callable[[ActionInfo], bool]) -> ActionInfo:
    """Release actions until the parked one is `wanted` (which stays parked)."""
    while True:
        action = await lane.peek_action()
        assert action is not None, "the procedure settled before the wanted action"
        if wanted(action):
            return action
        await lane.execute_action()


def kind(action_kind: str, **detail: Any) -> Callable[[ActionInfo], bool]:
    return lambda a: a.kind == action_kind and all(a.detail.get(k) == v for k, v in detail.items())


async def log(kit: Kit) -> tuple[LogItem, ...]:
    return await kit.storage.get_log()


def records(items: tuple[LogItem, ...], kind_: type[Any]) -> list[Any]:
    return [i.record for i in items if isinstance(i, StoredRecord) and isinstance(i.record, kind_)]


def said(items: tuple[LogItem, ...]) -> list[str]:
    return [
        message_text(i.entry.message)
        for i in items
        if isinstance(i, StoredEntry) and isinstance(i.entry, MessageEntry)
    ]


def inputs(entries: Any) -> list[str]:
    return [message_text(e.message) for e in entries if isinstance(e, MessageEntry)]


class Gated:
    """A tool that waits for `release` and counts its runs; sees the abort signal."""

    def __init__(self) -> None:
        self.running = asyncio.Event()
        self.release = asyncio.Event()
        self.runs = 0
        self.saw_abort = False

    async def __call__(self, args: Any, ctx: ToolContext) -> str:
        self.runs += 1
        self.running.set()
        waiting = asyncio.ensure_future(self.release.wait())
        aborted = asyncio.ensure_future(ctx.abort.wait())
        await asyncio.wait({waiting, aborted}, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        aborted.cancel()
        self.saw_abort = ctx.abort.is_set()
        return "stopped early" if self.saw_abort else "finished"


def look_tool(body: Any = None) -> Tool:
    async def look(args: Any, ctx: ToolContext) -> str:
        return "looked"

    return Tool(name="look", description="looks", execute=body or look, replay="never")


async def manual(backend: str, tmp_path: Path, script: list[Any], **options: Any) -> Kit:
    return await make_kit(backend, tmp_path, script, drive="manual", **options)


# -- 1: prompt vs prompt ---------------------------------------------------------------------------


@pytest.mark.parametrize("order", ORDERS)
async def test_1_prompt_vs_prompt(backend: str, tmp_path: Path, order: str) -> None:
    kit = await manual(backend, tmp_path, [text("one"), text("two")])
    first, second = ("a", "b") if order == "surface first" else ("b", "a")
    running = await started(kit.harness, kit.harness.prompt(first))
    before = await log(kit)
    busy = await kit.harness.prompt(second)
    assert isinstance(busy, Err) and busy.error.tag == "LaneBusy"
    assert await log(kit) == before  # the loser wrote nothing
    await kit.harness.run_to_completion()
    assert isinstance(await running, Ok)
    assert said(await log(kit))[0] == first
    covered("1 prompt vs prompt", order)


# -- 2: steer / follow-up vs run finish ------------------------------------------------------------


@pytest.mark.parametrize("queue", ["steer", "follow_up"])
@pytest.mark.parametrize("order", ORDERS)
async def test_2_queued_input_vs_run_finish(
    backend: str, tmp_path: Path, order: str, queue: str
) -> None:
    kit = await manual(backend, tmp_path, [text("first answer"), text("second answer")])
    running = await started(kit.harness, kit.harness.prompt("go"))
    await until(kit.harness, kind("try_finish_run"))
    if order == "effect first":
        await kit.harness.execute_action()  # the finish wins
        refused = await getattr(kit.harness, queue)("late input")
        assert isinstance(refused, Err) and refused.error.tag == "NoActiveRun"
        await kit.harness.run_to_completion()
        assert "late input" not in said(await log(kit))
    else:
        accepted = await getattr(kit.harness, queue)("late input")
        assert isinstance(accepted, Ok)
        assert await kit.harness.execute_action() is not None  # "continue": the run goes on
        await kit.harness.run_to_completion()
        assert said(await log(kit))[-2:] == ["late input", "second answer"]
    outcome = await running
    assert isinstance(outcome, Ok) and outcome.value.kind == "completed"
    covered(f"2 {queue} vs run finish", order)


# -- 3: deferred write vs run finish ---------------------------------------------------------------


@pytest.mark.parametrize("order", ORDERS)
async def test_3_deferred_write_vs_run_finish(backend: str, tmp_path: Path, order: str) -> None:
    kit = await manual(backend, tmp_path, [text("answer")])
    running = await started(kit.harness, kit.harness.prompt("go"))
    await until(kit.harness, kind("try_finish_run"))
    if order == "effect first":
        await kit.harness.run_to_completion()
        await running
    write = asyncio.ensure_future(kit.harness.session.append_custom_entry("note", {"n": 1}))
    if order == "surface first":  # the write is deferred before the run moves on
        async with asyncio.timeout(10):
            while not records(await log(kit), WriteDeferred):  # noqa: ASYNC110
                await asyncio.sleep(0)
    await kit.harness.run_to_completion()
    entry_id = await write
    outcome = await running
    assert isinstance(outcome, Ok)
    items = await log(kit)
    deferred = records(items, WriteDeferred)
    finished = next(
        i.seq for i in items if isinstance(i, StoredRecord) and i.type == "operation_finished"
    )
    applied = next(i.seq for i in items if isinstance(i, StoredEntry) and i.id == entry_id)
    if order == "surface first":
        assert [d.target.id for d in deferred] == [entry_id] and applied < finished
    else:
        assert deferred == [] and applied > finished  # a direct append on the idle lane
    covered("3 deferred write vs run finish", order)


# -- 4: abort vs run finish ------------------------------------------------------------------------


@pytest.mark.parametrize("order", ORDERS)
async def test_4_abort_vs_run_finish(backend: str, tmp_path: Path, order: str) -> None:
    kit = await manual(backend, tmp_path, [text("answer")])
    running = await started(kit.harness, kit.harness.prompt("go"))
    await until(kit.harness, kind("try_finish_run"))
    if order == "effect first":
        await kit.harness.execute_action()
        refused = await kit.harness.abort()
        assert isinstance(refused, Err) and refused.error.tag == "NoActiveOperation"
        await kit.harness.run_to_completion()
        expected = "completed"
    else:
        assert isinstance(await kit.harness.abort(), Ok)
        await kit.harness.run_to_completion()
        expected = "aborted"
    outcome = await running
    assert isinstance(outcome, Ok) and outcome.value.kind == expected
    assert [r.outcome for r in records(await log(kit), OperationFinished)] == [expected]
    covered("4 abort vs run finish", order)


# -- 5: abort vs queue consumption -----------------------------------------------------------------


@pytest.mark.parametrize("order", ORDERS)
async def test_5_abort_vs_queue_consumption(backend: str, tmp_path: Path, order: str) -> None:
    kit = await manual(backend, tmp_path, [tool_call("look"), text("done")], tools=[look_tool()])
    running = await started(kit.harness, kit.harness.prompt("go"))
    await until(kit.harness, kind("execute_tool"))
    steered = await kit.harness.steer("focus")
    assert isinstance(steered, Ok)
    await until(kit.harness, kind("consume_queue_item", queue="steer"))
    if order == "effect first":
        await kit.harness.execute_action()  # consumed: the entry is appended
        aborted = await kit.harness.abort()
        assert isinstance(aborted, Ok) and aborted.value.steer == ()
        assert "focus" in said(await log(kit))
    else:
        aborted = await kit.harness.abort()
        assert isinstance(aborted, Ok)
        assert [e.id for e in aborted.value.steer] == [steered.value]
        await kit.harness.execute_action()  # consumption skips
        assert "focus" not in said(await log(kit))
    await kit.harness.run_to_completion()
    outcome = await running
    assert isinstance(outcome, Ok) and outcome.value.kind == "aborted"
    covered("5 abort vs queue consumption", order)


# -- 6: abort vs before_run_end follow-up ----------------------------------------------------------


@pytest.mark.parametrize("order", ORDERS)
async def test_6_abort_vs_run_end_follow_up(backend: str, tmp_path: Path, order: str) -> None:
    kit = await manual(backend, tmp_path, [text("answer"), text("more")])

    async def once(event: BeforeRunEndEvent) -> BeforeRunEndResult | None:
        return BeforeRunEndResult(follow_up="one more thing")

    kit.harness.hooks.on("before_run_end", once)
    running = await started(kit.harness, kit.harness.prompt("go"))
    await until(kit.harness, kind("commit_run_end_follow_up"))
    if order == "effect first":
        await kit.harness.execute_action()  # committed
        aborted = await kit.harness.abort()
        assert isinstance(aborted, Ok)
        assert inputs(aborted.value.follow_up) == ["one more thing"]
    else:
        aborted = await kit.harness.abort()
        assert isinstance(aborted, Ok) and aborted.value.follow_up == ()
        await kit.harness.execute_action()  # dropped
    await kit.harness.run_to_completion()
    outcome = await running
    assert isinstance(outcome, Ok) and outcome.value.kind == "aborted"
    items = await log(kit)
    marker = next(
        i.seq for i in items if isinstance(i, StoredRecord) and isinstance(i.record, AbortRequested)
    )
    queued = [
        i.seq for i in items if isinstance(i, StoredRecord) and isinstance(i.record, QueueEnqueued)
    ]
    assert all(seq < marker for seq in queued)  # nothing queued behind the marker
    assert len(queued) == (1 if order == "effect first" else 0)
    assert "one more thing" not in said(items)
    covered("6 abort vs before_run_end follow-up", order)


# -- 7: next_run vs acceptance ---------------------------------------------------------------------


@pytest.mark.parametrize("order", ORDERS)
async def test_7_next_run_vs_acceptance(backend: str, tmp_path: Path, order: str) -> None:
    kit = await manual(backend, tmp_path, [text("one"), text("two")])
    if order == "surface first":
        assert isinstance(await kit.harness.next_run("seed"), Ok)
    running = await started(kit.harness, kit.harness.prompt("go"))
    if order == "effect first":
        assert isinstance(await kit.harness.next_run("seed"), Ok)
    await kit.harness.run_to_completion()
    assert isinstance(await running, Ok)
    starts = records(await log(kit), OperationStarted)
    first_inputs = inputs(starts[0].intent.initial_messages)
    if order == "surface first":
        assert first_inputs == ["seed", "go"]
    else:
        assert first_inputs == ["go"]  # it belongs to the next run
        second = await started(kit.harness, kit.harness.prompt("again"))
        await kit.harness.run_to_completion()
        assert isinstance(await second, Ok)
        starts = records(await log(kit), OperationStarted)
        intent = starts[1].intent
        assert isinstance(intent, RunIntent)
        assert inputs(intent.initial_messages) == ["seed", "again"]
    covered("7 next_run vs acceptance", order)


# -- 8: deferred write vs abort close --------------------------------------------------------------


@pytest.mark.parametrize("order", ORDERS)
async def test_8_deferred_write_vs_abort_close(backend: str, tmp_path: Path, order: str) -> None:
    kit = await manual(backend, tmp_path, [tool_call("look"), text("done")], tools=[look_tool()])
    running = await started(kit.harness, kit.harness.prompt("go"))
    await until(kit.harness, kind("execute_tool"))
    writes = []
    if order == "surface first":  # accepted before the abort: applied by reconciliation
        writes.append(asyncio.ensure_future(kit.harness.session.append_custom_entry("n")))
        await asyncio.sleep(0)
    assert isinstance(await kit.harness.abort(), Ok)
    await until(kit.harness, kind("finish_operation", outcome="aborted"))
    if order == "effect first":  # accepted while the close is parked: the close loops
        writes.append(asyncio.ensure_future(kit.harness.session.append_custom_entry("n")))
        await asyncio.sleep(0)
    await kit.harness.run_to_completion()
    outcome = await running
    assert isinstance(outcome, Ok) and outcome.value.kind == "aborted"
    entry_id = await writes[0]
    items = await log(kit)
    finished = [
        i.seq for i in items if isinstance(i, StoredRecord) and i.type == "operation_finished"
    ]
    applied = [i.seq for i in items if isinstance(i, StoredEntry) and i.id == entry_id]
    assert len(finished) == 1 and len(applied) == 1 and applied[0] < finished[0]
    assert isinstance(
        next(i for i in items if isinstance(i, StoredEntry) and i.id == entry_id).entry, CustomEntry
    )
    covered("8 deferred write vs abort close", order)


# -- 9: config write vs the acceptance snapshot ----------------------------------------------------


@pytest.mark.parametrize("order", ORDERS)
async def test_9_config_write_vs_acceptance(backend: str, tmp_path: Path, order: str) -> None:
    kit = await manual(backend, tmp_path, [text("one")])
    other = ModelRef(provider="scripted", model_id="other")
    if order == "surface first":
        await kit.harness.set_model(other)
    running = await started(kit.harness, kit.harness.prompt("go"))
    if order == "effect first":
        setting = asyncio.ensure_future(kit.harness.set_model(other))
        await asyncio.sleep(0)
    await kit.harness.run_to_completion()
    assert isinstance(await running, Ok)
    if order == "effect first":
        await setting
    items = await log(kit)
    first_model = kit.model.requests[0].model.model_id
    if order == "surface first":
        assert first_model == "other" and records(items, WriteDeferred) == []
        assert records(items, OperationStarted)[0].configuration.model_id == "other"
    else:
        # the run keeps its accepted snapshot; the write waits for the first checkpoint, which
        # applies it before the first request
        assert records(items, OperationStarted)[0].configuration.model_id == "test"
        assert len(records(items, WriteDeferred)) == 1 and first_model == "other"
        assert (await kit.harness.get_model()).model_id == "other"
    covered("9 config write vs acceptance snapshot", order)


# -- 10: abort vs an in-flight effect (irreducible) ------------------------------------------------


@pytest.mark.parametrize("order", ORDERS)
async def test_10_abort_vs_in_flight_tool(backend: str, tmp_path: Path, order: str) -> None:
    body = Gated()
    kit = await manual(
        backend, tmp_path, [tool_call("look"), text("done")], tools=[look_tool(body)]
    )
    running = await started(kit.harness, kit.harness.prompt("go"))
    await until(kit.harness, kind("execute_tool"))
    if order == "surface first":  # aborted while parked: the tool never starts
        assert isinstance(await kit.harness.abort(), Ok)
        await kit.harness.run_to_completion()
        assert body.runs == 0
        expected = "did not run"
    else:  # aborted while it runs: it sees the signal and settles; its result is committed
        releasing = asyncio.ensure_future(kit.harness.execute_action())
        await body.running.wait()
        assert isinstance(await kit.harness.abort(), Ok)
        await releasing
        await kit.harness.run_to_completion()
        assert body.runs == 1 and body.saw_abort
        expected = "stopped early"
    outcome = await running
    assert isinstance(outcome, Ok) and outcome.value.kind == "aborted"
    results = [s for s in said(await log(kit)) if s not in ("go",)]
    assert sum(expected in s for s in results) == 1  # one result for the call, from the procedure
    covered("10 abort vs in-flight effect (tool)", order)


# -- 11: cross-lane writes -------------------------------------------------------------------------


@pytest.mark.parametrize("order", ORDERS)
async def test_11_cross_lane_writes(backend: str, tmp_path: Path, order: str) -> None:
    kit = await manual(backend, tmp_path, [text("a"), text("b")])
    other = await kit.harness.create_lane("other", None)
    assert isinstance(other, Ok)
    main: AgentLane = kit.harness
    lanes = [main, other.value] if order == "surface first" else [other.value, main]
    tasks = [await started(kit.harness, lane.prompt(f"to {lane.name}")) for lane in lanes]
    while True:  # strictly alternate releases between the lanes, in the chosen order
        moved = False
        for lane in lanes:
            if await lane.peek_action() is not None:
                await lane.execute_action()
                moved = True
        if not moved:
            break
    for task in tasks:
        assert isinstance(await task, Ok)
    items = await log(kit)
    seqs = [i.seq for i in items]
    assert seqs == list(range(1, len(items) + 1))  # one linear order, no gaps
    for name in ("main", "other"):
        assert [r.lane for r in records(items, OperationFinished) if r.lane == name] == [name]
    reread = await kit.storage.find_records(RecordQuery(order="oldest_first"))
    assert [r.seq for r in reread] == sorted(r.seq for r in reread)
    covered("11 cross-lane writes", order)


# -- 12: cancel_queued vs consumption --------------------------------------------------------------


@pytest.mark.parametrize("order", ORDERS)
async def test_12_cancel_vs_consumption(backend: str, tmp_path: Path, order: str) -> None:
    kit = await manual(backend, tmp_path, [tool_call("look"), text("done")], tools=[look_tool()])
    running = await started(kit.harness, kit.harness.prompt("go"))
    await until(kit.harness, kind("execute_tool"))
    steered = await kit.harness.steer("never mind")
    assert isinstance(steered, Ok)
    await until(kit.harness, kind("consume_queue_item"))
    if order == "effect first":
        await kit.harness.execute_action()
        cancelled = await kit.harness.cancel_queued(steered.value)
        assert isinstance(cancelled, Ok) and cancelled.value == "already_consumed"
    else:
        cancelled = await kit.harness.cancel_queued(steered.value)
        assert isinstance(cancelled, Ok) and cancelled.value == "cancelled"
    await kit.harness.run_to_completion()
    assert isinstance(await running, Ok)
    seen = [
        message_text(m)
        for r in kit.model.requests
        for m in r.messages
        if isinstance(m, UserMessage)
    ]
    assert ("never mind" in seen) == (order == "effect first")
    covered("12 cancel_queued vs consumption", order)


class SlowModel(ScriptedModel):
    """A scripted model whose requests wait for `release` (to abort one in flight)."""

    def __init__(self) -> None:
        super().__init__([text("answer")])
        self.in_flight = asyncio.Event()
        self.release = asyncio.Event()
        self.sent = 0

    async def request(self, request: Any, on_update: Any = None) -> Any:
        self.sent += 1
        self.in_flight.set()
        await self.release.wait()
        return await super().request(request, on_update)


@pytest.mark.parametrize("order", ORDERS)
async def test_10_abort_vs_in_flight_model_request(
    backend: str, tmp_path: Path, order: str
) -> None:
    kit = await manual(backend, tmp_path, [])
    model = SlowModel()
    kit.harness._rt.model = model  # the same harness, a model whose request can be held
    running = await started(kit.harness, kit.harness.prompt("go"))
    await until(kit.harness, kind("stream_assistant"))
    if order == "surface first":  # aborted while parked: the request is never sent
        assert isinstance(await kit.harness.abort(), Ok)
        await kit.harness.run_to_completion()
        assert model.sent == 0
    else:  # aborted while in flight: the request is abandoned, its answer never committed
        releasing = asyncio.ensure_future(kit.harness.execute_action())
        await model.in_flight.wait()
        assert isinstance(await kit.harness.abort(), Ok)
        await releasing
        await kit.harness.run_to_completion()
        assert model.sent == 1
    outcome = await running
    assert isinstance(outcome, Ok) and outcome.value.kind == "aborted"
    items = await log(kit)
    assert "answer" not in said(items)
    assert [r.outcome for r in records(items, OperationFinished)] == ["aborted"]
    covered("10 abort vs in-flight effect (model request)", order)


# -- approvals: decision vs abort, decision vs decision --------------------------------------------


def approval_tools(runs: list[str]) -> list[Tool]:
    async def deploy(args: Any, ctx: ToolContext) -> str:
        runs.append(ctx.tool_call_id)
        return "deployed"

    return [Tool(name="deploy", description="deploys", execute=deploy, requires_approval=True)]


async def waiting(kit: Kit) -> Outcome:
    """Drive the prompt until its run waits for approval; the suspension."""
    running = await started(kit.harness, kit.harness.prompt("ship it"))
    await kit.harness.run_to_completion()
    outcome = await running
    assert isinstance(outcome, Ok) and outcome.value.pending_approvals
    return outcome.value


@pytest.mark.parametrize("order", ORDERS)
async def test_a1_decision_vs_abort(backend: str, tmp_path: Path, order: str) -> None:
    runs: list[str] = []
    kit = await manual(
        backend, tmp_path, [tool_call("deploy", call_id="c1")], tools=approval_tools(runs)
    )
    wait = await waiting(kit)
    (pending,) = wait.pending_approvals
    if order == "surface first":  # the abort closes the wait: the decision comes too late
        assert isinstance(await kit.harness.abort(), Ok)
        late = await kit.harness.resume(
            [approve(pending)], wait_id=wait.wait_id, idempotency_key="k"
        )
        assert isinstance(late, Err) and late.error.tag == "WaitSuperseded"
        await kit.harness.run_to_completion()
        assert records(await log(kit), ApprovalDecided) == []
    else:  # decided first: the abort lands before the approved call starts, which never runs
        deciding = await started(
            kit.harness,
            kit.harness.resume([approve(pending)], wait_id=wait.wait_id, idempotency_key="k"),
            "approval_decided",
        )
        await until(kit.harness, kind("run_hook", name="before_tool"))
        assert len(records(await log(kit), ApprovalDecided)) == 1
        assert isinstance(await kit.harness.abort(), Ok)
        await kit.harness.run_to_completion()
        outcome = await deciding
        assert isinstance(outcome, Ok) and outcome.value.kind == "aborted"
    assert runs == []
    assert [r.outcome for r in records(await log(kit), OperationFinished)] == ["aborted"]
    covered("A1 approval decision vs abort", order)


@pytest.mark.parametrize("order", ["same key", "different key"])
async def test_a2_decision_vs_decision(backend: str, tmp_path: Path, order: str) -> None:
    runs: list[str] = []
    kit = await manual(
        backend, tmp_path, [tool_call("deploy", call_id="c1"), text("done")],
        tools=approval_tools(runs),
    )  # fmt: skip
    wait = await waiting(kit)
    (pending,) = wait.pending_approvals
    first = await started(
        kit.harness,
        kit.harness.resume([approve(pending)], wait_id=wait.wait_id, idempotency_key="k1"),
        "approval_decided",
    )
    await until(kit.harness, kind("run_hook", name="before_tool"))
    if order == "same key":  # the same click again (a double click, a Slack retry)
        again = kit.harness.resume([approve(pending)], wait_id=wait.wait_id, idempotency_key="k1")
    else:
        again = kit.harness.resume(
            [deny(pending, "no")], wait_id=wait.wait_id, idempotency_key="k2"
        )
    second = asyncio.ensure_future(again)
    await asyncio.sleep(0)
    await kit.harness.run_to_completion()
    won, other = await first, await second
    assert isinstance(won, Ok) and won.value.kind == "completed"
    if order == "same key":  # the same click twice: the same result, one record
        assert isinstance(other, Ok) and other.value == won.value
    else:  # a different batch for a decided wait is refused
        assert isinstance(other, Err) and getattr(other.error, "reason", "") == "already_decided"
    assert runs == ["c1"] and len(records(await log(kit), ApprovalDecided)) == 1
    covered("A2 approval decision vs decision", "both orders: " + order)


# -- approval identity: an answer to the previous wait vs the run reaching the next one --------


@pytest.mark.parametrize("order", ORDERS)
async def test_a3_stale_decision_vs_the_next_wait(backend: str, tmp_path: Path, order: str) -> None:
    """The first Approve, sent again with another key, races the run to its second wait (the
    model called deploy again, reusing the call id with other arguments). Before the second
    wait it is a second decision of a decided wait; after it, an answer to a superseded wait.
    Either way nothing is written and the second call waits for its own decision."""
    runs: list[str] = []
    script = [tool_call("deploy", call_id="c1"), tool_call("deploy", {"n": 2}, call_id="c1")]
    kit = await manual(backend, tmp_path, [*script, text("done")], tools=approval_tools(runs))
    first = await waiting(kit)
    (old,) = first.pending_approvals
    deciding = await started(
        kit.harness,
        kit.harness.resume([approve(old)], wait_id=first.wait_id, idempotency_key="k1"),
        "approval_decided",
    )
    await until(kit.harness, kind("append_record", record_type="approval_requested"))
    stale = kit.harness.resume([approve(old)], wait_id=first.wait_id, idempotency_key="k2")
    if order == "surface first":  # the second wait is not recorded yet: no wait is open
        before = await log(kit)
        refused = await stale
        assert isinstance(refused, Err) and refused.error.tag == "WaitSuperseded"
        assert refused.error.current_wait_id is None  # type: ignore[union-attr]
        assert await log(kit) == before
        await kit.harness.run_to_completion()
    else:
        await kit.harness.run_to_completion()
        before = await log(kit)
        refused = await stale
        assert isinstance(refused, Err) and refused.error.tag == "WaitSuperseded"
        assert await log(kit) == before
    second = await deciding
    assert isinstance(second, Ok)
    if order == "effect first":
        assert refused.error.current_wait_id == second.value.wait_id  # type: ignore[union-attr]
    assert isinstance(second, Ok) and second.value.kind == "suspended"
    assert second.value.wait_id != first.wait_id and runs == ["c1"]
    (new,) = second.value.pending_approvals
    assert dict(new.args) == {"n": 2}
    covered("A3 stale decision vs the next wait", order)


# -- attempts: a counted resume vs abort ----------------------------------------------------------


@pytest.mark.parametrize("order", ORDERS)
async def test_a4_counted_resume_vs_abort(backend: str, tmp_path: Path, order: str) -> None:
    """A crash left a run open; the new process's resume (an attempt, counted durably first)
    races an operator's abort. Abort first: the resume runs the abort path. Resume first: the
    attempt is recorded, then the abort lands before the replayed tool starts."""
    gated = Gated()
    tool = Tool(name="work", description="work", execute=gated, replay="safe")
    kit = await make_kit(backend, tmp_path, [tool_call("work", call_id="c1")], tools=[tool])
    running = asyncio.ensure_future(kit.harness.prompt("go"))
    await gated.running.wait()  # the process dies here, mid-tool
    reopened = await kit.reopen(script=[text("unreachable")], tools=[tool], drive="manual")
    gated.running.clear()
    lane = reopened.harness
    if order == "surface first":
        assert isinstance(await lane.abort(), Ok)
        resuming = asyncio.ensure_future(lane.resume())
    else:
        resuming = asyncio.ensure_future(lane.resume())
        # admitted (the attempt recorded), then parked; the store's thread may be slow
        async with asyncio.timeout(10):
            while (await lane.lanes())[0].status != "running" or not await lane.peek_action():  # noqa: ASYNC110
                await asyncio.sleep(0.001)
        await until(lane, kind("execute_tool"))
        assert isinstance(await lane.abort(), Ok)
    await lane.run_to_completion()
    items = await log(reopened)
    assert [r.attempt for r in records(items, OperationResumed)] == (
        [] if order == "surface first" else [2]
    )
    assert [r.outcome for r in records(items, OperationFinished)] == ["aborted"]
    assert gated.runs == 1  # the replay never started
    outcome = await resuming
    if order == "surface first":  # the abort already reconciles: nothing to resume
        assert isinstance(outcome, Err) or outcome.value.kind == "aborted"
    else:
        assert isinstance(outcome, Ok) and outcome.value.kind == "aborted"
    running.cancel()
    covered("A4 counted resume vs abort", order)


# -- chosen ids: the same inbound message submitted twice -----------------------------------------


@pytest.mark.parametrize("order", ORDERS)
async def test_a5_the_same_input_submitted_twice(backend: str, tmp_path: Path, order: str) -> None:
    """A Slack retry delivers the same message while its first delivery is being accepted (or
    right after). One run, one user message; the second submission returns the first result."""
    kit = await manual(backend, tmp_path, [text("the answer")])
    if order == "surface first":  # both submitted before the first acceptance commits
        accepted = asyncio.Event()
        kit.harness.events.on("run_start", lambda _: accepted.set())
        first = asyncio.ensure_future(kit.harness.prompt("hello", entry_id="slack:C1:1.0"))
        second = asyncio.ensure_future(kit.harness.prompt("hello", entry_id="slack:C1:1.0"))
        await accepted.wait()
    else:
        first = asyncio.ensure_future(
            await started(kit.harness, kit.harness.prompt("hello", entry_id="slack:C1:1.0"))
        )
        await until(kit.harness, kind("stream_assistant"))
        second = asyncio.ensure_future(kit.harness.prompt("hello", entry_id="slack:C1:1.0"))
    await kit.harness.run_to_completion()
    one, two = await first, await second
    assert isinstance(one, Ok) and isinstance(two, Ok) and one.value == two.value
    items = await log(kit)
    assert len(records(items, OperationStarted)) == 1 and said(items) == ["hello", "the answer"]
    covered("A5 same input submitted twice", order)
