"""The reduction: lane state, its one transition function, and the fold of a restored slice.

`LaneState` is everything a lane's orchestration decides from: its leaf, its open operation
(unfinished step, tool batch, pending queues and writes, deferred handle, ...) and its pending
next-run items. It is *defined* as the fold of the lane's committed records and own entries
through `advance`: the live runtime applies `advance` to each item it commits, and restore
applies it to the bounded reads. The fixed-point self-check compares the two; a mismatch is
writer/reducer drift. Everything here is pure: no I/O, no clock, no ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeVar

from harness_core.errors import CorruptionReason, RecordLogCorruption
from harness_core.messages import AssistantMessage, DeferredHandle, ToolCallPart, ToolResultMessage
from harness_core.session.entries import (
    ActiveToolsChangeEntry,
    BranchSummaryEntry,
    CompactionEntry,
    Entry,
    MessageEntry,
    ModelChangeEntry,
    ThinkingLevelChangeEntry,
)
from harness_core.session.records import (
    AbortRequested,
    ApprovalDecided,
    ApprovalDecision,
    ApprovalRequested,
    CompactionIntent,
    CompactionReason,
    LaneConfiguration,
    NavigationIntent,
    OperationError,
    OperationFinished,
    OperationIntent,
    OperationKind,
    OperationOutcome,
    OperationResumed,
    OperationStarted,
    QueueCancelled,
    QueueEnqueued,
    RunIntent,
    StepAttempt,
    StepKind,
    ToolStarted,
    Usage,
    WriteDeferred,
)
from harness_core.session.types import LaneSlice, StoredEntry, StoredRecord

__all__ = [
    "ApprovalState",
    "LaneSlice",
    "FinishedOperation",
    "LaneState",
    "NewestOwn",
    "OperationState",
    "StepState",
    "ToolBatchState",
    "ToolCallState",
    "advance",
    "configure",
    "has_pending_work",
    "idle_lane",
    "needs_assistant",
    "reduce_lane",
]


@dataclass(frozen=True)
class StepState:
    """An unfinished step: its newest attempt's result entry does not exist yet."""

    kind: StepKind
    attempts: int
    """The durable attempt count (the newest attempt's number)."""
    result_entry_id: str
    compaction_reason: CompactionReason | None = None


@dataclass(frozen=True)
class ToolCallState:
    """One call of a tool batch, in source order."""

    tool_index: int
    call: ToolCallPart
    started: ToolStarted | None = None
    result_entry_id: str | None = None
    terminate: bool = False

    @property
    def result_exists(self) -> bool:
        """Whether the call's result entry was appended."""
        return self.result_entry_id is not None


@dataclass(frozen=True)
class ToolBatchState:
    """The tool calls of the newest assistant message that has any."""

    assistant_entry_id: str
    calls: tuple[ToolCallState, ...]
    truncated: bool
    """The assistant message stopped with ``length``: its calls never execute."""

    @property
    def unresolved(self) -> bool:
        """Whether some call has no result yet."""
        return any(not call.result_exists for call in self.calls)

    @property
    def terminate(self) -> bool:
        """Whether every result asked the run not to call the model again."""
        return bool(self.calls) and all(call.terminate for call in self.calls)


@dataclass(frozen=True)
class ApprovalState:
    """The newest approval wait of the current tool batch, and its decisions once made."""

    requested: ApprovalRequested
    decided: ApprovalDecided | None = None

    @property
    def waiting(self) -> bool:
        """Whether the run is suspended until a person decides."""
        return self.decided is None

    def decision(self, tool_call_id: str) -> ApprovalDecision | None:
        """The decision on one call, if made."""
        if self.decided is None:
            return None
        return next((d for d in self.decided.decisions if d.tool_call_id == tool_call_id), None)


@dataclass(frozen=True)
class NewestOwn:
    """The newest message the operation appended (deferred writes excluded)."""

    entry_id: str
    role: Literal["user", "assistant", "tool_result"]
    stop_reason: str | None = None
    failure: Literal["step", "deferred_fetch"] | None = None
    """Set when this is an assistant error (from a step, a deferred fetch, or a failure the run
    recorded): the terminal-failure marker. Recovery never completes such a run."""


