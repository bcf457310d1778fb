"""The channel seam: what Slack, email and the web channel exchange with the gateway.

An adapter turns its channel's events into `Inbound` messages (and `DecisionInbound` button
clicks) and hands them to the gateway's `InboundSink`, which returns only once the message is in
the durable inbox: the adapter acknowledges its channel (HTTP 200 to Slack, marking an email
handled, 202 to a web client) **after** that, never before, so nothing accepted is lost. The
gateway hands back replies as `Outbound`; `deliver` sends one and `reconcile` says whether an
earlier attempt whose outcome is unknown (a timeout, a reset after sending) actually arrived,
so a retry never posts twice.

A thread is a lane: `ThreadRef.lane` is the lane name (`web:<thread>`, `slack:<channel>:<ts>`,
`email:<root Message-ID>`); `ThreadRef.space` is what routing binds to a session (a web space,
a Slack channel, the bot's email address).
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from fastapi import APIRouter
from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from adapters.errors import AdapterError
from harness_core import SuppliedResult
from harness_core.frozen import Frozen, FrozenJsonObject

__all__ = [
    "Acceptance",
    "AdapterStartError",
    "Capabilities",
    "ApprovalClosed",
    "ApprovalView",
    "Attachment",
    "Author",
    "AuthorityChange",
    "ChannelAdapter",
    "ContextMessage",
    "DecisionInbound",
    "DecisionItem",
    "DecisionRefused",
    "DeliveryError",
    "DeliveryReceipt",
    "FileRefused",
    "GivesUp",
    "Inbound",
    "InboundSink",
    "IncomingFile",
    "KnownThread",
    "NotRouted",
    "OutboundKind",
    "Outbound",
    "PendingCall",
    "Reconciled",
    "TextCut",
    "ThreadRef",
    "Unavailable",
    "is_copy_of",
    "result_line",
]


class Capabilities(Frozen):
    """What a channel can do; the service and the conformance suite read it, never a name."""

    threads: bool = True
    """Replies land in the thread they answer (a lane per thread)."""
    decisions: bool = False
    """Approval requests carry controls whose use arrives as a `DecisionInbound` (Slack and web
    buttons, signed email links)."""
    approvers: bool = False
    """Only the approvers a deployment names may decide: anyone else's use of a control is
    refused and stores nothing (Slack's configured approvers; email links minted for, and
    checked against, approver addresses), and the channel vouches for who decided: its
    decisions are `DecisionInbound.identified`. False: whoever reaches the channel decides (the
    web channel, bound to a trusted interface), and a profile's named approvers are not
    decided there (D297)."""
    edits: bool = False
    """A posted message can be edited in place (an approval close edits its copies)."""
    reconciles: bool = True
    """`reconcile` finds an earlier attempt of a delivery. False: it cannot see one, so it
    answers ``absent`` and the delivery is sent again under the same identity, which the peer
    drops: the thread still holds it once (a webhook without a status URL, D195, D197)."""
    streaming: bool = False
    """A reply can be streamed into the thread while the model writes it."""
    files: bool = False
    """Files can be taken in with a message (`InboundSink.take_files`) and sent with a reply
    (`Outbound.files`: an upload into the thread, an email attachment, a download link),
    exactly once under the reply's delivery id. False: a reply's files are named in its text
    only (D229)."""


class ThreadRef(Frozen):
    """A conversation in a channel: one lane of one session."""

    channel: str
    """The adapter's name: ``web``, ``slack``, ``email`` (or a test's)."""
    space: str
    """What routing binds to a session: a web space, a Slack channel id, the bot's address."""
    thread: str
    """The thread's identity within its channel: a web thread id, ``<channel>:<thread_ts>``
    for Slack, the root ``Message-ID`` for email."""

    @property
    def lane(self) -> str:
        """The lane name of this thread (a permanent key: the same thread, the same lane).

        A lane is one thread of one space: a thread id another space of the session began is
        refused (D332), so a channel whose ids are chosen per space keeps them apart.
        """
        return f"{self.channel}:{self.thread}"


class Author(Frozen):
    """Who wrote a message, as the channel identifies them."""

    id: str
    name: str | None = None
    is_bot: bool = False


