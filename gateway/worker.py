"""Workers: take a session with pending messages, hold its writer lease, feed its lanes, reply.

A worker process runs `slots` session loops. Each takes a session from the inbox (a ticket),
acquires the store's fenced writer lease for it (another process holding it wins: the ticket is
given back), restores the harness (lanes a crash interrupted resume: a counted attempt; stuck
lanes wait for an operator), enqueues the replies a crash may have left unsent (after the
session's replies watermark: see `gateway.replies`), then accepts the
session's pending messages into their lanes: a new thread creates its lane; the user message's
entry id derives from the message's identity, so a message processed twice is accepted once; a
busy lane gets the configured queue. A message is acknowledged in the inbox only after the lane
accepted it durably. When no lane works and nothing is pending, the harness closes, the lease is
released (a clean release then moves the replies watermark) and the ticket returned.

A worker that dies leaves its ticket unreturned and its lease unrenewed: after the visibility
timeout another worker takes the session, waits out the lease, and continues every lane from
its last durable point.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from pydantic import ValidationError

from adapters import Attachment, DecisionInbound, FileLimits, Inbound, ThreadRef
from gateway.authority import EPOCH, end_revoked_runs, keep_if_revoked
from gateway.broker.contract import Broker, BrokerError, InboxItem, SessionTicket
from gateway.budgets import read_budget
from gateway.cuts import agent_notes
from gateway.fair import PENDING_READ, take_fairly
from gateway.files import attachment_line, read_slow, slow_files, user_content
from gateway.incarnation import gone
from gateway.lane_status import attempt_began, lane_thread, parked_mark
from gateway.live import LivePublisher
from gateway.logs import event
from gateway.metrics import Metrics
from gateway.operator_actions import OperatorAction, carry_out
from gateway.outage import Outage
from gateway.profiles import LaneProfile, LaneProfiles, lane_profile, within_profile
from gateway.replies import (
    LATE_DECISION_TEXT,
    MISMATCHED_DECISION_TEXT,
    NO_WAIT_DECISION_TEXT,
    RUN_CONTEXT,
    born_mark,
    enqueue_decision_notice,
    enqueue_held_notice,
    enqueue_refusal_notice,
    enqueue_replies,
    enqueue_stuck_notice,
    enqueue_working_notice,
    entry_id_of,
    lanes_to_reply,
    replies_mark,
    watermark_of,
)
from gateway.stop import is_stop, stop
from gateway.waits import until_done
from gateway.warm import Lingered, until_news
from harness_core import (
    AgentHarness,
    AgentHarnessOptions,
    AgentLane,
    ApprovalDecision,
    AssistantMessage,
    BeforeRunEvent,
    BeforeRunResult,
    BranchQuery,
    Clock,
    Err,
    HarnessClosed,
    HarnessFault,
    LeaseHeld,
    MissingIdentities,
    Ok,
    SessionError,
    SessionRepo,
    SessionStorage,
    ToolRecovery,
)
from harness_core.events import ApprovalDecidedEvent, RetryScheduled, RunEnd
from harness_core.messages import TextPart, UserContent, UserMessage
from harness_core.session import StoredEntry
from harness_core.session.records import ApprovalRequested
from harness_core.texts import one_line
from harness_core.tools import Tool, ToolContext, ToolOutput

__all__ = ["Worker", "WorkerConfig"]

log = logging.getLogger("gateway.worker")

_LAPSE: Final = "lapse"
"""`_serve`'s answer when the session's ticket must lapse (see `Inbox.take_session`)."""
_WARM: Final = "warm"
"""`_serve`'s answer when the session lingers: its linger ends its ticket (`gateway.warm`)."""
_FAULT_BACKOFF_MS = 1_000
_INTERRUPTED_AGAIN_MS = 1_000
"""After the broker or the store failed a session mid-way: when it is handed out again."""
_MISSING_BACKOFF_MS = (1_000, 15_000)
"""After a resume refused for tools the harness does not have (an MCP server not up yet): the
first and the longest wait before the session is taken again, with the tools offered then."""
"""A faulted session whose lease was given up is handed out again after this, doubling."""
_LEASE_MARGIN_MS = 100
"""Look again this long after another holder's lease should have lapsed."""
_AUTHORITY_MS = 1_000
"""How often a held session looks whether an authority changed (one mark read, D267)."""
_FILE_READS = 2
"""Slow files (a process each) a worker reads at once, whatever sessions they came to."""
_CUT_GRACE_S = 3.0
"""How long cut sessions get to end their loops (cancel lane work, release) before their slot
is cancelled."""

_SLOTS_BUSY_MS = 30_000
"""Messages that waited this long while every slot was busy this long are said in the log."""
_SLOTS_SAID_MS = 60_000
"""How often, at most, that wait is said again while it lasts."""

_NEWEST_MESSAGE = BranchQuery(start="", type="message", limit=1)
"""A lane's newest message on its path (the lane's leaf fills `start`)."""

OptionsFactory = Callable[[SessionStorage], AgentHarnessOptions]
"""The harness options of a session (the model, tools and policies are the service's)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerConfig:
    """How a worker process works (from the settings)."""

    worker_id: str
    slots: int = 4
    lease_ms: int = 30_000
    busy_policy: str = "steer"
    tool_recovery: ToolRecovery = "declared"
    take_wait_ms: int = 1_000
    """How long a free slot waits for a ready session before looking again."""
    poll_ms: int = 1_000
    """While a session works: how often its inbox is read when no news of it came (the broker
    tells of a new item at once: `Inbox.wait`)."""
    linger_ms: int = 0
    """How long a session that went idle is kept for its next message (0: let go at once; see
    `gateway.warm`). At most a third of `lease_ms`: an idle harness does not renew its lease."""
    deferred_poll_ms: int = 2_000
    """How often a lane parked on a background model request is polled."""
    warm_per_slot: int = 64
    """Sessions kept lingering at most, per slot (past it, the one lingering longest goes). A
    lingering session costs its restored lanes' memory and a waiter, no slot and no polling;
    with a few per slot, a rate above a few sessions a second per slot evicted every session
    before its next message came (`bench/gateway_bench.py`: 1.00 takes a reply at 4 per slot,
    0.14 at 64)."""


@dataclass(eq=False)
class _Session:
    """One session in a worker's hands."""

    ticket: SessionTicket
    harness: AgentHarness
    storage: SessionStorage
    tasks: dict[asyncio.Task[Any], str] = field(default_factory=dict)
    """Running lane work (a run, a resume, a decision) and its lane."""
    in_flight: set[str] = field(default_factory=set)
    """Inbox items whose work runs (acknowledged when it has been accepted)."""
    woken: asyncio.Event = field(default_factory=asyncio.Event)
    closing: bool = False
    watermark: str | None = None
    """The replies watermark as read at the take (what a clean release compares and sets)."""
    replies_missed: bool = False
    """A reply scan failed: the watermark must not move past what it would have found."""
    deciding: dict[str, asyncio.Lock] = field(default_factory=dict)
    """Per lane: held by the decision being judged, so decisions meet the lane in inbox order."""
    judged: dict[str, Callable[[], None]] = field(default_factory=dict)
    """Per lane: releases `deciding` once the lane recorded a decision (the run goes on)."""
    threads: dict[str, ThreadRef] = field(default_factory=dict)
    """The threads of lanes seen in this take (their profile's attempt cap is asked by lane)."""
    budgets: dict[str, int] = field(default_factory=dict)
    """Lanes' token budgets as an operator set them (`gateway.budgets`), over their profile's."""
    tools: tuple[str, ...] = ()
    """The names of the harness's tools (what a profile's patterns select from)."""
    told_held: set[str] = field(default_factory=set)
    """Inbox items whose thread was told they wait behind an approval (D334): a pending
    `next_run` message is looked at again at every wake, and says so once."""
    authority_epoch: str | None = None
    """The authority epoch its revoked runs were last ended at (`gateway.authority`)."""
    authority_checked_ms: int = 0
    since: int = 0
    """The inbox news position the session's pending items were last read after."""
    given: dict[str, LaneProfile] = field(default_factory=dict)
    """Per lane: the profile `LaneProfiles.apply` just gave it, for the run starting now (its
    `before_run` takes it instead of reading the lane's newest profile entry again)."""
    answering: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per lane: the reply context of the one message the run starting now answers (under
    ``next_run``), which its ``before_run`` keeps in the run (`gateway.replies.RUN_CONTEXT`)."""
    renewed_ms: int = 0
    """When the ticket was last renewed (or taken)."""
    lease: Any = None
    """The store's writer lease of the session (released when the worker lets it go)."""
    unhook: list[Callable[[], None]] = field(default_factory=list)
    """Undo what watches the harness (listeners, hooks, metrics), when it closes."""
    worked: bool = False
    """Its work ran to an idle session at least once (a clean release may move the mark)."""
    leave: asyncio.Event = field(default_factory=asyncio.Event)
    """Set to end its linger now (the worker needs its place among the sessions it keeps)."""
    linger_until_ms: int = 0
    tools_version: int = 0
    """The tool sources' version its harness was built with (`Worker` ``tools_version``)."""
    missing_tools: bool = False
    """A lane's resume was refused for tools the harness lacks: taken again after a wait."""
    deferred: set[str] = field(default_factory=set)
    """Inbox items (decisions, operator actions) whose resume waits for such tools: left
    pending, unread for the rest of this take, applied at the next (D396)."""
    ready: tuple[InboxItem, ...] | None = None
    """Pending items its linger just read (after `since`): the next work takes them unread."""
    files_read: dict[str, UserContent] = field(default_factory=dict)
    """Parts of messages' slow files read in the background (`read_slow`), by blob."""
    reading: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    """Per inbox item: the background read of its slow files (its lane's items wait)."""