@dataclass(frozen=True)
class OperationState:
    """The open operation of a lane."""

    id: str
    kind: OperationKind
    intent: OperationIntent
    source_leaf_id: str | None
    started_at: int
    configuration: LaneConfiguration
    aborting: bool = False
    abort_reason: OperationError | None = None
    """Why the abort was asked for, if said: its `OperationFinished` carries it (D266)."""
    step: StepState | None = None
    last_attempt_result_id: str | None = None
    tool_batch: ToolBatchState | None = None
    started_calls: frozenset[tuple[str, int]] = frozenset()
    missing_initial: tuple[Entry, ...] = ()
    pending_steer: tuple[Entry, ...] = ()
    pending_follow_up: tuple[Entry, ...] = ()
    pending_writes: tuple[Entry, ...] = ()
    deferred: DeferredHandle | None = None
    deferred_entry_id: str | None = None
    last_conversational_seq: int = 0
    last_overflow_compaction_seq: int = 0
    newest_own: NewestOwn | None = None
    last_assistant_entry_id: str | None = None
    result_written: bool = False
    """Structural operations: the compaction entry (or the branch summary) exists."""
    approval: ApprovalState | None = None
    """The current tool batch's approval wait (DESIGN §4.6)."""
    attempts: int = 1
    """Executions of this operation begun in its current budget: the first is 1, each resume
    after a crash adds one (`OperationResumed`), an operator's `unstick` starts again at 1."""
    turns: int = 0
    """Assistant messages this run produced since its newest consumed input (the prompt, a
    steer, a follow-up): what `max_turns` limits. Errors and deferred placeholders do not count."""

    @property
    def overflow_recovery_used(self) -> bool:
        """An overflow compaction is newer than the newest consumed conversational input."""
        return self.last_overflow_compaction_seq > self.last_conversational_seq

    @property
    def terminal_failure(self) -> bool:
        """The newest own message is a step- or fetch-produced error."""
        return self.newest_own is not None and self.newest_own.failure is not None


@dataclass(frozen=True)
class FinishedOperation:
    """How the lane's newest finished operation ended (what an operator sees on an idle lane)."""

    run_id: str
    outcome: OperationOutcome
    error: OperationError | None = None


@dataclass(frozen=True)
class LaneState:
    """Everything a lane's orchestration decides from."""

    lane: str
    leaf_id: str | None
    operation: OperationState | None = None
    pending_next_run: tuple[Entry, ...] = ()
    last_finished: FinishedOperation | None = None
    """The newest `OperationFinished` of the lane (restore reads it with one bounded query)."""


_S = TypeVar("_S")


def _evolve(state: _S, **changes: object) -> _S:
    """`dataclasses.replace` for the frozen states above, without re-running `__init__`.

    The states carry no `__post_init__` or validation, so a copy of the instance dict with the
    changes applied is the same value; it costs a seventh of `replace` (which collects every
    field and calls `__init__`, one `object.__setattr__` a field), and `advance` replaces a
    state or two on every write a lane makes.
    """
    fields = state.__dict__
    if not changes.keys() <= fields.keys():
        unknown = sorted(changes.keys() - fields.keys())
        raise TypeError(f"{type(state).__name__} has no field {unknown}")
    evolved = object.__new__(type(state))
    values = evolved.__dict__
    values.update(fields)
    values.update(changes)
    return evolved


def idle_lane(lane: str, leaf_id: str | None) -> LaneState:
    """The state of a lane with nothing open and nothing queued."""
    return LaneState(lane=lane, leaf_id=leaf_id)


def needs_assistant(op: OperationState) -> bool:
    """Whether the next checkpoint must call the model.

    True when the newest own message is user input or a tool result, except that a completed
    batch whose every result asked to terminate does not force another turn by itself.
    """
    newest = op.newest_own
    if newest is None or op.terminal_failure:
        return False
    if newest.role == "user":
        return True
    if newest.role == "tool_result":
        batch = op.tool_batch
        return batch is None or batch.unresolved or not batch.terminate
    return False


