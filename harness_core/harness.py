"""`AgentHarness` and `AgentLane`: the public surface of the durable runtime.

`AgentHarness.create()` restores the lanes with open operations read-only (every other lane
loads on first use) and reports the operations a crash (or a deferred request) left open;
`lane.resume()` continues one, never starting a new one. The harness is also lane ``main``.
Expected rejections are `Err` values; a storage failure faults the whole harness
(`HarnessFault` from every call until reopened) and `close()` makes in-flight calls raise
`HarnessClosed` while their durable operations stay resumable.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeAlias, TypeVar

from pydantic import TypeAdapter, ValidationError

from harness_core._runtime import lane_jobs
from harness_core._runtime.context import plan_compaction
from harness_core._runtime.effects import Effects
from harness_core._runtime.gate import ActionInfo, Gate, GatedEffects
from harness_core._runtime.lane import HarnessRuntime, LaneRuntime
from harness_core._runtime.lane_jobs import Prior, config_entry, decision_id
from harness_core._runtime.lane_table import LaneTable
from harness_core._runtime.lease import LeaseKeeper
from harness_core._runtime.procedures import Procedures
from harness_core._runtime.reduction import LaneState, OperationState
from harness_core._runtime.restore import restore_lane
from harness_core._runtime.telemetry import Telemetry
from harness_core.approvals import check_decisions
from harness_core.clock import SystemClock
from harness_core.errors import (
    HarnessClosed,
    HarnessError,
    HarnessFault,
    LeaseLost,
    RecordLogCorruption,
    SessionError,
)
from harness_core.events import (
    ConfigUpdate,
    EventBus,
    LaneCreated,
    LeaseLostEvent,
    LeaseRenewalFailed,
    Listener,
    RunResume,
)
from harness_core.frozen import FrozenJson, JsonValue, freeze_json, invalid_reason, revalidated
from harness_core.hooks import BeforeResumeEvent, BeforeRunEvent, Hooks, run_hook
from harness_core.ids import Uuid7Ids
from harness_core.messages import (
    AgentMessage,
    AssistantMessage,
    DeferredHandle,
    TextPart,
    TokenUsage,
    UserMessage,
)
from harness_core.models import ModelRef
from harness_core.options import AgentHarnessOptions
from harness_core.portable import (
    CapabilityState,
    HarnessState,
    capabilities_of,
    capability_entry,
)
from harness_core.result import (
    AbortAccepted,
    AlreadyAccepted,
    Closed,
    DecisionsMismatch,
    DecisionsRequired,
    Err,
    InvalidLane,
    InvalidMessage,
    InvalidUsage,
    LaneBusy,
    LaneExists,
    LaneStuck,
    MissingIdentities,
    NoActiveOperation,
    NoActiveRun,
    NothingToCompact,
    NothingToResume,
    Ok,
    Outcome,
    Result,
    UnknownQueueItem,
    UnknownTarget,
    WaitSuperseded,
)
from harness_core.session.contract import SessionStorage
from harness_core.session.durability import deferred_durability, durability_deferred
from harness_core.session.entries import CustomEntry, Entry, Id, MessageEntry
from harness_core.session.names import check_lane_name
from harness_core.session.records import (
    ApprovalDecided,
    ApprovalDecision,
    ApprovalRequested,
    CompactionIntent,
    NavigationIntent,
    OperationError,
    OperationFinished,
    OperationKind,
    OperationOutcome,
    OperationStarted,
    PendingApproval,
    QueueEnqueued,
    RunIntent,
    Usage,
)
from harness_core.session.types import (
    BranchQuery,
    EntryQuery,
    LabelFact,
    NameFact,
    RecordQuery,
    SessionStats,
    StoredEntry,
    StoredRecord,
)
from harness_core.tools import Tool, ToolRecovery

__all__ = [
    "AgentHarness",
    "AgentLane",
    "LaneInfo",
    "LaneSnapshot",
    "LaneStatus",
    "PromptInput",
    "SessionTree",
    "Started",
    "SuspendReason",
    "SuspendedOperation",
    "Watch",
]

_ENTRY_ID: TypeAdapter[str] = TypeAdapter(Id)

PromptInput: TypeAlias = str | UserMessage | Sequence[UserMessage]
"""A prompt: text (one user message), a user message, or several in order."""

_T = TypeVar("_T")

_LISTING_BATCH = 64
"""Lanes read from storage at once by `lanes()` (bounded concurrency on big sessions)."""


SuspendReason: TypeAlias = Literal["crash", "deferred", "approval"]
"""Why an open operation is not executing: a process died mid-operation (``crash``), a background
model request is pending (``deferred``), or calls wait for a person's decision (``approval``)."""

