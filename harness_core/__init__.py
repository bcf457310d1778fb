"""harness_core: the durable agent runtime. Everything a program needs is importable from here.

An `AgentHarness` runs an agent over one session of a store (`open_repo`); each Slack or email
thread is a lane (`AgentLane`). Every operation is durable before its effects, restore and
resume continue what a dead process left, and expected rejections come back as `Err` values.
The engine behind it (`harness_core._runtime`) is private. Four namespaces stay separate because
they are vocabularies of their own: `harness_core.session` (the stored entries, records and the
storage contract), `harness_core.storage` (the backends), `harness_core.testing` (the test kit)
and `harness_core.texts` (what the model reads from the harness). `scripted` is
`harness_core.models.scripted` (the deterministic model and its script builders).
"""

# ruff: noqa: I001  (the imports are grouped by what they are, as the reader looks for them)

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# -- the harness and its lanes ------------------------------------------------------------------
from harness_core._runtime.gate import ActionInfo, ActionKind
from harness_core.harness import (
    AgentHarness,
    AgentLane,
    LaneInfo,
    LaneSnapshot,
    LaneStatus,
    PromptInput,
    SessionTree,
    Started,
    SuspendedOperation,
    SuspendReason,
    Watch,
)
from harness_core.inspection import InterruptedCall, LaneInspection, inspect_lane, recovery_of
from harness_core.options import (
    AgentHarnessOptions,
    CompactionSettings,
    EntryProjector,
    QueueMode,
    RetryPolicy,
)

# -- results and outcomes -------------------------------------------------------------------------
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
    Rejection,
    Result,
    UnknownQueueItem,
    UnknownTarget,
    WaitSuperseded,
)

# -- messages --------------------------------------------------------------------------------------
from harness_core.messages import (
    AgentMessage,
    AssistantContent,
    AssistantMessage,
    Cost,
    DeferredHandle,
    ImagePart,
    ModelError,
    ModelErrorKind,
    StopReason,
    TextPart,
    ThinkingPart,
    TokenUsage,
    ToolCallPart,
    ToolFile,
    ToolOutcome,
    ToolResultMessage,
    UserContent,
    UserMessage,
    message_text,
    user_message,
)

# -- tools ----------------------------------------------------------------------------------------
from harness_core.tools import (
    PreparedToolCall,
    Replay,
    Tool,
    ToolArgumentsError,
    MAX_TOOL_FILES,
    MAX_TOOL_FILES_BYTES,
    MAX_TOOL_TEXT_CHARS,
    ToolContext,
    ToolOutput,
    ToolRecovery,
    idempotency_key,
    tool,
)

# -- models ---------------------------------------------------------------------------------------
from harness_core.models import (
    DEFAULT_INFO,
    ModelClient,
    ModelInfo,
    ModelRef,
    ModelRequest,
    ToolDefinition,
    scripted,
)
from harness_core.models.scripted import ScriptedModel

# -- approvals and decisions ----------------------------------------------------------------------
from harness_core.approvals import approve, args_digest, deny, supply
from harness_core.session.records import ApprovalDecision, PendingApproval, SuppliedResult

# -- portable state -------------------------------------------------------------------------------
from harness_core.portable import CapabilityState, HarnessState

# -- hooks ----------------------------------------------------------------------------------------
from harness_core.hooks import (
    AfterResponseEvent,
    AfterToolEvent,
    AfterToolPatch,
    BeforeCompactionEvent,
    BeforeCompactionResult,
    BeforeNavigationEvent,
    BeforeNavigationResult,
    BeforeRequestEvent,
    BeforeResumeEvent,
    BeforeRunEndEvent,
    BeforeRunEndResult,
    BeforeRunEvent,
    BeforeRunResult,
    BeforeToolEvent,
    BeforeToolResult,
    CompactionPreparation,
    HookError,
    HookName,
    Hooks,
    RequestOptions,
    SummaryResult,
    TransformContextEvent,
)

# -- events ---------------------------------------------------------------------------------------
from harness_core.events import (
    ApprovalDecidedEvent,
    LeaseLostEvent,
    CompactionEnd,
    CompactionStart,
    ConfigUpdate,
    EntryAdded,
    Event,
    EventBus,
    FactUpdate,
    Fault,
    HandlerError,
    LaneCreated,
    LeaseRenewalFailed,
    MessageEnd,
    MessageStart,
    MessageUpdate,
    NavigationEnd,
    NavigationStart,
    QueuedItem,
    QueueUpdate,
    RetryEnd,
    RetryScheduled,
    RetryStart,
    RunAbort,
    RunEnd,
    RunResume,
    RunStart,
    RunSuspend,
    ToolEnd,
    ToolStart,
    ToolUpdate,
    TurnEnd,
    TurnStart,
    UsageEvent,
    WritePending,
)

# -- the store: repositories, sessions, leases, what the harness's signatures name ---------------
from harness_core.session.contract import SessionStorage
from harness_core.session.contract import SessionRepo
from harness_core.session.entries import Entry
from harness_core.session.records import OperationError, OperationKind, OperationOutcome
from harness_core.session.types import (
    BranchQuery,
    EntryQuery,
    LeaseHolder,
    SessionStats,
    StoredEntry,
    WriterLease,
)
from harness_core.storage import open_repo

# -- errors ---------------------------------------------------------------------------------------
from harness_core.errors import (
    CorruptionReason,
    HarnessClosed,
    HarnessError,
    HarnessFault,
    HarnessNotImplemented,
    LeaseHeld,
    LeaseLost,
    RecordLogCorruption,
    SessionError,
    SessionErrorCode,
    StoreCorrupted,
)

