"""Read-only inspection of a session's lanes from its storage, with no harness and no lease.

An operator's view: what each lane is doing, why an open operation waits, which tool calls a
resume would replay or report interrupted. It reads exactly what `restore` reads and takes
nothing, so it may run beside the worker that executes the session.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness_core._runtime.reduction import LaneState, OperationState
from harness_core._runtime.restore import restore_lane
from harness_core.errors import RecordLogCorruption, StoreCorrupted
from harness_core.harness import LaneInfo, LaneStatus, _last_activity, _reason
from harness_core.session.contract import SessionStorage
from harness_core.session.records import PendingApproval
from harness_core.tools import ToolRecovery

__all__ = ["InterruptedCall", "LaneInspection", "inspect_lane", "recovery_of"]


@dataclass(frozen=True, kw_only=True, slots=True)
class InterruptedCall:
    """A tool call that started and has no result: a resume decides what becomes of it."""

    tool_call_id: str
    tool_name: str
    replay: str
    """The declaration it started under (``safe`` or ``never``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LaneInspection:
    """One lane as its storage holds it."""

    info: LaneInfo
    activity: str | None = None
    """What the open operation was last doing (None when idle)."""
    pending_approvals: tuple[PendingApproval, ...] = ()
    wait_id: str | None = None
    """The approval wait the decisions must name (status ``suspended``, reason approval)."""
    interrupted_calls: tuple[InterruptedCall, ...] = ()
    queued: int = 0
    """Steered, follow-up and next-run messages not yet in the transcript."""


async def inspect_lane(
    storage: SessionStorage, lane: str, *, max_attempts: int, executing: bool = False
) -> LaneInspection:
    """The lane's status from its storage.

    `executing`: a live worker holds the session's lease, so an open operation that is neither
    waiting for approval nor for a background request is ``running`` rather than ``suspended``
    by a crash. An operation interrupted `max_attempts` times is ``stuck`` either way.
    A log that cannot be restored is ``faulted`` with the reason.

    Raises:
        SessionError: ``unknown_lane`` when the session has no such lane.
    """
    try:
        state = await restore_lane(storage, lane)
    except (RecordLogCorruption, StoreCorrupted) as exc:
        return LaneInspection(
            info=LaneInfo(name=lane, leaf_id=None, status="faulted", fault=str(exc))
        )
    return _inspection(state, max_attempts=max_attempts, executing=executing)


def recovery_of(call: InterruptedCall, tool_recovery: ToolRecovery) -> str:
    """What a resume with `tool_recovery` does to an interrupted call, in words.

    The current declaration of the tool may differ from the one it started under; ``declared``
    replays only if both are ``safe``, which only the worker can know: said here as a condition.
    """
    if tool_recovery == "never":
        return "reported to the model as interrupted (not run again)"
    if tool_recovery == "always":
        return "run again"
    if call.replay == "safe":
        return "run again if the tool is still declared replay='safe', else reported interrupted"
    return "reported to the model as interrupted (declared replay='never')"


def _inspection(state: LaneState, *, max_attempts: int, executing: bool) -> LaneInspection:
    op = state.operation
    last = state.last_finished
    queued = len(state.pending_next_run)
    if op is None:
        failed = last is not None and last.outcome == "failed"
        return LaneInspection(
            info=LaneInfo(
                name=state.lane,
                leaf_id=state.leaf_id,
                status="failed" if failed else "idle",
                last_outcome=last.outcome if last else None,
                error=last.error if last else None,  # a failure's, or an abort's reason
            ),
            queued=queued,
        )
    reason = _reason(op)
    stuck = reason == "crash" and not op.aborting and op.attempts >= max_attempts
    status: LaneStatus
    if op.aborting:
        status = "aborting"
    elif stuck:
        status = "stuck"
    elif reason == "crash" and executing:
        status = "running"
    else:
        status = "suspended"
    approval = op.approval
    waiting = reason == "approval" and approval is not None and status == "suspended"
    return LaneInspection(
        info=LaneInfo(
            name=state.lane,
            leaf_id=state.leaf_id,
            operation_id=op.id,
            operation_kind=op.kind,
            status=status,
            suspended=reason if status in ("suspended", "stuck") else None,
            attempts=op.attempts,
            last_outcome=last.outcome if last else None,
        ),
        activity=_last_activity(op),
        pending_approvals=approval.requested.calls if waiting and approval else (),
        wait_id=approval.requested.id if waiting and approval else None,
        interrupted_calls=_interrupted(op),
        queued=queued + len(op.pending_steer) + len(op.pending_follow_up),
    )


def _interrupted(op: OperationState) -> tuple[InterruptedCall, ...]:
    batch = op.tool_batch
    if batch is None:
        return ()
    return tuple(
        InterruptedCall(
            tool_call_id=call.call.id,
            tool_name=call.started.tool_name,
            replay=call.started.replay,
        )
        for call in batch.calls
        if call.started is not None and not call.result_exists
    )