class Worker:
    """The session loops of one process."""

    def __init__(
        self,
        config: WorkerConfig,
        repo: SessionRepo,
        broker: Broker,
        options: OptionsFactory,
        clock: Clock,
        metrics: Metrics | None = None,
        profiles: LaneProfiles | None = None,
        live: LivePublisher | None = None,
        file_limits: FileLimits | None = None,
        working_after: Mapping[str, float] | None = None,
        tools_version: Callable[[], int] = lambda: 0,
        tool_gone: Callable[[str], bool] = lambda name: False,
        outage: Outage | None = None,
        writable: Callable[[], Awaitable[Exception | None]] | None = None,
    ) -> None:
        self.config = config
        self._writable = writable
        """Whether the store takes writes now (None: it does, or nothing can say): asked before
        a session that faulted is resumed (`_refuses_writes`)."""
        self._tool_gone = tool_gone
        """Whether a tool will not be offered again by itself (`McpTools.gone`)."""
        self._gone: dict[str, tuple[str, ...]] = {}
        """By session: tools a lane's resume waits for that are gone, stood in for at its next
        take (`_stand_in`)."""
        self._outage = outage or Outage("broker", clock, log)
        """Says a broker that fails the takes once, not once a second per slot (D347)."""
        self._owed_leases: list[Any] = []
        """Leases a failing store did not let go: given up once it answers (D347)."""
        self._owed_tickets: list[tuple[SessionTicket, int | None]] = []
        """Tickets a failing broker did not end: ended once it answers (D347)."""
        self._tools_version = tools_version
        """Moves when the tools `options` offers change (an MCP server's list): a session
        built before is let go at its next idle moment, and taken again with them."""
        self._working_after = {c: s for c, s in (working_after or {}).items() if s > 0}
        """By channel: after how many seconds a run still working says so once (D214)."""
        self._live = live
        """Shows each run's progress and streamed text to its thread (None: nothing live)."""
        self._file_limits = file_limits or FileLimits()
        self._reads = asyncio.Semaphore(_FILE_READS)
        """Slow files (PDFs, a process each) read at once across this worker's sessions."""
        self._metrics = metrics
        self._profiles = profiles
        """The agent profiles lanes are given (None: every lane has the harness's options)."""
        self._repo = repo
        self._broker = broker
        self._options = options
        self._clock = clock
        self._stopping = asyncio.Event()
        self._cutting = asyncio.Event()
        """A drain's deadline came: every session in hand ends its loop now."""
        self._slots: list[asyncio.Task[None]] = []
        self.active: dict[str, _Session] = {}
        """Sessions in this process's hands (working or lingering), by id."""
        self._warm: dict[str, _Session] = {}
        """Sessions lingering (`gateway.warm`), by id."""
        self._faults: dict[str, int] = {}
        """Sessions whose last takes faulted in a row: how many (their backoff grows)."""
        self._missing: dict[str, int] = {}
        """Sessions whose last takes lacked a lane's tools, in a row: how many."""
        self._lingers: set[asyncio.Task[None]] = set()
        self._resuming: asyncio.Queue[_Session] = asyncio.Queue()
        """Lingering sessions with a message, for the next free slot."""
        self._free = 0
        """Slots waiting for a session (the ones a lingering session's message may go to)."""
        self._last_free_ms = clock.now_ms()
        """When a slot last waited for a session (every slot is busy since, if none does)."""
        self._slots_said_ms: int | None = None
        self._watching: asyncio.Task[None] | None = None

    @property
    def actor(self) -> str:
        """This worker in the audit trail."""
        return f"worker:{self.config.worker_id}"

    def start(self) -> None:
        """Start the slots (returns at once)."""
        self._slots = [asyncio.ensure_future(self._slot(n)) for n in range(self.config.slots)]
        self._watching = asyncio.ensure_future(self._watch_slots())

    def stop_taking(self) -> None:
        """Drain: take no new session; the ones in hand finish what runs."""
        self._stopping.set()

    async def drain(self, seconds: float, *, cut: asyncio.Event | None = None) -> None:
        """Stop taking sessions, let running work finish for up to `seconds`, then close.

        Work still running at the deadline (or once `cut` is set) is cut: its operations stay
        open, and its sessions' leases and tickets are released, so the next worker resumes
        them at once instead of after the lease runs out (D157).
        """
        self.stop_taking()
        if self._watching is not None:
            self._watching.cancel()
        await until_done(self._slots, seconds, cut)
        if not all(task.done() for task in self._slots):
            self._cutting.set()
            for session in self.active.values():
                session.woken.set()
            await until_done(self._slots, _CUT_GRACE_S)
        for task in self._slots:  # a slot that did not end in the grace: its lease lapses
            task.cancel()
        await until_done(self._slots, _CUT_GRACE_S)
        while not self._resuming.empty():  # a message came as the drain began: let it go
            queued = self._resuming.get_nowait()
            await self._hand_back(queued.ticket, await self._let_go(queued))
        await until_done(list(self._lingers), _CUT_GRACE_S)  # they see the drain: let go
        for task in list(self._lingers):
            task.cancel()
        await until_done(list(self._lingers), _CUT_GRACE_S)
        # Whatever was cut where (a take, a restore): no ticket of this worker stays taken.
        with contextlib.suppress(Exception):
            released = await self._broker.inbox.release(self.config.worker_id)
            if released:
                log.info(event("sessions handed back", sessions=len(released)))

    async def _slot(self, number: int) -> None:
        while not self._stopping.is_set():
            try:
                got = await self._next()
            except Exception as exc:  # the broker is down: wait and try again, never crash
                self._outage.failed("take", exc)
                await self._pause(1.0)
                continue
            self._outage.ok("take")
            if self._owed_leases or self._owed_tickets:
                await self._settle_owed()
            if got is None:
                continue
            warm = got if isinstance(got, _Session) else None  # a lingering one's message
            ticket = got.ticket if isinstance(got, _Session) else got
            if warm is None and self._stopping.is_set():  # taken as the drain began
                with contextlib.suppress(Exception):
                    await self._broker.inbox.done(ticket, again_in_ms=0)
                break
            try:
                again = await (self._serve(ticket) if warm is None else self._carry_on(warm))
            except asyncio.CancelledError:
                raise
            except (BrokerError, SessionError) as exc:
                # the broker or the store did not answer mid-way (a blip): the session was let
                # go, its lease released or owed; its ticket goes back soon, owed till the
                # broker answers, where a lapse held every thread of it 30 s more (a probe)
                log.warning(
                    event(
                        "session interrupted",
                        session=ticket.session,
                        error=type(exc).__name__,
                        reason=one_line(str(exc)),
                        again_ms=_INTERRUPTED_AGAIN_MS,
                    )
                )
                again = _INTERRUPTED_AGAIN_MS
            except Exception as exc:
                _log_fault("session failed", ticket.session, exc)
                again = _LAPSE
            await self._hand_back(ticket, again)

    async def _watch_slots(self) -> None:
        """Look every few seconds whether messages wait while every slot is busy (`slots_busy`)."""
        while not self._stopping.is_set():
            await self._pause(_SLOTS_BUSY_MS / 3_000)
            with contextlib.suppress(Exception):  # the broker is down: the takes say so
                await self.slots_busy()

    async def slots_busy(self) -> bool:
        """Say, once a minute at most, that messages wait while every slot has long been busy.

        Without it a message to a session no slot could take waited without a word, in the
        thread or the log (an outside probe). Both must have lasted `_SLOTS_BUSY_MS`: every
        slot of this process busy, and the inbox's oldest pending message (which may also be
        waiting for its own busy lane). Returns whether it was said now.
        """
        now = self._clock.now_ms()
        busy_ms = now - self._last_free_ms
        if self._free > 0 or busy_ms < _SLOTS_BUSY_MS:
            return False
        if self._slots_said_ms is not None and now - self._slots_said_ms < _SLOTS_SAID_MS:
            return False
        backlog = await self._broker.inbox.backlog()
        if backlog.pending == 0 or backlog.oldest_age_ms < _SLOTS_BUSY_MS:
            return False
        self._slots_said_ms = now
        log.warning(
            event(
                "messages wait for a free slot",
                slots=self.config.slots,
                busy_s=busy_ms // 1000,
                pending=backlog.pending,
                oldest_s=backlog.oldest_age_ms // 1000,
                hint="every session slot of this process is busy: raise GATEWAY_WORKER_SLOTS, "
                "or run another process",
            )
        )
        return True

    async def _next(self) -> SessionTicket | _Session | None:
        """The next session for a free slot: a lingering one with a message, else a take."""
        if not self._resuming.empty():
            return self._resuming.get_nowait()
        self._free += 1
        take = asyncio.ensure_future(
            self._broker.inbox.take_session(self.config.worker_id, wait_ms=self.config.take_wait_ms)
        )
        resume = asyncio.ensure_future(self._resuming.get())
        try:
            await asyncio.wait({take, resume}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._free -= 1
            self._last_free_ms = self._clock.now_ms()
            self._slots_said_ms = None  # a slot was free: a wait that begins again is news
            for task in (take, resume):
                task.cancel()  # a cancelled take hands back what it took meanwhile
            await asyncio.gather(take, resume, return_exceptions=True)
        warm = resume.result() if not resume.cancelled() else None
        if take.cancelled():
            return warm
        if take.exception() is not None:
            if warm is not None:  # its message waits: the broker's trouble can wait
                return warm
            raise take.exception()  # type: ignore[misc]
        ticket = take.result()
        if warm is not None and ticket is not None:  # both at once: the warm one is cheaper
            # nobody looked at the taken session: it is for the next take at once, pending
            # items or not (a dead worker's session with an open operation has none)
            await self._hand_back(ticket, 0)
        return warm if warm is not None else ticket

    async def _hand_back(
        self, ticket: SessionTicket, again: int | Literal["lapse", "warm"] | None
    ) -> None:
        """End a ticket as `_serve` says (a lapse: the visibility timeout; a linger: itself)."""
        if again != _LAPSE and again != _WARM:
            try:
                await self._broker.inbox.done(ticket, again_in_ms=again)
            except Exception:  # the broker is down: ended once it answers, not at its lapse
                self._owed_tickets.append((ticket, again))

    async def _settle_owed(self) -> None:
        """Give up the leases and end the tickets an outage kept this worker from letting go.

        Else a session in hand when the store stopped answering waits out its lease (30 s)
        after a blip of a second. Both are fenced: a lease taken since (by any worker) is not
        this one's token, and a ticket handed out again is not this one (`done` changes
        nothing), so settling late never lets go of what is someone's now.
        """
        leases, self._owed_leases = self._owed_leases, []
        for lease in leases:  # before the tickets: a session handed out finds its lease free
            await self._release(lease)
        tickets, self._owed_tickets = self._owed_tickets, []
        for ticket, again in tickets:
            await self._hand_back(ticket, again)
        # what failed again is owed again: said only for what was let go (it was said 3 times
        # a second while the store still refused, each line claiming it: an outside probe)
        let_go = (
            max(len(leases) - len(self._owed_leases), 0),
            max(len(tickets) - len(self._owed_tickets), 0),
        )
        if any(let_go):
            log.info(event("let go after the outage", leases=let_go[0], tickets=let_go[1]))

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)

    # -- one session -------------------------------------------------------------------------

    async def _serve(self, ticket: SessionTicket) -> int | Literal["lapse", "warm"] | None:
        """Take up a session: its lease, its restore, what a crash left; then carry on with it.

        How its ticket ends: None: through with it; a delay: hand it out again then (work is
        left: an operation a drain interrupted, or a lease another process holds); `_LAPSE`:
        let the ticket lapse (a fault: another worker takes over after the visibility
        timeout); `_WARM`: it lingers (`gateway.warm`), and ends its ticket itself.
        """
        session_id = ticket.session
        if session_id in self.active:
            # a slot of this process has it (its ticket lapsed meanwhile): taking the lease
            # again would supersede that slot's; look again when it may be through
            return self.config.lease_ms // 3
        lease = await self._lease(session_id)
        if isinstance(lease, int):
            return lease  # another process holds the store's lease: look again when it lapses
        try:
            storage = await self._repo.open(session_id, lease=lease)
        except BaseException:
            await self._release(lease)
            raise
        threads: dict[str, ThreadRef] = {}
        budgets: dict[str, int] = {}
        version = self._tools_version()  # before the options: a change meanwhile is seen
        try:
            options = await self._session_options(session_id, storage, threads, budgets)
            harness, suspended = await AgentHarness.create(options)
        except BaseException:  # a restore cut by a stop, or failed: nothing was done yet
            with contextlib.suppress(Exception):
                await storage.close()
            await self._release(lease)
            raise
        session = _Session(
            ticket=ticket,
            harness=harness,
            storage=storage,
            threads=threads,
            budgets=budgets,
            tools=tuple(tool.name for tool in options.tools),
            tools_version=version,
            renewed_ms=self._clock.now_ms(),
            lease=lease,
        )
        if self._metrics is not None:
            self._metrics.session_taken()
            session.unhook.append(self._metrics.watch(harness))
        session.unhook.append(self._prompting(session))
        session.unhook.append(self._answering(session))
        # a decided wait is closed at once on every copy of its request, not when its run ends
        session.unhook.append(
            harness.events.on("approval_decided", lambda e: self._decided(session, e))
        )
        if self._live is not None:
            session.unhook.append(
                self._live.watch(harness.events, lambda lane: self._thread_for(session, lane))
            )
        session.unhook.append(harness.events.on("run_end", lambda e: _failed(session_id, e)))
        session.unhook.append(
            harness.events.on("retry_scheduled", lambda e: _retrying(session_id, e))
        )
        self.active[session_id] = session
        log.info(event("session taken", session=session_id, suspended=len(suspended)))
        try:
            if await self._refuses_writes(session_id):
                return await self._let_go(session, faulted=True)
            await self._same_history(session)  # before anything this take does writes
            ended = await self._end_revoked(session)  # never resumed, parked or answered
            for op in suspended:
                lane = await harness.lane(op.lane)
                if lane is None or op.lane in ended:
                    continue
                if op.stuck:
                    # said once, when it becomes stuck: every later take of its session found
                    # it again, and the audit trail filled with "lane stuck"
                    if await self._park(session, op.lane, op.id):
                        log.warning(event("lane stuck", session=session_id, lane=op.lane))
                        await self._record(session_id, op.lane, "lane stuck", op.id, op.attempts)
                    await self._stuck_notice(session, op.lane, op.id, op.attempts)
                    continue
                if op.reason == "crash":
                    await self._record(session_id, op.lane, "took over", op.id, op.attempts)
                    if self._metrics is not None:
                        self._metrics.takeover()
                if op.reason == "crash" or op.reason == "deferred":
                    self._track(session, op.lane, self._resume(session, lane))
            await self._reply_all(session)
        except (HarnessFault, HarnessClosed) as exc:
            _log_fault("session faulted", session_id, exc)
            return await self._let_go(session, faulted=True)
        except BaseException:
            await self._let_go(session)
            raise
        return await self._carry_on(session)

    async def _refuses_writes(self, session_id: str) -> bool:
        """Whether a session that faulted last time must wait: the store refuses writes.

        A Redis full under ``noeviction`` faulted each take's first write: every take resumed
        the lane's operation once more, and three in 7 s parked it stuck until an operator
        resumed it, its thread's later messages unanswered (an outside probe). Such a take
        now waits, its backoff growing, without resuming anything, until a write goes in.
        """
        if self._writable is None or not self._faults.get(session_id):
            return False
        try:
            refused = await self._writable()
        except Exception as exc:
            refused = exc
        if refused is None:
            return False
        log.warning(
            event(
                "session waits for the store to take writes",
                session=session_id,
                error=type(refused).__name__,
                reason=one_line(str(refused))[:300],
            )
        )
        return True

    async def _carry_on(self, session: _Session) -> int | Literal["lapse", "warm"] | None:
        """Work on a session in hand until it is idle; then keep it warm or let it go."""
        try:
            await self._work(session)
        except (HarnessFault, HarnessClosed) as exc:
            _log_fault("session faulted", session.ticket.session, exc)
            return await self._let_go(session, faulted=True)
        except BaseException:  # a slot cancelled by a drain past its grace: let go as ever
            await self._let_go(session)
            raise
        if not session.tasks:
            session.worked = True
            if session.missing_tools:
                return await self._let_go(session, missing=True)
            if self._tools_changed(session):
                await self._let_go(session)
                return 0  # taken again at once, with the tools offered now
            if self._keep_warm(session):
                return _WARM
        return await self._let_go(session)

    def _tools_changed(self, session: _Session) -> bool:
        """Whether the tools offered changed since the session's harness was built."""
        return self._tools_version() != session.tools_version

    async def _let_go(
        self, session: _Session, *, faulted: bool = False, missing: bool = False
    ) -> int | Literal["lapse"] | None:
        """Close the session's harness and give up its lease; how its ticket ends.

        A clean release (no fault, no operation left open, every reply scan done) moves the
        session's replies watermark to the store's last seq.
        """
        session_id = session.ticket.session
        session.closing = True
        self.active.pop(session_id, None)
        self._warm.pop(session_id, None)
        interrupted = bool(session.tasks)  # a drain's deadline: operations stay open
        for task in session.tasks:
            task.cancel()
        await asyncio.gather(*session.tasks, return_exceptions=True)
        for undo in session.unhook:
            undo()
        last_seq: int | None = None
        await session.harness.close()
        if session.worked and not interrupted and not session.replies_missed and not faulted:
            with contextlib.suppress(Exception):  # unread: the next take looks wider
                last_seq = (await session.storage.get_stats()).last_seq
        await session.storage.close()
        # closed: nothing of this process writes for the session any more, so a faulted one's
        # lease may go too; if the store answers again (a short outage), the next take need
        # not wait out the lease (30 s), only a backoff that grows while faults repeat
        released = await self._release(session.lease)
        # only while the lease was still ours: nobody else wrote up to `last_seq`
        if released and last_seq is not None:
            await self._advance_watermark(session, last_seq)
        log.info(
            event(
                "session released"
                if released
                else "session let go (its lease is given up once the store answers)"
                if session.lease in self._owed_leases
                else "session let go (its lease lapses)",
                session=session_id,
                faulted=faulted,
            )
        )
        if missing and not faulted:
            self._faults.pop(session_id, None)
            tries = self._missing[session_id] = self._missing.get(session_id, 0) + 1
            first, longest = _MISSING_BACKOFF_MS
            return int(min(first * 2 ** (tries - 1), longest))
        self._missing.pop(session_id, None)
        if not faulted:
            self._faults.pop(session_id, None)
            return 0 if interrupted else None
        if not released:
            return _LAPSE
        faults = self._faults[session_id] = self._faults.get(session_id, 0) + 1
        return int(min(_FAULT_BACKOFF_MS * 2 ** (faults - 1), self.config.lease_ms))

    # -- warm sessions ---------------------------------------------------------------------

    def _keep_warm(self, session: _Session) -> bool:
        """Let the idle session linger (`gateway.warm`) if it may; whether it does."""
        linger_ms = min(self.config.linger_ms, self.config.lease_ms // 3)
        if (
            linger_ms <= 0
            or self._stopping.is_set()
            or self._cutting.is_set()
            or session.replies_missed  # let go: the next take's scan finds what it missed
        ):
            return False
        staying = [warm for warm in self._warm.values() if not warm.leave.is_set()]
        if (
            len(staying) >= self.config.slots * self.config.warm_per_slot
        ):  # the one lingering longest goes
            min(staying, key=lambda warm: warm.linger_until_ms).leave.set()
        session.leave.clear()
        session.linger_until_ms = self._clock.now_ms() + linger_ms
        self._warm[session.ticket.session] = session
        task = asyncio.ensure_future(self._linger(session))
        self._lingers.add(task)
        task.add_done_callback(self._lingers.discard)
        return True

    async def _linger(self, session: _Session) -> None:
        """Wait for the lingering session's next message; then a free slot, or let it go."""
        ended = Lingered("over")
        try:
            ended = await until_news(
                self._broker.inbox,
                session.ticket,
                since=session.since,
                until_ms=session.linger_until_ms,
                clock=self._clock,
                ends=(self._stopping, self._cutting, session.leave),
                in_flight=session.in_flight,
            )
        except Exception as exc:  # the broker is away: let it go (what is pending stays)
            log.warning(event("linger failed", session=session.ticket.session, error=str(exc)))
        finally:
            self._warm.pop(session.ticket.session, None)
            if ended.end == "work" and self._free > 0 and not self._stopping.is_set():
                session.since, session.ready = ended.since, ended.items
                self._resuming.put_nowait(session)  # a free slot carries on with it
            else:  # no slot free here: let it go, for a free slot of any worker to take
                if ended.end == "lost":
                    log.warning(event("ticket lapsed", session=session.ticket.session))
                await self._hand_back(session.ticket, await self._let_go(session))

    async def _session_options(
        self,
        session_id: str,
        storage: SessionStorage,
        threads: dict[str, ThreadRef],
        budgets: dict[str, int],
    ) -> AgentHarnessOptions:
        """The session's harness options; with profiles, each lane's caps its profile's.

        A lane's cap is asked at the restore, before any message names the lane's thread: the
        threads of the lanes with an open operation are read first (a bounded read, like the
        restore's own), and `threads` learns the others as messages and decisions arrive; so
        do `budgets`, an operator's budget for a lane (over its profile's).
        """
        options = self._options(storage)
        gone = self._gone.pop(session_id, ())
        if gone:  # its lanes' resumes wait for these: stood in for, this take
            names = {tool.name for tool in options.tools}
            stand_ins = tuple(_stand_in(name) for name in gone if name not in names)
            options = dataclasses.replace(options, tools=(*options.tools, *stand_ins))
            log.warning(event("gone tools stood in for", session=session_id, tools=list(gone)))
        profiles = self._profiles
        if profiles is None:
            return options
        thread_of = functools.partial(self._known_thread, session_id, threads)
        options = dataclasses.replace(
            options, tools=tuple(within_profile(t, profiles, thread_of) for t in options.tools)
        )
        for started in await storage.find_open_operations(None):
            lane = getattr(started.record, "lane", None)
            if isinstance(lane, str) and lane not in threads:
                thread = await self._thread_of(session_id, lane)
                if thread is not None:
                    threads[lane] = thread
                    await self._read_budget(session_id, lane, thread, budgets)
        return dataclasses.replace(
            options,
            max_attempts=lambda lane: profiles.attempts(threads.get(lane)),
            max_turns=lambda lane: profiles.turns(threads.get(lane)),
            token_budget=lambda lane: budgets.get(lane) or profiles.budget(threads.get(lane)),
        )

    async def _read_budget(
        self, session_id: str, lane: str, thread: ThreadRef, budgets: dict[str, int]
    ) -> None:
        """Learn an operator's budget for `lane`, if its thread has a budget at all (D295)."""
        if self._profiles is None or self._profiles.budget(thread) is None:
            return  # no budget to set: the mark is not read
        found = await read_budget(self._broker.marks, session_id, lane)
        if found is not None and found.tokens is not None:
            budgets[lane] = found.tokens
        else:
            budgets.pop(lane, None)

    async def _thread_of(self, session_id: str, lane: str) -> ThreadRef | None:
        """The channel thread a lane answers, as the broker remembers it (None: unknown)."""
        return await lane_thread(self._broker, session_id, lane)

    async def _thread_for(self, session: _Session, lane: str) -> ThreadRef | None:
        """The thread of a lane of `session`: as its messages named it, else the broker's."""
        return await self._known_thread(session.ticket.session, session.threads, lane)

    async def _known_thread(
        self, session_id: str, threads: dict[str, ThreadRef], lane: str
    ) -> ThreadRef | None:
        known = threads.get(lane)
        if known is None:
            known = await self._thread_of(session_id, lane)
            if known is not None:
                threads.setdefault(lane, known)
        return known

    def _answering(self, session: _Session) -> Callable[[], None]:
        """Keep in a ``next_run`` run the reply context of the message it answers.

        Its replies (the answer, an approval request, a notice) went with the thread's newest
        reply context: that of a message accepted meanwhile, still waiting for the next run.
        A Slack reply then took the working reaction off that message too, and an email
        answered it (In-Reply-To, its author) before its own run began.
        """

        async def before_run(event: BeforeRunEvent) -> BeforeRunResult | None:
            context = session.answering.pop(event.lane, None)
            return None if context is None else BeforeRunResult(resume_data=context)

        return session.harness.hooks.on("before_run", before_run, id=RUN_CONTEXT)

    def _prompting(self, session: _Session) -> Callable[[], None]:
        """Fix each run's system prompt when it starts: its lane's profile's (see profiles).

        The profile a message's run was just given (`_Session.given`) is not read again.
        """
        profiles = self._profiles
        harness = session.harness
        if profiles is None:
            return lambda: None

        async def before_run(event: BeforeRunEvent) -> BeforeRunResult | None:
            return await profiles.run_prompt(
                harness, event.lane, session.given.pop(event.lane, None)
            )

        return harness.hooks.on("before_run", before_run, id="gateway.profile")

    async def _release(self, lease: Any) -> bool:
        """Give the session's lease up (False: it was no longer ours, or the store failed).

        A lease the store failed to release is owed: given up once it answers (D347).
        """
        try:
            released: bool = await self._repo.release_lease(lease)
        except Exception:
            self._owed_leases.append(lease)
            return False
        return released

    async def _lease(self, session_id: str) -> Any:
        """The session's writer lease, or in how many ms to look again (another holds it)."""
        try:
            return await self._acquire(session_id)
        except LeaseHeld as held:
            return await self._held(session_id, held)
        except SessionError as exc:
            if exc.code != "not_found":
                raise
        with contextlib.suppress(SessionError):  # a new session: the first message creates it
            await self._repo.create(session_id)
        try:
            return await self._acquire(session_id)
        except LeaseHeld as held:
            return await self._held(session_id, held)

    async def _acquire(self, session_id: str, owner: str | None = None) -> Any:
        return await self._repo.acquire_lease(
            session_id, owner=owner or self.config.worker_id, ttl_ms=self.config.lease_ms
        )

    async def _held(self, session_id: str, held: LeaseHeld) -> Any:
        """The lease after all (its holder is gone), or in how many ms to look again."""
        if held.expires_at_ms is not None and gone(held.owner):
            # Its process no longer runs (D159): supersede its token as that owner (a restarted
            # owner may; its writes are refused from now on), give that up, take it as us.
            try:
                await self._release(await self._acquire(session_id, held.owner))
                lease = await self._acquire(session_id)
            except LeaseHeld as again:  # another worker was quicker: its lease is live
                held = again
            else:
                log.warning(
                    event(
                        "lease taken over",
                        session=session_id,
                        holder=held.owner,
                        why="its process no longer runs on this machine",
                    )
                )
                return lease
        wait_ms = (
            self.config.lease_ms
            if held.expires_at_ms is None
            else max(held.expires_at_ms - self._clock.now_ms(), 0) + _LEASE_MARGIN_MS
        )
        log.warning(
            event(
                "session held by another process",
                session=session_id,
                holder=held.owner,
                wait_s=round(wait_ms / 1000, 1),
                why="it works on the session, or stopped without releasing it: its lease "
                "runs out then unless renewed",
            )
        )
        return wait_ms

    async def _work(self, session: _Session) -> None:
        """Accept pending messages and wait for lane work until nothing is left to do."""
        config = self.config
        inbox = self._broker.inbox
        while not self._cutting.is_set():
            if self._clock.now_ms() - session.renewed_ms >= config.lease_ms // 3:
                if not await inbox.renew(session.ticket):
                    log.warning(event("ticket lapsed", session=session.ticket.session))
                session.renewed_ms = self._clock.now_ms()
            if self._clock.now_ms() - session.authority_checked_ms >= _AUTHORITY_MS:
                await self._end_revoked(session)
            session.woken.clear()  # before the read: what ends after it wakes the wait below
            ready, session.ready = session.ready, None
            if ready is None:
                session.since = await inbox.position()
                ready = await inbox.pending(session.ticket.session, limit=PENDING_READ)
            # each lane to its share: one thread's backlog left the others' out of reach
            skip = session.in_flight | session.deferred
            items = list((await take_fairly(inbox, session.ticket.session, ready, skip)).items)
            if self._tools_changed(session):
                # a busy session would keep the old tools for good: what is running ends,
                # then it is taken again with the new ones (its pending items wait till then)
                if not session.tasks:
                    return
                items = []
            if items:  # its files' reading may take long: the ticket and the lease are kept
                async with self._keeping(session), session.harness.hold():
                    reading: set[str] = set()  # lanes whose earlier message's files are read
                    for item in items:
                        if item.lane in reading or not self._files_ready(session, item):
                            reading.add(item.lane)  # pending: its lane's order is kept
                            continue
                        await self._apply(session, item)
                        if session.reading.pop(item.id, None) is not None:
                            for file in self._slow_files(item):
                                session.files_read.pop(file.blob or "", None)
            if not session.tasks and not items:
                if self._stopping.is_set() or not await self._parked_deferred(session):
                    return
                await self._pause(config.deferred_poll_ms / 1000)
                continue
            await self._news(session, config.poll_ms)

    def _slow_files(self, item: InboxItem) -> tuple[Attachment, ...]:
        """`item`'s files whose reading takes a process each (none: not a message)."""
        if item.kind != "message" or not dict(item.payload).get("attachments"):
            return ()  # most messages: no parse
        try:
            return slow_files(Inbound.model_validate(dict(item.payload)))
        except ValidationError:
            return ()  # `_apply` refuses it

    def _files_ready(self, session: _Session, item: InboxItem) -> bool:
        """Whether `item` may be applied now; else its slow files are read in the background.

        A message's PDFs are read apart from the session's loop (`read_slow`): the other
        threads of its session go on meanwhile, and its own thread's later items wait.
        """
        slow = self._slow_files(item)
        if not slow:
            return True
        task = session.reading.get(item.id)
        if task is None:
            session.reading[item.id] = self._read_files(session, item, slow)
            return False
        # done: its parts are in `files_read`; a file not there (its blob gone, a read that
        # failed) is read, or named, in the loop as before
        return task.done()

    def _read_files(
        self, session: _Session, item: InboxItem, slow: tuple[Attachment, ...]
    ) -> asyncio.Task[None]:
        async def read() -> None:
            try:
                async with session.harness.hold():  # an idle harness renews no lease
                    parts = await read_slow(
                        slow,
                        self._broker.blobs,
                        item.session,
                        self._file_limits,
                        self._reads,
                    )
            except Exception as exc:  # read in the loop then, as before (a fault says itself)
                log.warning(event("files not read apart", item=item.id, error=type(exc).__name__))
                return
            session.files_read.update(parts)

        task: asyncio.Task[None] = asyncio.ensure_future(read())
        session.tasks[task] = item.lane

        def finished(done: asyncio.Task[None]) -> None:
            session.tasks.pop(done, None)
            if done.cancelled():
                session.reading.pop(item.id, None)
            else:
                done.exception()  # retrieved (none is raised: `read` says its own)
            session.woken.set()  # the loop applies the item now

        task.add_done_callback(finished)
        return task

    @contextlib.asynccontextmanager
    async def _keeping(self, session: _Session) -> AsyncIterator[None]:
        """Renew the session's ticket while a step of its own loop runs (taking messages in).

        The loop renews it between steps; a message whose files take long to read (a PDF of
        many pages, a stalled store) let it lapse, and another slot of this very process took
        the session while the first still read (an outside probe, D351).
        """

        async def beat() -> None:
            every_s = max(self.config.lease_ms // 3, 1) / 1000
            while True:
                await self._clock.sleep(every_s)
                with contextlib.suppress(Exception):  # the loop's own renewal says a lapse
                    if await self._broker.inbox.renew(session.ticket):
                        session.renewed_ms = self._clock.now_ms()

        task = asyncio.ensure_future(beat())
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _news(self, session: _Session, timeout_ms: int) -> None:
        """Wait until lane work ends, the inbox has news of the session, or `timeout_ms`."""
        woken = asyncio.ensure_future(session.woken.wait())
        told = asyncio.ensure_future(
            self._broker.inbox.wait(
                session.ticket.session, since=session.since, timeout_ms=timeout_ms
            )
        )
        try:
            await asyncio.wait({woken, told}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
            told.cancel()
            await asyncio.gather(woken, told, return_exceptions=True)

    async def _parked_deferred(self, session: _Session) -> bool:
        """Poll lanes parked on a background model request (True if one stays parked)."""
        parked = False
        for info in await session.harness.lanes(open_only=True):  # in memory: no reads
            if info.status == "suspended" and info.suspended == "deferred":
                lane = await session.harness.lane(info.name)
                if lane is not None:
                    parked = True
                    self._track(session, info.name, self._resume(session, lane))
        return parked

    def _track(self, session: _Session, lane: str, work: Awaitable[Any]) -> asyncio.Task[Any]:
        """Run lane work in the background; when it ends, enqueue the lane's new replies."""

        async def then_reply() -> None:
            ended = None
            try:
                ended = await work
            except (HarnessClosed, HarnessFault):
                raise
            except Exception as exc:
                log.error(event("lane work failed", lane=lane, error=type(exc).__name__))
            if not session.closing:
                # a run's outcome holds its final message: the scan need not read it again
                final = getattr(ended, "final_message", None)
                entry_id = getattr(ended, "final_entry_id", None)
                known = (
                    {entry_id: final} if entry_id and isinstance(final, AssistantMessage) else {}
                )
                await self._reply(session, lane, known)

        task: asyncio.Task[Any] = asyncio.ensure_future(then_reply())
        session.tasks[task] = lane

        def finished(done: asyncio.Task[Any]) -> None:
            session.tasks.pop(done, None)
            if not done.cancelled():
                done.exception()  # a fault is the session's to report, not asyncio's
            elif inspect.iscoroutine(work) and inspect.getcoroutinestate(work) == "CORO_CREATED":
                work.close()  # cut before it began (the session let go): not "never awaited"
            session.woken.set()

        task.add_done_callback(finished)
        return task

    def _decided(self, session: _Session, decided: ApprovalDecidedEvent) -> None:
        """A wait was decided (from any channel, a reminder, an operator): enqueue its close."""
        if decided.lane is None:
            return
        release = session.judged.pop(decided.lane, None)
        if release is not None:  # the next decision may meet the lane now (and be told it is late)
            release()
        if not session.closing:
            self._track(session, decided.lane, asyncio.sleep(0))  # then the lane's reply scan

    async def _end_revoked(self, session: _Session, *, now: bool = False) -> set[str]:
        """End the open runs of the session's revoked lanes (D267); returns their lanes.

        Only when an authority changed since the last look (`EPOCH`), or `now` (a wake).
        """
        session.authority_checked_ms = self._clock.now_ms()
        try:
            epoch = await self._broker.marks.get(EPOCH)
            if epoch is None or (epoch == session.authority_epoch and not now):
                session.authority_epoch = epoch
                return set()
            ended = await end_revoked_runs(
                session.harness,
                self._broker,
                session.ticket.session,
                functools.partial(self._thread_for, session),
                actor=self.actor,
                before_abort=self._live.mute if self._live is not None else lambda run: None,
            )
        except (HarnessClosed, HarnessFault):
            raise
        except Exception as exc:  # the broker did not answer: the next look tries again
            log.warning(event("authority check failed", error=type(exc).__name__))
            return set()
        session.authority_epoch = epoch
        for lane, _ in ended:  # a suspended run ends in the background: its close replies
            found = await session.harness.lane(lane)
            if found is not None:
                self._track(session, lane, found.wait_for_idle())
        return {lane for lane, _ in ended}

    async def _resume(self, session: _Session, lane: AgentLane) -> None:
        result = await lane.resume(tool_recovery=self.config.tool_recovery)
        if not isinstance(result, Err):
            return
        refusal = result.error
        if isinstance(refusal, MissingIdentities):
            # its tools' server is not up (yet): the lane stayed suspended, and nothing would
            # look again until someone wrote in its thread; the session is taken again soon
            self._wait_for_tools(session, lane.name, refusal)
            return
        log.info(event("resume refused", lane=lane.name, reason=refusal.tag))

    def _wait_for_tools(self, session: _Session, lane: str, refusal: MissingIdentities) -> None:
        """A resume of `lane` lacks tools: take the session again after a wait.

        Tools no server will offer again by themselves are stood in for at that take
        (`_stand_in`, D373): a decision or an operator's action deferred till then applies.
        """
        session.missing_tools = True
        gone = tuple(tool for tool in refusal.tools if self._tool_gone(tool))
        if gone:  # never to come back by itself: stood in for at the next take
            known = self._gone.get(session.ticket.session, ())
            self._gone[session.ticket.session] = tuple(sorted({*known, *gone}))
        log.warning(
            event(
                "resume waits for its tools",
                session=session.ticket.session,
                lane=lane,
                tools=list(refusal.tools),
                models=list(refusal.models),
                gone=list(gone),
            )
        )

    async def _record(
        self, session_id: str, lane: str, action: str, op_id: str, attempts: int
    ) -> None:
        """An audit event for operators (best effort: the log has the facts too)."""
        with contextlib.suppress(Exception):
            await self._broker.audit.record(
                _audit(self.actor, action, session_id, lane, op_id, "ok", {"attempts": attempts})
            )

    async def _park(self, session: _Session, lane: str, op_id: str) -> bool:
        """Tell operators the lane's last attempt is over (it is stuck, not running: D163).

        Whether this take parked it: False when an earlier one did; True when the mark could
        not be written (said again rather than not at all).
        """
        session_id = session.ticket.session
        try:
            began = await attempt_began(session.storage, lane, op_id)
            return await self._broker.marks.put(
                parked_mark(session_id, began), "stuck", expect=None
            )
        except Exception:  # unsaid, the lane reads as running while held
            return True

    async def _stuck_notice(self, session: _Session, lane: str, op_id: str, attempts: int) -> None:
        state = await self._broker.threads.get(session.ticket.session, lane)
        if state is not None:
            await enqueue_stuck_notice(
                self._broker, state, op_id, attempts, now_ms=self._clock.now_ms()
            )

    async def _reply_all(self, session: _Session) -> None:
        """Enqueue what the session's previous holder left unsent.

        After a clean release only the lanes with a reply-worthy record after the watermark
        can owe one; without a watermark (never set, or unreadable) every thread is looked at.
        """
        session_id = session.ticket.session
        threads = self._broker.threads
        session.watermark = await self._broker.marks.get(replies_mark(session_id))
        since = watermark_of(session.watermark)
        if since is None:
            states = list(await threads.list(session_id))
        else:
            states = []
            for lane in await lanes_to_reply(session.storage, since):
                state = await threads.get(session_id, lane)
                if state is not None:
                    states.append(state)
        for state in states:
            await enqueue_replies(self._broker, session.storage, state, now_ms=self._clock.now_ms())

    async def _same_history(self, session: _Session) -> None:
        """Rebase the broker's reply marks of a session whose store history was replaced.

        The marks are store seqs: with another store (``--store`` changed, the broker kept), a
        store reset, or an older store again, the session's seqs are not the ones the marks
        were kept for, and its threads' replies were never enqueued, silently (an outside
        probe), or an older history's would be sent again. The store's session is known by
        when it was created (`born_mark`); for another one, every lane's mark and the
        watermark move to the store's last seq, read before this take writes anything: what
        the store held was answered under its own broker, and what comes now is looked for
        (D352).
        """
        session_id = session.ticket.session
        marks = self._broker.marks
        storage = session.storage
        born = str((await storage.get_metadata()).created_at)
        name = born_mark(session_id)
        seen = await marks.get(name)
        if seen == born:
            return
        if seen is not None:
            last = (await storage.get_stats()).last_seq
            lanes = await self._broker.threads.rebase(session_id, last)
            watermark = await marks.get(replies_mark(session_id))
            await marks.put(replies_mark(session_id), str(last), expect=watermark)
            log.warning(
                event(
                    "session history replaced",
                    session=session_id,
                    lanes=lanes,
                    through=last,
                    why="the store's session is not the one the broker's reply marks were kept "
                    "for (another store, or one reset): its replies are looked for from here",
                )
            )
        await marks.put(name, born, expect=seen)

    async def _advance_watermark(self, session: _Session, last_seq: int) -> None:
        """Every reply through `last_seq` is enqueued: let the next take look after it only.

        A compare-and-set against the value read at the take: a concurrent holder's newer
        value wins (a stale worker never moves it), and it never moves back.
        """
        old = watermark_of(session.watermark)
        if old is not None and old >= last_seq:
            return
        name = replies_mark(session.ticket.session)
        with contextlib.suppress(Exception):  # best effort: without it the next take looks wider
            await self._broker.marks.put(name, str(last_seq), expect=session.watermark)

    async def _reply(
        self, session: _Session, lane: str, known: Mapping[str, AssistantMessage] | None = None
    ) -> None:
        try:
            state = await self._broker.threads.get(session.ticket.session, lane)
            if state is not None:
                replies = await enqueue_replies(
                    self._broker,
                    session.storage,
                    state,
                    now_ms=self._clock.now_ms(),
                    known=known,
                )
                for reply in replies:
                    log.info(
                        event(
                            "reply enqueued",
                            session=state.session,
                            lane=lane,
                            delivery=reply.outbound.delivery_id,
                            kind=reply.outbound.kind,
                        )
                    )
        except Exception as exc:  # the next scan (another operation, a takeover) enqueues it
            session.replies_missed = True
            log.warning(event("reply scan failed", lane=lane, error=type(exc).__name__))

    # -- one inbox item --------------------------------------------------------------------

    async def _apply(self, session: _Session, item: InboxItem) -> None:
        if item.kind == "authority":  # a revocation: its runs end now (D267)
            await self._end_revoked(session, now=True)
            await self._broker.inbox.ack(item.session, item.id)
            return
        thread_of = functools.partial(self._thread_for, session)
        actor, clock = self.actor, self._clock
        if await keep_if_revoked(self._broker, item, thread_of, actor=actor, clock=clock):
            return  # kept, never run: its thread's authority is revoked
        try:
            if item.kind == "decision":
                decision = DecisionInbound.model_validate(dict(item.payload))
            elif item.kind == "operator":
                action = OperatorAction.model_validate(dict(item.payload))
            else:
                inbound = Inbound.model_validate(dict(item.payload))
        except ValidationError as exc:
            await self._refuse(item, f"malformed {item.kind}: {exc.error_count()} errors")
            return
        if item.kind == "decision":
            # a decision never creates a lane: one for a thread without a lane changes nothing
            existing = await session.harness.lane(item.lane)
            if existing is None:
                await self._decision_refused(item, NO_WAIT_DECISION_TEXT, "no lane")
                return
            session.in_flight.add(item.id)
            self._track(session, item.lane, self._decide(session, item, existing, decision))
            return
        lane = await self._lane(session, item.lane)
        if lane is None:
            await self._refuse(item, "the lane cannot be created")
            return
        if item.kind == "operator":
            session.in_flight.add(item.id)
            self._track(session, item.lane, self._operate(session, item, lane, action))
            return
        await self._message(session, item, lane, inbound)

    async def _lane(self, session: _Session, name: str) -> AgentLane | None:
        harness = session.harness
        lane = await harness.lane(name)
        if lane is not None:
            return lane
        created = await harness.create_lane(name, None)
        if isinstance(created, Ok):
            return created.value
        return await harness.lane(name)  # created meanwhile (LaneExists), or invalid (None)

    async def _message(
        self, session: _Session, item: InboxItem, lane: AgentLane, inbound: Inbound
    ) -> None:
        """Start a run with the message, or queue it on the busy lane by the policy.

        A message is acknowledged only once the lane holds it; one that cannot be placed yet
        (the lane is busy under ``next_run``, or a compaction holds it) stays pending and is
        tried again at the next look, so a lane that goes idle meanwhile never strands it.
        """
        if is_stop(inbound.text) and await stop(
            self._broker, item, inbound, lane, now_ms=self._clock.now_ms()
        ):
            self._accepted(inbound)
            # the open operation is aborted: a run that was working replies when its task ends,
            # one that waited for approval has no task, and its request's copies need closing
            self._track(session, lane.name, asyncio.sleep(0))
            return
        inbox = self._broker.inbox
        entry_id = entry_id_of(item.dedupe_key)
        renewed = False  # the id was an earlier message's: this one has its own now
        if inbound.context or inbound.attachments:
            stored = await session.storage.get_entry(entry_id)
            if _earlier(stored, item):
                entry_id, renewed = _renewed(item), True
            elif stored is not None:
                # taken before a crash: its text had the context (the lane was new then), its
                # files' blobs may be gone since; built again now it could differ from the entry
                await inbox.ack(item.session, item.id)
                return
        fresh = bool(inbound.context) and await self._fresh(lane)
        profiles = self._profiles
        session.threads[lane.name] = inbound.thread
        await self._read_budget(session.ticket.session, lane.name, inbound.thread, session.budgets)
        policy = self.config.busy_policy
        if profiles is not None:
            policy = profiles.of(inbound.thread).busy_policy or policy
        for _ in range(3):  # the lane may go idle or busy between two calls
            if not await self._busy(lane):
                given = None
                if profiles is not None:  # idle: the run about to start takes the profile
                    given = await profiles.apply(
                        lane, inbound.thread, inbound.author, session.tools
                    )
                    session.given[lane.name] = given
                text = _text_of(inbound, with_context=fresh, tag=self._tag(given, inbound))
                if policy == "next_run":  # this run answers this message alone
                    session.answering[lane.name] = dict(inbound.reply_context)
                try:
                    started = await lane.start(
                        await self._content(session, text, item, inbound), entry_id=entry_id
                    )
                finally:
                    session.given.pop(lane.name, None)  # its run took it, or none started
                    session.answering.pop(lane.name, None)
                if isinstance(started, Ok):
                    outcome = started.value.outcome()
                    after_s = self._working_after.get(inbound.thread.channel)
                    if after_s is not None:
                        outcome = self._working(item, started.value.run_id, outcome, after_s)
                    self._track(session, lane.name, outcome)
                    await inbox.ack(item.session, item.id)
                    self._accepted(inbound)
                    return
                own = None if renewed else await _own_id(session, entry_id, item, started.error)
                if own is not None:  # a message id reused past the dedupe window: a new message
                    entry_id, renewed = own, True
                    continue
                if started.error.tag == "AlreadyAccepted":
                    await inbox.ack(item.session, item.id)
                    return
                if started.error.tag != "LaneBusy":
                    await self._refuse(item, started.error.tag)
                    return
            if policy == "next_run":
                await self._held_behind_approval(session, item, lane)
                return  # stays pending: it starts the lane's next run
            queue = lane.steer if policy == "steer" else lane.follow_up
            given = await lane_profile(lane) if profiles is not None else None
            text = _text_of(inbound, with_context=fresh, tag=self._tag(given, inbound))
            queued = await queue(
                await self._content(session, text, item, inbound), entry_id=entry_id
            )
            if isinstance(queued, Ok):
                await self._held_behind_approval(session, item, lane)
                await inbox.ack(item.session, item.id)
                self._accepted(inbound)
                return
            own = None if renewed else await _own_id(session, entry_id, item, queued.error)
            if own is not None:
                entry_id, renewed = own, True
                continue
            if queued.error.tag != "NoActiveRun":
                await self._refuse(item, queued.error.tag)
                return
        # still racing, or a compaction holds the lane: pending until the next look

    async def _held_behind_approval(
        self, session: _Session, item: InboxItem, lane: AgentLane
    ) -> None:
        """Tell the thread its message waits for an approval's decision, once per message.

        The notice's id is the item's, and this take asks the broker once per item.
        """
        if item.id in session.told_held:
            return
        info = await lane.info()
        if info.status != "suspended" or info.suspended != "approval":
            return
        with contextlib.suppress(Exception):  # a notice lost is only a notice
            state = await self._broker.threads.get(item.session, item.lane)
            if state is not None:
                await enqueue_held_notice(self._broker, state, item.id, now_ms=self._clock.now_ms())
                session.told_held.add(item.id)

    async def _content(
        self, session: _Session, text: str, item: InboxItem, inbound: Inbound
    ) -> str | UserMessage:
        """The user message: `text`, with a part per file the channel took in (D223)."""
        content = await user_content(
            text,
            inbound,
            self._broker.blobs,
            item.session,
            self._file_limits,
            read=session.files_read,
        )
        return content if isinstance(content, str) else UserMessage(content=content)

    def _tag(self, given: LaneProfile | None, inbound: Inbound) -> str | None:
        """Who wrote `inbound`, when the lane's system prompt does not already say so."""
        if self._profiles is None or given is None:
            return None
        return self._profiles.tag(given, inbound.author)

    async def _working(
        self, item: InboxItem, run_id: str, outcome: Awaitable[Any], after_s: float
    ) -> Any:
        """Await the run; if it is still working after `after_s`, tell its thread once (D214).

        The notice's delivery id names the run, so a resumed run never sends a second one; a
        run that suspends (an approval) or ends first sends none.
        """
        task = asyncio.ensure_future(outcome)
        try:
            done, _ = await asyncio.wait({task}, timeout=after_s)
            if not done:
                with contextlib.suppress(Exception):  # a notice lost is only a notice
                    state = await self._broker.threads.get(item.session, item.lane)
                    if state is not None:
                        await enqueue_working_notice(
                            self._broker, state, run_id, now_ms=self._clock.now_ms()
                        )
            return await task
        finally:
            task.cancel()  # only when this was cancelled first: a done task ignores it

    def _accepted(self, inbound: Inbound) -> None:
        if self._metrics is not None:
            self._metrics.message_accepted(inbound.thread.channel)

    async def _refuse(self, item: InboxItem, reason: str) -> None:
        """Reject an item the lane cannot take, and tell its thread (never silently dropped)."""
        await self._broker.inbox.reject(item.session, item.id, reason)
        log.warning(event("message refused", session=item.session, item=item.id, reason=reason))
        state = await self._broker.threads.get(item.session, item.lane)
        if state is not None:
            await enqueue_refusal_notice(self._broker, state, item.id, now_ms=self._clock.now_ms())

    async def _fresh(self, lane: AgentLane) -> bool:
        """Whether the lane holds no message yet (a thread's context goes into its first one).

        Its profile's entries may be there already (written just before a run that a crash
        then kept from starting): they are not messages.
        """
        info = await lane.info()  # this lane's status only: a session may hold thousands
        if info.operation_id is not None:
            return False
        if info.leaf_id is None:
            return True
        return not await lane.session.find_entries_on_branch(_NEWEST_MESSAGE)

    async def _busy(self, lane: AgentLane) -> bool:
        return (await lane.info()).operation_id is not None

    async def _operate(
        self, session: _Session, item: InboxItem, lane: AgentLane, action: OperatorAction
    ) -> None:
        try:
            if self._profiles is not None and lane.name not in session.threads:
                thread = await self._thread_of(session.ticket.session, lane.name)
                if thread is not None:  # a resume or unstick is judged by the lane's cap
                    session.threads[lane.name] = thread
            thread = session.threads.get(lane.name)
            if thread is not None:  # a retry after an operator raised the lane's budget
                await self._read_budget(session.ticket.session, lane.name, thread, session.budgets)
            done = await carry_out(
                action,
                lane,
                session.storage,
                self._broker,
                self._clock,
                waits=lambda refusal: self._wait_for_tools(session, lane.name, refusal),
            )
            if done.status == "pending":  # its tools are missing: the next take does it
                session.deferred.add(item.id)
                return
            await self._broker.inbox.ack(item.session, item.id)
        finally:
            session.in_flight.discard(item.id)

    async def _decision_refused(self, item: InboxItem, told: str, reason: str) -> None:
        """Reject a decision that cannot apply, and tell its thread (if the thread is known)."""
        await self._broker.inbox.reject(item.session, item.id, reason)
        log.info(event("decision refused", session=item.session, item=item.id, reason=reason))
        state = await self._broker.threads.get(item.session, item.lane)
        if state is not None:
            now_ms = self._clock.now_ms()
            await enqueue_decision_notice(self._broker, state, item.id, told, now_ms=now_ms)

    async def _misnamed(
        self, session: _Session, item: InboxItem, decision: DecisionInbound
    ) -> str | None:
        """Why a decision names something its lane does not hold (None: its ids agree).

        The lane's admission rules check the wait, the calls and their digests; the run and the
        session a click names are checked here (the intake did too, without the lease).
        """
        stored = await session.storage.get_record(decision.wait_id)
        wait = stored.record if stored is not None else None
        if not isinstance(wait, ApprovalRequested) or wait.lane != item.lane:
            return NO_WAIT_DECISION_TEXT  # a made-up wait is not one that stopped waiting
        if wait.run_id != decision.run_id or decision.session not in (None, item.session):
            return MISMATCHED_DECISION_TEXT
        return None

    async def _decide(
        self, session: _Session, item: InboxItem, lane: AgentLane, decision: DecisionInbound
    ) -> None:
        """Apply a decision to its lane, after the decisions accepted before it were judged.

        `resume` returns when the resumed run stops (minutes, maybe): the lane's next decision
        waits only until this one is recorded (`ApprovalDecidedEvent`) or refused, so the first
        decision accepted is the first the lane judges, on every backend.
        """
        session.threads.setdefault(lane.name, decision.thread)
        gate = session.deciding.setdefault(lane.name, asyncio.Lock())
        await gate.acquire()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                gate.release()

        session.judged[lane.name] = release
        try:
            misnamed = await self._misnamed(session, item, decision)
            if misnamed is not None:
                await self._decision_refused(item, misnamed, "misnamed")
                return
            result = await lane.resume(
                [
                    ApprovalDecision(
                        tool_call_id=d.tool_call_id,
                        args_digest=d.args_digest,
                        approved=d.approved,
                        reason=d.reason,
                        supplied=d.supplied,  # done by the decider: the tool does not run (D263)
                    )
                    for d in decision.decisions
                ],
                wait_id=decision.wait_id,
                decided_by=decision.decided_by.id,
                idempotency_key=decision.slot,
                tool_recovery=self.config.tool_recovery,
            )
            if isinstance(result, Err) and isinstance(result.error, MissingIdentities):
                # a tool of the wait is not offered (its server restarts, or dropped it): the
                # decision was acked unapplied and the lane waited for good (D396)
                self._wait_for_tools(session, lane.name, result.error)
                session.deferred.add(item.id)
                return
            outcome = "applied" if isinstance(result, Ok) else result.error.tag
            await self._broker.audit.record(
                _audit(
                    self.actor,
                    "approval decided",
                    session.ticket.session,
                    lane.name,
                    decision.wait_id,
                    outcome,
                    {
                        "decided_by": decision.decided_by.id,
                        # where it came from, and whether that channel vouched for the name (a
                        # web page click names itself): a typed id read as the person's own
                        "channel": decision.thread.channel,
                        "space": decision.thread.space,
                        "identified": decision.identified,
                    },
                )
            )
            told = None if isinstance(result, Ok) else _not_applied(result.error)
            state = (
                None if told is None else await self._broker.threads.get(item.session, lane.name)
            )
            if told is not None and state is not None:  # a click that did nothing is not silent
                now_ms = self._clock.now_ms()
                await enqueue_decision_notice(self._broker, state, item.id, told, now_ms=now_ms)
            await self._broker.inbox.ack(item.session, item.id)
        finally:
            if session.judged.get(lane.name) is release:
                del session.judged[lane.name]
            release()
            session.in_flight.discard(item.id)


def _stand_in(name: str) -> Tool:
    """A tool no server offers any more, for an interrupted call of it to be resumed (D373).

    The harness resumes an operation only with every tool of its unresolved calls (the
    runtime's rule): a call cut by a crash, of a tool renamed or removed meanwhile, left its
    lane suspended for ever, its thread unanswered. Declared never to replay, the stand-in is
    never run for such a call (it is reported interrupted, "may have had its effect"); a call
    the model makes of it now reads that the tool is no longer offered.
    """

    async def gone(args: Any, ctx: ToolContext) -> ToolOutput:
        said = f"the tool {name!r} is no longer offered: it was not run; do not call it again"
        return ToolOutput(content=(TextPart(text=said),), is_error=True)

    return Tool(
        name=name,
        description="No longer offered: do not call it.",
        execute=gone,
        parameters={"type": "object", "properties": {}},
        replay="never",
    )


def _not_applied(refusal: Any) -> str | None:
    """What a thread is told when a decision from it could not be applied (None: nothing)."""
    if refusal.tag in ("NothingToResume", "WaitSuperseded", "LaneBusy"):
        return LATE_DECISION_TEXT  # stopped, decided, or decided and working again
    if refusal.tag == "DecisionsMismatch":
        late = getattr(refusal, "reason", None) == "already_decided"
        return LATE_DECISION_TEXT if late else MISMATCHED_DECISION_TEXT
    return None


_REUSED_MS = 30_000
"""How much older than its inbox item an entry under the item's message id must be to be an
earlier message's (clocks of two processes differ; the dedupe window is a minute at least)."""


async def _own_id(session: _Session, entry_id: str, item: InboxItem, error: object) -> str | None:
    """A new entry id for `item` when `error` says its id holds an earlier message.

    None: the id holds this one (taken before a crash), or the refusal was another.
    """
    if _id_taken(error) and _earlier(await session.storage.get_entry(entry_id), item):
        return _renewed(item)
    return None


def _renewed(item: InboxItem) -> str:
    """The entry id of a message whose id an earlier message of the session took."""
    return entry_id_of(f"{item.dedupe_key}\n{item.id}")


def _id_taken(error: object) -> bool:
    """Whether a refused start or queue found the message's entry id already in the session."""
    tag = getattr(error, "tag", None)
    return tag == "AlreadyAccepted" or (
        tag == "InvalidMessage" and getattr(error, "reason", None) == "entry_id_conflict"
    )


def _earlier(stored: StoredEntry | None, item: InboxItem) -> bool:
    """Whether `stored`, under `item`'s message id, is an earlier message's, not this item's.

    The inbox forgets a message id after its dedupe window, the session never does: a sender
    that used the id again a day later got its message refused ("send it again in other
    words", which under the same id could not help) or, same text, dropped unanswered.
    """
    return stored is not None and stored.timestamp < item.appended_at_ms - _REUSED_MS


def _text_of(inbound: Inbound, *, with_context: bool = False, tag: str | None = None) -> str:
    """The user message for an inbound message: its text, then its attachments' metadata.

    `with_context` (the message starts its lane): the thread's earlier messages come first, one
    per line with their author, so the model reads the conversation it was called into. `tag`
    (who wrote it, when not the thread's starter: `gateway.profiles.author_tag`) opens the text.
    """
    lines = []
    if with_context and inbound.context:
        lines.append("Earlier in this thread:")
        if inbound.context_omitted:  # older than those shown (D169)
            lines.append(f"({inbound.context_omitted:,} earlier messages are not shown.)")
        for earlier in inbound.context:
            who = earlier.author.name or earlier.author.id
            lines.append(f"{who}: {earlier.text}")
        lines.append("")
        lines.append("The message to you:")
    if tag is not None:
        lines.append(f"{tag} {inbound.text}" if inbound.text else tag)
    elif inbound.text:
        lines.append(inbound.text)
    lines += [attachment_line(attachment) for attachment in inbound.attachments]
    lines += agent_notes(inbound)  # what the channel left out (D169)
    return "\n".join(lines) or "(empty message)"


def _audit(
    actor: str,
    action: str,
    session: str,
    lane: str,
    target: str,
    outcome: str,
    details: dict[str, Any],
) -> Any:
    from gateway.broker.contract import NewAuditEvent

    return NewAuditEvent(
        actor=actor,
        action=action,
        session=session,
        lane=lane,
        target=target,
        outcome=outcome,
        details=details,
    )


def _failed(session: str, end: RunEnd) -> None:
    """Log a run that ended failed, with its code (the model's error kind, ``retries_exhausted``).

    Never the provider's words: they may quote the request or part of a key.
    """
    if end.outcome == "failed":
        code = end.error.code if end.error is not None else "failed"
        log.warning(event("run failed", session=session, lane=end.lane, code=code))


def _retrying(session: str, retry: RetryScheduled) -> None:
    """Log a model request that failed and goes again: what failed, and when it goes."""
    log.info(
        event(
            "model request retried",
            session=session,
            lane=retry.lane,
            kind=retry.error_kind or "unknown",
            attempt=retry.attempt,
            delay_ms=retry.delay_ms,
        )
    )


def _log_fault(what: str, session: str, exc: BaseException) -> None:
    """One error line for a session that failed or faulted: its type, and why on one line.

    The store's words: an operator saw only ``HarnessFault``.
    """
    log.error(event(what, session=session, error=type(exc).__name__, reason=one_line(str(exc))))
