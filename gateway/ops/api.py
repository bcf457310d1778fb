"""The operator API under ``/api/v1``: read sessions, lanes and timelines; act on lanes.

Reads need a viewer or operator token; actions need an operator token. An action on a lane is
checked against the lane as stored (a refusal changes nothing), then carried to the session's
worker through the inbox (see `gateway.operator_actions`); the answer is the action's result if it
ends within `wait` seconds (200), else where it stands (202, poll ``/actions/{id}``). Every
action takes an ``Idempotency-Key`` (required for decisions): the same key replays the first
result without judging the lane again; the same key with another request is 409.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse

from gateway.broker.contract import Broker, NewAuditEvent, NewInboxItem
from gateway.lane_status import unused_main
from gateway.operator_actions import (
    ActionKind,
    ActionResult,
    OperatorAction,
    action_id_of,
    read_result,
    request_digest,
    result_mark,
)
from gateway.ops.auth import OpsAuth, Principal, Role
from gateway.ops.checks import check_allowed, decision_items, statuses
from gateway.ops.errors import API_PREFIX, ApiError
from gateway.ops.page import ops_page_router
from gateway.ops.reads import lane_view, read_only, timeline_page, usage_page
from gateway.ops.views import (
    ActionRequest,
    AuditView,
    BacklogView,
    DecisionsRequest,
    DeliveryView,
    LaneView,
    Page,
    RerunRequest,
    SessionView,
    TimelinePage,
    decode_cursor,
    encode_cursor,
    lane_of,
)
from harness_core import Clock, SessionRepo, ToolRecovery
from harness_core.session import OperationStarted, RecordQuery, RunIntent

__all__ = ["OpsApi"]

_KEY = r"^[!-~]{1,512}$"
_POLL_S = 0.05

Limit = Annotated[int, Query(ge=1, le=100, description="Items per page (1-100).")]
Cursor = Annotated[str | None, Query(max_length=2048, description="`next_cursor` of a page.")]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        pattern=_KEY,
        description="1-512 visible ASCII characters; the same key replays the first result.",
    ),
]
Wait = Annotated[
    float, Query(ge=0, le=30, description="Seconds to wait for the result (then 202).")
]


class OpsApi:
    """The operator API's routes over one store and one broker."""

    def __init__(
        self,
        repo: SessionRepo,
        broker: Broker,
        auth: OpsAuth,
        clock: Clock,
        *,
        max_attempts: int,
    ) -> None:
        self.repo = repo
        self.broker = broker
        self.auth = auth
        self.clock = clock
        self.max_attempts = max_attempts
        self.router = self._build()
        self.routers = [self.router, ops_page_router()]
        """Every router of the operator surface (the API; the /ops page joins it)."""

    # -- reads -----------------------------------------------------------------------------

    async def sessions(
        self, request: Request, limit: Limit = 50, cursor: Cursor = None
    ) -> Page[SessionView]:
        """Sessions of the store, by id."""
        self._who(request, "viewer")
        after = decode_cursor(cursor, 1)
        metas = sorted(await self.repo.list(), key=lambda m: m.id)
        if after is not None:
            metas = [m for m in metas if m.id > after[0]]
        items = []
        for meta in metas[:limit]:
            async with read_only(self.repo, meta.id) as storage:
                pointers = await storage.get_lanes()
                lanes = sum(1 for p in pointers if not unused_main(p.lane, "idle", p.leaf_id))
            holder = await self.repo.lease_holder(meta.id)
            items.append(
                SessionView(
                    id=meta.id,
                    name=meta.name,
                    created_at_ms=meta.created_at,
                    lanes=lanes,
                    held_by=holder.owner if holder else None,
                )
            )
        more = len(metas) > limit
        return Page(items=items, next_cursor=encode_cursor(items[-1].id) if more else None)

    async def lanes(
        self,
        request: Request,
        session: Annotated[str | None, Query(max_length=200)] = None,
        lane: Annotated[str | None, Query(max_length=1024, description="A lane name.")] = None,
        status: Annotated[
            str | None, Query(max_length=200, description="Comma-separated statuses.")
        ] = None,
        stuck: bool = False,
        limit: Limit = 50,
        cursor: Cursor = None,
    ) -> Page[LaneView]:
        """Lanes with their status, by session and name; filter by session and status."""
        self._who(request, "viewer")
        wanted = statuses(status, stuck)
        after = decode_cursor(cursor, 2)
        metas = sorted(await self.repo.list(), key=lambda m: m.id)
        items: list[LaneView] = []
        more = False
        for meta in metas:
            if session is not None and meta.id != session:
                continue
            if after is not None and meta.id < after[0]:
                continue
            holder = await self.repo.lease_holder(meta.id)
            async with read_only(self.repo, meta.id) as storage:
                names = sorted(p.lane for p in await storage.get_lanes())
                for name in names:
                    if lane is not None and name != lane:
                        continue
                    if after is not None and (meta.id, name) <= (after[0], after[1]):
                        continue
                    view = await lane_view(
                        storage,
                        self.broker,
                        meta.id,
                        name,
                        max_attempts=self.max_attempts,
                        held_by=holder.owner if holder else None,
                    )
                    if wanted is not None and view.status not in wanted:
                        continue
                    if unused_main(view.lane, view.status, view.leaf_id):
                        continue
                    if len(items) == limit:
                        more = True
                        break
                    items.append(view)
            if more:
                break
        last = items[-1] if items else None
        next_cursor = encode_cursor(last.session, last.lane) if more and last else None
        return Page(items=items, next_cursor=next_cursor)

    async def lane(self, request: Request, lane_id: str) -> LaneView:
        """One lane."""
        self._who(request, "viewer")
        session, lane = lane_of(lane_id)
        return await self._lane(session, lane)

    async def timeline(
        self,
        request: Request,
        lane_id: str,
        limit: Annotated[int, Query(ge=1, le=500)] = 100,
        cursor: Cursor = None,
    ) -> TimelinePage:
        """The lane's entries, records and moves, oldest first (content included).

        The first page also carries the lane's audit events: who did what to it, and how it
        ended (takeovers, stuck, operator actions).
        """
        self._who(request, "viewer")
        session, lane = lane_of(lane_id)
        after = decode_cursor(cursor, 1)
        async with read_only(self.repo, session) as storage:
            await self._known(storage, session, lane)
            items, last = await timeline_page(storage, lane, after=_seq(after), limit=limit)
        audit = (
            await self.broker.audit.list(session=session, lane=lane, limit=200)
            if after is None
            else ()
        )
        return TimelinePage(
            items=items,
            next_cursor=encode_cursor(str(last)) if last else None,
            audit=[AuditView.model_validate(e.model_dump(mode="json")) for e in audit],
        )

    async def usage(
        self, request: Request, lane_id: str, limit: Limit = 100, cursor: Cursor = None
    ) -> dict[str, Any]:
        """The lane's cost ledger, failed attempts included, and its total."""
        self._who(request, "viewer")
        session, lane = lane_of(lane_id)
        after = decode_cursor(cursor, 1)
        async with read_only(self.repo, session) as storage:
            await self._known(storage, session, lane)
            items, last = await usage_page(storage, lane, after=_seq(after), limit=limit)
            total = await storage.get_usage(lane=lane)
        return {
            "total": total.model_dump(mode="json"),
            "items": [item.model_dump(mode="json") for item in items],
            "next_cursor": encode_cursor(str(last)) if last else None,
        }

    async def audit(
        self,
        request: Request,
        session: Annotated[str | None, Query(max_length=200)] = None,
        lane: Annotated[str | None, Query(max_length=1024)] = None,
        limit: Limit = 50,
        cursor: Cursor = None,
    ) -> Page[AuditView]:
        """The audit trail in record order: who did what, when, with which outcome."""
        self._who(request, "viewer")
        after = decode_cursor(cursor, 1)
        events = await self.broker.audit.list(
            session=session, lane=lane, after=after[0] if after else None, limit=limit
        )
        items = [AuditView.model_validate(e.model_dump(mode="json")) for e in events]
        more = len(items) == limit
        return Page(items=items, next_cursor=encode_cursor(items[-1].id) if more else None)

    async def backlog(self, request: Request) -> BacklogView:
        """What waits: inbox and outbox backlog and ages, rejected items, dead letters."""
        self._who(request, "viewer")
        inbox = await self.broker.inbox.backlog()
        outbox = await self.broker.outbox.backlog(now_ms=self.clock.now_ms())
        return BacklogView(
            inbox_pending=inbox.pending,
            inbox_oldest_age_ms=inbox.oldest_age_ms,
            inbox_rejected=inbox.dead,
            outbox_pending=outbox.pending,
            outbox_oldest_age_ms=outbox.oldest_age_ms,
            dead_letters=outbox.dead,
        )

    async def deliveries(
        self,
        request: Request,
        status: Annotated[str, Query(pattern="^(pending|delivered|dead|discarded)$")] = "dead",
        limit: Limit = 50,
        cursor: Cursor = None,
    ) -> Page[DeliveryView]:
        """Deliveries of one status (dead letters by default) with their reasons."""
        self._who(request, "viewer")
        after = decode_cursor(cursor, 1)
        found = await self.broker.outbox.list(
            status,  # type: ignore[arg-type]
            after=after[0] if after else None,
            limit=limit,
        )
        items = [_delivery(d) for d in found]
        more = len(items) == limit
        return Page(items=items, next_cursor=encode_cursor(items[-1].id) if more else None)

    async def delivery(self, request: Request, delivery_id: str) -> DeliveryView:
        """One delivery, whatever its status."""
        self._who(request, "viewer")
        found = await self.broker.outbox.get(delivery_id)
        if found is None:
            raise ApiError(404, "not_found", f"no delivery {delivery_id[:80]!r}")
        return _delivery(found)

    async def action(self, request: Request, action_id: str) -> JSONResponse:
        """Where an action stands."""
        self._who(request, "viewer")
        result = await read_result(self.broker, action_id)
        if result is None:
            raise ApiError(404, "not_found", f"no action {action_id[:80]!r}")
        return JSONResponse(json.loads(result.model_dump_json()))  # refused is a state here

    # -- actions ---------------------------------------------------------------------------

    async def resume(
        self,
        request: Request,
        lane_id: str,
        body: ActionRequest | None = None,
        idempotency_key: IdempotencyKey = None,
        wait: Wait = 10.0,
    ) -> JSONResponse:
        """Resume a suspended lane; `tool_recovery` says what becomes of started tool calls."""
        choice = body or ActionRequest()
        return await self._act(
            request, lane_id, "resume", idempotency_key, wait, tool_recovery=choice.tool_recovery
        )

    async def unstick(
        self,
        request: Request,
        lane_id: str,
        body: ActionRequest | None = None,
        idempotency_key: IdempotencyKey = None,
        wait: Wait = 10.0,
    ) -> JSONResponse:
        """Resume a stuck lane with a fresh attempt budget (after fixing the cause)."""
        choice = body or ActionRequest()
        return await self._act(
            request, lane_id, "unstick", idempotency_key, wait, tool_recovery=choice.tool_recovery
        )

    async def abort(
        self,
        request: Request,
        lane_id: str,
        idempotency_key: IdempotencyKey = None,
        wait: Wait = 10.0,
    ) -> JSONResponse:
        """Abort the lane's open operation."""
        return await self._act(request, lane_id, "abort", idempotency_key, wait)

    async def rewind(
        self,
        request: Request,
        lane_id: str,
        body: RerunRequest,
        idempotency_key: IdempotencyKey = None,
        wait: Wait = 10.0,
    ) -> JSONResponse:
        """Move the lane to just before a user message and run it again (the old branch stays)."""
        return await self._act(
            request, lane_id, "rewind", idempotency_key, wait, entry_id=body.entry_id
        )

    async def retry(
        self,
        request: Request,
        lane_id: str,
        idempotency_key: IdempotencyKey = None,
        wait: Wait = 10.0,
    ) -> JSONResponse:
        """Run a failed run again from its first message (the failed branch stays)."""
        return await self._act(request, lane_id, "retry", idempotency_key, wait)

    async def decide(
        self,
        request: Request,
        lane_id: str,
        body: DecisionsRequest,
        idempotency_key: IdempotencyKey = None,
        wait: Wait = 10.0,
    ) -> JSONResponse:
        """Approve or deny exactly the pending calls of the wait the lane is suspended on."""
        if idempotency_key is None:
            raise ApiError(428, "precondition_required", "decisions need an Idempotency-Key header")
        return await self._act(request, lane_id, "decide", idempotency_key, wait, decisions=body)

    async def redeliver(self, request: Request, delivery_id: str) -> DeliveryView:
        """A dead letter back to pending with a fresh attempt budget (the same id)."""
        who = self._who(request, "operator")
        found = await self.broker.outbox.get(delivery_id)
        if found is None:
            raise ApiError(404, "not_found", f"no delivery {delivery_id[:80]!r}")
        if found.status != "dead":
            raise ApiError(
                409, "conflict", f"the delivery is {found.status}", {"reason": "not_dead"}
            )
        again = await self.broker.outbox.redeliver(delivery_id, now_ms=self.clock.now_ms())
        assert again is not None
        await self._audit(who, "redeliver", found.session, found.lane, delivery_id, again.status)
        return _delivery(again)

    async def discard(self, request: Request, delivery_id: str) -> DeliveryView:
        """Give up on a dead or pending delivery (kept as discarded)."""
        who = self._who(request, "operator")
        found = await self.broker.outbox.get(delivery_id)
        if found is None:
            raise ApiError(404, "not_found", f"no delivery {delivery_id[:80]!r}")
        if found.status not in ("dead", "pending"):
            raise ApiError(
                409, "conflict", f"the delivery is {found.status}", {"reason": "settled"}
            )
        gone = await self.broker.outbox.discard(delivery_id, now_ms=self.clock.now_ms())
        assert gone is not None
        await self._audit(who, "discard", found.session, found.lane, delivery_id, gone.status)
        return _delivery(gone)

    # -- the action path ---------------------------------------------------------------------

    async def _act(
        self,
        request: Request,
        lane_ref: str,
        kind: ActionKind,
        key: str | None,
        wait: float,
        *,
        tool_recovery: ToolRecovery = "declared",
        entry_id: str | None = None,
        decisions: DecisionsRequest | None = None,
    ) -> JSONResponse:
        who = self._who(request, "operator")
        session, lane = lane_of(lane_ref)
        asked = {
            "kind": kind,
            "session": session,
            "lane": lane,
            "tool_recovery": tool_recovery,
            "entry_id": entry_id,
            "decisions": decisions.model_dump(mode="json") if decisions else None,
        }
        digest = request_digest(asked)
        action_id = (
            action_id_of(who.actor, key) if key else action_id_of(who.actor, digest + _nonce())
        )
        digest_mark = f"ops:request:{action_id}"
        seen = await self.broker.marks.get(digest_mark)
        if seen is not None:  # a replayed key: the first result, whatever the lane is now
            if seen != digest:
                raise ApiError(
                    409,
                    "conflict",
                    "this Idempotency-Key was used for another request",
                    {"reason": "idempotency_key_reused"},
                )
            return await self._answer_when_done(action_id, wait)
        view = await self._lane(session, lane)
        check_allowed(view, kind)
        action = OperatorAction(
            id=action_id,
            kind=kind,
            session=session,
            lane=lane,
            actor=who.actor,
            tool_recovery=tool_recovery,
            # the operator saw what a resume does to a stuck lane: a fresh attempt budget
            unstick=kind == "unstick" or (kind == "resume" and view.status == "stuck"),
            entry_id=await self._rerun_target(session, view, entry_id, kind == "retry")
            if kind in ("rewind", "retry")
            else None,
            wait_id=decisions.wait_id if decisions else None,
            decisions=decision_items(view, decisions) if decisions else (),
            idempotency_key=key or action_id,
            requested_at_ms=self.clock.now_ms(),
        )
        if not await self.broker.marks.put(digest_mark, digest, expect=None):
            return await self._answer_when_done(action_id, wait)  # a racing twin
        pending = ActionResult(
            id=action_id, kind=kind, session=session, lane=lane, status="pending",
            at_ms=self.clock.now_ms(),
        )  # fmt: skip
        await self.broker.marks.put(result_mark(action_id), pending.model_dump_json(), expect=None)
        await self.broker.inbox.append(
            NewInboxItem(
                session=session,
                lane=lane,
                dedupe_key=f"operator:{action_id}",
                kind="operator",
                payload=action.model_dump(mode="json"),
            )
        )
        return await self._answer_when_done(action_id, wait)

    async def _answer_when_done(self, action_id: str, wait: float) -> JSONResponse:
        deadline = asyncio.get_running_loop().time() + wait
        while True:
            result = await read_result(self.broker, action_id)
            final = result is not None and result.status in ("done", "refused")
            if final or asyncio.get_running_loop().time() >= deadline:
                break
            await asyncio.sleep(_POLL_S)
        if result is None:
            raise ApiError(503, "unavailable", "the action's state could not be read")
        return _answer(result)

    async def _rerun_target(
        self, session: str, view: LaneView, entry_id: str | None, retry: bool
    ) -> str:
        if not retry:
            assert entry_id is not None
            return entry_id
        if view.status != "failed":
            raise ApiError(
                409,
                "conflict",
                f"the lane is {view.status}: only a failed run is retried",
                {"reason": "not_failed"},
            )
        async with read_only(self.repo, session) as storage:
            finished = await storage.find_records(
                RecordQuery(lane=view.lane, type="operation_finished", limit=1)
            )
            run_id = getattr(finished[0].record, "run_id", None) if finished else None
            started = (
                await storage.find_records(
                    RecordQuery(run_id=run_id, type="operation_started", limit=1)
                )
                if run_id
                else ()
            )
        record = started[0].record if started else None
        if (
            not isinstance(record, OperationStarted)
            or not isinstance(record.intent, RunIntent)
            or not record.intent.initial_messages
        ):
            raise ApiError(
                409,
                "conflict",
                "the failed run has no message to run again",
                {"reason": "no_message"},
            )
        return record.intent.initial_messages[0].id

    async def _lane(self, session: str, lane: str) -> LaneView:
        holder = await self.repo.lease_holder(session)
        async with read_only(self.repo, session) as storage:
            return await lane_view(
                storage,
                self.broker,
                session,
                lane,
                max_attempts=self.max_attempts,
                held_by=holder.owner if holder else None,
            )

    async def _known(self, storage: Any, session: str, lane: str) -> None:
        if lane not in {p.lane for p in await storage.get_lanes()}:
            raise ApiError(404, "not_found", f"no lane {lane!r} in session {session!r}")

    async def _audit(
        self, who: Principal, action: str, session: str, lane: str, target: str, outcome: str
    ) -> None:
        await self.broker.audit.record(
            NewAuditEvent(
                actor=who.actor, action=action, session=session, lane=lane, target=target,
                outcome=outcome,
            )
        )  # fmt: skip

    def _who(self, request: Request, role: Role) -> Principal:
        """The caller (authenticated before anything else), if its role allows `role`."""
        principal = getattr(request.state, "principal", None)
        if not isinstance(principal, Principal):
            principal = self.auth.principal(request)
        return self.auth.allow(principal, role)

    async def _authenticate(self, request: Request) -> None:
        # a router dependency: it runs before any parameter or body is judged, so an
        # unauthenticated caller learns nothing about a route but that it needs a token
        request.state.principal = self.auth.principal(request)

    def _build(self) -> APIRouter:
        router = APIRouter(
            prefix=API_PREFIX,
            tags=["operators"],
            dependencies=[Depends(self._authenticate)],
            responses={401: {"description": "no token, or not a valid one"}},
        )
        get, post = router.get, router.post
        get("/sessions", response_model=Page[SessionView])(self.sessions)
        get("/lanes", response_model=Page[LaneView])(self.lanes)
        get("/lanes/{lane_id}", response_model=LaneView)(self.lane)
        get("/lanes/{lane_id}/timeline", response_model=TimelinePage)(self.timeline)
        get("/lanes/{lane_id}/usage")(self.usage)
        get("/audit", response_model=Page[AuditView])(self.audit)
        get("/backlog", response_model=BacklogView)(self.backlog)
        get("/deliveries", response_model=Page[DeliveryView])(self.deliveries)
        get("/deliveries/{delivery_id}", response_model=DeliveryView)(self.delivery)
        get("/actions/{action_id}", response_model=ActionResult)(self.action)
        for name in ("resume", "unstick", "abort", "rewind", "retry"):
            post(f"/lanes/{{lane_id}}/{name}", response_model=ActionResult)(getattr(self, name))
        post("/lanes/{lane_id}/decisions", response_model=ActionResult)(self.decide)
        post("/deliveries/{delivery_id}/redeliver", response_model=DeliveryView)(self.redeliver)
        post("/deliveries/{delivery_id}/discard", response_model=DeliveryView)(self.discard)
        return router


