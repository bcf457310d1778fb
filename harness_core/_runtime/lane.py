"""The per-lane runtime: the mutation line, the live `LaneState`, commits and surface jobs.

Every state-dependent decision on a lane runs as one *job* on its mutation line (a FIFO lock):
validate against the live state, make at most one durable write, update the state with the
same `advance` restore uses. Provider requests, tools, hooks and sleeps never run inside a job,
so every race on a lane has exactly two histories. Jobs are shielded: a cancelled caller never
leaves a committed write without its state update.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import ValidationError

from harness_core import texts
from harness_core._runtime.context import ContextWindow
from harness_core._runtime.gate import Gate
from harness_core._runtime.lease import LeaseKeeper
from harness_core._runtime.reduction import (
    LaneState,
    OperationState,
    advance,
    configure,
    has_pending_work,
)
from harness_core.clock import Clock
from harness_core.errors import HarnessClosed, HarnessError, HarnessFault
from harness_core.events import (
    ApprovalDecidedEvent,
    EntryAdded,
    EventBus,
    FactUpdate,
    Fault,
    HandlerError,
    MessageEnd,
    MessageStart,
    MessageUpdate,
    NavigationStart,
    QueuedItem,
    QueueUpdate,
    RunAbort,
    RunStart,
    UsageEvent,
    WritePending,
)
from harness_core.frozen import invalid_reason, revalidated
from harness_core.hooks import HookName, Hooks, run_hook
from harness_core.ids import IdGenerator
from harness_core.messages import (
    AgentMessage,
    AssistantMessage,
    DeferredHandle,
    ModelError,
    TokenUsage,
)
from harness_core.models import ModelClient, ModelRequest
from harness_core.options import AgentHarnessOptions
from harness_core.result import (
    AbortAccepted,
    Err,
    LaneBusy,
    NoActiveOperation,
    NoActiveRun,
    Ok,
    Result,
    UnknownQueueItem,
)
from harness_core.session.contract import SessionStorage
from harness_core.session.durability import deferred_durability
from harness_core.session.entries import (
    ActiveToolsChangeEntry,
    CompactionEntry,
    Entry,
    EntryType,
    MessageEntry,
    ModelChangeEntry,
    ThinkingLevelChangeEntry,
)
from harness_core.session.records import (
    AbortRequested,
    ApprovalDecided,
    LaneConfiguration,
    NavigationIntent,
    OperationError,
    OperationFinished,
    OperationIntent,
    OperationOutcome,
    OperationResumed,
    OperationStarted,
    QueueCancelled,
    QueueEnqueued,
    QueueName,
    Record,
    Usage,
    WriteDeferred,
)
from harness_core.session.types import (
    BranchQuery,
    Fact,
    NameFact,
    RecordQuery,
    StoredEntry,
    StoredRecord,
)
from harness_core.tools import PreparedToolCall, Tool, ToolOutput

if TYPE_CHECKING:
    from harness_core._runtime.effects import FinishResult

__all__ = [
    "HarnessRuntime",
    "LaneRuntime",
    "Prior",
    "accept_id",
    "config_entry",
    "decision_id",
]

_T = TypeVar("_T")


def accept_id(entry_id: str) -> str:
    """The id of the record that accepts the caller-chosen input `entry_id` (prompt or queue).

    Derived, so a second submission of the same input is a point lookup (`get_record`), and the
    store itself refuses a second acceptance (the id exists).
    """
    return "accept-" + hashlib.sha256(entry_id.encode()).hexdigest()[:40]


def decision_id(lane: str, idempotency_key: str) -> str:
    """The id of the `ApprovalDecided` record made with `idempotency_key` on `lane`.

    Derived, so a replayed key is a point lookup however much history came after it.
    """
    digest = hashlib.sha256(f"{lane}\x00{idempotency_key}".encode()).hexdigest()
    return "decision-" + digest[:40]


@dataclass(frozen=True, slots=True)
class Prior:
    """A caller-chosen input id seen before.

    `record` accepted it; None means the id is an entry's that no acceptance made (unusable).
    """

    record: StoredRecord | None


@dataclass(eq=False)
class HarnessRuntime:
    """What every lane shares: storage, capabilities, policies, the fault and close state."""

    options: AgentHarnessOptions
    storage: SessionStorage
    ids: IdGenerator
    clock: Clock
    model: ModelClient
    hooks: Hooks
    events: EventBus
    tools: dict[str, Tool] = field(default_factory=dict)
    lanes: dict[str, LaneRuntime] = field(default_factory=dict)
    usage_totals: TokenUsage = field(default_factory=TokenUsage)
    closed: bool = False
    fault: HarnessFault | None = None
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    keeper: LeaseKeeper | None = None
    """Renews the writer lease while lanes have work (set by `AgentHarness.create`)."""

    def busy(self) -> bool:
        """Whether some lane's procedure executes."""
        return any(lane.task is not None for lane in self.lanes.values())

    async def authority(self) -> None:
        """Wait until a new model request or tool run may start (see `LeaseKeeper`)."""
        if self.keeper is not None:
            await self.keeper.authority()
        self.check()

    @property
    def session_id(self) -> str:
        """The session's id."""
        return self.storage.session_id

    def check(self) -> None:
        """Raise the harness's fault, or `HarnessClosed`, if it cannot act any more."""
        if self.fault is not None:
            raise self.fault
        if self.closed:
            raise HarnessClosed()

    def faulted(self, cause: BaseException) -> HarnessFault:
        """Fault the whole harness (once); every later call raises the same `HarnessFault`."""
        if self.fault is None:
            fault = HarnessFault(f"the harness faulted: {cause}")
            fault.__cause__ = cause
            self.fault = fault
            self.events.emit(Fault(message=str(cause)))
            for lane in self.lanes.values():
                lane.abort_signal.set()  # stop in-flight effects: nothing more will commit
        return self.fault

    async def write(self, fn: Callable[[SessionStorage], Awaitable[_T]]) -> _T:
        """Run one storage write; any failure faults the harness (the store stays a prefix).

        A cancellation is not a failure (`close()` cancelling a procedure, a caller giving up on
        its `create_lane`): whether the write landed or not, the store is a valid prefix.
        """
        self.check()
        try:
            return await fn(self.storage)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            raise self.faulted(exc) from exc

    async def durable(self) -> None:
        """Make every write so far durable before an effect may depend on it (a barrier).

        Inside a procedure writes are deferred (`deferred_durability`): the writes between two
        effects commit together here. A failure faults the harness like a failed write; a
        cancellation (`close()`) does not.
        """
        try:
            await self.storage.sync()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            raise self.faulted(exc) from exc

    def report(
        self, kind: Literal["hook", "event", "model", "tool"], name: str, error: BaseException | str
    ) -> None:
        """Report an isolated failure of code outside the harness."""
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        self.events.emit(HandlerError(kind=kind, name=name, error=text))

    def spawn(self, coro: Awaitable[_T]) -> asyncio.Task[_T]:
        """Run a procedure as a task the harness owns (callers only wait for it)."""
        task: asyncio.Task[_T] = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def system_prompt(self, lane: str) -> str | None:
        """The system prompt of a request on `lane` (evaluated per request)."""
        prompt = self.options.system_prompt
        return prompt(lane) if callable(prompt) else prompt

    def default_configuration(self) -> LaneConfiguration:
        """The configuration of a lane whose path sets nothing."""
        options = self.options
        return LaneConfiguration(
            provider=options.model.provider,
            model_id=options.model.model_id,
            thinking_level=options.thinking_level,
            active_tools=options.active_tools,
        )