class Attachment(Frozen):
    """A file sent with a message: its metadata, and where its content is held if taken in.

    The content never travels through the inbox: it is in the gateway's blob area under
    `blob` (`InboundSink.take_files`), put there before the message was accepted.
    """

    name: str
    media_type: str
    size: int = Field(ge=0)
    """Bytes."""
    ref: str | None = None
    """Where the channel keeps it (a URL or an id), if anywhere."""
    blob: str | None = None
    """The blob holding its content (``sha256:<hex>``), when it was taken in."""
    refused: str | None = None
    """Why it was not taken in (too large, a type the agent does not read...), one short
    sentence the agent and the thread are told."""

    @field_validator("name")
    @classmethod
    def _shown_as_it_is(cls, name: str) -> str:
        """Without invisible or direction-changing characters (Unicode Cf, Co).

        ``invoice\u202efdp.exe`` reads as ``invoiceexe.pdf`` in the thread, in notices and to
        the agent; a file's name is never a place for them (an outside probe).
        """
        if not any(unicodedata.category(c) in _HIDDEN for c in name):
            return name
        return "".join(c for c in name if unicodedata.category(c) not in _HIDDEN) or "file"


_HIDDEN = frozenset({"Cf", "Co"})
"""Unicode categories of characters that change how a name reads without showing."""


class FileRefused(AdapterError):
    """A file that cannot be taken in (a fetch that can never succeed); `str()` says why."""


@dataclass(frozen=True)
class IncomingFile:
    """A file a message names, as a channel offers it to `InboundSink.take_files`."""

    attachment: Attachment
    """Its metadata as the channel declares it (the size may be a claim, checked on fetch)."""
    key: str
    """The channel's permanent identity of this file (a Slack file id, an email's Message-ID
    and part number, a web upload's id): a file taken in under it is never fetched again."""
    fetch: Callable[[int], Awaitable[bytes]]
    """Its content; given the most bytes taken, it may stop reading past that (what it returns
    beyond the limit is refused). Raises `FileRefused` when it can never succeed (a host that
    is not the channel's, a file deleted), anything else when it may succeed later."""


class TextCut(Frozen):
    """A message's text was longer than its channel takes: how much of it the agent gets.

    Counted in characters (Unicode code points), as the person wrote them. The agent's user
    message says so, and the thread is told once (decision D169).
    """

    kept: int = Field(ge=0)
    """The characters the agent gets (the first ones; a cut never splits a character)."""
    total: int | None = Field(default=None, ge=0)
    """The characters the person wrote; None when the message was too large to count."""
    message_bytes: int | None = Field(default=None, ge=0)
    """Set when the whole message was larger than the channel reads: its size (email: only
    its header was read; `kept` is then the subject's characters, if any)."""
    limit_bytes: int | None = Field(default=None, ge=0)
    """The largest message the channel reads (with `message_bytes`)."""


class ContextMessage(Frozen):
    """An earlier message of a thread, shown to a lane that starts in the middle of it."""

    author: Author
    text: str


class Inbound(Frozen):
    """A message in a thread, as an adapter hands it to the gateway."""

    thread: ThreadRef
    message_id: str = Field(min_length=1, max_length=512)
    """The channel's identity of this message (Slack ``channel:ts``, an email ``Message-ID``,
    a web client's message id): the inbox deduplicates on it, and the lane's user-message entry
    id derives from it, so the same message is never accepted twice."""
    author: Author
    text: str
    attachments: tuple[Attachment, ...] = ()
    received_at_ms: int
    reply_context: FrozenJsonObject = Field(default_factory=dict)
    """What a reply in this thread needs besides the `ThreadRef` (email: the ``Message-ID`` and
    ``References`` to answer, the subject and recipients; Slack: nothing more). Opaque to the
    gateway; the newest one of a lane is handed back with its replies."""
    context: tuple[ContextMessage, ...] = ()
    """The thread's earlier messages, oldest first, when the bot is called into a conversation
    that began without it (Slack: the thread before the first mention). The lane sees them
    with this message only if the message starts it (a lane holding entries has its own)."""
    context_omitted: int = Field(default=0, ge=0)
    """Earlier messages of the thread left out of `context` (older than those it holds)."""
    cut: TextCut | None = None
    """Set when `text` is only the start of what the person wrote (the channel's limit)."""
    unlisted_attachments: int = Field(default=0, ge=0)
    """Attachments beyond the channel's limit of listed ones (the agent is told how many)."""
    content_digest: str | None = Field(default=None, min_length=1, max_length=128)
    """A digest of what identifies the message besides its id (email: its From, Date and
    Subject), the same each time the channel reads the same message. With it the gateway tells
    a message sent again from another that reuses its id (`Acceptance.reused`); None: the id
    alone decides (D382)."""

    @property
    def dedupe_key(self) -> str:
        """The inbox's key for this message: channel, space and message id."""
        return f"{self.thread.channel}:{self.thread.space}:{self.message_id}"