def has_pending_work(op: OperationState) -> bool:
    """Whether a run may not finish yet."""
    return bool(op.pending_writes or op.pending_steer or op.pending_follow_up) or needs_assistant(
        op
    )


def _corrupt(reason: CorruptionReason, message: str) -> RecordLogCorruption:
    return RecordLogCorruption(reason, message)


def _without(items: tuple[Entry, ...], entry_id: str) -> tuple[Entry, ...]:
    return tuple(item for item in items if item.id != entry_id)


def _find(items: tuple[Entry, ...], entry_id: str) -> Entry | None:
    for item in items:  # mostly empty: every write of a lane looks in three or four of these
        if item.id == entry_id:
            return item
    return None


def _start(state: LaneState, stored: StoredRecord, record: OperationStarted) -> LaneState:
    if state.operation is not None:
        raise _corrupt(
            "multiple_open_operations",
            f"lane {state.lane!r} starts {record.id!r} while {state.operation.id!r} is open",
        )
    intent = record.intent
    op = OperationState(
        id=record.id,
        kind=intent.kind,
        intent=intent,
        source_leaf_id=record.source_leaf_id,
        started_at=stored.timestamp,
        configuration=record.configuration,
    )
    pending_next_run = state.pending_next_run
    if isinstance(intent, RunIntent):
        captured = {entry.id for entry in intent.initial_messages}
        op = _evolve(op, missing_initial=intent.initial_messages)
        pending_next_run = tuple(e for e in pending_next_run if e.id not in captured)
    return _evolve(state, operation=op, pending_next_run=pending_next_run)


def _step(op: OperationState, stored: StoredRecord, record: StepAttempt) -> OperationState:
    if op.kind == "run" and record.step == "branch_summary":
        raise _corrupt("branch_summary_in_run", f"run {op.id!r} has a branch-summary step")
    if (record.step == "compaction") != (record.compaction_reason is not None):
        raise _corrupt(
            "compaction_reason",
            f"attempt {record.id!r}: compaction_reason is required on compaction steps only",
        )
    current = op.step
    continuing = current is not None and current.kind == record.step and record.attempt > 1
    if record.attempt != 1 and not (
        continuing and current and record.attempt == current.attempts + 1
    ):
        raise _corrupt(
            "attempts_not_consecutive",
            f"attempt {record.attempt} of a {record.step} step in {op.id!r} does not follow "
            f"{current.attempts if current else 'no attempt'}",
        )
    if continuing and current is not None:
        structural = record.step != "assistant"
        if structural and record.result_entry_id != current.result_entry_id:
            raise _corrupt("structural_step_mismatch", f"attempts of one {record.step} step differ")
        if record.compaction_reason != current.compaction_reason:
            raise _corrupt("structural_step_mismatch", "attempts of one step differ in reason")
    step = StepState(
        kind=record.step,
        attempts=record.attempt,
        result_entry_id=record.result_entry_id,
        compaction_reason=record.compaction_reason,
    )
    overflow_seq = op.last_overflow_compaction_seq
    if record.compaction_reason == "overflow":
        overflow_seq = stored.seq
    return _evolve(
        op,
        step=step,
        last_attempt_result_id=record.result_entry_id,
        last_overflow_compaction_seq=overflow_seq,
    )


def _tool_started(op: OperationState, record: ToolStarted) -> OperationState:
    batch = op.tool_batch
    key = (record.assistant_entry_id, record.tool_index)
    if key in op.started_calls:
        raise _corrupt("duplicate_tool_start", f"two tool_started for {key} in {op.id!r}")
    if (
        batch is None
        or batch.assistant_entry_id != record.assistant_entry_id
        or not 0 <= record.tool_index < len(batch.calls)
        or batch.calls[record.tool_index].call.id != record.tool_call_id
        or batch.calls[record.tool_index].call.name != record.tool_name
    ):
        raise _corrupt(
            "tool_identity_mismatch",
            f"tool_started {record.id!r} does not name call {record.tool_index} "
            f"({record.tool_call_id}, {record.tool_name}) of entry {record.assistant_entry_id!r}",
        )
    calls = list(batch.calls)
    calls[record.tool_index] = _evolve(calls[record.tool_index], started=record)
    return _evolve(
        op, tool_batch=_evolve(batch, calls=tuple(calls)), started_calls=op.started_calls | {key}
    )


