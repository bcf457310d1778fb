"""What the operator API reads: sessions, lanes and their status, timelines, usage, backlog.

Everything is read from the store and the broker without taking anything: storages are opened
read-only, the session's lease is only looked at (who executes it now), and a lane's status
comes from `inspect_lane`, the same fold restore uses.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from adapters import result_line
from gateway.authority import Revocation, revocation_of
from gateway.broker.contract import Broker
from gateway.budgets import lane_budget
from gateway.lane_status import LaneLimits, inspect_held, thread_ref
from gateway.ops.errors import ApiError
from gateway.ops.views import (
    DecidedView,
    InterruptedCallView,
    LaneView,
    PendingCallView,
    RevokedView,
    TimelineItem,
    UsageItem,
    lane_id,
    spelled_if_mixed,
)
from gateway.profiles import PROFILE_ENTRY
from harness_core import (
    LaneInspection,
    SessionError,
    SessionRepo,
    SessionStorage,
    ToolRecovery,
    recovery_of,
)
from harness_core.session import LaneMove, MessageEntry, RecordQuery, StoredEntry, StoredRecord
from harness_core.session.entries import ActiveToolsChangeEntry, CustomEntry, ModelChangeEntry
from harness_core.session.records import ApprovalDecided, ToolStarted, Usage

__all__ = [
    "allowed_actions",
    "lane_view",
    "read_only",
    "revoked_view",
    "thread_ref",
    "timeline_page",
    "usage_page",
]

_POLICIES: tuple[ToolRecovery, ...] = ("declared", "never", "always")
_SCAN = 500
"""Log items read per round while a lane's page is filled."""


@contextlib.asynccontextmanager
async def read_only(repo: SessionRepo, session: str) -> AsyncIterator[SessionStorage]:
    """The session opened without a lease; `ApiError` 404 when it does not exist."""
    try:
        storage = await repo.open(session)
    except SessionError as exc:
        if exc.code in ("not_found", "invalid_query", "invalid_session_id"):
            raise ApiError(404, "not_found", f"no session {session!r}") from exc
        raise
    try:
        yield storage
    finally:
        await storage.close()


def allowed_actions(seen: LaneInspection, *, revoked: bool = False) -> list[str]:
    """The actions a lane's status allows now (what the page offers).

    A revoked lane allows only an abort (its run ends anyway) and an unrevoke (D267); any
    other lane may be revoked (not listed: it is always allowed).
    """
    status = seen.info.status
    reason = seen.info.suspended
    if revoked:
        return (["abort"] if status in ("running", "suspended", "stuck") else []) + ["unrevoke"]
    actions: list[str] = []
    if status == "stuck":
        actions += ["resume", "unstick", "abort"]  # resume unsticks: a fresh attempt budget
    elif status == "suspended" and reason == "approval":
        actions += ["decide", "abort"]
    elif status == "suspended":
        actions += ["resume", "abort"]
    elif status == "running":
        actions += ["abort"]
    elif status in ("idle", "failed"):
        actions += ["rewind"] + (["retry"] if status == "failed" else [])
    return actions


