"""`length` is context pressure only when the prompt left less room than the intended cap.

The intended cap is min(caller cap, model cap) (D31, D48). A stop at it is genuine; a stop below
it with room to spare in the window is the provider's own output cap (D132): genuine too, the
answer is kept and nothing is compacted. Only a prompt that left too little room is pressure.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness_core.hooks import RequestOptions
from harness_core.messages import (
    AssistantMessage,
    StopReason,
    TextPart,
    TokenUsage,
    message_text,
)
from harness_core.models import ModelInfo, is_recoverable_length
from harness_core.models.scripted import length, text
from harness_core.options import CompactionSettings
from harness_core.result import Ok
from harness_core.session.types import RecordQuery
from tests.support.harness_kit import make_kit

MODEL_CAP = ModelInfo(context_window=100_000, max_output_tokens=1_000)


def stop(output: int, prompt: int, reason: StopReason = "length") -> AssistantMessage:
    return AssistantMessage(
        content=(TextPart(text="..."),),
        stop_reason=reason,
        usage=TokenUsage(input=prompt, output=output, total_tokens=prompt + output),
    )


# (case, message, intended cap, context window, compaction helps)
CASES = [
    ("the intended cap reached", stop(1_024, 10), 1_024, 128_000, False),
    ("the provider's own cap, one word in (issue 24)", stop(100, 4), 8_192, 128_000, False),
    ("the provider's default max_tokens below the intent", stop(4_096, 900), 8_192, 128_000, False),
    ("nothing came, the prompt small", stop(0, 5), 8_192, 128_000, False),
    ("a prompt of 268,009 in a 272,000 window", stop(3_991, 268_009), 8_192, 272_000, True),
    ("a prompt of 81,217 in an 84,500 window", stop(3_283, 81_217), 8_192, 84_500, True),
    ("16 reasoning tokens of a clamped 128k intent", stop(16, 150_000), 128_000, 200_000, True),
    ("a Qwen-style empty length at a full window", stop(0, 32_700), 8_192, 32_768, True),
    ("no window known: below the cap is pressure", stop(100, 4), 8_192, None, True),
    ("not a length stop", stop(5, 127_999, "stop"), 8_192, 128_000, False),
]


@pytest.mark.parametrize(
    ("message", "cap", "window", "recoverable"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_which_length_stops_compaction_can_help(
    message: AssistantMessage, cap: int, window: int | None, recoverable: bool
) -> None:
    assert is_recoverable_length(message, cap, window) is recoverable


async def test_the_providers_own_cap_delivers_what_came_and_compacts_nothing(
    backend: str, tmp_path: Path
) -> None:
    # no caller cap: the intended cap is the model's 1,000; the provider stopped at 100
    kit = await make_kit(backend, tmp_path, [length("Hello! Deploys are open", output_tokens=100)])
    kit.model.info = MODEL_CAP
    result = await kit.harness.prompt("hello")
    assert isinstance(result, Ok) and result.value.kind == "completed", result
    final = result.value.final_message
    assert final is not None and final.stop_reason == "length"
    assert message_text(final) == "Hello! Deploys are open"
    assert len(kit.model.requests) == 1  # no compaction, no retry
    usage = await kit.storage.find_records(RecordQuery(type="usage"))
    assert [u.record.usage.output for u in usage] == [100]  # type: ignore[union-attr]


async def test_a_caller_cap_above_the_models_cap_keeps_a_length_stop_at_the_models_cap(
    backend: str, tmp_path: Path
) -> None:
    kit = await make_kit(
        backend,
        tmp_path,
        [length("a long answer", output_tokens=1_000)],
        request_options=RequestOptions(max_output_tokens=50_000),
    )
    kit.model.info = MODEL_CAP
    result = await kit.harness.prompt("write a lot")
    assert isinstance(result, Ok) and result.value.kind == "completed", result
    final = result.value.final_message
    assert final is not None and message_text(final) == "a long answer"
    assert final.stop_reason == "length"
    assert len(kit.model.requests) == 1  # no compaction, no retry


async def test_a_caller_cap_below_the_models_cap_is_the_intended_cap(
    backend: str, tmp_path: Path
) -> None:
    kit = await make_kit(
        backend,
        tmp_path,
        [length("short", output_tokens=200)],
        request_options=RequestOptions(max_output_tokens=200),
    )
    kit.model.info = MODEL_CAP
    result = await kit.harness.prompt("be brief")
    assert isinstance(result, Ok) and result.value.kind == "completed"
    assert len(kit.model.requests) == 1


async def test_a_length_stop_with_no_room_left_is_still_context_pressure(
    backend: str, tmp_path: Path
) -> None:
    kit = await make_kit(
        backend,
        tmp_path,
        [
            text("older answer"),
            length("cut", output_tokens=10, input_tokens=99_500),  # 500 left of a 1,000 cap
            text("a summary"),
            text("full"),
        ],
        request_options=RequestOptions(max_output_tokens=50_000),
        compaction=CompactionSettings(keep_recent_tokens=1),
    )
    kit.model.info = MODEL_CAP
    assert isinstance(await kit.harness.prompt("first"), Ok)
    result = await kit.harness.prompt("second")
    assert isinstance(result, Ok) and result.value.kind == "completed"
    final = result.value.final_message
    assert final is not None and message_text(final) == "full"  # compacted, then retried