def _record(state: LaneState, stored: StoredRecord) -> LaneState:
    record = stored.record
    if isinstance(record, OperationStarted):
        return _start(state, stored, record)
    if isinstance(record, Usage):
        return state  # the ledger is invisible to orchestration
    if isinstance(record, QueueEnqueued) and record.queue == "next_run":
        return _evolve(state, pending_next_run=(*state.pending_next_run, record.target))
    if isinstance(record, QueueCancelled) and record.run_id is None:
        if _find(state.pending_next_run, record.entry_id) is None:
            raise _corrupt(
                "cancel_unknown_item", f"{record.id!r} cancels {record.entry_id!r}, not pending"
            )
        return _evolve(state, pending_next_run=_without(state.pending_next_run, record.entry_id))
    op = state.operation
    run_id = getattr(record, "run_id", None)
    if op is None or run_id != op.id:
        raise _corrupt(
            "unknown_operation",
            f"record {record.id!r} ({record.type}) names {run_id!r}, not the open operation "
            f"{op.id if op else None!r}",
        )
    if isinstance(record, OperationFinished):
        finished = FinishedOperation(run_id=op.id, outcome=record.outcome, error=record.error)
        return _evolve(state, operation=None, last_finished=finished)
    if isinstance(record, OperationResumed):
        expected = 1 if record.unstick else op.attempts + 1
        if record.attempt != expected:
            raise _corrupt(
                "attempts_not_consecutive",
                f"{record.id!r} resumes {op.id!r} as attempt {record.attempt}, expected {expected}",
            )
        return _evolve(state, operation=_evolve(op, attempts=record.attempt))
    if isinstance(record, AbortRequested):
        return _evolve(
            state,
            operation=_evolve(
                op,
                aborting=True,
                abort_reason=record.reason,
                pending_steer=(),
                pending_follow_up=(),
            ),
        )
    if isinstance(record, StepAttempt):
        return _evolve(state, operation=_step(op, stored, record))
    if isinstance(record, ToolStarted):
        return _evolve(state, operation=_tool_started(op, record))
    if isinstance(record, QueueEnqueued):
        if op.aborting:
            raise _corrupt("queue_after_abort", f"{record.id!r} queues input after the abort")
        if record.queue == "steer":
            return _evolve(
                state, operation=_evolve(op, pending_steer=(*op.pending_steer, record.target))
            )
        return _evolve(
            state, operation=_evolve(op, pending_follow_up=(*op.pending_follow_up, record.target))
        )
    if isinstance(record, QueueCancelled):
        if _find(op.pending_steer, record.entry_id) is not None:
            op = _evolve(op, pending_steer=_without(op.pending_steer, record.entry_id))
        elif _find(op.pending_follow_up, record.entry_id) is not None:
            op = _evolve(op, pending_follow_up=_without(op.pending_follow_up, record.entry_id))
        else:
            raise _corrupt(
                "cancel_unknown_item", f"{record.id!r} cancels {record.entry_id!r}, not pending"
            )
        return _evolve(state, operation=op)
    if isinstance(record, ApprovalRequested):
        return _evolve(state, operation=_approval_requested(op, record))
    if isinstance(record, ApprovalDecided):
        return _evolve(state, operation=_approval_decided(op, record))
    assert isinstance(record, WriteDeferred)
    return _evolve(state, operation=_evolve(op, pending_writes=(*op.pending_writes, record.target)))


def _approval_requested(op: OperationState, record: ApprovalRequested) -> OperationState:
    batch = op.tool_batch
    waiting = op.approval is not None and op.approval.waiting
    if op.kind != "run" or op.aborting or batch is None or waiting:
        raise _corrupt(
            "approval_mismatch", f"{record.id!r} requests approval where none can be pending"
        )
    if batch.assistant_entry_id != record.assistant_entry_id:
        raise _corrupt("approval_mismatch", f"{record.id!r} names another tool batch")
    for pending in record.calls:
        index = pending.tool_index
        if (
            not 0 <= index < len(batch.calls)
            or batch.calls[index].call.id != pending.tool_call_id
            or batch.calls[index].call.name != pending.tool_name
            or batch.calls[index].result_exists
        ):
            raise _corrupt(
                "approval_mismatch", f"{record.id!r}: {pending.tool_call_id} is not an open call"
            )
    return _evolve(op, approval=ApprovalState(requested=record))


