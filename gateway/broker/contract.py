"""The broker contract (docstrings are spec): inbox, outbox, thread state, audit trail, blob area.

The store holds sessions; the broker holds what moves between the channels and the sessions.
Two implementations meet this contract and pass one conformance suite: Redis (streams, consumer
groups, Lua where a step must be atomic; any number of `gateway serve` processes share it) and
SQLite (one file, the embedded default). Rules for every method:

* **Durable on return.** A write is durable (to the backend's configured level) when its call
  returns; a write that raises left no trace.
* **Idempotent by identity.** Inbox items are deduplicated by their `dedupe_key` (kept at least
  `dedupe_ttl_ms` after they were appended), deliveries by their `delivery_id` (kept until
  purged after settling); a repeat changes nothing and returns what exists.
* **Nothing silently dropped.** An item leaves the inbox only by `ack` (accepted into its lane)
  or `reject` (never acceptable: kept, with its reason, for operators); a delivery leaves the
  outbox only as delivered, dead (with a reason) or discarded by an operator.
* **Times are milliseconds on the injected clock** (`now_ms` arguments where a caller decides
  time; the broker's own clock otherwise).
* **Keys are hash-tagged** (Redis): everything of one session shares the tag `{<session>}`, and
  the shared queues are sharded under their own tags, so the broker runs on Redis Cluster.
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

from pydantic import Field

from gateway.errors import GatewayError
from harness_core.frozen import Frozen, FrozenJsonObject

__all__ = [
    "Audit",
    "AuditEvent",
    "Backlog",
    "BlobInfo",
    "BlobRefused",
    "Blobs",
    "Broker",
    "BrokerError",
    "BrokerErrorCode",
    "BrokerParts",
    "ClaimedDelivery",
    "Delivery",
    "DeliveryStatus",
    "Inbox",
    "InboxAppend",
    "InboxItem",
    "InboxItemKind",
    "InboxStatus",
    "LaneTaken",
    "Marks",
    "NewAuditEvent",
    "NewInboxItem",
    "Operated",
    "Outbox",
    "SessionTicket",
    "ThreadState",
    "TicketHeld",
    "Threads",
]

InboxItemKind = Literal["message", "decision", "operator", "authority"]
"""``authority``: a revocation that asks the session's worker to end its revoked runs."""
InboxStatus = Literal["pending", "acked", "rejected"]

BrokerErrorCode = Literal[
    "invalid_url",  # a broker URL was refused (before anything was created or contacted)
    "closed",  # the broker was closed
    "storage",  # the backend failed (I/O, connection); a write's outcome may be unknown
]


class BrokerError(GatewayError):
    """The broker could not be opened or used; `code` says why."""

    def __init__(self, code: BrokerErrorCode, message: str) -> None:
        super().__init__(message)
        self.code: BrokerErrorCode = code


class LaneTaken(GatewayError):
    """An append named a lane whose thread is another space's (nothing was held).

    A lane is one thread: ``web:t1`` of web space ``lobby`` is not ``web:t1`` of space
    ``secure``, though both spaces may route to one session. `space` is the space the lane
    belongs to (for the log: the message does not name it).
    """

    def __init__(self, session: str, lane: str, space: str) -> None:
        # the other space is not named: the message reaches whoever wrote from this one
        super().__init__(
            f"thread {lane!r} belongs to another space of this session: "
            "write in a thread of another id"
        )
        self.session = session
        self.lane = lane
        self.space = space


class NewInboxItem(Frozen):
    """What an adapter's message (or button click) becomes in the inbox."""

    session: str
    lane: str
    dedupe_key: str = Field(min_length=1, max_length=1024)
    kind: InboxItemKind
    payload: FrozenJsonObject
    """The `Inbound` (or `DecisionInbound`) as JSON."""


class InboxItem(NewInboxItem):
    """An item of a session's inbox."""

    id: str
    """Assigned by the broker; a session's items sort by it (as strings) in append order."""
    appended_at_ms: int
    status: InboxStatus = "pending"
    """As of the call that returned the item (a duplicate `append` shows what became of it)."""
    reason: str | None = None
    """Why it was rejected (None unless ``status == "rejected"``)."""


class InboxAppend(Frozen):
    """The result of `Inbox.append`: the item, and whether it existed already."""

    item: InboxItem
    duplicate: bool = False
    mark: str | None = None
    """The value of the mark `append` was asked to read (``read_mark``); None: unset, or none
    was asked for."""