def _nonce() -> str:
    return secrets.token_hex(8)


def _seq(after: tuple[str, ...] | None) -> int:
    if after is None:
        return 0
    if not after[0].isdigit():
        raise ApiError(400, "invalid_cursor", "the cursor is not one this API returned")
    return int(after[0])


def _answer(result: ActionResult) -> JSONResponse:
    """200 with a final result, 202 while pending or running, 409 if the worker refused it.

    A refusal means the lane changed between the API's check and the worker's action; a
    replayed key answers the same way as the first call did.
    """
    body = json.loads(result.model_dump_json())
    if result.status == "refused":
        error = dict(result.error or {})
        message = str(error.get("message", "refused"))
        raise ApiError(409, "conflict", message, {"reason": error.get("code"), "action": body})
    location = {"Location": f"{API_PREFIX}/actions/{result.id}"}
    return JSONResponse(body, status_code=200 if result.status == "done" else 202, headers=location)


def _delivery(found: Any) -> DeliveryView:
    outbound = dict(found.outbound)
    return DeliveryView(
        id=found.id,
        session=found.session,
        lane=found.lane,
        status=found.status,
        attempts=found.attempts,
        last_error=found.last_error,
        unknown_outcome=found.unknown_outcome,
        kind=outbound.get("kind"),
        text=outbound.get("text"),
        created_at_ms=found.created_at_ms,
        settled_at_ms=found.settled_at_ms,
    )
