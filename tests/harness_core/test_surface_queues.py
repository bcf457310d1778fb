"""Queues: steer and follow-up need an active run, next-run items seed the next prompt, a busy
lane rejects a second operation, every outcome of `cancel_queued`, and what an abort drains.
"""

from __future__ import annotations

from typing import Any

from harness_core.messages import user_message
from harness_core.models.scripted import text, tool_call
from harness_core.options import CompactionSettings
from harness_core.result import Ok
from harness_core.session.records import OperationStarted, QueueCancelled, RunIntent
from harness_core.tools import ToolContext
from tests.support.harness_kit import make_kit
from tests.support.surface import (
    Holder,
    Waiter,
    acting_tool,
    collect,
    entry_texts,
    err,
    in_flight,
    log_size,
    messages_of,
    ok,
    records_of,
    texts,
    transcript,
)


async def test_steer_and_follow_up_need_an_active_run(backend, tmp_path) -> None:
    kit = await make_kit(backend, tmp_path)
    before = await log_size(kit)
    assert err(await kit.harness.steer("x"), "NoActiveRun").lane == "main"
    assert err(await kit.harness.follow_up("x"), "NoActiveRun").lane == "main"
    assert await log_size(kit) == before and kit.writes == []
    # input validation comes first and writes nothing either
    err(await kit.harness.next_run([]), "InvalidMessage")
    err(await kit.harness.next_run([user_message("a"), user_message("b")]), "InvalidMessage")
    err(await kit.harness.prompt([]), "InvalidMessage")
    assert await log_size(kit) == before


async def test_next_run_on_an_idle_lane_is_captured_by_the_next_prompt(backend, tmp_path) -> None:
    kit = await make_kit(backend, tmp_path, [text("first"), text("second")])
    seeded = ok(await kit.harness.next_run("seed first"))
    assert kit.writes == [("R", "queue_enqueued:next_run")]
    ok(await kit.harness.prompt("the prompt"))
    started = await records_of(kit, OperationStarted)
    intent = started[0].intent
    assert isinstance(intent, RunIntent)
    assert intent.initial_messages[0].id == seeded
    assert entry_texts(intent.initial_messages) == ["seed first", "the prompt"]
    assert texts(intent.original_prompt) == ["the prompt"]  # captured items are not the prompt
    assert texts(kit.model.requests[0].messages) == ["seed first", "the prompt"]
    # captured once: the next run starts from the prompt alone
    ok(await kit.harness.prompt("again"))
    second = (await records_of(kit, OperationStarted))[1].intent
    assert isinstance(second, RunIntent) and entry_texts(second.initial_messages) == ["again"]


async def test_a_busy_lane_rejects_a_second_operation(backend, tmp_path) -> None:
    waiter = Waiter()
    kit = await make_kit(
        backend,
        tmp_path,
        [text("a1"), tool_call("wait"), text("done")],
        tools=[waiter.tool],
        compaction=CompactionSettings(keep_recent_tokens=1),
    )
    ok(await kit.harness.prompt("q1"))  # an earlier turn: something a compaction could summarize
    task = await in_flight(kit, waiter)
    run_id = (await records_of(kit, OperationStarted))[-1].id
    before = await log_size(kit)
    busy = err(await kit.harness.prompt("another"), "LaneBusy")
    assert (busy.operation_id, busy.operation_kind) == (run_id, "run")
    err(await kit.harness.compact(), "LaneBusy")
    err(await kit.harness.resume(), "LaneBusy")
    assert await log_size(kit) == before
    waiter.release.set()
    assert ok(await task).kind == "completed"


async def test_cancel_queued_outcomes(backend, tmp_path) -> None:
    holder = Holder()
    inside: dict[str, Any] = {}

    async def steer_then_abort(ctx: ToolContext) -> None:
        queued = ok(await holder.harness.steer("killed by the abort"))
        ok(await holder.harness.abort())
        inside["queued"] = queued
        inside["after_abort"] = await holder.harness.cancel_queued(queued)

    kit = await make_kit(
        backend,
        tmp_path,
        [text("first"), tool_call("act")],
        tools=[acting_tool(steer_then_abort)],
    )
    holder.kit = kit
    harness = kit.harness
    # cancelled: a pending next-run item is retracted and never appended
    dropped = ok(await harness.next_run("drop me"))
    assert await harness.cancel_queued(dropped) == Ok("cancelled")
    assert await harness.cancel_queued(dropped) == Ok("already_cleared")  # an earlier cancel won
    # already consumed: the run appended it
    kept = ok(await harness.next_run("keep me"))
    ok(await harness.prompt("first"))
    assert await harness.cancel_queued(kept) == Ok("already_consumed")
    assert texts(kit.model.requests[0].messages) == ["keep me", "first"]
    assert await kit.storage.get_entry(dropped) is None
    # already cleared: an abort killed the steering item
    assert ok(await harness.prompt("second")).kind == "aborted"
    assert inside["after_abort"] == Ok("already_cleared")
    assert await harness.cancel_queued(inside["queued"]) == Ok("already_cleared")
    # unknown
    unknown = err(await harness.cancel_queued("no-such-item"), "UnknownQueueItem")
    assert (unknown.lane, unknown.entry_id) == ("main", "no-such-item")
    assert len(await records_of(kit, QueueCancelled)) == 1  # only the real cancellation wrote


async def test_abort_returns_the_drained_queues_and_next_run_survives(backend, tmp_path) -> None:
    holder = Holder()
    inside: dict[str, Any] = {}

    async def queue_then_abort(ctx: ToolContext) -> None:
        harness = holder.harness
        ok(await harness.steer("steer it"))
        ok(await harness.follow_up("then this"))
        inside["next"] = ok(await harness.next_run("for later"))
        inside["abort"] = ok(await harness.abort())
        inside["late"] = await harness.steer("too late")  # the run is aborting

    kit = await make_kit(
        backend,
        tmp_path,
        [tool_call("act"), text("next answer")],
        tools=[acting_tool(queue_then_abort)],
    )
    holder.kit = kit
    aborts = collect(kit, "run_abort")
    outcome = ok(await kit.harness.prompt("go"))
    assert outcome.kind == "aborted"
    accepted = inside["abort"]
    assert accepted.run_id == outcome.run_id
    assert entry_texts(accepted.steer) == ["steer it"]
    assert entry_texts(accepted.follow_up) == ["then this"]
    assert len(aborts) == 1
    assert (texts(aborts[0].steer), texts(aborts[0].follow_up)) == (["steer it"], ["then this"])
    err(inside["late"], "NoActiveRun")
    assert all("steer it" not in str(r.messages) for r in kit.model.requests)
    assert "steer it" not in texts(messages_of(await transcript(kit)))
    # the next-run item survived the abort and seeds the next run
    watch = await kit.harness.watch()
    assert [e.id for e in watch.snapshot.next_run] == [inside["next"]]
    watch.unsubscribe()
    ok(await kit.harness.prompt("next"))
    assert texts(kit.model.requests[-1].messages)[-2:] == ["for later", "next"]
