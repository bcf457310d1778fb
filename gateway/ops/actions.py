"""Operator actions on lanes: what the API enqueues and the session's worker carries out.

An action on a lane must run where the lane's session is open, under its writer lease, so the
API never touches a lane itself: it checks the request against the lane as stored, then puts
an ``operator`` item in the session's inbox (deduplicated on the caller's `Idempotency-Key`)
and waits briefly for the worker's result, which the worker keeps as a broker mark
(``ops:action:<id>``) and in the audit trail. A caller that stops waiting reads the result
later from ``GET /api/v1/actions/<id>``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import Field

from adapters.channel import DecisionItem
from harness_core import ToolRecovery
from harness_core.frozen import Frozen, FrozenJsonObject

__all__ = [
    "ActionKind",
    "ActionResult",
    "ActionStatus",
    "OperatorAction",
    "action_id_of",
    "request_digest",
    "result_mark",
]

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
