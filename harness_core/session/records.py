"""Lane op-log records: the record types that let a new process continue a lane's work.

The reference's nine, plus the two approval records of DESIGN §4.6 (`ApprovalRequested`,
`ApprovalDecided`) and `OperationResumed`, which counts the executions of an operation that
crashes interrupted (a lane whose operation keeps crashing its process is parked stuck).

Records never enter the tree or model context. Each belongs to exactly one lane; records of an
operation carry `run_id`, the id of its `OperationStarted` record. Shapes are checked here; the
cross-record validity rules (which make a log corrupt) belong to the reducer, so that an
imported or hand-edited log is reported as corrupt with a reason instead of failing to decode.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self, TypeAlias

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    StringConstraints,
    model_serializer,
    model_validator,
)

from harness_core.frozen import Frozen, FrozenJson, FrozenJsonObject
from harness_core.messages import AgentMessage, StopReason, TokenUsage
from harness_core.session.entries import Entry, Id

__all__ = [
    "AbortRequested",
    "ApprovalDecided",
    "ApprovalDecision",
    "ApprovalRequested",
    "CompactionIntent",
    "CompactionReason",
    "LaneConfiguration",
    "LaneName",
    "NavigationIntent",
    "OperationError",
    "OperationFinished",
    "OperationIntent",
    "OperationKind",
    "OperationOutcome",
    "OperationResumed",
    "OperationStarted",
    "PendingApproval",
    "QueueCancelled",
    "QueueEnqueued",
    "QueueName",
    "Record",
    "RecordType",
    "RunIntent",
    "StepAttempt",
    "StepKind",
    "ToolStarted",
    "Usage",
    "UsageCause",
    "WriteDeferred",
]

LaneName: TypeAlias = Annotated[
    str,
    StringConstraints(min_length=1, max_length=512, pattern=r"^[^\x00-\x1f\x7f]+$"),
]
"""A lane name: a permanent application key such as ``slack:C123:1719432.0021``."""

RecordType = Literal[
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
    "operation_resumed",
]
OperationKind = Literal["run", "compaction", "navigation"]
OperationOutcome = Literal["completed", "aborted", "failed", "declined"]
StepKind = Literal["assistant", "compaction", "branch_summary"]
CompactionReason = Literal["manual", "threshold", "overflow"]
QueueName = Literal["steer", "follow_up", "next_run"]
UsageCause = Literal[
    "assistant", "compaction", "branch_summary", "deferred_fetch", "tool", "hook", "adjustment"
]


class _RecordBase(Frozen):
    id: Id
    """The record's identity; an `OperationStarted` id is its operation's run id."""
    lane: LaneName


class RunIntent(Frozen):
    """What a run was accepted to do."""

    kind: Literal["run"] = "run"
    original_prompt: tuple[AgentMessage, ...]
    """Normalized caller input, before hooks; excludes captured next-run items and injections."""
    initial_messages: tuple[Entry, ...]
    """Captured next-run items, the prompt, then before_run injections (provisioned ids)."""
    system_prompt_override: str | None = None
    resume_data: FrozenJsonObject | None = None
    """Opaque state keyed by stable hook registration id."""


class CompactionIntent(Frozen):
    """A manual compaction and the entry it will produce."""

    kind: Literal["compaction"] = "compaction"
    custom_instructions: str | None = None
    result_entry_id: Id


class NavigationIntent(Frozen):
    """A move of the lane's leaf, with an optional branch summary and label."""

    kind: Literal["navigation"] = "navigation"
    target_id: Id | None
    """The destination entry; None is the root."""
    summarize: bool = False
    custom_instructions: str | None = None
    label: str | None = None
    """A label fact written at completion."""
    summary_entry_id: Id | None = None
    """The provisioned branch-summary entry, present when `summarize`."""


OperationIntent = Annotated[
    RunIntent | CompactionIntent | NavigationIntent, Field(discriminator="kind")
]


class LaneConfiguration(Frozen):
    """A lane's effective model, thinking level and active tools."""

    provider: str
    model_id: str
    thinking_level: str = "off"
    active_tools: tuple[str, ...] | None = None
    """Names of the tools the model may call; None means every registered tool."""


class OperationStarted(_RecordBase):
    """The acceptance boundary of an operation; its id is the run id."""

    type: Literal["operation_started"] = "operation_started"
    source_leaf_id: Id | None
    """The lane's leaf at acceptance."""
    intent: OperationIntent
    configuration: LaneConfiguration
    """The lane's effective configuration at acceptance, so restore never walks the lane's
    history to find it (changes during the operation are entries the operation appended)."""


class OperationError(Frozen):
    """Why an operation failed (or, given with an abort, why it was aborted)."""

    code: str
    message: str


