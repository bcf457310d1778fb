"""The channel conformance suite: runner-independent checks every channel adapter passes.

A channel's tests build a `ChannelRig`: the channel's real peer (Slack's Web API and its signed
requests, a mail server, an HTTP client of the web channel...), able to build a fresh adapter
wired to it and to act as the people on the other side. Each `ChannelCheck` builds an adapter
from the rig, starts it with a `SuiteSink` (an `InboundSink` keeping the contract in memory) and
checks one promise of `adapters.channel`; a check that fails is the channel's bug (or the
contract's, to be fixed there first). With pytest, and a fixture giving a fresh rig (a fresh
peer) to each check::

    from adapters.conformance import ChannelCheck, channel_checks

    CHECKS = channel_checks()

    @pytest.mark.parametrize("check", CHECKS, ids=[c.id for c in CHECKS])
    async def test_my_channel_conforms(check: ChannelCheck, rig: MyRig) -> None:
        await check.run(rig)

The suite imports no test kit: everything it needs from a peer comes with the rig (D182, D196).

**The rig** (`ChannelRig`). People are ids in the channel's own terms (a web author, a Slack
user id, an email address); threads are labels the checks choose (``"once"``, ``"ids"``...)
that the rig maps to the channel's threads.

* `build()`: a fresh adapter wired to the peer, not started (called once per check).
* `say(thread, text, author=, redeliver=)`: post a message natively in the thread the label
  names (the first one starts it: a new web thread, a mention at the top of a Slack channel, a
  new mail; later ones answer in it), then send the same native event `redeliver` more times, as
  the peer does when it missed the acknowledgement. Returns a `Said`: for each send, whether
  the peer was acknowledged (HTTP 2xx; a mail flagged handled). A peer that learns it later than
  its send returns (mail) waits for it a few seconds at most.
* `seen(thread)`: what the peer holds from the bot in that thread, oldest first: a `Posted` per
  message the bot posted, with the mark naming its delivery and its part number where the
  channel splits a delivery.
* `mark_of(delivery_id)`: the mark every part of that delivery carries (the delivery id where
  the channel carries it as it is, as Slack's metadata and the web mailbox do; email: its
  derived ``Message-ID``).
* `decide(posted, approve=, as_user=)`: use the approval control of `posted` as that person
  (approve or deny it, whatever the channel asks for on the way, a Deny dialog say).
* `hostile()`: hostile native inputs (forged, missing or stale signatures, malformed or
  oversized bodies, mail that must not be answered...), each a `Hostile` whose `send` says
  whether the peer saw it refused (an HTTP 4xx; mail: set aside, flagged handled untaken).
* `lose_next_ack()`: the next send reaches the thread, but its answer is lost (the adapter
  sees a timeout or a dropped connection).
* `hang()`: from now on the peer takes calls and never answers them (the rig lets them go when
  it is torn down); False if the rig cannot make its peer hang.
* `approver`, `stranger`: a person who may decide approval requests, and one who may not.

**The promises** (a check per promise, in `channel_checks()`; each check's docstring says
exactly what it holds the channel to). `Capabilities` gate what a check expects, never whether
it runs: a channel without decision controls must say in the request that it is decided
elsewhere, one without an approver rule must let anyone decide, one that cannot edit must tell
the thread of a close, one whose `reconcile` cannot see a send must say absent and hold a
delivery sent again once.

* contract: the adapter is a `ChannelAdapter`, its threads carry its name, its body limits
  bound its own routes.
* inbound: a message is held once however often the peer sends it; it is acknowledged only
  once the sink holds it; refused once, it is held once when sent again; two messages with the
  same words are two, and a thread is one lane; hostile input is refused and stores nothing.
* outbound: every posted part carries its delivery id and the receipt names what was posted;
  `reconcile` says absent before a send and delivered after; after a lost acknowledgement it
  says delivered, and a retry as the outbox makes it posts nothing twice (without
  `Capabilities.reconciles`: it says absent, and what is sent again is held once).
* approvals: a request is decided by an approver, once, with its wait, run and digests, and a
  stranger's use stores nothing; a denial arrives as one; a close reaches every copy.
* lifecycle: after `stop` nothing is taken (messages, decisions) while deliveries still go
  out; `stop` and `close` end within `CLOSE_DEADLINE_S`, even with a hung peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from adapters.channel import (
    Acceptance,
    ApprovalClosed,
    ApprovalView,
    Attachment,
    AuthorityChange,
    Capabilities,
    ChannelAdapter,
    DecisionInbound,
    DecisionRefused,
    DeliveryError,
    Inbound,
    IncomingFile,
    KnownThread,
    Outbound,
    OutboundKind,
    PendingCall,
    ThreadRef,
    Unavailable,
    is_copy_of,
)
from adapters.files import FileLimits, take_in
from harness_core import args_digest

__all__ = [
    "ARRIVAL_S",
    "CLOSE_DEADLINE_S",
    "SESSION",
    "ChannelCheck",
    "ChannelRig",
    "Hostile",
    "Posted",
    "Said",
    "SuiteSink",
    "channel_checks",
]

SESSION = "suite"
"""The session every thread routes to in the suite's sink."""
CLOSE_DEADLINE_S = 5.0
"""How long `stop` and `close` together may take (real seconds), whatever the peer does."""
ARRIVAL_S = 10.0
"""How long (real seconds) a message may take from the peer to the sink, at most."""
LONG_TEXT = "\n\n".join(
    f"Paragraph {n}: " + " ".join(f"word{n}x{w}" for w in range(60)) for n in range(16)
)
"""A reply longer than a chat message (about 9,000 characters in paragraphs)."""
_NAME = re.compile(r"[a-z][a-z0-9]{0,31}")


