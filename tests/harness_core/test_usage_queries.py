"""The cost of an entry and of a lane: read-time sums of the usage ledger (reference §8.3)."""

from __future__ import annotations

from pathlib import Path

from harness_core.messages import TokenUsage
from harness_core.models.scripted import error, text
from harness_core.result import Ok
from harness_core.session.records import Usage
from harness_core.session.types import StoredRecord
from tests.support.harness_kit import make_kit


async def test_an_entrys_cost_and_a_lanes_ledger_are_bounded_sums(
    backend: str, tmp_path: Path
) -> None:
    kit = await make_kit(
        backend,
        tmp_path,
        [error("overloaded"), text("answer", output_tokens=7), text("other lane")],
    )
    result = await kit.harness.prompt("hello")
    assert isinstance(result, Ok) and result.value.final_entry_id is not None
    answer = result.value.final_entry_id
    records = [
        i.record
        for i in await kit.storage.get_log()
        if isinstance(i, StoredRecord) and isinstance(i.record, Usage)
    ]
    bound = [r.usage for r in records if r.entry_id == answer]
    assert len(bound) == 1  # a failed attempt is billed to its own (never-written) entry id
    failed = [r for r in records if r.stop_reason == "error"]
    assert len(failed) == 1 and failed[0].entry_id != answer
    other = (await kit.harness.create_lane("b", None)).value  # type: ignore[union-attr]
    assert isinstance(await other.record_usage(TokenUsage(output=-2), entry_id=answer), Ok)
    assert isinstance(await other.prompt("hi"), Ok)
    cost = await kit.harness.get_usage(answer)
    assert cost.output == sum(u.output for u in bound) - 2
    main_lane = await kit.harness.get_usage()  # the failed attempt included
    assert main_lane.output == sum(r.usage.output for r in records if r.lane == "main")
    assert main_lane.output >= 7
    lane_b = await other.get_usage()
    stats = await kit.storage.get_stats()
    assert main_lane.output + lane_b.output == stats.usage.output
    assert (await kit.harness.get_usage("nothing-billed")) == TokenUsage()
