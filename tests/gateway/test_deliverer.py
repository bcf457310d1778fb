"""The deliverer against a real broker and a channel that fails on demand, under a manual clock.

The retry schedule is asserted exactly: the deliverer's jitter comes from a seeded random, and a
replica of it says what every delay must be.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from adapters.channel import ApprovalClosed, ApprovalView, DeliveryError, Outbound, ThreadRef
from adapters.testing import RecordingChannel
from gateway.authority import Scope, restore, revoke
from gateway.broker import open_broker
from gateway.broker.contract import Broker, BrokerError, Delivery
from gateway.deliverer import Deliverer, DelivererConfig, retry_delay_ms
from gateway.outage import Outage
from gateway.redact import Redactor
from harness_core import SystemClock
from harness_core.testing import ManualClock
from tests.support.redis_server import RedisServer

SEED = 7
CAP_MS = 3_600_000
T = TypeVar("T")


class Rig:
    def __init__(self, broker: Broker, clock: ManualClock, fake: RecordingChannel) -> None:
        self.broker = broker
        self.clock = clock
        self.fake = fake
        self.deliverer: Deliverer | None = None

    def start(self, redact: Callable[[str], str] | None = None, **config: Any) -> Deliverer:
        settings: dict[str, Any] = {"deliverer_id": "d1", "idle_wait_ms": 10, **config}
        self.deliverer = Deliverer(
            DelivererConfig(**settings),
            self.broker,
            {"fake": self.fake},
            self.clock,
            random.Random(SEED),
            redact=redact,
        )
        self.deliverer.start()
        return self.deliverer

    async def enqueue(
        self,
        delivery_id: str = "reply:s:run-1",
        text: str = "hi",
        *,
        space: str = "default",
        thread: str = "t1",
    ) -> Outbound:
        outbound = Outbound(
            delivery_id=delivery_id,
            thread=ThreadRef(channel="fake", space=space, thread=thread),
            kind="reply",
            text=text,
        )
        await self.broker.outbox.enqueue(
            delivery_id,
            "s",
            f"fake:{thread}",
            outbound.model_dump(mode="json"),
            now_ms=self.clock.now_ms(),
        )
        return outbound

    async def until(
        self, delivery_id: str, ready: Callable[[Delivery], bool], timeout_s: float = 10.0
    ) -> Delivery:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            found = await self.broker.outbox.get(delivery_id)
            if found is not None and ready(found):
                return found
            assert asyncio.get_running_loop().time() < deadline, f"{delivery_id}: {found}"
            await asyncio.sleep(0.005)


@pytest.fixture(params=["sqlite", "redis"])
async def rig(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[Rig]:
    clock = ManualClock()
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/broker.db"
    else:
        server = request.getfixturevalue("redis_server")
        url = f"{server.url}?prefix={request.getfixturevalue('redis_prefix')}"
    broker = open_broker(url, clock=clock)
    made = Rig(broker, clock, RecordingChannel(clock=clock))
    yield made
    if made.deliverer is not None:
        await made.deliverer.stop(1)
    await broker.close()


def _failed(attempts: int, now_ms: Callable[[], int]) -> Callable[[Delivery], bool]:
    """Attempt `attempts` failed and was settled: due again later. A delivery claimed for that
    attempt and not settled yet shows the same count and the previous error, but is due now."""
    return lambda d: (
        d.attempts == attempts
        and d.status == "pending"
        and d.last_error is not None
        and d.due_at_ms > now_ms()
    )


async def _eventually(
    read: Callable[[], Awaitable[Sequence[T]]], timeout_s: float = 10.0
) -> Sequence[T]:
    """What `read` returns once it is not empty."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (found := await read()):
        assert asyncio.get_running_loop().time() < deadline, "still empty"
        await asyncio.sleep(0.005)
    return found


def _schedule(attempts: int) -> list[int]:
    """The delays a deliverer seeded with SEED waits after its first `attempts` failures."""
    rng = random.Random(SEED)
    return [retry_delay_ms(n, cap_ms=CAP_MS, rng=rng) for n in range(1, attempts + 1)]


