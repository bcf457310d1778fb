"""The project's own conversation messages: user, assistant and tool result, with their parts.

They are deliberately small and provider-neutral; conversion to a provider's message types
happens at the model boundary. All are immutable and JSON-safe, so they can sit inside durable
entries and records unchanged.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Literal, Self

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from harness_core.frozen import Frozen, FrozenJson, FrozenJsonObject

__all__ = [
    "AgentMessage",
    "AssistantContent",
    "AssistantMessage",
    "Cost",
    "DeferredHandle",
    "ImagePart",
    "message_text",
    "ModelError",
    "ModelErrorKind",
    "StopReason",
    "TextPart",
    "ThinkingPart",
    "TokenUsage",
    "ToolCallPart",
    "ToolFile",
    "ToolOutcome",
    "ToolResultMessage",
    "user_message",
    "UserContent",
    "UserMessage",
]


class TextPart(Frozen):
    """Plain text."""

    type: Literal["text"] = "text"
    text: str


class ImagePart(Frozen):
    """An inline image."""

    type: Literal["image"] = "image"
    media_type: str
    """MIME type, for example ``image/png``."""
    data: str
    """Base64-encoded bytes."""


class ThinkingPart(Frozen):
    """Model reasoning, kept so providers that require it can be sent it back."""

    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str | None = None
    """Provider signature that lets the reasoning be replayed verbatim."""


class ToolCallPart(Frozen):
    """A request by the model to call a tool."""

    type: Literal["tool_call"] = "tool_call"
    id: str
    """The provider's tool-call id; tool results refer to it."""
    name: str
    arguments: FrozenJsonObject = Field(default_factory=dict)


UserContent = Annotated[TextPart | ImagePart, Field(discriminator="type")]
AssistantContent = Annotated[TextPart | ThinkingPart | ToolCallPart, Field(discriminator="type")]


class Cost(Frozen):
    """Money spent, in US dollars; negative values are legal in adjustments."""

    input: float = 0.0
    output: float = 0.0
    cache_read: float = 0.0
    cache_write: float = 0.0
    total: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            input=self.input + other.input,
            output=self.output + other.output,
            cache_read=self.cache_read + other.cache_read,
            cache_write=self.cache_write + other.cache_write,
            total=self.total + other.total,
        )


class TokenUsage(Frozen):
    """Tokens and cost of provider requests; negative values are legal in adjustments."""

    input: int = 0
    output: int = 0
    """Output tokens, reasoning included."""
    cache_read: int = 0
    cache_write: int = 0
    total_tokens: int = 0
    cost: Cost = Cost()

    def __add__(self, other: TokenUsage) -> TokenUsage:
        mine, theirs = self.cost, other.cost
        # one validation for both models (the cost as a dict): a sum is validated like any
        # usage, so a cost sum that overflows to an infinity still raises ValidationError
        return TokenUsage.model_validate(
            {
                "input": self.input + other.input,
                "output": self.output + other.output,
                "cache_read": self.cache_read + other.cache_read,
                "cache_write": self.cache_write + other.cache_write,
                "total_tokens": self.total_tokens + other.total_tokens,
                "cost": {
                    "input": mine.input + theirs.input,
                    "output": mine.output + theirs.output,
                    "cache_read": mine.cache_read + theirs.cache_read,
                    "cache_write": mine.cache_write + theirs.cache_write,
                    "total": mine.total + theirs.total,
                },
            }
        )


StopReason = Literal["stop", "length", "tool_use", "error", "aborted", "deferred"]
"""Why a settled assistant message ended; errors are in-band, never exceptions."""

ToolOutcome = Literal["ok", "error", "blocked", "denied", "interrupted"]
"""How a tool call ended: ran fine; failed (it raised, timed out, or could not run: an unknown
tool or invalid arguments); was blocked by a `before_tool` hook; was denied by an approver; or
was interrupted with an unknown outcome (it may have happened)."""


ModelErrorKind = Literal[
    "rate_limit",
    "overloaded",
    "server",
    "network",
    "timeout",
    "context_overflow",
    "auth",
    "invalid_request",
    "content_filter",
    "expired",
    "unknown",
]


class ModelError(Frozen):
    """A provider failure, carried in the assistant message that reports it."""

    kind: ModelErrorKind
    message: str
    retryable: bool = False
    """Whether the same request may succeed if sent again (rate limits, 5xx, network)."""
    retry_after_ms: int | None = None
    """The provider's hint for when to retry, if it gave one."""


class DeferredHandle(Frozen):
    """A provider-side request still running (a background response or a batch)."""

    provider: str
    model: str
    id: str
    """The provider's identifier of the pending request."""
    data: FrozenJson = None
    """Whatever else the provider needs to fetch or cancel it."""