def _approval_decided(op: OperationState, record: ApprovalDecided) -> OperationState:
    approval = op.approval
    if approval is None or not approval.waiting or op.aborting:
        raise _corrupt("approval_mismatch", f"{record.id!r} decides no pending approval")
    if record.wait_id != approval.requested.id:
        raise _corrupt(
            "approval_mismatch",
            f"{record.id!r} answers wait {record.wait_id!r}, not {approval.requested.id!r}",
        )
    pending = {call.tool_call_id: call.args_digest for call in approval.requested.calls}
    decided = {decision.tool_call_id: decision.args_digest for decision in record.decisions}
    if len(decided) != len(record.decisions) or decided != pending:
        raise _corrupt(
            "approval_mismatch",
            f"{record.id!r} decides {sorted(decided)}, the wait lists {sorted(pending)} "
            "(ids and argument digests must match)",
        )
    return _evolve(op, approval=_evolve(approval, decided=record))


def _check_same(expected: Entry, entry: Entry) -> None:
    if expected != entry:
        raise _corrupt(
            "content_mismatch", f"entry {entry.id!r} differs from its provisioned payload"
        )


def configure(config: LaneConfiguration, entry: Entry) -> LaneConfiguration:
    """The configuration after `entry` on the path (unchanged unless it is a config entry)."""
    if isinstance(entry, ModelChangeEntry):
        return replace_config(config, provider=entry.provider, model_id=entry.model_id)
    if isinstance(entry, ThinkingLevelChangeEntry):
        return replace_config(config, thinking_level=entry.thinking_level)
    if isinstance(entry, ActiveToolsChangeEntry):
        return replace_config(config, active_tools=entry.active_tool_names)
    return config


def replace_config(config: LaneConfiguration, **changes: object) -> LaneConfiguration:
    """A configuration with some fields changed."""
    return LaneConfiguration(**{**dict(config), **changes})


def _message(
    op: OperationState, stored: StoredEntry, message_entry: MessageEntry, conversational: bool
) -> OperationState:
    # The changes are gathered and applied at once: this runs for every entry a lane appends.
    message = message_entry.message
    entry_id = stored.id
    changes: dict[str, object] = {}
    failure: Literal["step", "deferred_fetch"] | None = None
    is_error = isinstance(message, AssistantMessage) and message.stop_reason == "error"
    if is_error:
        # Only the harness appends assistant errors on a lane (deferred writes are handled
        # before this): a failed step, a give-up, a failed redemption, a failure marker.
        failure = "step"
    if op.deferred is not None and not conversational:
        # the redemption of a deferred request: its successor message
        if is_error:
            failure = "deferred_fetch"
        changes.update(deferred=None, deferred_entry_id=None)
    if op.step is not None and entry_id == op.step.result_entry_id:
        changes["step"] = None
    if isinstance(message, AssistantMessage):
        changes["last_assistant_entry_id"] = entry_id
        if message.stop_reason == "deferred" and message.deferred is not None:
            changes.update(deferred=message.deferred, deferred_entry_id=entry_id)
        parts = tuple(part for part in message.content if isinstance(part, ToolCallPart))
        if parts:
            batch = ToolBatchState(
                assistant_entry_id=entry_id,
                calls=tuple(ToolCallState(tool_index=i, call=part) for i, part in enumerate(parts)),
                truncated=message.stop_reason == "length",
            )
            changes.update(tool_batch=batch, approval=None)
    elif isinstance(message, ToolResultMessage) and op.tool_batch is not None:
        batch = op.tool_batch
        calls = list(batch.calls)
        for index, call in enumerate(calls):
            if call.call.id == message.tool_call_id and not call.result_exists:
                calls[index] = _evolve(
                    call, result_entry_id=entry_id, terminate=message_entry.terminate
                )
                break
        changes["tool_batch"] = _evolve(batch, calls=tuple(calls))
    if conversational:
        changes["last_conversational_seq"] = stored.seq
        changes["turns"] = 0
    elif (
        isinstance(message, AssistantMessage) and not is_error and message.stop_reason != "deferred"
    ):
        changes["turns"] = op.turns + 1
    stop_reason = message.stop_reason if isinstance(message, AssistantMessage) else None
    changes["newest_own"] = NewestOwn(
        entry_id=entry_id, role=message.role, stop_reason=stop_reason, failure=failure
    )
    return _evolve(op, **changes)