class DecisionItem(Frozen):
    """One call's decision from a channel (an Approve or Deny button, or a supplied result)."""

    tool_call_id: str
    args_digest: str
    approved: bool
    reason: str | None = None
    supplied: SuppliedResult | None = None
    """The call's result, given instead of running the tool: the decider did the action
    themselves (``approved`` is True; D236, D263)."""

    @model_validator(mode="after")
    def _supplied_only_when_approved(self) -> DecisionItem:
        if self.supplied is not None and not self.approved:
            raise ValueError("a supplied result stands for an approved call")
        return self

    @model_serializer(mode="wrap")
    def _supplied_only_when_given(self, handler: SerializerFunctionWrapHandler) -> Any:
        # an item without a supplied result encodes as before D263: the keys web clicks were
        # deduplicated on, and the items the inbox and the web mailbox hold, read the same
        data = handler(self)
        if self.supplied is None and isinstance(data, dict):
            data.pop("supplied", None)
        return data


RESULT_LINE_CHARS = 200
"""How much of a supplied result a thread or a timeline shows (its first line)."""


def result_line(text: str, limit: int = RESULT_LINE_CHARS) -> str:
    """A supplied result as one short line: its first non-blank line, an ellipsis if more."""
    lines = [" ".join(line.split()) for line in text.splitlines()]
    kept = [line for line in lines if line]
    first = kept[0] if kept else ""
    if len(first) > limit:
        return first[: limit - 1] + "…"
    return first + ("…" if len(kept) > 1 else "")


class DecisionInbound(Frozen):
    """A person decided an approval request in a channel (one click: one or more calls)."""

    thread: ThreadRef
    run_id: str
    wait_id: str
    decisions: tuple[DecisionItem, ...] = Field(min_length=1)
    decided_by: Author
    idempotency_key: str = Field(min_length=1)
    """The channel's identity of the click (Slack's ``slack:<wait>``, a web client's key...): a
    retried or double-clicked button is the same decision."""
    received_at_ms: int
    session: str | None = None
    """The session the request named, when the channel carries it back (Slack's button value,
    an email link): checked against the session the thread routes to."""
    identified: bool = False
    """The channel vouches for `decided_by`: Slack's signed click, an email link signed for the
    approver, a signed webhook's sender. False (the web page, which has no login: whoever
    clicks names themselves): a thread whose approvers are named does not take the decision,
    since anyone could type a name; an operator decides it."""

    @property
    def slot(self) -> str:
        """The decision's identity: its key bound to the wait, the run and the exact batch.

        The inbox deduplicates on it and the lane records the decision under it, so a click
        naming other calls or digests under the same key never takes the genuine click's slot,
        and a key reused for another wait is another decision. Who decided and how are not part
        of it: two approvers deciding the same request share a slot, and the second learns who
        took it (`Acceptance.first`).
        """
        calls = sorted((d.tool_call_id, d.args_digest) for d in self.decisions)
        canonical = json.dumps(
            [self.idempotency_key, self.wait_id, self.run_id, calls], separators=(",", ":")
        )
        return "d-" + hashlib.sha256(canonical.encode()).hexdigest()[:40]