class SessionTicket(Frozen):
    """A session handed to one worker (until `done`, or until it expires)."""

    session: str
    ticket: str
    """Opaque: what `done` needs to release it."""


class TicketHeld(Frozen):
    """A session a worker holds a live ticket of (see `Inbox.held`)."""

    session: str
    worker: str
    """The worker that took it (its id, as given to `take_session`)."""
    expires_at_ms: int
    """When the ticket lapses unless renewed (the broker's clock)."""


class Backlog(Frozen):
    """How much waits, and for how long (for metrics and health)."""

    pending: int
    oldest_age_ms: int = 0
    dead: int = 0
    """Outbox: dead letters kept; inbox: rejected items kept."""


@runtime_checkable
class Inbox(Protocol):
    """Messages that arrived, by session, until a worker accepted them into their lanes."""

    async def append(
        self,
        item: NewInboxItem,
        *,
        thread: FrozenJsonObject | None = None,
        reply_context: FrozenJsonObject | None = None,
        read_mark: str | None = None,
    ) -> InboxAppend:
        """Hold `item` durably and mark its session ready.

        A `dedupe_key` appended before (within the dedupe window) returns that item with
        ``duplicate=True`` and changes nothing, whatever its state now (pending or acked).
        `thread` given: the item's lane's thread and newest `reply_context` (None: empty) are
        recorded as `Threads.remember` records them, in the same atomic write (not a
        duplicate's: it changes nothing, its reply context included): the intake's two writes
        in one. A lane whose recorded thread has another ``space`` than `thread` refuses the
        append, in the same write, before anything else (`LaneTaken`, nothing held), so two
        spaces of one session that use the same thread id never share a lane, whichever
        writes first. `read_mark` given: that mark's value, read no
        earlier than the append (as `Marks.get` would read it just after), is the result's
        `mark`, in the same call where the backend allows.
        """
        ...

    async def pending(
        self, session: str, *, limit: int = 100, after: str | None = None
    ) -> tuple[InboxItem, ...]:
        """The session's items neither acked nor rejected, oldest first, up to `limit`.

        `after`: only those after the item of that id (the last of a page read before; an id
        this broker never issued reads from the first).
        """
        ...

    async def ack(self, session: str, item_id: str) -> None:
        """The item was accepted into its lane (idempotent; unknown ids are ignored).

        An item settles once: the first `ack` or `reject` wins, later calls change nothing.
        """
        ...

    async def reject(self, session: str, item_id: str, reason: str) -> None:
        """The item can never be accepted (malformed, unroutable): keep it with `reason`.

        Idempotent like `ack` (the first settlement and its reason stay); unknown ids are ignored.
        """
        ...

    async def take_session(self, worker: str, *, wait_ms: int = 0) -> SessionTicket | None:
        """A session with pending items for `worker`, waiting up to `wait_ms` for one.

        A session is handed to one worker at a time; a ticket neither `done` nor renewed within
        the broker's visibility timeout is handed out again, pending items or not (its worker
        died, maybe mid-operation: the next one resumes it). This is a scheduling hint, not the
        lock: the store's writer lease decides who writes a session.

        Cancelling a take hands out nothing: a session it took as the cancellation came is
        handed back (ready for the next take at once, pending items or not: it may be a lapsed
        ticket's, whose operation is open) before the cancellation propagates, so a
        worker may take while it waits for something else and cancel the take when that comes.
        """
        ...

    async def position(self) -> int:
        """Where the inbox's news stands now: what `wait` counts from.

        Take it before reading what it guards (`pending`, `renew`): whatever happens after that
        read then wakes the `wait` that starts from it.
        """
        ...

    async def wait(self, session: str, *, since: int, timeout_ms: int) -> bool:
        """Whether `session` had news after `since` (a `position`), waiting up to `timeout_ms`.

        News: an item was appended to the session, or its ticket changed hands (another worker
        took it over, `release` handed it back). True as soon as there is some; False when
        `timeout_ms` passed without. A hint, never a promise: it may also wake for something
        from before `since`, or for nothing (a notification that may have been lost is
        reported as news), so the caller reads again. A change made through another broker
        object (another process) is noticed too, at the latest within the broker's poll
        interval.
        """
        ...

    async def renew(self, ticket: SessionTicket) -> bool:
        """Keep the session for another visibility timeout (a worker still working on it).

        False (and no change) if the ticket is no longer the session's: `done` was called, or
        it expired and the session was handed to another worker.
        """
        ...

    async def done(self, ticket: SessionTicket, *, again_in_ms: int | None = None) -> None:
        """The worker is through with the session for now (idempotent).

        A ticket that is no longer the session's (expired and handed out again) changes nothing.
        If the session has pending items (they arrived meanwhile), it is ready again for any
        worker. With `again_in_ms` the session is handed out again after that delay even with
        nothing pending: its work is not through (a drain left an operation open, or another
        process still holds the store's lease).
        """
        ...

    async def held(self) -> tuple[TicketHeld, ...]:
        """Every live ticket: which worker holds which session until when, by session.

        A read (it may be stale the moment it returns). A ticket `done` deferred with
        `again_in_ms` is held by nobody and not listed; nor is one that lapsed.
        """
        ...

    async def release(self, worker: str) -> tuple[str, ...]:
        """Hand back every ticket `worker` holds: its sessions are ready for any worker at once.

        For a worker that is through before its work is (a drain cut it: an operation is left
        open) and for one found gone (its process died): the next `take_session` hands each
        session out, pending items or not, instead of after the visibility timeout. The
        released tickets are no longer the sessions' (`renew` is False, `done` changes
        nothing). Returns the sessions handed back, sorted; other workers' tickets are untouched.
        """
        ...

    async def backlog(self) -> Backlog:
        """Pending items over all sessions and the age of the oldest; rejected items kept."""
        ...