@dataclass(frozen=True)
class Said:
    """What the peer got back for a message a rig posted: one entry per send."""

    acked: tuple[bool, ...]
    """Whether each send (the first, then each redelivery) was acknowledged by the channel."""


@dataclass(frozen=True)
class Posted:
    """One message the bot posted in a thread, as the peer holds it."""

    id: str
    """The peer's own name of it, as the channel's receipts name it (`DeliveryReceipt`)."""
    mark: str | None
    """What it carries that names its delivery (`ChannelRig.mark_of`); None: nothing."""
    text: str
    """What a person reads in it (plain text)."""
    part: int | None = None
    """Its part number, for a channel that splits a delivery into several messages."""
    controls: tuple[str, ...] = ()
    """The approval controls it offers now (``approve``, ``deny``, maybe ``supply``): buttons,
    links."""


@dataclass(frozen=True)
class Hostile:
    """A hostile native input: `send` sends it and says whether the peer saw it refused."""

    name: str
    send: Callable[[], Awaitable[bool]]


class ChannelRig(Protocol):
    """A channel's real peer, as the suite drives it (see the module docstring)."""

    @property
    def approver(self) -> str:
        """A person who may decide approval requests (the channel's own id of them)."""
        ...

    @property
    def stranger(self) -> str:
        """A person who may not (on a channel without an approver rule: just someone else)."""
        ...

    def build(self) -> ChannelAdapter:
        """A fresh adapter wired to this peer, not started."""
        ...

    async def say(self, thread: str, text: str, *, author: str, redeliver: int = 0) -> Said:
        """Post `text` in the thread labelled `thread` as `author`, then `redeliver` times again."""
        ...

    async def seen(self, thread: str) -> list[Posted]:
        """What the peer holds from the bot in the thread labelled `thread`, oldest first."""
        ...

    def mark_of(self, delivery_id: str) -> str:
        """The mark each posted part of `delivery_id` carries."""
        ...

    async def decide(self, posted: Posted, *, approve: bool, as_user: str) -> None:
        """Use the approval control of `posted` as `as_user`."""
        ...

    def hostile(self) -> Sequence[Hostile]:
        """Hostile native inputs the channel must refuse, storing nothing."""
        ...

    def lose_next_ack(self) -> None:
        """The next send reaches the thread; its answer never reaches the adapter."""
        ...

    async def hang(self) -> bool:
        """Make the peer take calls and never answer them; False if this rig cannot."""
        ...


