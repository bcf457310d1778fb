"""The operator API under ``/api/v1``: read sessions, lanes and timelines; act on lanes.

Reads need a viewer or operator token; actions need an operator token. An action on a lane is
checked against the lane as stored (a refusal changes nothing), then carried to the session's
worker through the inbox (see `gateway.operator_actions`); the answer is the action's result if it
ends within `wait` seconds (200), else where it stands (202, poll ``/actions/{id}``). Every
action takes an ``Idempotency-Key`` (required for decisions): the same key replays the first
result without judging the lane again; the same key with another request is 409.

The routes come in groups, each a small class over one `OpsContext` (`context`: the store, the
broker, who asks, a lane's view): `lanes` (sessions, lanes, timelines, usage: the store's reads),
`audit` (the audit trail and the backlog), `deliveries` (the outbox, redeliver, discard) and
`actions` (the lane actions and where each stands), `authority` (revoke and unrevoke a lane or
a session, D267), `budget` (a lane's own token budget, D295), `mcp` (the MCP servers' health,
read from the callable the service hands in); `params` holds the shared parameters.
`OpsApi` composes them into one router, the route table below.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from gateway.broker.contract import Broker
from gateway.lane_status import LaneLimits
from gateway.operator_actions import ActionResult
from gateway.ops.api.actions import LaneActions
from gateway.ops.api.audit import AuditReads
from gateway.ops.api.authority import AuthorityActions
from gateway.ops.api.budget import BudgetActions
from gateway.ops.api.context import OpsContext
from gateway.ops.api.deliveries import Deliveries
from gateway.ops.api.lanes import LaneReads
from gateway.ops.api.mcp import McpHealth, McpReads, no_servers
from gateway.ops.auth import OpsAuth
from gateway.ops.errors import API_PREFIX
from gateway.ops.page import ops_page_router
from gateway.ops.views import (
    AuditView,
    AuthorityView,
    BacklogView,
    BudgetView,
    DeliveryView,
    LaneView,
    McpView,
    Page,
    SessionView,
    TimelinePage,
    WhoAmIView,
)
from harness_core import Clock, SessionRepo

__all__ = ["OpsApi"]


class OpsApi:
    """The operator API's routes over one store and one broker."""

    def __init__(
        self,
        repo: SessionRepo,
        broker: Broker,
        auth: OpsAuth,
        clock: Clock,
        *,
        limits: LaneLimits,
        mcp_health: McpHealth = no_servers,
    ) -> None:
        self.context = OpsContext(repo, broker, auth, clock, limits=limits)
        self.lanes = LaneReads(self.context)
        self.audit = AuditReads(self.context)
        self.deliveries = Deliveries(self.context)
        self.actions = LaneActions(self.context)
        self.authority = AuthorityActions(self.context)
        self.budget = BudgetActions(self.context)
        self.mcp = McpReads(self.context, mcp_health)
        self.router = self._build()
        self.routers = [self.router, ops_page_router()]
        """Every router of the operator surface (the API; the /ops page joins it)."""

    async def whoami(self, request: Request) -> WhoAmIView:
        """``GET /whoami``: the caller's token name and role (the page offers acting by it)."""
        who = self.context.who(request, "viewer")
        return WhoAmIView(name=who.name, role=who.role)

    def _build(self) -> APIRouter:
        router = APIRouter(
            prefix=API_PREFIX,
            tags=["operators"],
            dependencies=[Depends(self.context.authenticate)],
            responses={401: {"description": "no token, or not a valid one"}},
        )
        get = router.get
        acting = [Depends(self.context.operator)]  # 403 for a viewer, before any body is read

        def post(path: str, **kwargs: Any) -> Any:
            return router.post(path, dependencies=acting, **kwargs)

        lanes, audit, deliveries, actions = self.lanes, self.audit, self.deliveries, self.actions
        get("/whoami", response_model=WhoAmIView)(self.whoami)
        get("/sessions", response_model=Page[SessionView])(lanes.sessions)
        get("/lanes", response_model=Page[LaneView])(lanes.lanes)
        get("/lanes/{lane_id}", response_model=LaneView)(lanes.lane)
        get("/lanes/{lane_id}/timeline", response_model=TimelinePage)(lanes.timeline)
        get("/lanes/{lane_id}/usage")(lanes.usage)
        get("/audit", response_model=Page[AuditView])(audit.audit)
        get("/backlog", response_model=BacklogView)(audit.backlog)
        get("/mcp", response_model=McpView)(self.mcp.servers)
        get("/deliveries", response_model=Page[DeliveryView])(deliveries.deliveries)
        get("/deliveries/{delivery_id}", response_model=DeliveryView)(deliveries.delivery)
        get("/actions", response_model=ActionResult)(actions.action_by_key)
        get("/actions/{action_id}", response_model=ActionResult)(actions.action)
        for name in ("resume", "unstick", "abort", "rewind", "retry"):
            post(f"/lanes/{{lane_id}}/{name}", response_model=ActionResult)(getattr(actions, name))
        post("/lanes/{lane_id}/decisions", response_model=ActionResult)(actions.decide)
        authority = self.authority
        post("/lanes/{lane_id}/revoke", response_model=AuthorityView)(authority.revoke_lane)
        post("/lanes/{lane_id}/unrevoke", response_model=AuthorityView)(authority.unrevoke_lane)
        post("/sessions/{session}/revoke", response_model=AuthorityView)(authority.revoke_session)
        post("/sessions/{session}/unrevoke", response_model=AuthorityView)(
            authority.unrevoke_session
        )
        router.put("/lanes/{lane_id}/budget", response_model=BudgetView, dependencies=acting)(
            self.budget.set_lane_budget
        )
        post("/deliveries/{delivery_id}/redeliver", response_model=DeliveryView)(
            deliveries.redeliver
        )
        post("/deliveries/{delivery_id}/discard", response_model=DeliveryView)(deliveries.discard)
        return router
