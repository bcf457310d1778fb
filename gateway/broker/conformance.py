"""The broker conformance suite: runner-independent checks every broker passes.

A test module builds a `BrokerFixture` (a fresh, empty broker on a `SteppedClock` such as
`harness_core.testing.ManualClock`) and runs each `BrokerCase` with its own fixture (pytest:
parametrize over `broker_cases()`). Each case checks one rule of `gateway.broker.contract`'s
docstrings; a case that fails is the broker's bug (or the contract's, to be fixed there
first). The suite is shipped for plugin authors' tests yet imports no test kit: the clock it
advances comes with the fixture (D182).

Times move only when a case advances the clock. Waits are on that clock: a case that checks a
wait returns early starts it, makes sure it is still waiting after a short real pause, then
causes the wake-up (an append, an enqueue, advancing the clock) and expects the wait to end
within a few real seconds.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from gateway.broker.contract import (
    Audit,
    BlobRefused,
    Blobs,
    Broker,
    ClaimedDelivery,
    Delivery,
    Inbox,
    InboxItem,
    LaneTaken,
    Marks,
    NewAuditEvent,
    NewInboxItem,
    Operated,
    Outbox,
    SessionTicket,
    Threads,
)
from gateway.broker.limits import BlobLimits, blob_id
from harness_core import Clock
from harness_core.frozen import JsonValue, freeze_json

__all__ = ["BrokerCase", "BrokerFixture", "SteppedClock", "broker_cases"]

REAL_TIMEOUT_S = 5.0
"""How long (real seconds) a wake-up may take before a case fails."""
PAUSE_S = 0.05
"""The real pause after which a wait that should still be waiting must not have returned."""
LEASE = 10_000
"""The delivery lease the outbox cases claim with."""


class SteppedClock(Clock, Protocol):
    """A `Clock` whose time moves only when the case says so (its sleepers wake as it passes)."""

    def advance(self, ms: int) -> None:
        """Move time forward by `ms` and wake the sleepers whose deadline has come."""


@dataclass(frozen=True, kw_only=True)
class BrokerFixture:
    """What a case needs from a broker under test."""

    name: str
    broker: Broker
    """A fresh broker with no data, on `clock`."""
    clock: SteppedClock
    """The broker's clock: item times, ticket expiry, dedupe windows and waits."""
    visibility_timeout_ms: int
    """How long a session ticket lasts unless renewed."""
    dedupe_ttl_ms: int
    """How long (at least) a dedupe key is kept after its item was appended."""
    open_another: Callable[[], Awaitable[Broker]]
    """Another broker over the same durable data and clock, as a second process would open it
    (the fixture closes it)."""
    blob_limits: BlobLimits = field(default_factory=BlobLimits)
    """The limits the broker's blob area was opened with (small ones keep the cases quick)."""


@dataclass(frozen=True)
class BrokerCase:
    """One backend-neutral check."""

    group: str
    name: str
    run: Callable[[BrokerFixture], Awaitable[None]]

    @property
    def id(self) -> str:
        """A stable test id."""
        return f"{self.group}:{self.name}"


_CASES: list[BrokerCase] = []
_P = TypeVar("_P")
_T = TypeVar("_T")


def _case(group: str) -> Callable[[Callable[[BrokerFixture], Awaitable[None]]], Any]:
    def register(fn: Callable[[BrokerFixture], Awaitable[None]]) -> Any:
        _CASES.append(BrokerCase(group, fn.__name__, fn))
        return fn

    return register


def _cases(
    group: str, params: Mapping[str, _P]
) -> Callable[[Callable[[BrokerFixture, _P], Awaitable[None]]], Any]:
    """One case per rule: ``name/label`` runs ``fn(fixture, params[label])``."""

    def register(fn: Callable[[BrokerFixture, _P], Awaitable[None]]) -> Any:
        for label, param in params.items():
            _CASES.append(BrokerCase(group, f"{fn.__name__}/{label}", _bind(fn, param)))
        return fn

    return register


def _bind(
    fn: Callable[[BrokerFixture, _P], Awaitable[None]], param: _P
) -> Callable[[BrokerFixture], Awaitable[None]]:
    async def run(fx: BrokerFixture) -> None:
        await fn(fx, param)

    return run


def broker_cases() -> tuple[BrokerCase, ...]:
    """Every conformance case, in a stable order."""
    return tuple(_CASES)


# ---------------------------------------------------------------------------------------------
# helpers


def _new(
    key: str,
    *,
    session: str = "s1",
    lane: str = "web:t1",
    kind: Literal["message", "decision"] = "message",
    text: str = "hello",
) -> NewInboxItem:
    return NewInboxItem(
        session=session, lane=lane, dedupe_key=key, kind=kind, payload={"text": text, "n": 1}
    )


def _same_item(got: InboxItem, want: InboxItem) -> None:
    """`got` is `want` apart from its status and reason."""
    assert got.model_dump(exclude={"status", "reason"}) == want.model_dump(
        exclude={"status", "reason"}
    ), (got, want)


async def _pause() -> None:
    await asyncio.sleep(PAUSE_S)


async def _still_waiting(task: asyncio.Task[Any]) -> None:
    await _pause()
    assert not task.done(), f"returned without a reason to: {task.result()!r}"


async def _soon(task: Awaitable[_T]) -> _T:
    """The awaitable's result, within a few real seconds."""
    return await asyncio.wait_for(task, REAL_TIMEOUT_S)


async def _advance_until_done(
    fx: BrokerFixture, task: asyncio.Task[_T], *, step_ms: int, limit_ms: int
) -> tuple[_T, int]:
    """Advance the clock by `step_ms` at a time until `task` ends; its result and the advance.

    Fails if it has not ended after `limit_ms` of clock time (and a real pause per step).
    """
    advanced = 0
    while not task.done():
        if advanced >= limit_ms:
            task.cancel()
            raise AssertionError(f"still waiting after the clock advanced {advanced} ms")
        fx.clock.advance(step_ms)
        advanced += step_ms
        await asyncio.wait({task}, timeout=0.02)
    return task.result(), advanced


async def _claim_one(outbox: Outbox, now_ms: int, *, lease_ms: int = LEASE) -> ClaimedDelivery:
    claimed = await outbox.claim("d1", now_ms=now_ms, limit=1, lease_ms=lease_ms)
    assert len(claimed) == 1, claimed
    return claimed[0]


def _changed(operated: Operated | None) -> Delivery:
    """The delivery an operator's call changed (it must have)."""
    assert operated is not None, "no such delivery"
    assert operated.changed, operated.delivery
    return operated.delivery


def _unchanged(operated: Operated | None) -> Delivery:
    """The delivery an operator's call left as it was (it must have)."""
    assert operated is not None, "no such delivery"
    assert not operated.changed, operated.delivery
    return operated.delivery


async def _one_pending(fx: BrokerFixture, delivery_id: str = "reply:r1") -> ClaimedDelivery:
    """Enqueue a delivery now and claim it."""
    now = fx.clock.now_ms()
    assert await fx.broker.outbox.enqueue(delivery_id, "s1", "web:t1", {"text": "hi"}, now_ms=now)
    return await _claim_one(fx.broker.outbox, now)


# ---------------------------------------------------------------------------------------------
# the broker


@_case("broker")
async def parts_meet_their_protocols_and_close_is_idempotent(fx: BrokerFixture) -> None:
    b = fx.broker
    assert isinstance(b, Broker)
    assert isinstance(b.inbox, Inbox)
    assert isinstance(b.outbox, Outbox)
    assert isinstance(b.threads, Threads)
    assert isinstance(b.audit, Audit)
    assert isinstance(b.marks, Marks)
    assert isinstance(b.blobs, Blobs)
    await b.close()
    await b.close()


# ---------------------------------------------------------------------------------------------
# inbox: append, dedupe, pending, ack, reject, backlog


@_case("inbox")
async def append_returns_the_item_and_holds_it_durably(fx: BrokerFixture) -> None:
    new = _new("slack:Ev1", kind="decision")
    appended = await fx.broker.inbox.append(new)
    item = appended.item
    assert appended.duplicate is False
    assert (item.session, item.lane, item.dedupe_key, item.kind) == (
        "s1",
        "web:t1",
        "slack:Ev1",
        "decision",
    )
    assert item.payload == {"text": "hello", "n": 1}
    assert item.appended_at_ms == fx.clock.now_ms()
    assert (item.status, item.reason) == ("pending", None)
    assert item.id
    await fx.broker.close()
    other = await fx.open_another()
    assert await other.inbox.pending("s1") == (item,)