class DecisionRefused(AdapterError):
    """A decision that can change nothing: nothing was stored, and `str()` tells the person why.

    `code` is ``no_wait`` (nothing waits for a decision under that id in this thread),
    ``mismatch`` (it names another run, session, calls or arguments than the request's) or
    ``closed`` (the request is no longer waiting: `closed` says how and who closed it) or
    ``not_allowed`` (the decider is not among the approvers the deployment names for it).
    """

    def __init__(
        self,
        code: Literal["no_wait", "mismatch", "closed", "not_allowed"],
        message: str,
        closed: ApprovalClosed | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.closed = closed


class Acceptance(Frozen):
    """The gateway holds an inbound message durably: the adapter may acknowledge it now."""

    item_id: str
    session: str
    lane: str
    """The lane holding the item: for a duplicate, the first message's (a lane other than the
    thread's says its id was reused there, not that this message was sent again)."""
    duplicate: bool = False
    """The message was accepted before (a channel retry): acknowledge it, do nothing else."""
    first: DecisionInbound | None = None
    """For a duplicate decision: the one accepted first for the same idempotency key (who
    decided, and how), so a second clicker can be told."""
    revoked: bool = False
    """The thread's authority is revoked: the message is kept and never run, and nothing is
    to be said in the thread (no working reaction either)."""
    reused: bool = False
    """A duplicate whose first message has another `Inbound.content_digest`: the id was
    reused for a different message (a sender's bug), not sent again. Nothing was taken; the
    channel gives this message an id of its own and accepts it again (D382)."""

    @model_serializer(mode="wrap")
    def _flags_only_when_set(self, handler: SerializerFunctionWrapHandler) -> Any:
        # what a channel answers its peer with (the web channel's 202) stays as it was (D267)
        data = handler(self)
        if isinstance(data, dict):
            for flag in ("revoked", "reused"):
                if not getattr(self, flag):
                    data.pop(flag, None)
        return data


class KnownThread(Frozen):
    """A thread a lane already holds (a message of it was accepted), as the gateway knows it."""

    thread: ThreadRef
    session: str
    reply_context: FrozenJsonObject = Field(default_factory=dict)
    """The newest `Inbound.reply_context` accepted in the thread."""


class AuthorityChange(Frozen):
    """The channel says the bot lost, or got back, the right to act and speak somewhere.

    Slack: the bot was removed from a channel, or the channel was archived or deleted (`space`
    is the channel); the app was uninstalled or its bot token revoked (`space` None: every
    thread of the channel). Back: the bot was added to the channel again, or it was unarchived.
    """

    channel: str
    """The adapter's name (``ThreadRef.channel`` of the threads concerned)."""
    space: str | None = None
    """The space concerned (a Slack channel id); None: every space of the channel."""
    revoked: bool = True
    """True: the authority is withdrawn; False: it is back."""
    cause: str = Field(min_length=1, max_length=64)
    """The channel's event (``member_left_channel``, ``channel_archive``, ``app_uninstalled``)."""
    why: str = Field(min_length=1, max_length=300)
    """What happened, in words an operator reads."""
    by: str | None = Field(default=None, max_length=200)
    """Who did it, as the channel names them (a user id), when it says."""
    lifts: tuple[str, ...] = ()
    """A restore lifts only a revocation with one of these causes (a channel's own event
    never lifts an operator's revocation, nor one of another kind)."""
    at_ms: int


class AdapterStartError(AdapterError):
    """An adapter cannot start (a credential its channel refuses); ``str()`` is one line."""


class NotRouted(AdapterError):
    """No binding routes this thread's space to a session (the adapter refuses it, clearly)."""


class Unavailable(AdapterError):
    """The gateway cannot hold the message durably now: do not acknowledge; the channel retries."""


class InboundSink(Protocol):
    """The gateway side of the seam: adapters hand it what arrives."""

    async def accept(self, inbound: Inbound) -> Acceptance:
        """Hold `inbound` durably (inbox), deduplicated by its `dedupe_key`; then return.

        A duplicate whose first message has another `Inbound.content_digest` holds nothing
        and says `reused`: the adapter accepts it again under an id of its own.

        Raises:
            NotRouted: no session is bound to the thread's space.
            Unavailable: the inbox could not be written; the adapter must not acknowledge.
        """
        ...

    async def take_files(
        self, thread: ThreadRef, files: Sequence[IncomingFile]
    ) -> tuple[Attachment, ...]:
        """Take in the files of a message about to be accepted: hold each one's content durably.

        Call it before `accept`, and accept the message with what it returns: each attachment
        with `blob` set (its content held) or `refused` set (not taken: over a limit, a type
        the agent does not read, a fetch that can never succeed). A file held under its key
        already (a retried event after a crash) is not fetched again. A refusal stores nothing
        of that file; the thread is told when the message is accepted.

        Raises:
            NotRouted: no session is bound to the thread's space.
            Unavailable: a file could not be fetched or held now; the adapter must not
                acknowledge (the channel retries, and what was held is not fetched again).
        """
        ...

    async def read_file(self, channel: str, space: str, blob: str) -> bytes | None:
        """The content of a reply's file (an `Outbound.files` blob) held for `space`'s session.

        None when it is not held (unknown, or past its retention).

        Raises:
            NotRouted: no session is bound to the space.
            Unavailable: the blob area cannot be read now.
        """
        ...

    async def decide(self, decision: DecisionInbound) -> Acceptance:
        """Hold a decision durably; the worker holding the session applies it to the lane.

        The decision is checked against the request it names first (the thread's wait, its
        run, session, calls and digests, still open): one that can change nothing is refused
        and stores nothing. The first decision for an idempotency key wins: a later one with
        the same key is a duplicate, and `Acceptance.first` is the decision that won.

        Raises:
            DecisionRefused: the decision can change nothing (say `str(exc)` to the decider).
            NotRouted, Unavailable: as `accept`.
        """
        ...

    async def known(self, thread: ThreadRef) -> KnownThread | None:
        """The thread if a lane already holds it, else None (a thread the bot is not in).

        Raises:
            NotRouted: no session is bound to the thread's space.
            Unavailable: the gateway cannot tell now.
        """
        ...

    async def threads(self, channel: str, space: str) -> tuple[KnownThread, ...]:
        """Every thread of `space` in `channel` a lane holds (for a backfill after downtime).

        Raises:
            NotRouted, Unavailable: as `known`.
        """
        ...

    async def authority(self, change: AuthorityChange) -> None:
        """Record that the bot lost (or got back) its authority in a space or the whole channel.

        Durable on return: acknowledge the channel only then. Idempotent: a change that holds
        already changes nothing. A revocation holds at once: nothing more is posted there, the
        open runs of its threads end ``authority_revoked``, and its new messages are kept, not
        run (D267).

        Raises:
            Unavailable: it could not be recorded now; the adapter must not acknowledge.
        """
        ...

    async def get_mark(self, name: str) -> str | None:
        """A durable mark the adapter keeps (an IMAP mailbox's watermark); None if never set.

        Raises:
            Unavailable: the gateway cannot tell now.
        """
        ...

    async def put_mark(self, name: str, value: str, *, expect: str | None) -> bool:
        """Set a mark if it holds `expect` (None: unset): a compare-and-set; whether it did.

        Raises:
            Unavailable: the mark could not be written.
        """
        ...


class PendingCall(Frozen):
    """A call waiting for a decision, as an approval request shows it."""

    tool_call_id: str
    tool_name: str
    args: FrozenJsonObject
    args_digest: str


class ApprovalView(Frozen):
    """What an approval request renders: the wait it belongs to and its calls."""

    session: str
    run_id: str
    wait_id: str
    calls: tuple[PendingCall, ...]


class ApprovalClosed(Frozen):
    """An approval request that no longer waits: what closes every posted copy of it."""

    session: str
    run_id: str
    wait_id: str
    request_delivery_id: str
    """The request's delivery id; its reminders' are this plus ``:remind-<n>`` (`is_copy_of`)."""
    requested_at_ms: int
    """When the request was made (a channel looks for its copies from then on)."""
    outcome: Literal["approved", "denied", "supplied", "decided", "stopped", "ended"]
    """``supplied``: the decider gave every call's result (nothing ran); ``decided``: the calls
    were decided differently (some approved, some denied...); ``ended``: the run ended
    otherwise."""
    by: str | None = None
    """Who closed it (a channel user id, ``operator:<name>``...), when known."""
    at_ms: int
    reason: str | None = None
    """A denial's reason, if one was given."""
    result: str | None = None
    """A supplied result's first line (`result_line`; the first call's, when several were)."""
    result_is_error: bool = False
    """That supplied result says the action failed."""


def is_copy_of(delivery_id: str, request_delivery_id: str) -> bool:
    """Whether `delivery_id` posted the request `request_delivery_id` (itself or a reminder)."""
    return delivery_id == request_delivery_id or delivery_id.startswith(
        request_delivery_id + ":remind-"
    )


OutboundKind = Literal["reply", "approval_request", "failure_notice", "approval_closed"]


class Outbound(Frozen):
    """A message the gateway sends into a thread; `delivery_id` derives from what caused it."""

    delivery_id: str
    """Stable across retries and re-enqueues (from the operation: ``reply:<run id>``...)."""
    thread: ThreadRef
    kind: OutboundKind
    text: str
    """Markdown; the adapter converts it to its channel's format and splits it at its limits."""
    approval: ApprovalView | None = None
    """For ``approval_request``: the buttons to render."""
    closed: ApprovalClosed | None = None
    """For ``approval_closed``: the request whose posted copies no longer wait (a channel that
    can edit what it posted closes each copy; one that cannot says so in the thread)."""
    reply_context: FrozenJsonObject = Field(default_factory=dict)
    """The newest `Inbound.reply_context` of the thread."""
    answers: bool = True
    """Whether it answers the thread's open messages (Slack takes its working reaction off
    them); a notice sent as a message arrives, before the agent answers it, does not."""
    files: tuple[Attachment, ...] = ()
    """Files sent with it (what the run's tools returned), each held as a blob of the session
    (`Attachment.blob`): the adapter reads them with `InboundSink.read_file` and sends them
    with this delivery, under its `delivery_id` (D228)."""


class DeliveryReceipt(Frozen):
    """A delivered message: what the channel calls the parts it posted."""

    delivery_id: str
    channel_message_ids: tuple[str, ...] = ()
    delivered_at_ms: int


Reconciled = Literal["delivered", "absent", "unknown"]
"""Whether an earlier attempt of a delivery reached the channel: it did (do not send again), it
did not (send), or the channel cannot tell now (retry later)."""


class DeliveryError(AdapterError):
    """A delivery that did not (certainly) happen.

    `reason` is short and secret-free (it is stored with the delivery and shown to operators).
    `unknown_outcome` means the send may have reached the channel (a timeout after sending): the
    next attempt reconciles first. `permanent` means retrying cannot help (a thread that no
    longer exists): the delivery becomes a dead letter at once. `retry_after_s` is the channel's
    own hint (Slack's ``Retry-After``).
    """

    def __init__(
        self,
        reason: str,
        *,
        unknown_outcome: bool = False,
        permanent: bool = False,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.unknown_outcome = unknown_outcome
        self.permanent = permanent
        self.retry_after_s = retry_after_s


@runtime_checkable
class GivesUp(Protocol):
    """A channel told when the gateway gives one of its deliveries up (optional).

    A dead letter is settled by the deliverer, often after its last retry, when the adapter's
    own `deliver` could not know it was the last: a thread that showed "working on it" went on
    showing it (Slack's working reaction) though no answer was coming.
    """

    async def given_up(self, outbound: Outbound, reason: str) -> None:
        """`outbound` became a dead letter: show it in its thread where the channel can.

        Best effort and quick (what talks to the channel runs in the background); never raises.
        """
        ...


@runtime_checkable
class ChannelAdapter(Protocol):
    """One channel (the contract every adapter meets; its tests run against a real peer).

    Inbound: between `start` and `stop` the adapter receives its channel's events and hands each
    message to the sink (`accept`) and each button click to `decide`, acknowledging the channel
    only after the sink returned. It ignores its own bot's messages.

    Outbound: `deliver` renders an `Outbound` by its kind (a reply; an approval request with
    Approve/Deny controls carrying the wait and the argument digests; a short failure notice;
    the close of an approval request, which edits every posted copy of it to say who closed it,
    or says so in the thread where the channel cannot edit), converts Markdown, splits at the
    channel's limits, and posts into the thread; every part it posts carries the `delivery_id`
    where the channel allows (Slack metadata, an email's ``Message-ID``) so `reconcile` can
    find it.
    """

    @property
    def name(self) -> str:
        """The channel's name (``ThreadRef.channel`` of its threads)."""
        ...

    async def start(self, sink: InboundSink) -> None:
        """Begin receiving (open sockets, IMAP IDLE...); returns once running.

        Raises:
            AdapterStartError: the channel refuses this adapter's credentials (a channel that is
                only unreachable is not an error: the adapter keeps trying).
        """
        ...

    async def stop(self) -> None:
        """Stop receiving and release connections (idempotent)."""
        ...

    async def deliver(self, outbound: Outbound) -> DeliveryReceipt:
        """Send `outbound` into its thread.

        Raises:
            DeliveryError: it was not delivered, or its outcome is unknown.
        """
        ...

    async def reconcile(self, outbound: Outbound) -> Reconciled:
        """Whether an earlier attempt of `outbound` (same `delivery_id`) reached the thread."""
        ...

    @property
    def capabilities(self) -> Capabilities:
        """What this channel can do (threads, decision controls, edits, streaming, files)."""
        ...

    @property
    def router(self) -> APIRouter | None:
        """The HTTP routes the service mounts for this channel (None: it needs none)."""
        ...

    @property
    def body_limits(self) -> Mapping[str, int]:
        """The largest request body in bytes, by path prefix of `router` (empty: the default)."""
        ...

    async def close(self) -> None:
        """Release what `stop` keeps for a restart (pools, files); called once, last."""
        ...
