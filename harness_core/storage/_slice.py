"""The restore read of one lane (`SessionStorage.read_lane_slice`), shared by every backend.

`compose_lane_slice` builds it from the contract's smaller bounded reads (memory, JSONL); SQLite
runs the same reads in one transaction and Redis in one script call. All of them hand the parts
to `assemble_lane_slice`, so the rule of what a slice holds lives here once.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness_core.errors import RecordLogCorruption, SessionError
from harness_core.session.contract import SessionStorage
from harness_core.session.records import NavigationIntent, OperationStarted, RecordType
from harness_core.session.types import LaneSlice, RecordQuery, StoredEntry, StoredRecord

__all__ = [
    "QUEUE_TYPES",
    "appended_entries",
    "assemble_lane_slice",
    "compose_lane_slice",
    "entries_anchor",
    "leaf_mismatch",
    "single_open_operation",
]

QUEUE_TYPES: tuple[RecordType, ...] = ("queue_enqueued", "queue_cancelled")
"""The record types of the next-run queue."""


def single_open_operation(lane: str, opened: Sequence[StoredRecord]) -> OperationStarted | None:
    """The lane's open operation (None when idle).

    Raises:
        RecordLogCorruption: ``multiple_open_operations``, a state no single writer produces.
    """
    if len(opened) > 1:
        raise RecordLogCorruption(
            "multiple_open_operations",
            f"lane {lane!r} has open operations {[r.id for r in opened]}",
        )
    if not opened:
        return None
    start = opened[0].record
    assert isinstance(start, OperationStarted)
    return start


def entries_anchor(start: OperationStarted, leaf_id: str | None) -> tuple[bool, str | None]:
    """Whether the open operation may have appended entries, and the entry they hang below.

    Navigation moves first: before the move the leaf is the source and nothing was appended;
    after it, the operation's entries hang below the target. Any other operation appends below
    the leaf it started from.
    """
    intent = start.intent
    if isinstance(intent, NavigationIntent):
        return leaf_id != start.source_leaf_id, intent.target_id
    return True, start.source_leaf_id


def leaf_mismatch(
    lane: str, leaf_id: str | None, start: OperationStarted, exc: SessionError
) -> RecordLogCorruption | None:
    """The corruption a failed read of the operation's entries shows, if any.

    An anchor off the lane's path means the lane was moved off its open operation; an anchor
    that is not in the session, that the store lost what the operation started from (a
    store restored from an older copy).
    """
    if exc.code == "not_found":
        return RecordLogCorruption(
            "leaf_mismatch",
            f"lane {lane!r}'s open operation {start.id!r} started from an entry the session "
            f"does not hold ({exc})",
        )
    if exc.code != "invalid_query":
        return None
    return RecordLogCorruption(
        "leaf_mismatch",
        f"lane {lane!r} is at {leaf_id!r}, off the path of its open operation {start.id!r}",
    )


async def appended_entries(
    storage: SessionStorage, lane: str, start: OperationStarted, leaf_id: str | None
) -> tuple[StoredEntry, ...]:
    """The entries the open operation `start` appended to the lane (at `leaf_id`)."""
    appended, after = entries_anchor(start, leaf_id)
    if not appended:
        return ()
    try:
        return await storage.read_lane_entries(lane, after=after)
    except SessionError as exc:
        corruption = leaf_mismatch(lane, leaf_id, start, exc)
        if corruption is None:
            raise
        raise corruption from exc


def assemble_lane_slice(
    lane: str,
    leaf_id: str | None,
    opened: Sequence[StoredRecord],
    queued: Sequence[StoredRecord],
    operation: Sequence[StoredRecord],
    entries: Sequence[StoredEntry],
    last_finished: StoredRecord | None,
) -> LaneSlice:
    """The slice from its parts.

    `queued`: the lane's queue records since its newest run start; only next-run items (no run
    id) from before the open operation are kept, as later ones belong to it. `operation`: the
    lane's records from the open operation's start; `entries`: what it appended.
    """
    op_seq = opened[0].seq if opened else None
    items: dict[int, StoredEntry | StoredRecord] = {}
    for record in queued:
        if getattr(record.record, "run_id", None) is None and (
            op_seq is None or record.seq < op_seq
        ):
            items[record.seq] = record
    for record in operation:
        items[record.seq] = record
    for entry in entries:
        items[entry.seq] = entry
    return LaneSlice(
        lane=lane,
        leaf_id=leaf_id,
        items=tuple(items[seq] for seq in sorted(items)),
        last_finished=last_finished,
    )


async def compose_lane_slice(storage: SessionStorage, lane: str) -> LaneSlice:
    """`read_lane_slice` from the contract's smaller reads, one after the other."""
    pointer = await storage.get_lane(lane)
    if pointer is None:
        raise SessionError("unknown_lane", f"lane {lane!r} does not exist")
    opened = await storage.find_open_operations(lane, limit=2)
    start = single_open_operation(lane, opened)
    newest_run = await storage.find_records(
        RecordQuery(lane=lane, type="operation_started", operation_kind="run", limit=1)
    )
    queue_after = newest_run[0].seq if newest_run else 0
    queued: list[StoredRecord] = []
    for record_type in QUEUE_TYPES:
        queued += await storage.find_records(
            RecordQuery(lane=lane, type=record_type, after_seq=queue_after, order="oldest_first")
        )
    operation: tuple[StoredRecord, ...] = ()
    entries: tuple[StoredEntry, ...] = ()
    if start is not None:
        operation = await storage.read_operation_records(lane, start.id)
        entries = await appended_entries(storage, lane, start, pointer.leaf_id)
    finished = await storage.find_records(
        RecordQuery(lane=lane, type="operation_finished", limit=1)
    )
    return assemble_lane_slice(
        lane, pointer.leaf_id, opened, queued, operation, entries, finished[0] if finished else None
    )