@_cases("inbox", {"pending": "pending", "acked": "acked", "rejected": "rejected"})
async def a_duplicate_returns_the_existing_item_and_changes_nothing(
    fx: BrokerFixture, state: str
) -> None:
    inbox = fx.broker.inbox
    first = (await inbox.append(_new("k1", text="first"))).item
    if state == "acked":
        await inbox.ack("s1", first.id)
    elif state == "rejected":
        await inbox.reject("s1", first.id, "unroutable")
    fx.clock.advance(1)
    before = (await inbox.backlog(), await inbox.pending("s1"))
    again = await inbox.append(_new("k1", lane="web:t2", text="second"))
    assert again.duplicate is True
    _same_item(again.item, first)
    assert again.item.status == state
    assert again.item.reason == ("unroutable" if state == "rejected" else None)
    assert (await inbox.backlog(), await inbox.pending("s1")) == before
    if state != "pending":  # a duplicate does not make a session ready again
        assert await inbox.take_session("w1") is None


@_case("inbox")
async def dedupe_keys_are_kept_for_the_whole_window(fx: BrokerFixture) -> None:
    inbox = fx.broker.inbox
    first = (await inbox.append(_new("k1"))).item
    await inbox.ack("s1", first.id)
    fx.clock.advance(fx.dedupe_ttl_ms - 1)
    again = await inbox.append(_new("k1"))
    assert again.duplicate is True
    assert again.item.id == first.id
    assert again.item.status == "acked"


@_case("inbox")
async def pending_lists_a_sessions_items_in_append_order(fx: BrokerFixture) -> None:
    inbox = fx.broker.inbox
    items = []
    for n in range(12):  # more than 10: ids sort as strings too
        items.append((await inbox.append(_new(f"k{n}", lane=f"web:t{n % 3}"))).item)
        if n == 5:
            await inbox.append(_new("other", session="s2"))
    assert [i.id for i in items] == sorted(i.id for i in items)
    assert len({i.id for i in items}) == 12
    assert await inbox.pending("s1") == tuple(items)
    assert await inbox.pending("s1", limit=5) == tuple(items[:5])
    await inbox.ack("s1", items[0].id)
    await inbox.reject("s1", items[3].id, "bad")
    assert await inbox.pending("s1", limit=3) == (items[1], items[2], items[4])
    assert [i.dedupe_key for i in await inbox.pending("s2")] == ["other"]
    assert await inbox.pending("nobody") == ()
    # a page after another: from the item after `after`, settled ones skipped
    assert await inbox.pending("s1", limit=3, after=items[2].id) == (
        items[4],
        items[5],
        items[6],
    )
    assert await inbox.pending("s1", after=items[0].id) == await inbox.pending("s1")  # acked
    assert await inbox.pending("s1", after=items[11].id) == ()
    assert await inbox.pending("s1", limit=2, after="not-an-id") == (items[1], items[2])


@_case("inbox")
async def ack_settles_once_and_ignores_unknown_ids(fx: BrokerFixture) -> None:
    inbox = fx.broker.inbox
    a = (await inbox.append(_new("a"))).item
    b = (await inbox.append(_new("b"))).item
    await inbox.ack("s1", a.id)
    await inbox.ack("s1", a.id)
    await inbox.ack("s1", "no-such-id")
    await inbox.ack("s2", b.id)  # not an item of s2: ignored
    assert await inbox.pending("s1") == (b,)
    await inbox.reject("s1", a.id, "too late")  # settled already: the ack stays
    dup = await inbox.append(_new("a"))
    assert (dup.item.status, dup.item.reason) == ("acked", None)
    assert (await inbox.backlog()).dead == 0


@_case("inbox")
async def reject_keeps_the_reason_and_counts_in_the_backlog(fx: BrokerFixture) -> None:
    inbox = fx.broker.inbox
    a = (await inbox.append(_new("a"))).item
    b = (await inbox.append(_new("b"))).item
    await inbox.reject("s1", a.id, "malformed: no text")
    await inbox.reject("s1", a.id, "another reason")  # the first settlement stays
    await inbox.ack("s1", a.id)
    await inbox.reject("s1", "no-such-id", "x")
    assert await inbox.pending("s1") == (b,)
    backlog = await inbox.backlog()
    assert (backlog.pending, backlog.dead) == (1, 1)
    dup = await inbox.append(_new("a"))
    assert (dup.item.status, dup.item.reason) == ("rejected", "malformed: no text")
    await fx.broker.close()
    other = await fx.open_another()
    assert (await other.inbox.backlog()).dead == 1


@_case("inbox")
async def backlog_counts_pending_items_and_the_oldest_age(fx: BrokerFixture) -> None:
    inbox = fx.broker.inbox
    empty = await inbox.backlog()
    assert (empty.pending, empty.oldest_age_ms, empty.dead) == (0, 0, 0)
    first = (await inbox.append(_new("a"))).item
    fx.clock.advance(700)
    await inbox.append(_new("b", session="s2"))
    fx.clock.advance(300)
    backlog = await inbox.backlog()
    assert (backlog.pending, backlog.oldest_age_ms) == (2, 1000)
    await inbox.ack("s1", first.id)
    backlog = await inbox.backlog()
    assert (backlog.pending, backlog.oldest_age_ms) == (1, 300)


# ---------------------------------------------------------------------------------------------
# inbox: sessions handed to workers


@_case("sessions")
async def take_session_hands_out_a_session_with_pending_items(fx: BrokerFixture) -> None:
    inbox = fx.broker.inbox
    assert await inbox.take_session("w1") is None
    item = (await inbox.append(_new("a"))).item
    ticket = await inbox.take_session("w1")
    assert ticket is not None
    assert ticket.session == "s1"
    assert ticket.ticket
    await inbox.done(ticket)
    await inbox.ack("s1", item.id)  # settled without a worker holding the session
    assert await inbox.take_session("w1") is None


@_case("sessions")
async def a_session_goes_to_one_worker_at_a_time(fx: BrokerFixture) -> None:
    inbox = fx.broker.inbox
    await inbox.append(_new("a"))
    first = await inbox.take_session("w1")
    assert first is not None
    assert first.session == "s1"
    assert await inbox.take_session("w2") is None
    await inbox.append(_new("b"))  # more work for a held session: still held
    assert await inbox.take_session("w2") is None
    await inbox.append(_new("c", session="s2"))
    second = await inbox.take_session("w2")
    assert second is not None
    assert second.session == "s2"
    assert await inbox.take_session("w3") is None


@_case("sessions")
async def a_ticket_not_done_within_the_visibility_timeout_is_handed_out_again(
    fx: BrokerFixture,
) -> None:
    inbox = fx.broker.inbox
    await inbox.append(_new("a"))
    first = await inbox.take_session("w1")
    assert first is not None
    fx.clock.advance(fx.visibility_timeout_ms - 1)
    assert await inbox.take_session("w2") is None
    fx.clock.advance(2)
    second = await inbox.take_session("w2")
    assert second is not None
    assert second.session == "s1"
    assert second.ticket != first.ticket
    assert await inbox.renew(first) is False  # the dead worker's ticket is no longer the session's
    await inbox.done(first)  # ... and cannot release the new holder
    assert await inbox.take_session("w3") is None


@_case("sessions")
async def a_lapsed_ticket_hands_the_session_out_again_with_nothing_pending(
    fx: BrokerFixture,
) -> None:
    inbox = fx.broker.inbox
    item = (await inbox.append(_new("a"))).item
    first = await inbox.take_session("w1")
    assert first is not None
    await inbox.ack("s1", item.id)  # accepted; then the worker dies mid-operation
    fx.clock.advance(fx.visibility_timeout_ms + 1)
    second = await inbox.take_session("w2")
    assert second is not None
    assert second.session == "s1"
    await inbox.done(second)
    assert await inbox.take_session("w3") is None


@_case("sessions")
async def done_with_again_in_ms_hands_the_session_out_again_later(fx: BrokerFixture) -> None:
    inbox = fx.broker.inbox
    item = (await inbox.append(_new("a"))).item
    first = await inbox.take_session("w1")
    assert first is not None
    await inbox.ack("s1", item.id)
    await inbox.done(first, again_in_ms=1_000)
    assert await inbox.renew(first) is False
    assert await inbox.take_session("w2") is None
    fx.clock.advance(1_000)
    second = await inbox.take_session("w2")
    assert second is not None
    assert second.session == "s1"
    await inbox.done(first, again_in_ms=0)  # the old ticket changes nothing
    assert await inbox.take_session("w3") is None
    await inbox.done(second, again_in_ms=0)
    third = await inbox.take_session("w3")
    assert third is not None
    assert third.session == "s1"
    await inbox.done(third)
    assert await inbox.take_session("w4") is None