class AbortRequested(_RecordBase):
    """An abort was accepted; reconciliation and `OperationFinished(aborted)` follow."""

    type: Literal["abort_requested"] = "abort_requested"
    run_id: Id
    reason: OperationError | None = None
    """Why, when the caller said (a13n's ``authority_revoked``): the operation's
    `OperationFinished(aborted)` carries it as its `error` (D266)."""

    @model_serializer(mode="wrap")
    def _reason_only_when_given(self, handler: SerializerFunctionWrapHandler) -> Any:
        # an abort without a reason encodes as it did before D266: stored logs and their
        # canonical encodings stay byte-identical
        data = handler(self)
        if self.reason is None and isinstance(data, dict):
            data.pop("reason", None)
        return data


class OperationFinished(_RecordBase):
    """Closes an operation."""

    type: Literal["operation_finished"] = "operation_finished"
    run_id: Id
    outcome: OperationOutcome
    error: OperationError | None = None
    final_entry_id: Id | None = None
    """A run's newest assistant message at its end (what it answered); informational."""
    leaf_id: Id | None = None
    """The lane's leaf at the end; informational (an outcome can be rebuilt from the record)."""


class OperationResumed(_RecordBase):
    """An execution of an operation that a crash (or a closed process) interrupted begins.

    The operation's first execution is attempt 1; each resume after a crash counts one more, so
    an operation that keeps killing its process leaves a trace instead of re-running invisibly.
    At the harness's ``max_attempts`` the lane is parked stuck until an operator resumes it with
    `unstick`, which starts a fresh budget (attempt 1 again).
    """

    type: Literal["operation_resumed"] = "operation_resumed"
    run_id: Id
    attempt: Annotated[int, Field(ge=1)]
    unstick: bool = False
    """An explicit override past the attempt budget (then `attempt` is 1)."""


class StepAttempt(_RecordBase):
    """About to attempt a retryable step for the n-th time; the durable count caps retries."""

    type: Literal["step_attempt"] = "step_attempt"
    run_id: Id
    step: StepKind
    attempt: Annotated[int, Field(ge=1)]
    result_entry_id: Id
    """The entry this attempt produces if it succeeds."""
    compaction_reason: CompactionReason | None = None
    """Required on compaction steps and forbidden on others (checked by the reducer)."""


class ToolStarted(_RecordBase):
    """A tool is about to run; `assistant_entry_id` + `tool_index` is its invocation identity."""

    type: Literal["tool_started"] = "tool_started"
    run_id: Id
    assistant_entry_id: Id
    tool_index: Annotated[int, Field(ge=0)]
    tool_call_id: str
    tool_name: str
    effective_args: FrozenJsonObject
    """The arguments after before_tool hooks."""
    result_entry_id: Id
    replay: Literal["never", "safe"]
    """The tool's replay declaration when it started; recovery replays only if this and the
    current declaration are both ``"safe"``."""


class QueueEnqueued(_RecordBase):
    """Queued input; its entry is appended where the model first sees it."""

    type: Literal["queue_enqueued"] = "queue_enqueued"
    queue: QueueName
    run_id: Id | None = None
    """The run the item belongs to; absent for next-run items."""
    target: Entry


class QueueCancelled(_RecordBase):
    """A durable retraction of a queued item that was still pending."""

    type: Literal["queue_cancelled"] = "queue_cancelled"
    run_id: Id | None = None
    entry_id: Id


class WriteDeferred(_RecordBase):
    """An entry or configuration change requested mid-run, applied at the next checkpoint."""

    type: Literal["write_deferred"] = "write_deferred"
    run_id: Id
    target: Entry


class Usage(_RecordBase):
    """The cost ledger: one measurement, written whatever the outcome of the request.

    Which optional fields are required depends on `cause`:
    ``assistant``/``compaction``/``branch_summary``/``deferred_fetch`` need `run_id`, `entry_id`,
    `attempt` and `stop_reason`; ``tool`` needs `run_id`, `entry_id` and `tool_call_id`; ``hook``
    needs `run_id` and `entry_id`; ``adjustment`` may carry `run_id`, `entry_id` and `details`.
    """

    type: Literal["usage"] = "usage"
    cause: UsageCause
    usage: TokenUsage
    run_id: Id | None = None
    entry_id: Id | None = None
    """The provisioned id the measurement belongs to (it may never materialize)."""
    attempt: Annotated[int, Field(ge=1)] | None = None
    stop_reason: StopReason | None = None
    tool_call_id: str | None = None
    details: FrozenJson = None

    @model_validator(mode="after")
    def _fields_match_cause(self) -> Self:
        required: tuple[str, ...]
        allowed: tuple[str, ...]
        if self.cause in ("assistant", "compaction", "branch_summary", "deferred_fetch"):
            required = allowed = ("run_id", "entry_id", "attempt", "stop_reason")
        elif self.cause == "tool":
            required = allowed = ("run_id", "entry_id", "tool_call_id")
        elif self.cause == "hook":
            required = allowed = ("run_id", "entry_id")
        else:
            required, allowed = (), ("run_id", "entry_id", "details")
        optional = ("run_id", "entry_id", "attempt", "stop_reason", "tool_call_id", "details")
        for name in optional:
            present = getattr(self, name) is not None
            if name in required and not present:
                raise ValueError(f"usage with cause {self.cause!r} needs {name}")
            if name not in allowed and present:
                raise ValueError(f"usage with cause {self.cause!r} must not carry {name}")
        return self


