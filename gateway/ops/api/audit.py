"""The operator API's broker reads: the audit trail and the backlog (what happened, what waits)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Request

from gateway.ops.api.context import OpsContext
from gateway.ops.api.params import Cursor, Limit
from gateway.ops.errors import ApiError
from gateway.ops.views import (
    AuditView,
    BacklogView,
    Page,
    decode_cursor,
    encode_cursor,
    lane_of,
)

__all__ = ["AuditReads"]


class AuditReads:
    """``/audit`` and ``/backlog``: who did what, and what waits in the inbox and the outbox."""

    def __init__(self, ops: OpsContext) -> None:
        self.ops = ops

    async def audit(
        self,
        request: Request,
        session: Annotated[str | None, Query(max_length=200)] = None,
        lane: Annotated[str | None, Query(max_length=1024)] = None,
        limit: Limit = 50,
        cursor: Cursor = None,
    ) -> Page[AuditView]:
        """The audit trail in record order: who did what, when, with which outcome.

        `lane` is a lane's id (``ln_...``, as every lane route takes it; it names its session
        too) or its name (with `session` to tell the sessions' lanes of one name apart).
        """
        self.ops.who(request, "viewer")
        if lane is not None and lane.startswith("ln_"):
            # an id read as a name found nothing, and said nothing (an outside probe)
            owner, lane = lane_of(lane)
            if session is not None and session != owner:
                raise ApiError(
                    400,
                    "invalid_argument",
                    f"lane {lane!r} is of session {owner!r}, not {session!r}",
                )
            session = owner
        after = decode_cursor(cursor, 1)
        events = await self.ops.broker.audit.list(
            session=session, lane=lane, after=after[0] if after else None, limit=limit
        )
        items = [AuditView.model_validate(e.model_dump(mode="json")) for e in events]
        more = len(items) == limit
        return Page(items=items, next_cursor=encode_cursor(items[-1].id) if more else None)

    async def backlog(self, request: Request) -> BacklogView:
        """What waits: inbox and outbox backlog and ages, rejected items, dead letters."""
        self.ops.who(request, "viewer")
        inbox = await self.ops.broker.inbox.backlog()
        outbox = await self.ops.broker.outbox.backlog(now_ms=self.ops.clock.now_ms())
        return BacklogView(
            inbox_pending=inbox.pending,
            inbox_oldest_age_ms=inbox.oldest_age_ms,
            inbox_rejected=inbox.dead,
            outbox_pending=outbox.pending,
            outbox_oldest_age_ms=outbox.oldest_age_ms,
            dead_letters=outbox.dead,
        )