@_case("sessions")
async def renew_keeps_the_session_for_another_timeout(fx: BrokerFixture) -> None:
    inbox = fx.broker.inbox
    await inbox.append(_new("a"))
    ticket = await inbox.take_session("w1")
    assert ticket is not None
    for _ in range(3):
        fx.clock.advance(fx.visibility_timeout_ms - 1)
        assert await inbox.renew(ticket) is True
        assert await inbox.take_session("w2") is None
    fx.clock.advance(fx.visibility_timeout_ms + 1)
    assert await inbox.take_session("w2") is not None


@_case("sessions")
async def renew_after_done_is_refused(fx: BrokerFixture) -> None:
    inbox = fx.broker.inbox
    await inbox.append(_new("a"))
    ticket = await inbox.take_session("w1")
    assert ticket is not None
    await inbox.done(ticket)
    assert await inbox.renew(ticket) is False
    again = await inbox.take_session("w2")  # still pending: ready again, and renew took nothing
    assert again is not None
    assert again.ticket != ticket.ticket


@_cases(
    "sessions",
    {"unacked": "unacked", "all_acked": "all_acked", "arrived_meanwhile": "arrived_meanwhile"},
)
async def done_makes_a_session_with_pending_items_ready_again(fx: BrokerFixture, how: str) -> None:
    inbox = fx.broker.inbox
    item = (await inbox.append(_new("a"))).item
    ticket = await inbox.take_session("w1")
    assert ticket is not None
    if how != "unacked":
        await inbox.ack("s1", item.id)
    if how == "arrived_meanwhile":
        await inbox.append(_new("b"))
    await inbox.done(ticket)
    again = await inbox.take_session("w2")
    if how == "all_acked":
        assert again is None
    else:
        assert again is not None
        assert again.session == "s1"


@_case("sessions")
async def done_is_idempotent(fx: BrokerFixture) -> None:
    inbox = fx.broker.inbox
    await inbox.append(_new("a"))
    first = await inbox.take_session("w1")
    assert first is not None
    await inbox.done(first)
    second = await inbox.take_session("w2")
    assert second is not None
    await inbox.done(first)  # a repeat does not release the new holder
    assert await inbox.take_session("w3") is None
    await inbox.done(second)
    await inbox.done(second)
    third = await inbox.take_session("w3")
    assert third is not None
    assert await inbox.take_session("w4") is None


@_case("sessions")
async def take_session_waits_up_to_wait_ms_then_returns_none(fx: BrokerFixture) -> None:
    task = asyncio.ensure_future(fx.broker.inbox.take_session("w1", wait_ms=2_000))
    await _still_waiting(task)
    result, _ = await _advance_until_done(fx, task, step_ms=250, limit_ms=3_000)
    assert result is None


@_case("sessions")
async def take_session_wakes_early_on_append(fx: BrokerFixture) -> None:
    task = asyncio.ensure_future(fx.broker.inbox.take_session("w1", wait_ms=60_000))
    await _still_waiting(task)
    await fx.broker.inbox.append(_new("a", session="s7"))
    ticket = await _soon(task)
    assert ticket is not None
    assert ticket.session == "s7"


@_case("sessions")
async def take_session_wakes_early_when_done_readies_a_session(fx: BrokerFixture) -> None:
    inbox = fx.broker.inbox
    await inbox.append(_new("a"))
    held = await inbox.take_session("w1")
    assert held is not None
    task = asyncio.ensure_future(inbox.take_session("w2", wait_ms=60_000))
    await _still_waiting(task)
    await inbox.done(held)  # the item is still pending
    ticket = await _soon(task)
    assert ticket is not None
    assert ticket.session == "s1"