class PendingApproval(Frozen):
    """A tool call waiting for a person's decision."""

    tool_call_id: str
    tool_index: Annotated[int, Field(ge=0)]
    tool_name: str
    args: FrozenJsonObject
    """The arguments the approver sees (after `before_tool` hooks)."""
    args_digest: str
    """SHA-256 of the canonical JSON of `args`: what a decision approves."""
    started: bool = False
    """A replay of a call that had started before a crash (its outcome is unknown)."""


class ApprovalRequested(_RecordBase):
    """The run suspends until every listed call of its newest tool batch is decided.

    Its `id` identifies this wait: a decision batch names it, so an answer to an earlier wait of
    the same run (or of another run whose calls reuse the ids) can never decide this one.
    """

    type: Literal["approval_requested"] = "approval_requested"
    run_id: Id
    assistant_entry_id: Id
    calls: Annotated[tuple[PendingApproval, ...], Field(min_length=1)]
    leaf_id: Id | None = None
    """The lane's leaf when the run suspended; informational."""


MAX_SUPPLIED_CHARS = 100_000
"""The longest result a decision may supply (a tool's own output has its own bounds)."""


class SuppliedResult(Frozen):
    """A tool's result given by whoever decided the call: they did the action themselves."""

    text: Annotated[str, StringConstraints(min_length=1, max_length=MAX_SUPPLIED_CHARS)]
    """What the model reads as the call's result."""
    is_error: bool = False
    """The action failed (the model reads it as a failed call)."""


class ApprovalDecision(Frozen):
    """One call's decision: approve (optionally with replacement arguments), deny, or supply.

    It is bound to the arguments the decider saw (`args_digest`): a decision for other arguments
    decides nothing. A supplied result (`supplied`, with ``approved=True``) stands in for the
    call: the tool does not run, the result is recorded as the call's (a13n C2: an application-
    executed tool; D236).
    """

    tool_call_id: str
    args_digest: str
    """The `PendingApproval.args_digest` of the call decided."""
    approved: bool
    override_args: FrozenJsonObject | None = None
    reason: str | None = None
    """Why it was denied (shown to the model), or a note on the approval."""
    supplied: SuppliedResult | None = None
    """The call's result, given instead of running the tool."""

    @model_validator(mode="after")
    def _override_only_when_approved(self) -> Self:
        if self.override_args is not None and not self.approved:
            raise ValueError("override_args only make sense for an approval")
        if self.supplied is not None and (not self.approved or self.override_args is not None):
            raise ValueError("a supplied result stands for an approved call, without new args")
        return self

    @model_serializer(mode="wrap")
    def _supplied_only_when_given(self, handler: SerializerFunctionWrapHandler) -> Any:
        # a decision without a supplied result encodes as it did before D236: stored logs and
        # their canonical encodings stay byte-identical
        data = handler(self)
        if self.supplied is None and isinstance(data, dict):
            data.pop("supplied", None)
        return data


class ApprovalDecided(_RecordBase):
    """A whole decision batch, durable before any decided call runs."""

    type: Literal["approval_decided"] = "approval_decided"
    run_id: Id
    wait_id: Id
    """The `ApprovalRequested` this batch answers."""
    idempotency_key: str
    """The decider's key: the same key replays the same result."""
    decided_by: str | None = None
    decisions: Annotated[tuple[ApprovalDecision, ...], Field(min_length=1)]


Record = Annotated[
    OperationStarted
    | AbortRequested
    | OperationFinished
    | StepAttempt
    | ToolStarted
    | QueueEnqueued
    | QueueCancelled
    | WriteDeferred
    | Usage
    | ApprovalRequested
    | ApprovalDecided
    | OperationResumed,
    Field(discriminator="type"),
]
"""Any lane op-log record, as written (storage adds `seq` and `timestamp` in `StoredRecord`)."""
