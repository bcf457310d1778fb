"""Tier B: the exact order of durable writes (E entries, R records, L lane moves, G facts) and
hooks (H) for each canonical scenario (approvals included), and in every scenario the
append-only-context check over all of its requests (`assert_append_only`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from harness_core._runtime.context import project, project_entry
from harness_core.approvals import approve, deny
from harness_core.harness import SuspendedOperation
from harness_core.hooks import BeforeRunEndEvent, BeforeRunEndResult, TransformContextEvent
from harness_core.messages import AgentMessage, UserMessage, message_text, user_message
from harness_core.models import ModelRequest
from harness_core.models.scripted import deferred, error, length, text, tool_call, tool_calls
from harness_core.options import CompactionSettings, RetryPolicy
from harness_core.result import Ok, Outcome
from harness_core.session.entries import CompactionEntry
from harness_core.session.records import (
    ApprovalDecided,
    PendingApproval,
    StepAttempt,
    ToolStarted,
)
from harness_core.session.types import BranchQuery, LaneMove, LogItem, StoredEntry, StoredRecord
from harness_core.tools import Tool, ToolContext, tool
from tests.support.harness_kit import Kit, make_kit

REQUEST_HOOKS = [("H", "before_request"), ("H", "transform_context")]
PRESSED = 99_500
"""A reported prompt that leaves 500 of a 100,000 window: less than the 1,000 cap (D132)."""


def step(attempt: int = 1) -> list[tuple[str, str]]:
    """One assistant attempt: the hooks and records around one model call."""
    return [
        ("H", "before_request"),
        ("R", f"step_attempt:assistant:{attempt}"),
        ("H", "transform_context"),
        ("H", "after_response"),
        ("R", "usage:assistant"),
    ]


async def assert_append_only(kit: Kit, requests: Sequence[ModelRequest] | None = None) -> None:
    """The provider context only grows at its tail (DESIGN §2.7), checked exactly.

    Each model request is matched, in order, to its durable `step_attempt` record (so the
    scenario must not run two lanes' steps at once), which names its lane and run. On a lane,
    each assistant request starts with every message of the lane's previous assistant request:
    within a run and across runs, across a retry (which resends exactly the same messages) and
    across an approval wait, a deferred request or a crash and resume. The two sanctioned
    exceptions rebuild the context, and the next request must start with exactly what they
    left: a compaction (its summary and retained tail) and a navigation (the durable context at
    the lane's new leaf). Within a run the system prompt never changes.

    Args:
        kit: the scenario's harness, store and model.
        requests: every request of the session in order, when the scenario used several models
            (a restarted process with its own script); default: the kit's model's.
    """
    sent = list(kit.model.requests if requests is None else requests)
    log = await kit.storage.get_log()
    attempts = [
        (item.seq, item.record)
        for item in log
        if isinstance(item, StoredRecord) and isinstance(item.record, StepAttempt)
    ]
    assert [(r.step, r.attempt) for r in sent] == [(a.step, a.attempt) for _, a in attempts], (
        "every request follows its own step_attempt record, in order"
    )
    newest: dict[str, tuple[int, StepAttempt, ModelRequest]] = {}
    for (seq, attempt), request in zip(attempts, sent, strict=True):
        if request.step != "assistant":
            continue  # a summary request: its messages are not the conversation's
        before = newest.get(attempt.lane)
        newest[attempt.lane] = (seq, attempt, request)
        if before is None:
            continue
        before_seq, before_attempt, previous = before
        between = [item for item in log if before_seq < item.seq < seq]
        rebuilt = await _rebuilt_context(kit, between, attempt.lane)
        if rebuilt is not None:
            assert request.messages[: len(rebuilt)] == rebuilt, "not the rebuilt context"
            continue
        assert request.messages[: len(previous.messages)] == previous.messages, (
            f"request {attempt.step}:{attempt.attempt} of {attempt.run_id} changed the context "
            "before its tail"
        )
        if attempt.attempt > 1:
            assert request.messages == previous.messages, "a retry resends the same context"
        if attempt.run_id == before_attempt.run_id:
            assert request.system_prompt == previous.system_prompt


async def _rebuilt_context(
    kit: Kit, between: Sequence[LogItem], lane: str
) -> tuple[AgentMessage, ...] | None:
    """The head of the lane's context if a compaction or a navigation rebuilt it, else None."""
    rebuilt = [
        item
        for item in between
        if (isinstance(item, LaneMove) and item.lane == lane)
        or (
            isinstance(item, StoredEntry)
            and item.lane == lane
            and isinstance(item.entry, CompactionEntry)
        )
    ]
    if not rebuilt:
        return None
    last = rebuilt[-1]
    if isinstance(last, StoredEntry):
        return tuple(project_entry(last.entry))  # the summary, then the retained tail
    assert isinstance(last, LaneMove)
    if last.leaf_id is None:
        return ()
    # the path to the new leaf, from its newest compaction (a summary entry follows it, if any)
    path = await kit.storage.find_entries_on_branch(
        BranchQuery(start=last.leaf_id, stop_at_type="compaction")
    )
    return project([stored.entry for stored in reversed(path)])


async def echo(args: Any, ctx: ToolContext) -> str:
    return f"echo {args}"


ECHO = Tool(name="echo", description="echo", execute=echo)


@pytest.mark.parametrize("rewrite", ["drop_the_oldest", "a_fake_summary_head"])
async def test_the_append_only_check_sees_a_rewritten_head(backend, tmp_path, rewrite) -> None:
    # The check itself: a transform_context handler that rewrites the head of the second
    # request breaks the provider's cache; a head that merely looks like a summary is no excuse.
    kit = await make_kit(
        backend, tmp_path, [tool_call("echo", {"x": 1}), text("done")], tools=[ECHO]
    )

    async def rewrite_second(event: TransformContextEvent) -> tuple[AgentMessage, ...] | None:
        if not kit.model.requests:
            return None
        if rewrite == "drop_the_oldest":
            return event.messages[1:]
        return (user_message("Summary of the earlier conversation:\nnothing"), *event.messages[1:])

    kit.harness.hooks.on("transform_context", rewrite_second)
    assert isinstance(await kit.harness.prompt("fix the bug"), Ok)
    with pytest.raises(AssertionError, match="changed the context before its tail"):
        await assert_append_only(kit)


async def test_one_tool_run(backend, tmp_path) -> None:
    kit = await make_kit(
        backend, tmp_path, [tool_call("echo", {"x": 1}), text("done")], tools=[ECHO]
    )
    result = await kit.harness.prompt("fix the bug")
    assert isinstance(result, Ok) and result.value.kind == "completed"
    assert kit.writes == [
        ("H", "before_run"),
        ("R", "operation_started"),
        ("E", "message:user"),
        *step(),
        ("E", "message:assistant:tool_use"),
        ("H", "before_tool"),
        ("R", "tool_started"),
        ("H", "after_tool"),
        ("E", "message:tool_result:ok"),
        *step(),
        ("E", "message:assistant:stop"),
        ("H", "before_run_end"),
        ("R", "operation_finished:completed"),
    ]
    await assert_append_only(kit)


async def test_retry_then_success(backend, tmp_path) -> None:
    kit = await make_kit(backend, tmp_path, [error("server"), text("ok")])
    result = await kit.harness.prompt("hi")
    assert isinstance(result, Ok) and result.value.kind == "completed"
    assert kit.writes == [
        ("H", "before_run"),
        ("R", "operation_started"),
        ("E", "message:user"),
        *step(1),
        *step(2),
        ("E", "message:assistant:stop"),
        ("H", "before_run_end"),
        ("R", "operation_finished:completed"),
    ]
    await assert_append_only(kit)


async def test_retries_exhausted_give_up(backend, tmp_path) -> None:
    kit = await make_kit(backend, tmp_path, [error("rate_limit")] * 3)
    retries: list[Any] = []
    kit.harness.events.on("retry_scheduled", retries.append)
    result = await kit.harness.prompt("hi")
    assert isinstance(result, Ok) and result.value.kind == "failed"
    # two retries after attempts 1 and 2; the third failure ends the run at once
    assert [(r.attempt, r.max_attempts, r.error_kind) for r in retries] == [
        (1, 3, "rate_limit"),
        (2, 3, "rate_limit"),
    ]
    assert result.value.error is not None and result.value.error.code == "retries_exhausted"
    assert kit.writes == [
        ("H", "before_run"),
        ("R", "operation_started"),
        ("E", "message:user"),
        *step(1),
        *step(2),
        *step(3),
        ("E", "message:assistant:error"),  # the give-up entry fulfills attempt 3's id
        ("R", "operation_finished:failed"),
    ]
    await assert_append_only(kit)


async def test_the_last_attempt_fails_at_once_without_a_wait(backend, tmp_path) -> None:
    # backoff 1 s, then 2 s: the third failure ends the run, it does not wait 4 s more first
    kit = await make_kit(
        backend,
        tmp_path,
        [error("overloaded")] * 3,
        retry=RetryPolicy(max_attempts=3, initial_delay_ms=1_000),
    )
    waited: list[int] = []
    kit.harness.events.on("retry_scheduled", lambda event: waited.append(event.delay_ms))
    ends: list[Any] = []
    kit.harness.events.on("retry_end", ends.append)
    run = asyncio.create_task(kit.harness.prompt("hi"))
    while len(kit.model.requests) < 3:  # the clock moves only while attempts are still due
        await asyncio.sleep(0.01)
        kit.clock.advance(500)
    # after the third failure the clock stands still: a run that waited (4 s more) never ends
    result = await asyncio.wait_for(run, 10)
    assert waited == [1_000, 2_000]
    assert isinstance(result, Ok) and result.value.kind == "failed"
    assert result.value.error is not None and result.value.error.code == "retries_exhausted"
    # 1 s + 2 s, then at once (the loop's steps may pass the due time under load: never 4 s)
    assert kit.clock.now_ms() - 1_700_000_000_000 < 7_000
    # giving up says what the provider said the last time, not only that the cap was reached
    [end] = ends
    assert (end.attempt, end.success, end.final_error) == (3, False, "scripted failure")


async def test_terminal_error(backend, tmp_path) -> None:
    kit = await make_kit(backend, tmp_path, [error("invalid_request", retryable=False)])
    result = await kit.harness.prompt("hi")
    assert isinstance(result, Ok) and result.value.kind == "failed"
    assert kit.writes[-3:] == [
        ("R", "usage:assistant"),
        ("E", "message:assistant:error"),
        ("R", "operation_finished:failed"),
    ]
    await assert_append_only(kit)


def after_tool_call(kit: Kit) -> list[tuple[str, str]]:
    """The writes after the first assistant message that called a tool."""
    index = kit.writes.index(("E", "message:assistant:tool_use"))
    return kit.writes[index + 1 :]


def tool_that(action: Callable[[ToolContext], Awaitable[None]]) -> Tool:
    """A tool whose execution runs `action(ctx)` (which may call the lane surface)."""

    async def execute(args: Any, ctx: ToolContext) -> str:
        await action(ctx)
        return "tool done"

    return Tool(name="act", description="acts on the lane while it runs", execute=execute)


async def test_steering_while_a_tool_runs(backend, tmp_path) -> None:
    holder: dict[str, Kit] = {}

    async def steer(ctx: ToolContext) -> None:
        assert isinstance(await holder["kit"].harness.steer("focus on the tests"), Ok)

    kit = await make_kit(
        backend, tmp_path, [tool_call("act"), text("done")], tools=[tool_that(steer)]
    )
    holder["kit"] = kit
    await kit.harness.prompt("go")
    assert after_tool_call(kit) == [
        ("H", "before_tool"),
        ("R", "tool_started"),
        ("R", "queue_enqueued:steer"),
        ("H", "after_tool"),
        ("E", "message:tool_result:ok"),
        ("E", "message:user"),  # the checkpoint consumes the steering message
        *step(),
        ("E", "message:assistant:stop"),
        ("H", "before_run_end"),
        ("R", "operation_finished:completed"),
    ]
    last = kit.model.requests[-1].messages
    assert isinstance(last[-1], UserMessage) and message_text(last[-1]) == "focus on the tests"
    await assert_append_only(kit)


async def test_queue_cancellation(backend, tmp_path) -> None:
    holder: dict[str, Kit] = {}

    async def steer_then_cancel(ctx: ToolContext) -> None:
        harness = holder["kit"].harness
        queued = await harness.steer("never mind")
        assert isinstance(queued, Ok)
        assert await harness.cancel_queued(queued.value) == Ok("cancelled")
        assert await harness.cancel_queued(queued.value) == Ok("already_cleared")

    kit = await make_kit(
        backend, tmp_path, [tool_call("act"), text("done")], tools=[tool_that(steer_then_cancel)]
    )
    holder["kit"] = kit
    await kit.harness.prompt("go")
    assert ("R", "queue_enqueued:steer") in kit.writes and ("R", "queue_cancelled") in kit.writes
    assert kit.writes.count(("E", "message:user")) == 1  # the model never saw it
    assert all("never mind" not in str(r.messages) for r in kit.model.requests)
    await assert_append_only(kit)


async def test_deferred_write_mid_turn(backend, tmp_path) -> None:
    holder: dict[str, Kit] = {}

    async def write(ctx: ToolContext) -> None:
        await holder["kit"].harness.session.append_custom_entry("note", {"from": "tool"})

    kit = await make_kit(
        backend, tmp_path, [tool_call("act"), text("done")], tools=[tool_that(write)]
    )
    holder["kit"] = kit
    await kit.harness.prompt("go")
    assert after_tool_call(kit)[:6] == [
        ("H", "before_tool"),
        ("R", "tool_started"),
        ("R", "write_deferred"),
        ("H", "after_tool"),
        ("E", "message:tool_result:ok"),
        ("E", "custom"),  # applied at the checkpoint: a tail append
    ]
    await assert_append_only(kit)


async def test_abort_during_a_tool(backend, tmp_path) -> None:
    holder: dict[str, Kit] = {}

    async def abort(ctx: ToolContext) -> None:
        result = await holder["kit"].harness.abort()
        assert isinstance(result, Ok)
        assert ctx.abort.is_set()

    kit = await make_kit(backend, tmp_path, [tool_call("act")], tools=[tool_that(abort)])
    holder["kit"] = kit
    result = await kit.harness.prompt("go")
    assert isinstance(result, Ok) and result.value.kind == "aborted"
    assert after_tool_call(kit) == [
        ("H", "before_tool"),
        ("R", "tool_started"),
        ("R", "abort_requested"),
        ("H", "after_tool"),
        ("E", "message:tool_result:ok"),  # the tool settled: its real result
        ("E", "message:assistant:aborted"),  # the abort closure
        ("R", "operation_finished:aborted"),
    ]
    await assert_append_only(kit)


async def test_follow_up_from_before_run_end(backend, tmp_path) -> None:
    kit = await make_kit(backend, tmp_path, [text("first"), text("second")])
    asked: list[int] = []

    async def once_more(event: BeforeRunEndEvent) -> BeforeRunEndResult | None:
        if not asked:
            asked.append(1)
            return BeforeRunEndResult(follow_up="and then?")
        return None

    kit.harness.hooks.on("before_run_end", once_more)
    await kit.harness.prompt("go")
    assert (
        kit.writes[-9:]
        == [
            ("H", "before_run_end"),
            ("R", "queue_enqueued:follow_up"),
            ("E", "message:user"),
            *step(),
            ("E", "message:assistant:stop"),
            ("H", "before_run_end"),
            ("R", "operation_finished:completed"),
        ][-9:]
    )
    assert kit.writes.count(("H", "before_run_end")) == 2
    await assert_append_only(kit)


async def test_deferred_request_suspends_and_redeems(backend, tmp_path) -> None:
    kit = await make_kit(backend, tmp_path, [deferred("resp_1")])
    result = await kit.harness.prompt("take your time")
    assert isinstance(result, Ok) and result.value.kind == "suspended"
    handle = result.value.deferred
    assert handle is not None and handle.id == "resp_1"
    assert kit.writes[-2:] == [("R", "usage:assistant"), ("E", "message:assistant:deferred")]
    # pending: the same handle again, nothing but (maybe) usage is written
    kit.writes.clear()
    pending = await kit.harness.resume()
    assert isinstance(pending, Ok) and pending.value.kind == "suspended"
    assert kit.writes == [("H", "before_resume"), ("H", "after_response")]
    # ready
    kit.model.fetch_script.append(text("here it is"))
    kit.writes.clear()
    ready = await kit.harness.resume()
    assert isinstance(ready, Ok) and ready.value.kind == "completed"
    assert kit.writes == [
        ("H", "before_resume"),
        ("H", "after_response"),
        ("R", "usage:deferred_fetch"),
        ("E", "message:assistant:stop"),
        ("H", "before_run_end"),
        ("R", "operation_finished:completed"),
    ]
    assert len(kit.model.fetches) == 2 and len(kit.model.requests) == 1
    await assert_append_only(kit)


async def test_deferred_terminal_failure(backend, tmp_path) -> None:
    kit = await make_kit(backend, tmp_path, [deferred("resp_1")])
    await kit.harness.prompt("take your time")
    kit.model.fetch_script.append(error("expired", retryable=False))
    kit.writes.clear()
    failed = await kit.harness.resume()
    assert isinstance(failed, Ok) and failed.value.kind == "failed"
    assert kit.writes[-3:] == [
        ("R", "usage:deferred_fetch"),
        ("E", "message:assistant:error"),
        ("R", "operation_finished:failed"),
    ]
    assert len(kit.model.requests) == 1, "no automatic replacement request"
    await assert_append_only(kit)


def summary_step(kind: str, attempt: int = 1) -> list[tuple[str, str]]:
    return [
        ("H", "before_request"),
        ("R", f"step_attempt:{kind}:{attempt}"),
        ("H", "after_response"),
        ("R", f"usage:{kind}"),
    ]


async def two_turns(kit: Kit) -> None:
    assert isinstance(await kit.harness.prompt("first question " + "q" * 200), Ok)
    kit.writes.clear()


async def test_auto_compaction_at_a_checkpoint(backend, tmp_path) -> None:
    from harness_core.models import ModelInfo
    from harness_core.options import CompactionSettings

    async def big(args: Any, ctx: ToolContext) -> str:
        return "x" * 1200

    kit = await make_kit(
        backend,
        tmp_path,
        [text("first answer " + "a" * 200), tool_call("big"), text("the summary"), text("done")],
        tools=[Tool(name="big", description="big output", execute=big)],
        compaction=CompactionSettings(reserve_tokens=100, keep_recent_tokens=50),
    )
    kit.model.info = ModelInfo(context_window=400, max_output_tokens=100)
    await two_turns(kit)
    result = await kit.harness.prompt("now the big one")
    assert isinstance(result, Ok) and result.value.kind == "completed"
    tail = after_tool_call(kit)
    assert tail[:3] == [("H", "before_tool"), ("R", "tool_started"), ("H", "after_tool")]
    assert tail[3:] == [
        ("E", "message:tool_result:ok"),
        ("H", "before_compaction"),
        *summary_step("compaction"),
        ("E", "compaction"),
        *step(),
        ("E", "message:assistant:stop"),
        ("H", "before_run_end"),
        ("R", "operation_finished:completed"),
    ]
    compacted = kit.model.requests[-1].messages
    assert message_text(compacted[0]).startswith(
        "Summary of the earlier conversation:\nthe summary"
    )
    assert "first question" not in str(compacted)
    await assert_append_only(kit)


async def test_overflow_compacts_once_then_retries(backend, tmp_path) -> None:
    from harness_core.models import ModelInfo

    kit = await make_kit(
        backend,
        tmp_path,
        [
            text("first answer"),
            length("cut", output_tokens=3, input_tokens=PRESSED),
            text("summary"),
            text("fits now"),
        ],
        compaction=CompactionSettings(keep_recent_tokens=10),
    )
    kit.model.info = ModelInfo(context_window=100_000, max_output_tokens=1_000)
    await two_turns(kit)
    result = await kit.harness.prompt("second")
    assert isinstance(result, Ok) and result.value.kind == "completed"
    assert kit.writes == [
        ("H", "before_run"),
        ("R", "operation_started"),
        ("E", "message:user"),
        *step(1),  # the recoverable length response is discarded (its usage kept)
        ("H", "before_compaction"),
        *summary_step("compaction"),
        ("E", "compaction"),
        *step(1),  # a new assistant step
        ("E", "message:assistant:stop"),
        ("H", "before_run_end"),
        ("R", "operation_finished:completed"),
    ]
    await assert_append_only(kit)


async def test_length_twice_gives_up_after_one_recovery(backend, tmp_path) -> None:
    from harness_core.models import ModelInfo

    kit = await make_kit(
        backend,
        tmp_path,
        [
            text("first answer"),
            length("cut", output_tokens=3, input_tokens=PRESSED),
            text("summary"),
            length("cut again", output_tokens=2, input_tokens=PRESSED),
        ],
        compaction=CompactionSettings(keep_recent_tokens=10),
    )
    kit.model.info = ModelInfo(context_window=100_000, max_output_tokens=1_000)
    await two_turns(kit)
    result = await kit.harness.prompt("second")
    assert isinstance(result, Ok) and result.value.kind == "failed"
    assert result.value.error is not None and result.value.error.code == "context_overflow"
    assert kit.writes[-3:] == [
        ("R", "usage:assistant"),
        ("E", "message:assistant:error"),
        ("R", "operation_finished:failed"),
    ]
    assert kit.writes.count(("E", "compaction")) == 1
    await assert_append_only(kit)


async def test_genuine_length_is_kept(backend, tmp_path) -> None:
    from harness_core.models import ModelInfo

    kit = await make_kit(backend, tmp_path, [length("all of it", output_tokens=1_000)])
    kit.model.info = ModelInfo(context_window=100_000, max_output_tokens=1_000)
    result = await kit.harness.prompt("write a lot")
    assert isinstance(result, Ok) and result.value.kind == "completed"
    assert ("E", "message:assistant:length") in kit.writes
    await assert_append_only(kit)


async def test_manual_compaction(backend, tmp_path) -> None:
    kit = await make_kit(
        backend,
        tmp_path,
        [text("a1"), text("a2"), text("summary")],
        compaction=CompactionSettings(keep_recent_tokens=10),
    )
    assert isinstance(await kit.harness.prompt("q1"), Ok)
    assert isinstance(await kit.harness.prompt("q2"), Ok)
    kit.writes.clear()
    result = await kit.harness.compact("keep the numbers")
    assert isinstance(result, Ok) and result.value.kind == "completed" and result.value.entry_id
    assert kit.writes == [
        ("R", "operation_started"),
        ("H", "before_compaction"),
        *summary_step("compaction"),
        ("E", "compaction"),
        ("R", "operation_finished:completed"),
    ]
    stored = await kit.storage.get_entry(result.value.entry_id)
    assert stored is not None and isinstance(stored.entry, CompactionEntry)
    assert stored.entry.summary == "summary"
    assert "keep the numbers" in str(kit.model.requests[-1].messages)
    await assert_append_only(kit)


async def test_navigation_moves_first_then_summary_and_label(backend, tmp_path) -> None:
    kit = await make_kit(
        backend, tmp_path, [text("a1"), text("a2"), text("what we did"), text("a3")]
    )
    first = await kit.harness.prompt("q1")
    assert isinstance(first, Ok)
    target = first.value.final_entry_id
    assert isinstance(await kit.harness.prompt("q2"), Ok)
    kit.writes.clear()
    result = await kit.harness.navigate_tree(target, summarize=True, label="before-q2")
    assert isinstance(result, Ok) and result.value.kind == "completed"
    assert kit.writes == [
        ("R", "operation_started"),
        ("H", "before_navigation"),
        *summary_step("branch_summary"),
        ("L", "main"),
        ("E", "branch_summary"),
        ("G", "label"),
        ("R", "operation_finished:completed"),
    ]
    assert await kit.harness.session.get_label(target) == "before-q2"  # type: ignore[arg-type]
    leaf = await kit.harness.get_leaf_id()
    assert leaf == result.value.entry_id
    stored = await kit.storage.get_entry(leaf)  # type: ignore[arg-type]
    assert stored is not None and stored.parent_id == target
    assert "q2" in str(kit.model.requests[-1].messages)  # the summary covered the abandoned branch
    assert isinstance(await kit.harness.prompt("q3"), Ok)  # on the new branch: a rebuilt context
    assert [message_text(m) for m in kit.model.requests[-1].messages] == [
        "q1",
        "a1",
        "Summary of a branch this conversation left:\nwhat we did",
        "q3",
    ]
    await assert_append_only(kit)


# -- approvals (D43): the wait, the durable decision, then the normal tool path ----------------


class Deploy(BaseModel):
    build: int


def approval_tools(deployed: list[int]) -> list[Tool]:
    """`deploy` needs a person's approval; `lookup` is a safe read."""

    @tool(requires_approval=True)
    async def deploy(args: Deploy, ctx: ToolContext) -> str:
        """Deploy a build."""
        deployed.append(args.build)
        return f"deployed {args.build}"

    @tool(replay="safe")
    async def lookup(args: dict[str, Any], ctx: ToolContext) -> str:
        """Look something up."""
        return "green"

    return [deploy, lookup]


RUN_START = [("H", "before_run"), ("R", "operation_started"), ("E", "message:user")]
RUN_END = [
    *step(),
    ("E", "message:assistant:stop"),
    ("H", "before_run_end"),
    ("R", "operation_finished:completed"),
]


async def waiting_for_approval(
    backend: str, tmp_path: Path, deployed: list[int], *calls: tuple[str, dict[str, Any], str]
) -> tuple[Kit, Outcome]:
    """A run whose tool batch `calls` stopped at the approval wait, and its suspension."""
    kit = await make_kit(
        backend, tmp_path, [tool_calls(*calls), text("done")], tools=approval_tools(deployed)
    )
    outcome = await kit.harness.prompt("ship it")
    assert isinstance(outcome, Ok) and outcome.value.kind == "suspended"
    assert outcome.value.wait_id is not None
    return kit, outcome.value


def pending(wait: Outcome | SuspendedOperation, call_id: str) -> PendingApproval:
    """A waiting call as the approver saw it (its arguments digest binds the decision)."""
    return next(p for p in wait.pending_approvals if p.tool_call_id == call_id)


async def decided(kit: Kit) -> ApprovalDecided:
    (record,) = [
        item.record
        for item in await kit.storage.get_log()
        if isinstance(item, StoredRecord) and isinstance(item.record, ApprovalDecided)
    ]
    return record


async def test_approval_approved(backend, tmp_path) -> None:
    deployed: list[int] = []
    kit, wait = await waiting_for_approval(
        backend, tmp_path, deployed, ("lookup", {}, "c1"), ("deploy", {"build": 42}, "c2")
    )
    assert kit.writes == [
        *RUN_START,
        *step(),
        ("E", "message:assistant:tool_use"),
        ("H", "before_tool"),  # lookup: runs at once
        ("R", "tool_started"),
        ("H", "before_tool"),  # deploy: its effective arguments go into the wait, it does not start
        ("H", "after_tool"),
        ("E", "message:tool_result:ok"),
        ("R", "approval_requested"),  # once the rest of the batch settled
    ]
    kit.writes.clear()
    resumed = await kit.harness.resume(
        [approve(pending(wait, "c2"))],
        wait_id=wait.wait_id,
        idempotency_key="click-1",
        decided_by="U_ALICE",
    )
    assert isinstance(resumed, Ok) and resumed.value.kind == "completed"
    assert kit.writes == [
        ("R", "approval_decided"),  # durable before anything runs
        ("H", "before_resume"),
        ("H", "before_tool"),  # the normal tool path: policy checked again
        ("R", "tool_started"),
        ("H", "after_tool"),
        ("E", "message:tool_result:ok"),
        *RUN_END,
    ]
    record = await decided(kit)
    assert (record.idempotency_key, record.decided_by) == ("click-1", "U_ALICE")
    assert deployed == [42]
    await assert_append_only(kit)


async def test_approval_denied(backend, tmp_path) -> None:
    deployed: list[int] = []
    kit, wait = await waiting_for_approval(
        backend, tmp_path, deployed, ("deploy", {"build": 42}, "c1")
    )
    assert kit.writes == [
        *RUN_START,
        *step(),
        ("E", "message:assistant:tool_use"),
        ("H", "before_tool"),
        ("R", "approval_requested"),  # nothing else in the batch: the wait follows at once
    ]
    kit.writes.clear()
    resumed = await kit.harness.resume(
        [deny(pending(wait, "c1"), "not on a Friday")],
        wait_id=wait.wait_id,
        idempotency_key="click-1",
        decided_by="U_BOB",
    )
    assert isinstance(resumed, Ok) and resumed.value.kind == "completed"
    assert kit.writes == [
        ("R", "approval_decided"),
        ("H", "before_resume"),
        ("E", "message:tool_result:denied"),  # no before_tool, no tool_started: it never runs
        *RUN_END,
    ]
    assert deployed == []
    result = kit.model.requests[-1].messages[-1]
    assert message_text(result) == "This tool call was denied by U_BOB: not on a Friday"
    await assert_append_only(kit)


async def test_approval_mixed_batch_with_override_arguments(backend, tmp_path) -> None:
    deployed: list[int] = []
    kit, wait = await waiting_for_approval(
        backend,
        tmp_path,
        deployed,
        ("deploy", {"build": 42}, "c1"),
        ("lookup", {}, "c2"),
        ("deploy", {"build": 7}, "c3"),
    )
    assert kit.writes == [
        *RUN_START,
        *step(),
        ("E", "message:assistant:tool_use"),
        ("H", "before_tool"),  # c1 waits
        ("H", "before_tool"),  # c2 runs
        ("R", "tool_started"),
        ("H", "before_tool"),  # c3 waits
        ("H", "after_tool"),
        ("E", "message:tool_result:ok"),
        ("R", "approval_requested"),  # one wait for both
    ]
    kit.writes.clear()
    resumed = await kit.harness.resume(
        [
            deny(pending(wait, "c3"), "not that one"),
            approve(pending(wait, "c1"), args={"build": 43}),
        ],
        wait_id=wait.wait_id,
        idempotency_key="click-1",
        decided_by="U_ALICE",
    )
    assert isinstance(resumed, Ok) and resumed.value.kind == "completed"
    assert kit.writes == [
        ("R", "approval_decided"),  # the whole batch, one record
        ("H", "before_resume"),
        ("H", "before_tool"),  # c1 with the approver's arguments
        ("R", "tool_started"),
        ("H", "after_tool"),
        ("E", "message:tool_result:ok"),
        ("E", "message:tool_result:denied"),  # c3: in call order, after c1
        *RUN_END,
    ]
    assert deployed == [43]
    starts = [
        item.record
        for item in await kit.storage.get_log()
        if isinstance(item, StoredRecord) and isinstance(item.record, ToolStarted)
    ]
    assert [(s.tool_call_id, dict(s.effective_args)) for s in starts] == [
        ("c2", {}),
        ("c1", {"build": 43}),
    ]
    record = await decided(kit)
    assert [(d.tool_call_id, d.approved) for d in record.decisions] == [
        ("c3", False),
        ("c1", True),
    ]
    await assert_append_only(kit)


async def test_approval_decided_by_a_restarted_process(backend, tmp_path) -> None:
    deployed: list[int] = []
    kit, wait = await waiting_for_approval(
        backend, tmp_path, deployed, ("deploy", {"build": 42}, "c1")
    )
    reopened = await kit.reopen(script=[text("done")], tools=approval_tools(deployed))
    (restored,) = reopened.suspended
    assert (restored.reason, restored.wait_id) == ("approval", wait.wait_id)
    assert restored.pending_approvals == wait.pending_approvals
    resumed = await reopened.harness.resume(
        [approve(pending(restored, "c1"))],
        wait_id=restored.wait_id,
        idempotency_key="click-1",
        decided_by="U_ALICE",
    )
    assert isinstance(resumed, Ok) and resumed.value.kind == "completed"
    assert reopened.writes == [
        ("R", "approval_decided"),
        ("H", "before_resume"),
        ("H", "before_tool"),
        ("R", "tool_started"),
        ("H", "after_tool"),
        ("E", "message:tool_result:ok"),
        *RUN_END,
    ]
    assert deployed == [42]
    # the restarted process rebuilt the context from the store: still the same prefix
    await assert_append_only(reopened, [*kit.model.requests, *reopened.model.requests])


async def test_before_navigation_declines_and_the_operation_ends_declined(
    backend: str, tmp_path: Path
) -> None:
    """S2-035, S2-076: a `before_navigation` hook may decline: the lane does not move, nothing
    is summarized, and the operation closes as `declined`."""
    from harness_core.hooks import BeforeNavigationResult

    kit = await make_kit(backend, tmp_path, [text("a1"), text("a2")])
    first = await kit.harness.prompt("q1")
    assert isinstance(first, Ok)
    assert isinstance(await kit.harness.prompt("q2"), Ok)
    leaf = await kit.harness.get_leaf_id()

    async def decline(event: Any) -> BeforeNavigationResult:
        return BeforeNavigationResult(decline=True)

    kit.harness.hooks.on("before_navigation", decline, id="test.decline")
    kit.writes.clear()
    requests = len(kit.model.requests)
    result = await kit.harness.navigate_tree(first.value.final_entry_id, summarize=True)
    assert isinstance(result, Ok) and result.value.kind == "declined", result
    assert kit.writes[-1] == ("R", "operation_finished:declined")
    assert ("L", "main") not in kit.writes and len(kit.model.requests) == requests
    assert await kit.harness.get_leaf_id() == leaf


async def test_before_navigation_supplies_the_summary_and_no_summary_step_runs(
    backend: str, tmp_path: Path
) -> None:
    """S2-076, S2-062: a supplied summary skips the summary step; the usage the hook reports is
    a `usage` record beside the summary entry."""
    from harness_core.hooks import BeforeNavigationResult, SummaryResult
    from harness_core.messages import TokenUsage

    kit = await make_kit(backend, tmp_path, [text("a1"), text("a2")])
    first = await kit.harness.prompt("q1")
    assert isinstance(first, Ok)
    assert isinstance(await kit.harness.prompt("q2"), Ok)

    async def supply_summary(event: Any) -> BeforeNavigationResult:
        return BeforeNavigationResult(
            summary=SummaryResult(
                summary="the host's summary", usage=TokenUsage(input=7, output=3, total_tokens=10)
            )
        )

    kit.harness.hooks.on("before_navigation", supply_summary, id="test.supply")
    requests = len(kit.model.requests)
    result = await kit.harness.navigate_tree(first.value.final_entry_id, summarize=True)
    assert isinstance(result, Ok) and result.value.kind == "completed", result
    assert len(kit.model.requests) == requests  # no summary step
    entry = await kit.storage.get_entry(result.value.entry_id)  # type: ignore[arg-type]
    assert entry is not None and entry.entry.summary == "the host's summary"  # type: ignore[union-attr]
    usage = [
        item.record
        for item in await kit.storage.get_log()
        if isinstance(item, StoredRecord) and item.record.type == "usage"
    ]
    reported = [u for u in usage if u.entry_id == result.value.entry_id]
    assert [(u.usage.input, u.usage.output) for u in reported] == [(7, 3)]


async def test_usage_a_tool_reports_is_a_record_beside_its_result(
    backend: str, tmp_path: Path
) -> None:
    """S2-062: a tool's own nested model work (`ToolOutput.usage`) lands as a `usage` record
    whose entry is the tool's result entry."""
    from harness_core.messages import TokenUsage
    from harness_core.tools import ToolOutput

    async def summarize(args: Any, ctx: ToolContext) -> ToolOutput:
        return ToolOutput(
            content=(ToolOutput.text("short").content[0],),
            usage=TokenUsage(input=120, output=30, total_tokens=150),
        )

    kit = await make_kit(
        backend,
        tmp_path,
        [tool_call("summarize", call_id="c1"), text("done")],
        tools=[Tool(name="summarize", description="s", execute=summarize)],
    )
    assert isinstance(await kit.harness.prompt("go"), Ok)
    log = await kit.storage.get_log()
    results = [
        item.entry.id
        for item in log
        if isinstance(item, StoredEntry)
        and item.entry.type == "message"
        and item.entry.message.role == "tool_result"
    ]
    usage = [
        item.record
        for item in log
        if isinstance(item, StoredRecord)
        and item.record.type == "usage"
        and item.record.entry_id in results
    ]
    assert [(u.usage.input, u.usage.output) for u in usage] == [(120, 30)]


async def test_a_checkpoint_applies_pending_writes_before_it_consumes_steering(
    backend: str, tmp_path: Path
) -> None:
    """S2-047: the checkpoint's fixed order, with both kinds waiting at once: the pending write
    (a capability's data, deferred while the run is open) lands first, then the steering."""
    from harness_core.portable import CapabilityState

    holder: dict[str, Kit] = {}

    async def both(ctx: ToolContext) -> None:
        harness = holder["kit"].harness
        assert isinstance(await harness.steer("focus on the tests"), Ok)
        await harness.set_capability("acme.notes", CapabilityState(version="1", data="n"))

    kit = await make_kit(
        backend, tmp_path, [tool_call("act"), text("done")], tools=[tool_that(both)]
    )
    holder["kit"] = kit
    assert isinstance(await kit.harness.prompt("go"), Ok)
    after = after_tool_call(kit)
    result = after.index(("E", "message:tool_result:ok"))
    assert after[result + 1][1].startswith("custom")  # the pending write first
    assert after[result + 2] == ("E", "message:user")  # then the steering message
    await assert_append_only(kit)


async def test_consumed_input_rearms_the_overflow_guard(backend: str, tmp_path: Path) -> None:
    """S2-074 (D25): a length stop under pressure is recovered once; only conversational input
    consumed since (here a steer, at the checkpoint after a tool) allows a second recovery."""
    from harness_core.models import ModelInfo

    holder: dict[str, Kit] = {}

    async def steer(ctx: ToolContext) -> None:
        assert isinstance(await holder["kit"].harness.steer("and the docs"), Ok)

    kit = await make_kit(
        backend,
        tmp_path,
        [
            text("first answer"),
            length("cut", output_tokens=3, input_tokens=PRESSED),
            text("summary"),
            tool_call("act"),
            length("cut again", output_tokens=2, input_tokens=PRESSED),
            text("summary two"),
            text("done"),
        ],
        tools=[tool_that(steer)],
        compaction=CompactionSettings(keep_recent_tokens=10),
    )
    holder["kit"] = kit
    kit.model.info = ModelInfo(context_window=100_000, max_output_tokens=1_000)
    await two_turns(kit)
    result = await kit.harness.prompt("second")
    assert isinstance(result, Ok) and result.value.kind == "completed", result
    assert kit.writes.count(("E", "compaction")) == 2
    await assert_append_only(kit)
