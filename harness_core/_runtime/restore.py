"""Restore: the bounded reads of one lane, reduced to its state (read-only, no effects).

Per lane: the open-operation projection (0 idle, 1 suspended, 2 corruption); the next-run queue
records since the newest run start; for an open operation, its records and the entries it
appended. Nothing here scans another lane's traffic or the session's older history. The storage
reads all of it in one call (`SessionStorage.read_lane_slice`).
"""

from __future__ import annotations

from harness_core._runtime.reduction import LaneState, reduce_lane
from harness_core.session.contract import SessionStorage

__all__ = ["restore_lane"]


async def restore_lane(storage: SessionStorage, lane: str) -> LaneState:
    """The lane's state, reduced from storage.

    Raises:
        RecordLogCorruption: the lane's records contradict each other (two open operations, a
            lane off its open operation's path, or anything the reduction refuses).
        SessionError: ``unknown_lane``.
    """
    return reduce_lane(await storage.read_lane_slice(lane))
