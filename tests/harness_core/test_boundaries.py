"""Values from outside the harness (providers, tools, hooks, callers) can fail one operation of
one lane, never the session: a provider anomaly is scoped to its lane, and a number that is not
valid durable data (NaN, infinity) never reaches the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness_core.events import HandlerError
from harness_core.hooks import BeforeCompactionResult, SummaryResult
from harness_core.messages import AssistantMessage, Cost, TextPart, TokenUsage, message_text
from harness_core.models.scripted import deferred, text, tool_call
from harness_core.options import CompactionSettings
from harness_core.result import Err, Ok
from harness_core.session.entries import CompactionEntry
from harness_core.session.records import OperationFinished, Usage
from harness_core.session.types import StoredEntry, StoredRecord
from harness_core.tools import Tool, ToolContext, ToolOutput
from tests.support.harness_kit import Kit, make_kit

NAN = float("nan")


def nan_usage(output: int = 5) -> TokenUsage:
    """A usage whose cost skipped validation (as a provider's `model_copy` can build it)."""
    cost = Cost().model_copy(update={"total": NAN, "output": float("inf")})
    return TokenUsage(output=output).model_copy(update={"cost": cost})


def errors(kit: Kit) -> list[HandlerError]:
    seen: list[HandlerError] = []
    kit.harness.events.on("handler_error", seen.append)
    return seen


async def finished(kit: Kit) -> list[OperationFinished]:
    return [
        i.record
        for i in await kit.storage.get_log()
        if isinstance(i, StoredRecord) and isinstance(i.record, OperationFinished)
    ]


async def assert_store_healthy(kit: Kit) -> None:
    """The log reads back, a restarted process restores it, and the ledger is finite."""
    log = await kit.storage.get_log()
    assert log and [i.seq for i in log] == list(range(1, len(log) + 1))
    stats = await kit.storage.get_stats()
    assert stats.usage.cost.total == stats.usage.cost.total  # not NaN
    reopened = await kit.reopen(script=[text("still here")])
    assert reopened.suspended == []
    assert isinstance(await reopened.harness.prompt("and now?"), Ok)


# -- a provider anomaly fails its lane only --------------------------------------------------------


async def test_a_changed_deferred_handle_fails_that_run_and_no_other_lane(
    backend: str, tmp_path: Path
) -> None:
    kit = await make_kit(backend, tmp_path, [deferred("resp_1"), text("lane b answers")])
    parked = await kit.harness.prompt("take your time")
    assert isinstance(parked, Ok) and parked.value.kind == "suspended"
    other = (await kit.harness.create_lane("b", None)).value  # type: ignore[union-attr]
    kit.model.fetch_script.append(deferred("resp_SOMETHING_ELSE"))
    failed = await kit.harness.resume()
    assert isinstance(failed, Ok) and failed.value.kind == "failed"
    assert failed.value.error is not None and failed.value.error.code == "provider_anomaly"
    assert [h.id for h in kit.model.cancels] == ["resp_1"]  # the original request is cancelled
    answered = await other.prompt("hello")  # the harness did not fault
    assert isinstance(answered, Ok) and answered.value.kind == "completed"
    assert [(f.lane, f.outcome) for f in await finished(kit)] == [
        ("main", "failed"),
        ("b", "completed"),
    ]
    again = await kit.harness.prompt("try again")  # the failed lane itself takes new work
    assert isinstance(again, Ok)


async def test_a_deferred_answer_to_a_summary_fails_the_compaction_only(
    backend: str, tmp_path: Path
) -> None:
    kit = await make_kit(
        backend,
        tmp_path,
        [text("a1"), text("a2"), deferred("resp_summary")],
        compaction=CompactionSettings(keep_recent_tokens=1),
    )
    for prompt in ("q1", "q2"):
        assert isinstance(await kit.harness.prompt(prompt), Ok)
    compacted = await kit.harness.compact()
    assert isinstance(compacted, Ok) and compacted.value.kind == "failed"
    assert compacted.value.error is not None
    assert compacted.value.error.code == "provider_anomaly"
    assert [h.id for h in kit.model.cancels] == ["resp_summary"]
    kit.model.script.append(text("a3"))
    assert isinstance(await kit.harness.prompt("q3"), Ok)


# -- invalid numbers never reach the store ---------------------------------------------------------


async def test_a_provider_nan_cost_keeps_the_answer_and_drops_the_bad_usage(
    backend: str, tmp_path: Path
) -> None:
    bad = AssistantMessage(content=(TextPart(text="the answer"),), stop_reason="stop").model_copy(
        update={"usage": nan_usage()}
    )
    kit = await make_kit(backend, tmp_path, [bad])
    reported = errors(kit)
    result = await kit.harness.prompt("what is it?")
    assert isinstance(result, Ok) and result.value.kind == "completed"
    final = result.value.final_message
    assert final is not None and message_text(final) == "the answer"
    assert final.usage == TokenUsage()
    assert [(e.kind, e.name) for e in reported] == [("model", "scripted:test")]
    assert "usage.cost" in reported[0].error
    await assert_store_healthy(kit)


async def test_a_provider_message_that_is_invalid_beyond_its_usage_is_a_retryable_error(
    backend: str, tmp_path: Path
) -> None:
    broken = tool_call("lookup", {"q": 1})
    parts = (broken.content[0].model_copy(update={"arguments": {"q": NAN}}),)
    kit = await make_kit(
        backend, tmp_path, [broken.model_copy(update={"content": parts}), text("recovered")]
    )
    reported = errors(kit)
    result = await kit.harness.prompt("go")
    assert isinstance(result, Ok) and result.value.kind == "completed"
    assert result.value.final_message is not None
    assert message_text(result.value.final_message) == "recovered"  # the retry answered
    assert [e.kind for e in reported] == ["model"]
    await assert_store_healthy(kit)


async def test_a_tool_output_with_a_nan_usage_becomes_an_error_result(
    backend: str, tmp_path: Path
) -> None:
    async def measure(args: Any, ctx: ToolContext) -> ToolOutput:
        return ToolOutput.text("measured").model_copy(update={"usage": nan_usage()})

    tool = Tool(name="measure", description="measure", execute=measure)
    kit = await make_kit(backend, tmp_path, [tool_call("measure", {}), text("done")], tools=[tool])
    reported = errors(kit)
    result = await kit.harness.prompt("measure it")
    assert isinstance(result, Ok) and result.value.kind == "completed"
    seen = kit.model.requests[-1].messages[-1]
    assert "measure returned an invalid result" in message_text(seen)
    assert [(e.kind, e.name) for e in reported] == [("tool", "measure")]
    await assert_store_healthy(kit)


async def test_a_hook_summary_with_a_nan_usage_is_ignored_and_the_model_summarizes(
    backend: str, tmp_path: Path
) -> None:
    kit = await make_kit(
        backend,
        tmp_path,
        [text("a1"), text("a2"), text("the model's summary")],
        compaction=CompactionSettings(keep_recent_tokens=1),
    )
    reported = errors(kit)

    async def supply(event: Any) -> BeforeCompactionResult:
        return BeforeCompactionResult(
            compaction=SummaryResult(summary="hook summary", usage=nan_usage())
        )

    kit.harness.hooks.on("before_compaction", supply)
    for prompt in ("q1", "q2"):
        assert isinstance(await kit.harness.prompt(prompt), Ok)
    compacted = await kit.harness.compact()
    assert isinstance(compacted, Ok) and compacted.value.kind == "completed"
    entry = next(
        i.entry
        for i in await kit.storage.get_log()
        if isinstance(i, StoredEntry) and isinstance(i.entry, CompactionEntry)
    )
    assert isinstance(entry, CompactionEntry) and entry.summary == "the model's summary"
    assert [(e.kind, e.name) for e in reported] == [("hook", "before_compaction")]
    await assert_store_healthy(kit)


async def test_a_caller_usage_adjustment_with_nan_is_refused_and_writes_nothing(
    backend: str, tmp_path: Path
) -> None:
    kit = await make_kit(backend, tmp_path)
    before = await kit.storage.get_stats()
    refused = await kit.harness.record_usage(nan_usage())
    assert isinstance(refused, Err) and refused.error.tag == "InvalidUsage"
    assert "cost" in refused.error.message
    assert await kit.storage.get_stats() == before
    fine = await kit.harness.record_usage(TokenUsage(output=-3))
    assert isinstance(fine, Ok)
    usage = [i.record for i in await kit.storage.get_log() if isinstance(i, StoredRecord)]
    assert [r.usage.output for r in usage if isinstance(r, Usage)] == [-3]