@_case("sessions")
async def take_session_wakes_when_a_ticket_expires(fx: BrokerFixture) -> None:
    inbox = fx.broker.inbox
    await inbox.append(_new("a"))
    assert await inbox.take_session("w1") is not None
    limit = 2 * fx.visibility_timeout_ms
    task = asyncio.ensure_future(inbox.take_session("w2", wait_ms=limit))
    await _still_waiting(task)
    step = max(1, fx.visibility_timeout_ms // 8)
    ticket, _ = await _advance_until_done(fx, task, step_ms=step, limit_ms=limit)
    assert ticket is not None
    assert ticket.session == "s1"


@_case("sessions")
async def held_lists_live_tickets_by_session_with_their_worker_and_expiry(
    fx: BrokerFixture,
) -> None:
    inbox = fx.broker.inbox
    assert await inbox.held() == ()
    for n, session in enumerate(("s2", "s1", "s3", "s4")):
        await inbox.append(_new(f"k{n}", session=session))
    taken = {}
    for worker in ("w1", "w2", "w1", "w3"):
        ticket = await inbox.take_session(worker)
        assert ticket is not None
        taken[ticket.session] = (worker, ticket)
    began = fx.clock.now_ms()
    await inbox.done(taken["s3"][1])  # through with it: not held
    await inbox.done(taken["s4"][1], again_in_ms=5_000)  # deferred: held by nobody
    held = await inbox.held()
    assert [(h.session, h.worker) for h in held] == [
        (s, taken[s][0]) for s in sorted(taken) if s not in ("s3", "s4")
    ]
    assert {h.expires_at_ms for h in held} == {began + fx.visibility_timeout_ms}
    fx.clock.advance(fx.visibility_timeout_ms + 1)  # lapsed: not held
    assert await (await fx.open_another()).inbox.held() == ()


@_cases("sessions", {"pending": True, "nothing_pending": False})
async def release_hands_a_workers_sessions_to_the_next_take_at_once(
    fx: BrokerFixture, pending: bool
) -> None:
    inbox = fx.broker.inbox
    items = [(await inbox.append(_new(f"k{n}", session=f"s{n}"))).item for n in range(3)]
    mine = [await inbox.take_session("gone"), await inbox.take_session("gone")]
    other = await inbox.take_session("alive")
    assert other is not None
    assert all(t is not None for t in mine)
    if not pending:  # accepted; then the worker is cut mid-operation (work is left)
        for item in items:
            await inbox.ack(item.session, item.id)
    another = await fx.open_another()  # the next process
    assert await another.inbox.take_session("next") is None
    released = await another.inbox.release("gone")
    assert released == tuple(sorted(t.session for t in mine if t is not None))
    assert await another.inbox.release("gone") == ()  # idempotent
    assert await another.inbox.release("nobody") == ()
    again = [await another.inbox.take_session("next") for _ in range(3)]
    assert sorted(t.session for t in again if t is not None) == list(released)
    assert again[-1] is None  # the other worker's session stays its own
    for ticket in mine:
        assert ticket is not None
        assert await inbox.renew(ticket) is False  # the released tickets are no longer theirs
        await inbox.done(ticket)  # ... and cannot release the next holder
    assert await inbox.renew(other) is True
    assert sorted(h.worker for h in await inbox.held()) == ["alive", "next", "next"]


@_case("sessions")
async def release_wakes_a_waiting_take(fx: BrokerFixture) -> None:
    inbox = fx.broker.inbox
    item = (await inbox.append(_new("a"))).item
    assert await inbox.take_session("gone") is not None
    await inbox.ack("s1", item.id)
    task = asyncio.ensure_future(inbox.take_session("next", wait_ms=60_000))
    await _still_waiting(task)
    assert await inbox.release("gone") == ("s1",)
    ticket = await _soon(task)
    assert ticket is not None
    assert ticket.session == "s1"


@_case("sessions")
async def workers_taking_concurrently_never_share_a_session(fx: BrokerFixture) -> None:
    sessions = [f"s{n}" for n in range(16)]
    for n, session in enumerate(sessions):
        await fx.broker.inbox.append(_new(f"k{n}", session=session))
    brokers = [fx.broker, await fx.open_another()]
    taken: list[str] = []

    async def worker(name: str, broker: Broker) -> None:
        while (ticket := await broker.inbox.take_session(name)) is not None:
            taken.append(ticket.session)
            await asyncio.sleep(0)

    await asyncio.gather(*(worker(f"w{n}", brokers[n % 2]) for n in range(8)))
    assert sorted(taken) == sorted(sessions), Counter(taken)


async def _cancelled_take(inbox: Inbox, turn: int) -> SessionTicket | None:
    """A take cancelled after `turn` yields; what it returned if that came before the cancel."""
    take = asyncio.ensure_future(inbox.take_session("w1", wait_ms=60_000))
    for _ in range(turn):  # the cancellation lands a little later into the take each turn
        await asyncio.sleep(0)
    take.cancel()
    done, _ = await asyncio.wait({take}, timeout=REAL_TIMEOUT_S)
    assert done, "a cancelled take did not end"
    return None if take.cancelled() else take.result()


@_case("sessions")
async def a_cancelled_take_hands_out_nothing(fx: BrokerFixture) -> None:
    """Cancelled at any point of its work, a take leaves the session ready for the next one."""
    inbox = fx.broker.inbox
    for turn in range(24):
        session = f"c{turn}"
        await inbox.append(_new(f"k{turn}", session=session))
        if (ticket := await _cancelled_take(inbox, turn)) is not None:
            await inbox.done(ticket)  # it returned before the cancellation: a ticket as any
        again = await inbox.take_session("w2")
        assert again is not None, f"turn {turn}: the session stayed taken"
        assert again.session == session
        await inbox.done(again)
        for item in await inbox.pending(session):
            await inbox.ack(session, item.id)


@_case("sessions")
async def a_cancelled_take_of_a_lapsed_ticket_leaves_it_for_the_next_take(
    fx: BrokerFixture,
) -> None:
    """A take cancelled as it took a lapsed ticket leaves the session for the next take.

    A dead worker's session with nothing pending (its operation is open) is handed out once its
    ticket lapses; a take cancelled then must not end it as if it was served.
    """
    inbox = fx.broker.inbox
    handed_back = 0
    for turn in range(24):
        session = f"c{turn}"
        item = (await inbox.append(_new(f"k{turn}", session=session))).item
        first = await inbox.take_session("dead")
        assert first is not None
        await inbox.ack(session, item.id)  # accepted into its lane; then the worker died
        fx.clock.advance(fx.visibility_timeout_ms + 1)
        if (ticket := await _cancelled_take(inbox, turn)) is not None:
            await inbox.done(ticket)  # it returned before the cancellation: served, through
            continue
        handed_back += 1
        again = await inbox.take_session("w2")
        assert again is not None, f"turn {turn}: the lapsed session was dropped"
        assert again.session == session
        await inbox.done(again)
    assert handed_back > 0


@_case("news")
async def wait_returns_when_an_item_is_appended_to_the_held_session(fx: BrokerFixture) -> None:
    inbox = fx.broker.inbox
    await inbox.append(_new("a"))
    ticket = await inbox.take_session("w1")
    assert ticket is not None
    since = await inbox.position()
    assert [i.dedupe_key for i in await inbox.pending("s1")] == ["a"]
    task = asyncio.ensure_future(inbox.wait("s1", since=since, timeout_ms=60_000))
    await _still_waiting(task)
    await inbox.append(_new("b", session="s2"))  # another session's news is not this one's
    await _still_waiting(task)
    await inbox.append(_new("c"))
    assert await _soon(task) is True
    assert [i.dedupe_key for i in await inbox.pending("s1")] == ["a", "c"]


@_case("news")
async def an_append_between_position_and_wait_is_not_missed(fx: BrokerFixture) -> None:
    inbox = fx.broker.inbox
    await inbox.append(_new("a"))
    ticket = await inbox.take_session("w1")
    assert ticket is not None
    since = await inbox.position()
    await inbox.append(_new("b"))
    assert await _soon(inbox.wait("s1", since=since, timeout_ms=60_000)) is True


@_case("news")
async def an_append_through_another_broker_is_news_too(fx: BrokerFixture) -> None:
    inbox = fx.broker.inbox
    await inbox.append(_new("a"))
    ticket = await inbox.take_session("w1")
    assert ticket is not None
    since = await inbox.position()
    task = asyncio.ensure_future(inbox.wait("s1", since=since, timeout_ms=600_000))
    await _still_waiting(task)
    await (await fx.open_another()).inbox.append(_new("b"))
    woke, _ = await _advance_until_done(fx, task, step_ms=250, limit_ms=60_000)
    assert woke is True


@_case("news")
async def wait_returns_false_after_a_timeout_without_news(fx: BrokerFixture) -> None:
    """Within the broker's poll interval (a second or more) a wait without news says so."""
    inbox = fx.broker.inbox
    await inbox.append(_new("a"))
    assert await inbox.take_session("w1") is not None
    since = await inbox.position()
    task = asyncio.ensure_future(inbox.wait("s1", since=since, timeout_ms=500))
    await _still_waiting(task)
    woke, advanced = await _advance_until_done(fx, task, step_ms=100, limit_ms=1_000)
    assert woke is False
    assert advanced >= 500


@_cases("news", {"lapsed_and_taken": "lapsed", "released": "released"})
async def wait_returns_when_the_sessions_ticket_changes_hands(fx: BrokerFixture, how: str) -> None:
    inbox = fx.broker.inbox
    item = (await inbox.append(_new("a"))).item
    ticket = await inbox.take_session("w1")
    assert ticket is not None
    await inbox.ack("s1", item.id)  # nothing pending: only the ticket can be news
    since = await inbox.position()
    task = asyncio.ensure_future(
        inbox.wait("s1", since=since, timeout_ms=10 * fx.visibility_timeout_ms)
    )
    await _still_waiting(task)
    another = await fx.open_another()
    if how == "lapsed":
        fx.clock.advance(fx.visibility_timeout_ms + 1)
        taken = await another.inbox.take_session("w2")
        assert taken is not None
        assert taken.session == "s1"
    else:
        assert await another.inbox.release("w1") == ("s1",)
    woke, _ = await _advance_until_done(fx, task, step_ms=250, limit_ms=60_000)
    assert woke is True
    assert await inbox.renew(ticket) is False


# ---------------------------------------------------------------------------------------------
# outbox


@_case("outbox")
async def enqueue_holds_a_pending_delivery_due_now(fx: BrokerFixture) -> None:
    now = fx.clock.now_ms() - 5  # the caller's time decides
    outbound: dict[str, JsonValue] = {"text": "the answer", "parts": [1, 2]}
    assert await fx.broker.outbox.enqueue("reply:r1", "s1", "web:t1", outbound, now_ms=now)
    delivery = await fx.broker.outbox.get("reply:r1")
    assert delivery is not None
    assert (delivery.id, delivery.session, delivery.lane) == ("reply:r1", "s1", "web:t1")
    assert delivery.outbound == freeze_json(outbound)
    assert (delivery.status, delivery.attempts, delivery.due_at_ms) == ("pending", 0, now)
    assert (delivery.unknown_outcome, delivery.last_error) == (False, None)
    assert (delivery.created_at_ms, delivery.settled_at_ms) == (now, None)
    assert await fx.broker.outbox.get("reply:nope") is None
    await fx.broker.close()
    other = await fx.open_another()
    assert await other.outbox.get("reply:r1") == delivery


@_case("outbox")
async def enqueue_is_idempotent_by_id(fx: BrokerFixture) -> None:
    outbox = fx.broker.outbox
    now = fx.clock.now_ms()
    assert await outbox.enqueue("reply:r1", "s1", "web:t1", {"text": "a"}, now_ms=now) is True
    before = await outbox.get("reply:r1")
    again = await outbox.enqueue("reply:r1", "s2", "web:t9", {"text": "b"}, now_ms=now + 50)
    assert again is False
    assert await outbox.get("reply:r1") == before
    claimed = await _claim_one(outbox, now)
    assert await outbox.settle_delivered(claimed, now_ms=now + 1)
    delivered = await outbox.get("reply:r1")
    assert await outbox.enqueue("reply:r1", "s1", "web:t1", {"text": "a"}, now_ms=now) is False
    assert await outbox.get("reply:r1") == delivered


@_case("outbox")
async def claim_leases_due_deliveries_oldest_due_first(fx: BrokerFixture) -> None:
    outbox = fx.broker.outbox
    t = fx.clock.now_ms()
    for delivery_id, due in (("a", t + 300), ("b", t + 100), ("c", t + 200), ("d", t + 900)):
        assert await outbox.enqueue(delivery_id, "s1", "web:t1", {"n": due}, now_ms=due)
    assert await outbox.claim("d1", now_ms=t + 50, limit=10, lease_ms=LEASE) == ()
    first = await outbox.claim("d1", now_ms=t + 500, limit=2, lease_ms=LEASE)
    assert [c.delivery.id for c in first] == ["b", "c"]
    rest = await outbox.claim("d2", now_ms=t + 500, limit=10, lease_ms=LEASE)
    assert [c.delivery.id for c in rest] == ["a"]  # "d" is not due; b and c are leased
    assert await outbox.claim("d3", now_ms=t + 500, limit=0, lease_ms=LEASE) == ()


@_case("outbox")
async def claim_counts_attempts_and_leases_until_the_lease_lapses(fx: BrokerFixture) -> None:
    outbox = fx.broker.outbox
    now = fx.clock.now_ms()
    await outbox.enqueue("reply:r1", "s1", "web:t1", {"text": "hi"}, now_ms=now)
    first = await _claim_one(outbox, now)
    assert first.delivery.attempts == 1
    assert first.delivery.status == "pending"
    assert first.lease_expires_at_ms == now + LEASE
    assert first.token
    got = await outbox.get("reply:r1")
    assert got is not None
    assert got.attempts == 1
    assert await outbox.claim("d2", now_ms=now + LEASE - 1, limit=5, lease_ms=LEASE) == ()
    second = await outbox.claim("d2", now_ms=now + LEASE + 1, limit=5, lease_ms=LEASE)
    assert len(second) == 1
    assert second[0].delivery.attempts == 2  # the lapsed claim still counted
    assert second[0].token != first.token
    assert second[0].lease_expires_at_ms == now + 2 * LEASE + 1


@_case("outbox")
async def a_claim_that_takes_over_a_lapsed_lease_marks_the_outcome_unknown(
    fx: BrokerFixture,
) -> None:
    outbox = fx.broker.outbox
    now = fx.clock.now_ms()
    await outbox.enqueue("reply:r1", "s1", "web:t1", {"text": "hi"}, now_ms=now)
    first = await _claim_one(outbox, now)
    assert first.delivery.unknown_outcome is False
    [second] = await outbox.claim("d2", now_ms=now + LEASE + 1, limit=5, lease_ms=LEASE)
    assert second.delivery.unknown_outcome is True  # the lapsed attempt may have sent it
    await outbox.settle_retry(
        second, due_at_ms=now + LEASE + 2, reason="boom", unknown_outcome=False, now_ms=now
    )
    [third] = await outbox.claim("d3", now_ms=now + LEASE + 2, limit=5, lease_ms=LEASE)
    assert third.delivery.unknown_outcome is False  # a settled failure is known


@_case("outbox")
async def a_gone_worker_s_leases_are_released_at_once_and_no_other(fx: BrokerFixture) -> None:
    """A process known to be gone (D159) held deliveries in flight.

    Released, they are taken at once, their outcome unknown, where they waited out the whole
    lease (D397).
    """
    outbox = fx.broker.outbox
    now = fx.clock.now_ms()
    for n in (1, 2, 3):
        await outbox.enqueue(f"reply:r{n}", "s1", f"web:t{n}", {"text": "hi"}, now_ms=now)
    gone = await outbox.claim("gone", now_ms=now, limit=2, lease_ms=LEASE)
    [alive] = await outbox.claim("alive", now_ms=now, limit=5, lease_ms=LEASE)
    assert await outbox.holders(now_ms=now + 1) == ("alive", "gone")
    released = await outbox.release("gone", now_ms=now + 1)
    assert sorted(released) == sorted(c.delivery.id for c in gone)
    assert await outbox.release("gone", now_ms=now + 1) == ()  # nothing live is left to it
    assert await outbox.holders(now_ms=now + 1) == ("alive",)
    taken = await outbox.claim("next", now_ms=now + 2, limit=5, lease_ms=LEASE)
    assert sorted(c.delivery.id for c in taken) == sorted(released)  # not the live one
    assert all(c.delivery.unknown_outcome and c.delivery.attempts == 2 for c in taken)
    assert await outbox.settle_delivered(alive, now_ms=now + 3) is True  # untouched
    for claimed in gone:  # the gone process's claims can settle nothing now
        assert await outbox.settle_delivered(claimed, now_ms=now + 3) is False
    assert await outbox.release("alive", now_ms=now + 4) == ()  # settled: not live


@_case("outbox")
async def settle_delivered_ends_a_delivery(fx: BrokerFixture) -> None:
    claimed = await _one_pending(fx)
    now = fx.clock.now_ms()
    assert await fx.broker.outbox.settle_delivered(claimed, now_ms=now + 7) is True
    delivery = await fx.broker.outbox.get("reply:r1")
    assert delivery is not None
    assert (delivery.status, delivery.settled_at_ms, delivery.attempts) == ("delivered", now + 7, 1)
    later = now + 10 * LEASE
    assert await fx.broker.outbox.claim("d2", now_ms=later, limit=5, lease_ms=LEASE) == ()
    assert await fx.broker.outbox.settle_delivered(claimed, now_ms=now + 8) is False
    assert (await fx.broker.outbox.get("reply:r1")) == delivery


@_case("outbox")
async def settle_retry_sets_the_due_time_the_reason_and_unknown_outcome(
    fx: BrokerFixture,
) -> None:
    outbox = fx.broker.outbox
    claimed = await _one_pending(fx)
    now = fx.clock.now_ms()
    assert await outbox.settle_retry(
        claimed, due_at_ms=now + 2_000, reason="TimeoutError", unknown_outcome=True, now_ms=now
    )
    delivery = await outbox.get("reply:r1")
    assert delivery is not None
    assert (delivery.status, delivery.due_at_ms) == ("pending", now + 2_000)
    assert (delivery.unknown_outcome, delivery.last_error) == (True, "TimeoutError")
    assert delivery.settled_at_ms is None
    assert await outbox.claim("d1", now_ms=now + 1_999, limit=5, lease_ms=LEASE) == ()
    again = await _claim_one(outbox, now + 2_000)  # due again, though the old lease had time left
    assert again.delivery.attempts == 2
    assert again.delivery.unknown_outcome is True
    assert await outbox.settle_retry(
        again, due_at_ms=now + 6_000, reason="HTTP 503", unknown_outcome=False, now_ms=now
    )
    delivery = await outbox.get("reply:r1")
    assert delivery is not None
    assert (delivery.unknown_outcome, delivery.last_error) == (False, "HTTP 503")


@_case("outbox")
async def settle_dead_keeps_a_dead_letter_with_its_reason(fx: BrokerFixture) -> None:
    outbox = fx.broker.outbox
    claimed = await _one_pending(fx)
    now = fx.clock.now_ms()
    assert await outbox.settle_dead(claimed, reason="channel_not_found", now_ms=now + 3) is True
    dead = await outbox.list("dead")
    assert [d.id for d in dead] == ["reply:r1"]
    assert (dead[0].status, dead[0].last_error, dead[0].settled_at_ms) == (
        "dead",
        "channel_not_found",
        now + 3,
    )
    assert await outbox.list("pending") == ()
    assert (await outbox.backlog(now_ms=now)).dead == 1
    later = now + 10 * LEASE
    assert await outbox.claim("d2", now_ms=later, limit=5, lease_ms=LEASE) == ()
    await fx.broker.close()
    other = await fx.open_another()
    assert await other.outbox.list("dead") == dead


_SETTLES: dict[str, Callable[[Outbox, ClaimedDelivery, int], Awaitable[bool]]] = {
    "delivered": lambda o, c, now: o.settle_delivered(c, now_ms=now),
    "retry": lambda o, c, now: o.settle_retry(
        c, due_at_ms=now + 1, reason="x", unknown_outcome=False, now_ms=now
    ),
    "dead": lambda o, c, now: o.settle_dead(c, reason="x", now_ms=now),
}


@_cases("outbox", _SETTLES)
async def a_superseded_claim_cannot_settle(
    fx: BrokerFixture, settle: Callable[[Outbox, ClaimedDelivery, int], Awaitable[bool]]
) -> None:
    outbox = fx.broker.outbox
    old = await _one_pending(fx)
    now = old.lease_expires_at_ms + 1
    new = await _claim_one(outbox, now)
    before = await outbox.get("reply:r1")
    assert await settle(outbox, old, now) is False
    assert await outbox.get("reply:r1") == before
    assert await settle(outbox, new, now) is True


@_cases("outbox", _SETTLES)
async def a_lapsed_claim_nobody_took_over_still_settles(
    fx: BrokerFixture, settle: Callable[[Outbox, ClaimedDelivery, int], Awaitable[bool]]
) -> None:
    claimed = await _one_pending(fx)
    assert await settle(fx.broker.outbox, claimed, claimed.lease_expires_at_ms + 1) is True


@_case("outbox")
async def redeliver_returns_a_dead_letter_with_a_fresh_attempt_budget(fx: BrokerFixture) -> None:
    outbox = fx.broker.outbox
    claimed = await _one_pending(fx)
    now = fx.clock.now_ms()
    await outbox.settle_dead(claimed, reason="HTTP 500", now_ms=now)
    redelivered = _changed(await outbox.redeliver("reply:r1", now_ms=now + 1_000))
    assert (redelivered.id, redelivered.status, redelivered.attempts) == ("reply:r1", "pending", 0)
    assert (redelivered.due_at_ms, redelivered.settled_at_ms) == (now + 1_000, None)
    assert await outbox.get("reply:r1") == redelivered
    assert await outbox.list("dead") == ()
    # a second operator's redeliver, a moment later: told it changed nothing
    assert _unchanged(await outbox.redeliver("reply:r1", now_ms=now + 1_000)) == redelivered
    again = await _claim_one(outbox, now + 1_000)
    assert again.delivery.attempts == 1
    # not dead: returned unchanged; unknown: None
    assert _unchanged(await outbox.redeliver("reply:r1", now_ms=now + 2_000)) == again.delivery
    assert await outbox.redeliver("reply:nope", now_ms=now) is None


@_case("outbox")
async def discard_gives_up_on_a_dead_or_pending_delivery(fx: BrokerFixture) -> None:
    outbox = fx.broker.outbox
    now = fx.clock.now_ms()
    for delivery_id in ("dead", "pending", "delivered"):
        await outbox.enqueue(delivery_id, "s1", "web:t1", {"id": delivery_id}, now_ms=now)
    claims = {
        c.delivery.id: c for c in await outbox.claim("d1", now_ms=now, limit=3, lease_ms=LEASE)
    }
    await outbox.enqueue("waiting", "s1", "web:t1", {"id": "waiting"}, now_ms=now)
    await outbox.settle_dead(claims["dead"], reason="x", now_ms=now)
    await outbox.settle_delivered(claims["delivered"], now_ms=now)
    await outbox.settle_retry(
        claims["pending"], due_at_ms=now, reason="HTTP 503", unknown_outcome=False, now_ms=now
    )
    for delivery_id in ("dead", "pending", "waiting"):
        discarded = _changed(await outbox.discard(delivery_id, now_ms=now + 5))
        assert (discarded.status, discarded.settled_at_ms) == ("discarded", now + 5)
        assert await outbox.get(delivery_id) == discarded
    delivered = await outbox.get("delivered")
    assert _unchanged(await outbox.discard("delivered", now_ms=now + 5)) == delivered
    assert await outbox.discard("nope", now_ms=now) is None
    # the same discard again, a moment later: it changed nothing
    twice = _unchanged(await outbox.discard("dead", now_ms=now + 6))
    assert twice.settled_at_ms == now + 5
    assert [d.id for d in await outbox.list("discarded")] == ["dead", "pending", "waiting"]
    later = now + 10 * LEASE
    assert await outbox.claim("d2", now_ms=later, limit=5, lease_ms=LEASE) == ()
    backlog = await outbox.backlog(now_ms=later)
    assert (backlog.pending, backlog.dead) == (0, 0)


@_case("outbox")
async def a_delivery_being_sent_is_not_discarded_until_its_attempt_is_settled(
    fx: BrokerFixture,
) -> None:
    """Discarded mid-attempt, a reply reached its thread while the record said "discarded"."""
    outbox = fx.broker.outbox
    claimed = await _one_pending(fx)
    now = fx.clock.now_ms()
    assert _unchanged(await outbox.discard("reply:r1", now_ms=now)).status == "pending"
    assert await outbox.settle_delivered(claimed, now_ms=now + 1) is True  # the send stands
    assert _unchanged(await outbox.discard("reply:r1", now_ms=now + 2)).status == "delivered"
    # a claim that lapsed holds nothing: the discard is taken, and the claim cannot settle
    await outbox.enqueue("reply:r2", "s1", "web:t1", {"id": "r2"}, now_ms=now)
    late = await _claim_one(outbox, now + 3)
    lapsed = _changed(await outbox.discard("reply:r2", now_ms=late.lease_expires_at_ms + 1))
    assert lapsed.status == "discarded"
    assert await outbox.settle_delivered(late, now_ms=late.lease_expires_at_ms + 2) is False
    # the other order: discarded first, nothing is claimed
    await outbox.enqueue("reply:r3", "s1", "web:t1", {"id": "r3"}, now_ms=now)
    _changed(await outbox.discard("reply:r3", now_ms=now + 4))
    later = late.lease_expires_at_ms + 10 * LEASE
    assert await outbox.claim("d2", now_ms=later, limit=5, lease_ms=LEASE) == ()


@_case("outbox")
async def list_orders_one_status_by_id_after_a_cursor(fx: BrokerFixture) -> None:
    outbox = fx.broker.outbox
    now = fx.clock.now_ms()
    ids = ["reply:c", "reply:a", "notice:z", "reply:b", "reply:aa"]
    for delivery_id in ids:
        await outbox.enqueue(delivery_id, "s1", "web:t1", {}, now_ms=now)
    claimed = await outbox.claim("d1", now_ms=now, limit=1, lease_ms=LEASE)
    await outbox.settle_dead(claimed[0], reason="x", now_ms=now)  # ids[?]: the first due
    dead_id = claimed[0].delivery.id
    pending = sorted(i for i in ids if i != dead_id)
    assert [d.id for d in await outbox.list("pending")] == pending
    assert [d.id for d in await outbox.list("pending", limit=2)] == pending[:2]
    assert [d.id for d in await outbox.list("pending", after=pending[1])] == pending[2:]
    assert [d.id for d in await outbox.list("pending", after="reply:ab")] == [
        i for i in pending if i > "reply:ab"
    ]
    assert [d.id for d in await outbox.list("dead")] == [dead_id]
    assert await outbox.list("delivered") == ()


@_case("outbox")
async def backlog_counts_pending_the_oldest_due_age_and_dead_letters(fx: BrokerFixture) -> None:
    outbox = fx.broker.outbox
    t = fx.clock.now_ms()
    empty = await outbox.backlog(now_ms=t)
    assert (empty.pending, empty.oldest_age_ms, empty.dead) == (0, 0, 0)
    await outbox.enqueue("a", "s1", "web:t1", {}, now_ms=t)
    await outbox.enqueue("b", "s1", "web:t1", {}, now_ms=t + 400)
    await outbox.enqueue("c", "s1", "web:t1", {}, now_ms=t + 5_000)  # not due yet at t + 1000
    backlog = await outbox.backlog(now_ms=t + 1_000)
    assert (backlog.pending, backlog.oldest_age_ms, backlog.dead) == (3, 1_000, 0)
    claimed = await _claim_one(outbox, t + 1_000)
    assert claimed.delivery.id == "a"
    await outbox.settle_dead(claimed, reason="x", now_ms=t + 1_000)
    backlog = await outbox.backlog(now_ms=t + 1_000)
    assert (backlog.pending, backlog.oldest_age_ms, backlog.dead) == (2, 600, 1)


@_case("outbox")
async def wait_returns_early_on_enqueue(fx: BrokerFixture) -> None:
    task = asyncio.ensure_future(fx.broker.outbox.wait(60_000))
    await _still_waiting(task)
    await fx.broker.outbox.enqueue("reply:r1", "s1", "web:t1", {}, now_ms=fx.clock.now_ms())
    await _soon(task)


@_case("outbox")
async def wait_returns_at_once_when_a_delivery_is_due_already(fx: BrokerFixture) -> None:
    # the deliverer waits right after a claim that took fewer than it asked for: a delivery
    # enqueued before the wait (after that claim) must not wait for the next bell or timeout
    outbox = fx.broker.outbox
    assert await outbox.claim("d", now_ms=fx.clock.now_ms(), limit=4, lease_ms=30_000) == ()
    await outbox.wait(0)  # what a claim with nothing to take leaves cached is read now
    await outbox.enqueue("reply:r1", "s1", "web:t1", {}, now_ms=fx.clock.now_ms())
    await _soon(outbox.wait(60_000))


@_case("outbox")
async def wait_returns_when_a_retry_comes_due(fx: BrokerFixture) -> None:
    outbox = fx.broker.outbox
    claimed = await _one_pending(fx)
    now = fx.clock.now_ms()
    await outbox.settle_retry(
        claimed, due_at_ms=now + 1_000, reason="x", unknown_outcome=False, now_ms=now
    )
    task = asyncio.ensure_future(outbox.wait(60_000))
    await _still_waiting(task)
    _, advanced = await _advance_until_done(fx, task, step_ms=250, limit_ms=30_000)
    assert advanced >= 1_000


@_case("outbox")
async def wait_returns_after_the_timeout(fx: BrokerFixture) -> None:
    outbox = fx.broker.outbox
    await outbox.enqueue("later", "s1", "web:t1", {}, now_ms=fx.clock.now_ms() + 3_600_000)
    task = asyncio.ensure_future(outbox.wait(2_000))
    await _still_waiting(task)
    await _advance_until_done(fx, task, step_ms=250, limit_ms=3_000)


@_case("outbox")
async def deliverers_claiming_concurrently_never_share_a_delivery(fx: BrokerFixture) -> None:
    now = fx.clock.now_ms()
    ids = [f"reply:{n:02d}" for n in range(40)]
    for delivery_id in ids:
        await fx.broker.outbox.enqueue(delivery_id, "s1", "web:t1", {}, now_ms=now)
    brokers = [fx.broker, await fx.open_another()]
    claimed: list[str] = []

    async def deliverer(name: str, broker: Broker) -> None:
        while batch := await broker.outbox.claim(name, now_ms=now, limit=3, lease_ms=LEASE):
            claimed.extend(c.delivery.id for c in batch)
            await asyncio.sleep(0)

    await asyncio.gather(*(deliverer(f"d{n}", brokers[n % 2]) for n in range(6)))
    assert sorted(claimed) == ids, Counter(claimed)


# ---------------------------------------------------------------------------------------------
# threads


@_case("threads")
async def remember_creates_and_updates_a_lanes_state(fx: BrokerFixture) -> None:
    threads = fx.broker.threads
    assert await threads.get("s1", "web:t1") is None
    thread = {"channel": "web", "space": "home", "thread": "t1"}
    await threads.remember("s1", "web:t1", thread, {"reply_to": "m1"})
    state = await threads.get("s1", "web:t1")
    assert state is not None
    assert (state.session, state.lane, state.thread) == ("s1", "web:t1", thread)
    assert (state.reply_context, state.replied_through) == ({"reply_to": "m1"}, 0)
    await threads.mark_replied("s1", "web:t1", 42)
    await threads.remember("s1", "web:t1", thread, {"reply_to": "m2"})
    state = await threads.get("s1", "web:t1")
    assert state is not None
    assert (state.reply_context, state.replied_through) == ({"reply_to": "m2"}, 42)
    await fx.broker.close()
    other = await fx.open_another()
    assert await other.threads.get("s1", "web:t1") == state


@_case("threads")
async def an_append_with_its_thread_remembers_it_in_the_same_write(fx: BrokerFixture) -> None:
    broker = fx.broker
    thread = {"channel": "web", "space": "home", "thread": "t1"}
    first = await broker.inbox.append(
        _new("k1", lane="web:t1"), thread=thread, reply_context={"reply_to": "m1"}
    )
    state = await broker.threads.get("s1", "web:t1")
    assert state is not None
    assert (state.thread, state.reply_context, state.replied_through) == (
        thread,
        {"reply_to": "m1"},
        0,
    )
    assert [i.id for i in await broker.inbox.pending("s1")] == [first.item.id]
    await broker.threads.mark_replied("s1", "web:t1", 7)
    again = await broker.inbox.append(
        _new("k1", lane="web:t1"), thread=thread, reply_context={"reply_to": "m2"}
    )
    assert again.duplicate
    assert again.item.id == first.item.id
    state = await broker.threads.get("s1", "web:t1")
    assert state is not None  # a duplicate changes nothing: a stranger's mail that reused an
    # id took the thread's replies (D318)
    assert (state.reply_context, state.replied_through) == ({"reply_to": "m1"}, 7)
    await broker.inbox.append(_new("k2", lane="web:t2"), thread={"t": 2})
    other = await broker.threads.get("s1", "web:t2")
    assert other is not None
    assert (other.thread, other.reply_context) == ({"t": 2}, {})
    await broker.inbox.append(_new("k3", lane="web:t3"))  # no thread: none remembered
    assert await broker.threads.get("s1", "web:t3") is None
    assert len(await broker.inbox.pending("s1")) == 3


@_case("threads")
async def a_lane_keeps_the_thread_it_began_with(fx: BrokerFixture) -> None:
    threads = fx.broker.threads
    secure = {"channel": "web", "space": "secure", "thread": "t1"}
    lobby = {"channel": "web", "space": "lobby", "thread": "t1"}
    await threads.remember("s1", "web:t1", secure, {"reply_to": "m1"})
    await threads.remember("s1", "web:t1", lobby, {"reply_to": "m2"})
    state = await threads.get("s1", "web:t1")
    assert state is not None  # its replies and its approvers stay the first space's (D332)
    assert (state.thread, state.reply_context) == (secure, {"reply_to": "m2"})


_SPACES = {"secure first": ("secure", "lobby"), "lobby first": ("lobby", "secure")}


@_cases("threads", _SPACES)
async def an_append_from_another_space_of_a_lane_is_refused(
    fx: BrokerFixture, spaces: tuple[str, str]
) -> None:
    """Two spaces of one session using one thread id: the first to write keeps the lane."""
    broker = fx.broker
    first, second = ({"channel": "web", "space": space, "thread": "t1"} for space in spaces)
    held = await broker.inbox.append(
        _new("k1", lane="web:t1"), thread=first, reply_context={"reply_to": "m1"}
    )
    refused: LaneTaken | None = None
    try:
        await broker.inbox.append(
            _new("k2", lane="web:t1"), thread=second, reply_context={"reply_to": "m2"}
        )
    except LaneTaken as taken:
        refused = taken
    assert refused is not None, "another space's append was held"
    assert refused.space == spaces[0]
    assert [i.id for i in await broker.inbox.pending("s1")] == [held.item.id]  # nothing held
    state = await broker.threads.get("s1", "web:t1")
    assert state is not None
    assert (state.thread, state.reply_context) == (first, {"reply_to": "m1"})
    again = await broker.inbox.append(  # the lane's own space goes on as before
        _new("k3", lane="web:t1"), thread=first, reply_context={"reply_to": "m3"}
    )
    assert not again.duplicate
    assert len(await broker.inbox.pending("s1")) == 2


@_case("inbox")
async def an_append_reads_the_mark_it_is_asked_for_as_of_the_append(fx: BrokerFixture) -> None:
    broker = fx.broker
    first = await broker.inbox.append(_new("k1"), read_mark="m")
    assert first.mark is None  # unset
    assert await broker.marks.put("m", "1", expect=None)
    again = await broker.inbox.append(_new("k1"), read_mark="m")
    assert again.duplicate
    assert again.mark == "1"  # a duplicate's too, as of this call
    other = await fx.open_another()  # another process moved it: read, never remembered
    assert await other.marks.put("m", "2", expect="1")
    assert (await broker.inbox.append(_new("k2"), read_mark="m")).mark == "2"
    assert (await broker.inbox.append(_new("k3"))).mark is None  # none asked for
    assert len(await broker.inbox.pending("s1")) == 3


@_case("threads")
async def list_returns_a_sessions_lanes_by_name(fx: BrokerFixture) -> None:
    threads = fx.broker.threads
    for session, lane in (("s1", "web:b"), ("s2", "web:a"), ("s1", "email:<x@y>"), ("s1", "web:a")):
        await threads.remember(session, lane, {"lane": lane}, {})
    assert [s.lane for s in await threads.list("s1")] == ["email:<x@y>", "web:a", "web:b"]
    assert [s.session for s in await threads.list("s1")] == ["s1"] * 3
    assert await threads.list("s3") == ()


@_case("threads")
async def mark_replied_never_lowers_the_mark(fx: BrokerFixture) -> None:
    threads = fx.broker.threads
    await threads.remember("s1", "web:t1", {"t": 1}, {})
    for seq, want in ((10, 10), (7, 10), (10, 10), (11, 11)):
        await threads.mark_replied("s1", "web:t1", seq)
        state = await threads.get("s1", "web:t1")
        assert state is not None
        assert state.replied_through == want
    await threads.mark_replied("s1", "web:unknown", 5)  # no state: ignored
    assert await threads.get("s1", "web:unknown") is None


@_case("threads")
async def rebase_moves_every_lane_of_one_session_either_way(fx: BrokerFixture) -> None:
    threads = fx.broker.threads
    for session, lane in (("s1", "web:t1"), ("s1", "web:t2"), ("s2", "web:t1")):
        await threads.remember(session, lane, {"t": 1}, {"ts": "1"})
        await threads.mark_replied(session, lane, 9)
    await threads.remember("s1", "web:t3", {"t": 3}, {})  # never marked
    assert await threads.rebase("s1", 4) == 3
    assert [(s.lane, s.replied_through) for s in await threads.list("s1")] == [
        ("web:t1", 4),
        ("web:t2", 4),
        ("web:t3", 4),
    ]
    kept = await threads.get("s1", "web:t1")
    assert kept is not None
    assert kept.reply_context == {"ts": "1"}  # only the mark moves
    other = await threads.get("s2", "web:t1")
    assert other is not None
    assert other.replied_through == 9
    assert await threads.rebase("s1", 12) == 3  # higher too
    assert {s.replied_through for s in await threads.list("s1")} == {12}
    assert await threads.rebase("nobody", 1) == 0
    await threads.mark_replied("s1", "web:t1", 13)  # marks move on from there
    again = await threads.get("s1", "web:t1")
    assert again is not None
    assert again.replied_through == 13


# ---------------------------------------------------------------------------------------------
# marks


@_case("marks")
async def a_mark_is_set_only_from_the_value_expected(fx: BrokerFixture) -> None:
    marks = fx.broker.marks
    name = "email:bot@example.test:INBOX"
    assert await marks.get(name) is None
    assert not await marks.put(name, "7:10", expect="7:9")  # not set yet
    assert await marks.put(name, "7:10", expect=None)
    assert not await marks.put(name, "7:11", expect=None)  # set meanwhile
    assert not await marks.put(name, "7:11", expect="7:9")
    assert await marks.put(name, "7:12", expect="7:10")
    assert await marks.get(name) == "7:12"
    assert await marks.get("email:other") is None
    await fx.broker.close()
    other = await fx.open_another()
    assert await other.marks.get(name) == "7:12"


@_case("marks")
async def racing_puts_from_one_value_let_exactly_one_win(fx: BrokerFixture) -> None:
    marks = fx.broker.marks
    await marks.put("m", "0", expect=None)
    won = await asyncio.gather(*(marks.put("m", str(n), expect="0") for n in range(1, 9)))
    assert sum(won) == 1
    assert await marks.get("m") == str(won.index(True) + 1)


# ---------------------------------------------------------------------------------------------
# audit


def _audit(n: int, *, session: str | None = "s1", lane: str | None = "web:t1") -> NewAuditEvent:
    return NewAuditEvent(
        actor=f"worker:w{n % 2}",
        action="accept",
        session=session,
        lane=lane,
        target=f"item-{n}",
        outcome="ok",
        details={"n": n},
    )


@_case("audit")
async def record_appends_events_in_record_order(fx: BrokerFixture) -> None:
    audit = fx.broker.audit
    events = []
    for n in range(12):  # more than 10: ids sort as strings too
        events.append(await audit.record(_audit(n)))
        fx.clock.advance(n)
    assert [e.id for e in events] == sorted(e.id for e in events)
    assert len({e.id for e in events}) == 12
    first = events[0]
    assert first.model_dump(exclude={"id", "at_ms"}) == _audit(0).model_dump()
    assert events[3].at_ms - first.at_ms == 0 + 1 + 2
    operator = await audit.record(NewAuditEvent(actor="operator:ann", action="x", outcome="ok"))
    assert (operator.session, operator.lane, operator.target, operator.details) == (
        None,
        None,
        None,
        {},
    )
    assert await audit.list() == (*events, operator)
    await fx.broker.close()
    other = await fx.open_another()
    assert await other.audit.list() == (*events, operator)


@_case("audit")
async def list_narrows_by_session_and_lane(fx: BrokerFixture) -> None:
    audit = fx.broker.audit
    a = await audit.record(_audit(1, session="s1", lane="web:t1"))
    b = await audit.record(_audit(2, session="s2", lane="web:t1"))
    c = await audit.record(_audit(3, session="s1", lane="web:t2"))
    d = await audit.record(_audit(4, session="s1", lane=None))
    e = await audit.record(_audit(5, session=None, lane=None))
    assert await audit.list() == (a, b, c, d, e)
    assert await audit.list(session="s1") == (a, c, d)
    assert await audit.list(session="s1", lane="web:t1") == (a,)
    assert await audit.list(lane="web:t1") == (a, b)
    assert await audit.list(session="s9") == ()


@_case("audit")
async def list_pages_with_a_cursor_and_a_limit(fx: BrokerFixture) -> None:
    audit = fx.broker.audit
    events = [await audit.record(_audit(n, session=f"s{n % 2}")) for n in range(7)]
    assert await audit.list(limit=3) == tuple(events[:3])
    assert await audit.list(after=events[2].id, limit=3) == tuple(events[3:6])
    assert await audit.list(after=events[6].id) == ()
    s0 = [e for e in events if e.session == "s0"]
    assert await audit.list(session="s0", after=s0[1].id) == tuple(s0[2:])
    pages: list[str] = []
    after: str | None = None
    while page := await audit.list(after=after, limit=2):
        pages += [e.id for e in page]
        after = page[-1].id
    assert pages == [e.id for e in events]


# ---------------------------------------------------------------------------------------------
# blobs: content-addressed, named by a channel's key, bounded, kept for a retention


async def _refused(put: Awaitable[object]) -> BlobRefused:
    """The refusal `put` raises (a put that succeeds fails the case)."""
    try:
        await put
    except BlobRefused as refused:
        return refused
    raise AssertionError("the blob area took a blob it must refuse")


@_case("blobs")
async def a_blob_is_held_by_its_content_and_read_back_from_another_broker(
    fx: BrokerFixture,
) -> None:
    blobs = fx.broker.blobs
    data = bytes(range(256)) * 2  # binary, not text
    info = await blobs.put("s1", data, key="slack:F1")
    assert info.id == blob_id(data)
    assert info.size == len(data)
    assert info.keep_until_ms == fx.clock.now_ms() + fx.blob_limits.retention_ms
    assert await blobs.get("s1", info.id) == data
    assert await blobs.find("s1", "slack:F1") == info
    assert await blobs.find("s1", "slack:F2") is None
    assert await blobs.get("s2", info.id) is None  # sessions hold their own blobs
    assert await blobs.get("s1", blob_id(b"other")) is None
    await fx.broker.close()
    other = await fx.open_another()
    assert await other.blobs.get("s1", info.id) == data
    assert await other.blobs.find("s1", "slack:F1") == info


@_case("blobs")
async def the_same_bytes_are_held_once_and_their_retention_renewed(fx: BrokerFixture) -> None:
    blobs = fx.broker.blobs
    limits = fx.blob_limits
    data = b"x" * limits.max_blob_bytes
    first = await blobs.put("s1", data, key="email:<a@x>:1")
    for _ in range(limits.max_session_bytes // limits.max_blob_bytes):
        await blobs.put("s1", data)  # counted once: never `full`
    fx.clock.advance(1_000)
    again = await blobs.put("s1", data, key="email:<b@x>:1")
    assert again.id == first.id
    assert again.keep_until_ms == first.keep_until_ms + 1_000
    assert await blobs.find("s1", "email:<a@x>:1") == again
    assert await blobs.find("s1", "email:<b@x>:1") == again


@_case("blobs")
async def a_blob_over_the_limit_is_refused_and_nothing_is_stored(fx: BrokerFixture) -> None:
    blobs = fx.broker.blobs
    assert blobs.max_blob_bytes == fx.blob_limits.max_blob_bytes
    data = b"y" * (fx.blob_limits.max_blob_bytes + 1)
    refused = await _refused(blobs.put("s1", data, key="k1"))
    assert refused.code == "too_large"
    assert "limit" in str(refused)
    assert await blobs.find("s1", "k1") is None
    assert await blobs.get("s1", blob_id(data)) is None


@_case("blobs")
async def a_session_full_of_unexpired_blobs_refuses_more_until_their_retention_passes(
    fx: BrokerFixture,
) -> None:
    blobs = fx.broker.blobs
    limits = fx.blob_limits
    size = limits.max_blob_bytes
    count = limits.max_session_bytes // size
    held = [await blobs.put("s1", bytes([n]) * size, key=f"k{n}") for n in range(count)]
    extra = b"z" * size
    assert (await _refused(blobs.put("s1", extra, key="extra"))).code == "full"
    assert await blobs.find("s1", "extra") is None
    assert await blobs.get("s1", blob_id(extra)) is None
    assert [await blobs.get("s1", b.id) for b in held] == [bytes([n]) * size for n in range(count)]
    assert (await blobs.put("s2", extra)).size == size  # another session has its own room
    fx.clock.advance(limits.retention_ms - 1)
    assert await blobs.get("s1", held[0].id) is not None  # kept for the whole retention
    fx.clock.advance(1)
    assert await blobs.get("s1", held[0].id) is None  # past it: never read again
    assert await blobs.find("s1", "k0") is None
    taken = await blobs.put("s1", extra, key="extra")  # room again: the expired ones went
    assert await blobs.find("s1", "extra") == taken
    assert await blobs.get("s1", taken.id) == extra
