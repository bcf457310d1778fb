"""What every group of operator routes shares: the store, the broker, who asks, a lane's view."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from adapters import read_json
from gateway.broker.contract import Broker
from gateway.lane_status import LaneLimits
from gateway.ops.auth import OpsAuth, Principal, Role
from gateway.ops.errors import ApiError
from gateway.ops.reads import lane_view, read_only
from gateway.ops.views import LaneView
from harness_core import Clock, SessionRepo

__all__ = ["OpsContext"]


class OpsContext:
    """The store, the broker, the tokens and the clock the operator routes work through."""

    def __init__(
        self,
        repo: SessionRepo,
        broker: Broker,
        auth: OpsAuth,
        clock: Clock,
        *,
        limits: LaneLimits,
    ) -> None:
        self.repo = repo
        self.broker = broker
        self.auth = auth
        self.clock = clock
        self.limits = limits

    def who(self, request: Request, role: Role) -> Principal:
        """The caller (authenticated before anything else), if its role allows `role`."""
        principal = getattr(request.state, "principal", None)
        if not isinstance(principal, Principal):
            principal = self.auth.principal(request)
        return self.auth.allow(principal, role)

    async def authenticate(self, request: Request) -> None:
        """The router's dependency: the caller's token, judged before anything else."""
        # it runs before any parameter or body is judged, so an unauthenticated caller
        # learns nothing about a route but that it needs a token
        request.state.principal = self.auth.principal(request)

    async def operator(self, request: Request) -> None:
        """An acting route's dependency: an operator's token, judged before its body.

        A viewer with a malformed body got 400 and the field list instead of 403. The body is
        then read strictly: a key given twice in one object (``deny`` then ``approve`` for one
        call) was read as its last value, and approved (D340).
        """
        self.who(request, "operator")
        body = await request.body()
        if body:
            try:
                read_json(body)
            except ValueError as exc:
                raise ApiError(400, "invalid_argument", str(exc)) from None

    async def lane(self, session: str, lane: str) -> LaneView:
        """The lane as stored, with its holder and the worker's parked mark."""
        holder = await self.repo.lease_holder(session)
        async with read_only(self.repo, session) as storage:
            return await lane_view(
                storage,
                self.broker,
                session,
                lane,
                limits=self.limits,
                held_by=holder.owner if holder else None,
            )

    async def known(self, storage: Any, session: str, lane: str) -> None:
        """Refuse (404) a lane the session does not have."""
        if lane not in {p.lane for p in await storage.get_lanes()}:
            raise ApiError(404, "not_found", f"no lane {lane!r} in session {session!r}")
