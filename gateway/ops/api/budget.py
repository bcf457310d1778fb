"""The operator API's budgets: set one lane's token budget over its profile's (D295).

`PUT /lanes/{id}/budget` with ``{"tokens": N}`` gives the lane a budget of its own (more than its
profile's, to let a spent thread go on, or less); ``{"tokens": null}`` gives it its profile's
again. It is a value, not an increment, so a repeated call changes nothing; it takes effect at
the lane's next message or operator action, and a lane whose thread has no budget refuses one
(409, reason ``no_budget``): a budget is the profile's to give first.
"""

from __future__ import annotations

from fastapi import Request

from gateway.budgets import set_budget
from gateway.lane_status import lane_thread
from gateway.ops.api.context import OpsContext
from gateway.ops.errors import ApiError
from gateway.ops.reads import read_only
from gateway.ops.views import BudgetRequest, BudgetView, lane_of
from gateway.ops.views import lane_id as id_of

__all__ = ["BudgetActions"]


class BudgetActions:
    """``/lanes/{id}/budget``."""

    def __init__(self, ops: OpsContext) -> None:
        self.ops = ops

    async def set_lane_budget(
        self, request: Request, lane_id: str, body: BudgetRequest
    ) -> BudgetView:
        """Set the lane's token budget (null: its profile's again); audited."""
        who = self.ops.who(request, "operator")
        session, lane = lane_of(lane_id)
        broker = self.ops.broker
        async with read_only(self.ops.repo, session) as storage:
            await self.ops.known(storage, session, lane)
            base = self.ops.limits.budget(await lane_thread(broker, session, lane))
            if base is None and body.tokens is not None:
                raise ApiError(
                    409,
                    "conflict",
                    f"lane {lane!r} has no token budget to set: give its profile a token_budget "
                    "(or set GATEWAY_TOKEN_BUDGET) first. Nothing was changed.",
                    {"reason": "no_budget"},
                )
            now_ms = self.ops.clock.now_ms()
            found, changed = await set_budget(
                broker, session, lane, body.tokens, by=who.actor, now_ms=now_ms, reason=body.reason
            )
            spent = (await storage.get_usage(lane=lane)).total_tokens
        in_force = found.tokens if found is not None and found.tokens is not None else base
        return BudgetView(
            id=id_of(session, lane),
            changed=changed,
            budget=in_force,
            profile_budget=base,
            spent=spent,
            set_by=found.by if found else None,
            set_at_ms=found.at_ms if found else None,
            reason=found.reason if found else None,
        )
