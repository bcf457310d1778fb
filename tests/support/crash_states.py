"""Crash states written by hand through the public storage API (Tier A, reference §16.1).

`Prefill` appends a lane's records and entries one by one with `append_record`,
`append_entry` and `move_lane`, the way any writer (this one, an older version, another
backend's) could have left them; nothing here runs the harness. `render` turns log items into
short lines so a test can assert exactly what a recovery appended. Ids a test provisions are
kept verbatim; ids the recovering harness mints (``g<n>-...``) render as ``~``, so the
expectations do not depend on how many ids a procedure happens to draw.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from harness_core.approvals import args_digest
from harness_core.frozen import JsonValue
from harness_core.messages import (
    AssistantMessage,
    DeferredHandle,
    ModelError,
    ModelErrorKind,
    StopReason,
    TextPart,
    TokenUsage,
    ToolCallPart,
    ToolOutcome,
    ToolResultMessage,
    UserMessage,
)
from harness_core.session.contract import SessionStorage
from harness_core.session.entries import (
    ActiveToolsChangeEntry,
    BranchSummaryEntry,
    CompactionEntry,
    CustomEntry,
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
    OperationFinished,
    OperationOutcome,
    OperationResumed,
    OperationStarted,
    PendingApproval,
    QueueCancelled,
    QueueEnqueued,
    QueueName,
    Record,
    RunIntent,
    StepAttempt,
    StepKind,
    ToolStarted,
    Usage,
    UsageCause,
    WriteDeferred,
)
from harness_core.session.types import (
    FactSet,
    LaneMove,
    LogItem,
    StoredEntry,
    StoredRecord,
)

__all__ = [
    "CONFIGURATION",
    "GENERATED",
    "Prefill",
    "assistant_error",
    "assistant_text",
    "compaction_entry",
    "custom",
    "deferred_entry",
    "render",
    "render_log",
    "tool_result",
    "tool_use",
    "user",
]

CONFIGURATION = LaneConfiguration(provider="scripted", model_id="test")
"""The configuration hand-built operations carry (the test harness's default model)."""

GENERATED = "g"
"""Ids minted by a recovering harness start with ``g<n>-`` (its `SequentialIds` prefix)."""


# -- entries ----------------------------------------------------------------------------------


def user(entry_id: str, text: str = "please help") -> MessageEntry:
    """A user message entry."""
    return MessageEntry(id=entry_id, message=UserMessage(content=(TextPart(text=text),)))


def assistant_text(entry_id: str, text: str = "an answer") -> MessageEntry:
    """A settled assistant answer (``stop``)."""
    return MessageEntry(
        id=entry_id,
        message=AssistantMessage(
            content=(TextPart(text=text),), stop_reason="stop", usage=TokenUsage(output=3)
        ),
    )


def tool_use(
    entry_id: str,
    *calls: tuple[str, str] | tuple[str, str, dict[str, JsonValue]],
    stop_reason: StopReason = "tool_use",
) -> MessageEntry:
    """An assistant message calling tools: (call id, tool name[, arguments]) in source order."""
    parts = tuple(
        ToolCallPart(id=spec[0], name=spec[1], arguments=spec[2] if len(spec) > 2 else {})
        for spec in calls
    )
    return MessageEntry(
        id=entry_id,
        message=AssistantMessage(content=parts, stop_reason=stop_reason, usage=TokenUsage()),
    )


def assistant_error(
    entry_id: str, kind: ModelErrorKind = "invalid_request", *, retryable: bool = False
) -> MessageEntry:
    """An assistant error entry: the terminal-failure marker of a step."""
    return MessageEntry(
        id=entry_id,
        message=AssistantMessage(
            stop_reason="error",
            error=ModelError(kind=kind, message="it failed", retryable=retryable),
            usage=TokenUsage(),
        ),
    )


def deferred_entry(entry_id: str, handle_id: str = "job-1") -> MessageEntry:
    """An assistant message that parked a background request (stop reason ``deferred``)."""
    return MessageEntry(
        id=entry_id,
        message=AssistantMessage(
            stop_reason="deferred",
            deferred=DeferredHandle(provider="scripted", model="test", id=handle_id),
            usage=TokenUsage(),
        ),
    )


def tool_result(
    entry_id: str, call_id: str, name: str, outcome: ToolOutcome = "ok", *, terminate: bool = False
) -> MessageEntry:
    """A tool result entry."""
    return MessageEntry(
        id=entry_id,
        message=ToolResultMessage(
            tool_call_id=call_id,
            tool_name=name,
            content=(TextPart(text=f"{name} said {outcome}"),),
            outcome=outcome,
        ),
        terminate=terminate,
    )


def custom(entry_id: str, custom_type: str = "note", data: JsonValue = None) -> CustomEntry:
    """Application data."""
    return CustomEntry(id=entry_id, custom_type=custom_type, data=data)


def compaction_entry(entry_id: str, summary: str = "a summary") -> CompactionEntry:
    """A compaction checkpoint with nothing retained."""
    return CompactionEntry(id=entry_id, summary=summary, retained_tail=(), tokens_before=100)


# -- the prefill --------------------------------------------------------------------------------


class Prefill:
    """Writes one session's crash state through the storage API, item by item.

    Record ids are ``p1``, ``p2``, ... unless given; every method returns what it wrote.
    Nothing is validated beyond what the storage itself checks: a test can write any state a
    log could hold, including ones this harness never writes.
    """

    def __init__(self, storage: SessionStorage) -> None:
        self.storage = storage
        self._ids = itertools.count(1)
        self.waits: list[str] = []
        """The ids of the `ApprovalRequested` records written, oldest first (a decision
        answers the newest by default)."""

    def _rid(self) -> str:
        return f"p{next(self._ids)}"

    async def record(self, record: Record) -> StoredRecord:
        """Append any record."""
        return await self.storage.append_record(record)

    async def entry(self, entry: Entry, lane: str = "main") -> StoredEntry:
        """Append any entry to `lane` (it chains to the lane's leaf)."""
        return await self.storage.append_entry(entry, lane)

    async def entries(self, *entries: Entry, lane: str = "main") -> None:
        """Append several entries in order."""
        for entry in entries:
            await self.entry(entry, lane)

    async def leaf(self, lane: str = "main") -> str | None:
        """The lane's current leaf."""
        pointer = await self.storage.get_lane(lane)
        assert pointer is not None, f"no lane {lane!r}"
        return pointer.leaf_id

    async def lane(self, name: str, at: str | None = None) -> None:
        """Create a lane."""
        await self.storage.create_lane(name, at)

    async def move(self, to: str | None, lane: str = "main") -> LaneMove:
        """Move a lane's leaf (what navigation commits, or what another writer did)."""
        return await self.storage.move_lane(lane, to)

    async def run(
        self,
        run_id: str = "run",
        *initial: Entry,
        append: int | None = None,
        lane: str = "main",
        prompt: Sequence[Entry] | None = None,
    ) -> OperationStarted:
        """Accept a run with these initial messages, then append the first `append` of them.

        `append` defaults to all. `prompt` (the caller's own messages, default: every initial
        user message) becomes the intent's ``original_prompt``.
        """
        shown = initial if prompt is None else prompt
        record = OperationStarted(
            id=run_id,
            lane=lane,
            source_leaf_id=await self.leaf(lane),
            intent=RunIntent(
                original_prompt=tuple(e.message for e in shown if isinstance(e, MessageEntry)),
                initial_messages=initial,
            ),
            configuration=CONFIGURATION,
        )
        await self.record(record)
        for entry in initial[: len(initial) if append is None else append]:
            await self.entry(entry, lane)
        return record

    async def compaction(
        self, run_id: str = "op", result_entry_id: str = "cmp", lane: str = "main"
    ) -> OperationStarted:
        """Accept a manual compaction."""
        record = OperationStarted(
            id=run_id,
            lane=lane,
            source_leaf_id=await self.leaf(lane),
            intent=CompactionIntent(result_entry_id=result_entry_id),
            configuration=CONFIGURATION,
        )
        await self.record(record)
        return record

    async def navigation(
        self,
        target_id: str | None,
        run_id: str = "nav",
        *,
        summary_entry_id: str | None = None,
        label: str | None = None,
        lane: str = "main",
    ) -> OperationStarted:
        """Accept a navigation (summarize iff `summary_entry_id` is given)."""
        record = OperationStarted(
            id=run_id,
            lane=lane,
            source_leaf_id=await self.leaf(lane),
            intent=NavigationIntent(
                target_id=target_id,
                summarize=summary_entry_id is not None,
                label=label,
                summary_entry_id=summary_entry_id,
            ),
            configuration=CONFIGURATION,
        )
        await self.record(record)
        return record

    async def attempt(
        self,
        attempt: int,
        result_entry_id: str,
        *,
        run_id: str = "run",
        step: StepKind = "assistant",
        reason: CompactionReason | None = None,
        usage: StopReason | None = None,
        lane: str = "main",
    ) -> StepAttempt:
        """A step attempt; with `usage`, also the usage record of its settled request."""
        record = StepAttempt(
            id=self._rid(),
            lane=lane,
            run_id=run_id,
            step=step,
            attempt=attempt,
            result_entry_id=result_entry_id,
            compaction_reason=reason,
        )
        await self.record(record)
        if usage is not None:
            cause: UsageCause = "assistant" if step == "assistant" else step
            await self.record(
                Usage(
                    id=self._rid(),
                    lane=lane,
                    cause=cause,
                    usage=TokenUsage(input=10, output=2),
                    run_id=run_id,
                    entry_id=result_entry_id,
                    attempt=attempt,
                    stop_reason=usage,
                )
            )
        return record

    async def started(
        self,
        assistant_entry_id: str,
        tool_index: int,
        call_id: str,
        name: str,
        result_entry_id: str,
        replay: str = "never",
        *,
        args: dict[str, JsonValue] | None = None,
        run_id: str = "run",
        lane: str = "main",
    ) -> ToolStarted:
        """A `tool_started` record (the tool was about to run)."""
        record = ToolStarted(
            id=self._rid(),
            lane=lane,
            run_id=run_id,
            assistant_entry_id=assistant_entry_id,
            tool_index=tool_index,
            tool_call_id=call_id,
            tool_name=name,
            effective_args=args or {},
            result_entry_id=result_entry_id,
            replay=replay,
        )
        await self.record(record)
        return record

    async def enqueue(
        self, queue: QueueName, target: Entry, *, run_id: str | None = "run", lane: str = "main"
    ) -> QueueEnqueued:
        """Queued input (``next_run`` items carry no run id)."""
        record = QueueEnqueued(
            id=self._rid(),
            lane=lane,
            queue=queue,
            run_id=None if queue == "next_run" else run_id,
            target=target,
        )
        await self.record(record)
        return record

    async def cancel(
        self, entry_id: str, *, run_id: str | None = "run", lane: str = "main"
    ) -> QueueCancelled:
        """A queue retraction."""
        record = QueueCancelled(id=self._rid(), lane=lane, run_id=run_id, entry_id=entry_id)
        await self.record(record)
        return record

    async def write(self, target: Entry, *, run_id: str = "run", lane: str = "main") -> None:
        """A deferred write accepted mid-run."""
        await self.record(WriteDeferred(id=self._rid(), lane=lane, run_id=run_id, target=target))

    async def abort(self, *, run_id: str = "run", lane: str = "main") -> None:
        """An accepted abort."""
        await self.record(AbortRequested(id=self._rid(), lane=lane, run_id=run_id))

    async def finish(
        self, outcome: OperationOutcome = "completed", *, run_id: str = "run", lane: str = "main"
    ) -> None:
        """Close an operation."""
        await self.record(
            OperationFinished(id=self._rid(), lane=lane, run_id=run_id, outcome=outcome)
        )

    async def resumed(
        self, attempt: int, *, unstick: bool = False, run_id: str = "run", lane: str = "main"
    ) -> None:
        """An execution of an interrupted operation begins (its attempt in the budget)."""
        await self.record(
            OperationResumed(
                id=self._rid(), lane=lane, run_id=run_id, attempt=attempt, unstick=unstick
            )
        )

    async def usage(self, cause: UsageCause = "adjustment", *, lane: str = "main") -> None:
        """A ledger adjustment (invisible to recovery)."""
        await self.record(
            Usage(id=self._rid(), lane=lane, cause=cause, usage=TokenUsage(output=-1))
        )

    async def approval_requested(
        self,
        assistant_entry_id: str,
        *calls: tuple[int, str, str],
        started: bool = False,
        run_id: str = "run",
        lane: str = "main",
    ) -> ApprovalRequested:
        """A wait for decisions on calls (tool index, call id, tool name), arguments ``{}``."""
        record = ApprovalRequested(
            id=self._rid(),
            lane=lane,
            run_id=run_id,
            assistant_entry_id=assistant_entry_id,
            calls=tuple(
                PendingApproval(
                    tool_call_id=call_id,
                    tool_index=index,
                    tool_name=name,
                    args={},
                    args_digest=args_digest({}),
                    started=started,
                )
                for index, call_id, name in calls
            ),
        )
        await self.record(record)
        self.waits.append(record.id)
        return record

    async def approval_decided(
        self,
        *decisions: ApprovalDecision,
        key: str = "k-old",
        wait_id: str | None = None,
        run_id: str = "run",
        lane: str = "main",
    ) -> ApprovalDecided:
        """A recorded decision batch answering `wait_id` (default: the newest wait written)."""
        wait = wait_id or (self.waits[-1] if self.waits else None)
        assert wait is not None, "a decision answers a wait"
        record = ApprovalDecided(
            id=self._rid(),
            lane=lane,
            run_id=run_id,
            wait_id=wait,
            idempotency_key=key,
            decided_by="ops",
            decisions=decisions,
        )
        await self.record(record)
        return record


# -- rendering ----------------------------------------------------------------------------------

ASSERTED_RECORDS = frozenset(
    {
        "operation_started",
        "abort_requested",
        "operation_finished",
        "step_attempt",
        "tool_started",
        "queue_enqueued",
        "queue_cancelled",
        "write_deferred",
        "usage",
        "approval_requested",
        "approval_decided",
    }
)
"""Record types `render` shows. Others render as None: ``operation_resumed`` (the durable count
of resume attempts, asserted in `test_attempts.py`) and any bookkeeping record added later, so
Tier A expectations keep asserting the recovery work they name."""


def _id(value: str | None) -> str:
    if value is None:
        return "root"
    return "~" if value[:1] == GENERATED and "-" in value and value[1:2].isdigit() else value


def _text(message: AssistantMessage | UserMessage | ToolResultMessage) -> str:
    return " ".join(part.text for part in message.content if isinstance(part, TextPart))


def _entry(entry: Entry) -> str:
    if isinstance(entry, MessageEntry):
        message = entry.message
        if isinstance(message, UserMessage):
            return f"user {_text(message)}"
        if isinstance(message, ToolResultMessage):
            return f"result {message.tool_call_id} {message.outcome}"
        calls = [part.id for part in message.content if isinstance(part, ToolCallPart)]
        said = _text(message)
        return " ".join(
            [f"assistant {message.stop_reason}"]
            + ([said] if said else [])
            + ([f"calls={','.join(calls)}"] if calls else [])
        )
    if isinstance(entry, CustomEntry):
        return f"custom {entry.custom_type}"
    if isinstance(entry, ModelChangeEntry):
        return f"model_change {entry.provider}:{entry.model_id}"
    if isinstance(entry, ThinkingLevelChangeEntry):
        return f"thinking_level_change {entry.thinking_level}"
    if isinstance(entry, ActiveToolsChangeEntry):
        return f"active_tools_change {','.join(entry.active_tool_names)}"
    if isinstance(entry, BranchSummaryEntry):
        return f"branch_summary from={entry.from_id}"
    assert isinstance(entry, CompactionEntry)
    return "compaction"


def _record(record: Record) -> str | None:
    if record.type not in ASSERTED_RECORDS:
        return None
    if isinstance(record, StepAttempt):
        reason = f" {record.compaction_reason}" if record.compaction_reason else ""
        return f"attempt {record.step}#{record.attempt} {_id(record.result_entry_id)}{reason}"
    if isinstance(record, OperationFinished):
        error = f" {record.error.code}" if record.error else ""
        return f"finished {record.outcome}{error}"
    if isinstance(record, ToolStarted):
        return f"tool_started {record.tool_call_id} {record.tool_name} {record.replay}"
    if isinstance(record, Usage):
        return f"usage {record.cause}"
    if isinstance(record, QueueEnqueued):
        return f"enqueue {record.queue} {_id(record.target.id)}"
    if isinstance(record, QueueCancelled):
        return f"cancel {record.entry_id}"
    if isinstance(record, WriteDeferred):
        return f"write {_id(record.target.id)}"
    if isinstance(record, AbortRequested):
        return "abort"
    if isinstance(record, ApprovalRequested):
        calls = ",".join(c.tool_call_id + ("*" if c.started else "") for c in record.calls)
        return f"approval_requested {calls}"
    if isinstance(record, ApprovalDecided):
        decided = " ".join(d.tool_call_id + ("+" if d.approved else "-") for d in record.decisions)
        return f"approval_decided {decided}"
    assert isinstance(record, OperationStarted)
    return f"operation_started {record.intent.kind} {record.id}"


def render(item: LogItem) -> str | None:
    """One log item as a line: ``E <id> <what>``, ``R <what>``, ``L <lane> <leaf>``, ``F ...``.

    Entry and record lines of a lane other than ``main`` start with ``[lane]``. Returns None for
    record types this module does not assert on (see `ASSERTED_RECORDS`).
    """
    if isinstance(item, StoredEntry):
        lane = "" if item.lane in ("main", None) else f"[{item.lane}] "
        return f"{lane}E {_id(item.id)} {_entry(item.entry)}"
    if isinstance(item, StoredRecord):
        line = _record(item.record)
        if line is None:
            return None
        lane = "" if item.lane == "main" else f"[{item.lane}] "
        return f"{lane}R {line}"
    if isinstance(item, LaneMove):
        return f"L {item.lane} {_id(item.leaf_id)}"
    assert isinstance(item, FactSet)
    fact = item.fact
    if fact.fact == "name":
        return f"F name {fact.name}"
    return f"F label {fact.target_id}={fact.label}"


def render_log(items: Sequence[LogItem]) -> list[str]:
    """The lines of several items (unasserted record types left out)."""
    return [line for line in map(render, items) if line is not None]
