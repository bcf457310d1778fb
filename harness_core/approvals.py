"""Approvals: building decisions, the digest an approval refers to, and checking a decision batch.

A call to a tool declared ``requires_approval`` does not run until a person decides. The run
suspends (reason ``approval``) with the pending calls; `lane.resume(decisions, wait_id=...)`
must name the wait it answers (the `ApprovalRequested` id) and decide exactly its calls, each
bound to the digest of the arguments the decider saw; the whole batch becomes one durable
`ApprovalDecided` record before any of them runs. Denied calls get a ``denied`` result the model
reads. An approval is never permission to replay a call whose outcome became unknown in a
crash: that needs a new decision.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from harness_core.frozen import thaw_json
from harness_core.result import DecisionsMismatch, WaitSuperseded
from harness_core.session.records import (
    ApprovalDecided,
    ApprovalDecision,
    ApprovalRequested,
    PendingApproval,
    SuppliedResult,
)
from harness_core.tools import Tool, ToolArgumentsError

__all__ = ["approve", "args_digest", "check_decisions", "deny", "mismatch", "stale", "supply"]


def args_digest(args: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of tool arguments (what an approval refers to)."""
    canonical = json.dumps(thaw_json(args), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def _target(call: PendingApproval | str, digest: str | None) -> tuple[str, str]:
    if isinstance(call, PendingApproval):
        if digest is not None and digest != call.args_digest:
            raise ValueError(
                f"args_digest {digest!r} is not the digest of call {call.tool_call_id}"
            )
        return call.tool_call_id, call.args_digest
    if digest is None:
        raise ValueError(
            f"deciding call {call!r} needs the args_digest of the arguments the decider saw"
        )
    return call, digest


def approve(
    call: PendingApproval | str,
    *,
    args_digest: str | None = None,
    args: Mapping[str, Any] | None = None,
    note: str | None = None,
) -> ApprovalDecision:
    """Approve one pending call, optionally replacing its arguments (validated again).

    Pass the `PendingApproval` itself, or its call id with the `args_digest` the decider saw.
    """
    call_id, digest = _target(call, args_digest)
    return ApprovalDecision(
        tool_call_id=call_id, args_digest=digest, approved=True, override_args=args, reason=note
    )


def deny(
    call: PendingApproval | str, reason: str, *, args_digest: str | None = None
) -> ApprovalDecision:
    """Deny one pending call; the model sees `reason`."""
    call_id, digest = _target(call, args_digest)
    return ApprovalDecision(tool_call_id=call_id, args_digest=digest, approved=False, reason=reason)


def supply(
    call: PendingApproval | str,
    result: str,
    *,
    is_error: bool = False,
    args_digest: str | None = None,
    note: str | None = None,
) -> ApprovalDecision:
    """Answer one pending call with its result instead of running the tool (D236).

    For a call whose action someone did themselves (an operator, a host system): the tool never
    runs and `result` is recorded as the call's result (`is_error`: the action failed). The
    decision is bound to the arguments the decider saw, like an approval.
    """
    call_id, digest = _target(call, args_digest)
    return ApprovalDecision(
        tool_call_id=call_id,
        args_digest=digest,
        approved=True,
        reason=note,
        supplied=SuppliedResult(text=result, is_error=is_error),
    )


def mismatch(
    pending: Iterable[PendingApproval], decisions: Iterable[ApprovalDecision]
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(missing, unexpected, duplicated) call ids of a decision batch against a wait."""
    wanted = [p.tool_call_id for p in pending]
    given = [d.tool_call_id for d in decisions]
    duplicated = tuple(sorted({i for i in given if given.count(i) > 1}))
    missing = tuple(i for i in wanted if i not in given)
    unexpected = tuple(sorted({i for i in given if i not in wanted}))
    return missing, unexpected, duplicated


def stale(
    pending: Iterable[PendingApproval], decisions: Iterable[ApprovalDecision]
) -> tuple[str, ...]:
    """Call ids whose decision approves or denies other arguments than the wait's."""
    digests = {p.tool_call_id: p.args_digest for p in pending}
    return tuple(
        d.tool_call_id
        for d in decisions
        if digests.get(d.tool_call_id, d.args_digest) != d.args_digest
    )


def check_decisions(
    lane: str,
    requested: ApprovalRequested | None,
    decided: ApprovalDecided | None,
    aborting: bool,
    decisions: Sequence[ApprovalDecision],
    wait_id: str | None,
    tools: Mapping[str, Tool],
) -> DecisionsMismatch | WaitSuperseded | None:
    """Why a decision batch may not be recorded against a lane's wait now (None: it may).

    The admission rules, in order: the batch names a wait (`unbound`); that wait is the lane's
    open one (`WaitSuperseded`, with the current wait); nobody decided it yet
    (`already_decided`); each decision is for the arguments the wait holds
    (`stale_arguments`); the batch decides exactly its calls (`coverage`, `duplicate`); override
    arguments are valid for the current tool (`invalid_arguments`). `requested` and `decided`
    are the lane's current wait and its decisions, if any.
    """
    if wait_id is None:
        return DecisionsMismatch(
            message="a decision batch must name the wait it answers (wait_id)",
            lane=lane,
            reason="unbound",
        )
    current = requested.id if requested is not None and not aborting else None
    if wait_id != current:
        return WaitSuperseded(
            message=f"lane {lane!r} does not wait for {wait_id!r}"
            + (f" (it waits for {current!r})" if current else ""),
            lane=lane,
            wait_id=wait_id,
            current_wait_id=current if decided is None else None,
        )
    assert requested is not None
    if decided is not None:
        # who decided, not the run's internal id: what the loser of a race needs to hear
        by = f" by {decided.decided_by}" if decided.decided_by else ""
        return DecisionsMismatch(
            message=f"this request was already decided{by} (another decision came first)",
            lane=lane,
            reason="already_decided",
        )
    missing, unexpected, duplicated = mismatch(requested.calls, decisions)
    changed = stale(requested.calls, decisions)
    if changed and not (missing or unexpected or duplicated):
        return DecisionsMismatch(
            message=f"the decisions on {list(changed)} are for other arguments than the "
            "pending calls' (compare args_digest)",
            lane=lane,
            unexpected=changed,
            reason="stale_arguments",
        )
    if missing or unexpected or duplicated:
        return DecisionsMismatch(
            message=f"decide exactly {[p.tool_call_id for p in requested.calls]}: missing "
            f"{list(missing)}, unexpected {list(unexpected)}, duplicated {list(duplicated)}",
            lane=lane,
            missing=missing,
            unexpected=unexpected,
            reason="duplicate" if duplicated else "coverage",
        )
    for decision in decisions:
        pending = next(p for p in requested.calls if p.tool_call_id == decision.tool_call_id)
        tool = tools.get(pending.tool_name)
        if decision.override_args is not None and tool is not None:
            try:
                tool.parse(decision.override_args)
            except ToolArgumentsError as exc:
                return DecisionsMismatch(message=str(exc), lane=lane, reason="invalid_arguments")
    return None
