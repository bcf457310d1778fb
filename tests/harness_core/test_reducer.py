"""The pure reduction: one table row per corruption reason, purity, and every canonical prefix."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from harness_core._runtime.reduction import LaneSlice, reduce_lane
from harness_core._runtime.restore import restore_lane
from harness_core.errors import CorruptionReason, RecordLogCorruption
from harness_core.messages import AssistantMessage, TextPart, ToolCallPart, UserMessage
from harness_core.session.entries import Entry, MessageEntry
from harness_core.session.records import (
    AbortRequested,
    ApprovalDecided,
    ApprovalDecision,
    CompactionIntent,
    LaneConfiguration,
    OperationFinished,
    OperationStarted,
    QueueCancelled,
    QueueEnqueued,
    Record,
    RunIntent,
    StepAttempt,
    ToolStarted,
)
from harness_core.session.types import SessionMetadata, StoredEntry, StoredRecord
from harness_core.storage.memory import MemorySessionRepo
from harness_core.testing import ManualClock
from harness_core.testing.trajectories import SCENARIOS, Scenario, trajectory

CONFIG = LaneConfiguration(provider="scripted", model_id="test")
LANE = "main"


class Trace:
    """Builds a lane's slice item by item, with increasing seqs."""

    def __init__(self) -> None:
        self.items: list[StoredEntry | StoredRecord] = []
        self._seq = itertools.count(1)
        self.leaf: str | None = None

    def record(self, record: Record) -> Trace:
        self.items.append(StoredRecord(seq=next(self._seq), timestamp=1, record=record))
        return self

    def entry(self, entry: Entry) -> Trace:
        self.items.append(
            StoredEntry(
                seq=next(self._seq), timestamp=1, lane=LANE, parent_id=self.leaf, entry=entry
            )
        )
        self.leaf = entry.id
        return self

    def slice(self, leaf: str | None = "<leaf>") -> LaneSlice:
        return LaneSlice(
            lane=LANE, leaf_id=self.leaf if leaf == "<leaf>" else leaf, items=tuple(self.items)
        )


def user(entry_id: str, text: str = "hi") -> MessageEntry:
    return MessageEntry(id=entry_id, message=UserMessage(content=(TextPart(text=text),)))


def assistant(entry_id: str, *calls: tuple[str, str]) -> MessageEntry:
    parts = tuple(ToolCallPart(id=call_id, name=name, arguments={}) for call_id, name in calls)
    return MessageEntry(
        id=entry_id,
        message=AssistantMessage(
            content=parts or (TextPart(text="ok"),), stop_reason="tool_use" if parts else "stop"
        ),
    )


def run(op_id: str = "op1", *initial: Entry) -> OperationStarted:
    intent = RunIntent(original_prompt=(), initial_messages=initial or (user("u1"),))
    return OperationStarted(
        id=op_id, lane=LANE, source_leaf_id=None, intent=intent, configuration=CONFIG
    )


def attempt(n: int, result: str = "a1", step: str = "assistant", **extra: object) -> StepAttempt:
    return StepAttempt(
        id=f"s{n}-{result}",
        lane=LANE,
        run_id="op1",
        step=step,
        attempt=n,
        result_entry_id=result,
        **extra,
    )


def started(index: int = 0, *, assistant_id: str = "a1", call: str = "c1") -> ToolStarted:
    return ToolStarted(
        id=f"t{index}",
        lane=LANE,
        run_id="op1",
        assistant_entry_id=assistant_id,
        tool_index=index,
        tool_call_id=call,
        tool_name="echo",
        effective_args={},
        result_entry_id=f"r{index}",
        replay="never",
    )


def running() -> Trace:
    return Trace().record(run()).entry(user("u1"))


def compaction_op() -> Trace:
    start = OperationStarted(
        id="op1",
        lane=LANE,
        source_leaf_id=None,
        intent=CompactionIntent(result_entry_id="k1"),
        configuration=CONFIG,
    )
    return Trace().record(start)


