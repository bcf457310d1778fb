"""`RecordingChannel`: a `ChannelAdapter` for tests that records, fails, hangs and loses acks.

Every delivery that reaches the channel is recorded at its *sink* (in memory, and in a JSONL
*ledger* file when one is given, so several processes can share one sink and a test counts
what all of them delivered); `count(delivery_id)` says how often a delivery arrived, so a test
asserts that no reply was delivered twice. `reconcile` answers truthfully from the sink.

Faults are programmed per call: the next N deliveries fail (a retryable `DeliveryError`, or a
permanent one), hang until cancelled (before or after sending), or lose their acknowledgement
(delivered, then `DeliveryError(unknown_outcome=True)`); or every delivery does, until `heal`.
Inbound, the channel injects messages into the sink it was started with (`send`), repeats one
as a channel retry would (`resend`) and sends button clicks (`decide`).

Given an `inner` adapter (say a `WebChannel`), it wraps it: same name, `start`/`stop` and
deliveries are passed through (faults apply first), and what the inner adapter delivered is
recorded, so a test that talks to the real web channel still counts every delivery at a sink.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fastapi import APIRouter

from adapters.channel import (
    Acceptance,
    Attachment,
    Author,
    Capabilities,
    ChannelAdapter,
    ContextMessage,
    DecisionInbound,
    DecisionItem,
    DeliveryError,
    DeliveryReceipt,
    Inbound,
    InboundSink,
    Outbound,
    Reconciled,
    ThreadRef,
)
from harness_core import Clock, SystemClock

__all__ = ["Fault", "FaultKind", "RecordingChannel"]

FaultKind = Literal["fail", "hang", "lose_ack", "reconcile_unknown"]


@dataclass(frozen=True)
class Fault:
    """What one call does instead of succeeding."""

    kind: FaultKind
    reason: str = "injected failure"
    permanent: bool = False
    """``fail``: the delivery can never succeed (a dead letter at once)."""
    retry_after_s: float | None = None
    """``fail``: the channel's ``Retry-After`` hint."""
    after_send: bool = False
    """``hang``: deliver first, then hang (the caller's timeout makes the outcome unknown)."""