def _entry(state: LaneState, stored: StoredEntry) -> LaneState:
    entry = stored.entry
    op = state.operation
    if op is None:
        return _evolve(state, leaf_id=stored.id)
    configuration = configure(op.configuration, entry)
    if configuration is not op.configuration:
        op = _evolve(op, configuration=configuration)
    expected = _find(op.pending_writes, stored.id)
    if expected is not None:
        # An accepted write applied at a checkpoint: a fact, never the next turn's trigger.
        _check_same(expected, entry)
        op = _evolve(op, pending_writes=_without(op.pending_writes, stored.id))
        return _evolve(state, leaf_id=stored.id, operation=op)
    conversational = False
    for items in (op.missing_initial, op.pending_steer, op.pending_follow_up):
        expected = _find(items, stored.id)
        if expected is not None:
            _check_same(expected, entry)
            op = _evolve(
                op,
                missing_initial=_without(op.missing_initial, stored.id),
                pending_steer=_without(op.pending_steer, stored.id),
                pending_follow_up=_without(op.pending_follow_up, stored.id),
            )
            conversational = isinstance(entry, MessageEntry) and entry.message.role == "user"
            break
    if isinstance(entry, MessageEntry):
        op = _message(op, stored, entry, conversational)
    elif isinstance(entry, (CompactionEntry, BranchSummaryEntry)):
        if op.step is not None and stored.id == op.step.result_entry_id:
            op = _evolve(op, step=None)
        intent = op.intent
        if (isinstance(intent, CompactionIntent) and stored.id == intent.result_entry_id) or (
            isinstance(intent, NavigationIntent) and stored.id == intent.summary_entry_id
        ):
            op = _evolve(op, result_written=True)
    return _evolve(state, leaf_id=stored.id, operation=op)


def advance(state: LaneState, item: StoredEntry | StoredRecord) -> LaneState:
    """The lane's state after one more of its committed items (a record, or an own entry).

    Raises:
        RecordLogCorruption: the item contradicts the state (see `CorruptionReason`).
    """
    if isinstance(item, StoredRecord):
        return _record(state, item)
    return _entry(state, item)


def reduce_lane(lane_slice: LaneSlice) -> LaneState:
    """Fold a slice into the lane's state.

    Raises:
        RecordLogCorruption: the slice is a state no single writer can produce.
    """
    state = idle_lane(lane_slice.lane, None)
    finished = lane_slice.last_finished
    if finished is not None:
        record = finished.record
        if not isinstance(record, OperationFinished):
            raise RecordLogCorruption(
                "unknown_operation", f"{finished.id!r} is not an operation_finished record"
            )
        state = _evolve(
            state,
            last_finished=FinishedOperation(
                run_id=record.run_id, outcome=record.outcome, error=record.error
            ),
        )
    own_leaf: str | None = None
    for item in sorted(lane_slice.items, key=lambda i: i.seq):
        if isinstance(item, StoredEntry):
            own_leaf = item.id
        state = advance(state, item)
    op = state.operation
    if op is not None:
        allowed: set[str | None] = {own_leaf} if own_leaf is not None else {op.source_leaf_id}
        if isinstance(op.intent, NavigationIntent) and own_leaf is None:
            allowed.add(op.intent.target_id)
        if lane_slice.leaf_id not in allowed:
            raise RecordLogCorruption(
                "leaf_mismatch",
                f"lane {lane_slice.lane!r} is at {lane_slice.leaf_id!r} but its open operation "
                f"{op.id!r} left it at {sorted(map(str, allowed))}",
            )
    return _evolve(state, leaf_id=lane_slice.leaf_id)
