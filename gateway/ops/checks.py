"""The operator API's judgement of a request against a lane, before anything is stored.

A refusal here is the API's answer (409 when the lane's status does not allow the action, 400
when decisions do not cover exactly the pending calls); nothing reaches the inbox.
"""

from __future__ import annotations

from typing import get_args

from adapters import DecisionItem
from gateway.ops.errors import ApiError
from gateway.ops.views import DecisionsRequest, LaneView
from harness_core import LaneStatus, SuppliedResult

__all__ = ["STATUSES", "check_allowed", "decision_items", "statuses"]

STATUSES: tuple[str, ...] = get_args(LaneStatus)


def statuses(status: str | None, stuck: bool) -> frozenset[str] | None:
    """The statuses a lane filter names (None: any); 400 for one that does not exist."""
    wanted = {part.strip() for part in (status or "").split(",") if part.strip()}
    if stuck:
        wanted.add("stuck")
    unknown = sorted(wanted - set(STATUSES))
    if unknown:
        raise ApiError(
            400,
            "invalid_argument",
            f"unknown status {', '.join(unknown)}; known: {', '.join(STATUSES)}",
            {"field": "status"},
        )
    return frozenset(wanted) or None


_NEEDS = {
    "resume": "suspended by a crash or a background request, or stuck",
    "unstick": "stuck",
    "abort": "running or suspended",
    "rewind": "idle or failed",
    "retry": "failed",
    "decide": "suspended for approval",
}


def check_allowed(view: LaneView, kind: str) -> None:
    """409 unless the lane's status allows `kind` (refused before anything is stored)."""
    revoked = view.revoked
    if revoked is not None and kind not in view.actions:
        raise ApiError(
            409,
            "conflict",
            f"{kind} needs the lane's authority, which is revoked: {revoked.why} "
            f"({revoked.scope_name}, by {revoked.by}); unrevoke it first",
            {"reason": "authority_revoked", "status": view.status},
        )
    if kind not in view.actions:
        reason = "not_idle_waiting_head" if kind == "decide" else f"lane_{view.status}"
        said = f" ({view.suspended})" if view.suspended else ""
        if view.status == "running" and view.attempts:
            said = (
                f": attempt {view.attempts} of {view.max_attempts} runs in {view.held_by} "
                "and may still end by itself"
            )
        raise ApiError(
            409,
            "conflict",
            f"{kind} needs a lane that is {_NEEDS[kind]}; this one is {view.status}{said}",
            {"reason": reason, "status": view.status},
        )


def decision_items(view: LaneView, body: DecisionsRequest) -> tuple[DecisionItem, ...]:
    """The decisions, bound to the pending calls' arguments; 409/400 when they do not fit."""
    if view.status != "suspended" or view.suspended != "approval" or view.wait_id != body.wait_id:
        raise ApiError(
            409,
            "conflict",
            "the lane is not waiting on that approval (it was decided, aborted or superseded)",
            {"reason": "not_idle_waiting_head", "wait_id": view.wait_id},
        )
    pending = {call.tool_call_id: call for call in view.pending_approvals}
    missing = sorted(set(pending) - set(body.approvals))
    unexpected = sorted(set(body.approvals) - set(pending))
    if missing or unexpected:
        raise ApiError(
            400,
            "invalid_argument",
            "the decisions must cover exactly the pending calls",
            {
                "reason": "pending_coverage_mismatch",
                "field": "approvals",
                "missing": missing,
                "unexpected": unexpected,
            },
        )
    return tuple(
        DecisionItem(
            tool_call_id=call_id,
            args_digest=pending[call_id].args_digest,
            approved=choice.action != "deny",
            reason=choice.reason,
            supplied=SuppliedResult(text=choice.result, is_error=choice.is_error)
            if choice.action == "supply" and choice.result is not None
            else None,
        )
        for call_id, choice in sorted(body.approvals.items())
    )
