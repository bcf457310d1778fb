"""The deliverer: sends due replies through their adapters; retries, reconciles, dead-letters.

Delivery is at least once towards the channel, and made effectively once by the adapters: every
attempt whose outcome is unknown (a timeout, an adapter saying so) is reconciled before the next
send, so a reply that arrived is never posted again. Failures are retried on a13n's schedule,
``min(cap, 2^attempts) x U(0.8, 1.0)`` seconds (the channel's own ``Retry-After`` wins when
longer), until `max_attempts`; then the delivery is a dead letter with a secret-free reason.

Nothing is posted into a thread whose authority is revoked (`gateway.authority`): such a
delivery is a dead letter at once, its reason beginning ``authority_revoked`` (D267).

Approval requests and their closes are ordered here, since deliveries run in parallel: a copy
of a request (the request or a reminder) whose close is already enqueued is not posted (its
buttons could change nothing), and a close waits while a copy of its request is still pending
(so the copy is there to be closed when the close runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pydantic import ValidationError

from adapters import ChannelAdapter, DeliveryError, GivesUp, Outbound, is_copy_of
from gateway.authority import revocation_of
from gateway.broker.contract import Broker, ClaimedDelivery, Delivery, NewAuditEvent
from gateway.closes import close_delivery_id
from gateway.logs import event
from gateway.metrics import Metrics
from gateway.outage import Outage
from gateway.waits import until_done
from harness_core import Clock
from harness_core.texts import one_line

__all__ = ["Deliverer", "DelivererConfig", "retry_delay_ms"]

_BROKER_DOWN_S = 1.0
"""The pause after a claim failed: a broker that is down fails its bell's wait at once too, and
a deliverer that only waited on it claimed thousands of times a second (an outside probe saw
2,200 log lines a second while Redis was down)."""


log = logging.getLogger("gateway.deliverer")

_HAND_BACK_S = 1.0
"""How long handing a cut attempt's delivery back may take (else its claim lapses as ever)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DelivererConfig:
    """How replies are delivered (from the settings)."""

    deliverer_id: str
    max_attempts: int = 12
    lease_ms: int = 60_000
    """How long a claimed delivery stays this deliverer's (then another may claim it)."""
    timeout_ms: int = 10_000
    """How long one adapter call may take before its outcome is unknown (< lease_ms / 2)."""
    max_delay_ms: int = 3_600_000
    batch: int = 32
    parallel: int = 8
    idle_wait_ms: int = 1_000


def retry_delay_ms(attempts: int, *, cap_ms: int, rng: random.Random) -> int:
    """a13n's schedule after `attempts` claims: ``min(cap, 2^attempts s) x U(0.8, 1.0)``."""
    base = min(cap_ms, 1000 * 2 ** min(attempts, 16))
    return int(base * rng.uniform(0.8, 1.0))


