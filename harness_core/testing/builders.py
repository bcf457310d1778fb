"""Small builders for durable entries and records, used by the conformance suite and tests."""

from __future__ import annotations

from harness_core.frozen import JsonValue
from harness_core.messages import (
    AssistantMessage,
    TextPart,
    TokenUsage,
    ToolResultMessage,
    user_message,
)
from harness_core.session.entries import CustomEntry, MessageEntry
from harness_core.session.records import (
    CompactionIntent,
    LaneConfiguration,
    NavigationIntent,
    OperationFinished,
    OperationKind,
    OperationStarted,
    RunIntent,
    StepAttempt,
)

TEST_CONFIGURATION = LaneConfiguration(provider="scripted", model_id="test")

__all__ = [
    "TEST_CONFIGURATION",
    "assistant_entry",
    "custom_entry",
    "operation_finished",
    "operation_started",
    "step_attempt",
    "tool_result_entry",
    "user_entry",
]


def user_entry(entry_id: str, text: str = "hello") -> MessageEntry:
    """A message entry holding a user message."""
    return MessageEntry(id=entry_id, message=user_message(text))


def assistant_entry(
    entry_id: str, text: str = "hi", usage: TokenUsage | None = None
) -> MessageEntry:
    """A message entry holding a settled assistant message."""
    return MessageEntry(
        id=entry_id,
        message=AssistantMessage(
            content=(TextPart(text=text),),
            stop_reason="stop",
            provider="test",
            model="m",
            usage=usage,
        ),
    )


def tool_result_entry(
    entry_id: str, call_id: str = "call-1", *, terminate: bool = False
) -> MessageEntry:
    """A message entry holding a tool result."""
    return MessageEntry(
        id=entry_id,
        message=ToolResultMessage(
            tool_call_id=call_id, tool_name="echo", content=(TextPart(text="ok"),)
        ),
        terminate=terminate,
    )


def custom_entry(entry_id: str, custom_type: str = "note", data: JsonValue = None) -> CustomEntry:
    """A custom entry."""
    return CustomEntry(id=entry_id, custom_type=custom_type, data=data)


def operation_started(
    run_id: str, lane: str = "main", kind: OperationKind = "run", source_leaf_id: str | None = None
) -> OperationStarted:
    """An operation start of the given kind with a minimal intent."""
    intent: RunIntent | CompactionIntent | NavigationIntent
    if kind == "run":
        intent = RunIntent(original_prompt=(), initial_messages=())
    elif kind == "compaction":
        intent = CompactionIntent(result_entry_id=f"{run_id}-result")
    else:
        intent = NavigationIntent(target_id=None)
    return OperationStarted(
        id=run_id,
        lane=lane,
        source_leaf_id=source_leaf_id,
        intent=intent,
        configuration=TEST_CONFIGURATION,
    )


def operation_finished(
    record_id: str, run_id: str, lane: str = "main", outcome: str = "completed"
) -> OperationFinished:
    """An operation finish."""
    return OperationFinished.model_validate(
        {"id": record_id, "lane": lane, "run_id": run_id, "outcome": outcome}
    )


def step_attempt(
    record_id: str, run_id: str, attempt: int, result_entry_id: str, lane: str = "main"
) -> StepAttempt:
    """An assistant step attempt."""
    return StepAttempt(
        id=record_id,
        lane=lane,
        run_id=run_id,
        step="assistant",
        attempt=attempt,
        result_entry_id=result_entry_id,
    )