DeliveryStatus = Literal["pending", "delivered", "dead", "discarded"]


class Delivery(Frozen):
    """One outbound message and its delivery state."""

    id: str
    """The delivery id (from what caused the message: ``reply:<run id>``...)."""
    session: str
    lane: str
    outbound: FrozenJsonObject
    """The `Outbound` as JSON."""
    status: DeliveryStatus = "pending"
    attempts: int = 0
    """Claims so far (each claim counts one, settled or not)."""
    due_at_ms: int
    unknown_outcome: bool = False
    """The last attempt may have reached the channel: the next one reconciles first."""
    last_error: str | None = None
    """Secret-free: a short reason or an exception's type name."""
    created_at_ms: int
    settled_at_ms: int | None = None


class Operated(Frozen):
    """An operator's change of a delivery: the delivery as it is after, and whether it changed."""

    delivery: Delivery
    changed: bool


class ClaimedDelivery(Frozen):
    """A delivery leased to one deliverer (it settles it while its lease holds)."""

    delivery: Delivery
    token: str
    lease_expires_at_ms: int


@runtime_checkable
class Outbox(Protocol):
    """Replies waiting to be delivered, retried on a schedule, then dead letters."""

    async def enqueue(
        self, delivery_id: str, session: str, lane: str, outbound: FrozenJsonObject, *, now_ms: int
    ) -> bool:
        """Hold a delivery, due now; False (and no change) if `delivery_id` exists already."""
        ...

    async def claim(
        self, worker: str, *, now_ms: int, limit: int, lease_ms: int
    ) -> tuple[ClaimedDelivery, ...]:
        """Lease up to `limit` due, pending deliveries that no live lease holds, oldest due first.

        Each claim counts one attempt (a lease that lapses unsettled still counted). A claim
        that takes over a lapsed lease returns the delivery with ``unknown_outcome`` set: the
        lapsed attempt may have reached the channel, so the next one reconciles first.
        """
        ...

    async def settle_delivered(self, claimed: ClaimedDelivery, *, now_ms: int) -> bool:
        """Mark delivered; False (no change) if the claim's lease was lost to another claim."""
        ...

    async def settle_retry(
        self,
        claimed: ClaimedDelivery,
        *,
        due_at_ms: int,
        reason: str,
        unknown_outcome: bool,
        now_ms: int,
    ) -> bool:
        """Due again at `due_at_ms` (the caller computes the schedule); False if superseded."""
        ...

    async def settle_dead(self, claimed: ClaimedDelivery, *, reason: str, now_ms: int) -> bool:
        """A dead letter, kept with `reason`; False if superseded."""
        ...

    async def get(self, delivery_id: str) -> Delivery | None:
        """One delivery, whatever its status."""
        ...

    async def list(
        self, status: DeliveryStatus, *, after: str | None = None, limit: int = 100
    ) -> tuple[Delivery, ...]:
        """Deliveries of one status, ordered by id, after the cursor `after`."""
        ...

    async def redeliver(self, delivery_id: str, *, now_ms: int) -> Operated | None:
        """A dead letter back to pending, due now, with a fresh attempt budget (same id).

        None if there is no such delivery; a delivery that is not dead is returned as it is,
        `changed` False (another operator's call may have taken it first).
        """
        ...

    async def discard(self, delivery_id: str, *, now_ms: int) -> Operated | None:
        """An operator gives up on a delivery (kept as discarded).

        A dead one, or a pending one no deliverer holds at `now_ms`. None if there is no such
        delivery; any other is returned as it is, `changed` False: a settled one, or one an
        attempt is being made of (it may yet arrive, and a record saying "discarded" would
        then be false: it can be discarded once the attempt is settled).
        """
        ...

    async def holders(self, *, now_ms: int) -> tuple[str, ...]:
        """The workers holding a live lease on a pending delivery (each once, sorted)."""
        ...

    async def release(self, worker: str, *, now_ms: int) -> tuple[str, ...]:
        """End `worker`'s live leases: its process is known to be gone (D159, D397).

        Each delivery it held is claimable at once (deliverers are woken), as if its lease had
        lapsed: the next claim takes it with ``unknown_outcome`` set, its attempt counted. A
        lease of any other worker is left alone. Returns the released deliveries' ids.
        """
        ...

    async def backlog(self, *, now_ms: int) -> Backlog:
        """Pending deliveries, the age of the oldest due one, and dead letters kept."""
        ...

    async def wait(self, timeout_ms: int) -> None:
        """Return when something may be due (an enqueue, a retry's time) or after the timeout."""
        ...


