"""The self-check at an operation's end: drift (another writer changed the lane) faults the
harness; a harness that alone writes its lanes never trips it.
"""

from __future__ import annotations

import pytest

from harness_core._runtime.restore import restore_lane
from harness_core.errors import HarnessFault, RecordLogCorruption
from harness_core.messages import user_message
from harness_core.models.scripted import text
from harness_core.session.entries import MessageEntry
from harness_core.session.records import OperationFinished, QueueEnqueued
from tests.support.harness_kit import make_kit
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