ROWS: dict[CorruptionReason, Callable[[], LaneSlice]] = {
    "multiple_open_operations": lambda: running().record(run("op2")).slice(),
    "unknown_operation": lambda: (
        running()
        .record(OperationFinished(id="f", lane=LANE, run_id="op9", outcome="completed"))
        .slice()
    ),
    "attempts_not_consecutive": lambda: running().record(attempt(2)).slice(),
    "compaction_reason": lambda: compaction_op().record(attempt(1, "k1", "compaction")).slice(),
    "queue_after_abort": lambda: (
        running()
        .record(AbortRequested(id="ab", lane=LANE, run_id="op1"))
        .record(QueueEnqueued(id="q", lane=LANE, queue="steer", run_id="op1", target=user("u2")))
        .slice()
    ),
    "cancel_unknown_item": lambda: (
        running().record(QueueCancelled(id="qc", lane=LANE, run_id="op1", entry_id="nope")).slice()
    ),
    "structural_step_mismatch": lambda: (
        compaction_op()
        .record(attempt(1, "k1", "compaction", compaction_reason="manual"))
        .record(attempt(2, "k2", "compaction", compaction_reason="manual"))
        .slice()
    ),
    "tool_identity_mismatch": lambda: (
        running()
        .record(attempt(1))
        .entry(assistant("a1", ("c1", "echo")))
        .record(started(0, call="c7"))
        .slice()
    ),
    "duplicate_tool_start": lambda: (
        running()
        .record(attempt(1))
        .entry(assistant("a1", ("c1", "echo")))
        .record(started(0))
        .record(started(0))
        .slice()
    ),
    "content_mismatch": lambda: Trace().record(run()).entry(user("u1", "something else")).slice(),
    "branch_summary_in_run": lambda: running().record(attempt(1, "b1", "branch_summary")).slice(),
    "leaf_mismatch": lambda: running().slice(leaf="elsewhere"),
    "approval_mismatch": lambda: (
        running()
        .record(attempt(1))
        .entry(assistant("a1", ("c1", "echo")))
        .record(
            ApprovalDecided(
                id="d",
                lane=LANE,
                run_id="op1",
                wait_id="w",
                idempotency_key="k",
                decisions=(ApprovalDecision(tool_call_id="c1", args_digest="x", approved=True),),
            )
        )
        .slice()
    ),
}


def test_the_table_has_a_row_per_reason_the_reduction_can_find() -> None:
    # `drift` is the self-check's (the live state disagrees with a fresh reduction): see
    # test_surface_self_check.py::test_drift_faults_the_harness
    assert set(ROWS) == set(CorruptionReason.__args__) - {"drift"}  # type: ignore[attr-defined]


@pytest.mark.parametrize("reason", sorted(ROWS))
def test_each_corruption_is_rejected_with_its_reason(reason: CorruptionReason) -> None:
    lane_slice = ROWS[reason]()
    with pytest.raises(RecordLogCorruption) as caught:
        reduce_lane(lane_slice)
    assert caught.value.reason == reason


def test_a_valid_slice_reduces_purely_and_leaves_its_input_alone() -> None:
    trace = (
        running()
        .record(attempt(1))
        .entry(assistant("a1", ("c1", "echo"), ("c2", "echo")))
        .record(started(0))
        .record(QueueEnqueued(id="q", lane=LANE, queue="steer", run_id="op1", target=user("u2")))
    )
    lane_slice = trace.slice()
    before = lane_slice.items
    first, second = reduce_lane(lane_slice), reduce_lane(lane_slice)
    assert first == second and lane_slice.items == before
    op = first.operation
    assert op is not None and op.tool_batch is not None
    assert [c.started is not None for c in op.tool_batch.calls] == [True, False]
    assert [e.id for e in op.pending_steer] == ["u2"] and op.missing_initial == ()
    assert first.leaf_id == "a1"


def test_items_out_of_order_reduce_by_seq() -> None:
    trace = running().record(attempt(1)).entry(assistant("a1"))
    shuffled = LaneSlice(lane=LANE, leaf_id="a1", items=tuple(reversed(trace.items)))
    assert reduce_lane(shuffled) == reduce_lane(trace.slice())


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_every_prefix_of_every_canonical_trace_reduces(scenario: Scenario) -> None:
    log = await trajectory(scenario)
    for k in range(len(log) + 1):
        repo = MemorySessionRepo(clock=ManualClock())
        await repo.import_session(SessionMetadata(id="s", created_at=1), log[:k])
        lease = await repo.acquire_lease("s", owner="t", ttl_ms=60_000)
        storage = await repo.open("s", lease=lease)
        for lane in await storage.get_lanes():
            state = await restore_lane(storage, lane.lane)
            assert state.leaf_id == lane.leaf_id
        await repo.close()
