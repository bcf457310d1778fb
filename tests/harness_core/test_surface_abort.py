"""`abort()`: rejected without a write on an idle lane, accepted again without a second marker,
and a suspended deferred run's request cancelled (never redeemed).
"""

from __future__ import annotations

import asyncio
from typing import Any

from harness_core.messages import AssistantMessage
from harness_core.models.scripted import deferred, text, tool_call
from harness_core.session.records import AbortRequested, OperationFinished
from harness_core.tools import ToolContext
from tests.support.harness_kit import make_kit
from tests.support.surface import (
    Holder,
    acting_tool,
    collect,
    entry_texts,
    err,
    log_size,
    messages_of,
    ok,
    records_of,
    texts,
    transcript,
)


async def test_abort_on_an_idle_lane_is_rejected_without_a_write(backend, tmp_path) -> None:
    kit = await make_kit(backend, tmp_path, [text("ok")])
    ok(await kit.harness.prompt("hi"))  # a finished run is not abortable either
    before = await log_size(kit)
    assert err(await kit.harness.abort(), "NoActiveOperation").lane == "main"
    assert await log_size(kit) == before


async def test_a_second_abort_is_accepted_again_without_a_second_marker(backend, tmp_path) -> None:
    """D22: the second abort of the same operation resolves Ok with the same run id and empty
    payloads (the queues were already drained), writes nothing and emits no second event."""
    holder = Holder()
    inside: dict[str, Any] = {}

    async def abort_twice(ctx: ToolContext) -> None:
        ok(await holder.harness.steer("queued"))
        inside["first"] = ok(await holder.harness.abort())
        size = await log_size(holder.kit)
        inside["second"] = ok(await holder.harness.abort())
        inside["wrote"] = await log_size(holder.kit) - size

    kit = await make_kit(backend, tmp_path, [tool_call("act")], tools=[acting_tool(abort_twice)])
    holder.kit = kit
    aborts = collect(kit, "run_abort")
    outcome = ok(await kit.harness.prompt("go"))
    assert outcome.kind == "aborted"
    first, second = inside["first"], inside["second"]
    assert first.run_id == second.run_id == outcome.run_id
    assert entry_texts(first.steer) == ["queued"]
    assert (second.steer, second.follow_up) == ((), ())
    assert inside["wrote"] == 0
    assert len(await records_of(kit, AbortRequested)) == 1
    assert [texts(e.steer) for e in aborts] == [["queued"]]
    assert [r.outcome for r in await records_of(kit, OperationFinished)] == ["aborted"]
    err(await kit.harness.abort(), "NoActiveOperation")  # after the finish


async def test_abort_of_a_suspended_deferred_run_cancels_the_request(backend, tmp_path) -> None:
    kit = await make_kit(backend, tmp_path, [deferred("resp_1")])
    suspended = ok(await kit.harness.prompt("take your time"))
    assert suspended.kind == "suspended" and suspended.deferred is not None
    assert [(i.name, i.status) for i in await kit.harness.lanes()] == [("main", "suspended")]
    ends = collect(kit, "run_end")
    accepted = ok(await kit.harness.abort())
    assert accepted.run_id == suspended.run_id
    async with asyncio.timeout(10):
        await kit.harness.wait_for_idle()
    assert kit.model.cancels == [suspended.deferred]
    assert kit.model.fetches == []  # aborting never redeems the request
    assert [(e.run_id, e.outcome) for e in ends] == [(suspended.run_id, "aborted")]
    finished = await records_of(kit, OperationFinished)
    assert [(r.run_id, r.outcome) for r in finished] == [(suspended.run_id, "aborted")]
    stops = [
        m.stop_reason for m in messages_of(await transcript(kit)) if isinstance(m, AssistantMessage)
    ]
    assert stops == ["deferred", "aborted"]  # the deferred entry stays, then the closure
    assert [(i.name, i.status) for i in await kit.harness.lanes()] == [("main", "idle")]