class ThreadState(Frozen):
    """What the gateway keeps per lane beside the store: where and how to reply."""

    session: str
    lane: str
    thread: FrozenJsonObject
    """The `ThreadRef` as JSON."""
    reply_context: FrozenJsonObject = Field(default_factory=dict)
    """The newest inbound message's reply context."""
    replied_through: int = 0
    """The store seq through which the lane's finished operations have their replies enqueued."""


@runtime_checkable
class Threads(Protocol):
    """Per-lane routing state: the newest reply context and how far replies were enqueued."""

    async def remember(
        self, session: str, lane: str, thread: FrozenJsonObject, reply_context: FrozenJsonObject
    ) -> None:
        """Record the lane's newest reply context, and its thread when the lane is new.

        The thread a lane was first remembered with stays (a lane is one thread: what another
        space names it cannot move its replies, nor the approvers that judge its decisions).
        """
        ...

    async def get(self, session: str, lane: str) -> ThreadState | None:
        """One lane's state."""
        ...

    async def list(self, session: str) -> tuple[ThreadState, ...]:
        """Every lane of a session that has state, by lane name."""
        ...

    async def mark_replied(self, session: str, lane: str, seq: int) -> None:
        """Replies are enqueued through `seq` (never lowers the mark).

        A lane without state is ignored (`remember` creates it).
        """
        ...

    async def rebase(self, session: str, seq: int) -> int:
        """Every lane of `session` to replies enqueued through `seq`, lower or higher.

        For a session whose store history was replaced (another store, one reset, or an older
        one again): marks kept for another history would hide this one's replies, or send its
        old ones again (D352). Returns how many lanes there are.
        """
        ...


class NewAuditEvent(Frozen):
    """Something a worker, the deliverer or an operator did (never message content or secrets)."""

    actor: str
    """``worker:<id>``, ``deliverer:<id>``, ``operator:<name>``."""
    action: str
    session: str | None = None
    lane: str | None = None
    target: str | None = None
    """What it acted on: a run id, a delivery id, an inbox item id."""
    outcome: str
    details: FrozenJsonObject = Field(default_factory=dict)


class AuditEvent(NewAuditEvent):
    """A recorded audit event."""

    id: str
    """Assigned by the broker; events sort by it in record order."""
    at_ms: int


@runtime_checkable
class Audit(Protocol):
    """An append-only trail of what workers, deliverers and operators did."""

    async def record(self, event: NewAuditEvent) -> AuditEvent:
        """Append an event."""
        ...

    async def list(
        self,
        *,
        session: str | None = None,
        lane: str | None = None,
        after: str | None = None,
        limit: int = 100,
    ) -> tuple[AuditEvent, ...]:
        """Events in record order after the cursor `after`, narrowed by session and lane.

        `after` is an event's id; ids sort (as strings) in record order.
        """
        ...


