"""`length` is genuine at min(caller cap, model cap); below it, it is context pressure (D31)."""

from __future__ import annotations

from pathlib import Path

from harness_core.hooks import RequestOptions
from harness_core.messages import message_text
from harness_core.models import ModelInfo
from harness_core.models.scripted import length, text
from harness_core.options import CompactionSettings
from harness_core.result import Ok
from tests.support.harness_kit import make_kit

MODEL_CAP = ModelInfo(context_window=100_000, max_output_tokens=1_000)


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


async def test_a_length_stop_below_both_caps_is_still_context_pressure(
    backend: str, tmp_path: Path
) -> None:
    kit = await make_kit(
        backend,
        tmp_path,
        [text("older answer"), length("cut", output_tokens=10), text("a summary"), text("full")],
        request_options=RequestOptions(max_output_tokens=50_000),
        compaction=CompactionSettings(keep_recent_tokens=1),
    )
    kit.model.info = MODEL_CAP
    assert isinstance(await kit.harness.prompt("first"), Ok)
    result = await kit.harness.prompt("second")
    assert isinstance(result, Ok) and result.value.kind == "completed"
    final = result.value.final_message
    assert final is not None and message_text(final) == "full"  # compacted, then retried