class UserMessage(Frozen):
    """Input from a person (or an application speaking for one)."""

    role: Literal["user"] = "user"
    content: tuple[UserContent, ...]
    sender: str | None = None
    """Who wrote it, as the channel names them (for example a Slack user id or an email address)."""
    timestamp: int | None = None
    """Unix milliseconds when the person sent it, if known."""


class AssistantMessage(Frozen):
    """A settled model response: `stop_reason` is final and errors are in-band."""

    role: Literal["assistant"] = "assistant"
    content: tuple[AssistantContent, ...] = ()
    stop_reason: StopReason
    provider: str | None = None
    model: str | None = None
    usage: TokenUsage | None = None
    """Display snapshot of the request that produced this message."""
    error: ModelError | None = None
    """What went wrong, when `stop_reason` is ``"error"`` (errors are in-band, never raised)."""
    raw_stop_reason: str | None = None
    """The provider's own stop reason, for diagnostics only."""
    deferred: DeferredHandle | None = None
    """Present exactly when `stop_reason` is ``"deferred"``."""
    timestamp: int | None = None

    @model_validator(mode="after")
    def _deferred_matches_stop_reason(self) -> Self:
        if (self.stop_reason == "deferred") != (self.deferred is not None):
            raise ValueError("a deferred handle is present exactly when stop_reason is 'deferred'")
        return self


class ToolFile(Frozen):
    """A file a tool returned (a report, a CSV): sent with the run's reply, never to the model.

    The model is told its name, type and size in the result's text (D227).
    """

    name: str = Field(min_length=1, max_length=255)
    """The file name a person sees (no directories)."""
    media_type: str = Field(min_length=3, max_length=255, pattern=r"^[\w.+-]+/[\w.+-]+$")
    """MIME type, for example ``text/csv``."""
    data: str
    """Base64-encoded bytes."""

    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        if any(c in name for c in "/\\\0\r\n") or name in {".", ".."}:
            raise ValueError("a file name is one plain name (no directories or line breaks)")
        return name

    @field_validator("data")
    @classmethod
    def _base64(cls, data: str) -> str:
        try:
            base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("a file's data is base64") from None
        return data

    @classmethod
    def of(cls, name: str, media_type: str, content: bytes) -> ToolFile:
        """A file of `content` bytes."""
        return cls(name=name, media_type=media_type, data=base64.b64encode(content).decode())

    @property
    def content(self) -> bytes:
        """The file's bytes."""
        return base64.b64decode(self.data)

    @property
    def size(self) -> int:
        """The file's size in bytes (from its base64 length, without decoding)."""
        return len(self.data) * 3 // 4 - self.data[-2:].count("=") if self.data else 0


class ToolResultMessage(Frozen):
    """The result of one tool call, as the model will see it."""

    role: Literal["tool_result"] = "tool_result"
    tool_call_id: str
    tool_name: str
    content: tuple[UserContent, ...] = ()
    outcome: ToolOutcome = "ok"
    details: FrozenJson = None
    """Structured data for applications; never sent to the model."""
    usage: TokenUsage | None = None
    """Nested model work the tool reported, if any."""
    files: tuple[ToolFile, ...] = ()
    """Files the tool returned, sent with the run's reply; never sent to the model."""
    timestamp: int | None = None

    @model_serializer(mode="wrap")
    def _files_only_when_any(self, handler: SerializerFunctionWrapHandler) -> Any:
        # a result without files encodes as it did before files existed: stored logs and their
        # canonical encodings stay byte-identical
        data = handler(self)
        if not self.files and isinstance(data, dict):
            data.pop("files", None)
        return data

    @property
    def is_error(self) -> bool:
        """Whether the model should read this result as a failure."""
        return self.outcome != "ok"


AgentMessage = Annotated[
    UserMessage | AssistantMessage | ToolResultMessage, Field(discriminator="role")
]


def user_message(
    text: str, *, sender: str | None = None, timestamp: int | None = None
) -> UserMessage:
    """Build a user message of one text part."""
    return UserMessage(content=(TextPart(text=text),), sender=sender, timestamp=timestamp)


def message_text(message: AgentMessage) -> str:
    """The plain text of a message (tool calls rendered as their name and arguments)."""
    parts: list[str] = []
    for part in message.content:
        if isinstance(part, TextPart):
            parts.append(part.text)
        elif isinstance(part, ToolCallPart):
            parts.append(f"[call {part.name} {dict(part.arguments)}]")
    return "\n".join(parts)
