"""Approvals: building decisions, the digest an approval refers to, and checking a decision batch.

A call to a tool declared ``requires_approval`` does not run until a person decides. The run
suspends (reason ``approval``) with the pending calls; `lane.resume(decisions=...)` must decide
exactly those calls, and the whole batch becomes one durable `ApprovalDecided` record before any
of them runs. Denied calls get a ``denied`` result the model reads. An approval is never
permission to replay a call whose outcome became unknown in a crash: that needs a new decision.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from harness_core.frozen import thaw_json
from harness_core.session.records import ApprovalDecision, PendingApproval

__all__ = ["approve", "args_digest", "deny", "mismatch"]


def args_digest(args: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of tool arguments (what an approval refers to)."""
    canonical = json.dumps(thaw_json(args), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def approve(
    tool_call_id: str, *, args: Mapping[str, Any] | None = None, note: str | None = None
) -> ApprovalDecision:
    """Approve one pending call, optionally replacing its arguments (validated again)."""
    return ApprovalDecision(
        tool_call_id=tool_call_id, approved=True, override_args=args, reason=note
    )


def deny(tool_call_id: str, reason: str) -> ApprovalDecision:
    """Deny one pending call; the model sees `reason`."""
    return ApprovalDecision(tool_call_id=tool_call_id, approved=False, reason=reason)


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
