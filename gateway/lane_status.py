"""A lane's status as a live worker holds it: stuck only when no attempt of it runs (D163).

The worker parks a lane whose counted-out attempt it finds dead and says so with a broker mark
(`parked_mark`, keyed by `attempt_began`); `inspect_held` reads a lane with that mark in mind,
for the operator API and for the metrics alike. The worker and the metrics import this module,
never the operator front end in `gateway.ops` (D182).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from pydantic import ValidationError

from adapters import ThreadRef
from gateway.broker.contract import Broker
from harness_core import LaneInspection, SessionStorage, inspect_lane
from harness_core.session import RecordQuery
from harness_core.session.records import OperationResumed

__all__ = [
    "LaneLimits",
    "attempt_began",
    "inspect_held",
    "inspect_own",
    "lane_thread",
    "parked_mark",
    "thread_ref",
    "unused_main",
]


class LaneLimits(Protocol):
    """A lane's caps, by the thread it answers (None: not known), as its worker applies them.

    `gateway.profiles.LaneProfiles` is the one the service passes: a thread's profile's caps,
    the top-level settings' where the profile sets none.
    """

    def attempts(self, thread: ThreadRef | None) -> int:
        """Interrupted executions of one operation before the lane is parked stuck."""
        ...

    def budget(self, thread: ThreadRef | None) -> int | None:
        """Tokens the lane may spend in all (None: no budget)."""
        ...


def thread_ref(raw: Any) -> ThreadRef | None:
    """A lane view's (or thread state's) thread as a `ThreadRef`; None when it is not one."""
    try:
        return ThreadRef.model_validate(dict(raw))
    except (ValidationError, TypeError, ValueError):
        return None


async def lane_thread(broker: Broker, session: str, lane: str) -> ThreadRef | None:
    """The channel thread a lane answers, as the broker remembers it (None: unknown)."""
    state = await broker.threads.get(session, lane)
    return thread_ref(state.thread) if state is not None else None


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


async def inspect_own(
    storage: SessionStorage,
    broker: Broker,
    session: str,
    lane: str,
    *,
    limits: LaneLimits,
    held: bool,
) -> LaneInspection:
    """`inspect_held` under the lane's own attempt cap (its thread's profile's).

    The cap only matters to a lane with an open operation: only then is its thread read, and
    the lane read again if its cap is not the default one.
    """
    default = limits.attempts(None)
    seen = await inspect_held(storage, broker, session, lane, max_attempts=default, held=held)
    if seen.info.operation_id is None:
        return seen
    own = limits.attempts(await lane_thread(broker, session, lane))
    if own == default:
        return seen
    return await inspect_held(storage, broker, session, lane, max_attempts=own, held=held)