class LaneRuntime:
    """One lane of a harness: its mutation line, live state and execution slot."""

    def __init__(self, runtime: HarnessRuntime, name: str, state: LaneState) -> None:
        self.runtime = runtime
        self.name = name
        self.state = state
        self.task: asyncio.Task[Any] | None = None
        """The procedure executing this lane's operation, if any (the execution slot)."""
        self.abort_signal = asyncio.Event()
        self.last_finished: OperationState | None = None
        self.fault: HarnessFault | None = None
        """Set when the lane's durable log cannot be restored: every call on it raises this."""
        self._line = asyncio.Lock()
        self._context: list[StoredEntry] | None = None
        self._window: ContextWindow | None = None
        self._streaming = False
        """A `message_start` for the assistant message in flight was emitted (streaming)."""
        """The projection of `_context`, kept in step with it."""
        self._idle_config: tuple[str | None, LaneConfiguration] | None = None
        self._settled = asyncio.Event()
        self.gate: Gate | None = (
            Gate(lambda: self.task is not None) if runtime.options.drive == "manual" else None
        )
        """Manual drive: where this lane's effects park (None in automatic drive)."""
        self._settled.set()

    # -- the mutation line -------------------------------------------------------------------

    async def job(self, fn: Callable[[], Awaitable[_T]]) -> _T:
        """Run `fn` alone on this lane's line, shielded from the caller's cancellation."""

        async def locked() -> _T:
            async with self._line:
                self.runtime.check()
                return await fn()

        # also for the lane's own procedure: the task's yield lets other lanes' writes join
        # this commit's group; running it inline cost SQLite with 16 lanes ~25 % (D123)
        return await asyncio.shield(locked())

    @property
    def operation(self) -> OperationState:
        """The open operation (a procedure only runs while one is open)."""
        op = self.state.operation
        if op is None:
            raise HarnessError(f"lane {self.name!r} has no open operation")
        return op

    # -- commits (inside a job) --------------------------------------------------------------

    async def _append(self, entry: Entry, run_id: str | None = None) -> StoredEntry:
        stored = await self.runtime.write(lambda s: s.append_entry(entry, self.name))
        self._after_entry(stored, run_id)
        return stored

    def _after_entry(self, stored: StoredEntry, run_id: str | None) -> None:
        self.state = advance(self.state, stored)
        entry = stored.entry
        if self._context is not None:
            if isinstance(entry, CompactionEntry):
                self._context = [stored]
                self._window = ContextWindow(self.runtime.options.entry_projectors)
            else:
                self._context.append(stored)
            if self._window is not None:
                self._window.add(entry)
        if self._idle_config is not None and self._idle_config[0] == stored.parent_id:
            # the cached configuration follows the lane's own appends (no path walk)
            self._idle_config = (stored.id, configure(self._idle_config[1], entry))
        if isinstance(entry, MessageEntry):
            events = self.runtime.events
            if not (self._streaming and isinstance(entry.message, AssistantMessage)):
                events.emit(MessageStart(lane=self.name, run_id=run_id, message=entry.message))
            self._streaming = False
            events.emit(
                MessageEnd(lane=self.name, run_id=run_id, message=entry.message, entry_id=stored.id)
            )
        else:
            self.runtime.events.emit(EntryAdded(lane=self.name, entry=entry))

    async def _record(self, record: Record) -> StoredRecord:
        stored = await self.runtime.write(lambda s: s.append_record(record))
        self.state = advance(self.state, stored)
        if isinstance(record, Usage):
            runtime = self.runtime
            runtime.usage_totals = runtime.usage_totals + record.usage
            runtime.events.emit(
                UsageEvent(lane=self.name, record=record, totals=runtime.usage_totals)
            )
        return stored

    def _run_id(self) -> str | None:
        return self.state.operation.id if self.state.operation else None

    async def append_entry(self, entry: Entry) -> StoredEntry:
        """Append an entry (a job)."""
        return await self.job(lambda: self._append(entry, self._run_id()))

    async def append_entry_if_missing(self, entry: Entry) -> StoredEntry:
        """Append unless the provisioned id exists with equal content (a job)."""

        async def run() -> StoredEntry:
            stored, appended = await self.runtime.write(
                lambda s: s.append_entry_if_missing(entry, self.name)
            )
            if appended:
                self._after_entry(stored, self._run_id())
            return stored

        return await self.job(run)

    async def append_record(self, record: Record) -> StoredRecord:
        """Append a record (a job)."""
        return await self.job(lambda: self._record(record))

    async def decide(self, record: ApprovalDecided) -> None:
        """Record an approval decision batch, inside the job that admitted it.

        Not a job of its own: checking the wait and recording its decisions are one job.
        """
        await self._record(record)
        self.runtime.events.emit(
            ApprovalDecidedEvent(lane=self.name, run_id=record.run_id, record=record)
        )

    async def count_attempt(self, op: OperationState, *, unstick: bool) -> None:
        """Record one more execution of an interrupted operation, inside the admitting job."""
        await self._record(
            OperationResumed(
                id=self.runtime.ids.next(),
                lane=self.name,
                run_id=op.id,
                attempt=1 if unstick else op.attempts + 1,
                unstick=unstick,
            )
        )

    async def move_lane(self, to: str | None) -> None:
        """Move the lane's leaf (a job)."""

        async def run() -> None:
            await self.runtime.write(lambda s: s.move_lane(self.name, to))
            self.state = replace(self.state, leaf_id=to)
            self.drop_caches()

        await self.job(run)

    def drop_caches(self) -> None:
        """Forget the context window and configuration read from storage (read again on use).

        Called when the leaf moves, and when the lane leaves memory (eviction, the harness's
        close): the runtime's objects refer to each other, so without this a dropped lane's
        decoded window (thousands of objects on a long lane) would wait for a full collection.
        """
        self._context = None
        self._window = None
        self._idle_config = None

    async def set_fact(self, fact: Fact) -> None:
        """Set a global fact (a job)."""

        async def run() -> None:
            if isinstance(fact, NameFact):
                await self.runtime.write(lambda s: s.set_name(fact.name))
                self.runtime.events.emit(FactUpdate(lane=self.name, fact="name", name=fact.name))
            else:
                await self.runtime.write(lambda s: s.set_label(fact.target_id, fact.label))
                self.runtime.events.emit(
                    FactUpdate(
                        lane=self.name, fact="label", target_id=fact.target_id, label=fact.label
                    )
                )

        await self.job(run)

    # -- conditional commits (procedure side) ------------------------------------------------

    async def try_finish_run(
        self,
        run_id: str,
        outcome: Literal["completed", "failed"],
        error: OperationError | None = None,
    ) -> FinishResult:
        """Finish the run unless something is pending or an abort was accepted."""

        async def run() -> FinishResult:
            op = self.state.operation
            if op is None or op.id != run_id or op.aborting or has_pending_work(op):
                return "continue"
            await self._finish(op, outcome, error)
            return "finished"

        return await self.job(run)

    async def finish_operation(
        self, run_id: str, outcome: OperationOutcome, error: OperationError | None = None
    ) -> FinishResult:
        """Close an operation unless an abort (or, closing an abort, a pending write) preempts."""

        async def run() -> FinishResult:
            op = self.state.operation
            if op is None or op.id != run_id:
                return "continue"
            if outcome != "aborted" and op.aborting:
                return "continue"
            if outcome == "aborted" and op.pending_writes:
                return "continue"
            await self._finish(op, outcome, error)
            return "finished"

        return await self.job(run)

    async def _finish(
        self, op: OperationState, outcome: OperationOutcome, error: OperationError | None
    ) -> None:
        record = OperationFinished(
            id=self.runtime.ids.next(),
            lane=self.name,
            run_id=op.id,
            outcome=outcome,
            error=error,
            final_entry_id=op.last_assistant_entry_id if op.kind == "run" else None,
            leaf_id=self.state.leaf_id,
        )
        await self._record(record)
        self.last_finished = op
        if op.kind != "navigation":
            # a run or compaction stays on its path: its final configuration is the leaf's
            self._idle_config = (self.state.leaf_id, op.configuration)

    async def commit_run_end_follow_up(
        self, run_id: str, item: Entry
    ) -> Literal["committed", "dropped"]:
        """Queue a follow-up from `before_run_end` if the run is active and not aborting."""

        async def run() -> Literal["committed", "dropped"]:
            op = self.state.operation
            if op is None or op.id != run_id or op.aborting:
                return "dropped"
            await self._record(
                QueueEnqueued(
                    id=self.runtime.ids.next(),
                    lane=self.name,
                    queue="follow_up",
                    run_id=run_id,
                    target=item,
                )
            )
            self._emit_queues()
            return "committed"

        return await self.job(run)

    async def consume_queue_item(
        self, run_id: str, queue: QueueName, entry_id: str
    ) -> Literal["consumed", "skipped"]:
        """Append a queued item's entry at this checkpoint if it is still pending."""

        async def run() -> Literal["consumed", "skipped"]:
            op = self.state.operation
            if op is None or op.id != run_id or op.aborting:
                return "skipped"
            pending = op.pending_steer if queue == "steer" else op.pending_follow_up
            item = next((e for e in pending if e.id == entry_id), None)
            if item is None:
                return "skipped"
            await self._append(item, run_id)
            self._emit_queues()
            return "consumed"

        return await self.job(run)

    async def apply_pending_write(
        self, run_id: str, entry_id: str
    ) -> Literal["applied", "skipped"]:
        """Apply an accepted write at this checkpoint (also while aborting)."""

        async def run() -> Literal["applied", "skipped"]:
            op = self.state.operation
            if op is None or op.id != run_id:
                return "skipped"
            item = next((e for e in op.pending_writes if e.id == entry_id), None)
            if item is None:
                return "skipped"
            await self._append(item, run_id)
            return "applied"

        return await self.job(run)

    # -- external effects --------------------------------------------------------------------

    async def _until_aborted(self, work: Awaitable[_T]) -> _T | None:
        """Run `work`, abandoning it (None) if the lane's abort signal fires first."""
        task = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self.abort_signal.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        return None

    async def stream_assistant(self, request: ModelRequest) -> AssistantMessage:
        """One provider request; an abort (or close) settles it as ``stop_reason="aborted"``."""
        self.runtime.check()
        run_id = self._run_id()
        events = self.runtime.events

        def progress(partial: AssistantMessage) -> None:
            if not self._streaming:
                self._streaming = True
                events.emit(MessageStart(lane=self.name, run_id=run_id, message=partial))
            events.emit(MessageUpdate(lane=self.name, run_id=run_id or "", message=partial))

        self._streaming = False  # a retried attempt streams (and starts) again
        await self.runtime.durable()  # the request's intent (its step attempt) first
        await self.runtime.authority()  # never start a paid call on a lapsing lease
        if self.abort_signal.is_set():  # aborted before the request went out: never send it
            return AssistantMessage(stop_reason="aborted", usage=TokenUsage())
        try:
            message = await self._until_aborted(self.runtime.model.request(request, progress))
        except Exception as exc:  # a client that raised instead of answering in band
            return AssistantMessage(
                stop_reason="error",
                error=ModelError(
                    kind="unknown", message=f"{type(exc).__name__}: {exc}", retryable=True
                ),
                usage=TokenUsage(),
            )
        self.runtime.check()
        if message is None:
            return AssistantMessage(stop_reason="aborted", usage=TokenUsage())
        return self.checked_response(message, str(request.model))

    def checked_response(self, message: AssistantMessage, source: str) -> AssistantMessage:
        """A provider's (or hook's) message, valid before it can reach a record or an entry.

        A message whose only invalid part is its usage (a NaN cost) keeps its content with the
        usage zeroed, and the loss is reported; any other invalid message becomes a retryable
        error, so a provider's bad number never faults the lane's store.
        """
        try:
            return revalidated(message)
        except ValidationError as exc:
            reason = invalid_reason(exc)
        try:
            kept = revalidated(message.model_copy(update={"usage": TokenUsage()}))
        except ValidationError:
            self.runtime.report("model", source, f"invalid message ({reason})")
            return AssistantMessage(
                stop_reason="error",
                error=ModelError(
                    kind="unknown",
                    message=f"the provider returned an invalid message ({reason})",
                    retryable=True,
                ),
                usage=TokenUsage(),
            )
        self.runtime.report("model", source, f"invalid usage dropped ({reason})")
        return kept

    async def execute_tool(self, prepared: PreparedToolCall) -> ToolOutput:
        """Run a tool; it settles even if the run is aborted (the tool sees `ctx.abort`).

        A call whose run was aborted before it started does not start: its result says so.
        """
        self.runtime.check()
        tool = prepared.tool
        await self.runtime.durable()  # the call's intent first
        await self.runtime.authority()
        if self.abort_signal.is_set():
            return ToolOutput.text(texts.NOT_RUN_ABORTED, is_error=True)
        try:
            args = tool.parse(prepared.args)
            work = tool.execute(args, prepared.context)
            raw = await (
                asyncio.wait_for(work, tool.timeout_seconds) if tool.timeout_seconds else work
            )
        except TimeoutError:
            return ToolOutput.text(
                texts.tool_timed_out(tool.name, tool.timeout_seconds or 0), is_error=True
            )
        except Exception as exc:
            return ToolOutput.text(texts.tool_failed(tool.name, exc), is_error=True)
        returned: object = raw  # typed, but a tool is foreign code
        if isinstance(returned, str):
            return ToolOutput.text(returned)
        if not isinstance(returned, ToolOutput):
            return ToolOutput.text(
                f"{tool.name} returned {type(returned).__name__}, not text or a ToolOutput",
                is_error=True,
            )
        return self.checked_output(returned, tool.name)

    def checked_output(self, output: ToolOutput, tool_name: str) -> ToolOutput:
        """A tool's (or hook's) output, valid before it can reach a record or an entry."""
        try:
            return revalidated(output)
        except ValidationError as exc:
            reason = invalid_reason(exc)
        self.runtime.report("tool", tool_name, f"invalid output ({reason})")
        return ToolOutput.text(texts.invalid_result(tool_name, reason), is_error=True)

    async def fetch_deferred(self, handle: DeferredHandle) -> AssistantMessage:
        """Check a deferred request once; a raised failure becomes an error message."""
        await self.runtime.durable()
        await self.runtime.authority()
        try:
            message = await self._until_aborted(self.runtime.model.fetch_deferred(handle))
        except Exception as exc:
            return AssistantMessage(
                stop_reason="error",
                error=ModelError(kind="unknown", message=f"deferred fetch failed: {exc}"),
                usage=TokenUsage(),
            )
        if message is None:
            return AssistantMessage(stop_reason="aborted", usage=TokenUsage())
        return self.checked_response(message, f"{handle.provider}:{handle.model}")

    async def cancel_deferred(self, handle: DeferredHandle) -> None:
        """Best effort: a failure is reported, not raised."""
        await self.runtime.durable()
        try:
            await self.runtime.model.cancel_deferred(handle)
        except Exception as exc:
            self.runtime.report("hook", "cancel_deferred", exc)

    async def run_hook(self, name: HookName, event: Any) -> Any:
        """Run a hook's handlers; a failing handler is isolated and reported."""
        self.runtime.check()
        if self.runtime.hooks.registrations(name):
            await self.runtime.durable()  # a handler is foreign code: it may act on what it sees
        return await run_hook(
            self.runtime.hooks,
            name,
            event,
            lambda hook, exc: self.runtime.report("hook", hook, exc),
        )

    async def sleep(self, seconds: float) -> Literal["elapsed", "aborted"]:
        """Back off; an abort ends the wait."""
        self.runtime.check()
        await self.runtime.durable()  # never hold deferred writes (and SQLite's lock) across a wait

        async def wait() -> bool:
            await self.runtime.clock.sleep(seconds)
            return True

        waited = await self._until_aborted(wait())
        return "elapsed" if waited else "aborted"

    # -- reads ---------------------------------------------------------------------------------

    async def context_entries(self) -> list[StoredEntry]:
        """The lane's context window: its path from the newest compaction to the leaf."""
        if self._context is not None:
            tail = self._context[-1].id if self._context else None
            if tail != self.state.leaf_id:  # kept in step with the lane's own appends only
                self._context = self._window = None
        if self._context is None:
            leaf = self.state.leaf_id
            if leaf is None:
                self._context = []
            else:
                window = await self.runtime.storage.find_entries_on_branch(
                    BranchQuery(start=leaf, stop_at_type="compaction")
                )
                self._context = list(reversed(window))
        return list(self._context)

    async def entry(self, entry_id: str) -> StoredEntry | None:
        """The stored entry `entry_id`: from the cached context when it holds it, else storage.

        Entries never change once stored, so a cached copy is the stored one even when the
        cache is behind the leaf. Callers ask for a run's newest entries, so the scan looks at
        the newest few only: its cost stays flat however long the lane is.
        """
        for stored in islice(reversed(self._context or ()), 16):
            if stored.id == entry_id:
                return stored
        return await self.runtime.storage.get_entry(entry_id)

    async def _context_window(self) -> ContextWindow:
        if self._context is None or self._window is None:
            entries = await self.context_entries()
            self._window = ContextWindow(self.runtime.options.entry_projectors)
            for stored in entries:
                self._window.add(stored.entry)
        return self._window

    async def context_messages(self) -> tuple[AgentMessage, ...]:
        """The provider messages of the current context window."""
        return (await self._context_window()).messages()

    async def context_tokens(self, system_prompt: str | None) -> int:
        """The estimated size of a request carrying the context window and `system_prompt`."""
        return (await self._context_window()).tokens(system_prompt)

    async def configuration(self) -> LaneConfiguration:
        """The lane's effective configuration: the open operation's, or the path's at the leaf."""
        op = self.state.operation
        if op is not None:
            return op.configuration
        leaf = self.state.leaf_id
        if self._idle_config is not None and self._idle_config[0] == leaf:
            return self._idle_config[1]
        # The context window (which the next request loads anyway) is the path from the newest
        # compaction; only a path with a compaction needs a walk, of its older part.
        context = await self.context_entries()
        config = self.runtime.default_configuration()
        if context and context[0].parent_id is not None:
            config = await self._configuration_at(context[0].parent_id, config)
        for stored in context:
            config = configure(config, stored.entry)
        self._idle_config = (leaf, config)
        return config

    async def _configuration_at(
        self, entry_id: str, config: LaneConfiguration
    ) -> LaneConfiguration:
        """`config` with the newest configuration entries of the path ending at `entry_id`."""
        storage = self.runtime.storage
        for entry_type in ("model_change", "thinking_level_change", "active_tools_change"):
            found = await storage.find_entries_on_branch(
                BranchQuery(start=entry_id, type=entry_type, limit=1)
            )
            if found:
                config = configure(config, found[0].entry)
        return config

    async def path_entries_of_type(self, entry_type: EntryType) -> list[StoredEntry]:
        """The entries of `entry_type` on the lane's whole path, oldest first.

        From the context window, plus a walk of the path's older part when a compaction
        starts the window.
        """
        context = await self.context_entries()
        older: tuple[StoredEntry, ...] = ()
        if context and context[0].parent_id is not None:
            older = await self.runtime.storage.find_entries_on_branch(
                BranchQuery(start=context[0].parent_id, type=entry_type)
            )
        return [*reversed(older), *(s for s in context if s.entry.type == entry_type)]

    def _emit_queues(self) -> None:
        op = self.state.operation

        def items(entries: tuple[Entry, ...]) -> tuple[QueuedItem, ...]:
            return tuple(
                QueuedItem(entry_id=e.id, message=e.message)
                for e in entries
                if isinstance(e, MessageEntry)
            )

        self.runtime.events.emit(
            QueueUpdate(
                lane=self.name,
                steer=items(op.pending_steer) if op else (),
                follow_up=items(op.pending_follow_up) if op else (),
                next_run=items(self.state.pending_next_run),
            )
        )

    # -- surface jobs ------------------------------------------------------------------------

    def busy(self, op: OperationState) -> Err[LaneBusy]:
        """The rejection for a second operation on this lane."""
        return Err(
            LaneBusy(
                message=f"lane {self.name!r} is busy with {op.kind} {op.id!r}",
                lane=self.name,
                operation_id=op.id,
                operation_kind=op.kind,
            )
        )

    async def prior(self, entry_id: str | None) -> Prior | None:
        """How a caller-chosen input id was used before, or None if it is new (two reads)."""
        if entry_id is None:
            return None
        storage = self.runtime.storage
        found = await storage.get_record(accept_id(entry_id))
        if found is not None:
            return Prior(found)
        return Prior(None) if await storage.get_entry(entry_id) is not None else None

    async def accept(
        self,
        build_intent: Callable[[LaneState], OperationIntent],
        start: Callable[[], Awaitable[Any]],
        *,
        input_id: str | None = None,
    ) -> Result[tuple[OperationState, asyncio.Task[Any]], LaneBusy] | Prior:
        """Accept an operation on an idle lane and start its procedure, in one job.

        `build_intent` sees the state (run acceptance captures the pending next-run items); the
        procedure task takes the lane's execution slot before the job ends, so no second
        acceptance or resume can slip in. With `input_id` (a run's caller-chosen prompt id) the
        run's id is derived from it, and an input accepted before is returned as `Prior`.
        """

        async def run() -> Result[tuple[OperationState, asyncio.Task[Any]], LaneBusy] | Prior:
            prior = await self.prior(input_id)
            if prior is not None:
                return prior
            op = self.state.operation
            if op is not None:
                return self.busy(op)
            intent = build_intent(self.state)
            record = OperationStarted(
                id=accept_id(input_id) if input_id is not None else self.runtime.ids.next(),
                lane=self.name,
                source_leaf_id=self.state.leaf_id,
                intent=intent,
                configuration=await self.configuration(),
            )
            await self._record(record)
            if intent.kind == "run":
                self.runtime.events.emit(RunStart(lane=self.name, run_id=record.id))
            elif isinstance(intent, NavigationIntent):
                self.runtime.events.emit(
                    NavigationStart(lane=self.name, run_id=record.id, target_id=intent.target_id)
                )
            self.abort_signal.clear()
            task = self.occupy(start())
            return Ok((self.operation, task))

        return await self.job(run)

    def occupy(self, procedure: Awaitable[_T]) -> asyncio.Task[_T]:
        """Take the execution slot with a procedure task.

        In automatic drive the procedure's writes are deferred (`deferred_durability`): those
        no effect separates commit together at the next barrier (`HarnessRuntime.durable`,
        before every model request, tool run, hook handler, deferred-request call and sleep)
        and when the procedure ends, before its outcome reaches anyone. Manual drive keeps
        every write durable on return: its gate parks before each effect, and a parked
        procedure must not hold a transaction open.
        """
        self._settled.clear()
        task = self.runtime.spawn(procedure if self.gate is not None else self._batched(procedure))
        self.task = task
        if self.runtime.keeper is not None:
            self.runtime.keeper.wake()
        if self.gate is not None:
            self.gate.wake()

        def release(done: asyncio.Task[Any]) -> None:
            if self.task is done:
                self.task = None
                self._settled.set()
                keeper = self.runtime.keeper
                if keeper is not None and not self.runtime.busy():
                    keeper.idle()
                if self.gate is not None:
                    self.gate.wake()

        task.add_done_callback(release)
        return task

    async def _batched(self, procedure: Awaitable[_T]) -> _T:
        with deferred_durability():
            try:
                result = await procedure
            except BaseException:
                # what it wrote stays a valid prefix; keep it (a failure here is the harness's)
                with contextlib.suppress(Exception):
                    await self.runtime.storage.sync()
                raise
        await self.runtime.durable()
        return result

    async def enqueue(
        self, queue: QueueName, entry: Entry, *, chosen: bool = False
    ) -> Result[str, NoActiveRun] | Prior:
        """Accept queued input: steering and follow-ups need an active, non-aborting run.

        With `chosen` (the caller chose the entry's id) the record's id is derived from it and
        an input accepted before is returned as `Prior`.
        """

        async def run() -> Result[str, NoActiveRun] | Prior:
            prior = await self.prior(entry.id if chosen else None)
            if prior is not None:
                return prior
            op = self.state.operation
            run_id: str | None = None
            if queue != "next_run":
                if op is None or op.kind != "run" or op.aborting:
                    return Err(
                        NoActiveRun(message=f"lane {self.name!r} has no active run", lane=self.name)
                    )
                run_id = op.id
            await self._record(
                QueueEnqueued(
                    id=accept_id(entry.id) if chosen else self.runtime.ids.next(),
                    lane=self.name,
                    queue=queue,
                    run_id=run_id,
                    target=entry,
                )
            )
            self._emit_queues()
            return Ok(entry.id)

        return await self.job(run)

    async def cancel_queued(
        self, entry_id: str
    ) -> Result[Literal["cancelled", "already_consumed", "already_cleared"], UnknownQueueItem]:
        """Retract a queued item if it is still pending."""

        async def run() -> Result[
            Literal["cancelled", "already_consumed", "already_cleared"], UnknownQueueItem
        ]:
            op = self.state.operation
            pending: list[tuple[str | None, tuple[Entry, ...]]] = [
                (None, self.state.pending_next_run)
            ]
            if op is not None:
                pending += [(op.id, op.pending_steer), (op.id, op.pending_follow_up)]
            for run_id, items in pending:
                if any(e.id == entry_id for e in items):
                    await self._record(
                        QueueCancelled(
                            id=self.runtime.ids.next(),
                            lane=self.name,
                            run_id=run_id,
                            entry_id=entry_id,
                        )
                    )
                    self._emit_queues()
                    return Ok("cancelled")
            storage = self.runtime.storage
            if await storage.get_entry(entry_id) is not None:
                return Ok("already_consumed")
            enqueued = await storage.find_records(
                RecordQuery(lane=self.name, type="queue_enqueued")
            )
            if any(
                isinstance(r.record, QueueEnqueued) and r.record.target.id == entry_id
                for r in enqueued
            ):
                return Ok("already_cleared")
            return Err(
                UnknownQueueItem(
                    message=f"no queued item {entry_id!r}", lane=self.name, entry_id=entry_id
                )
            )

        return await self.job(run)

    async def write(self, entry: Entry) -> str:
        """A lane-view write; returns the entry's id once durably accepted.

        Deferred while a run is open, waits out a structural operation, appended directly on an
        idle lane.
        """
        while True:
            waiting: asyncio.Task[Any] | None = None

            async def run() -> str | None:
                nonlocal waiting
                op = self.state.operation
                if op is None:
                    await self._append(entry)
                    return entry.id
                if op.kind == "run":
                    await self._record(
                        WriteDeferred(
                            id=self.runtime.ids.next(), lane=self.name, run_id=op.id, target=entry
                        )
                    )
                    self.runtime.events.emit(
                        WritePending(lane=self.name, run_id=op.id, entry_id=entry.id, entry=entry)
                    )
                    return entry.id
                waiting = self.task
                return None

            result = await self.job(run)
            if result is not None:
                return result
            await self.wait_settled()
            if (
                waiting is None
                and self.state.operation is not None
                and self.state.operation.kind != "run"
            ):
                # a suspended structural operation: nothing will close it until someone resumes it
                raise HarnessError(
                    f"lane {self.name!r} has an unfinished {self.state.operation.kind}; "
                    "resume or abort it first"
                )

    async def abort(self) -> Result[AbortAccepted, NoActiveOperation]:
        """Accept an abort: durable on return; reconciliation continues in the background."""

        async def run() -> Result[AbortAccepted, NoActiveOperation]:
            op = self.state.operation
            if op is None:
                return Err(
                    NoActiveOperation(
                        message=f"lane {self.name!r} has nothing to abort", lane=self.name
                    )
                )
            if op.aborting:  # idempotent: one marker per operation
                return Ok(AbortAccepted(run_id=op.id))
            accepted = AbortAccepted(
                run_id=op.id, steer=op.pending_steer, follow_up=op.pending_follow_up
            )
            await self._record(
                AbortRequested(id=self.runtime.ids.next(), lane=self.name, run_id=op.id)
            )
            self.runtime.events.emit(
                RunAbort(
                    lane=self.name,
                    run_id=op.id,
                    steer=_messages(op.pending_steer),
                    follow_up=_messages(op.pending_follow_up),
                )
            )
            self.abort_signal.set()
            self._emit_queues()
            return Ok(accepted)

        return await self.job(run)

    async def wait_settled(self) -> None:
        """Wait until no procedure executes on this lane."""
        while not self._settled.is_set():
            await self._settled.wait()

    def ready_for(self, op_id: str) -> None:
        """Clear a stale abort signal before a procedure of `op_id` starts (resume)."""
        op = self.state.operation
        if op is not None and op.id == op_id and not op.aborting:
            self.abort_signal.clear()


def _messages(entries: tuple[Entry, ...]) -> tuple[AgentMessage, ...]:
    return tuple(e.message for e in entries if isinstance(e, MessageEntry))


def config_entry(runtime: HarnessRuntime, changes: dict[str, Any]) -> Entry:
    """The entry that records one configuration change."""
    entry_id = runtime.ids.next()
    if "model" in changes:
        model = changes["model"]
        return ModelChangeEntry(id=entry_id, provider=model.provider, model_id=model.model_id)
    if "thinking_level" in changes:
        return ThinkingLevelChangeEntry(id=entry_id, thinking_level=changes["thinking_level"])
    return ActiveToolsChangeEntry(id=entry_id, active_tool_names=tuple(changes["active_tools"]))
