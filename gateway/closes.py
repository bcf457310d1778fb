"""Closing approval requests: how a wait ended, and the delivery that says so on every copy.

A wait ends when a decision is recorded for it (from any copy of the request, a reminder, the
operator API) or when its run ends without one (a stop, an operator's abort). The reply scan
(`gateway.replies`) then enqueues one ``approval_closed`` delivery per wait, under the delivery
id ``approval_closed:<session>:<wait>``, so every process and every scan enqueues it once; each
channel closes every copy it posted (Slack edits each message, the web page closes each card,
email says it in the thread). The deliverer holds the close back while a copy is still being
posted, and posts no copy of a request already closed (`gateway.deliverer`).

Who decided is in the store (`ApprovalDecided.decided_by`); who stopped a run is not: `note_abort`
keeps it in a broker mark (``aborted-by:<session>:<run>``) before the abort, so a scan after a
crash still names them.
"""

from __future__ import annotations

import datetime
from typing import Literal

from adapters import ApprovalClosed, Outbound, ThreadRef, result_line
from gateway.broker.contract import Broker, ThreadState
from harness_core import AgentLane, SessionStorage
from harness_core.session.records import (
    ApprovalDecided,
    ApprovalDecision,
    ApprovalRequested,
    OperationFinished,
)
from harness_core.session.types import RecordQuery, StoredRecord

__all__ = [
    "abort_mark",
    "close_delivery_id",
    "close_outbound",
    "closed_text",
    "closure",
    "decided_of",
    "described",
    "note_abort",
    "request_delivery_id",
    "supplied_words",
    "verdict",
]


def request_delivery_id(session: str, wait_id: str) -> str:
    """The delivery id of a wait's approval request (its reminders add ``:remind-<n>``)."""
    return f"approval_request:{session}:{wait_id}"


def close_delivery_id(session: str, wait_id: str) -> str:
    """The delivery id of the close of a wait's approval request (one per wait)."""
    return f"approval_closed:{session}:{wait_id}"


def abort_mark(session: str, run_id: str) -> str:
    """The broker mark naming who aborted run `run_id` (a stop in the thread, an operator)."""
    return f"aborted-by:{session}:{run_id}"


async def note_abort(broker: Broker, session: str, lane: AgentLane, by: str) -> None:
    """Remember who is about to abort `lane`'s open operation (the first to say so is kept)."""
    run_id = (await lane.info()).operation_id
    if run_id is not None:
        await broker.marks.put(abort_mark(session, run_id), by, expect=None)


async def decided_of(storage: SessionStorage, wait: ApprovalRequested) -> StoredRecord | None:
    """The decision recorded for `wait`, if any (one read of its run's decisions)."""
    for stored in await storage.find_records(
        RecordQuery(
            lane=wait.lane, type="approval_decided", run_id=wait.run_id, order="oldest_first"
        )
    ):
        if isinstance(stored.record, ApprovalDecided) and stored.record.wait_id == wait.id:
            return stored
    return None


async def closure(
    storage: SessionStorage, broker: Broker, session: str, requested: StoredRecord
) -> ApprovalClosed | None:
    """How the wait `requested` (an `ApprovalRequested`) ended, or None while it waits."""
    record = requested.record
    assert isinstance(record, ApprovalRequested)
    base = {
        "session": session,
        "run_id": record.run_id,
        "wait_id": record.id,
        "request_delivery_id": request_delivery_id(session, record.id),
        "requested_at_ms": requested.timestamp,
    }
    stored = await decided_of(storage, record)
    if stored is not None and isinstance(stored.record, ApprovalDecided):
        decided = stored.record
        verdicts = {verdict(d) for d in decided.decisions}
        outcome = "decided" if len(verdicts) > 1 else verdicts.pop()
        reason = next((d.reason for d in decided.decisions if not d.approved and d.reason), None)
        supplied = next((d.supplied for d in decided.decisions if d.supplied is not None), None)
        return ApprovalClosed(
            **base,
            outcome=outcome,
            by=decided.decided_by,
            at_ms=stored.timestamp,
            reason=reason,
            result=result_line(supplied.text) if supplied is not None else None,
            result_is_error=supplied is not None and supplied.is_error,
        )
    finished = await storage.find_records(
        RecordQuery(lane=record.lane, type="operation_finished", run_id=record.run_id, limit=1)
    )
    if not finished or not isinstance(finished[0].record, OperationFinished):
        return None
    end = finished[0]
    assert isinstance(end.record, OperationFinished)
    if end.record.outcome == "aborted":
        by = await broker.marks.get(abort_mark(session, record.run_id))
        return ApprovalClosed(**base, outcome="stopped", by=by, at_ms=end.timestamp)
    return ApprovalClosed(**base, outcome="ended", at_ms=end.timestamp)


def verdict(decision: ApprovalDecision) -> Literal["approved", "denied", "supplied"]:
    """What one call's decision was, in a word."""
    if decision.supplied is not None:
        return "supplied"
    return "approved" if decision.approved else "denied"


def supplied_words(who: str | None, closed: ApprovalClosed, when: str = "") -> str:
    """``ann supplied the result at ...: deployed by hand`` (`closed` holds the result)."""
    failed = " (the action failed)" if closed.result_is_error else ""
    return f"{who or 'someone'} supplied the result{failed}{when}: {closed.result or ''}"


def described(closed: ApprovalClosed) -> str:
    """How it ended, in a few words: ``approved by ann at 2025-01-02 10:30 UTC``.

    The gateway's own process (``gateway:<worker id>``: a run its route no longer reaches) is
    "the gateway": a worker's id means nothing in a thread.
    """
    by = f" by {closed.by}" if closed.by else ""
    if closed.by and closed.by.startswith("gateway:"):
        by = " by the gateway"
    at = datetime.datetime.fromtimestamp(closed.at_ms / 1000, tz=datetime.UTC)
    when = f" at {at:%Y-%m-%d %H:%M} UTC"
    if closed.outcome == "approved":
        return f"approved{by}{when}"
    if closed.outcome == "denied":
        why = f" (reason: {' '.join(closed.reason.split())[:500]})" if closed.reason else ""
        return f"denied{by}{when}{why}"
    if closed.outcome == "supplied":
        return supplied_words(closed.by, closed, when)
    if closed.outcome == "decided" and closed.result is not None:
        return f"decided{by}{when} (for some calls, {supplied_words('they', closed)})"
    if closed.outcome == "decided":
        return f"decided{by}{when} (some calls approved, some denied)"
    if closed.outcome == "stopped":
        return f"stopped{by}{when}"
    return f"closed{when}: its run ended"


def closed_text(closed: ApprovalClosed, names: str) -> str:
    """The close's words in a thread (Markdown): what was asked, and how it ended."""
    said = described(closed)
    end = "" if said.endswith((".", "!", "?", "…")) else "."  # a supplied result's own ending
    return f"The approval request for {names} is closed: {said}{end}"


def close_outbound(
    state: ThreadState, thread: ThreadRef, requested: ApprovalRequested, closed: ApprovalClosed
) -> Outbound:
    """The ``approval_closed`` delivery of a wait that ended (one per wait)."""
    names = ", ".join(sorted({call.tool_name for call in requested.calls}))
    return Outbound(
        delivery_id=close_delivery_id(state.session, requested.id),
        thread=thread,
        kind="approval_closed",
        text=closed_text(closed, names),
        closed=closed,
        reply_context=state.reply_context,
    )
