"""The operator API's deliveries: list and read outbound messages, redeliver or discard one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import Query, Request
from pydantic import ValidationError

from adapters import ThreadRef
from gateway.authority import revocation_of
from gateway.broker.contract import NewAuditEvent
from gateway.ops.api.context import OpsContext
from gateway.ops.api.params import Cursor, IdempotencyKey, Limit
from gateway.ops.auth import Principal
from gateway.ops.errors import ApiError
from gateway.ops.views import DeliveryView, Page, decode_cursor, encode_cursor

__all__ = ["Deliveries"]


class Deliveries:
    """``/deliveries``: the outbox by status (dead letters first); redeliver or discard one."""

    def __init__(self, ops: OpsContext) -> None:
        self.ops = ops

    async def deliveries(
        self,
        request: Request,
        status: Annotated[str, Query(pattern="^(pending|delivered|dead|discarded)$")] = "dead",
        limit: Limit = 50,
        cursor: Cursor = None,
    ) -> Page[DeliveryView]:
        """Deliveries of one status (dead letters by default) with their reasons."""
        self.ops.who(request, "viewer")
        after = decode_cursor(cursor, 1)
        found = await self.ops.broker.outbox.list(
            status,  # type: ignore[arg-type]
            after=after[0] if after else None,
            limit=limit,
        )
        items = [_delivery(d) for d in found]
        more = len(items) == limit
        return Page(items=items, next_cursor=encode_cursor(items[-1].id) if more else None)

    async def delivery(self, request: Request, delivery_id: str) -> DeliveryView:
        """One delivery, whatever its status."""
        self.ops.who(request, "viewer")
        found = await self.ops.broker.outbox.get(delivery_id)
        if found is None:
            raise ApiError(404, "not_found", f"no delivery {delivery_id[:80]!r}")
        return _delivery(found)

    async def redeliver(
        self, request: Request, delivery_id: str, idempotency_key: IdempotencyKey = None
    ) -> DeliveryView:
        """A dead letter back to pending with a fresh attempt budget (the same id).

        The same ``Idempotency-Key`` again (a script's retry after a timeout) answers the
        delivery as it is now, with 200, and does nothing.
        """
        who = self.ops.who(request, "operator")
        found = await self.ops.broker.outbox.get(delivery_id)
        if found is None:
            raise ApiError(404, "not_found", f"no delivery {delivery_id[:80]!r}")
        if await self._replayed(idempotency_key, "redeliver", delivery_id):
            return _delivery(found)
        if found.status != "dead":
            raise ApiError(
                409, "conflict", f"the delivery is {found.status}", {"reason": "not_dead"}
            )
        # sent again into a thread still revoked, it would be a dead letter again at once
        thread = _thread(found.outbound)
        revoked = await revocation_of(self.ops.broker.marks, found.session, found.lane, thread)
        if revoked is not None:
            raise ApiError(
                409,
                "conflict",
                f"redeliver needs the thread's authority, which is revoked: {revoked.why} "
                f"({revoked.scope.words()}, by {revoked.by}); unrevoke it first",
                {"reason": "authority_revoked"},
            )
        again = await self.ops.broker.outbox.redeliver(delivery_id, now_ms=self.ops.clock.now_ms())
        assert again is not None
        if not again.changed:  # another operator's call took it between the read and this one
            raise ApiError(
                409,
                "conflict",
                f"the delivery is {again.delivery.status}",
                {"reason": "not_dead"},
            )
        await self._remember(idempotency_key, "redeliver", delivery_id)
        await self._audit(who, "redeliver", found.session, found.lane, delivery_id, "pending")
        return _delivery(again.delivery)

    async def discard(
        self, request: Request, delivery_id: str, idempotency_key: IdempotencyKey = None
    ) -> DeliveryView:
        """Give up on a dead delivery, or a pending one no attempt is being made of.

        The same ``Idempotency-Key`` again answers the delivery as it is now (200).
        """
        who = self.ops.who(request, "operator")
        found = await self.ops.broker.outbox.get(delivery_id)
        if found is None:
            raise ApiError(404, "not_found", f"no delivery {delivery_id[:80]!r}")
        if await self._replayed(idempotency_key, "discard", delivery_id):
            return _delivery(found)
        if found.status not in ("dead", "pending"):
            raise ApiError(
                409, "conflict", f"the delivery is {found.status}", {"reason": "settled"}
            )
        gone = await self.ops.broker.outbox.discard(delivery_id, now_ms=self.ops.clock.now_ms())
        assert gone is not None
        if not gone.changed:
            status = gone.delivery.status
            if status == "pending":  # a deliverer holds it: the send may yet arrive
                raise ApiError(
                    409,
                    "conflict",
                    "the delivery is being sent now: discard it once this attempt ends "
                    "(it may yet arrive; its status will say)",
                    {"reason": "being_sent"},
                )
            raise ApiError(409, "conflict", f"the delivery is {status}", {"reason": "settled"})
        await self._remember(idempotency_key, "discard", delivery_id)
        await self._audit(who, "discard", found.session, found.lane, delivery_id, "discarded")
        return _delivery(gone.delivery)

    async def _replayed(self, key: str | None, action: str, delivery_id: str) -> bool:
        """Whether `key` already did `action` to the delivery (409 if it did something else)."""
        if key is None:
            return False
        done = await self.ops.broker.marks.get(_key_mark(key))
        if done is None:
            return False
        if done != f"{action} {delivery_id}":
            raise ApiError(
                409,
                "conflict",
                "this Idempotency-Key was used for another action",
                {"reason": "idempotency_key_reused"},
            )
        return True

    async def _remember(self, key: str | None, action: str, delivery_id: str) -> None:
        if key is not None:
            await self.ops.broker.marks.put(_key_mark(key), f"{action} {delivery_id}", expect=None)

    async def _audit(
        self, who: Principal, action: str, session: str, lane: str, target: str, outcome: str
    ) -> None:
        await self.ops.broker.audit.record(
            NewAuditEvent(
                actor=who.actor, action=action, session=session, lane=lane, target=target,
                outcome=outcome,
            )
        )  # fmt: skip


def _key_mark(key: str) -> str:
    """The broker mark that remembers what a delivery action's Idempotency-Key did."""
    return f"ops:delivery-key:{key}"


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


def _thread(outbound: Mapping[str, Any]) -> ThreadRef | None:
    """The thread a delivery goes to (None: its payload names none this code reads)."""
    try:
        return ThreadRef.model_validate(outbound.get("thread"))
    except ValidationError:
        return None
