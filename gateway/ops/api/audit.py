"""The operator API's broker reads: the audit trail and the backlog (what happened, what waits)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Request

from gateway.ops.api.context import OpsContext
from gateway.ops.api.params import Cursor, Limit
from gateway.ops.views import AuditView, BacklogView, Page, decode_cursor, encode_cursor

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
        """The audit trail in record order: who did what, when, with which outcome."""
        self.ops.who(request, "viewer")
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
