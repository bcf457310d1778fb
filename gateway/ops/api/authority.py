"""The operator API's revocations: revoke or unrevoke a lane or a whole session (D267).

A revocation holds at once, in every process (`gateway.authority`): nothing more is posted in
the threads it covers, their messages are kept and not run, and the worker holding the session
(woken here) ends their open runs ``authority_revoked``. Both calls are idempotent (revoking a
revoked lane keeps the first revocation) and audited, and answer with the revocation as it is.
"""

from __future__ import annotations

from fastapi import Request

from gateway.authority import Revocation, Scope, restore, revocation_of, revoke, wake
from gateway.lane_status import thread_ref
from gateway.ops.api.context import OpsContext
from gateway.ops.reads import read_only, revoked_view
from gateway.ops.views import AuthorityRequest, AuthorityView, lane_of

__all__ = ["AuthorityActions"]

_CAUSE = "operator"


class AuthorityActions:
    """``/lanes/{id}/revoke``, ``/lanes/{id}/unrevoke``, ``/sessions/{id}/revoke`` and back."""

    def __init__(self, ops: OpsContext) -> None:
        self.ops = ops

    async def revoke_lane(
        self, request: Request, lane_id: str, body: AuthorityRequest | None = None
    ) -> AuthorityView:
        """Withdraw a lane's authority: its run ends, its messages wait unrun, nothing is posted."""
        who = self.ops.who(request, "operator")
        session, lane = lane_of(lane_id)
        await self.ops.lane(session, lane)  # 404 for a lane the session lacks
        return await self._revoke(Scope.of_lane(session, lane), who.actor, body)

    async def unrevoke_lane(
        self, request: Request, lane_id: str, body: AuthorityRequest | None = None
    ) -> AuthorityView:
        """Give a lane its authority back: lifts the revocation its view shows (the narrowest).

        That may be its session's, its channel space's or its channel's (the bot added back to
        a Slack channel without Slack saying so): every lane it covers gets authority back.
        """
        who = self.ops.who(request, "operator")
        session, lane = lane_of(lane_id)
        view = await self.ops.lane(session, lane)
        found = await revocation_of(self.ops.broker.marks, session, lane, thread_ref(view.thread))
        if found is None:
            return AuthorityView(changed=False)
        return await self._restore(found.scope, who.actor, body)

    async def revoke_session(
        self, request: Request, session: str, body: AuthorityRequest | None = None
    ) -> AuthorityView:
        """Withdraw the authority of every lane of a session, present and future."""
        who = self.ops.who(request, "operator")
        async with read_only(self.ops.repo, session):
            pass  # 404 for a session the store lacks
        return await self._revoke(Scope.of_session(session), who.actor, body)

    async def unrevoke_session(
        self, request: Request, session: str, body: AuthorityRequest | None = None
    ) -> AuthorityView:
        """Lift a session's revocation (a lane's own, or its channel's, stays)."""
        who = self.ops.who(request, "operator")
        async with read_only(self.ops.repo, session):
            pass
        return await self._restore(Scope.of_session(session), who.actor, body)

    async def _revoke(
        self, scope: Scope, actor: str, body: AuthorityRequest | None
    ) -> AuthorityView:
        why = (body.reason if body else None) or f"revoked by {actor}"
        broker = self.ops.broker
        revocation, changed = await revoke(
            broker, scope, cause=_CAUSE, why=why, by=actor, now_ms=self.ops.clock.now_ms()
        )
        assert scope.session is not None
        await wake(broker, scope.session, revocation)  # idempotent: a repeat wakes it once
        return _answer(revocation, changed)

    async def _restore(
        self, scope: Scope, actor: str, body: AuthorityRequest | None
    ) -> AuthorityView:
        restored, changed = await restore(
            self.ops.broker,
            scope,
            by=actor,
            now_ms=self.ops.clock.now_ms(),
            why=body.reason if body else None,
        )
        return _answer(restored, changed)


def _answer(revocation: Revocation | None, changed: bool) -> AuthorityView:
    if revocation is None:
        return AuthorityView(changed=changed)
    return AuthorityView(
        changed=changed,
        revoked=revoked_view(revocation),
        restored_by=revocation.restored_by,
        restored_at_ms=revocation.restored_at_ms,
    )
