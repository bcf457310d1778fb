"""Approval reminders: a request that has waited long is asked again in its thread.

An approval never expires: the run waits for a person. But a person can miss the request, and
nothing else would ever say it is still there. Every sweep, each gateway process looks at every
session's open operations (a bounded query answered from a projection, without a lease) and, for a
run suspended for approval whose request has waited at least ``interval x 2^(n-1)``, posts the
request again with its buttons as reminder ``n``: after one interval, two, four, eight... Only
the newest reminder due is sent (a gateway that was down for a day does not send the ones it
missed), and its delivery id (``approval_request:<session>:<wait>:remind-<n>``) makes every
process and every sweep enqueue it once. A request that was decided, or whose run was stopped,
is no longer open and gets none. A decision from a reminder is the same decision: it names the
same wait, and the first one wins; when the wait ends, every copy is closed (`gateway.closes`).
"""

from __future__ import annotations

import contextlib
import datetime
import logging

from adapters import Outbound, ThreadRef
from gateway.authority import revocation_of
from gateway.broker.contract import Broker
from gateway.logs import event
from gateway.replies import approval_outbound, delivery_id
from harness_core import SessionError, SessionRepo, SessionStorage, inspect_lane
from harness_core.session.records import ApprovalRequested

__all__ = ["due_reminder", "remind", "reminder_text"]

log = logging.getLogger("gateway.reminders")


def due_reminder(waited_ms: int, interval_ms: int) -> int | None:
    """The newest reminder due after `waited_ms`, or None before the first.

    Reminder 1 is due after one interval, 2 after two, 3 after four, n after 2^(n-1).
    """
    if interval_ms <= 0 or waited_ms < interval_ms:
        return None
    return (waited_ms // interval_ms).bit_length()


def reminder_text(requested_at_ms: int, now_ms: int, text: str) -> str:
    """The reminder's words: since when it waits (UTC) and for how long, then the request's."""
    since = datetime.datetime.fromtimestamp(requested_at_ms / 1000, tz=datetime.UTC)
    return (
        f"Still waiting since {since:%Y-%m-%d %H:%M} UTC ({_ago(now_ms - requested_at_ms)}). {text}"
    )


def _ago(ms: int) -> str:
    if ms < 60_000:
        return f"{max(0, ms) // 1000} s"
    minutes = ms // 60_000
    if minutes < 120:
        return f"{minutes} min"
    hours = minutes // 60
    return f"{hours} h" if hours < 48 else f"{hours // 24} days"


async def remind(
    repo: SessionRepo,
    broker: Broker,
    *,
    now_ms: int,
    interval_ms: int,
    max_attempts: int,
) -> list[Outbound]:
    """One sweep over every session: enqueue the reminders due now; returns those enqueued."""
    sent: list[Outbound] = []
    for meta in await repo.list():
        try:
            storage = await repo.open(meta.id)  # read-only: no lease taken
        except SessionError as exc:
            if exc.code == "not_found":
                continue  # deleted since the listing
            raise
        try:
            sent += await _remind_session(
                storage, broker, meta.id, now_ms, interval_ms, max_attempts
            )
        except Exception as exc:  # one session that cannot be read holds back no other
            log.warning(
                event("approval reminders failed", session=meta.id, error=type(exc).__name__)
            )
        finally:
            with contextlib.suppress(Exception):
                await storage.close()
    return sent


async def _remind_session(
    storage: SessionStorage,
    broker: Broker,
    session: str,
    now_ms: int,
    interval_ms: int,
    max_attempts: int,
) -> list[Outbound]:
    sent: list[Outbound] = []
    for started in await storage.find_open_operations(None):
        lane = started.record.lane
        try:
            reminded = await _remind_lane(
                storage, broker, session, lane, now_ms, interval_ms, max_attempts
            )
        except Exception as exc:  # one lane that cannot be read holds back no other
            log.warning(
                event(
                    "approval reminder failed", session=session, lane=lane, error=type(exc).__name__
                )
            )
            continue
        if reminded is not None:
            sent.append(reminded)
    return sent


async def _remind_lane(
    storage: SessionStorage,
    broker: Broker,
    session: str,
    lane: str,
    now_ms: int,
    interval_ms: int,
    max_attempts: int,
) -> Outbound | None:
    """The reminder enqueued for `lane` now, or None (not waiting, not due, or sent before)."""
    seen = await inspect_lane(storage, lane, max_attempts=max_attempts)
    if seen.info.suspended != "approval" or seen.wait_id is None:
        return None
    request = await storage.get_record(seen.wait_id)
    if request is None or not isinstance(request.record, ApprovalRequested):
        return None
    number = due_reminder(now_ms - request.timestamp, interval_ms)
    state = await broker.threads.get(session, lane)
    if number is None or state is None:  # not yet, or a lane no channel answers (ask)
        return None
    thread = ThreadRef.model_validate(dict(state.thread))
    if await revocation_of(broker.marks, session, lane, thread) is not None:
        return None  # nothing more is said where the bot may no longer speak (D267)
    asked = approval_outbound(state, thread, request.record)
    outbound = asked.model_copy(
        update={
            "delivery_id": delivery_id(
                session, "approval_request", f"{request.record.id}:remind-{number}"
            ),
            "text": reminder_text(request.timestamp, now_ms, asked.text),
        }
    )
    payload = outbound.model_dump(mode="json")
    if not await broker.outbox.enqueue(outbound.delivery_id, session, lane, payload, now_ms=now_ms):
        return None
    log.info(
        event(
            "approval reminder", session=session, lane=lane, wait=request.record.id, reminder=number
        )
    )
    return outbound
