"""The self-check at an operation's end: drift (another writer changed the lane) faults the
harness; a harness that alone writes its lanes never trips it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import harness_core.harness as harness_module
from harness_core._runtime.restore import restore_lane
from harness_core.errors import HarnessFault, RecordLogCorruption
from harness_core.messages import user_message
from harness_core.models.scripted import text
from harness_core.session.entries import MessageEntry
from harness_core.session.records import OperationFinished, QueueEnqueued
from tests.support.harness_kit import Kit, make_kit
from tests.support.surface import collect, entry_texts, ok, records_of, reopen, texts, transcript


async def test_drift_faults_the_harness(backend, tmp_path) -> None:
    """Another writer appends to the lane's log behind the harness's back (the ownership rule
    broken): the self-check at the next operation end recomputes the lane from storage, finds
    a queued item the live state never saw, and faults."""
    kit = await make_kit(backend, tmp_path, [text("a1")])
    first = ok(await kit.harness.prompt("q1"))
    user_entry = (await transcript(kit))[0].id
    sneaked = MessageEntry(id="sneaked-entry", message=user_message("behind your back"))
    await kit.storage.append_record(
        QueueEnqueued(id="sneaked", lane="main", queue="next_run", run_id=None, target=sneaked)
    )
    faults = collect(kit, "fault")
    with pytest.raises(HarnessFault) as caught:
        await kit.harness.navigate_tree(user_entry)  # needs no model; ends with the self-check
    cause = caught.value.__cause__
    assert isinstance(cause, RecordLogCorruption) and cause.reason == "drift"
    assert len(faults) == 1
    finished = await records_of(kit, OperationFinished)
    assert len(finished) == 2, "the navigation itself committed before the check"
    with pytest.raises(HarnessFault):
        await kit.harness.prompt("q2")
    # storage is the truth: a reopened harness sees the item and the next run captures it
    fresh_kit = await reopen(kit, "r-", script=[text("a2")])
    assert fresh_kit.suspended == []
    assert await fresh_kit.harness.get_leaf_id() == user_entry != first.leaf_id
    ok(await fresh_kit.harness.prompt("q2"))
    assert texts(fresh_kit.model.requests[-1].messages)[-2:] == ["behind your back", "q2"]


async def test_the_self_check_passes_when_only_the_harness_writes(backend, tmp_path) -> None:
    """The converse of drift: a harness that alone writes its lanes never trips the check."""
    kit = await make_kit(backend, tmp_path, [text("a1"), text("a2")])
    faults = collect(kit, "fault")
    ok(await kit.harness.prompt("q1"))
    ok(await kit.harness.next_run("later"))
    ok(await kit.harness.navigate_tree((await transcript(kit))[0].id))
    ok(await kit.harness.prompt("q2"))
    ok(await kit.harness.next_run("pending"))
    state = await restore_lane(kit.storage, "main")
    assert entry_texts(state.pending_next_run) == ["pending"]
    assert state.leaf_id == await kit.harness.get_leaf_id() and faults == []


async def test_a_message_accepted_while_the_check_reads_waits_for_it(
    backend, tmp_path, monkeypatch
) -> None:
    """Check first: the next run on the lane is accepted as soon as the last one finished, while
    the self-check is still reading the lane back. The check holds the lane's line, so the accept
    waits for it instead of landing mid-read (which the check would call drift)."""
    kit = await make_kit(backend, tmp_path, [text("a1"), text("a2")])
    faults = collect(kit, "fault")
    reading, release = asyncio.Event(), asyncio.Event()

    async def slow_restore(storage: Any, lane: str) -> Any:
        if not reading.is_set():
            reading.set()
            await release.wait()
        return await restore_lane(storage, lane)

    monkeypatch.setattr(harness_module, "restore_lane", slow_restore)
    first = asyncio.ensure_future(kit.harness.prompt("q1"))
    await asyncio.wait_for(reading.wait(), 5)
    second = asyncio.ensure_future(kit.harness.prompt("q2"))
    for _ in range(50):
        await asyncio.sleep(0)
    assert "q2" not in await logged_texts(kit), "accepted while the check was reading"
    release.set()
    ok(await first)
    ok(await second)
    assert faults == []
    assert await logged_texts(kit) == ["q1", "a1", "q2", "a2"]


async def test_a_run_accepted_before_the_check_is_seen_by_it(backend, tmp_path) -> None:
    """Accept first: the next run is accepted (and even answered) between the last run's
    `operation_finished` and its self-check; the check then reads the lane with that run in it
    and finds no drift."""
    kit = await make_kit(backend, tmp_path, [text("a1"), text("a2")])
    faults = collect(kit, "fault")
    paused, release = asyncio.Event(), asyncio.Event()
    recording = kit.recording
    assert recording is not None
    sync = recording.sync

    async def pausing_sync(*, point: bool = True) -> None:
        # the procedure's last barrier, after its operation_finished, before the check
        finished = any(kind == "R" and d.startswith("operation_finished") for kind, d in kit.writes)
        if finished and not paused.is_set():
            paused.set()
            await release.wait()
        await sync(point=point)

    recording.sync = pausing_sync  # type: ignore[attr-defined]
    first = asyncio.ensure_future(kit.harness.prompt("q1"))
    await asyncio.wait_for(paused.wait(), 5)
    ok(await kit.harness.prompt("q2"))
    release.set()
    ok(await first)
    assert faults == []
    assert await logged_texts(kit) == ["q1", "a1", "q2", "a2"]


async def logged_texts(kit: Kit) -> list[str]:
    return entry_texts(stored.entry for stored in await transcript(kit))
