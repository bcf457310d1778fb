"""The operator API's lane actions: resume, unstick, abort, rewind, retry, decide, and their state.

An action is checked against the lane as stored (a refusal changes nothing), then carried to the
session's worker through the inbox; the answer is its result if it ends within `wait` seconds
(200), else where it stands (202). The same ``Idempotency-Key`` replays the first result.
"""

from __future__ import annotations

import asyncio
import json
import secrets

from fastapi import Request
from fastapi.responses import JSONResponse

from gateway.broker.contract import NewInboxItem
from gateway.operator_actions import (
    ActionKind,
    ActionResult,
    OperatorAction,
    action_id_of,
    read_result,
    request_digest,
    result_mark,
)
from gateway.ops.api.context import OpsContext
from gateway.ops.api.params import IdempotencyKey, KeyQuery, Wait
from gateway.ops.checks import check_allowed, decision_items
from gateway.ops.errors import API_PREFIX, ApiError
from gateway.ops.reads import read_only
from gateway.ops.views import ActionRequest, DecisionsRequest, LaneView, RerunRequest, lane_of
from harness_core import ToolRecovery
from harness_core.session import OperationStarted, RecordQuery, RunIntent

__all__ = ["LaneActions"]

_POLL_S = 0.05


class LaneActions:
    """``/lanes/{id}/<action>``, ``/actions/{id}``: an operator's action, carried to the worker."""

    def __init__(self, ops: OpsContext) -> None:
        self.ops = ops

    async def action(self, request: Request, action_id: str) -> JSONResponse:
        """Where an action stands."""
        self.ops.who(request, "viewer")
        result = await read_result(self.ops.broker, action_id)
        if result is None:
            raise ApiError(404, "not_found", f"no action {action_id[:80]!r}")
        return JSONResponse(json.loads(result.model_dump_json()))  # refused is a state here

    async def action_by_key(self, request: Request, key: KeyQuery) -> JSONResponse:
        """The action this caller's ``Idempotency-Key`` named, wherever it stands.

        A key's first action is found without sending the request again (whose body, built
        from what the lane showed then, a retry after a Ctrl-C cannot rebuild); 404: nothing
        was done under it.
        """
        who = self.ops.who(request, "viewer")
        result = await read_result(self.ops.broker, action_id_of(who.actor, key))
        if result is None:
            raise ApiError(404, "not_found", "no action of yours under this key: nothing was done")
        return JSONResponse(json.loads(result.model_dump_json()))

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
        """Approve, deny or supply the result of exactly the pending calls of the lane's wait.

        ``supply`` (with ``result``, and ``is_error`` when the action failed): the operator did
        the call's action themselves; the tool does not run and the model reads the result.
        """
        if idempotency_key is None:
            raise ApiError(428, "precondition_required", "decisions need an Idempotency-Key header")
        return await self._act(request, lane_id, "decide", idempotency_key, wait, decisions=body)

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
        who = self.ops.who(request, "operator")
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
        seen = await self.ops.broker.marks.get(digest_mark)
        if seen is not None:  # a replayed key: the first result, whatever the lane is now
            _same_request(seen, digest)
            return await self._answer_when_done(action_id, wait)
        view = await self.ops.lane(session, lane)
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
            requested_at_ms=self.ops.clock.now_ms(),
        )
        if not await self.ops.broker.marks.put(digest_mark, digest, expect=None):
            # a racing request with this key took it first: its twin shares its result, and
            # another request (an Approve and a Deny sent together) is refused as when later
            _same_request(await self.ops.broker.marks.get(digest_mark), digest)
            return await self._answer_when_done(action_id, wait)
        pending = ActionResult(
            id=action_id, kind=kind, session=session, lane=lane, status="pending",
            at_ms=self.ops.clock.now_ms(),
        )  # fmt: skip
        await self.ops.broker.marks.put(
            result_mark(action_id), pending.model_dump_json(), expect=None
        )
        await self.ops.broker.inbox.append(
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
            result = await read_result(self.ops.broker, action_id)
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
        async with read_only(self.ops.repo, session) as storage:
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


def _nonce() -> str:
    return secrets.token_hex(8)


def _answer(result: ActionResult) -> JSONResponse:
    """200 with a final result, 202 while pending or running, 409 if the worker refused it.

    A refusal means the lane changed between the API's check and the worker's action; a
    replayed key answers the same way as the first call did.
    """
    body = json.loads(result.model_dump_json())
    if result.status == "refused":
        error = dict(result.error or {})
        message = str(error.get("message", "refused"))
        reason = error.get("reason") or error.get("code")  # an action stored before reasons
        raise ApiError(409, "conflict", message, {"reason": reason, "action": body})
    location = {"Location": f"{API_PREFIX}/actions/{result.id}"}
    return JSONResponse(body, status_code=200 if result.status == "done" else 202, headers=location)


def _same_request(seen: str | None, digest: str) -> None:
    """Refuse a request that reuses another request's Idempotency-Key (409)."""
    if seen is not None and seen != digest:
        raise ApiError(
            409,
            "conflict",
            "this Idempotency-Key was used for another request",
            {"reason": "idempotency_key_reused"},
        )
