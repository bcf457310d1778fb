"""Tier B: the exact order of durable writes (E entries, R records, L lane moves, G facts) and
hooks (H) for each canonical scenario, and the append-only-context check on every request."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from harness_core.context import message_text
from harness_core.hooks import BeforeRunEndEvent, BeforeRunEndResult
from harness_core.messages import UserMessage
from harness_core.model import ModelRequest
from harness_core.options import CompactionSettings
from harness_core.result import Ok
from harness_core.scripted import deferred, error, length, text, tool_call
from harness_core.session.entries import CompactionEntry
from harness_core.tools import Tool, ToolContext
from tests.support.harness_kit import Kit, make_kit

BACKENDS = ["memory", "sqlite"]

REQUEST_HOOKS = [("H", "before_request"), ("H", "transform_context")]


def step(attempt: int = 1) -> list[tuple[str, str]]:
    """One assistant attempt: the hooks and records around one model call."""
    return [
        ("H", "before_request"),
        ("R", f"step_attempt:assistant:{attempt}"),
        ("H", "transform_context"),
        ("H", "after_response"),
        ("R", "usage:assistant"),
    ]


def assert_append_only(kit: Kit) -> None:
    """Within a run, each request's messages extend the previous request's as an exact prefix,
    except across a compaction (requests for summaries are not conversation requests)."""
    previous: ModelRequest | None = None
    for request in kit.model.requests:
        if request.step != "assistant":
            previous = None  # a summary request, then a compacted context
            continue
        if previous is not None and not any(
            isinstance(m, UserMessage)
            and m.content
            and getattr(m.content[0], "text", "").startswith("Summary of")
            for m in request.messages[:1]
        ):
            assert request.messages[: len(previous.messages)] == previous.messages, (
                "context changed before the tail"
            )
        previous = request


async def echo(args: Any, ctx: ToolContext) -> str:
    return f"echo {args}"


ECHO = Tool(name="echo", description="echo", execute=echo)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


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
    assert_append_only(kit)


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


async def test_retries_exhausted_give_up(backend, tmp_path) -> None:
    kit = await make_kit(backend, tmp_path, [error("rate_limit")] * 3)
    result = await kit.harness.prompt("hi")
    assert isinstance(result, Ok) and result.value.kind == "failed"
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


async def test_terminal_error(backend, tmp_path) -> None:
    kit = await make_kit(backend, tmp_path, [error("invalid_request", retryable=False)])
    result = await kit.harness.prompt("hi")
    assert isinstance(result, Ok) and result.value.kind == "failed"
    assert kit.writes[-3:] == [
        ("R", "usage:assistant"),
        ("E", "message:assistant:error"),
        ("R", "operation_finished:failed"),
    ]


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
    assert_append_only(kit)


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
    assert_append_only(kit)


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
    from harness_core.model import ModelInfo
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
    assert_append_only(kit)


async def test_overflow_compacts_once_then_retries(backend, tmp_path) -> None:
    from harness_core.model import ModelInfo

    kit = await make_kit(
        backend,
        tmp_path,
        [text("first answer"), length("cut", output_tokens=3), text("summary"), text("fits now")],
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


async def test_length_twice_gives_up_after_one_recovery(backend, tmp_path) -> None:
    from harness_core.model import ModelInfo

    kit = await make_kit(
        backend,
        tmp_path,
        [
            text("first answer"),
            length("cut", output_tokens=3),
            text("summary"),
            length("cut again", output_tokens=2),
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


async def test_genuine_length_is_kept(backend, tmp_path) -> None:
    from harness_core.model import ModelInfo

    kit = await make_kit(backend, tmp_path, [length("all of it", output_tokens=1_000)])
    kit.model.info = ModelInfo(context_window=100_000, max_output_tokens=1_000)
    result = await kit.harness.prompt("write a lot")
    assert isinstance(result, Ok) and result.value.kind == "completed"
    assert ("E", "message:assistant:length") in kit.writes


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


async def test_navigation_moves_first_then_summary_and_label(backend, tmp_path) -> None:
    kit = await make_kit(backend, tmp_path, [text("a1"), text("a2"), text("what we did")])
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