class SuiteSink:
    """An `InboundSink` keeping the contract in memory: what a check's adapter handed over.

    Every thread routes to `SESSION`. A message is held once per `Inbound.dedupe_key` (a later
    one is a duplicate). A decision is judged against the approval requests the check opened
    (`open_request`), as the gateway judges it: one naming no open wait of its thread, or
    another run, session, calls or digests, is refused (`DecisionRefused`) and stores nothing;
    a decision is held once per slot (`DecisionInbound.slot`), the first one winning.
    `refuse()` makes `accept` raise `Unavailable`, as an inbox that is down.
    """

    def __init__(self) -> None:
        self.messages: dict[str, Inbound] = {}
        """The messages held, by dedupe key."""
        self.offered: list[Inbound] = []
        """Every message the adapter handed over, held, duplicate or refused."""
        self.refusals = 0
        """How many `accept` calls were refused (`refuse`)."""
        self.decisions: dict[str, DecisionInbound] = {}
        """The decisions held, by slot."""
        self.decisions_refused: list[DecisionInbound] = []
        """Decisions refused as the gateway refuses one that can change nothing."""
        self.marks: dict[str, str] = {}
        self.authority_changes: list[AuthorityChange] = []
        self.files: dict[str, bytes] = {}
        """The files taken in, by their channel's key."""
        self.blobs: dict[str, bytes] = {}
        """The files replies send, by blob id (a check puts them here)."""
        self._requests: dict[str, tuple[str, ApprovalView]] = {}
        self._refusing: int | None = 0

    def refuse(self, times: int | None = None) -> None:
        """Refuse the next `times` messages (None: every one until `refuse(0)`)."""
        self._refusing = times

    def open_request(self, request: Outbound) -> None:
        """An approval request of a thread now waits for a decision (the check delivers it)."""
        assert request.approval is not None, "an approval request carries its view"
        self._requests[request.approval.wait_id] = (request.thread.lane, request.approval)

    def texts(self, text: str) -> list[Inbound]:
        """The held messages whose text holds `text`."""
        return [m for m in self.messages.values() if text in m.text]

    async def accept(self, inbound: Inbound) -> Acceptance:
        """Hold `inbound` once per dedupe key (`InboundSink.accept`); refused while `refuse`d."""
        self.offered.append(inbound)
        if self._refusing is None or self._refusing > 0:
            if self._refusing is not None:
                self._refusing -= 1
            self.refusals += 1
            raise Unavailable("the suite's inbox is down")
        held = self.messages.setdefault(inbound.dedupe_key, inbound)
        item = f"m-{list(self.messages).index(inbound.dedupe_key) + 1}"
        lane = held.thread.lane  # a duplicate's: the first message's
        digests = (held.content_digest, inbound.content_digest)
        return Acceptance(
            item_id=item,
            session=SESSION,
            lane=lane,
            duplicate=held is not inbound,
            reused=None not in digests and digests[0] != digests[1],
        )

    async def take_files(
        self, thread: ThreadRef, files: Sequence[IncomingFile]
    ) -> tuple[Attachment, ...]:
        """Take files in under the default `FileLimits`, held in memory by key."""

        async def find(key: str) -> tuple[str, int] | None:
            data = self.files.get(key)
            return None if data is None else (f"mem:{key}", len(data))

        async def put(key: str, data: bytes) -> str:
            self.files[key] = data
            return f"mem:{key}"

        return await take_in(files, FileLimits(), find=find, put=put)

    async def decide(self, decision: DecisionInbound) -> Acceptance:
        """Judge `decision` against the open requests, then hold it once per slot."""
        lane = decision.thread.lane
        found = self._requests.get(decision.wait_id)
        if found is None or found[0] != lane:
            self.decisions_refused.append(decision)
            raise DecisionRefused(
                "no_wait", "Nothing waits for a decision here. Nothing was recorded."
            )
        view = found[1]
        given = sorted((d.tool_call_id, d.args_digest) for d in decision.decisions)
        wanted = sorted((c.tool_call_id, c.args_digest) for c in view.calls)
        if (
            decision.session not in (None, view.session)
            or decision.run_id != view.run_id
            or given != wanted
        ):
            self.decisions_refused.append(decision)
            raise DecisionRefused(
                "mismatch", "This decision does not match its request. Nothing was recorded."
            )
        first = self.decisions.setdefault(decision.slot, decision)
        item = f"d-{list(self.decisions).index(decision.slot) + 1}"
        if first is not decision:
            return Acceptance(item_id=item, session=SESSION, lane=lane, duplicate=True, first=first)
        return Acceptance(item_id=item, session=SESSION, lane=lane)

    async def known(self, thread: ThreadRef) -> KnownThread | None:
        """The thread, if a message of it is held."""
        held = [m for m in self.messages.values() if m.thread.lane == thread.lane]
        if not held:
            return None
        return KnownThread(thread=thread, session=SESSION, reply_context=held[-1].reply_context)

    async def threads(self, channel: str, space: str) -> tuple[KnownThread, ...]:
        """The held threads of `space` in `channel`."""
        refs = dict.fromkeys(
            m.thread
            for m in self.messages.values()
            if (m.thread.channel, m.thread.space) == (channel, space)
        )
        found = [await self.known(ref) for ref in refs]
        return tuple(known for known in found if known is not None)

    async def read_file(self, channel: str, space: str, blob: str) -> bytes | None:
        """A file held under `blob` (`files`), or None."""
        return self.blobs.get(blob)

    async def authority(self, change: AuthorityChange) -> None:
        """Hold an authority change the channel reported (in order, repeats included)."""
        self.authority_changes.append(change)

    async def get_mark(self, name: str) -> str | None:
        """A mark the adapter keeps."""
        return self.marks.get(name)

    async def put_mark(self, name: str, value: str, *, expect: str | None) -> bool:
        """Set a mark if it holds `expect` (a compare-and-set)."""
        if self.marks.get(name) != expect:
            return False
        self.marks[name] = value
        return True

    async def until(
        self, check: Callable[[], bool], what: Callable[[], str], timeout_s: float = ARRIVAL_S
    ) -> None:
        """Wait until `check()` holds; fail saying `what()` after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"after {timeout_s} s: {what()}")
            await asyncio.sleep(0.02)


@dataclass(frozen=True)
class ChannelCheck:
    """One channel-neutral check of one promise."""

    group: str
    name: str
    run: Callable[[ChannelRig], Awaitable[None]]

    @property
    def id(self) -> str:
        """A stable test id."""
        return f"{self.group}:{self.name}"

    @property
    def promise(self) -> str:
        """What the check holds the channel to (its docstring's first line)."""
        return (getattr(self.run, "__doc__", None) or "").strip().split("\n")[0]


_CHECKS: list[ChannelCheck] = []


def _check(group: str) -> Callable[[Callable[[ChannelRig], Awaitable[None]]], Any]:
    def register(fn: Callable[[ChannelRig], Awaitable[None]]) -> Any:
        _CHECKS.append(ChannelCheck(group, fn.__name__, fn))
        return fn

    return register


def channel_checks() -> tuple[ChannelCheck, ...]:
    """Every check, in a stable order."""
    return tuple(_CHECKS)


# ---------------------------------------------------------------------------------------------
# helpers


@dataclass
class _Subject:
    """A started adapter, its rig and its sink: what a check works with."""

    rig: ChannelRig
    adapter: ChannelAdapter
    sink: SuiteSink
    closed: bool = False

    @property
    def capabilities(self) -> Capabilities:
        return self.adapter.capabilities

    async def held(self, thread: str, text: str, *, author: str | None = None) -> Inbound:
        """Say `text` in `thread` (as the approver) and wait until the sink holds it."""
        said = await self.rig.say(thread, text, author=author or self.rig.approver)
        assert said.acked == (True,), f"a plain message was not acknowledged: {said}"
        return (await self.arrived(text))[0]

    async def arrived(self, text: str, count: int = 1) -> list[Inbound]:
        """The held messages holding `text`, once there are `count`."""
        await self.sink.until(
            lambda: len(self.sink.texts(text)) >= count,
            lambda: f"{count} message(s) with {text!r}; held {_texts(self.sink)}",
        )
        return self.sink.texts(text)

    async def close(self) -> float:
        """Stop, then close; the seconds both took (failing past `CLOSE_DEADLINE_S`)."""
        self.closed = True
        began = time.monotonic()
        try:
            async with asyncio.timeout(CLOSE_DEADLINE_S):
                await self.adapter.stop()
                await self.adapter.close()
        except TimeoutError:
            raise AssertionError(f"stop and close took over {CLOSE_DEADLINE_S} s") from None
        return time.monotonic() - began


@contextlib.asynccontextmanager
async def _running(rig: ChannelRig) -> AsyncIterator[_Subject]:
    adapter = rig.build()
    sink = SuiteSink()
    await adapter.start(sink)
    subject = _Subject(rig, adapter, sink)
    try:
        yield subject
    finally:
        if not subject.closed:
            await subject.close()


def _texts(sink: SuiteSink) -> list[str]:
    return [m.text[:80] for m in sink.messages.values()]


def _outbound(
    inbound: Inbound, delivery_id: str, text: str, kind: OutboundKind = "reply", **extra: Any
) -> Outbound:
    """A delivery into the thread of `inbound`, as the gateway makes one."""
    return Outbound(
        delivery_id=delivery_id,
        thread=inbound.thread,
        kind=kind,
        text=text,
        reply_context=inbound.reply_context,
        **extra,
    )


def _request(inbound: Inbound, n: int) -> Outbound:
    """Approval request number `n` of the thread of `inbound`: one call to ``deploy``."""
    args = {"service": "api", "version": n}
    call = PendingCall(
        tool_call_id=f"call-{n}", tool_name="deploy", args=args, args_digest=args_digest(args)
    )
    view = ApprovalView(session=SESSION, run_id=f"run-{n}", wait_id=f"wait-{n}", calls=(call,))
    return _outbound(
        inbound,
        f"approval:{SESSION}:wait-{n}",
        "May I deploy the api service?",
        "approval_request",
        approval=view,
    )


def _parts(rig: ChannelRig, posted: Sequence[Posted], delivery_id: str) -> list[Posted]:
    """The posted parts of `delivery_id`."""
    mark = rig.mark_of(delivery_id)
    return [p for p in posted if p.mark == mark]


def _whole(parts: Sequence[Posted]) -> bool:
    """Whether `parts` are one delivery, each part once: one message, or parts 0..n-1."""
    if not parts:
        return False
    numbers = sorted(-1 if p.part is None else p.part for p in parts)
    return numbers == [-1] or numbers == list(range(len(parts)))


async def _failure(delivery: Awaitable[Any]) -> DeliveryError | None:
    """The `DeliveryError` a delivery raised, or None if it succeeded."""
    try:
        await delivery
    except DeliveryError as exc:
        return exc
    return None


async def _as_the_outbox_does(adapter: ChannelAdapter, outbound: Outbound) -> list[DeliveryError]:
    """Deliver as the gateway's deliverer does: after an unknown outcome, reconcile first.

    Returns the errors on the way (a permanent one fails the check).
    """
    errors: list[DeliveryError] = []
    unknown = False
    for _ in range(5):
        if unknown:
            found = await adapter.reconcile(outbound)
            if found == "delivered":
                return errors
            if found == "unknown":
                continue
        try:
            await adapter.deliver(outbound)
        except DeliveryError as exc:
            errors.append(exc)
            unknown = unknown or exc.unknown_outcome
        else:
            return errors
        if errors[-1].permanent:
            raise AssertionError(f"a retryable send failed for good: {errors[-1].reason}")
    raise AssertionError(f"not delivered after 5 attempts: {[e.reason for e in errors]}")


def _decided_elsewhere(posted: Posted, request: Outbound) -> None:
    """A request nobody can decide in the channel says who can: an operator, naming the wait."""
    view = request.approval
    assert view is not None
    assert posted.controls == (), f"controls offered by a channel without decisions: {posted}"
    said = posted.text.lower()
    assert "operator" in said, f"the request does not say an operator decides it: {posted.text!r}"
    for name in (view.run_id, view.wait_id):
        assert name.lower() in said, f"the request does not name {name!r}: {posted.text!r}"


async def _the_request(subject: _Subject, thread: str, request: Outbound) -> Posted:
    """Deliver `request` (opened at the sink) and return its one posted copy."""
    subject.sink.open_request(request)
    await subject.adapter.deliver(request)
    copies = _parts(subject.rig, await subject.rig.seen(thread), request.delivery_id)
    assert len(copies) == 1, f"an approval request posted as {copies}"
    return copies[0]


# ---------------------------------------------------------------------------------------------
# contract


@_check("contract")
async def the_adapter_declares_what_the_service_reads(rig: ChannelRig) -> None:
    """A `ChannelAdapter` whose threads carry its name, whose body limits bound its own routes.

    The name is 1-32 of a-z and 0-9 from a letter (the registry's rule); `capabilities` is a
    `Capabilities`; every key of `body_limits` is a path prefix of one of `router`'s routes, with
    a positive bound (no router: no limits); a message it hands over names the channel.
    """
    async with _running(rig) as subject:
        adapter = subject.adapter
        assert isinstance(adapter, ChannelAdapter)
        assert _NAME.fullmatch(adapter.name), f"channel name {adapter.name!r}"
        assert isinstance(adapter.capabilities, Capabilities)
        router, limits = adapter.router, dict(adapter.body_limits)
        paths = [str(getattr(route, "path", "")) for route in router.routes] if router else []
        for prefix, bound in limits.items():
            assert prefix.startswith("/"), prefix
            assert bound > 0, (prefix, bound)
            assert any(path.startswith(prefix) for path in paths), (prefix, paths)
        inbound = await subject.held("named", "whose thread is this?")
        assert inbound.thread.channel == adapter.name, inbound.thread
        assert inbound.thread.lane == f"{adapter.name}:{inbound.thread.thread}", inbound.thread


# ---------------------------------------------------------------------------------------------
# inbound


@_check("inbound")
async def a_message_is_held_once_however_often_the_peer_sends_it(rig: ChannelRig) -> None:
    """Sent three times (two redeliveries), a message is held once and every send is acked.

    Every time the adapter hands it over it carries the same dedupe key: the identity of the
    peer's message, not of the delivery attempt.
    """
    async with _running(rig) as subject:
        said = await rig.say("once", "only once please", author=rig.approver, redeliver=2)
        held = await subject.arrived("only once please")
        assert len(held) == 1, f"one message held {len(held)} times: {held}"
        inbound = held[0]
        assert said.acked == (True, True, True), f"a redelivery was not acknowledged: {said}"
        offered = {m.dedupe_key for m in subject.sink.offered if "only once please" in m.text}
        assert offered == {inbound.dedupe_key}, f"one message, several keys: {offered}"


@_check("inbound")
async def a_message_is_acknowledged_only_once_the_sink_holds_it(rig: ChannelRig) -> None:
    """While the sink cannot hold a message (`Unavailable`), the peer is not acknowledged.

    The adapter offered it (the sink refused at least once) and nothing is held: the peer keeps
    it and sends it again, so nothing accepted is lost.
    """
    async with _running(rig) as subject:
        subject.sink.refuse()
        said = await rig.say("refused", "not while the inbox is down", author=rig.approver)
        assert said.acked == (False,), f"acknowledged while the sink could not hold it: {said}"
        assert subject.sink.refusals >= 1, "the adapter never offered the message"
        assert subject.sink.messages == {}, _texts(subject.sink)


@_check("inbound")
async def a_message_refused_once_is_held_once_when_sent_again(rig: ChannelRig) -> None:
    """Refused once by the sink, a message sent again is held once, and the peer acked at last."""
    async with _running(rig) as subject:
        subject.sink.refuse(1)
        said = await rig.say("retried", "after the inbox is back", author=rig.approver, redeliver=1)
        held = await subject.arrived("after the inbox is back")
        assert len(held) == 1, f"one message held {len(held)} times: {held}"
        inbound = held[0]
        assert said.acked[-1], f"the peer was never acknowledged: {said}"
        assert subject.sink.refusals == 1, f"refused {subject.sink.refusals} times"
        offered = {m.dedupe_key for m in subject.sink.offered if m.text == inbound.text}
        assert offered == {inbound.dedupe_key}, f"one message, several keys: {offered}"


@_check("inbound")
async def two_messages_with_the_same_words_are_two_and_a_thread_is_one_lane(
    rig: ChannelRig,
) -> None:
    """Two messages with the same words are two; in one thread they share a lane, not another's.

    Deduplication is by the peer's identity of a message, never by its text.
    """
    async with _running(rig) as subject:
        for thread in ("twice", "twice", "elsewhere"):
            said = await rig.say(thread, "the same words", author=rig.approver)
            assert said.acked == (True,), said
        held = await subject.arrived("the same words", 3)
        assert len({m.dedupe_key for m in held}) == 3, [m.dedupe_key for m in held]
        assert len({m.message_id for m in held}) == 3, [m.message_id for m in held]
        first, second, other = held
        assert first.thread == second.thread, (first.thread, second.thread)
        assert other.thread.lane != first.thread.lane, "two threads share a lane"


@_check("inbound")
async def hostile_input_is_refused_and_stores_nothing(rig: ChannelRig) -> None:
    """Every hostile input the rig knows is refused, nothing is held, and the channel still works.

    Refused: the peer was told (an HTTP 4xx) or the input was set aside (mail flagged handled,
    untaken). No message and no decision reaches the sink's store; a genuine message after them
    is held as usual.
    """
    async with _running(rig) as subject:
        inputs = rig.hostile()
        assert inputs, "the rig names no hostile input"
        outcome = {each.name: await each.send() for each in inputs}
        taken = [name for name, refused in outcome.items() if not refused]
        assert taken == [], f"not refused: {taken}"
        assert subject.sink.messages == {}, _texts(subject.sink)
        assert subject.sink.decisions == {}, list(subject.sink.decisions.values())
        await subject.held("after", "a genuine message after all that")


# ---------------------------------------------------------------------------------------------
# outbound


@_check("outbound")
async def every_posted_part_carries_its_delivery_id(rig: ChannelRig) -> None:
    """Every message the bot posts carries its delivery's mark, and receipts name what is posted.

    A reply longer than a message, a failure notice, an approval request and its reminder
    (``<request>:remind-1``, `is_copy_of`) are each posted whole (one message, or parts 0..n-1
    each once), marked with `ChannelRig.mark_of` of their delivery id; nothing else of the bot's
    is in the thread; each receipt names its delivery and exactly the messages posted.
    """
    async with _running(rig) as subject:
        inbound = await subject.held("ids", "tell me everything")
        request = _request(inbound, 1)
        reminder = request.model_copy(update={"delivery_id": request.delivery_id + ":remind-1"})
        assert is_copy_of(reminder.delivery_id, request.delivery_id)
        sent = [
            _outbound(inbound, "reply:run-0", LONG_TEXT),
            _outbound(inbound, "failure:run-0", "I could not finish this.", "failure_notice"),
            request,
            reminder,
        ]
        receipts = [await subject.adapter.deliver(outbound) for outbound in sent]
        posted = await rig.seen("ids")
        marks = {rig.mark_of(o.delivery_id) for o in sent}
        assert len(marks) == len(sent), "two deliveries share a mark"
        strays = [p for p in posted if p.mark not in marks]
        assert strays == [], f"posted without the mark of a delivery: {strays}"
        for outbound, receipt in zip(sent, receipts, strict=True):
            parts = _parts(rig, posted, outbound.delivery_id)
            assert _whole(parts), (outbound.delivery_id, parts)
            assert receipt.delivery_id == outbound.delivery_id, receipt
            assert set(receipt.channel_message_ids) == {p.id for p in parts}, (receipt, parts)


@_check("outbound")
async def reconcile_says_absent_before_a_send_and_delivered_after(rig: ChannelRig) -> None:
    """`reconcile` never claims a delivery that was not sent, and finds one that was.

    Without `Capabilities.reconciles` it cannot see the send: it says absent after it too
    (never unknown, which the outbox would retry until a dead letter), and the delivery sent
    again, as the outbox then does, is still held once.
    """
    async with _running(rig) as subject:
        inbound = await subject.held("reconcile", "answer me once")
        reply = _outbound(inbound, "reply:run-1", "Here is the answer.")
        before = await subject.adapter.reconcile(reply)
        # unknown: a channel whose sends may land late waits out a doubt first (`Unsure`)
        assert before in ("absent", "unknown"), f"reconcile before any send: {before}"
        await subject.adapter.deliver(reply)
        after = await subject.adapter.reconcile(reply)
        if subject.capabilities.reconciles:
            assert after == "delivered", f"reconcile after a send: {after}"
        else:
            assert after == "absent", f"reconcile that cannot see, after a send: {after}"
            await subject.adapter.deliver(reply)
        assert len(_parts(rig, await rig.seen("reconcile"), reply.delivery_id)) == 1


@_check("outbound")
async def a_lost_ack_is_reconciled_and_nothing_is_posted_twice(rig: ChannelRig) -> None:
    """After a send whose answer was lost, `reconcile` says delivered; retries post nothing twice.

    A short reply whose answer is lost raises `DeliveryError` with an unknown outcome (never a
    permanent one), and `reconcile` then says ``delivered``. A long reply whose first answer is
    lost, delivered as the outbox does (reconcile after an unknown outcome, send what is absent),
    ends with every part posted exactly once. Without `Capabilities.reconciles`, `reconcile`
    says ``absent`` instead, and the short reply sent again is held once all the same.
    """
    async with _running(rig) as subject:
        adapter = subject.adapter
        inbound = await subject.held("lost", "answer even if you cannot hear back")
        short = _outbound(inbound, "reply:run-2", "A short answer.")
        rig.lose_next_ack()
        lost = await _failure(adapter.deliver(short))
        assert lost is not None, "a send whose answer was lost succeeded (the rig lost nothing?)"
        assert lost.unknown_outcome, lost.reason
        assert not lost.permanent, lost.reason
        expected = "delivered" if subject.capabilities.reconciles else "absent"
        found = await adapter.reconcile(short)
        assert found == expected, f"reconcile after a lost answer: {found}"
        if found == "absent":
            await adapter.deliver(short)  # what the outbox does with absent
        long = _outbound(inbound, "reply:run-3", LONG_TEXT)
        rig.lose_next_ack()
        errors = await _as_the_outbox_does(adapter, long)
        assert errors, "a send whose answer was lost succeeded (the rig lost nothing?)"
        assert errors[0].unknown_outcome, [e.reason for e in errors]
        found = await adapter.reconcile(long)
        assert found == expected, f"reconcile after the retries: {found}"
        posted = await rig.seen("lost")
        for outbound in (short, long):
            parts = _parts(rig, posted, outbound.delivery_id)
            assert _whole(parts), (outbound.delivery_id, parts)
        assert len(_parts(rig, posted, short.delivery_id)) == 1


# ---------------------------------------------------------------------------------------------
# approvals


@_check("approvals")
async def an_approval_request_is_decided_by_an_approver_once(rig: ChannelRig) -> None:
    """The approver's approval reaches the sink once, naming the request's wait, run and digests.

    With `Capabilities.decisions`: the posted request offers approve and deny. With
    `Capabilities.approvers`: the stranger's use of it is refused and stores nothing, then the
    approver's is held, as theirs, once (a second use is the same decision). Without an
    approver rule, anyone who reaches the channel decides: the stranger's use is held as
    theirs. A decision is `identified` exactly when the channel has an approver rule. Without
    decisions: the request offers no control and says an operator decides it, naming its run
    and wait.
    """
    async with _running(rig) as subject:
        inbound = await subject.held("approve", "please deploy the api")
        request = _request(inbound, 2)
        posted = await _the_request(subject, "approve", request)
        if not subject.capabilities.decisions:
            _decided_elsewhere(posted, request)
            return
        # approve and deny at least; a channel may offer more (Slack's "Done it myself", D263)
        assert {"approve", "deny"} <= set(posted.controls), posted
        decider = rig.stranger
        if subject.capabilities.approvers:
            await rig.decide(posted, approve=True, as_user=rig.stranger)
            assert subject.sink.decisions == {}, "a stranger's decision was held"
            decider = rig.approver
            await rig.decide(posted, approve=True, as_user=rig.approver)
        else:
            await rig.decide(posted, approve=True, as_user=rig.stranger)
        await subject.sink.until(
            lambda: len(subject.sink.decisions) >= 1,
            lambda: f"no decision held; refused: {subject.sink.decisions_refused}",
        )
        await rig.decide(posted, approve=True, as_user=decider)  # a second click, the same
        decisions = list(subject.sink.decisions.values())
        assert len(decisions) == 1, f"one click, {len(decisions)} decisions: {decisions}"
        decision = decisions[0]
        view = request.approval
        assert view is not None
        assert (decision.wait_id, decision.run_id) == (view.wait_id, view.run_id)
        assert decision.thread.lane == inbound.thread.lane, decision.thread
        assert decision.session in (None, SESSION)
        assert [(d.tool_call_id, d.args_digest, d.approved) for d in decision.decisions] == [
            (c.tool_call_id, c.args_digest, True) for c in view.calls
        ]
        assert decision.decided_by.id == decider, decision.decided_by
        # only a channel that checks who decides vouches for them (D297)
        assert decision.identified == subject.capabilities.approvers, decision


@_check("approvals")
async def a_denial_arrives_as_a_denial(rig: ChannelRig) -> None:
    """The approver's denial reaches the sink once, every call denied.

    Without `Capabilities.decisions`: as for an approval, the request says an operator decides.
    """
    async with _running(rig) as subject:
        inbound = await subject.held("deny", "please deploy, or not")
        request = _request(inbound, 3)
        posted = await _the_request(subject, "deny", request)
        if not subject.capabilities.decisions:
            _decided_elsewhere(posted, request)
            return
        await rig.decide(posted, approve=False, as_user=rig.approver)
        await subject.sink.until(
            lambda: len(subject.sink.decisions) >= 1,
            lambda: f"no denial held; refused: {subject.sink.decisions_refused}",
        )
        decisions = list(subject.sink.decisions.values())
        assert len(decisions) == 1, f"one click, {len(decisions)} decisions: {decisions}"
        decision = decisions[0]
        assert decision.wait_id == "wait-3", decision
        assert [d.approved for d in decision.decisions] == [False], decision.decisions
        assert decision.decided_by.id == rig.approver, decision.decided_by


@_check("approvals")
async def a_close_reaches_every_copy_of_its_request(rig: ChannelRig) -> None:
    """The close of a request reaches its request and its reminder, whatever the channel can do.

    With `Capabilities.edits`: every copy (`is_copy_of` the request) is left without controls.
    Without: the thread is told, in a message marked with the close's delivery id. Either way
    each copy is still posted once.
    """
    async with _running(rig) as subject:
        inbound = await subject.held("close", "deploy, then forget it")
        request = _request(inbound, 4)
        reminder = request.model_copy(update={"delivery_id": request.delivery_id + ":remind-1"})
        subject.sink.open_request(request)
        for outbound in (request, reminder):
            await subject.adapter.deliver(outbound)
        view = request.approval
        assert view is not None
        closed = ApprovalClosed(
            session=SESSION,
            run_id=view.run_id,
            wait_id=view.wait_id,
            request_delivery_id=request.delivery_id,
            requested_at_ms=inbound.received_at_ms,
            outcome="approved",
            by="operator:alice",
            at_ms=inbound.received_at_ms + 1000,
        )
        close = _outbound(
            inbound,
            f"approval_closed:{view.wait_id}",
            "Approved by operator:alice.",
            "approval_closed",
            closed=closed,
        )
        await subject.adapter.deliver(close)
        posted = await rig.seen("close")
        copies = [
            p
            for outbound in (request, reminder)
            if is_copy_of(outbound.delivery_id, closed.request_delivery_id)
            for p in _parts(rig, posted, outbound.delivery_id)
        ]
        assert len(copies) == 2, copies
        if subject.capabilities.edits:
            assert [p for p in copies if p.controls] == [], copies
        else:
            told = _parts(rig, posted, close.delivery_id)
            assert told, f"the thread was not told of the close: {posted}"


# ---------------------------------------------------------------------------------------------
# lifecycle


@_check("lifecycle")
async def after_stop_nothing_is_taken_and_deliveries_still_go_out(rig: ChannelRig) -> None:
    """After `stop`, no message or decision is taken and the peer is not acked; `deliver` works.

    A draining service stops its channels first, then delivers what its last steps replied:
    a reply delivered after `stop` is posted. `stop` again changes nothing.
    """
    async with _running(rig) as subject:
        inbound = await subject.held("stop", "before the stop")
        request = _request(inbound, 5)
        posted = await _the_request(subject, "stop", request)
        await subject.adapter.stop()
        said = await rig.say("stop", "after the stop", author=rig.approver)
        assert not any(said.acked), f"acknowledged after stop: {said}"
        if subject.capabilities.decisions:
            await rig.decide(posted, approve=True, as_user=rig.approver)
        reply = _outbound(inbound, "reply:run-5", "Delivered while draining.")
        await subject.adapter.deliver(reply)
        assert len(_parts(rig, await rig.seen("stop"), reply.delivery_id)) == 1
        await subject.adapter.stop()
        assert list(subject.sink.messages.values()) == [inbound], _texts(subject.sink)
        assert subject.sink.decisions == {}, "a decision was taken after stop"


@_check("lifecycle")
async def stop_and_close_end_within_the_deadline_even_with_a_hung_peer(rig: ChannelRig) -> None:
    """`stop` then `close` take at most `CLOSE_DEADLINE_S`, with a send hung on a hung peer.

    Where the rig can hang its peer, a delivery is in flight on it meanwhile: close does not
    wait for it, and it ends at once when the caller cancels it (the deliverer's timeout).
    """
    async with _running(rig) as subject:
        inbound = await subject.held("hang", "are you still there?")
        in_flight: asyncio.Future[Any] | None = None
        done: set[asyncio.Future[Any]] = set()
        if await rig.hang():
            reply = _outbound(inbound, "reply:run-6", "Into the void.")
            in_flight = asyncio.ensure_future(subject.adapter.deliver(reply))
            await asyncio.sleep(0.3)  # it is on its way, and stuck
            assert not in_flight.done(), "the send did not hang (does the rig's hang hang?)"
        try:
            took = await subject.close()
            assert took <= CLOSE_DEADLINE_S, f"stop and close took {took:.1f} s"
        finally:
            if in_flight is not None:
                in_flight.cancel()
                done, _ = await asyncio.wait({in_flight}, timeout=1.0)
                if done and not in_flight.cancelled():
                    in_flight.exception()  # it failed instead (the peer hung up): no matter
        assert in_flight is None or done, "a send on a hung peer did not end when cancelled"
