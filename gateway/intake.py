"""Intake: the gateway's side of the channel seam (messages and clicks into the durable inbox).

An adapter calls `accept` (or `decide`); the thread is routed to its session, the lane's reply
context is remembered, and the item is appended to the session's inbox, deduplicated by the
message's identity. Only then does the call return, and only then may the adapter acknowledge
its channel: nothing it acknowledged can be lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from adapters.channel import (
    Acceptance,
    DecisionInbound,
    Inbound,
    NotRouted,
    ThreadRef,
    Unavailable,
)
from gateway.broker.contract import Broker, NewInboxItem
from gateway.logs import event
from harness_core.session.names import check_lane_name, check_session_id

__all__ = ["Intake"]

log = logging.getLogger("gateway.intake")


class Intake:
    """Routes inbound messages to sessions and holds them in the inbox (an `InboundSink`)."""

    def __init__(self, broker: Broker, route: Callable[[str, str], str | None]) -> None:
        self._broker = broker
        self._route = route
        """(channel, space) -> the session id, or None when nothing is bound."""

    def _session_of(self, thread: ThreadRef) -> str:
        session = self._route(thread.channel, thread.space)
        if session is None:
            raise NotRouted(f"no session is bound to {thread.channel} space {thread.space!r}")
        try:
            check_session_id(session)
            check_lane_name(thread.lane)
        except ValueError as exc:
            raise NotRouted(str(exc)) from exc
        return session

    async def accept(self, inbound: Inbound) -> Acceptance:
        """See `InboundSink.accept`."""
        session = self._session_of(inbound.thread)
        lane = inbound.thread.lane
        try:
            await self._broker.threads.remember(
                session,
                lane,
                inbound.thread.model_dump(mode="json"),
                dict(inbound.reply_context),
            )
            appended = await self._broker.inbox.append(
                NewInboxItem(
                    session=session,
                    lane=lane,
                    dedupe_key=inbound.dedupe_key,
                    kind="message",
                    payload=inbound.model_dump(mode="json"),
                )
            )
        except Exception as exc:  # the inbox could not hold it: the channel must retry
            log.warning(event("inbox unavailable", error=type(exc).__name__))
            raise Unavailable(f"the inbox is unavailable ({type(exc).__name__})") from exc
        log.info(
            event(
                "message accepted",
                session=session,
                lane=lane,
                item=appended.item.id,
                duplicate=appended.duplicate,
            )
        )
        return Acceptance(
            item_id=appended.item.id, session=session, lane=lane, duplicate=appended.duplicate
        )

    async def decide(self, decision: DecisionInbound) -> Acceptance:
        """See `InboundSink.decide`."""
        session = self._session_of(decision.thread)
        lane = decision.thread.lane
        try:
            appended = await self._broker.inbox.append(
                NewInboxItem(
                    session=session,
                    lane=lane,
                    dedupe_key=f"decision:{lane}:{decision.idempotency_key}",
                    kind="decision",
                    payload=decision.model_dump(mode="json"),
                )
            )
        except Exception as exc:
            log.warning(event("inbox unavailable", error=type(exc).__name__))
            raise Unavailable(f"the inbox is unavailable ({type(exc).__name__})") from exc
        log.info(event("decision accepted", session=session, lane=lane, item=appended.item.id))
        return Acceptance(
            item_id=appended.item.id, session=session, lane=lane, duplicate=appended.duplicate
        )