@runtime_checkable
class Marks(Protocol):
    """Small durable values channels keep between processes (an IMAP mailbox's watermark).

    Names are the adapter's (``email:<address>:<folder>``); values are short text. `put` is a
    compare-and-set, so processes that advance one mark concurrently never move it back.
    """

    async def get(self, name: str) -> str | None:
        """The mark's value, or None when it was never set."""
        ...

    async def put(self, name: str, value: str, *, expect: str | None) -> bool:
        """Set `name` to `value` if it holds `expect` now (None: it is unset); whether it did."""
        ...


class BlobInfo(Frozen):
    """A blob held for a session: its content's identity, size and how long it is kept."""

    id: str
    """``sha256:<64 hex digits>`` of the content: the same bytes, the same blob."""
    size: int = Field(ge=0)
    """Bytes."""
    keep_until_ms: int
    """It is held at least until then (the broker's clock); gone some time after."""


BlobRefusedCode = Literal["too_large", "full"]


class BlobRefused(GatewayError):
    """A blob the area does not take (nothing was stored); `str()` says why, in one line.

    ``too_large``: larger than one blob may be. ``full``: the session holds as much as it may
    until older blobs' retention passes.
    """

    def __init__(self, code: BlobRefusedCode, message: str) -> None:
        super().__init__(message)
        self.code: BlobRefusedCode = code


@runtime_checkable
class Blobs(Protocol):
    """The files people sent, content-addressed per session, bounded, kept for a retention.

    A channel stores a file's content here *before* the message naming it enters the inbox
    (so a crash between the two loses nothing), under a `key` that is the channel's identity
    of the file (a Slack file id, an email's Message-ID and part): a retried event finds it
    by that key and fetches nothing again. A worker reads the content when it accepts the
    message into its lane; the lane's user message holds what the agent gets from then on, so
    a blob must outlive the inbox item, not the run. Bounds: `max_blob_bytes` per blob and
    `max_session_bytes` for the blobs a session holds; a blob is kept `retention_ms` after its
    last `put` (a put of held bytes renews it), and only blobs past their retention ever go
    (an expired one is never read again, whichever backend still holds its bytes).
    """

    @property
    def max_blob_bytes(self) -> int:
        """The largest blob taken."""
        ...

    async def put(self, session: str, data: bytes, *, key: str | None = None) -> BlobInfo:
        """Hold `data` for `session` (durable on return); named by `key` too, when given.

        Bytes held already are not stored again: their retention is renewed (and the key
        added). A key names one blob: a later put under the same key moves it.

        Raises:
            BlobRefused: ``too_large`` or ``full``; nothing was stored.
        """
        ...

    async def find(self, session: str, key: str) -> BlobInfo | None:
        """The blob `key` names, while it is kept; None otherwise."""
        ...

    async def get(self, session: str, blob_id: str) -> bytes | None:
        """A blob's content while it is kept; None for an unknown or expired one."""
        ...


@runtime_checkable
class Broker(Protocol):
    """The six parts over one backend."""

    @property
    def inbox(self) -> Inbox:
        """The inbox."""
        ...

    @property
    def outbox(self) -> Outbox:
        """The outbox."""
        ...

    @property
    def threads(self) -> Threads:
        """Per-lane thread state."""
        ...

    @property
    def audit(self) -> Audit:
        """The audit trail."""
        ...

    @property
    def marks(self) -> Marks:
        """Channels' durable marks."""
        ...

    @property
    def blobs(self) -> Blobs:
        """The files people sent, by content."""
        ...

    async def close(self) -> None:
        """Release connections (idempotent)."""
        ...


class BrokerParts:
    """The six parts a backend holds, as the `Broker` Protocol's properties (shared code)."""

    _inbox: Inbox
    _outbox: Outbox
    _threads: Threads
    _audit: Audit
    _marks: Marks
    _blobs: Blobs

    @property
    def inbox(self) -> Inbox:
        """The inbox."""
        return self._inbox

    @property
    def outbox(self) -> Outbox:
        """The outbox."""
        return self._outbox

    @property
    def threads(self) -> Threads:
        """Per-lane thread state."""
        return self._threads

    @property
    def audit(self) -> Audit:
        """The audit trail."""
        return self._audit

    @property
    def marks(self) -> Marks:
        """Channels' durable marks."""
        return self._marks

    @property
    def blobs(self) -> Blobs:
        """The files people sent, by content."""
        return self._blobs
