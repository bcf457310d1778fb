"""The operator API's store reads: sessions, lanes, a lane, its timeline and its cost ledger."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Query, Request

from adapters import whole_number
from gateway.authority import Scope, read_scope
from gateway.budgets import lane_budget
from gateway.lane_status import lane_thread, unused_main
from gateway.ops.api.context import OpsContext
from gateway.ops.api.params import Cursor, Limit
from gateway.ops.checks import statuses
from gateway.ops.errors import ApiError
from gateway.ops.reads import lane_view, read_only, revoked_view, timeline_page, usage_page
from gateway.ops.views import (
    AuditView,
    LaneView,
    Page,
    SessionView,
    TimelinePage,
    decode_cursor,
    encode_cursor,
    lane_of,
)

__all__ = ["LaneReads"]


class LaneReads:
    """``/sessions`` and ``/lanes``: what the store holds, read without taking a session."""

    def __init__(self, ops: OpsContext) -> None:
        self.ops = ops

    async def sessions(
        self, request: Request, limit: Limit = 50, cursor: Cursor = None
    ) -> Page[SessionView]:
        """Sessions of the store, by id."""
        self.ops.who(request, "viewer")
        after = decode_cursor(cursor, 1)
        metas = sorted(await self.ops.repo.list(), key=lambda m: m.id)
        if after is not None:
            metas = [m for m in metas if m.id > after[0]]
        items = []
        for meta in metas[:limit]:
            async with read_only(self.ops.repo, meta.id) as storage:
                pointers = await storage.get_lanes()
                lanes = sum(1 for p in pointers if not unused_main(p.lane, "idle", p.leaf_id))
            holder = await self.ops.repo.lease_holder(meta.id)
            revoked, _ = await read_scope(self.ops.broker.marks, Scope.of_session(meta.id))
            items.append(
                SessionView(
                    id=meta.id,
                    name=meta.name,
                    created_at_ms=meta.created_at,
                    lanes=lanes,
                    held_by=holder.owner if holder else None,
                    revoked=revoked_view(revoked),
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
        self.ops.who(request, "viewer")
        wanted = statuses(status, stuck)
        after = decode_cursor(cursor, 2)
        metas = sorted(await self.ops.repo.list(), key=lambda m: m.id)
        items: list[LaneView] = []
        more = False
        for meta in metas:
            if session is not None and meta.id != session:
                continue
            if after is not None and meta.id < after[0]:
                continue
            holder = await self.ops.repo.lease_holder(meta.id)
            async with read_only(self.ops.repo, meta.id) as storage:
                names = sorted(p.lane for p in await storage.get_lanes())
                for name in names:
                    if lane is not None and name != lane:
                        continue
                    if after is not None and (meta.id, name) <= (after[0], after[1]):
                        continue
                    view = await lane_view(
                        storage,
                        self.ops.broker,
                        meta.id,
                        name,
                        limits=self.ops.limits,
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
        self.ops.who(request, "viewer")
        session, lane = lane_of(lane_id)
        return await self.ops.lane(session, lane)

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
        self.ops.who(request, "viewer")
        session, lane = lane_of(lane_id)
        after = decode_cursor(cursor, 1)
        async with read_only(self.ops.repo, session) as storage:
            await self.ops.known(storage, session, lane)
            items, last = await timeline_page(storage, lane, after=_seq(after), limit=limit)
        audit = (
            await self.ops.broker.audit.list(session=session, lane=lane, limit=200)
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
        """The lane's cost ledger, failed attempts included, its total and its token budget."""
        self.ops.who(request, "viewer")
        session, lane = lane_of(lane_id)
        after = decode_cursor(cursor, 1)
        async with read_only(self.ops.repo, session) as storage:
            await self.ops.known(storage, session, lane)
            items, last = await usage_page(storage, lane, after=_seq(after), limit=limit)
            total = await storage.get_usage(lane=lane)
        thread = await lane_thread(self.ops.broker, session, lane)
        budget = await lane_budget(
            self.ops.broker.marks, self.ops.limits.budget(thread), session, lane
        )
        return {
            "total": total.model_dump(mode="json"),
            "budget": budget,
            "items": [item.model_dump(mode="json") for item in items],
            "next_cursor": encode_cursor(str(last)) if last else None,
        }


def _seq(after: tuple[str, ...] | None) -> int:
    if after is None:
        return 0
    seq = whole_number(after[0], 2**63 - 1)
    if seq is None:
        raise ApiError(400, "invalid_cursor", "the cursor is not one this API returned")
    return seq
