"""Reading what a lane holds, and answering a web approval, the same way in every service test."""

from __future__ import annotations

from typing import Any

from harness_core import SessionRepo, UserMessage, message_text
from harness_core.session.entries import MessageEntry


async def lane_texts(
    repo: SessionRepo,
    session: str,
    lane: str,
    kind: type[Any] = UserMessage,
) -> list[str]:
    """The texts of the lane's messages of `kind` (user messages by default), without a lease."""
    storage = await repo.open(session)
    try:
        return [
            message_text(stored.entry.message)
            for stored in await storage.read_lane_entries(lane, after=None)
            if isinstance(stored.entry, MessageEntry) and isinstance(stored.entry.message, kind)
        ]
    finally:
        await storage.close()


def decision_body(approval: dict[str, Any], *, approved: bool, key: str) -> dict[str, Any]:
    """A web channel decision deciding every call of an `approval_request` item alike."""
    return {
        "run_id": approval["run_id"],
        "wait_id": approval["wait_id"],
        "decisions": [
            {
                "tool_call_id": call["tool_call_id"],
                "args_digest": call["args_digest"],
                "approved": approved,
            }
            for call in approval["calls"]
        ],
        "idempotency_key": key,
    }
