"""The per-lane runtime: the mutation line, the live `LaneState`, its commits and effects.

Every state-dependent decision on a lane runs as one *job* on its mutation line (a FIFO lock):
validate against the live state, make at most one durable write, update the state with the
same `advance` restore uses. Provider requests, tools, hooks and sleeps never run inside a job,
so every race on a lane has exactly two histories. Jobs are shielded: a cancelled caller never
leaves a committed write without its state update.

`LaneRuntime` is the production `Effects`. Its neighbours hold the rest of a lane: its reads
and their caches (`lane_context`), the bodies of its external effects (`lane_effects`) and the
surface's jobs on it (`lane_jobs`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from harness_core._runtime.gate import Gate
from harness_core._runtime.lane_context import LaneContext
from harness_core._runtime.lane_effects import AbortSignal, ExternalEffects
from harness_core._runtime.lease import LeaseKeeper
from harness_core._runtime.reduction import (
    LaneState,
    OperationState,
    advance,
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
    QueuedItem,
    QueueUpdate,
    UsageEvent,
)
from harness_core.hooks import HookName, Hooks
from harness_core.ids import IdGenerator
from harness_core.messages import (
    AssistantMessage,
    DeferredHandle,
    TokenUsage,
)
from harness_core.models import ModelClient, ModelRequest, ToolDefinition
from harness_core.options import AgentHarnessOptions
from harness_core.session.contract import SessionStorage
from harness_core.session.durability import deferred_durability
from harness_core.session.entries import (
    Entry,
    MessageEntry,
)
from harness_core.session.records import (
    ApprovalDecided,
    LaneConfiguration,
    OperationError,
    OperationFinished,
    OperationOutcome,
    OperationResumed,
    QueueEnqueued,
    QueueName,
    Record,
    Usage,
)
from harness_core.session.types import (
    Fact,
    NameFact,
    StoredEntry,
    StoredRecord,
)
from harness_core.tools import PreparedToolCall, Tool, ToolOutput

if TYPE_CHECKING:
    from harness_core._runtime.effects import FinishResult

__all__ = ["HarnessRuntime", "LaneRuntime"]

_T = TypeVar("_T")


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
    definitions: dict[str, tuple[Tool, ToolDefinition]] = field(default_factory=dict)
    """Each tool's `definition()`, by name, made once per `Tool` object."""
    writes_begun: int = 0
    writes_ended: int = 0
    """Writes started and finished through `write` (every write of the harness goes there)."""
    held: int = 0
    """Callers inside `AgentHarness.hold`: the lease is kept as while a lane works."""

    def tool_definitions(self, tools: Iterable[Tool]) -> tuple[ToolDefinition, ...]:
        """How the model sees `tools`.

        Every model request lists every active tool, and a definition freezes the tool's
        whole parameter schema; a `Tool` is frozen, so its definition is made once.
        """
        definitions = self.definitions
        listed = []
        for tool in tools:
            cached = definitions.get(tool.name)
            if cached is None or cached[0] is not tool:
                cached = definitions[tool.name] = (tool, tool.definition())
            listed.append(cached[1])
        return tuple(listed)

    def busy(self) -> bool:
        """Whether some lane's procedure executes, or a caller holds the session (`hold`)."""
        return self.held > 0 or any(lane.task is not None for lane in self.lanes.values())

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
        self.writes_begun += 1
        try:
            return await fn(self.storage)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            raise self.faulted(exc) from exc
        finally:
            self.writes_ended += 1

    def write_mark(self) -> int | None:
        """Where the writes stand, or None while one is in flight.

        The harness holds its session's writer lease, so nothing but its own `write` changes
        the store: a read made after a mark answers the same while the mark stays the same
        (D273). None: a write under way may or may not be seen by a read made now.
        """
        return self.writes_ended if self.writes_begun == self.writes_ended else None

    async def durable(self, *, point: bool = True) -> None:
        """Make every write so far durable before an effect may depend on it (a barrier).

        Inside a procedure writes are deferred (`deferred_durability`): the writes between two
        effects commit together here. `point`: something outside the store will depend on
        them (an acknowledgement, a tool that must not run twice, a decision, an operation's
        end: power-loss durable); ``False`` before an effect that may safely happen again
        after a power loss (a model request, a tool declared safe to replay, a wait: process-
        crash durable, D233). A failure faults the harness like a failed write; a
        cancellation (`close()`) does not.
        """
        try:
            await self.storage.sync(point=point)
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
        task.add_done_callback(self._fault_seen)
        return task

    def _fault_seen(self, task: asyncio.Task[Any]) -> None:
        """Once the harness faulted, a procedure's failure is that fault's: marked retrieved.

        The harness reports the fault (every later call raises it) and the procedure's caller
        may have stopped waiting: asyncio printed a traceback a task (25 when Redis died
        under 25 runs). Before a fault, a failure nobody retrieves stays asyncio's to report.
        """
        if self.fault is not None and not task.cancelled():
            task.exception()

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
    """One lane of a harness: its mutation line, live state, commits and execution slot.

    The production `Effects`: its commits run here, as jobs; its external effects delegate
    to `external` (`lane_effects`). Reads go through `context`; the surface's jobs on the lane
    are `lane_jobs`' functions, built on `job`, `commit_entry` and `commit_record`.
    """

    def __init__(self, runtime: HarnessRuntime, name: str, state: LaneState) -> None:
        self.runtime = runtime
        self.name = name
        self.state = state
        self.task: asyncio.Task[Any] | None = None
        """The procedure executing this lane's operation, if any (the execution slot)."""
        self.abort_signal = AbortSignal()
        self.last_finished: OperationState | None = None
        self.fault: HarnessFault | None = None
        """Set when the lane's durable log cannot be restored: every call on it raises this."""
        self._line = asyncio.Lock()
        self.context = LaneContext(runtime, lambda: self.state)
        """The lane's reads (context window, configuration) and their caches."""
        self.external = ExternalEffects(runtime, name, self.abort_signal)
        """The bodies of the lane's effects outside the store (model, tools, hooks, sleeps)."""
        self._settled = asyncio.Event()
        self.gate: Gate | None = (
            Gate(lambda: self.task is not None) if runtime.options.drive == "manual" else None
        )
        """Manual drive: where this lane's effects park (None in automatic drive)."""
        self._settled.set()

    # -- the mutation line -------------------------------------------------------------------

    async def job(self, fn: Callable[[], Awaitable[_T]]) -> _T:
        """Run `fn` alone on this lane's line; a surface caller's cancellation cannot stop it."""

        async def locked() -> _T:
            async with self._line:
                self.runtime.check()
                return await fn()

        if asyncio.current_task() is self.task:
            # The lane's own procedure: only `close()` cancels it, so it needs no shield, nor a
            # task per write (D123, D254). It still gives the loop the turns a task took
            # between this write and the lane's next step (the task's completion, then the
            # wake-up): in them the other lanes' writes join the group the next commit takes
            # (with other turns, SQLite with 16 lanes committed two to four times as often).
            result = await locked()
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            return result
        return await asyncio.shield(locked())

    @property
    def operation(self) -> OperationState:
        """The open operation (a procedure only runs while one is open)."""
        op = self.state.operation
        if op is None:
            raise HarnessError(f"lane {self.name!r} has no open operation")
        return op

    # -- commits (inside a job) --------------------------------------------------------------

    async def commit_entry(self, entry: Entry, run_id: str | None = None) -> StoredEntry:
        """Append `entry` and advance the state (inside a job)."""
        stored = await self.runtime.write(lambda s: s.append_entry(entry, self.name))
        self._after_entry(stored, run_id)
        return stored

    def _after_entry(self, stored: StoredEntry, run_id: str | None) -> None:
        self.state = advance(self.state, stored)
        entry = stored.entry
        self.context.after_entry(stored)
        events = self.runtime.events
        if isinstance(entry, MessageEntry):
            # a streamed assistant message started with its first partial
            streamed = self.external.streaming and isinstance(entry.message, AssistantMessage)
            self.external.streaming = False
            if not streamed and events.wants("message_start"):
                events.emit(MessageStart(lane=self.name, run_id=run_id, message=entry.message))
            if events.wants("message_end"):
                events.emit(
                    MessageEnd(
                        lane=self.name, run_id=run_id, message=entry.message, entry_id=stored.id
                    )
                )
        elif events.wants("entry_added"):
            events.emit(EntryAdded(lane=self.name, entry=entry))

    async def commit_record(self, record: Record) -> StoredRecord:
        """Append `record` and advance the state (inside a job)."""
        stored = await self.runtime.write(lambda s: s.append_record(record))
        self.state = advance(self.state, stored)
        if isinstance(record, Usage):
            runtime = self.runtime
            runtime.usage_totals = runtime.usage_totals + record.usage
            if runtime.events.wants("usage"):
                runtime.events.emit(
                    UsageEvent(lane=self.name, record=record, totals=runtime.usage_totals)
                )
        return stored

    def _run_id(self) -> str | None:
        return self.state.operation.id if self.state.operation else None

    async def append_entry(self, entry: Entry) -> StoredEntry:
        """Append an entry (a job)."""
        return await self.job(lambda: self.commit_entry(entry, self._run_id()))

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
        return await self.job(lambda: self.commit_record(record))

    async def decide(self, record: ApprovalDecided) -> None:
        """Record an approval decision batch, inside the job that admitted it.

        Not a job of its own: checking the wait and recording its decisions are one job.
        """
        await self.commit_record(record)
        await self.runtime.durable()  # a decision taking effect is a durability point (D233)
        self.runtime.events.emit(
            ApprovalDecidedEvent(lane=self.name, run_id=record.run_id, record=record)
        )

    async def count_attempt(self, op: OperationState, *, unstick: bool) -> None:
        """Record one more execution of an interrupted operation, inside the admitting job."""
        await self.commit_record(
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
            self.context.drop()

        await self.job(run)

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
        await self.commit_record(record)
        self.last_finished = op
        if op.kind != "navigation":
            # a run or compaction stays on its path: its final configuration is the leaf's
            self.context.settled_configuration(self.state.leaf_id, op.configuration)

    async def commit_run_end_follow_up(
        self, run_id: str, item: Entry
    ) -> Literal["committed", "dropped"]:
        """Queue a follow-up from `before_run_end` if the run is active and not aborting."""

        async def run() -> Literal["committed", "dropped"]:
            op = self.state.operation
            if op is None or op.id != run_id or op.aborting:
                return "dropped"
            await self.commit_record(
                QueueEnqueued(
                    id=self.runtime.ids.next(),
                    lane=self.name,
                    queue="follow_up",
                    run_id=run_id,
                    target=item,
                )
            )
            self.emit_queues()
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
            await self.commit_entry(item, run_id)
            self.emit_queues()
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
            await self.commit_entry(item, run_id)
            return "applied"

        return await self.job(run)

    def emit_queues(self) -> None:
        """Announce the lane's queues (after a commit that changed them)."""
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

    # -- external effects (bodies in `lane_effects`) ------------------------------------------

    async def stream_assistant(self, request: ModelRequest) -> AssistantMessage:
        """One provider request; an abort (or close) settles it as ``stop_reason="aborted"``."""
        return await self.external.stream_assistant(request, self._run_id())

    async def execute_tool(self, prepared: PreparedToolCall) -> ToolOutput:
        """Run a tool; after an abort it may settle for `TOOL_ABORT_GRACE_S`, then is cut off."""
        return await self.external.execute_tool(prepared)

    async def fetch_deferred(self, handle: DeferredHandle) -> AssistantMessage:
        """Check a deferred request once; a raised failure becomes an error message."""
        return await self.external.fetch_deferred(handle)

    async def cancel_deferred(self, handle: DeferredHandle) -> None:
        """Best effort: a failure is reported, not raised."""
        await self.external.cancel_deferred(handle)

    async def run_hook(self, name: HookName, event: Any) -> Any:
        """Run a hook's handlers; a failing handler is isolated and reported."""
        return await self.external.run_hook(name, event)

    async def sleep(self, seconds: float) -> Literal["elapsed", "aborted"]:
        """Back off; an abort ends the wait."""
        return await self.external.sleep(seconds)

    # -- the execution slot ------------------------------------------------------------------

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

    async def wait_settled(self) -> None:
        """Wait until no procedure executes on this lane."""
        while not self._settled.is_set():
            await self._settled.wait()

    def ready_for(self, op_id: str) -> None:
        """Clear a stale abort signal before a procedure of `op_id` starts (resume)."""
        op = self.state.operation
        if op is not None and op.id == op_id and not op.aborting:
            self.abort_signal.clear()