async def test_a_configured_secret_in_a_reply_never_reaches_the_channel(rig: Rig) -> None:
    """The deliverer is the last boundary before Slack, email or a webhook: a reply quoting a
    secret (an MCP server's token a tool echoed, the provider's key) goes redacted (D349), as
    the web thread and the operator API already showed it; a reply without one goes as is."""
    secret = "tok-3f9a81c2d7e4"
    await rig.enqueue("reply:s:run-1", f'the token is {secret}, or "{secret}" quoted')
    await rig.enqueue("reply:s:run-2", "nothing to hide: https://example.com/a")
    rig.start(redact=Redactor([secret]).redact)
    await rig.until("reply:s:run-1", lambda d: d.status == "delivered")
    await rig.until("reply:s:run-2", lambda d: d.status == "delivered")
    said = {o.delivery_id: o.text for o in rig.fake.delivered}
    assert said == {
        "reply:s:run-1": 'the token is [redacted], or "[redacted]" quoted',
        "reply:s:run-2": "nothing to hide: https://example.com/a",
    }


async def test_a_channel_that_fails_three_times_is_retried_on_the_schedule(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.deliverer")
    rig.fake.fail_next(3)
    await rig.enqueue()
    rig.start()
    expected = _schedule(3)
    for n, delay in enumerate(expected, 1):
        failed = await rig.until("reply:s:run-1", _failed(n, rig.clock.now_ms))
        assert failed.due_at_ms - rig.clock.now_ms() == delay
        assert 0.8 * 1000 * 2**n <= delay <= 1000 * 2**n
        rig.clock.advance(delay - 1)
        await asyncio.sleep(0.05)
        assert (await rig.broker.outbox.get("reply:s:run-1")).attempts == n  # type: ignore[union-attr]
        rig.clock.advance(1)
    done = await rig.until("reply:s:run-1", lambda d: d.status == "delivered")
    assert done.attempts == 4
    assert rig.fake.count("reply:s:run-1") == 1
    assert len(rig.fake.attempts) == 4
    # routine at first; from the third failure on, a warning (an SMTP outage was invisible
    # under GATEWAY_LOG_LEVEL=warning until its dead letters, hours later: an outside probe)
    levels = [r.levelname for r in caplog.records if r.getMessage() == "delivery failed"]
    assert levels == ["INFO", "INFO", "WARNING"]


async def test_a_channel_that_always_fails_makes_a_dead_letter(rig: Rig) -> None:
    rig.fake.fail_always(reason="channel down")
    await rig.enqueue()
    rig.start(max_attempts=4)
    for delay in _schedule(3):
        await rig.until("reply:s:run-1", lambda d: d.due_at_ms > rig.clock.now_ms())
        rig.clock.advance(delay)
    dead = await rig.until("reply:s:run-1", lambda d: d.status == "dead")
    assert dead.attempts == 4 and dead.last_error == "channel down"
    assert rig.fake.count("reply:s:run-1") == 0
    # The audit event is written after the delivery is settled dead, so it may trail the status.
    [audit] = await _eventually(lambda: rig.broker.audit.list(session="s"))
    assert audit.action == "dead letter" and audit.target == "reply:s:run-1"
    assert audit.details["attempts"] == 4


async def test_a_permanent_failure_is_a_dead_letter_at_once(rig: Rig) -> None:
    rig.fake.fail_next(1, permanent=True, reason="channel_not_found")
    await rig.enqueue()
    rig.start()
    dead = await rig.until("reply:s:run-1", lambda d: d.status == "dead")
    assert dead.attempts == 1 and dead.last_error == "channel_not_found"


async def test_the_channels_retry_after_wins_when_longer(rig: Rig) -> None:
    rig.fake.fail_next(1, retry_after_s=30)
    await rig.enqueue()
    rig.start()
    failed = await rig.until("reply:s:run-1", lambda d: d.last_error is not None)
    assert failed.due_at_ms - rig.clock.now_ms() == 30_000


async def test_a_lost_acknowledgement_is_reconciled_not_resent(rig: Rig) -> None:
    rig.fake.lose_ack_next(1)
    await rig.enqueue()
    rig.start()
    unknown = await rig.until("reply:s:run-1", lambda d: d.unknown_outcome)
    assert unknown.status == "pending"
    rig.clock.advance(unknown.due_at_ms - rig.clock.now_ms())
    done = await rig.until("reply:s:run-1", lambda d: d.status == "delivered")
    assert done.attempts == 2
    assert rig.fake.count("reply:s:run-1") == 1  # at the sink once
    assert len(rig.fake.attempts) == 1  # and sent once: the second attempt only looked
    assert rig.fake.reconciled == [("reply:s:run-1", "delivered")]


async def test_a_send_that_hangs_past_its_timeout_is_reconciled(rig: Rig) -> None:
    rig.fake.hang_next(1, after_send=True)
    await rig.enqueue()
    rig.start(timeout_ms=100)
    unknown = await rig.until("reply:s:run-1", lambda d: d.unknown_outcome)
    assert unknown.last_error is not None
    assert re.fullmatch(r"no answer from the \w+ channel within 0\.1 s", unknown.last_error)
    rig.clock.advance(unknown.due_at_ms - rig.clock.now_ms())
    await rig.until("reply:s:run-1", lambda d: d.status == "delivered")
    assert rig.fake.count("reply:s:run-1") == 1 and len(rig.fake.attempts) == 1


async def test_an_unanswerable_reconcile_retries_without_sending(rig: Rig) -> None:
    rig.fake.lose_ack_next(1)
    rig.fake.reconcile_unknown_next(1)
    await rig.enqueue()
    rig.start()
    first = await rig.until("reply:s:run-1", lambda d: d.unknown_outcome)
    rig.clock.advance(first.due_at_ms - rig.clock.now_ms())
    second = await rig.until(
        "reply:s:run-1",
        lambda d: d.attempts == 2 and d.last_error is not None and d.due_at_ms > rig.clock.now_ms(),
    )
    # the first attempt's failure stays said: "reconcile: unknown" alone hid it
    assert second.last_error == f"reconcile: unknown (after {first.last_error})"
    assert first.last_error and second.unknown_outcome
    assert len(rig.fake.attempts) == 1
    rig.clock.advance(second.due_at_ms - rig.clock.now_ms())
    await rig.until("reply:s:run-1", lambda d: d.status == "delivered")
    assert rig.fake.count("reply:s:run-1") == 1 and len(rig.fake.attempts) == 1


async def test_a_dead_letter_redelivered_goes_out_once(rig: Rig) -> None:
    rig.fake.fail_next(1, permanent=True)
    await rig.enqueue()
    rig.start()
    await rig.until("reply:s:run-1", lambda d: d.status == "dead")
    again = await rig.broker.outbox.redeliver("reply:s:run-1", now_ms=rig.clock.now_ms())
    assert again is not None and again.changed and again.delivery.status == "pending"
    await rig.until("reply:s:run-1", lambda d: d.status == "delivered")
    assert rig.fake.count("reply:s:run-1") == 1


async def test_stop_delivers_what_is_due_then_stops(rig: Rig) -> None:
    deliverer = rig.start()
    await asyncio.sleep(0.05)
    for n in range(5):
        await rig.enqueue(f"reply:s:run-{n}")
    await deliverer.stop(5)
    assert sorted(rig.fake.counts()) == [f"reply:s:run-{n}" for n in range(5)]


def test_the_delay_is_capped_and_jittered_down_only() -> None:
    rng = random.Random(1)
    delays = [retry_delay_ms(30, cap_ms=CAP_MS, rng=rng) for _ in range(200)]
    assert all(0.8 * CAP_MS <= d <= CAP_MS for d in delays)
    assert len(set(delays)) > 100
    assert retry_delay_ms(1, cap_ms=CAP_MS, rng=random.Random(1)) <= 2000


def _request_and_close(rig: Rig) -> tuple[Outbound, Outbound]:
    """An approval request (wait w1) and its close, as the reply scan enqueues them."""
    thread = ThreadRef(channel="fake", space="default", thread="t1")
    view = ApprovalView(session="s", run_id="r1", wait_id="w1", calls=())
    request = Outbound(
        delivery_id="approval_request:s:w1",
        thread=thread,
        kind="approval_request",
        text="May I?",
        approval=view,
    )
    closed = ApprovalClosed(
        session="s",
        run_id="r1",
        wait_id="w1",
        request_delivery_id=request.delivery_id,
        requested_at_ms=0,
        outcome="approved",
        by="ann",
        at_ms=1,
    )
    close = Outbound(
        delivery_id="approval_closed:s:w1",
        thread=thread,
        kind="approval_closed",
        text="closed",
        closed=closed,
    )
    return request, close


async def _put(rig: Rig, outbound: Outbound) -> None:
    payload = outbound.model_dump(mode="json")
    now = rig.clock.now_ms()
    await rig.broker.outbox.enqueue(outbound.delivery_id, "s", "fake:t1", payload, now_ms=now)


async def test_a_request_closed_before_it_was_posted_is_never_posted(rig: Rig) -> None:
    request, close = _request_and_close(rig)
    reminder = request.model_copy(update={"delivery_id": request.delivery_id + ":remind-3"})
    for outbound in (close, request, reminder):
        await _put(rig, outbound)
    rig.start()
    for copy in (request, reminder):
        await rig.until(copy.delivery_id, lambda d: d.status == "delivered")
        assert rig.fake.count(copy.delivery_id) == 0  # settled unsent: its buttons would lie
    for _ in range(20):  # the close may have waited for them: let its retry come due
        rig.clock.advance(2_000)
        found = await rig.broker.outbox.get(close.delivery_id)
        if found is not None and found.status == "delivered":
            break
        await asyncio.sleep(0.05)
    assert rig.fake.count(close.delivery_id) == 1


async def test_a_close_waits_while_a_copy_of_its_request_is_pending(rig: Rig) -> None:
    request, close = _request_and_close(rig)
    rig.fake.fail_next(1)
    await _put(rig, request)
    rig.start()
    await rig.until(request.delivery_id, _failed(1, rig.clock.now_ms))  # pending, retrying
    await _put(rig, close)
    held = await rig.until(close.delivery_id, _failed(1, rig.clock.now_ms))
    # the copy's send failed here, so the close goes behind it as any later delivery of the
    # thread does (D384); a copy still pending for another reason holds it back as well
    assert held.last_error == (
        f"after {request.delivery_id}, an earlier delivery of its thread that failed"
    )
    assert rig.fake.count(close.delivery_id) == 0
    rig.clock.advance(held.due_at_ms - rig.clock.now_ms())
    await rig.until(close.delivery_id, lambda d: d.status == "delivered")
    # the request, closed before it was ever posted, is settled unsent first; then the close
    await rig.until(request.delivery_id, lambda d: d.status == "delivered")
    assert [o.delivery_id for o in rig.fake.delivered] == [close.delivery_id]


@pytest.mark.parametrize("after_send", [False, True], ids=["before_sending", "after_sending"])
async def test_an_attempt_a_stop_cuts_is_handed_back_due_now_its_outcome_unknown(
    rig: Rig, after_send: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the hand back is bounded (1 s) so a stop never hangs on a slow broker; what it writes is
    # this test's subject, so a loaded CI machine's slow Redis call must not cut it short (a
    # hand back cut short is safe: the lease lapses and the next claim marks the outcome unknown)
    monkeypatch.setattr("gateway.deliverer._HAND_BACK_S", 10.0)
    rig.fake.hang_next(1, after_send=after_send)
    await rig.enqueue()
    deliverer = rig.start(lease_ms=60_000, timeout_ms=20_000)
    await rig.fake.wait_until(lambda: rig.fake.hanging > 0)
    cut = asyncio.Event()
    cut.set()  # a second signal: no drain
    await deliverer.stop(5, cut=cut)
    handed = await rig.broker.outbox.get("reply:s:run-1")
    assert handed is not None
    assert (handed.status, handed.unknown_outcome, handed.attempts) == ("pending", True, 1)
    assert handed.due_at_ms <= rig.clock.now_ms() and handed.last_error == "cut by a stop"
    rig.deliverer = None
    rig.start(deliverer_id="d2")  # the next process: at once, not after the 60 s lease
    await rig.until("reply:s:run-1", lambda d: d.status == "delivered")
    assert rig.fake.count("reply:s:run-1") == 1  # reconciled first when it had gone out


async def test_a_thread_whose_authority_is_revoked_gets_nothing_posted(rig: Rig) -> None:
    """D267: its deliveries become dead letters at once, unsent and not reconciled; other
    threads are delivered; once the authority is back, a redelivered one goes out."""
    space = Scope.of_space("fake", "default")
    await revoke(rig.broker, space, cause="channel_archive", why="archived", by="fake", now_ms=1)
    await rig.enqueue("reply:s:run-1")
    await rig.enqueue("reply:s:run-2", space="other", thread="t2")
    rig.start()
    dead = await rig.until("reply:s:run-1", lambda d: d.status == "dead")
    assert dead.last_error == "authority_revoked: archived (fake space default, by fake)"
    await rig.until("reply:s:run-2", lambda d: d.status == "delivered")
    assert [o.delivery_id for o in rig.fake.attempts] == ["reply:s:run-2"]
    assert rig.fake.reconciled == []

    await restore(rig.broker, space, by="op", now_ms=2)
    await rig.broker.outbox.redeliver("reply:s:run-1", now_ms=rig.clock.now_ms())
    await rig.until("reply:s:run-1", lambda d: d.status == "delivered")


async def test_a_broker_that_is_down_is_claimed_from_about_once_a_second(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis killed under a running deliverer (on the real clock, as a service runs it): it
    pauses between claims, and delivers again once Redis is back."""
    server = RedisServer(tmp_path / "redis", appendonly=True).start()
    clock = SystemClock()
    broker = open_broker(f"{server.url}?prefix=down", clock=clock)
    fake = RecordingChannel(clock=clock)
    outage = Outage("broker", clock, logging.getLogger("gateway.deliverer"))
    deliverer = Deliverer(
        DelivererConfig(deliverer_id="d1"),
        broker,
        {"fake": fake},
        clock,
        random.Random(SEED),
        outage=outage,
    )
    deliverer.start()

    async def delivered(delivery_id: str) -> None:
        outbound = Outbound(
            delivery_id=delivery_id,
            thread=ThreadRef(channel="fake", space="default", thread="t1"),
            kind="reply",
            text="hi",
        )
        payload = outbound.model_dump(mode="json")
        await broker.outbox.enqueue(delivery_id, "s", "fake:t1", payload, now_ms=clock.now_ms())
        deadline = asyncio.get_running_loop().time() + 15
        while (
            found := await broker.outbox.get(delivery_id)
        ) is None or found.status != "delivered":
            assert asyncio.get_running_loop().time() < deadline, found
            await asyncio.sleep(0.02)

    try:
        await delivered("reply:s:before")
        server.kill()
        with caplog.at_level(logging.WARNING, logger="gateway.deliverer"):
            caplog.clear()
            await asyncio.sleep(3)
        failed = [r.msg for r in caplog.records if r.getMessage() == "broker unavailable"]
        assert 1 <= outage.failures <= 6, outage.failures  # was about 2,000 a second
        assert len(failed) == 1  # said once (D347)
        assert getattr(failed[0], "fields", {})["code"] == "storage"  # why, by its code
        server.start()  # the same data directory
        await delivered("reply:s:after")
    finally:
        await deliverer.stop(1)
        await broker.close()
        server.stop()


class _Held(RecordingChannel):
    """Holds the send of one delivery until `release` is set."""

    def __init__(self, held: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.held = held
        self.release = asyncio.Event()

    async def deliver(self, outbound: Outbound) -> Any:
        if outbound.delivery_id == self.held:
            await self.release.wait()
        return await super().deliver(outbound)


class _FailsOnce(RecordingChannel):
    """The first send of each of some deliveries fails for now (a dropped connection)."""

    def __init__(self, *failing: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.failing = set(failing)

    async def deliver(self, outbound: Outbound) -> Any:
        if outbound.delivery_id in self.failing:
            self.failing.discard(outbound.delivery_id)
            raise DeliveryError("connection reset")
        return await super().deliver(outbound)


async def test_a_reply_behind_one_that_failed_goes_after_it_not_before(rig: Rig) -> None:
    """The first reply's send failed (a dropped connection) and was due again a second later;
    the second, claimed meanwhile, went at once: the answer to the second question landed
    before the first's (D384). It is due just after the failed one now, and its wait spends
    none of its own attempts; another thread's reply does not wait."""
    rig.fake = failing = _FailsOnce("reply:s:run-1", "reply:s:run-2", clock=rig.clock)
    await rig.enqueue("reply:s:run-1", "first")
    await rig.enqueue("reply:s:run-2", "second")
    await rig.enqueue("reply:s:run-3", "third")
    await rig.enqueue("reply:s:run-9", "elsewhere", thread="t2")
    rig.start(max_attempts=2)
    failed = await rig.until("reply:s:run-1", _failed(1, rig.clock.now_ms))
    await rig.until("reply:s:run-9", lambda d: d.status == "delivered")
    second = await rig.until(
        "reply:s:run-2", lambda d: d.attempts == 1 and d.due_at_ms > failed.due_at_ms
    )
    third = await rig.until(
        "reply:s:run-3", lambda d: d.attempts == 1 and d.due_at_ms > second.due_at_ms
    )
    assert [o.text for o in failing.delivered] == ["elsewhere"]  # nothing of t1 went first
    rig.clock.advance(third.due_at_ms - rig.clock.now_ms())
    await rig.until("reply:s:run-1", lambda d: d.status == "delivered")
    # pending, not dead: one of its two claims was a wait (max 2)
    again = await rig.until("reply:s:run-2", _failed(2, rig.clock.now_ms))
    rig.clock.advance(max(again.due_at_ms, third.due_at_ms) + 2 - rig.clock.now_ms())
    for number in (2, 3):
        await rig.until(f"reply:s:run-{number}", lambda d: d.status == "delivered")
    assert [o.text for o in failing.delivered if o.text != "elsewhere"] == [
        "first",
        "second",
        "third",
    ]


async def test_a_reply_does_not_wait_long_behind_one_that_failed(rig: Rig) -> None:
    """A failed reply due again in two minutes (the channel's ``Retry-After``) would hold the
    thread's next replies as long, and one that keeps failing for hours: past the wait D379
    allows (30 s), the later ones go (D384), out of order rather than not at all."""
    rig.fake.fail_next(1, reason="rate limited", retry_after_s=120)
    await rig.enqueue("reply:s:run-1", "first")
    await rig.enqueue("reply:s:run-2", "second")
    rig.start()
    await rig.until("reply:s:run-1", _failed(1, rig.clock.now_ms))
    second = await rig.until("reply:s:run-2", lambda d: d.status == "delivered")
    assert second.attempts == 1 and [o.text for o in rig.fake.delivered] == ["second"]


@pytest.mark.parametrize(("lease_ms", "waits"), [(60_000, True), (25_000, False)])
async def test_a_thread_s_replies_land_in_the_order_they_were_made(
    rig: Rig, lease_ms: int, waits: bool
) -> None:
    """Deliveries run in parallel: the second run's answer landed before the first's, which
    took longer to send (`test_held_messages` met it under load). One thread's go one after
    the other (D379), within what the claim's lease allows (a lease of 25 s with a send's
    timeout of 10 s leaves no time to wait: each goes at once, as before); another thread's
    reply does not wait for them."""
    held = _Held("reply:s:run-1", clock=rig.clock)
    rig.fake = held
    await rig.enqueue("reply:s:run-1", "first")
    await rig.enqueue("reply:s:run-2", "second")
    await rig.enqueue("reply:s:run-3", "third")
    await rig.enqueue("reply:s:run-9", "elsewhere", thread="t2")
    rig.start(lease_ms=lease_ms, timeout_ms=10_000)
    # while the first one's send is held: another thread's reply goes
    await rig.until("reply:s:run-9", lambda d: d.status == "delivered")
    if waits:  # the thread's later replies wait for it
        await asyncio.sleep(0.2)
        assert [o.text for o in held.delivered] == ["elsewhere"]
    else:  # no time to wait: they go at once, before it
        for number in (2, 3):
            await rig.until(f"reply:s:run-{number}", lambda d: d.status == "delivered")
    held.release.set()
    for number in (1, 2, 3):
        await rig.until(f"reply:s:run-{number}", lambda d: d.status == "delivered")
    one_thread = [o.text for o in held.delivered if o.text != "elsewhere"]
    if waits:
        assert one_thread == ["first", "second", "third"]
    else:
        assert one_thread[-1] == "first" and sorted(one_thread[:2]) == ["second", "third"]


async def test_a_settle_the_broker_fails_is_said_and_the_next_claim_looks_first(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk failed the settle after the send: its error went unretrieved ("Task
    exception was never retrieved", an outside probe). It is a warning now, and the claim
    lapses into one that reconciles before sending again."""
    real = rig.broker.outbox.settle_delivered
    failing = [True]

    async def settle(claimed: Any, *, now_ms: int) -> Any:
        if failing.pop() if failing else False:
            raise BrokerError("storage", "sqlite error on broker.db: database or disk is full")
        return await real(claimed, now_ms=now_ms)

    rig.broker.outbox.settle_delivered = settle  # type: ignore[method-assign]
    caplog.set_level(logging.INFO, logger="gateway.deliverer")
    deliverer = rig.start(lease_ms=60_000)
    await rig.enqueue()
    [said] = await _eventually(lambda: _said(caplog, "delivery not settled"))
    assert said.msg.fields["error"] == "BrokerError"  # type: ignore[union-attr]
    assert "disk is full" in said.msg.fields["reason"]  # type: ignore[union-attr]
    assert not deliverer._running  # the attempt ended, its error taken
    rig.clock.advance(60_001)  # the claim lapses: the next one reconciles, never sends again
    found = await rig.until("reply:s:run-1", lambda d: d.status == "delivered")
    assert found.attempts == 2
    assert rig.fake.count("reply:s:run-1") == 1
    assert len(rig.fake.attempts) == 1  # sent once: the second claim only looked


async def _said(caplog: pytest.LogCaptureFixture, message: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == message]
