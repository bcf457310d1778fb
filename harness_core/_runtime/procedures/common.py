"""What every part of a procedure shares: the operation's context, control-flow signals, helpers.

A procedure reads the lane's live state and acts only through its `Effects` object (`fx`), so
manual drive can park it before every effect and tests can cut it at any of them. The control
flow signals (`_RunFailed`, `_Park`, `_Aborted`, `_Overflow`, `_AwaitApproval`) never leave the
procedures package.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from opentelemetry.trace import INVALID_SPAN, Span

from harness_core._runtime.effects import Effects
from harness_core._runtime.lane import LaneRuntime
from harness_core._runtime.reduction import (
    OperationState,
    ToolCallState,
    configure,
)
from harness_core._runtime.telemetry import Telemetry
from harness_core.frozen import (
    FrozenJsonObject,
)
from harness_core.messages import (
    AssistantMessage,
    DeferredHandle,
    ModelError,
    TokenUsage,
    ToolCallPart,
)
from harness_core.models import (
    ModelRef,
)
from harness_core.session.entries import MessageEntry
from harness_core.session.records import (
    ApprovalRequested,
    LaneConfiguration,
    OperationError,
    RunIntent,
)
from harness_core.tools import (
    Tool,
    ToolRecovery,
)

__all__ = ["OperationContext", "Part"]


@dataclass(eq=False)
class OperationContext:
    """One open operation's procedure: its lane, effects, recovery policy and span."""

    lane: LaneRuntime
    fx: Effects
    tool_recovery: ToolRecovery = "declared"
    span: Span = INVALID_SPAN
    """The operation's span (the parent of its step and tool spans)."""
    telemetry: Telemetry = field(init=False)
    model_ref: tuple[LaneConfiguration, ModelRef] | None = field(default=None, init=False)
    """The model of the newest configuration asked (a step asks several times)."""

    def __post_init__(self) -> None:
        options = self.lane.runtime.options
        self.telemetry = Telemetry(options.tracer, options.trace_parent)


@dataclass(frozen=True, slots=True)
class _NeedsApproval:
    call: ToolCallState
    args: FrozenJsonObject
    started: bool = False


class _AwaitApproval(Exception):
    def __init__(self, wait: ApprovalRequested) -> None:
        super().__init__("awaiting approval")
        self.wait = wait


class _RunFailed(Exception):
    def __init__(self, error: OperationError) -> None:
        super().__init__(error.message)
        self.error = error


class _Park(Exception):
    def __init__(self, handle: DeferredHandle) -> None:
        super().__init__("parked")
        self.handle = handle


class _Aborted(Exception):
    pass


class _Overflow(Exception):
    pass


def _message_error(message: AssistantMessage) -> OperationError:
    error = message.error
    return OperationError(
        code=error.kind if error else "error",
        message=error.message if error else "the model failed",
    )


def _turn_limit(limit: int) -> OperationError:
    return OperationError(
        code="turn_limit",
        message=f"the model took {limit} turns without finishing (the run's limit, max_turns)",
    )


def _over_budget(spent: int, budget: int) -> OperationError:
    return OperationError(
        code="token_budget",
        message=f"the lane has spent {spent} tokens of its budget of {budget} (token_budget)",
    )


def _truncation() -> OperationError:
    return OperationError(
        code="context_overflow", message="the conversation does not fit the model's context window"
    )


def _give_up(entry_id: str, error: OperationError) -> MessageEntry:
    message = AssistantMessage(
        stop_reason="error",
        error=ModelError(kind="unknown", message=error.message),
        usage=TokenUsage(),
    )
    return MessageEntry(id=entry_id, message=message)


def _tool_calls(message: AssistantMessage) -> tuple[ToolCallPart, ...]:
    return tuple(part for part in message.content if isinstance(part, ToolCallPart))


class Part:
    """A part of the procedures of one operation; the parts share its context."""

    def __init__(self, ctx: OperationContext) -> None:
        self.ctx = ctx
        self.lane = ctx.lane
        self.fx = ctx.fx
        self.rt = ctx.lane.runtime
        self.telemetry = ctx.telemetry

    @property
    def span(self) -> Span:
        """The operation's span."""
        return self.ctx.span

    @property
    def op(self) -> OperationState:
        """The operation this procedure drives."""
        return self.lane.operation

    def _id(self) -> str:
        return self.rt.ids.next()

    def _emit(self, event: object) -> None:
        self.rt.events.emit(event)

    def _wants(self, event_type: str) -> bool:
        """Whether an event of `event_type` would reach anyone (else it need not be built)."""
        return self.rt.events.wants(event_type)

    def _model(self) -> ModelRef:
        config = self.op.configuration
        cached = self.ctx.model_ref
        if cached is None or cached[0] is not config:
            cached = (config, ModelRef(provider=config.provider, model_id=config.model_id))
            self.ctx.model_ref = cached
        return cached[1]

    def _system_prompt(self) -> str | None:
        intent = self.op.intent
        if isinstance(intent, RunIntent) and intent.system_prompt_override is not None:
            return intent.system_prompt_override
        return self.rt.system_prompt(self.lane.name)

    def _active_tools(self) -> list[Tool]:
        names = self.op.configuration.active_tools
        tools = self.rt.tools
        if names is None:
            return list(tools.values())
        return [tools[name] for name in names if name in tools]

    def _current_surface(self) -> dict[str, Tool]:
        """The tools the lane offers now: the operation's configuration, pending changes applied.

        A tool switched off after a crash, before the resume, is off for its recovery already
        (a13n B4, D234).
        """
        config = self.op.configuration
        for entry in self.op.pending_writes:
            config = configure(config, entry)
        tools = self.rt.tools
        if config.active_tools is None:
            return dict(tools)
        return {name: tools[name] for name in config.active_tools if name in tools}
