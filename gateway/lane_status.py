"""A lane's status as a live worker holds it: stuck only when no attempt of it runs (D163).

The worker parks a lane whose counted-out attempt it finds dead and says so with a broker mark
(`parked_mark`, keyed by `attempt_began`); `inspect_held` reads a lane with that mark in mind,
for the operator API and for the metrics alike. The worker and the metrics import this module,
never the operator front end in `gateway.ops` (D182).
"""

from __future__ import annotations

import dataclasses

from gateway.broker.contract import Broker
from harness_core import LaneInspection, SessionStorage, inspect_lane
from harness_core.session import RecordQuery
from harness_core.session.records import OperationResumed

__all__ = ["attempt_began", "inspect_held", "parked_mark", "unused_main"]


def unused_main(lane: str, status: str, leaf_id: str | None) -> bool:
    """The harness's default lane, which channel threads never use: not worth a row or a count."""
    return lane == "main" and status == "idle" and leaf_id is None


def parked_mark(session: str, began: str) -> str:
    """The broker mark a worker sets when it parks a lane stuck.

    `began` is `attempt_began` of the attempt that ended: a later attempt (a resume, an
    unstick) begins with a new record, so an old mark never names it.
    """
    return f"ops:parked:{session}:{began}"


async def attempt_began(storage: SessionStorage, lane: str, run_id: str) -> str:
    """The id of the record that began the operation's current attempt (a resume, or its start)."""
    found = await storage.find_records(
        RecordQuery(lane=lane, type="operation_resumed", run_id=run_id, limit=1)
    )
    if found and isinstance(found[0].record, OperationResumed):
        return found[0].record.id
    return run_id


async def _attempt_running(
    storage: SessionStorage, broker: Broker, session: str, lane: str, run_id: str
) -> bool:
    """Whether the live lease holder runs the operation's counted-out attempt (D163).

    The log cannot tell an attempt that runs from one whose process died: both began and have
    no end. A worker that takes the session and finds the attempt dead parks the lane and says
    so with `parked_mark`; until it does, the attempt belongs to the holder and runs.
    """
    began = await attempt_began(storage, lane, run_id)
    return await broker.marks.get(parked_mark(session, began)) is None


async def inspect_held(
    storage: SessionStorage,
    broker: Broker,
    session: str,
    lane: str,
    *,
    max_attempts: int,
    held: bool,
) -> LaneInspection:
    """`inspect_lane`, where a lane is stuck only when no attempt of it runs (D163).

    `held`: a live worker holds the session's lease. Its counted-out attempt then runs unless
    a worker parked the lane (`parked_mark`).

    Raises:
        SessionError: ``unknown_lane`` when the session has no such lane.
    """
    seen = await inspect_lane(storage, lane, max_attempts=max_attempts, executing=held)
    found = seen.info
    if (
        found.status == "stuck"
        and held
        and found.operation_id is not None
        and await _attempt_running(storage, broker, session, lane, found.operation_id)
    ):
        seen = dataclasses.replace(
            seen, info=dataclasses.replace(found, status="running", suspended=None)
        )
    elif (
        found.status in ("running", "suspended")
        and found.operation_id is not None
        and (found.status == "running" or found.suspended == "crash")
        and not await _attempt_running(storage, broker, session, lane, found.operation_id)
    ):
        # parked by a worker under a lower cap than `max_attempts` (its lane's profile)
        seen = dataclasses.replace(
            seen, info=dataclasses.replace(found, status="stuck", suspended="crash")
        )
    return seen