class Deliverer:
    """Claims due deliveries and settles each one."""

    def __init__(
        self,
        config: DelivererConfig,
        broker: Broker,
        adapters: Mapping[str, ChannelAdapter],
        clock: Clock,
        rng: random.Random | None = None,
        metrics: Metrics | None = None,
        redact: Callable[[str], str] | None = None,
        outage: Outage | None = None,
    ) -> None:
        self.config = config
        self._outage = outage or Outage("broker", clock, log)
        """Says a broker that fails the claims once, not once a second (D347)."""
        self._redact = redact or (lambda text: text)
        """Cleans a failure's reason before it is stored (a channel's error may quote a token)."""
        self._metrics = metrics
        self._broker = broker
        self._adapters = adapters
        self._clock = clock
        self._rng = rng or random.Random()  # jitter, not security
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._last_of: dict[tuple[str, str], asyncio.Task[None]] = {}
        """By (session, lane): the attempt claimed last, which the thread's next one waits for."""
        self._failed_of: dict[tuple[str, str], str] = {}
        """By (session, lane): a delivery whose send failed here and is due again later; the
        thread's later deliveries are due after it (D384)."""
        self._behind: dict[tuple[str, str], int] = {}
        """By (session, lane): when the thread's last delivery put behind a failed one is due."""
        self._deferred: Counter[str] = Counter()
        """By delivery: the claims it spent waiting behind a failed one (not its attempts)."""

    @property
    def actor(self) -> str:
        """This deliverer in the audit trail."""
        return f"deliverer:{self.config.deliverer_id}"

    def start(self) -> None:
        """Start delivering (returns at once)."""
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self, seconds: float, *, cut: asyncio.Event | None = None) -> None:
        """Drain: deliver what is due now (claiming until nothing is), for up to `seconds`.

        Attempts still running at the deadline (or once `cut` is set) are cancelled and their
        deliveries handed back, due now with their outcome unknown: the next deliverer (this
        process's successor, or another) reconciles each before sending it again.
        """
        self._stopping.set()
        if self._task is not None:
            await until_done([self._task], seconds, cut)
            self._task.cancel()
            await until_done([self._task], _HAND_BACK_S * 2)

    async def _loop(self) -> None:
        config = self.config
        slots = asyncio.Semaphore(config.parallel)
        try:
            while True:
                try:
                    claimed = await self._broker.outbox.claim(
                        config.deliverer_id,
                        now_ms=self._clock.now_ms(),
                        limit=min(config.batch, config.parallel),
                        lease_ms=config.lease_ms,
                    )
                except Exception as exc:  # the broker is down: its bell is too, so pause
                    self._outage.failed("claim", exc)
                    if self._stopping.is_set():
                        break
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), _BROKER_DOWN_S)
                    continue
                self._outage.ok("claim")
                if not claimed:
                    if self._stopping.is_set():
                        break
                    await self._wait(config.idle_wait_ms)
                    continue
                # fewer than asked for: the outbox had no more due, so the next claim would
                # most likely find nothing; `wait` returns at once if something is due by now
                drained = len(claimed) < min(config.batch, config.parallel)
                for item in claimed:
                    await slots.acquire()
                    thread = (item.delivery.session, item.delivery.lane)
                    before = self._last_of.get(thread)
                    task = asyncio.ensure_future(self._attempt(item, after=before))
                    self._running.add(task)
                    self._last_of[thread] = task

                    def settled(done: asyncio.Task[None], thread: tuple[str, str] = thread) -> None:
                        self._running.discard(done)
                        if self._last_of.get(thread) is done:
                            del self._last_of[thread]
                        slots.release()

                    task.add_done_callback(settled)
                if drained and not self._stopping.is_set():
                    await self._wait(config.idle_wait_ms)
            if self._running:
                await asyncio.gather(*self._running, return_exceptions=True)
        except asyncio.CancelledError:
            for task in self._running:
                task.cancel()
            await until_done(self._running, _HAND_BACK_S * 1.5)  # they hand their claims back
            raise

    async def _wait(self, ms: int) -> None:
        waiting = asyncio.ensure_future(self._broker.outbox.wait(ms))
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
            stopping.cancel()
            await asyncio.gather(waiting, stopping, return_exceptions=True)

    async def _attempt(
        self, claimed: ClaimedDelivery, *, after: asyncio.Task[None] | None = None
    ) -> None:
        began = time.monotonic()
        try:
            if after is not None and not after.done():
                await self._in_turn(after)
            if await self._behind_a_failed_one(claimed):
                return
            await self._try(claimed)
        except asyncio.CancelledError:
            await self._hand_back(claimed)
            raise
        except Exception as exc:
            # the broker failed a settle (a full disk, a blip): the claim lapses, and the next
            # one looks before it sends (`unknown_outcome`). It went unretrieved, "Task
            # exception was never retrieved" in the log (an outside probe).
            log.warning(
                event(
                    "delivery not settled",
                    delivery=claimed.delivery.id,
                    error=type(exc).__name__,
                    reason=one_line(str(exc))[:300],
                    again_in_ms=self.config.lease_ms,
                )
            )
        finally:
            if self._metrics is not None:
                self._metrics.delivery_time(time.monotonic() - began)

    async def _in_turn(self, before: asyncio.Task[None]) -> None:
        """Wait for the attempt of the thread's delivery claimed before this one (D379).

        Deliveries run in parallel, so two replies of one thread (two runs' answers, a reply
        and the next run's notice) could land in the other order than they were made. They go
        one after the other here, within what the claim's lease allows: this attempt still
        needs a reconcile and a send, each up to `timeout_ms`, and a margin, before its lease
        could lapse to another deliverer (which would send it as well); past that it goes.
        """
        config = self.config
        spare_ms = config.lease_ms - 3 * config.timeout_ms
        if spare_ms <= 0:
            return
        await asyncio.wait({before}, timeout=spare_ms / 1000)  # however it ended

    async def _behind_a_failed_one(self, claimed: ClaimedDelivery) -> bool:
        """Put a delivery after its thread's earlier one that failed here and waits (D384).

        `_in_turn` orders one thread's attempts, yet an attempt that failed is due again
        later, and the thread's next reply, claimed meanwhile, went first: the answer to the
        second question before the first. It is due again just after the failed one (and
        after any other put behind it), spending a claim that does not count as an attempt
        of its own; the failed one decides again when it is delivered or dead. Only while
        the failed one is due within the wait `_in_turn` allows (30 s by default): one that
        keeps failing, or a channel's long ``Retry-After``, must not wedge the thread, so
        past that the later ones go. True when it was put behind.
        """
        delivery = claimed.delivery
        thread = (delivery.session, delivery.lane)
        failed = self._failed_of.get(thread)
        if failed is None or failed == delivery.id:
            return False
        try:
            earlier = await self._broker.outbox.get(failed)
        except Exception:  # unknown: send it, as before this rule
            return False
        if earlier is None or earlier.status != "pending":  # settled since (here or elsewhere)
            self._forget_failed(thread, failed)
            return False
        now = self._clock.now_ms()
        due = max(earlier.due_at_ms, self._behind.get(thread, 0)) + 1
        if due - now > self.config.lease_ms - 3 * self.config.timeout_ms:
            return False  # too long a wait: the thread goes on out of order, not wedged
        self._behind[thread] = due
        self._deferred[delivery.id] += 1
        await self._broker.outbox.settle_retry(
            claimed,
            due_at_ms=due,
            reason=f"after {failed}, an earlier delivery of its thread that failed",
            unknown_outcome=delivery.unknown_outcome,
            now_ms=now,
        )
        log.info(
            event("delivery behind", delivery=delivery.id, behind=failed, retry_in_ms=due - now)
        )
        return True

    def _settled(self, delivery: Delivery) -> None:
        """A delivery ended here: the thread's later ones no longer wait for it."""
        self._deferred.pop(delivery.id, None)
        self._forget_failed((delivery.session, delivery.lane), delivery.id)

    def _forget_failed(self, thread: tuple[str, str], delivery_id: str) -> None:
        if self._failed_of.get(thread) == delivery_id:
            del self._failed_of[thread]
            self._behind.pop(thread, None)

    async def _try(self, claimed: ClaimedDelivery) -> None:
        delivery = claimed.delivery
        try:
            outbound = self._cleaned(Outbound.model_validate(dict(delivery.outbound)))
        except ValidationError:
            await self._dead(claimed, "malformed outbound")
            return
        if await self._revoked(claimed, outbound):
            return
        adapter = self._adapters.get(outbound.thread.channel)
        if adapter is None:
            await self._retry(claimed, f"no adapter for {outbound.thread.channel}", False)
            return
        if await self._held_back(claimed, outbound):
            return
        timeout = self.config.timeout_ms / 1000
        if delivery.unknown_outcome:  # an earlier attempt may have arrived: look before sending
            try:
                found = await asyncio.wait_for(adapter.reconcile(outbound), timeout=timeout)
            except Exception as exc:
                found = "unknown"
                log.info(event("reconcile failed", delivery=delivery.id, error=type(exc).__name__))
            if found == "delivered":
                await self._delivered(claimed, reconciled=True)
                return
            if found == "unknown":
                # the attempt before's failure stays said: "reconcile: unknown" alone hid
                # the receiver's 500 from the operator reading the dead letter
                await self._retry(claimed, _unknown_after(delivery.last_error), True, tell=outbound)
                return
        try:
            await asyncio.wait_for(adapter.deliver(outbound), timeout=timeout)
        except DeliveryError as exc:
            if exc.permanent:
                await self._dead(claimed, exc.reason, tell=outbound)
            else:
                await self._retry(
                    claimed, exc.reason, exc.unknown_outcome, exc.retry_after_s, tell=outbound
                )
            return
        except TimeoutError:  # it may have gone out: the next attempt looks first
            said = f"no answer from the {outbound.thread.channel} channel within {timeout:g} s"
            await self._retry(claimed, said, True, tell=outbound)
            return
        except Exception as exc:
            await self._retry(claimed, type(exc).__name__, True, tell=outbound)
            return
        await self._delivered(claimed, reconciled=False)

    def _cleaned(self, outbound: Outbound) -> Outbound:
        """`outbound` without a configured secret in anything it says (D349).

        The last boundary before a channel: a reply quoting a secret a tool or the model came
        by (an MCP server's token, the provider's key) goes with ``[redacted]`` in its place,
        as the web thread and the operator API already show it.
        """
        raw = outbound.model_dump_json()
        clean = self._redact(raw)
        return outbound if clean == raw else Outbound.model_validate_json(clean)

    async def _revoked(self, claimed: ClaimedDelivery, outbound: Outbound) -> bool:
        """Dead-letter a delivery into a thread whose authority is revoked (True), unsent (D267).

        Never posted, not retried: an operator redelivers it once the authority is back. Read
        before reconciling too (a revoked token or a channel the bot left has nothing to read).
        """
        delivery = claimed.delivery
        try:
            revocation = await revocation_of(
                self._broker.marks, delivery.session, delivery.lane, outbound.thread
            )
        except Exception as exc:  # unknown: sending could speak where it may not; look later
            await self._retry(claimed, f"authority unread ({type(exc).__name__})", False)
            return True
        if revocation is None:
            return False
        await self._dead(claimed, revocation.reason())
        return True

    async def _held_back(self, claimed: ClaimedDelivery, outbound: Outbound) -> bool:
        """Hold back what approval requests and their closes must not send yet.

        A request copy closed before it was posted is settled unsent; a close whose request
        still has a copy pending is retried later. True when it did either.
        """
        outbox = self._broker.outbox
        view = outbound.approval
        if outbound.kind == "approval_request" and view is not None:
            if await outbox.get(close_delivery_id(view.session, view.wait_id)) is None:
                return False
            await outbox.settle_delivered(claimed, now_ms=self._clock.now_ms())
            self._count(claimed, "skipped")
            log.info(event("request closed before it was posted", delivery=claimed.delivery.id))
            return True
        closed = outbound.closed
        if outbound.kind != "approval_closed" or closed is None:
            return False
        base = closed.request_delivery_id
        first = await outbox.get(base)
        pending = first is not None and first.status == "pending"
        if not pending:
            later = await outbox.list("pending", after=base, limit=50)
            pending = any(is_copy_of(d.id, base) for d in later)
        if pending:
            await self._retry(claimed, "a copy of the request is still being posted", False)
        return pending

    async def _hand_back(self, claimed: ClaimedDelivery) -> None:
        """A stop cut the attempt: due again now, outcome unknown (best effort, bounded)."""
        now = self._clock.now_ms()
        retry = self._broker.outbox.settle_retry(
            claimed, due_at_ms=now, reason="cut by a stop", unknown_outcome=True, now_ms=now
        )
        with contextlib.suppress(Exception):
            await asyncio.wait_for(retry, timeout=_HAND_BACK_S)

    async def _delivered(self, claimed: ClaimedDelivery, *, reconciled: bool) -> None:
        settled = await self._broker.outbox.settle_delivered(claimed, now_ms=self._clock.now_ms())
        self._settled(claimed.delivery)
        self._count(claimed, "reconciled" if reconciled else "delivered")
        log.info(
            event(
                "delivered",
                delivery=claimed.delivery.id,
                attempts=claimed.delivery.attempts,
                reconciled=reconciled,
                settled=settled,
            )
        )

    async def _given_up(self, delivery: Delivery, outbound: Outbound, reason: str) -> None:
        """Tell the delivery's channel it was given up (best effort, within the send timeout)."""
        adapter: object = self._adapters.get(outbound.thread.channel)
        if not isinstance(adapter, GivesUp):  # an optional part of a channel
            return
        try:
            await asyncio.wait_for(
                adapter.given_up(outbound, reason), timeout=self.config.timeout_ms / 1000
            )
        except Exception as exc:  # the dead letter stands; the channel only shows less
            log.info(event("given up not shown", delivery=delivery.id, error=type(exc).__name__))

    async def _retry(
        self,
        claimed: ClaimedDelivery,
        reason: str,
        unknown_outcome: bool,
        retry_after_s: float | None = None,
        *,
        tell: Outbound | None = None,
    ) -> None:
        """Settle an attempt that failed for now: due again later, or dead past the last.

        `tell`: the outbound of an attempt that was made, whose channel a dead letter is told.
        """
        delivery = claimed.delivery
        reason = self._redact(reason)
        if delivery.attempts - self._deferred[delivery.id] >= self.config.max_attempts:
            await self._dead(claimed, reason, tell=tell)
            return
        delay = retry_delay_ms(delivery.attempts, cap_ms=self.config.max_delay_ms, rng=self._rng)
        if retry_after_s is not None and math.isfinite(retry_after_s) and retry_after_s > 0:
            # the channel's hint, within the deliverer's own longest wait: a proxy's "1e12"
            # parked a reply for 31 years, and "inf" failed the attempt with nothing recorded
            hinted = int(min(retry_after_s * 1000, self.config.max_delay_ms))
            delay = max(delay, hinted)
        now = self._clock.now_ms()
        settled = await self._broker.outbox.settle_retry(
            claimed,
            due_at_ms=now + delay,
            reason=reason,
            unknown_outcome=unknown_outcome or delivery.unknown_outcome,
            now_ms=now,
        )
        if settled and tell is not None:  # a send failed: the thread's next ones wait for it
            self._failed_of.setdefault((delivery.session, delivery.lane), delivery.id)
        self._count(claimed, "retry")
        # the first failures are routine (a retry puts them right); from the third on it is an
        # outage an operator reading warnings must see, long before the dead letter
        level = logging.WARNING if delivery.attempts >= _WARN_FROM_ATTEMPT else logging.INFO
        log.log(
            level,
            event(
                "delivery failed",
                delivery=delivery.id,
                attempts=delivery.attempts,
                reason=reason,
                retry_in_ms=delay,
            ),
        )

    async def _dead(
        self, claimed: ClaimedDelivery, reason: str, *, tell: Outbound | None = None
    ) -> None:
        """Settle a dead letter; `tell`: the outbound whose channel is told (`GivesUp`)."""
        delivery = claimed.delivery
        reason = self._redact(reason)
        dead = await self._broker.outbox.settle_dead(
            claimed, reason=reason, now_ms=self._clock.now_ms()
        )
        self._settled(delivery)
        self._count(claimed, "dead")
        log.warning(event("delivery dead", delivery=delivery.id, reason=reason))
        if tell is not None and dead:
            await self._given_up(delivery, tell, reason)
        with contextlib.suppress(Exception):
            await self._broker.audit.record(
                NewAuditEvent(
                    actor=self.actor,
                    action="dead letter",
                    session=delivery.session,
                    lane=delivery.lane,
                    target=delivery.id,
                    outcome="dead",
                    details={"reason": reason, "attempts": delivery.attempts},
                )
            )

    def _count(self, claimed: ClaimedDelivery, outcome: str) -> None:
        if self._metrics is not None:
            thread = claimed.delivery.outbound.get("thread")
            channel = thread.get("channel") if isinstance(thread, Mapping) else None
            self._metrics.delivery(channel, outcome)


_WARN_FROM_ATTEMPT = 3
"""The attempt from which a failed delivery is a warning, not an info line."""

_UNKNOWN = "reconcile: unknown"


def _unknown_after(before: str | None) -> str:
    """The reason of a retry whose reconcile could not tell, with the failure that led to it."""
    if before is None or before == _UNKNOWN:
        return _UNKNOWN
    if before.startswith(f"{_UNKNOWN} (after ") and before.endswith(")"):
        return before  # the same cause, again
    return f"{_UNKNOWN} (after {before})"
