"""Operator actions on lanes: what the API enqueues, and how the session's worker carries it out.

An action on a lane must run where the lane's session is open, under its writer lease, so the
API (`gateway.ops`) never touches a lane itself: it checks the request against the lane as
stored, then puts an ``operator`` item in the session's inbox (deduplicated on the caller's
`Idempotency-Key`) and waits briefly for the worker's result. A caller that stops waiting reads
the result later from ``GET /api/v1/actions/<id>``.

The worker calls `carry_out` for an ``operator`` inbox item. The action's newest result is
kept as a broker mark (``ops:action:<id>``: ``running`` while it works, then ``done`` or
``refused``) and every final result goes into the audit trail. A result that is already final
makes a redelivered item a no-op; one left ``running`` by a worker that died is closed as
interrupted (the lane itself continues by its crash recovery, never by running the action
twice). The worker imports this module, never the HTTP front end (D182).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field

from adapters import DecisionItem
from gateway.broker.contract import Broker, NewAuditEvent
from gateway.closes import note_abort
from gateway.logs import event
from gateway.replies import enqueue_stop_notice
from gateway.stop import stopped_text
from harness_core import (
    AgentLane,
    ApprovalDecision,
    Clock,
    Err,
    MissingIdentities,
    Ok,
    Outcome,
    SessionStorage,
    ToolRecovery,
    UserMessage,
)
from harness_core.frozen import Frozen, FrozenJsonObject
from harness_core.session import MessageEntry

__all__ = [
    "ActionKind",
    "ActionResult",
    "ActionStatus",
    "OperatorAction",
    "action_id_of",
    "carry_out",
    "read_result",
    "refuse",
    "request_digest",
    "result_mark",
]

log = logging.getLogger("gateway.ops")

ActionKind = Literal["resume", "unstick", "abort", "rewind", "retry", "decide"]
ActionStatus = Literal["pending", "running", "done", "refused"]


class OperatorAction(Frozen):
    """An operator's action, as the inbox carries it to the session's worker."""

    id: str
    kind: ActionKind
    session: str
    lane: str
    actor: str
    """``operator:<token name>``: who acted (the audit trail's actor)."""
    tool_recovery: ToolRecovery = "declared"
    unstick: bool = False
    """A fresh attempt budget (``unstick``, or ``resume`` of a stuck lane)."""
    entry_id: str | None = None
    """``rewind``/``retry``: the user message to run again (the lane moves to just before it)."""
    wait_id: str | None = None
    """``decide``: the approval wait the decisions answer."""
    decisions: tuple[DecisionItem, ...] = ()
    idempotency_key: str = Field(min_length=1, max_length=512)
    requested_at_ms: int


class ActionResult(Frozen):
    """Where an action stands; ``done`` and ``refused`` are final."""

    id: str
    kind: ActionKind
    session: str
    lane: str
    status: ActionStatus
    outcome: str | None = None
    """``done``: how it ended (a run's outcome: completed, suspended, failed, aborted...)."""
    error: FrozenJsonObject | None = None
    """``refused``: ``{"code", "message"}`` (the lane was not in a state the action needs)."""
    run_id: str | None = None
    at_ms: int


def action_id_of(actor: str, idempotency_key: str) -> str:
    """One caller's key names one action, whatever lane it names (a reused key is a conflict)."""
    digest = hashlib.sha256(json.dumps([actor, idempotency_key]).encode()).hexdigest()
    return f"act_{digest[:32]}"


def result_mark(action_id: str) -> str:
    """The broker mark that holds an action's newest `ActionResult`."""
    return f"ops:action:{action_id}"


def request_digest(payload: object) -> str:
    """What a replayed key's request is compared by (canonical JSON)."""
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


async def read_result(broker: Broker, action_id: str) -> ActionResult | None:
    """An action's newest result, or None if no worker has taken it yet."""
    raw = await broker.marks.get(result_mark(action_id))
    return None if raw is None else ActionResult.model_validate_json(raw)


async def carry_out(
    action: OperatorAction,
    lane: AgentLane,
    storage: SessionStorage,
    broker: Broker,
    clock: Clock,
    *,
    waits: Callable[[MissingIdentities], None] | None = None,
) -> ActionResult:
    """Do `action` on `lane` (once), keeping its result and auditing it.

    `waits`: told of a resume refused for tools (or models) the harness lacks, which the
    worker provides at its next take of the session: the result is ``pending`` again (not
    final; the worker leaves the item to that take), not refused (D396).
    """
    mark = result_mark(action.id)
    raw = await broker.marks.get(mark)
    earlier = None if raw is None else ActionResult.model_validate_json(raw)
    if earlier is not None and earlier.status in ("done", "refused"):
        return earlier
    if earlier is not None and earlier.status == "running":
        final = _result(action, clock, "done", outcome="interrupted")
        note = "the worker stopped while it ran; the lane continues by its crash recovery"
        await _settle(action, broker, raw, final, note)
        return final
    running = _result(action, clock, "running")
    if not await broker.marks.put(mark, running.model_dump_json(), expect=raw):
        return await carry_out(action, lane, storage, broker, clock)  # another took it first
    try:
        final = await _do(action, lane, storage, broker, clock, waits)
        if final.status == "pending":  # not final: the worker's next take does it
            await broker.marks.put(mark, final.model_dump_json(), expect=running.model_dump_json())
            return final
    except Exception as exc:
        final = _result(
            action, clock, "refused", error={"code": "failed", "message": type(exc).__name__}
        )
        log.error(event("operator action failed", action=action.id, error=type(exc).__name__))
    await _settle(action, broker, running.model_dump_json(), final, None)
    return final


async def refuse(
    action: OperatorAction, broker: Broker, clock: Clock, code: str, message: str
) -> ActionResult:
    """Refuse `action` without doing it (its lane's authority is revoked: D267), kept and audited.

    A result that is final already stays (a redelivered item).
    """
    raw = await broker.marks.get(result_mark(action.id))
    earlier = None if raw is None else ActionResult.model_validate_json(raw)
    if earlier is not None and earlier.status in ("done", "refused"):
        return earlier
    final = _result(action, clock, "refused", error={"code": code, "message": message})
    await _settle(action, broker, raw, final, None)
    return final


async def _do(
    action: OperatorAction,
    lane: AgentLane,
    storage: SessionStorage,
    broker: Broker,
    clock: Clock,
    waits: Callable[[MissingIdentities], None] | None,
) -> ActionResult:
    kind = action.kind
    if kind == "abort":
        # a run that waits for approval is told by its request's close ("... closed: stopped
        # by operator:alice"); one that works would end in silence without a word of its own
        waiting = (await lane.info()).suspended == "approval"
        await note_abort(broker, action.session, lane, action.actor)  # who closed a request
        aborted = await lane.abort()
        if isinstance(aborted, Err):
            return _refused(action, clock, aborted.error)
        state = None if waiting else await broker.threads.get(action.session, action.lane)
        if state is not None:  # the thread hears it, as it does a `stop` said there
            dropped = len(aborted.value.steer) + len(aborted.value.follow_up)
            said = stopped_text(dropped, by=action.actor)
            await enqueue_stop_notice(broker, state, action.id, said, now_ms=clock.now_ms())
        return _result(action, clock, "done", outcome="aborted")
    if kind in ("resume", "unstick"):
        resumed = await lane.resume(tool_recovery=action.tool_recovery, unstick=action.unstick)
        return _ended(action, clock, resumed, waits)
    if kind == "decide":
        decided = await lane.resume(
            [
                ApprovalDecision(
                    tool_call_id=d.tool_call_id,
                    args_digest=d.args_digest,
                    approved=d.approved,
                    reason=d.reason,
                    supplied=d.supplied,
                )
                for d in action.decisions
            ],
            wait_id=action.wait_id,
            decided_by=action.actor,
            idempotency_key=action.id,
            tool_recovery=action.tool_recovery,
        )
        return _ended(action, clock, decided, waits)
    return await _rerun(action, lane, storage, clock)


async def _rerun(
    action: OperatorAction, lane: AgentLane, storage: SessionStorage, clock: Clock
) -> ActionResult:
    """Move the lane to just before a user message and run that message again."""
    assert action.entry_id is not None
    stored = await storage.get_entry(action.entry_id)
    entry = stored.entry if stored is not None else None
    if (
        stored is None
        or not isinstance(entry, MessageEntry)
        or not isinstance(entry.message, UserMessage)
    ):
        return _result(
            action,
            clock,
            "refused",
            error={
                "code": "not_a_user_message",
                "message": "a rewind needs a user message entry"
                if stored is not None
                else f"no entry {action.entry_id!r} in this session",
            },
        )
    if stored.lane is not None and stored.lane != action.lane:
        # another thread's message: its conversation (another customer's, perhaps) would
        # become this thread's, answered here
        return _result(
            action,
            clock,
            "refused",
            error={
                "code": "not_this_lane",
                "message": "the entry is a message of another lane: a rewind takes the lane's own",
            },
        )
    moved = await lane.navigate_tree(stored.parent_id)
    if isinstance(moved, Err):
        return _refused(action, clock, moved.error)
    started = await lane.start(entry.message, entry_id=f"rerun-{action.id[4:]}")
    if isinstance(started, Err):
        return _refused(action, clock, started.error)
    outcome = await started.value.outcome()
    return _result(action, clock, "done", outcome=outcome.kind, run_id=outcome.run_id)


def _ended(
    action: OperatorAction,
    clock: Clock,
    result: Any,
    waits: Callable[[MissingIdentities], None] | None,
) -> ActionResult:
    if isinstance(result, Ok):
        outcome: Outcome = result.value
        return _result(action, clock, "done", outcome=outcome.kind, run_id=outcome.run_id)
    refusal = result.error
    if isinstance(refusal, MissingIdentities) and waits is not None:
        waits(refusal)
        error = {
            "code": "waits_for_tools",
            "message": f"{refusal.message}: done when the session is taken again with them, "
            "or with stand-ins for tools no server offers any more",
        }
        return _result(action, clock, "pending", error=error)
    return _refused(action, clock, refusal)


def _refused(action: OperatorAction, clock: Clock, rejection: Any) -> ActionResult:
    tag = str(rejection.tag)
    error = {"code": tag, "message": str(rejection.message), "reason": _reason(rejection)}
    return _result(action, clock, "refused", error=error)


def _reason(rejection: Any) -> str:
    """The API's word for a refusal (its 409's ``reason``), not the engine's class name.

    A decision that lost a race (another came first, or the wait moved on) is what the API
    calls a wait that was decided or superseded; two operators deciding at once read
    ``DecisionsMismatch`` where the documented reason was ``not_idle_waiting_head``.
    """
    tag = str(rejection.tag)
    if tag == "WaitSuperseded" or (
        tag == "DecisionsMismatch" and getattr(rejection, "reason", None) == "already_decided"
    ):
        return "not_idle_waiting_head"
    return re.sub(r"(?<!^)(?=[A-Z])", "_", tag).lower()  # LaneBusy: lane_busy


def _result(
    action: OperatorAction,
    clock: Clock,
    status: ActionStatus,
    *,
    outcome: str | None = None,
    error: dict[str, str] | None = None,
    run_id: str | None = None,
) -> ActionResult:
    return ActionResult(
        id=action.id,
        kind=action.kind,
        session=action.session,
        lane=action.lane,
        status=status,
        outcome=outcome,
        error=error,
        run_id=run_id,
        at_ms=clock.now_ms(),
    )


async def _settle(
    action: OperatorAction, broker: Broker, was: str | None, final: ActionResult, note: str | None
) -> None:
    await broker.marks.put(result_mark(action.id), final.model_dump_json(), expect=was)
    details: dict[str, Any] = {"kind": action.kind, "idempotency_key": action.idempotency_key}
    if action.kind in ("resume", "unstick", "decide"):
        details["tool_recovery"] = action.tool_recovery
    if action.unstick:
        details["unstick"] = True
    supplied = [d.tool_call_id for d in action.decisions if d.supplied is not None]
    if supplied:  # the operator did these calls' actions themselves: they never ran (D263)
        details["supplied"] = supplied
    if action.decisions:  # who approved the deploy: the trail says, not only the store
        ran = [d for d in action.decisions if d.supplied is None]
        details["approved"] = [d.tool_call_id for d in ran if d.approved]
        details["denied"] = [d.tool_call_id for d in ran if not d.approved]
    if action.entry_id is not None:
        details["entry_id"] = action.entry_id
    if final.error is not None:
        details["error"] = dict(final.error)
    if final.run_id is not None:
        details["run_id"] = final.run_id
    if note is not None:
        details["note"] = note
    await broker.audit.record(
        NewAuditEvent(
            actor=action.actor,
            action=action.kind,
            session=action.session,
            lane=action.lane,
            target=action.id,
            outcome=final.outcome or final.status,
            details=details,
        )
    )
    log.info(event("operator action", action=action.id, kind=action.kind, status=final.status))
