"""The pure reduction of a lane's bounded durable slice into its `LaneState`.

No I/O, no clock, no ids: the same function restore uses on storage reads and the fixed-point
self-check uses to compare against the live state.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from harness_core.session.records import NavigationIntent, OperationFinished
from harness_core.session.types import StoredEntry, StoredRecord
from harness_core.state import (
    FinishedOperation,
    LaneState,
    RecordLogCorruption,
    advance,
    idle_lane,
)

__all__ = ["LaneSlice", "reduce_lane"]


@dataclass(frozen=True, slots=True)
class LaneSlice:
    """What restore reads of one lane: its leaf and a bounded, seq-ordered list of items.

    `items` holds the next-run queue records since the lane's newest run start (older ones were
    captured by that run), then the open operation's records and the entries it appended.
    """

    lane: str
    leaf_id: str | None
    items: tuple[StoredEntry | StoredRecord, ...]
    last_finished: StoredRecord | None = None
    """The lane's newest `OperationFinished` (how its last operation ended), if any."""


def reduce_lane(lane_slice: LaneSlice) -> LaneState:
    """Fold a slice into the lane's state.

    Raises:
        RecordLogCorruption: the slice is a state no single writer can produce.
    """
    state = idle_lane(lane_slice.lane, None)
    finished = lane_slice.last_finished
    if finished is not None:
        record = finished.record
        if not isinstance(record, OperationFinished):
            raise RecordLogCorruption(
                "unknown_operation", f"{finished.id!r} is not an operation_finished record"
            )
        state = replace(
            state,
            last_finished=FinishedOperation(
                run_id=record.run_id, outcome=record.outcome, error=record.error
            ),
        )
    own_leaf: str | None = None
    for item in sorted(lane_slice.items, key=lambda i: i.seq):
        if isinstance(item, StoredEntry):
            own_leaf = item.id
        state = advance(state, item)
    op = state.operation
    if op is not None:
        allowed: set[str | None] = {own_leaf} if own_leaf is not None else {op.source_leaf_id}
        if isinstance(op.intent, NavigationIntent) and own_leaf is None:
            allowed.add(op.intent.target_id)
        if lane_slice.leaf_id not in allowed:
            raise RecordLogCorruption(
                "leaf_mismatch",
                f"lane {lane_slice.lane!r} is at {lane_slice.leaf_id!r} but its open operation "
                f"{op.id!r} left it at {sorted(map(str, allowed))}",
            )
    return replace(state, leaf_id=lane_slice.leaf_id)
