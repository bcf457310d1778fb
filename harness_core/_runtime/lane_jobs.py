"""The surface's jobs on a lane: accept an operation, queue input, cancel it, write, abort.

Each is one job on the lane's mutation line (`LaneRuntime.job`): it validates against the live
state and commits at most once through the lane's commit primitives (`commit_record`,
`commit_entry`), so it races the lane's procedure in exactly two orders. The ids of caller-chosen
inputs are derived here (`accept_id`, `decision_id`): a second submission is a point lookup and
the store refuses a second acceptance.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from harness_core._runtime.reduction import LaneState, OperationState
from harness_core.errors import HarnessError
from harness_core.events import NavigationStart, RunAbort, RunStart, WritePending
from harness_core.messages import AgentMessage
from harness_core.result import (
    AbortAccepted,
    Err,
    LaneBusy,
    NoActiveOperation,
    NoActiveRun,
    Ok,
    Result,
    UnknownQueueItem,
)
from harness_core.session.entries import (
    ActiveToolsChangeEntry,
    Entry,
    MessageEntry,
    ModelChangeEntry,
    ThinkingLevelChangeEntry,
)
from harness_core.session.records import (
    AbortRequested,
    NavigationIntent,
    OperationError,
    OperationIntent,
    OperationStarted,
    QueueCancelled,
    QueueEnqueued,
    QueueName,
    WriteDeferred,
)
from harness_core.session.types import RecordQuery, StoredRecord

if TYPE_CHECKING:
    from harness_core._runtime.lane import HarnessRuntime, LaneRuntime

__all__ = [
    "Prior",
    "abort",
    "accept",
    "accept_id",
    "busy",
    "cancel_queued",
    "config_entry",
    "decision_id",
    "enqueue",
    "prior",
    "write",
]


def accept_id(entry_id: str) -> str:
    """The id of the record that accepts the caller-chosen input `entry_id` (prompt or queue).

    Derived, so a second submission of the same input is a point lookup (`get_record`), and the
    store itself refuses a second acceptance (the id exists).
    """
    return "accept-" + hashlib.sha256(entry_id.encode()).hexdigest()[:40]


def decision_id(lane: str, idempotency_key: str) -> str:
    """The id of the `ApprovalDecided` record made with `idempotency_key` on `lane`.

    Derived, so a replayed key is a point lookup however much history came after it.
    """
    digest = hashlib.sha256(f"{lane}\x00{idempotency_key}".encode()).hexdigest()
    return "decision-" + digest[:40]


def config_entry(runtime: HarnessRuntime, changes: dict[str, Any]) -> Entry:
    """The entry that records one configuration change."""
    entry_id = runtime.ids.next()
    if "model" in changes:
        model = changes["model"]
        return ModelChangeEntry(id=entry_id, provider=model.provider, model_id=model.model_id)
    if "thinking_level" in changes:
        return ThinkingLevelChangeEntry(id=entry_id, thinking_level=changes["thinking_level"])
    return ActiveToolsChangeEntry(id=entry_id, active_tool_names=tuple(changes["active_tools"]))


@dataclass(frozen=True, slots=True)
class Prior:
    """A caller-chosen input id seen before.

    `record` accepted it; None means the id is an entry's that no acceptance made (unusable).
    """

    record: StoredRecord | None


def busy(lane: LaneRuntime, op: OperationState) -> Err[LaneBusy]:
    """The rejection for a second operation on `lane`."""
    return Err(
        LaneBusy(
            message=f"lane {lane.name!r} is busy with {op.kind} {op.id!r}",
            lane=lane.name,
            operation_id=op.id,
            operation_kind=op.kind,
        )
    )


async def prior(
    lane: LaneRuntime, entry_id: str | None, *, new_at: int | None = None
) -> Prior | None:
    """How a caller-chosen input id was used before, or None if it is new (two reads).

    `new_at`: the write mark (`HarnessRuntime.write_mark`) at which the caller read the id as
    new; while the mark has not moved the answer stands, and the reads are skipped (D273).
    """
    if entry_id is None:
        return None
    if new_at is not None and lane.runtime.write_mark() == new_at:
        return None
    storage = lane.runtime.storage
    found = await storage.get_record(accept_id(entry_id))
    if found is not None:
        return Prior(found)
    return Prior(None) if await storage.get_entry(entry_id) is not None else None


async def accept(
    lane: LaneRuntime,
    build_intent: Callable[[LaneState], OperationIntent],
    start: Callable[[], Awaitable[Any]],
    *,
    input_id: str | None = None,
    new_at: int | None = None,
) -> Result[tuple[OperationState, asyncio.Task[Any]], LaneBusy] | Prior:
    """Accept an operation on an idle lane and start its procedure, in one job.

    `build_intent` sees the state (run acceptance captures the pending next-run items); the
    procedure task takes the lane's execution slot before the job ends, so no second
    acceptance or resume can slip in. With `input_id` (a run's caller-chosen prompt id) the
    run's id is derived from it, and an input accepted before is returned as `Prior`
    (`new_at`: see `prior`).
    """

    async def run() -> Result[tuple[OperationState, asyncio.Task[Any]], LaneBusy] | Prior:
        seen = await prior(lane, input_id, new_at=new_at)
        if seen is not None:
            return seen
        op = lane.state.operation
        if op is not None:
            return busy(lane, op)
        intent = build_intent(lane.state)
        record = OperationStarted(
            id=accept_id(input_id) if input_id is not None else lane.runtime.ids.next(),
            lane=lane.name,
            source_leaf_id=lane.state.leaf_id,
            intent=intent,
            configuration=await lane.context.configuration(),
        )
        await lane.commit_record(record)
        if intent.kind == "run":
            if lane.runtime.events.wants("run_start"):
                lane.runtime.events.emit(RunStart(lane=lane.name, run_id=record.id))
        elif isinstance(intent, NavigationIntent):
            lane.runtime.events.emit(
                NavigationStart(lane=lane.name, run_id=record.id, target_id=intent.target_id)
            )
        lane.abort_signal.clear()
        task = lane.occupy(start())
        return Ok((lane.operation, task))

    return await lane.job(run)


async def enqueue(
    lane: LaneRuntime, queue: QueueName, entry: Entry, *, chosen: bool = False
) -> Result[str, NoActiveRun] | Prior:
    """Accept queued input: steering and follow-ups need an active, non-aborting run.

    With `chosen` (the caller chose the entry's id) the record's id is derived from it and
    an input accepted before is returned as `Prior`.
    """

    async def run() -> Result[str, NoActiveRun] | Prior:
        seen = await prior(lane, entry.id if chosen else None)
        if seen is not None:
            return seen
        op = lane.state.operation
        run_id: str | None = None
        if queue != "next_run":
            if op is None or op.kind != "run" or op.aborting:
                return Err(
                    NoActiveRun(message=f"lane {lane.name!r} has no active run", lane=lane.name)
                )
            run_id = op.id
        await lane.commit_record(
            QueueEnqueued(
                id=accept_id(entry.id) if chosen else lane.runtime.ids.next(),
                lane=lane.name,
                queue=queue,
                run_id=run_id,
                target=entry,
            )
        )
        lane.emit_queues()
        return Ok(entry.id)

    return await lane.job(run)


async def cancel_queued(
    lane: LaneRuntime, entry_id: str
) -> Result[Literal["cancelled", "already_consumed", "already_cleared"], UnknownQueueItem]:
    """Retract a queued item if it is still pending."""

    async def run() -> Result[
        Literal["cancelled", "already_consumed", "already_cleared"], UnknownQueueItem
    ]:
        op = lane.state.operation
        pending: list[tuple[str | None, tuple[Entry, ...]]] = [(None, lane.state.pending_next_run)]
        if op is not None:
            pending += [(op.id, op.pending_steer), (op.id, op.pending_follow_up)]
        for run_id, items in pending:
            if any(e.id == entry_id for e in items):
                await lane.commit_record(
                    QueueCancelled(
                        id=lane.runtime.ids.next(),
                        lane=lane.name,
                        run_id=run_id,
                        entry_id=entry_id,
                    )
                )
                lane.emit_queues()
                return Ok("cancelled")
        storage = lane.runtime.storage
        if await storage.get_entry(entry_id) is not None:
            return Ok("already_consumed")
        enqueued = await storage.find_records(RecordQuery(lane=lane.name, type="queue_enqueued"))
        if any(
            isinstance(r.record, QueueEnqueued) and r.record.target.id == entry_id for r in enqueued
        ):
            return Ok("already_cleared")
        return Err(
            UnknownQueueItem(
                message=f"no queued item {entry_id!r}", lane=lane.name, entry_id=entry_id
            )
        )

    return await lane.job(run)


async def write(lane: LaneRuntime, entry: Entry) -> str:
    """A lane-view write; returns the entry's id once durably accepted.

    Deferred while a run is open, waits out a structural operation, appended directly on an
    idle lane.
    """
    while True:
        waiting: asyncio.Task[Any] | None = None

        async def run() -> str | None:
            nonlocal waiting
            op = lane.state.operation
            if op is None:
                await lane.commit_entry(entry)
                return entry.id
            if op.kind == "run":
                await lane.commit_record(
                    WriteDeferred(
                        id=lane.runtime.ids.next(), lane=lane.name, run_id=op.id, target=entry
                    )
                )
                lane.runtime.events.emit(
                    WritePending(lane=lane.name, run_id=op.id, entry_id=entry.id, entry=entry)
                )
                return entry.id
            waiting = lane.task
            return None

        result = await lane.job(run)
        if result is not None:
            return result
        await lane.wait_settled()
        if (
            waiting is None
            and lane.state.operation is not None
            and lane.state.operation.kind != "run"
        ):
            # a suspended structural operation: nothing will close it until someone resumes it
            raise HarnessError(
                f"lane {lane.name!r} has an unfinished {lane.state.operation.kind}; "
                "resume or abort it first"
            )


async def abort(
    lane: LaneRuntime, reason: OperationError | None = None
) -> Result[AbortAccepted, NoActiveOperation]:
    """Accept an abort: durable on return; reconciliation continues in the background.

    `reason` is kept with the abort and closes the operation as its error (D266); an
    operation already aborting keeps the reason it was first given.
    """

    async def run() -> Result[AbortAccepted, NoActiveOperation]:
        op = lane.state.operation
        if op is None:
            return Err(
                NoActiveOperation(
                    message=f"lane {lane.name!r} has nothing to abort", lane=lane.name
                )
            )
        if op.aborting:  # idempotent: one marker per operation
            return Ok(AbortAccepted(run_id=op.id))
        accepted = AbortAccepted(
            run_id=op.id, steer=op.pending_steer, follow_up=op.pending_follow_up
        )
        await lane.commit_record(
            AbortRequested(id=lane.runtime.ids.next(), lane=lane.name, run_id=op.id, reason=reason)
        )
        lane.runtime.events.emit(
            RunAbort(
                lane=lane.name,
                run_id=op.id,
                steer=_messages(op.pending_steer),
                follow_up=_messages(op.pending_follow_up),
            )
        )
        lane.abort_signal.set()
        lane.emit_queues()
        return Ok(accepted)

    return await lane.job(run)


def _messages(entries: tuple[Entry, ...]) -> tuple[AgentMessage, ...]:
    return tuple(e.message for e in entries if isinstance(e, MessageEntry))
