"""Restore: the bounded reads of one lane, reduced to its state (read-only, no effects).

Per lane: the open-operation projection (0 idle, 1 suspended, 2 corruption); the next-run queue
records since the newest run start; for an open operation, its records and the entries it
appended. Nothing here scans another lane's traffic or the session's older history.
"""

from __future__ import annotations

from harness_core._runtime.reduction import LaneSlice, LaneState, reduce_lane
from harness_core.errors import RecordLogCorruption, SessionError
from harness_core.session.contract import SessionStorage
from harness_core.session.records import NavigationIntent, OperationStarted
from harness_core.session.types import RecordQuery, StoredEntry, StoredRecord

__all__ = ["read_lane_slice", "restore_lane"]


async def read_lane_slice(storage: SessionStorage, lane: str) -> LaneSlice:
    """Read what reducing `lane` needs.

    Raises:
        RecordLogCorruption: the lane has two open operations.
        SessionError: ``unknown_lane``.
    """
    pointer = await storage.get_lane(lane)
    if pointer is None:
        raise SessionError("unknown_lane", f"lane {lane!r} does not exist")
    opened = await storage.find_open_operations(lane, limit=2)
    if len(opened) > 1:
        raise RecordLogCorruption(
            "multiple_open_operations",
            f"lane {lane!r} has open operations {[r.id for r in opened]}",
        )
    newest_run = await storage.find_records(
        RecordQuery(lane=lane, type="operation_started", operation_kind="run", limit=1)
    )
    queue_after = newest_run[0].seq if newest_run else 0
    op_seq = opened[0].seq if opened else None
    items: dict[int, StoredEntry | StoredRecord] = {}
    for record_type in ("queue_enqueued", "queue_cancelled"):
        for record in await storage.find_records(
            RecordQuery(lane=lane, type=record_type, after_seq=queue_after, order="oldest_first")
        ):
            # next-run items carry no run id; before the open operation only they matter
            if getattr(record.record, "run_id", None) is None and (
                op_seq is None or record.seq < op_seq
            ):
                items[record.seq] = record
    if opened:
        start = opened[0].record
        assert isinstance(start, OperationStarted)
        for record in await storage.read_operation_records(lane, start.id):
            items[record.seq] = record
        for entry in await _own_entries(storage, lane, start, pointer.leaf_id):
            items[entry.seq] = entry
    finished = await storage.find_records(
        RecordQuery(lane=lane, type="operation_finished", limit=1)
    )
    return LaneSlice(
        lane=lane,
        leaf_id=pointer.leaf_id,
        items=tuple(items[s] for s in sorted(items)),
        last_finished=finished[0] if finished else None,
    )


async def _own_entries(
    storage: SessionStorage, lane: str, start: OperationStarted, leaf_id: str | None
) -> tuple[StoredEntry, ...]:
    intent = start.intent
    if isinstance(intent, NavigationIntent):
        # Navigation moves first: before the move the leaf is the source and nothing was
        # appended; after it, the operation's entries hang below the target.
        if leaf_id == start.source_leaf_id:
            return ()
        return await storage.read_lane_entries(lane, after=intent.target_id)
    try:
        return await storage.read_lane_entries(lane, after=start.source_leaf_id)
    except SessionError as exc:
        if exc.code != "invalid_query":
            raise
        # the anchor is not on the lane's path: the lane was moved off its open operation
        raise RecordLogCorruption(
            "leaf_mismatch",
            f"lane {lane!r} is at {leaf_id!r}, off the path of its open operation {start.id!r}",
        ) from exc


async def restore_lane(storage: SessionStorage, lane: str) -> LaneState:
    """The lane's state, reduced from storage."""
    return reduce_lane(await read_lane_slice(storage, lane))