async def lane_view(
    storage: SessionStorage,
    broker: Broker,
    session: str,
    lane: str,
    *,
    limits: LaneLimits,
    held_by: str | None,
) -> LaneView:
    """One lane as an operator sees it; `ApiError` 404 for a lane the session lacks.

    Its caps are its own: its thread's profile's, as its worker applies them.
    """
    state = await broker.threads.get(session, lane)
    thread = thread_ref(state.thread) if state is not None else None
    max_attempts = limits.attempts(thread)
    try:
        seen = await inspect_held(
            storage, broker, session, lane, max_attempts=max_attempts, held=held_by is not None
        )
    except SessionError as exc:
        if exc.code == "unknown_lane":
            raise ApiError(404, "not_found", f"no lane {lane!r} in session {session!r}") from exc
        raise
    info = seen.info
    revocation = await revocation_of(broker.marks, session, lane, thread)
    budget = await lane_budget(broker.marks, limits.budget(thread), session, lane)
    actions = allowed_actions(seen, revoked=revocation is not None)
    # what a resume would do to them: listed while a resume is to be decided (a lane being
    # resumed, running, listed them as if it still needed one)
    interrupted = seen.interrupted_calls if "resume" in actions else ()
    return LaneView(
        id=lane_id(session, lane),
        session=session,
        lane=lane,
        lane_spelled=spelled_if_mixed(lane),
        status=info.status,
        leaf_id=info.leaf_id,
        suspended=info.suspended,
        attempts=info.attempts,
        max_attempts=max_attempts,
        token_budget=budget,
        operation_id=info.operation_id,
        operation_kind=info.operation_kind,
        activity=seen.activity,
        last_outcome=info.last_outcome,
        error=info.error.model_dump(mode="json") if info.error is not None else None,
        fault=info.fault,
        wait_id=seen.wait_id,
        pending_approvals=[
            PendingCallView(
                tool_call_id=p.tool_call_id,
                tool_name=p.tool_name,
                arguments=dict(p.args),
                args_digest=p.args_digest,
            )
            for p in seen.pending_approvals
        ],
        interrupted_calls=[
            InterruptedCallView(
                tool_call_id=call.tool_call_id,
                tool_name=call.tool_name,
                replay=call.replay,
                on_resume={policy: recovery_of(call, policy) for policy in _POLICIES},
            )
            for call in interrupted
        ],
        queued=seen.queued,
        last_decision=await _last_decision(storage, lane),
        thread=dict(state.thread) if state is not None else None,
        held_by=held_by,
        revoked=revoked_view(revocation),
        actions=actions,
    )


async def _last_decision(storage: SessionStorage, lane: str) -> DecidedView | None:
    found = await storage.find_records(RecordQuery(lane=lane, type="approval_decided", limit=1))
    if not found:
        return None
    stored = found[0]
    record = stored.record
    assert isinstance(record, ApprovalDecided)
    return DecidedView(
        wait_id=record.wait_id,
        decided_by=record.decided_by,
        at_ms=stored.timestamp,
        calls={
            d.tool_call_id: "supplied"
            if d.supplied is not None
            else "approved"
            if d.approved
            else "denied"
            for d in record.decisions
        },
    )


def revoked_view(revocation: Revocation | None) -> RevokedView | None:
    """An active revocation as the API shows it (None: none, or restored)."""
    if revocation is None or not revocation.active:
        return None
    return RevokedView.model_validate(revocation.details())


async def timeline_page(
    storage: SessionStorage, lane: str, *, after: int, limit: int
) -> tuple[list[TimelineItem], int | None]:
    """The lane's entries, records and moves after seq `after`, oldest first; the next cursor."""
    items: list[TimelineItem] = []
    cursor = after
    while True:
        page = await storage.get_log(after_seq=cursor, limit=_SCAN)
        for item in page:
            cursor = item.seq
            view = _timeline_item(item, lane)
            if view is not None:
                items.append(view)
                if len(items) == limit:
                    return items, cursor  # more may follow
        if len(page) < _SCAN:
            return items, None


def _timeline_item(item: Any, lane: str) -> TimelineItem | None:
    if isinstance(item, StoredEntry):
        if item.lane != lane:
            return None
        entry = item.entry
        return TimelineItem(
            seq=item.seq,
            at_ms=item.timestamp,
            kind="entry",
            type=entry.type,
            id=entry.id,
            summary=_entry_summary(entry),
            data=entry.model_dump(mode="json"),
        )
    if isinstance(item, StoredRecord):
        record = item.record
        if getattr(record, "lane", None) != lane:
            return None
        return TimelineItem(
            seq=item.seq,
            at_ms=item.timestamp,
            kind="record",
            type=record.type,
            id=record.id,
            run_id=getattr(record, "run_id", None),
            summary=_record_summary(record),
            data=record.model_dump(mode="json"),
        )
    if isinstance(item, LaneMove) and item.lane == lane:
        return TimelineItem(
            seq=item.seq,
            at_ms=item.timestamp,
            kind="move",
            type="lane_move",
            summary=f"lane moved to {item.leaf_id or 'the root'}",
            data=item.model_dump(mode="json"),
        )
    return None


