"""`ScriptedModel`: a deterministic `ModelClient` for tests, benchmarks and the no-key demo.

It is not a language model. It answers each request with the next scripted reply (or from a
responder function when the script runs out) and records every request and fetch it receives.

Tool-call ids: `tool_call` and `tool_calls` take an explicit call id, or leave it to the model. A
call without one is numbered by the `ScriptedModel` that answers with it, in the order that model
answers: ``call-1``, ``call-2``, ... So ids are unique across one model's answers (and within
each message) and depend only on what that model answered, never on other models or on which
tests ran before. Two answers share an id only when the script says so (an explicit id).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic import Field

from harness_core._runtime.context import estimate_tokens
from harness_core.clock import Clock, SystemClock
from harness_core.frozen import Frozen, JsonValue
from harness_core.messages import (
    AgentMessage,
    AssistantContent,
    AssistantMessage,
    DeferredHandle,
    ModelError,
    ModelErrorKind,
    TextPart,
    TokenUsage,
    ToolCallPart,
    ToolResultMessage,
    UserMessage,
    message_text,
)
from harness_core.models import DEFAULT_INFO, ModelInfo, ModelRef, ModelRequest

__all__ = [
    "Reply",
    "ScriptedModel",
    "Streamed",
    "deferred",
    "echo_responder",
    "error",
    "length",
    "results_of_this_run",
    "streamed",
    "text",
    "tool_call",
    "tool_calls",
]


class Streamed(Frozen):
    """An answer the model reports in chunks while it "writes" it (see `streamed`)."""

    message: AssistantMessage
    chunk_chars: int = Field(default=8, ge=1)
    """Characters of text per reported chunk."""
    pause_ms: int = Field(default=20, ge=0)
    """The pause before each chunk (on the model's clock)."""


Answer = AssistantMessage | Streamed
Reply = Answer | Callable[[ModelRequest], Answer]


_UNNUMBERED = "call-?"
"""The id prefix of a scripted call the answering model has not numbered yet (``call-?1``...)."""


def text(content: str, *, output_tokens: int | None = None) -> AssistantMessage:
    """A plain answer."""
    usage = TokenUsage(output=output_tokens if output_tokens is not None else len(content) // 4 + 1)
    return AssistantMessage(content=(TextPart(text=content),), stop_reason="stop", usage=usage)


def streamed(
    content: str, *, chunk_chars: int = 8, pause_ms: int = 20, output_tokens: int | None = None
) -> Streamed:
    """A plain answer streamed `chunk_chars` characters at a time, `pause_ms` before each."""
    return Streamed(
        message=text(content, output_tokens=output_tokens),
        chunk_chars=chunk_chars,
        pause_ms=pause_ms,
    )


def tool_call(
    name: str, arguments: Mapping[str, JsonValue] | None = None, *, call_id: str | None = None
) -> AssistantMessage:
    """An answer that calls one tool."""
    return tool_calls((name, arguments or {}, call_id))


def results_of_this_run(messages: Iterable[AgentMessage]) -> str:
    """What the tools returned since the last answer, one result a line (for a responder).

    A message sent while a run works joins it: the run's one reply then answers both, as a real
    model's would (the first tool's result came before the second message).
    """
    found: list[str] = []
    for message in reversed(list(messages)):
        if isinstance(message, AssistantMessage) and not any(
            isinstance(part, ToolCallPart) for part in message.content
        ):
            break  # the answer before this run
        if isinstance(message, ToolResultMessage):
            found.append(message_text(message))
    return "\n".join(reversed(found))


def tool_calls(*calls: tuple[str, Mapping[str, JsonValue], str | None]) -> AssistantMessage:
    """An answer that calls several tools, in order: (name, arguments, call id or None).

    A call without an id gets one from the `ScriptedModel` that answers with this message
    (``call-<n>``: its n-th numbered call); until then it holds a placeholder.
    """
    parts = tuple(
        ToolCallPart(id=call_id or f"{_UNNUMBERED}{position}", name=name, arguments=dict(arguments))
        for position, (name, arguments, call_id) in enumerate(calls, 1)
    )
    return AssistantMessage(
        content=parts, stop_reason="tool_use", usage=TokenUsage(output=10 * len(parts))
    )


def error(
    kind: ModelErrorKind = "server", *, retryable: bool = True, message: str = "scripted failure"
) -> AssistantMessage:
    """A provider failure, in band."""
    return AssistantMessage(
        stop_reason="error",
        error=ModelError(kind=kind, message=message, retryable=retryable),
        usage=TokenUsage(),
    )


def length(content: str, *, output_tokens: int, input_tokens: int = 0) -> AssistantMessage:
    """An answer cut off at `output_tokens` (compare with the request's intended cap).

    `input_tokens` is the prompt the provider reports (0: the request's estimate); a prompt that
    leaves less room in the window than the intended cap makes the stop context pressure.
    """
    return AssistantMessage(
        content=(TextPart(text=content),),
        stop_reason="length",
        usage=TokenUsage(
            input=input_tokens, output=output_tokens, total_tokens=input_tokens + output_tokens
        ),
    )


def deferred(
    handle_id: str, *, provider: str = "scripted", model: str = "test"
) -> AssistantMessage:
    """An answer that says the request continues in the background."""
    return AssistantMessage(
        stop_reason="deferred",
        deferred=DeferredHandle(provider=provider, model=model, id=handle_id),
        usage=TokenUsage(),
    )


def echo_responder(request: ModelRequest) -> AssistantMessage:
    """The demo's stand-in for a model: it repeats the newest user message back."""
    newest = next((m for m in reversed(request.messages) if isinstance(m, UserMessage)), None)
    said = message_text(newest) if newest else ""
    if request.step != "assistant":
        return text(f"(summary of {len(request.messages)} messages)")
    return text(f"You said: {said}" if said else "Hello.")


class ScriptedModel:
    """A `ModelClient` that replays a script and records what it was asked.

    Args:
        script: replies in order, each an `AssistantMessage` or a function of the request.
        responder: answers once the script is exhausted; without one, an exhausted script
            answers with a non-retryable error (a test asking more than it scripted fails loudly).
        fetches: outcomes of `fetch_deferred`, in order (the same deferred message = pending).
        info: limits reported for every model (or a mapping by ``provider:model_id``).
        clock: what the pauses of a `Streamed` answer wait on (the system clock by default).
    """

    def __init__(
        self,
        script: Iterable[Reply] = (),
        *,
        responder: Callable[[ModelRequest], Answer] | None = None,
        fetches: Iterable[AssistantMessage] = (),
        info: ModelInfo | Mapping[str, ModelInfo] = DEFAULT_INFO,
        known_models: Iterable[str] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.clock: Clock = clock or SystemClock()
        """What a `Streamed` answer's pauses wait on."""
        self.script: list[Reply] = list(script)
        self.fetch_script: list[AssistantMessage] = list(fetches)
        self.responder = responder
        self.info = info
        self.known_models = set(known_models) if known_models is not None else None
        self.requests: list[ModelRequest] = []
        self.fetches: list[DeferredHandle] = []
        self.cancels: list[DeferredHandle] = []
        self.numbered_calls = 0
        """How many tool calls this model has numbered (the last id it gave is ``call-<n>``)."""

    def model_info(self, model: ModelRef) -> ModelInfo | None:
        """The scripted limits (None for a model outside `known_models`)."""
        if self.known_models is not None and str(model) not in self.known_models:
            return None
        if isinstance(self.info, ModelInfo):
            return self.info
        return self.info.get(str(model))

    async def request(
        self, request: ModelRequest, on_update: Callable[[AssistantMessage], None] | None = None
    ) -> AssistantMessage:
        """Answer with the next scripted reply (a `Streamed` one chunk by chunk)."""
        self.requests.append(request)
        answer: Answer
        if self.script:
            reply = self.script.pop(0)
            answer = reply(request) if callable(reply) else reply
        elif self.responder is not None:
            answer = self.responder(request)
        else:
            answer = error(
                "invalid_request", retryable=False, message="ScriptedModel: the script is exhausted"
            )
        message = answer.message if isinstance(answer, Streamed) else answer
        message = self._complete(message, request)
        if isinstance(answer, Streamed) and on_update is not None:
            await _stream(message, answer, on_update, self.clock)
        if on_update is not None and message.content:
            on_update(message)
        return message

    def _number_calls(self, message: AssistantMessage) -> AssistantMessage:
        """Give each call without a scripted id the next ``call-<n>`` of this model."""
        content = self._numbered(message.content)
        return message if content is None else message.model_copy(update={"content": content})

    def _numbered(
        self, content: tuple[AssistantContent, ...]
    ) -> tuple[AssistantContent, ...] | None:
        """`content` with its unnumbered calls numbered (None: it has none)."""
        if not any(
            isinstance(part, ToolCallPart) and part.id.startswith(_UNNUMBERED) for part in content
        ):
            return None
        numbered = []
        for part in content:
            if isinstance(part, ToolCallPart) and part.id.startswith(_UNNUMBERED):
                self.numbered_calls += 1
                part = part.model_copy(update={"id": f"call-{self.numbered_calls}"})
            numbered.append(part)
        return tuple(numbered)

    def _complete(self, message: AssistantMessage, request: ModelRequest) -> AssistantMessage:
        """The answer as sent: its calls numbered, its usage and model filled in (one copy)."""
        usage = message.usage or TokenUsage()
        if usage.input == 0 and message.stop_reason != "error":
            prompt = request.estimated_input_tokens
            if prompt is None:
                prompt = estimate_tokens(request.messages, request.system_prompt)
            usage = usage.model_copy(
                update={"input": prompt, "total_tokens": prompt + usage.output}
            )
        updates: dict[str, Any] = {
            "usage": usage,
            "provider": message.provider or request.model.provider,
        }
        updates["model"] = message.model or request.model.model_id
        content = self._numbered(message.content)
        if content is not None:
            updates["content"] = content
        return message.model_copy(update=updates)

    async def fetch_deferred(self, handle: DeferredHandle) -> AssistantMessage:
        """The next scripted fetch outcome (pending when none is left)."""
        self.fetches.append(handle)
        if self.fetch_script:
            return self._number_calls(self.fetch_script.pop(0))
        return AssistantMessage(stop_reason="deferred", deferred=handle, usage=TokenUsage())

    async def cancel_deferred(self, handle: DeferredHandle) -> None:
        """Record the cancellation."""
        self.cancels.append(handle)


async def _stream(
    message: AssistantMessage,
    pace: Streamed,
    on_update: Callable[[AssistantMessage], None],
    clock: Clock,
) -> None:
    """Report `message`'s text growing by `pace.chunk_chars`, pausing before each chunk."""
    written = message_text(message)
    for end in range(pace.chunk_chars, len(written), pace.chunk_chars):
        await clock.sleep(pace.pause_ms / 1000)
        partial = written[:end]
        on_update(message.model_copy(update={"content": (TextPart(text=partial),)}))
    await clock.sleep(pace.pause_ms / 1000)  # the last chunk: the settled message