# -- clocks, ids, JSON ----------------------------------------------------------------------------
from harness_core.clock import Clock, SystemClock
from harness_core.frozen import JsonValue
from harness_core.ids import IdGenerator, SequentialIds, Uuid7Ids
from harness_core import texts

if TYPE_CHECKING:
    from harness_core.models.pydantic_ai import ModelResolver, PydanticAIModel

_LAZY = {"ModelResolver", "PydanticAIModel"}
"""Imported on first use: they load pydantic-ai and the provider SDKs (a second of start-up)."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from harness_core.models import pydantic_ai

        return getattr(pydantic_ai, name)
    raise AttributeError(f"module 'harness_core' has no attribute {name!r}")


__all__ = [
    "AbortAccepted",
    "ActionInfo",
    "ActionKind",
    "AfterResponseEvent",
    "AfterToolEvent",
    "AfterToolPatch",
    "AgentHarness",
    "AgentHarnessOptions",
    "AgentLane",
    "AgentMessage",
    "AlreadyAccepted",
    "ApprovalDecidedEvent",
    "ApprovalDecision",
    "approve",
    "args_digest",
    "AssistantContent",
    "AssistantMessage",
    "BeforeCompactionEvent",
    "BeforeCompactionResult",
    "BeforeNavigationEvent",
    "BeforeNavigationResult",
    "BeforeRequestEvent",
    "BeforeResumeEvent",
    "BeforeRunEndEvent",
    "BeforeRunEndResult",
    "BeforeRunEvent",
    "BeforeRunResult",
    "BeforeToolEvent",
    "BeforeToolResult",
    "BranchQuery",
    "CapabilityState",
    "Clock",
    "Closed",
    "CompactionEnd",
    "CompactionPreparation",
    "CompactionSettings",
    "CompactionStart",
    "ConfigUpdate",
    "CorruptionReason",
    "Cost",
    "DecisionsMismatch",
    "DecisionsRequired",
    "DEFAULT_INFO",
    "DeferredHandle",
    "deny",
    "Entry",
    "EntryAdded",
    "EntryProjector",
    "EntryQuery",
    "Err",
    "Event",
    "EventBus",
    "FactUpdate",
    "Fault",
    "HandlerError",
    "HarnessClosed",
    "HarnessError",
    "HarnessFault",
    "HarnessNotImplemented",
    "HarnessState",
    "HookError",
    "HookName",
    "Hooks",
    "idempotency_key",
    "IdGenerator",
    "ImagePart",
    "inspect_lane",
    "InterruptedCall",
    "InvalidLane",
    "InvalidMessage",
    "InvalidUsage",
    "JsonValue",
    "LaneBusy",
    "LaneCreated",
    "LaneExists",
    "LaneInfo",
    "LaneInspection",
    "LaneSnapshot",
    "LaneStatus",
    "LaneStuck",
    "LeaseHeld",
    "LeaseHolder",
    "LeaseLost",
    "LeaseLostEvent",
    "LeaseRenewalFailed",
    "MAX_TOOL_FILES",
    "MAX_TOOL_FILES_BYTES",
    "MAX_TOOL_TEXT_CHARS",
    "message_text",
    "MessageEnd",
    "MessageStart",
    "MessageUpdate",
    "MissingIdentities",
    "ModelClient",
    "ModelError",
    "ModelErrorKind",
    "ModelInfo",
    "ModelRef",
    "ModelRequest",
    "ModelResolver",
    "NavigationEnd",
    "NavigationStart",
    "NoActiveOperation",
    "NoActiveRun",
    "NothingToCompact",
    "NothingToResume",
    "Ok",
    "open_repo",
    "OperationError",
    "OperationKind",
    "OperationOutcome",
    "Outcome",
    "PendingApproval",
    "PreparedToolCall",
    "PromptInput",
    "PydanticAIModel",
    "QueuedItem",
    "QueueMode",
    "QueueUpdate",
    "RecordLogCorruption",
    "recovery_of",
    "Rejection",
    "Replay",
    "RequestOptions",
    "Result",
    "RetryEnd",
    "RetryPolicy",
    "RetryScheduled",
    "RetryStart",
    "RunAbort",
    "RunEnd",
    "RunResume",
    "RunStart",
    "RunSuspend",
    "scripted",
    "ScriptedModel",
    "SequentialIds",
    "SessionError",
    "SessionErrorCode",
    "SessionRepo",
    "SessionStats",
    "SessionStorage",
    "SessionTree",
    "Started",
    "StopReason",
    "StoreCorrupted",
    "StoredEntry",
    "SummaryResult",
    "SuppliedResult",
    "supply",
    "SuspendedOperation",
    "SuspendReason",
    "SystemClock",
    "TextPart",
    "texts",
    "ThinkingPart",
    "TokenUsage",
    "tool",
    "Tool",
    "ToolArgumentsError",
    "ToolCallPart",
    "ToolContext",
    "ToolDefinition",
    "ToolEnd",
    "ToolFile",
    "ToolOutcome",
    "ToolOutput",
    "ToolRecovery",
    "ToolResultMessage",
    "ToolStart",
    "ToolUpdate",
    "TransformContextEvent",
    "TurnEnd",
    "TurnStart",
    "UnknownQueueItem",
    "UnknownTarget",
    "UsageEvent",
    "user_message",
    "UserContent",
    "UserMessage",
    "Uuid7Ids",
    "WaitSuperseded",
    "Watch",
    "WritePending",
    "WriterLease",
]