def _entry_summary(entry: Any) -> str:
    if isinstance(entry, MessageEntry):
        message = entry.message
        role = message.role
        texts: list[str] = []
        for part in getattr(message, "content", ()):
            kind = getattr(part, "type", "")
            if kind == "text":
                texts.append(part.text)
            elif kind == "tool_call":
                texts.append(f"calls {part.name}({_short(part.arguments)})")
        name = getattr(message, "tool_name", None)
        head = f"{role} ({name})" if name else role
        stop = getattr(message, "stop_reason", None)
        tail = f" [{stop}]" if stop not in (None, "stop", "tool_use") else ""
        details = getattr(message, "details", None)
        if isinstance(details, Mapping) and details.get("supplied") is True:
            # the tool never ran: whoever decided the call gave this result (D236)
            head += f" [{details.get('note') or 'supplied'}]"
        return _clip(f"{head}: {' '.join(texts) or '(no text)'}{tail}")
    return _clip(_configuration_summary(entry) or f"{entry.type}")


def _configuration_summary(entry: Any) -> str | None:
    """A configuration entry in words: a lane's model, tools or profile changed here."""
    if isinstance(entry, ModelChangeEntry):
        return f"model: {entry.provider}:{entry.model_id}"
    if isinstance(entry, ActiveToolsChangeEntry):
        return f"tools: {', '.join(entry.active_tool_names) or '(none)'}"
    if isinstance(entry, CustomEntry) and entry.custom_type == PROFILE_ENTRY:
        data = entry.data if isinstance(entry.data, dict) else {}
        tools = data.get("tools")
        shown = ", ".join(map(str, tools)) if isinstance(tools, list | tuple) else "?"
        return (
            f"profile {data.get('profile', '?')} ({data.get('digest', '?')}): "
            f"model {data.get('model', '?')}, tools {shown or '(none)'}"
        )
    if isinstance(entry, CustomEntry):
        return f"custom {entry.custom_type}"
    return None


def _record_summary(record: Any) -> str:
    if isinstance(record, ApprovalDecided):
        return _clip(_decided_summary(record))
    if isinstance(record, ToolStarted):
        return _clip(
            f"tool {record.tool_name} started (replay={record.replay}) "
            f"args {_short(record.effective_args)}"
        )
    if isinstance(record, Usage):
        usage = record.usage
        return _clip(
            f"usage {record.cause}: {usage.input} in / {usage.output} out"
            + (f" ({record.stop_reason})" if record.stop_reason else "")
        )
    outcome = getattr(record, "outcome", None)
    error = getattr(record, "error", None)
    text = record.type.replace("_", " ")
    if outcome:
        text += f": {outcome}"
    if error is not None:
        text += f" ({getattr(error, 'code', '')}: {getattr(error, 'message', '')})"
    return _clip(text)


def _decided_summary(record: ApprovalDecided) -> str:
    """Who decided, and each call's decision: ``c2 result supplied: deployed by hand``."""
    said = []
    for decision in record.decisions:
        if decision.supplied is not None:
            failed = " (the action failed)" if decision.supplied.is_error else ""
            line = result_line(decision.supplied.text, 120)
            said.append(f"{decision.tool_call_id} result supplied{failed}: {line}")
        elif decision.approved:
            said.append(f"{decision.tool_call_id} approved")
        else:
            why = f" ({result_line(decision.reason, 120)})" if decision.reason else ""
            said.append(f"{decision.tool_call_id} denied{why}")
    by = f" by {record.decided_by}" if record.decided_by else ""
    return f"approval decided{by}: {'; '.join(said)}"


def _short(value: Any) -> str:
    return _clip(json.dumps(value, default=str, separators=(",", ":")), 120)


def _clip(text: str, size: int = 300) -> str:
    return text if len(text) <= size else text[: size - 1] + "…"


async def usage_page(
    storage: SessionStorage, lane: str, *, after: int, limit: int
) -> tuple[list[UsageItem], int | None]:
    """The lane's cost ledger (failed attempts included) after seq `after`, oldest first."""
    records = await storage.find_records(
        RecordQuery(lane=lane, type="usage", after_seq=after, order="oldest_first", limit=limit)
    )
    items = []
    for stored in records:
        record = stored.record
        assert isinstance(record, Usage)
        items.append(
            UsageItem(
                seq=stored.seq,
                at_ms=stored.timestamp,
                cause=record.cause,
                run_id=record.run_id,
                entry_id=record.entry_id,
                attempt=record.attempt,
                stop_reason=record.stop_reason,
                usage=record.usage.model_dump(mode="json"),
            )
        )
    return items, (items[-1].seq if len(items) == limit else None)