LaneStatus: TypeAlias = Literal[
    "idle", "running", "suspended", "aborting", "failed", "stuck", "faulted"
]
"""What a lane is doing: nothing (``idle``; ``failed`` when its newest operation failed), an
operation executes (``running``, ``aborting``) or waits (``suspended``; ``stuck`` when a crash
interrupted it `max_attempts` times), or its durable log cannot be restored (``faulted``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SuspendedOperation:
    """An operation `create()` found open, and why.

    A non-empty `missing_tools` or `missing_models` means `resume()` will refuse until the
    harness has them (abort still works). `stuck` means it was interrupted `attempts` times
    (`max_attempts`): `resume()` refuses unless told to `unstick`.
    """

    lane: str
    kind: OperationKind
    id: str
    started_at: int
    reason: SuspendReason
    prompt: tuple[AgentMessage, ...] = ()
    deferred: DeferredHandle | None = None
    aborting: bool = False
    missing_tools: tuple[str, ...] = ()
    missing_models: tuple[str, ...] = ()
    pending_approvals: tuple[PendingApproval, ...] = ()
    """Reason ``approval``: the calls to decide (`resume(decisions, wait_id=...)`)."""
    wait_id: str | None = None
    """Reason ``approval``: the wait the decisions must name."""
    attempts: int = 1
    """Executions of the operation begun in its current budget (the interrupted one included)."""
    stuck: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class Started:
    """A run durably accepted (or, for a repeated input, the run that accepted it first)."""

    run_id: str
    _wait: Callable[[], Awaitable[Outcome]]

    async def outcome(self) -> Outcome:
        """How the run first stops: its end, or its suspension (approval, deferred, close)."""
        return await self._wait()


@dataclass(frozen=True, kw_only=True, slots=True)
class LaneInfo:
    """A lane and what it is doing (see `LaneStatus`)."""

    name: str
    leaf_id: str | None
    operation_id: str | None = None
    operation_kind: OperationKind | None = None
    status: LaneStatus = "idle"
    suspended: SuspendReason | None = None
    """Why the open operation waits (statuses ``suspended`` and ``stuck``)."""
    attempts: int = 0
    """Executions of the open operation begun in its current budget (0 when idle)."""
    last_outcome: OperationOutcome | None = None
    """How the lane's newest finished operation ended."""
    error: OperationError | None = None
    """Why it failed (status ``failed``), or why it was aborted when the abort said (status
    ``idle``, `last_outcome` ``aborted``: ``authority_revoked``..., D266)."""
    fault: str | None = None
    """Why the lane cannot be restored (status ``faulted``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LaneSnapshot:
    """A lane at one instant: its transcript (context window), operation and queues."""

    lane: str
    leaf_id: str | None
    transcript: tuple[StoredEntry, ...]
    status: LaneStatus
    operation_id: str | None
    steer: tuple[Entry, ...]
    follow_up: tuple[Entry, ...]
    next_run: tuple[Entry, ...]
    pending_writes: tuple[Entry, ...]
    faulted: bool


class Watch:
    """A snapshot plus the events after it, with no gap: call `start(listener)` when ready."""

    def __init__(self, bus: EventBus, watcher: Any, snapshot: LaneSnapshot) -> None:
        self.snapshot = snapshot
        self._bus = bus
        self._watcher = watcher

    def start(self, listener: Listener) -> None:
        """Deliver the buffered events in order, then live ones."""
        self._bus.start(self._watcher, listener)

    def unsubscribe(self) -> None:
        """Stop delivery and drop the buffer."""
        self._bus.unwatch(self._watcher)


@dataclass(frozen=True, kw_only=True, slots=True)
class _ResumeRequest:
    """What a `resume()` call asks for (judged in the lane's job)."""

    decisions: tuple[ApprovalDecision, ...] | None
    wait_id: str | None
    key: str | None
    decided_by: str | None
    tool_recovery: ToolRecovery
    unstick: bool


def _normalize(
    lane: str, value: PromptInput, entry_id: str | None = None
) -> Result[tuple[UserMessage, ...], InvalidMessage]:
    if entry_id is not None:
        try:
            _ENTRY_ID.validate_python(entry_id)
        except ValidationError:
            return Err(
                InvalidMessage(
                    message=f"entry id {entry_id!r} must be 1-256 characters without whitespace",
                    lane=lane,
                    reason="entry_id",
                )
            )
        if not isinstance(value, str | UserMessage) and len(value) != 1:
            return Err(
                InvalidMessage(
                    message="a chosen entry_id names one message", lane=lane, reason="entry_id"
                )
            )
    if isinstance(value, str):
        return Ok((UserMessage(content=(TextPart(text=value),)),))
    messages: tuple[Any, ...] = (value,) if isinstance(value, UserMessage) else tuple(value)
    if not messages:
        return Err(
            InvalidMessage(message="a prompt needs at least one message", lane=lane, reason="empty")
        )
    checked = []
    for message in messages:
        if not isinstance(message, UserMessage):
            return Err(
                InvalidMessage(
                    message="only user messages can be prompted or queued, "
                    f"got {type(message).__name__}",
                    lane=lane,
                    reason="not a user message",
                )
            )
        try:
            checked.append(revalidated(message))  # built by the caller, maybe unvalidated
        except ValidationError as exc:
            return Err(
                InvalidMessage(
                    message=f"invalid user message: {invalid_reason(exc)}",
                    lane=lane,
                    reason="invalid",
                )
            )
    return Ok(tuple(checked))


_F = TypeVar("_F", bound=Callable[..., Awaitable[Any]])
_C = TypeVar("_C", bound=type)


def _pinned(method: _F) -> _F:
    """Keep the lane loaded for the whole call (see `LaneTable.pinned`)."""

    @functools.wraps(method)
    async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        harness, name = self._pin_target()
        with harness._table.pinned(name):
            return await method(self, *args, **kwargs)

    return call  # type: ignore[return-value]


def _pinning(cls: _C) -> _C:
    """Pin the lane during every public coroutine method of a lane facade.

    A call may hold its lane's runtime across awaits (hooks, storage reads); were the lane
    dropped from memory meanwhile, a reload would make a second mutation line for it.
    """
    for name, member in list(vars(cls).items()):
        if not name.startswith("_") and inspect.iscoroutinefunction(member):
            setattr(cls, name, _pinned(member))
    return cls


@_pinning
class SessionTree:
    """A lane's view of the session tree: reads default to the lane's leaf, writes append to it."""

    def __init__(self, lane: AgentLane) -> None:
        self._lane = lane

    def _pin_target(self) -> tuple[AgentHarness, str]:
        return self._lane._harness, self._lane._name

    async def get_leaf_id(self) -> str | None:
        """The lane's leaf."""
        return (await self._lane._lane_rt()).state.leaf_id

    async def get_entry(self, entry_id: str) -> StoredEntry | None:
        """Point lookup (committed entries only: a deferred write is not there until applied)."""
        return await self._lane._harness._storage().get_entry(entry_id)

    async def find_entries(self, query: EntryQuery | None = None) -> tuple[StoredEntry, ...]:
        """Session-wide query over every branch."""
        return await self._lane._harness._storage().find_entries(query)

    async def find_entries_on_branch(
        self, query: BranchQuery | None = None
    ) -> tuple[StoredEntry, ...]:
        """Path query; `start` defaults to the lane's leaf (an empty lane has an empty path)."""
        lane = await self._lane._lane_rt()
        leaf = lane.state.leaf_id
        if query is None or not query.start:
            if leaf is None:
                return ()
            query = BranchQuery(start=leaf) if query is None else _with_start(query, leaf)
        cached = lane.context.cached_path(query)
        if cached is not None:
            return cached
        return await self._lane._harness._storage().find_entries_on_branch(query)

    async def get_name(self) -> str | None:
        """The session's name."""
        return await self._lane._harness._storage().get_name()

    async def set_name(self, name: str) -> None:
        """Set the session's name (a global fact, applied at once)."""
        await (await self._lane._lane_rt()).set_fact(NameFact(name=name))

    async def get_label(self, target_id: str) -> str | None:
        """An entry's label."""
        return await self._lane._harness._storage().get_label(target_id)

    async def set_label(self, target_id: str, label: str | None) -> None:
        """Label an entry (None clears)."""
        await (await self._lane._lane_rt()).set_fact(LabelFact(target_id=target_id, label=label))

    async def get_stats(self) -> SessionStats:
        """The session's running counters."""
        return await self._lane._harness._storage().get_stats()

    async def append_message(self, message: AgentMessage) -> str:
        """Append a message to the lane: deferred to the next checkpoint while a run is open."""
        runtime = await self._lane._lane_rt()
        entry = MessageEntry(id=runtime.runtime.ids.next(), message=message)
        return await lane_jobs.write(runtime, entry)

    async def append_custom_entry(self, custom_type: str, data: JsonValue = None) -> str:
        """Append application data to the lane (deferred while a run is open)."""
        runtime = await self._lane._lane_rt()
        return await lane_jobs.write(
            runtime, CustomEntry(id=runtime.runtime.ids.next(), custom_type=custom_type, data=data)
        )


def _accepted_input(prior: Prior, entry_id: str) -> AgentMessage | None:
    """The message an earlier acceptance recorded under `entry_id` (None: not an input)."""
    record = prior.record.record if prior.record is not None else None
    if isinstance(record, OperationStarted) and isinstance(record.intent, RunIntent):
        entry = next((e for e in record.intent.initial_messages if e.id == entry_id), None)
    elif isinstance(record, QueueEnqueued):
        entry = record.target if record.target.id == entry_id else None
    else:
        entry = None
    return entry.message if isinstance(entry, MessageEntry) else None


def _conflict(lane: str, entry_id: str) -> Err[InvalidMessage]:
    return Err(
        InvalidMessage(
            message=f"entry id {entry_id!r} was used before for other content",
            lane=lane,
            reason="entry_id_conflict",
        )
    )


def _with_start(query: BranchQuery, start: str) -> BranchQuery:
    return replace(query, start=start)


@_pinning
class AgentLane:
    """One lane: a stateless facade bound to a name (identity is the name, not the object)."""

    def __init__(self, harness: AgentHarness, name: str) -> None:
        self._harness = harness
        self._name = name
        self.session = SessionTree(self)

    @property
    def name(self) -> str:
        """The lane's name."""
        return self._name

    def _pin_target(self) -> tuple[AgentHarness, str]:
        return self._harness, self._name

    async def _lane_rt(self) -> LaneRuntime:
        """The lane's runtime, restored from storage on first use (see `LaneTable`)."""
        runtime = self._harness._rt
        runtime.check()
        lane = await self._harness._table.get(self._name)
        if lane is None:
            raise HarnessError(f"lane {self._name!r} does not exist")
        if lane.fault is not None:
            raise lane.fault
        return lane

    def _closed(self) -> Err[Closed] | None:
        runtime = self._harness._rt
        if runtime.fault is not None:
            raise runtime.fault
        if runtime.closed:
            return Err(Closed())
        lane = runtime.lanes.get(self._name)
        if lane is not None and lane.fault is not None:
            raise lane.fault
        return None

    async def get_leaf_id(self) -> str | None:
        """The lane's leaf."""
        return (await self._lane_rt()).state.leaf_id

    async def info(self) -> LaneInfo:
        """The lane and what it is doing, as `AgentHarness.lanes()` lists it (one lane's reads).

        A faulted lane reports its fault here rather than raising it.
        """
        self._harness._rt.check()
        lane = await self._harness._table.get(self._name)
        if lane is None:
            raise HarnessError(f"lane {self._name!r} does not exist")
        return _live_info(lane)

    # -- operations ----------------------------------------------------------------------------

    async def prompt(
        self, value: PromptInput, *, entry_id: str | None = None
    ) -> Result[Outcome, LaneBusy | InvalidMessage | AlreadyAccepted | Closed]:
        """Start a run with this input and wait for it to finish (or suspend).

        `entry_id` chooses the user message's entry id (the gateway derives it from the inbound
        message), making the call idempotent: if that input was accepted before, nothing is
        written and the result is the original one (the run's first stop: its outcome, or its
        suspension), or `AlreadyAccepted` if it was queued instead; the same id with other
        content is `InvalidMessage(reason="entry_id_conflict")`.
        """
        # Nobody hears of the acceptance before the outcome, so it may commit with the run's
        # first batch, at the barrier before the model call (D112); a refusal wrote nothing,
        # and the procedure syncs whatever it wrote before it ends. Manual drive keeps every
        # write durable on return.
        manual = self._harness._rt.options.drive == "manual"
        with contextlib.nullcontext() if manual else deferred_durability():
            started = await self.start(value, entry_id=entry_id)
        if isinstance(started, Err):
            return started
        return Ok(await started.value.outcome())

    async def start(
        self, value: PromptInput, *, entry_id: str | None = None
    ) -> Result[Started, LaneBusy | InvalidMessage | AlreadyAccepted | Closed]:
        """`prompt`, returning as soon as the run is durably accepted.

        A service acknowledges its inbound message then; `await started.outcome()` says how the
        run stops. A repeated input returns the run that accepted it first.
        """
        if (closed := self._closed()) is not None:
            return closed
        normalized = _normalize(self._name, value, entry_id)
        if isinstance(normalized, Err):
            return normalized
        runtime = self._harness._rt
        lane = await self._lane_rt()
        # before the hooks: a repeat must change nothing
        mark = runtime.write_mark()
        prior = await lane_jobs.prior(lane, entry_id)
        if prior is not None and entry_id is not None:
            await self._durable_prior(runtime)
            return self._harness._prompted_before(lane, prior, entry_id, normalized.value[0])
        messages, override, resume_data = await run_hook(
            runtime.hooks,
            "before_run",
            BeforeRunEvent(
                lane=self._name,
                prompt=normalized.value,
                system_prompt=runtime.system_prompt(self._name),
            ),
            lambda name, exc: runtime.report("hook", name, exc),
        )
        ids = [entry_id or runtime.ids.next(), *(runtime.ids.next() for _ in normalized.value[1:])]
        entries = (
            *(MessageEntry(id=i, message=m) for i, m in zip(ids, normalized.value, strict=True)),
            *(MessageEntry(id=runtime.ids.next(), message=m) for m in messages),
        )

        def intent(state: LaneState) -> RunIntent:
            return RunIntent(
                original_prompt=normalized.value,
                initial_messages=(*state.pending_next_run, *entries),
                system_prompt_override=override,
                resume_data=resume_data or None,
            )

        accepted = await lane_jobs.accept(
            lane,
            intent,
            lambda: self._harness._execute(lane, resumed=False),
            input_id=entry_id,
            new_at=mark,  # read as new just now: unless something was written since, it still is
        )
        if isinstance(accepted, Prior):  # a concurrent submission of the same input won
            assert entry_id is not None
            await self._durable_prior(runtime)
            return self._harness._prompted_before(lane, accepted, entry_id, normalized.value[0])
        if isinstance(accepted, Err):
            return accepted
        op, task = accepted.value
        return Ok(Started(run_id=op.id, _wait=lambda: self._harness._wait(task)))

    @staticmethod
    async def _durable_prior(runtime: HarnessRuntime) -> None:
        """The prior acceptance found may be a `prompt`'s, still deferred: make it durable."""
        if not durability_deferred():
            await runtime.durable()

    async def resume(
        self,
        decisions: Sequence[ApprovalDecision] | None = None,
        *,
        wait_id: str | None = None,
        decided_by: str | None = None,
        idempotency_key: str | None = None,
        tool_recovery: ToolRecovery = "declared",
        unstick: bool = False,
    ) -> Result[
        Outcome,
        LaneBusy
        | NothingToResume
        | MissingIdentities
        | DecisionsRequired
        | DecisionsMismatch
        | WaitSuperseded
        | LaneStuck
        | Closed,
    ]:
        """Continue this lane's open operation from its durable state (never starts a new one).

        An operation suspended for approval needs `decisions` covering exactly its pending calls
        and naming the wait they answer (`wait_id`, from the suspension); the batch is recorded
        (with `decided_by` and `idempotency_key`) before anything runs, and the same key later
        returns the same result. `tool_recovery` says what happens to a call that started before
        a crash and has no result (see `ToolRecovery`). Each resume after a crash is a counted
        attempt; after `max_attempts` the lane is stuck and only `unstick=True` (a fresh budget,
        after fixing the cause) resumes it.
        """
        if (closed := self._closed()) is not None:
            return closed
        lane = await self._lane_rt()
        harness = self._harness
        runtime = harness._rt
        key = idempotency_key or (runtime.ids.next() if decisions is not None else None)
        if decisions is not None and idempotency_key is not None:
            # a replayed key is looked up before anything about the lane's state is judged
            found = await runtime.storage.get_record(decision_id(self._name, idempotency_key))
            if found is not None:
                return await harness._replayed_decision(lane, found, decisions, wait_id)

        request = _ResumeRequest(
            decisions=tuple(decisions) if decisions is not None else None,
            wait_id=wait_id,
            key=key,
            decided_by=decided_by,
            tool_recovery=tool_recovery,
            unstick=unstick,
        )
        admitted = await lane.job(lambda: harness._admit_resume(lane, request))
        if isinstance(admitted, Err):
            if decisions is not None and idempotency_key is not None:
                # the same batch, recorded by a concurrent call since the lookup above
                found = await runtime.storage.get_record(decision_id(self._name, idempotency_key))
                if found is not None:
                    return await harness._replayed_decision(lane, found, decisions, wait_id)
            return admitted
        return Ok(await harness._wait(admitted.value))

    async def abort(
        self, reason: OperationError | None = None
    ) -> Result[AbortAccepted, NoActiveOperation | Closed]:
        """Abort the open operation: durable on return; reconciliation runs in the background.

        `reason` says why (``OperationError(code="authority_revoked", ...)``): it is recorded
        with the abort, and the operation ends ``aborted`` with it as its error (its
        `OperationFinished`, its `Outcome`, its ``run_end`` event), after a crash too (D266).
        An operation already aborting keeps the reason (or none) it was first aborted with.
        """
        if (closed := self._closed()) is not None:
            return closed
        lane = await self._lane_rt()
        result = await lane_jobs.abort(lane, reason)  # emits `run_abort` when it writes the marker
        if isinstance(result, Ok):

            async def reconcile() -> None:
                if lane.task is None and lane.state.operation is not None:
                    # reconciliation of a suspended operation: not a resume (no before_resume)
                    lane.occupy(self._harness._execute(lane, resumed=False))

            await lane.job(reconcile)  # a suspended operation has no procedure to notice the abort
        return result

    async def compact(
        self, custom_instructions: str | None = None
    ) -> Result[Outcome, LaneBusy | NothingToCompact | Closed]:
        """Summarize the lane's older context into a compaction entry (its own operation)."""
        if (closed := self._closed()) is not None:
            return closed
        lane = await self._lane_rt()
        runtime = self._harness._rt

        async def check() -> tuple[OperationState | None, tuple[AgentMessage, ...]]:
            # one job: no commit races the cold read, and a busy lane says so first
            return lane.state.operation, await lane.context.messages()

        busy, messages = await lane.job(check)
        if busy is not None:
            return lane_jobs.busy(lane, busy)
        to_summarize, _ = plan_compaction(messages, runtime.options.compaction.keep_recent_tokens)
        if not to_summarize:
            return Err(
                NothingToCompact(
                    message=f"lane {self._name!r} has nothing to compact", lane=self._name
                )
            )
        result_id = runtime.ids.next()
        accepted = await lane_jobs.accept(
            lane,
            lambda state: CompactionIntent(
                custom_instructions=custom_instructions, result_entry_id=result_id
            ),
            lambda: self._harness._execute(lane, resumed=False),
        )
        assert not isinstance(accepted, Prior)  # no caller-chosen id
        if isinstance(accepted, Err):
            return accepted
        return Ok(await self._harness._wait(accepted.value[1]))

    async def navigate_tree(
        self,
        target_id: str | None,
        *,
        summarize: bool = False,
        label: str | None = None,
        custom_instructions: str | None = None,
    ) -> Result[Outcome, LaneBusy | UnknownTarget | Closed]:
        """Move the lane's leaf to `target_id` (None: the root).

        Optionally summarizes the branch it leaves and labels the target.
        """
        if (closed := self._closed()) is not None:
            return closed
        lane = await self._lane_rt()
        runtime = self._harness._rt
        if target_id is not None and await runtime.storage.get_entry(target_id) is None:
            return Err(
                UnknownTarget(message=f"entry {target_id!r} does not exist", target_id=target_id)
            )
        if target_id is None and label is not None:
            return Err(
                UnknownTarget(
                    message="the root is not an entry: a label needs a target entry",
                    target_id=None,
                )
            )
        if target_id == lane.state.leaf_id:
            return Err(
                UnknownTarget(
                    message=f"lane {self._name!r} is already at {target_id!r}", target_id=target_id
                )
            )
        summary_id = runtime.ids.next() if summarize else None
        accepted = await lane_jobs.accept(
            lane,
            lambda state: NavigationIntent(
                target_id=target_id, summarize=summarize, custom_instructions=custom_instructions,
                label=label, summary_entry_id=summary_id,
            ),
            lambda: self._harness._execute(lane, resumed=False),
        )  # fmt: skip
        assert not isinstance(accepted, Prior)  # no caller-chosen id
        if isinstance(accepted, Err):
            return accepted
        return Ok(await self._harness._wait(accepted.value[1]))

    # -- queues --------------------------------------------------------------------------------

    async def _enqueue(
        self,
        queue: Literal["steer", "follow_up", "next_run"],
        value: PromptInput,
        entry_id: str | None,
    ) -> Result[str, NoActiveRun | InvalidMessage | Closed]:
        if (closed := self._closed()) is not None:
            return closed
        normalized = _normalize(self._name, value, entry_id)
        if isinstance(normalized, Err):
            return normalized
        if len(normalized.value) != 1:
            return Err(
                InvalidMessage(
                    message="queue one message at a time",
                    lane=self._name,
                    reason="several messages",
                )
            )
        runtime = self._harness._rt
        message = normalized.value[0]
        enqueued = await lane_jobs.enqueue(
            await self._lane_rt(),
            queue,
            MessageEntry(id=entry_id or runtime.ids.next(), message=message),
            chosen=entry_id is not None,
        )
        if isinstance(enqueued, Prior):
            assert entry_id is not None
            if _accepted_input(enqueued, entry_id) != message:
                return _conflict(self._name, entry_id)
            return Ok(entry_id)  # accepted before (as this or another kind of input)
        return enqueued

    async def steer(
        self, value: PromptInput, *, entry_id: str | None = None
    ) -> Result[str, NoActiveRun | InvalidMessage | Closed]:
        """Correct the current run: seen at its next checkpoint. Returns the item's entry id.

        `entry_id` chooses the entry's id: an input accepted before (by any method) is not
        queued again and its id is returned; other content under that id is
        `InvalidMessage(reason="entry_id_conflict")`. The same holds for `follow_up` and
        `next_run`.
        """
        return await self._enqueue("steer", value, entry_id)

    async def follow_up(
        self, value: PromptInput, *, entry_id: str | None = None
    ) -> Result[str, NoActiveRun | InvalidMessage | Closed]:
        """Add work the run takes up when it would otherwise stop (see `steer` for `entry_id`)."""
        return await self._enqueue("follow_up", value, entry_id)

    async def next_run(
        self, value: PromptInput, *, entry_id: str | None = None
    ) -> Result[str, NoActiveRun | InvalidMessage | Closed]:
        """Seed the lane's next run (always accepted; survives an abort; see `steer`)."""
        return await self._enqueue("next_run", value, entry_id)

    async def cancel_queued(
        self, entry_id: str
    ) -> Result[
        Literal["cancelled", "already_consumed", "already_cleared"], UnknownQueueItem | Closed
    ]:
        """Retract a queued item if it is still pending."""
        if (closed := self._closed()) is not None:
            return closed
        return await lane_jobs.cancel_queued(await self._lane_rt(), entry_id)

    async def record_usage(
        self, usage: TokenUsage, *, entry_id: str | None = None, details: JsonValue = None
    ) -> Result[None, InvalidUsage | Closed]:
        """Append a usage adjustment (negative values are legal; NaN and infinities are not)."""
        if (closed := self._closed()) is not None:
            return closed
        try:
            usage = revalidated(usage)
            details = freeze_json(details)
        except (ValidationError, ValueError) as exc:
            reason = invalid_reason(exc) if isinstance(exc, ValidationError) else str(exc)
            return Err(InvalidUsage(message=f"invalid usage adjustment: {reason}", lane=self._name))
        runtime = self._harness._rt
        lane = await self._lane_rt()
        run_id = lane.state.operation.id if lane.state.operation else None
        await lane.append_record(
            Usage(
                id=runtime.ids.next(),
                lane=self._name,
                cause="adjustment",
                usage=usage,
                run_id=run_id,
                entry_id=entry_id,
                details=details,
            )
        )
        return Ok(None)

    async def get_usage(self, entry_id: str | None = None) -> TokenUsage:
        """The lane's cost ledger: the sum of its usage records (failed attempts included).

        With `entry_id`, the effective cost of that entry instead: every lane's usage records
        bound to it (the responses that produced it, retries, adjustments). Both are bounded
        reads (running projections), for operator pages and budgets.
        """
        storage = self._harness._storage()
        await self._lane_rt()
        if entry_id is not None:
            return await storage.get_usage(entry_id=entry_id)
        return await storage.get_usage(lane=self._name)

    async def wait_for_idle(self) -> None:
        """Wait until no procedure executes on this lane (a suspended operation counts as idle)."""
        await (await self._lane_rt()).wait_settled()

    # -- configuration ---------------------------------------------------------------------------

    async def get_model(self) -> ModelRef:
        """The lane's effective model."""
        config = await (await self._lane_rt()).context.configuration()
        return ModelRef(provider=config.provider, model_id=config.model_id)

    async def get_thinking_level(self) -> str:
        """The lane's effective thinking level."""
        return (await (await self._lane_rt()).context.configuration()).thinking_level

    async def get_active_tools(self) -> tuple[str, ...]:
        """The names of the tools the lane's model may call."""
        config = await (await self._lane_rt()).context.configuration()
        if config.active_tools is None:
            return tuple(self._harness._rt.tools)
        return config.active_tools

    async def _configure(self, prop: str, changes: dict[str, Any], value: JsonValue) -> None:
        lane = await self._lane_rt()
        await lane_jobs.write(lane, config_entry(self._harness._rt, changes))
        self._harness._rt.events.emit(ConfigUpdate(lane=self._name, property=prop, value=value))

    async def set_model(self, model: ModelRef) -> None:
        """Use `model` on this lane from the next request (deferred while a run is open)."""
        await self._configure("model", {"model": model}, str(model))

    async def set_thinking_level(self, level: str) -> None:
        """Set the lane's thinking level."""
        await self._configure("thinking_level", {"thinking_level": level}, level)

    async def set_active_tools(self, names: Sequence[str]) -> None:
        """Set the tools the lane's model may call."""
        await self._configure("active_tools", {"active_tools": tuple(names)}, list(names))

    # -- observation ---------------------------------------------------------------------------

    async def watch(self) -> Watch:
        """A snapshot of the lane and, once started, every later event of it (no gap)."""
        lane = await self._lane_rt()
        runtime = self._harness._rt
        bus = runtime.events

        async def take() -> Watch:
            # On the mutation line, so no commit of this lane lands between the start of the
            # buffer and the snapshot read: otherwise an entry could be both in the transcript
            # and announced after it, and a cold context cache would be filled without it.
            watcher = bus.watch(self._name)  # buffer from this instant, then take the snapshot
            try:
                transcript = tuple(await lane.context.entries())
            except BaseException:
                bus.unwatch(watcher)
                raise
            op = lane.state.operation
            return Watch(bus, watcher, _snapshot(lane, transcript, op, runtime.fault is not None))

        return await lane.job(take)

    # -- portable state ----------------------------------------------------------------------------

    async def export_state(self, thread_id: str | None = None) -> HarnessState:
        """The lane's conversation (its context window) and capability data, as portable state.

        Reads committed entries only; `thread_id` defaults to the lane's name.
        """
        messages = await (await self._lane_rt()).context.messages()
        state = HarnessState(
            thread_id=thread_id or self._name, capabilities=await self._capabilities()
        )
        # the messages are the lane's own, validated when stored: checking thousands of them
        # again would cost about a microsecond each (D241)
        return state.model_copy(update={"messages": messages})

    async def _capabilities(self) -> dict[str, CapabilityState]:
        path = await (await self._lane_rt()).context.path_entries_of_type("custom")
        return capabilities_of([stored.entry for stored in path])

    async def set_capability(self, namespace: str, state: CapabilityState) -> str:
        """Record a capability's data on the lane (deferred while a run is open)."""
        lane = await self._lane_rt()
        entry = capability_entry(lane.runtime.ids.next(), namespace, state)
        return await lane_jobs.write(lane, entry)

    async def get_capability(self, namespace: str, version: str) -> FrozenJson:
        """A capability's newest data on the lane's path, if its version matches exactly."""
        state = (await self._capabilities()).get(namespace)
        return state.data if state is not None and state.version == version else None

    # -- manual drive ----------------------------------------------------------------------------

    async def _gate(self) -> Gate:
        gate = (await self._lane_rt()).gate
        if gate is None:
            raise HarnessError("manual drive controls need AgentHarnessOptions(drive='manual')")
        return gate

    async def peek_action(self) -> ActionInfo | None:
        """The lane's next parked effect, once its procedure reaches one (None: nothing to drive).

        No side effect: calling it again returns the same action until `execute_action()`.
        """
        return await (await self._gate()).peek()

    async def execute_action(self) -> ActionInfo | None:
        """Release exactly the action `peek_action()` shows; return the next one (None: settled).

        Returns once the released effect settled, parked a nested action, or the operation
        settled. Never releases two actions.
        """
        return await (await self._gate()).execute()

    async def run_to_completion(self) -> None:
        """Release actions until the lane's procedure settles (finished or suspended)."""
        await (await self._gate()).run_to_completion()


def _lease_lost(runtime: HarnessRuntime, error: LeaseLost) -> None:
    runtime.events.emit(LeaseLostEvent(message=str(error)))
    runtime.faulted(error)


def _renewal_failed(runtime: HarnessRuntime, error: BaseException) -> None:
    keeper = runtime.keeper
    expires = keeper.expires_at_ms if keeper is not None else None
    runtime.events.emit(
        LeaseRenewalFailed(error=f"{type(error).__name__}: {error}", expires_at_ms=expires or 0)
    )


def _reason(op: OperationState) -> SuspendReason:
    """Why an open operation that is not executing waits."""
    approval = op.approval
    if approval is not None and approval.waiting and not op.aborting:
        return "approval"
    return "deferred" if op.deferred is not None else "crash"


def _last_activity(op: OperationState) -> str:
    """What an interrupted operation was doing, in words an operator can act on."""
    batch = op.tool_batch
    running = [
        call.started.tool_name
        for call in (batch.calls if batch is not None else ())
        if call.started is not None and not call.result_exists
    ]
    if running:
        return f"running tool {', '.join(repr(name) for name in running)}"
    step = op.step
    if step is not None:
        article = "an" if step.kind[:1] in "aeiou" else "a"  # "an assistant", "a compaction"
        return f"waiting for {article} {step.kind} model request (attempt {step.attempts})"
    if op.missing_initial:
        return "recording its input"
    return "between steps"


def _status(lane: LaneRuntime, op: OperationState | None) -> LaneStatus:
    return _status_of(
        lane.state,
        op,
        faulted=lane.fault is not None,
        running=lane.task is not None,
        max_attempts=lane.runtime.options.max_attempts_of(lane.name),
    )


def _status_of(
    state: LaneState, op: OperationState | None, *, faulted: bool, running: bool, max_attempts: int
) -> LaneStatus:
    if faulted:
        return "faulted"
    if op is None:
        last = state.last_finished
        return "failed" if last is not None and last.outcome == "failed" else "idle"
    if op.aborting:
        return "aborting"
    if running:
        return "running"
    stuck = _reason(op) == "crash" and op.attempts >= max_attempts
    return "stuck" if stuck else "suspended"


def _info(
    state: LaneState, *, fault: HarnessFault | None, running: bool, max_attempts: int
) -> LaneInfo:
    op = state.operation
    last = state.last_finished
    status = _status_of(
        state, op, faulted=fault is not None, running=running, max_attempts=max_attempts
    )
    return LaneInfo(
        name=state.lane,
        leaf_id=state.leaf_id,
        operation_id=op.id if op else None,
        operation_kind=op.kind if op else None,
        status=status,
        suspended=_reason(op) if op and status in ("suspended", "stuck") else None,
        attempts=op.attempts if op else 0,
        last_outcome=last.outcome if last else None,
        error=last.error if last and status in ("failed", "idle") else None,
        fault=str(fault.__cause__) if fault is not None else None,
    )


def _live_info(lane: LaneRuntime) -> LaneInfo:
    return _info(
        lane.state,
        fault=lane.fault,
        running=lane.task is not None,
        max_attempts=lane.runtime.options.max_attempts_of(lane.name),
    )


def _snapshot(
    lane: LaneRuntime, transcript: tuple[StoredEntry, ...], op: OperationState | None, faulted: bool
) -> LaneSnapshot:
    return LaneSnapshot(
        lane=lane.name,
        leaf_id=lane.state.leaf_id,
        transcript=transcript,
        status=_status(lane, op),
        operation_id=op.id if op else None,
        steer=op.pending_steer if op else (),
        follow_up=op.pending_follow_up if op else (),
        next_run=lane.state.pending_next_run,
        pending_writes=op.pending_writes if op else (),
        faulted=faulted,
    )


class AgentHarness(AgentLane):
    """The durable agent runtime over one session; also lane ``main``."""

    def __init__(self, runtime: HarnessRuntime) -> None:
        self._rt = runtime
        self._table = LaneTable(runtime, runtime.options.max_idle_lanes)
        super().__init__(self, "main")

    @classmethod
    async def create(
        cls, options: AgentHarnessOptions
    ) -> tuple[AgentHarness, list[SuspendedOperation]]:
        """Open a harness: restore the lanes with an open operation (bounded reads, no writes).

        Returns the harness and one `SuspendedOperation` per lane with an open operation. Its
        cost follows the open operations, not the session's lanes: they are found with one
        read of the open-operation projection, and every other lane (``main``, the harness's
        own, included) is restored on its first use (see `AgentHarnessOptions.max_idle_lanes`).
        A lane whose log is a state no single writer can produce (`RecordLogCorruption`) is
        restored *faulted* (here, or at its first use for an idle lane): `lanes()` reports it
        with the reason, every call on it raises `HarnessFault`, and the session's other lanes
        work normally.
        """
        clock = options.clock or SystemClock()
        bus = EventBus()
        runtime = HarnessRuntime(
            options=options,
            storage=options.storage,
            ids=options.ids or Uuid7Ids(clock),
            clock=clock,
            model=options.model_client,
            hooks=Hooks(),
            events=bus,
            tools={tool.name: tool for tool in options.tools},
        )
        bus.report = lambda name, exc: runtime.report("event", name, exc)
        runtime.keeper = LeaseKeeper(
            options.storage,
            clock,
            busy=runtime.busy,
            on_lost=lambda exc: _lease_lost(runtime, exc),
            on_error=lambda exc: _renewal_failed(runtime, exc),
            renew_every_ms=options.lease_renew_ms,
        )
        harness = cls(runtime)
        runtime.usage_totals = (await options.storage.get_stats()).usage
        opened = await options.storage.find_open_operations(None)
        names = sorted({stored.record.lane for stored in opened})
        states = await asyncio.gather(
            *(restore_lane(options.storage, name) for name in names), return_exceptions=True
        )
        suspended: list[SuspendedOperation] = []
        for name, state in zip(names, states, strict=True):
            if isinstance(state, RecordLogCorruption):
                pointer = await options.storage.get_lane(name)
                leaf = pointer.leaf_id if pointer is not None else None
                runtime.lanes[name] = harness._table.faulted(name, leaf, state)
                continue
            if isinstance(state, BaseException):
                raise state
            runtime.lanes[name] = LaneRuntime(runtime, name, state)
            if state.operation is not None:
                suspended.append(harness._suspended(name, state.operation))
        return harness, suspended

    # -- lanes -------------------------------------------------------------------------------------

    @property
    def hooks(self) -> Hooks:
        """Harness-wide hook registrations."""
        return self._rt.hooks

    @property
    def events(self) -> EventBus:
        """Harness-wide event listeners (live only)."""
        return self._rt.events

    async def lane(self, name: str) -> AgentLane | None:
        """The lane called `name`, or None (lookup only; never creates).

        A lane not in memory is restored from storage here (a few bounded reads; concurrent
        lookups of one lane restore it once); a lane in memory costs no read.
        """
        self._rt.check()
        found = await self._table.get(name)
        self._rt.check()
        return AgentLane(self, name) if found is not None else None

    async def create_lane(
        self, name: str, at: str | None
    ) -> Result[AgentLane, LaneExists | InvalidLane | UnknownTarget | Closed]:
        """Create a lane with its leaf at entry `at` (None: the root); copies nothing."""
        if (closed := self._closed()) is not None:
            return closed
        runtime = self._rt
        try:
            check_lane_name(name)
        except SessionError as exc:
            return Err(InvalidLane(message=str(exc), lane=name, reason="name"))
        table = self._table
        # under the name's load lock: no first use of the name restores it meanwhile
        async with table.exclusive(name):
            if table.loaded(name) is not None or await runtime.storage.get_lane(name) is not None:
                return Err(LaneExists(message=f"lane {name!r} exists", lane=name))
            if at is not None and await runtime.storage.get_entry(at) is None:
                return Err(UnknownTarget(message=f"entry {at!r} does not exist", target_id=at))
            await runtime.write(lambda s: s.create_lane(name, at))  # a refusal faults the harness
            table.insert(LaneRuntime(runtime, name, LaneState(lane=name, leaf_id=at)))
        runtime.events.emit(LaneCreated(lane=name, at=at))
        return Ok(AgentLane(self, name))

    async def lanes(self, *, open_only: bool = False) -> list[LaneInfo]:
        """Every lane with its status (``main`` always among them), sorted by name.

        Lanes not in memory are read from storage for the listing (bounded reads per lane, not
        kept loaded), so its cost grows with the session's lanes; a lane's own status is
        `lane.info()`. With `open_only`, only the lanes with an open operation (and faulted
        lanes found so far): they are always in memory, so that listing reads nothing.
        """
        runtime = self._rt
        runtime.check()
        options = runtime.options
        # what is in memory now: a lane dropped while the others are read keeps this view
        infos = {name: _live_info(lane) for name, lane in runtime.lanes.items()}
        if open_only:
            return [
                infos[name]
                for name in sorted(infos)
                if infos[name].operation_id is not None or infos[name].status == "faulted"
            ]
        unloaded = [p.lane for p in await runtime.storage.get_lanes() if p.lane not in infos]
        for start in range(0, len(unloaded), _LISTING_BATCH):
            batch = unloaded[start : start + _LISTING_BATCH]
            states = await asyncio.gather(
                *(restore_lane(runtime.storage, name) for name in batch), return_exceptions=True
            )
            for name, state in zip(batch, states, strict=True):
                if isinstance(state, RecordLogCorruption):
                    lane = await self._table.get(name)  # loaded faulted, reported once
                    if lane is not None:
                        infos[name] = _live_info(lane)
                elif isinstance(state, BaseException):
                    raise state
                else:
                    infos[name] = _info(
                        state,
                        fault=None,
                        running=False,
                        max_attempts=options.max_attempts_of(name),
                    )
        runtime.check()
        infos.update((name, _live_info(lane)) for name, lane in runtime.lanes.items())
        return [infos[name] for name in sorted(infos)]

    async def import_state(
        self, name: str, state: HarnessState
    ) -> Result[AgentLane, LaneExists | InvalidLane | UnknownTarget | Closed]:
        """Start a new lane from portable state: its messages, then its capability data.

        Each item is one durable append; a crash midway leaves a lane holding a prefix (import
        into a fresh lane again). Environment state is an observation and is not imported.
        """
        created = await self.create_lane(name, None)
        if isinstance(created, Err):
            return created
        lane = created.value
        runtime = self._rt
        with self._table.pinned(name):
            for message in state.messages:
                lane_rt = await lane._lane_rt()
                entry = MessageEntry(id=runtime.ids.next(), message=message)
                await lane_jobs.write(lane_rt, entry)
            for namespace, capability in state.capabilities.items():
                await lane.set_capability(namespace, capability)
        return Ok(lane)

    def get_tools(self) -> tuple[Tool, ...]:
        """The registered tools."""
        return tuple(self._rt.tools.values())

    def set_tools(self, tools: Sequence[Tool]) -> None:
        """Replace the tool registry (code, never persisted; lanes keep their active names)."""
        self._rt.check()
        self._rt.tools = {tool.name: tool for tool in tools}
        self._rt.events.emit(ConfigUpdate(property="tools"))

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """Keep the writer lease renewed while the caller works for the session outside a run.

        An idle harness renews nothing; a caller that takes a while before its next call (a
        gateway reading a message's files before the message enters its lane) would have the
        lease lapse under it, and its next write fail (D351). Within this block the lease is
        renewed as while a lane works.
        """
        runtime = self._rt
        runtime.held += 1
        if runtime.keeper is not None:
            runtime.keeper.wake()
        try:
            yield
        finally:
            runtime.held -= 1
            if runtime.keeper is not None and not runtime.busy():
                runtime.keeper.idle()

    async def close(self) -> None:
        """Stop: in-flight calls raise `HarnessClosed`; open operations stay resumable.

        The writer lease belongs to whoever opened the storage: release it after this returns.
        """
        runtime = self._rt
        if runtime.closed:
            return
        runtime.closed = True
        for lane in runtime.lanes.values():
            if lane.gate is not None:
                lane.gate.close()  # parked effects never run: the durable prefix is final
            lane.abort_signal.set()  # in-flight model requests settle at once
        tasks = list(runtime.tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for lane in runtime.lanes.values():
            lane.context.drop()
        if runtime.keeper is not None:
            await runtime.keeper.stop()

    # -- internals -----------------------------------------------------------------------------

    def _storage(self) -> SessionStorage:
        self._rt.check()
        return self._rt.storage

    def _suspended(self, lane: str, op: OperationState) -> SuspendedOperation:
        tools, models = self._missing(op)
        intent = op.intent
        approval = op.approval
        reason = _reason(op)
        waiting = reason == "approval" and approval is not None
        return SuspendedOperation(
            lane=lane,
            kind=op.kind,
            id=op.id,
            started_at=op.started_at,
            reason=reason,
            prompt=intent.original_prompt if isinstance(intent, RunIntent) else (),
            deferred=op.deferred,
            aborting=op.aborting,
            missing_tools=tools,
            missing_models=models,
            pending_approvals=approval.requested.calls if waiting and approval else (),
            wait_id=approval.requested.id if waiting and approval else None,
            attempts=op.attempts,
            stuck=self._stuck(lane, op) is not None,
        )

    def _stuck(self, lane: str, op: OperationState) -> LaneStuck | None:
        """Why an interrupted operation may not run again without an operator, or None."""
        limit = self._rt.options.max_attempts_of(lane)
        if _reason(op) != "crash" or op.aborting or op.attempts < limit:
            return None
        activity = _last_activity(op)
        return LaneStuck(
            message=f"{op.kind} {op.id!r} on lane {lane!r} was interrupted {op.attempts} times "
            f"(max_attempts={limit}); it was last {activity}. Fix the cause, then resume with "
            "unstick=True or abort it.",
            lane=lane,
            operation_id=op.id,
            attempts=op.attempts,
            max_attempts=limit,
            last_activity=activity,
        )

    async def _admit_resume(
        self, lane: LaneRuntime, request: _ResumeRequest
    ) -> Result[
        asyncio.Task[Outcome],
        LaneBusy
        | NothingToResume
        | MissingIdentities
        | DecisionsRequired
        | DecisionsMismatch
        | WaitSuperseded
        | LaneStuck,
    ]:
        """Admit a resume in the lane's job: judge it, make its one durable write, start it.

        The write is the decision batch (an approval wait) or the counted attempt (a crash);
        a deferred poll writes nothing before it starts.
        """
        name = lane.name
        op = lane.state.operation
        decisions = request.decisions
        if op is None:
            if decisions is not None and request.wait_id is not None:
                return Err(
                    WaitSuperseded(
                        message=f"lane {name!r} no longer waits for {request.wait_id!r}",
                        lane=name,
                        wait_id=request.wait_id,
                    )
                )
            return Err(NothingToResume(message=f"lane {name!r} has no open operation", lane=name))
        approval = op.approval
        decided = approval.decided if approval is not None else None
        same_key = decided is not None and decided.idempotency_key == request.key
        if same_key and lane.task is not None:
            return Ok(lane.task)  # the same decision, already running: its result
        if decisions is not None and not same_key:
            refused = check_decisions(
                name,
                approval.requested if approval is not None else None,
                decided,
                op.aborting,
                decisions,
                request.wait_id,
                self._rt.tools,
            )
            if refused is not None:
                return Err(refused)  # before busy: a late or conflicting batch says so
        if lane.task is not None:
            return lane_jobs.busy(lane, op)
        tools, models = self._missing(op)
        if tools or models:
            return Err(
                MissingIdentities(
                    message=f"resuming {op.id!r} needs tools {list(tools)} "
                    f"and models {list(models)}",
                    lane=name,
                    tools=tools,
                    models=models,
                )
            )
        reason = _reason(op)
        if decisions is None and reason == "approval" and approval is not None:
            return Err(
                DecisionsRequired(
                    message=f"{op.id!r} waits for decisions on "
                    f"{[p.tool_call_id for p in approval.requested.calls]} "
                    f"(wait {approval.requested.id!r})",
                    lane=name,
                    operation_id=op.id,
                    pending=approval.requested.calls,
                    wait_id=approval.requested.id,
                )
            )
        if decisions is not None and not same_key:
            assert request.key is not None
            assert approval is not None
            await lane.decide(
                ApprovalDecided(
                    id=decision_id(name, request.key),
                    lane=name,
                    run_id=op.id,
                    wait_id=approval.requested.id,
                    idempotency_key=request.key,
                    decided_by=request.decided_by,
                    decisions=decisions,
                )
            )
        elif reason == "crash":
            stuck = self._stuck(name, op)
            if stuck is not None and not request.unstick:
                return Err(stuck)
            # one more execution of an interrupted operation: counted before it starts
            await lane.count_attempt(op, unstick=request.unstick)
        lane.ready_for(op.id)
        return Ok(
            lane.occupy(self._execute(lane, resumed=True, tool_recovery=request.tool_recovery))
        )

    def _prompted_before(
        self, lane: LaneRuntime, prior: Prior, entry_id: str, message: UserMessage
    ) -> Result[Started, InvalidMessage | AlreadyAccepted]:
        """The original acceptance of a prompt whose caller-chosen input was accepted before."""
        found = prior.record
        record = found.record if found is not None else None
        if (
            found is None
            or record is None
            or record.lane != lane.name
            or _accepted_input(prior, entry_id) != message
        ):
            return _conflict(lane.name, entry_id)
        if isinstance(record, QueueEnqueued):
            return Err(
                AlreadyAccepted(
                    message=f"input {entry_id!r} was queued ({record.queue}) before",
                    lane=lane.name,
                    entry_id=entry_id,
                    queue=record.queue,
                    run_id=record.run_id,
                )
            )
        seq = found.seq
        return Ok(Started(run_id=record.id, _wait=lambda: self._first_stop(lane, record.id, seq)))

    async def _replayed_decision(
        self,
        lane: LaneRuntime,
        found: StoredRecord,
        decisions: Sequence[ApprovalDecision],
        wait_id: str | None,
    ) -> Result[Outcome, DecisionsMismatch]:
        """The original result of a decision batch whose idempotency key was used before."""
        record = found.record
        same = (
            isinstance(record, ApprovalDecided)
            and record.lane == lane.name
            and record.wait_id == wait_id
            and record.decisions == tuple(decisions)
        )
        if not same or not isinstance(record, ApprovalDecided):
            return Err(
                DecisionsMismatch(
                    message="this idempotency key was used for a different decision batch",
                    lane=lane.name,
                    reason="key_reused",
                )
            )
        return Ok(await self._first_stop(lane, record.run_id, found.seq))

    async def _first_stop(self, lane: LaneRuntime, run_id: str, after_seq: int) -> Outcome:
        """How run `run_id` first stopped after `after_seq`.

        That is what the call that wrote at `after_seq` returned: a later approval wait or the
        run's end, rebuilt from the records however much history came after; while the run has
        not stopped since, its live result or its suspension.
        """
        storage = self._rt.storage
        waits = await storage.find_records(
            RecordQuery(
                lane=lane.name,
                type="approval_requested",
                run_id=run_id,
                after_seq=after_seq,
                order="oldest_first",
                limit=1,
            )
        )
        ends = await storage.find_records(
            RecordQuery(lane=lane.name, type="operation_finished", run_id=run_id, limit=1)
        )
        stops = sorted((*waits, *ends), key=lambda stored: stored.seq)
        if stops:
            stop = stops[0].record
            if isinstance(stop, ApprovalRequested):
                return Outcome(
                    operation="run",
                    run_id=run_id,
                    kind="suspended",
                    leaf_id=stop.leaf_id,
                    final_entry_id=stop.assistant_entry_id,
                    pending_approvals=stop.calls,
                    wait_id=stop.id,
                )
            assert isinstance(stop, OperationFinished)
            final: AssistantMessage | None = None
            if stop.final_entry_id is not None:
                stored = await storage.get_entry(stop.final_entry_id)
                message = stored.entry.message if stored is not None else None  # type: ignore[union-attr]
                final = message if isinstance(message, AssistantMessage) else None
            kind = stop.outcome if stop.outcome != "declined" else "completed"
            return Outcome(
                operation="run",
                run_id=run_id,
                kind=kind,
                leaf_id=stop.leaf_id,
                final_entry_id=stop.final_entry_id,
                final_message=final,
                error=stop.error,
            )
        op = lane.state.operation
        assert op is not None, "an open run without a stop"
        assert op.id == run_id, "an open run without a stop"
        if lane.task is not None:
            return await self._wait(lane.task)  # still executing: its own result
        return Outcome(  # suspended by a crash or a deferred request: resume() continues it
            operation="run",
            run_id=run_id,
            kind="suspended",
            leaf_id=lane.state.leaf_id,
            final_entry_id=op.deferred_entry_id or op.last_assistant_entry_id,
            deferred=op.deferred,
        )

    def _missing(self, op: OperationState) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Tools of unresolved calls and models the operation needs that this harness lacks."""
        runtime = self._rt
        tools: list[str] = []
        if op.tool_batch is not None and not op.tool_batch.truncated:
            for call in op.tool_batch.calls:
                if (
                    not call.result_exists
                    and call.call.name not in runtime.tools
                    and call.call.name not in tools
                ):
                    tools.append(call.call.name)
        models: list[str] = []
        config = op.configuration
        needs_model = (
            op.kind == "run"
            or (isinstance(op.intent, NavigationIntent) and op.intent.summarize)
            or op.kind == "compaction"
        )
        model = ModelRef(provider=config.provider, model_id=config.model_id)
        if needs_model and not op.aborting and runtime.model.model_info(model) is None:
            models.append(str(model))
        return tuple(tools), tuple(models)

    async def _execute(
        self, lane: LaneRuntime, *, resumed: bool, tool_recovery: ToolRecovery = "declared"
    ) -> Outcome:
        """Run the lane's open operation to its end (or suspension), then self-check."""
        runtime = self._rt
        op = lane.operation
        fx: Effects = lane
        if lane.gate is not None:
            fx = GatedEffects(fx, lane.gate)
        procedures = Procedures(lane, fx, tool_recovery)
        procedures.ctx.span = span = procedures.ctx.telemetry.start(
            "harness.operation",
            None,
            {
                "harness.lane": lane.name,
                "harness.run_id": op.id,
                "harness.operation": op.kind,
                "harness.resumed": resumed,
            },
        )
        try:
            if resumed:
                await self._before_resume(lane, op, fx)
            outcome = await procedures.execute()
        except (HarnessFault, HarnessClosed, asyncio.CancelledError) as exc:
            Telemetry.end(span, {"harness.outcome": "interrupted"}, error=type(exc).__name__)
            raise
        except BaseException as exc:
            Telemetry.end(span, {"harness.outcome": "fault"}, error=type(exc).__name__)
            raise runtime.faulted(exc) from exc
        Telemetry.end(
            span,
            {"harness.outcome": outcome.kind},
            error=outcome.error.code if outcome.error is not None else None,
        )
        if runtime.options.self_check:
            await self._self_check(lane)
        return outcome

    async def _before_resume(self, lane: LaneRuntime, op: OperationState, fx: Effects) -> None:
        intent = op.intent
        event = BeforeResumeEvent(
            lane=lane.name,
            run_id=op.id,
            kind=op.kind,
            prompt=intent.original_prompt if isinstance(intent, RunIntent) else (),
            system_prompt_override=intent.system_prompt_override
            if isinstance(intent, RunIntent)
            else None,
            resume_data=intent.resume_data if isinstance(intent, RunIntent) else None,
        )
        await fx.run_hook("before_resume", event)
        self._rt.events.emit(RunResume(lane=lane.name, run_id=op.id))

    async def _self_check(self, lane: LaneRuntime) -> None:
        """The fixed point: the state recomputed from storage must equal the live state."""
        runtime = self._rt

        async def check() -> None:
            try:
                stored = await restore_lane(runtime.storage, lane.name)
            except BaseException as exc:
                raise runtime.faulted(exc) from exc
            if stored != lane.state:
                raise runtime.faulted(
                    RecordLogCorruption(
                        "drift", f"lane {lane.name!r}: live {lane.state!r} != stored {stored!r}"
                    )
                )

        if runtime.fault is not None or runtime.closed:
            return
        # On the lane's line: a message accepted while the log is read back (the next run may
        # start as soon as this one finished) would otherwise look like drift.
        with contextlib.suppress(HarnessClosed):
            await lane.job(check)

    async def _wait(self, task: asyncio.Task[_T]) -> _T:
        """Wait for a procedure the harness owns; closing the harness raises `HarnessClosed`."""
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled() and self._rt.closed:
                raise HarnessClosed() from None
            raise