class RecordingChannel:
    """A channel for tests: deliveries recorded at a sink, faults on demand, inbound injected.

    `ledger` (a file path) makes the sink durable and shared: every delivery is appended to it
    as one JSON line (under an exclusive lock), and counts and `reconcile` read it, so a test
    that runs several gateway processes counts at one sink. `inner`: the adapter it wraps.
    """

    def __init__(
        self,
        name: str = "fake",
        *,
        space: str = "default",
        clock: Clock | None = None,
        ledger: str | Path | None = None,
        inner: ChannelAdapter | None = None,
    ) -> None:
        self.inner = inner
        self._name = inner.name if inner is not None else name
        self.space = space
        self.clock = clock or SystemClock()
        self.ledger = None if ledger is None else Path(ledger)
        self.sink: InboundSink | None = None
        self.running = False
        self.delivered: list[Outbound] = []
        """Every delivery that reached the sink, in order (repeats included) - this process."""
        self.attempts: list[Outbound] = []
        """Every `deliver` call, whatever became of it."""
        self.reconciled: list[tuple[str, Reconciled]] = []
        """Every `reconcile` call: the delivery id and the answer."""
        self.sent: list[Inbound] = []
        """Every inbound message handed to the sink (resends included)."""
        self.decisions: list[DecisionInbound] = []
        self.hanging = 0
        """Calls hanging right now."""
        self._faults: list[Fault] = []
        self._always: Fault | None = None
        self._reconcile_faults = 0
        self._changed = asyncio.Condition()
        self._message_numbers = 0

    @property
    def name(self) -> str:
        """The channel's name (``fake`` unless given)."""
        return self._name

    @property
    def capabilities(self) -> Capabilities:
        """The wrapped adapter's; alone, threads and decisions (its tests decide by hand)."""
        if self.inner is not None:
            return self.inner.capabilities
        return Capabilities(decisions=True)

    @property
    def router(self) -> APIRouter | None:
        """The wrapped adapter's HTTP routes, if it has any (the service mounts them)."""
        return None if self.inner is None else self.inner.router

    @property
    def body_limits(self) -> Mapping[str, int]:
        """The wrapped adapter's body bounds by path prefix, if it declares any."""
        return {} if self.inner is None else self.inner.body_limits

    # -- faults --------------------------------------------------------------------------------

    def fail_next(
        self,
        n: int = 1,
        *,
        reason: str = "injected failure",
        permanent: bool = False,
        retry_after_s: float | None = None,
    ) -> None:
        """The next `n` deliveries raise `DeliveryError` without delivering."""
        fault = Fault("fail", reason=reason, permanent=permanent, retry_after_s=retry_after_s)
        self._faults += [fault] * n

    def fail_always(self, *, reason: str = "injected failure", permanent: bool = False) -> None:
        """Every delivery raises `DeliveryError` without delivering, until `heal`."""
        self._always = Fault("fail", reason=reason, permanent=permanent)

    def hang_next(self, n: int = 1, *, after_send: bool = False) -> None:
        """The next `n` deliveries hang until cancelled (`after_send`: having delivered)."""
        self._faults += [Fault("hang", after_send=after_send)] * n

    def hang_always(self, *, after_send: bool = False) -> None:
        """Every delivery hangs until cancelled, until `heal`."""
        self._always = Fault("hang", after_send=after_send)

    def lose_ack_next(self, n: int = 1) -> None:
        """The next `n` deliveries arrive, then raise `DeliveryError(unknown_outcome=True)`."""
        self._faults += [Fault("lose_ack", reason="acknowledgement lost")] * n

    def lose_ack_always(self) -> None:
        """Every delivery arrives, then raises `DeliveryError(unknown_outcome=True)`."""
        self._always = Fault("lose_ack", reason="acknowledgement lost")

    def reconcile_unknown_next(self, n: int = 1) -> None:
        """The next `n` reconciliations answer ``unknown`` (the channel cannot tell now)."""
        self._reconcile_faults += n

    def heal(self) -> None:
        """Forget every programmed fault: deliveries succeed from now on."""
        self._faults.clear()
        self._always = None
        self._reconcile_faults = 0

    # -- the sink ------------------------------------------------------------------------------

    def _ledger_lines(self) -> list[dict[str, object]]:
        if self.ledger is None or not self.ledger.exists():
            return []
        lines = []
        for raw in self.ledger.read_text().splitlines():
            with contextlib.suppress(ValueError):  # a torn last line of a killed process
                lines.append(json.loads(raw))
        return lines

    def counts(self) -> Counter[str]:
        """How many times each delivery id arrived at the sink (the ledger's, if any)."""
        if self.ledger is not None:
            return Counter(str(line["delivery_id"]) for line in self._ledger_lines())
        return Counter(o.delivery_id for o in self.delivered)

    def count(self, delivery_id: str) -> int:
        """How many times `delivery_id` arrived at the sink."""
        return self.counts()[delivery_id]

    def duplicates(self) -> dict[str, int]:
        """The delivery ids that arrived more than once, with their counts (empty: none)."""
        return {key: n for key, n in self.counts().items() if n > 1}

    def replies(self, thread: str | ThreadRef) -> list[Outbound]:
        """What this process delivered into a thread, in order (repeats included)."""
        ref = self.thread_ref(thread)
        return [o for o in self.delivered if o.thread == ref]

    def _record(self, outbound: Outbound) -> None:
        self.delivered.append(outbound)
        if self.ledger is not None:
            line = json.dumps(
                {
                    "delivery_id": outbound.delivery_id,
                    "lane": outbound.thread.lane,
                    "kind": outbound.kind,
                    "text": outbound.text,
                    "at_ms": self.clock.now_ms(),
                    "pid": os.getpid(),
                },
                separators=(",", ":"),
            )
            self.ledger.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                os.write(fd, (line + "\n").encode())
                os.fsync(fd)
            finally:
                os.close(fd)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_until(
        self, predicate: Callable[[], bool], *, timeout_s: float = 10.0, poll_s: float = 0.05
    ) -> None:
        """Return once `predicate()` holds (checked on every change and every `poll_s`).

        Raises:
            TimeoutError: it did not hold within `timeout_s`.
        """
        async with asyncio.timeout(timeout_s):
            while not predicate():
                async with self._changed:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(poll_s):
                            await self._changed.wait()

    async def wait_delivered(self, *delivery_ids: str, timeout_s: float = 10.0) -> None:
        """Return once each of `delivery_ids` arrived at least once."""
        await self.wait_until(
            lambda: all(self.count(d) > 0 for d in delivery_ids), timeout_s=timeout_s
        )

    # -- ChannelAdapter ------------------------------------------------------------------------

    async def start(self, sink: InboundSink) -> None:
        """Remember `sink` (what `send`, `resend` and `decide` hand messages to)."""
        self.sink = sink
        self.running = True
        if self.inner is not None:
            await self.inner.start(sink)

    async def stop(self) -> None:
        """Stop (idempotent); the recordings stay."""
        self.running = False
        if self.inner is not None:
            await self.inner.stop()

    async def close(self) -> None:
        """Stop, and close the wrapped adapter (the recordings stay)."""
        await self.stop()
        if self.inner is not None:
            await self.inner.close()

    def _next_fault(self) -> Fault | None:
        if self._faults:
            return self._faults.pop(0)
        return self._always

    async def _hang(self) -> None:
        self.hanging += 1
        await self._notify()
        try:
            await asyncio.Event().wait()
        finally:
            self.hanging -= 1

    async def deliver(self, outbound: Outbound) -> DeliveryReceipt:
        """Record `outbound` at the sink, unless a programmed fault says otherwise.

        With an `inner` adapter, it delivers first (its `DeliveryError` passes through and
        nothing is recorded) and its receipt is returned.

        Raises:
            DeliveryError: a ``fail`` (not delivered) or ``lose_ack`` (delivered, unknown).
        """
        self.attempts.append(outbound)
        fault = self._next_fault()
        if fault is not None and fault.kind == "fail":
            await self._notify()
            raise DeliveryError(
                fault.reason, permanent=fault.permanent, retry_after_s=fault.retry_after_s
            )
        if fault is not None and fault.kind == "hang" and not fault.after_send:
            await self._hang()
        receipt = None if self.inner is None else await self.inner.deliver(outbound)
        self._record(outbound)
        await self._notify()
        if fault is not None and fault.kind == "hang":
            await self._hang()
        if fault is not None and fault.kind == "lose_ack":
            raise DeliveryError(fault.reason, unknown_outcome=True)
        if receipt is not None:
            return receipt
        return DeliveryReceipt(
            delivery_id=outbound.delivery_id,
            channel_message_ids=(f"{outbound.delivery_id}#{self.count(outbound.delivery_id)}",),
            delivered_at_ms=self.clock.now_ms(),
        )

    async def reconcile(self, outbound: Outbound) -> Reconciled:
        """``delivered`` if the sink holds the delivery id, else ``absent`` (or a fault)."""
        answer: Reconciled
        if self._reconcile_faults > 0:
            self._reconcile_faults -= 1
            answer = "unknown"
        else:
            answer = "delivered" if self.count(outbound.delivery_id) > 0 else "absent"
        self.reconciled.append((outbound.delivery_id, answer))
        return answer

    # -- inbound -------------------------------------------------------------------------------

    def thread_ref(self, thread: str | ThreadRef, space: str | None = None) -> ThreadRef:
        """`thread` as a `ThreadRef` of this channel (a plain id lives in `space`)."""
        if isinstance(thread, ThreadRef):
            return thread
        return ThreadRef(channel=self.name, space=space or self.space, thread=thread)

    def _sink(self) -> InboundSink:
        if self.sink is None:
            raise RuntimeError("the channel was not started: no sink to send to")
        return self.sink

    async def send(
        self,
        thread: str | ThreadRef,
        text: str,
        *,
        message_id: str | None = None,
        author: Author | str = "user",
        space: str | None = None,
        attachments: Sequence[Attachment] = (),
        reply_context: dict[str, object] | None = None,
        context: Sequence[ContextMessage] = (),
    ) -> Acceptance:
        """Hand a message to the sink, as the channel would on an event; return its acceptance.

        Raises:
            NotRouted, Unavailable: whatever the sink raises.
        """
        self._message_numbers += 1
        inbound = Inbound(
            thread=self.thread_ref(thread, space),
            message_id=message_id or f"{self.name}-msg-{self._message_numbers}",
            author=Author(id=author, name=author) if isinstance(author, str) else author,
            text=text,
            attachments=tuple(attachments),
            received_at_ms=self.clock.now_ms(),
            reply_context=reply_context or {},
            context=tuple(context),
        )
        return await self._accept(inbound)

    async def resend(self, message_id: str) -> Acceptance:
        """Hand the same message to the sink again, as a channel's retry of an event does.

        Raises:
            KeyError: no message with that id was sent.
        """
        for inbound in reversed(self.sent):
            if inbound.message_id == message_id:
                return await self._accept(inbound)
        raise KeyError(message_id)

    async def _accept(self, inbound: Inbound) -> Acceptance:
        sink = self._sink()
        self.sent.append(inbound)
        return await sink.accept(inbound)

    async def decide(
        self,
        thread: str | ThreadRef,
        *,
        run_id: str,
        wait_id: str,
        decisions: Iterable[DecisionItem],
        idempotency_key: str | None = None,
        decided_by: Author | str = "approver",
        space: str | None = None,
        identified: bool = True,
    ) -> Acceptance:
        """Hand a button click to the sink (`decisions` records it); return its acceptance.

        The same `idempotency_key` again is a double click (default: a new key per call).
        `identified`: the channel vouches for `decided_by` (`DecisionInbound.identified`).

        Raises:
            NotRouted, Unavailable: whatever the sink raises.
        """
        items = tuple(decisions)
        decision = DecisionInbound(
            thread=self.thread_ref(thread, space),
            run_id=run_id,
            wait_id=wait_id,
            decisions=items,
            decided_by=(
                Author(id=decided_by, name=decided_by)
                if isinstance(decided_by, str)
                else decided_by
            ),
            idempotency_key=idempotency_key or f"{self.name}-click-{len(self.decisions) + 1}",
            received_at_ms=self.clock.now_ms(),
            identified=identified,
        )
        sink = self._sink()
        self.decisions.append(decision)
        return await sink.decide(decision)
