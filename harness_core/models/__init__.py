"""The model boundary: one request in, one settled assistant message out (errors in-band).

`ModelClient` is what the harness calls; the pydantic-ai implementation and `ScriptedModel`
(tests, benchmarks, the no-key demo) implement it. Classification helpers decide what the
harness does with a settled message: retry it, compact and retry, or accept it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from pydantic import Field

from harness_core.frozen import Frozen, FrozenJsonObject
from harness_core.messages import AgentMessage, AssistantMessage, DeferredHandle
from harness_core.session.records import StepKind

__all__ = [
    "DEFAULT_INFO",
    "ModelClient",
    "ModelInfo",
    "ModelRef",
    "ModelRequest",
    "ToolDefinition",
    "is_context_overflow",
    "is_recoverable_length",
    "is_retryable",
]


class ModelRef(Frozen):
    """Which model: a provider and the provider's model id."""

    provider: str
    model_id: str

    def __str__(self) -> str:
        return f"{self.provider}:{self.model_id}"


class ModelInfo(Frozen):
    """What the harness needs to know about a model to plan requests."""

    context_window: int
    """Tokens the model accepts in one request, prompt and output together."""
    max_output_tokens: int
    """The model's own output cap (the intended maximum unless the caller sets a lower one)."""


DEFAULT_INFO = ModelInfo(context_window=128_000, max_output_tokens=8_192)
"""Limits assumed for a model nobody described (clients take per-model overrides)."""


class ToolDefinition(Frozen):
    """A tool as the model sees it."""

    name: str
    description: str
    parameters: FrozenJsonObject = Field(default_factory=dict)
    """JSON schema of the arguments."""


class ModelRequest(Frozen):
    """One provider request, fully described (the harness builds it, the client sends it)."""

    model: ModelRef
    system_prompt: str | None = None
    messages: tuple[AgentMessage, ...]
    tools: tuple[ToolDefinition, ...] = ()
    thinking_level: str = "off"
    max_output_tokens: int | None = None
    """The caller's cap, if any; the model's own cap applies otherwise."""
    deferred: bool = False
    """Ask for a background request: the client may answer with ``stop_reason="deferred"``."""
    step: StepKind = "assistant"
    attempt: int = 1
    estimated_input_tokens: int | None = None
    """The harness's size estimate of `system_prompt` + `messages` (None: not computed)."""


@runtime_checkable
class ModelClient(Protocol):
    """Sends requests to model providers.

    Never raises for provider failures: they come back as an assistant message with
    ``stop_reason="error"`` and a `ModelError`.
    """

    def model_info(self, model: ModelRef) -> ModelInfo | None:
        """Limits of a model, or None if this client cannot serve it (a missing identity)."""
        ...

    async def request(
        self,
        request: ModelRequest,
        on_update: Callable[[AssistantMessage], None] | None = None,
    ) -> AssistantMessage:
        """Send one request and return the settled message.

        `on_update` receives partial messages while streaming (progress only). Cancelling the
        awaiting task abandons the request; the harness then records ``stop_reason="aborted"``.
        """
        ...

    async def fetch_deferred(self, handle: DeferredHandle) -> AssistantMessage:
        """Check a deferred request once.

        Returns the same handle again (still pending), the result, or an error message
        (expired, unknown, consumed).
        """
        ...

    async def cancel_deferred(self, handle: DeferredHandle) -> None:
        """Best-effort cancellation of a deferred request."""
        ...


def is_retryable(message: AssistantMessage) -> bool:
    """Whether a settled message is a failure the same request may not hit again."""
    error = message.error
    return (
        message.stop_reason == "error"
        and error is not None
        and error.retryable
        and error.kind != "context_overflow"
    )


def is_context_overflow(message: AssistantMessage, info: ModelInfo | None) -> bool:
    """An overflow: the provider said the prompt did not fit, or it silently exceeded the window."""
    if message.stop_reason == "error":
        return message.error is not None and message.error.kind == "context_overflow"
    usage = message.usage
    return info is not None and usage is not None and usage.input > info.context_window


def is_recoverable_length(
    message: AssistantMessage, desired_max_output: int, context_window: int | None = None
) -> bool:
    """A ``length`` stop that compaction can help: the prompt left too little room for the answer.

    Reaching the intended output cap (reasoning included) is a genuine output limit. Stopping
    below it is context pressure only when the prompt left less room in `context_window` than
    that cap (a request the provider clamped to what was left, a Qwen-style empty ``length`` at
    a full window); with room to spare it is the provider's own output cap (its default
    ``max_tokens``, a server's limit), which compaction cannot change: genuine too (D132).
    Without a known window, any stop below the cap counts as pressure. No percentages.
    """
    if message.stop_reason != "length":
        return False
    usage = message.usage
    output = usage.output if usage is not None else 0
    if desired_max_output > 0 and output >= desired_max_output:
        return False
    if context_window is None or desired_max_output <= 0:
        return True
    prompt = usage.input if usage is not None else 0
    return context_window - prompt < desired_max_output
