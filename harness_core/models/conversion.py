"""Conversion between the project's messages and pydantic-ai's, both ways.

Used at the model boundary (`PydanticAIModel`) and for portable state (`HarnessState`), whose
messages can be written as pydantic-ai `ModelMessagesTypeAdapter` JSON and read back. The
mapping is lossless for what the project keeps: text, images, thinking (with signatures), tool
calls, tool results with their outcome, stop reasons and usage.

Reasoning models that write their thinking into the answer's text between ``<think>`` and
``</think>`` get it back as thinking, never as text (D134): pydantic-ai splits the tags only
when each arrives as a delta of its own, so a leading block it left in the text (or a closing
tag it left in the thinking) is split here, and an unterminated leading block is all thinking.

At the model boundary tool names are the provider's (D209): `to_model_messages` with
``wire_names=True`` encodes each tool call's and result's name, and `from_model_response` with
the request's `ToolNames` reads the model's calls back as harness names. Portable state keeps
harness names (both default off).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from typing import Any

from pydantic_ai import messages as pai

from harness_core.frozen import thaw_json
from harness_core.messages import (
    AgentMessage,
    AssistantContent,
    AssistantMessage,
    Cost,
    ImagePart,
    StopReason,
    TextPart,
    ThinkingPart,
    TokenUsage,
    ToolCallPart,
    ToolOutcome,
    ToolResultMessage,
    UserContent,
    UserMessage,
)
from harness_core.models.tool_names import ToolNames, wire_name

__all__ = [
    "MODEL_DECLINED",
    "from_model_messages",
    "from_model_response",
    "message_json",
    "messages_from_json",
    "to_model_messages",
    "token_usage",
]

_OUTCOME_TO_PAI: dict[ToolOutcome, str] = {
    "ok": "success",
    "error": "failed",
    "blocked": "failed",
    "denied": "denied",
    "interrupted": "interrupted",
}
_OUTCOME_FROM_PAI: dict[str, ToolOutcome] = {
    "success": "ok",
    "failed": "error",
    "denied": "denied",
    "interrupted": "interrupted",
    "retried": "error",
}


def _user_content(part: UserContent) -> str | pai.BinaryContent:
    if isinstance(part, TextPart):
        return part.text
    return pai.BinaryContent(data=base64.b64decode(part.data), media_type=part.media_type)


def _result_content(message: ToolResultMessage) -> str | list[str | pai.BinaryContent]:
    """A tool result's content: its text as one string, or its parts in order with images.

    A text-only result stays one string, as it always went (a provider's prompt cache keys on
    those bytes); a result with images (an MCP tool's screenshot) carries them, which
    pydantic-ai sends as the provider takes them (image blocks in Anthropic's tool result).
    """
    if all(isinstance(p, TextPart) for p in message.content):
        return "\n".join(p.text for p in message.content if isinstance(p, TextPart))
    return [_user_content(p) for p in message.content]


def _same(name: str) -> str:
    return name


def _assistant_parts(
    message: AssistantMessage, tool_name: Callable[[str], str]
) -> list[pai.ModelResponsePart]:
    parts: list[pai.ModelResponsePart] = []
    for part in message.content:
        if isinstance(part, TextPart):
            parts.append(pai.TextPart(content=part.text))
        elif isinstance(part, ThinkingPart):
            parts.append(pai.ThinkingPart(content=part.thinking, signature=part.signature))
        else:
            parts.append(
                pai.ToolCallPart(
                    tool_name=tool_name(part.name),
                    args=thaw_json(part.arguments),
                    tool_call_id=part.id,
                )
            )
    return parts


def to_model_messages(
    messages: Sequence[AgentMessage],
    system_prompt: str | None = None,
    *,
    wire_names: bool = False,
) -> list[pai.ModelMessage]:
    """The pydantic-ai history for a context.

    User input and tool results become requests (consecutive ones share one request), assistant
    messages become responses; the system prompt opens the first request. With `wire_names`
    every tool name is the one the provider sees (`wire_name`).
    """
    tool_name = wire_name if wire_names else _same
    history: list[pai.ModelMessage] = []
    pending: list[pai.ModelRequestPart] = []
    if system_prompt:
        pending.append(pai.SystemPromptPart(content=system_prompt))

    def flush() -> None:
        if pending:
            history.append(pai.ModelRequest(parts=list(pending)))
            pending.clear()

    for message in messages:
        if isinstance(message, UserMessage):
            contents = [_user_content(p) for p in message.content]
            content: Any = (
                contents[0] if len(contents) == 1 and isinstance(contents[0], str) else contents
            )
            pending.append(pai.UserPromptPart(content=content))
        elif isinstance(message, ToolResultMessage):
            pending.append(
                pai.ToolReturnPart(
                    tool_name=tool_name(message.tool_name),
                    content=_result_content(message),
                    tool_call_id=message.tool_call_id,
                    outcome=_OUTCOME_TO_PAI[message.outcome],  # type: ignore[arg-type]
                )
            )
        else:
            flush()
            history.append(
                pai.ModelResponse(
                    parts=_assistant_parts(message, tool_name),
                    model_name=message.model,
                    provider_name=message.provider,
                    finish_reason=_finish_reason(message.stop_reason),
                    usage=_request_usage(message.usage),
                )
            )
    flush()
    return history


def _finish_reason(stop: StopReason) -> pai.FinishReason | None:
    return {"stop": "stop", "length": "length", "tool_use": "tool_call", "error": "error"}.get(stop)  # type: ignore[return-value]


def _request_usage(usage: TokenUsage | None) -> Any:
    from pydantic_ai.usage import RequestUsage

    if usage is None:
        return RequestUsage()
    return RequestUsage(
        input_tokens=usage.input,
        output_tokens=usage.output,
        cache_read_tokens=usage.cache_read,
        cache_write_tokens=usage.cache_write,
    )


def token_usage(usage: Any, cost: float | None = None) -> TokenUsage:
    """A pydantic-ai `RequestUsage` as the ledger's `TokenUsage` (cost in dollars if known).

    The total is the provider's own when a model kept it in ``details["total_tokens"]`` (some
    count thinking tokens there only, D135), else input + output.
    """
    reported = usage.details.get("total_tokens") if usage.details else None
    counted = usage.input_tokens + usage.output_tokens
    total = reported if isinstance(reported, int) and reported > 0 else counted
    return TokenUsage(
        input=usage.input_tokens,
        output=usage.output_tokens,
        cache_read=usage.cache_read_tokens,
        cache_write=usage.cache_write_tokens,
        total_tokens=total,
        cost=Cost(total=cost) if cost is not None else Cost(),
    )


def _stop_reason(response: pai.ModelResponse, has_calls: bool) -> StopReason:
    reason = response.finish_reason
    if reason == "length":
        return "length"
    if reason == "tool_call" or (has_calls and reason in (None, "stop")):
        return "tool_use"
    if reason in ("error", "content_filter"):
        return "error"
    return "stop"


MODEL_DECLINED = "the model declined: "
"""How a `content_filter` error's message opens when the provider gave the model's own words
for declining (OpenAI's ``refusal``, Anthropic's refusal ``explanation``): the words follow."""

_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"
_BREAKS = "\r\n"  # dropped after a closing tag (an indented answer keeps its indent)


def _split_think(text: str) -> tuple[str | None, str]:
    """(thinking, answer) of a text that opens with a ``<think>`` block; (None, text) otherwise.

    An unterminated block is all thinking: the model is still thinking (a partial message) or
    was cut off before it answered.
    """
    stripped = text.lstrip()
    if not stripped.startswith(_THINK_OPEN):
        return None, text
    body = stripped[len(_THINK_OPEN) :]
    end = body.find(_THINK_CLOSE)
    if end < 0:
        return body, ""
    return body[:end], body[end + len(_THINK_CLOSE) :].lstrip(_BREAKS)


def _content(
    response: pai.ModelResponse, tool_name: Callable[[str], str]
) -> list[AssistantContent]:
    content: list[AssistantContent] = []
    answered = False  # a text part came (only a leading block is thinking)
    for part in response.parts:
        if isinstance(part, pai.TextPart):
            thinking, text = (None, part.content) if answered else _split_think(part.content)
            if thinking is not None:
                content.append(ThinkingPart(thinking=thinking))
            if not answered and content and isinstance(content[-1], ThinkingPart):
                text = text.lstrip(_BREAKS)  # the blank lines after a closing tag
            if text:
                content.append(TextPart(text=text))
                answered = True
        elif isinstance(part, pai.ThinkingPart):
            tagged = part.id == "content" and part.signature is None  # from tags in the text
            end = part.content.find(_THINK_CLOSE) if tagged else -1
            if end < 0:
                content.append(ThinkingPart(thinking=part.content, signature=part.signature))
                continue
            # a tagged block whose closing tag came glued to the answer's first words
            content.append(ThinkingPart(thinking=part.content[:end]))
            rest = part.content[end + len(_THINK_CLOSE) :].lstrip(_BREAKS)
            if rest:
                content.append(TextPart(text=rest))
                answered = True
        elif isinstance(part, pai.ToolCallPart):
            content.append(
                ToolCallPart(
                    id=part.tool_call_id,
                    name=tool_name(part.tool_name),
                    arguments=part.args_as_dict(),
                )
            )
    return content


def from_model_response(
    response: pai.ModelResponse,
    provider: str | None = None,
    *,
    tool_names: ToolNames | None = None,
) -> AssistantMessage:
    """A settled pydantic-ai response as an `AssistantMessage` (suspension is the caller's).

    With `tool_names` (the request's table) each tool call is named as the harness names it.
    """
    content = _content(response, tool_names.decode if tool_names is not None else _same)
    has_calls = any(isinstance(p, ToolCallPart) for p in content)
    stop = _stop_reason(response, has_calls)
    details = response.provider_details or {}
    raw = details.get("finish_reason")
    error = None
    if stop == "error":
        from harness_core.messages import ModelError

        kind = "content_filter" if response.finish_reason == "content_filter" else "unknown"
        refusal = details.get("refusal")
        said = (
            MODEL_DECLINED + refusal.strip()
            if kind == "content_filter" and isinstance(refusal, str) and refusal.strip()
            else f"the provider ended the response: {raw or kind}"
        )
        error = ModelError(kind=kind, message=said)
    return AssistantMessage(
        content=tuple(content),
        stop_reason=stop,
        provider=provider or response.provider_name,
        model=response.model_name,
        usage=token_usage(response.usage),
        error=error,
        raw_stop_reason=str(raw) if raw is not None else response.finish_reason,
    )


def from_model_messages(
    history: Sequence[pai.ModelMessage],
) -> tuple[str | None, tuple[AgentMessage, ...]]:
    """The project's messages (and the system prompt, if any) of a pydantic-ai history."""
    system: list[str] = []
    messages: list[AgentMessage] = []
    for item in history:
        if isinstance(item, pai.ModelResponse):
            messages.append(from_model_response(item))
            continue
        for part in item.parts:
            if isinstance(part, pai.SystemPromptPart):
                system.append(part.content)
            elif isinstance(part, pai.UserPromptPart):
                messages.append(UserMessage(content=_from_user_content(part.content)))
            elif isinstance(part, pai.ToolReturnPart):
                messages.append(
                    ToolResultMessage(
                        tool_call_id=part.tool_call_id,
                        tool_name=part.tool_name,
                        content=_from_result_content(part),
                        outcome=_OUTCOME_FROM_PAI.get(part.outcome, "ok"),
                    )
                )
    return ("\n\n".join(system) or None), tuple(messages)


def _from_result_content(part: pai.ToolReturnPart) -> tuple[UserContent, ...]:
    content = part.content
    if isinstance(content, list) and any(isinstance(i, pai.BinaryContent) for i in content):
        return _from_user_content(content)
    return (TextPart(text=part.model_response_str()),)


def _from_user_content(content: Any) -> tuple[UserContent, ...]:
    items = [content] if isinstance(content, str) else list(content)
    parts: list[UserContent] = []
    for item in items:
        if isinstance(item, str):
            parts.append(TextPart(text=item))
        elif isinstance(item, pai.BinaryContent):
            parts.append(
                ImagePart(media_type=item.media_type, data=base64.b64encode(item.data).decode())
            )
    return tuple(parts)


def message_json(messages: Sequence[AgentMessage], system_prompt: str | None = None) -> bytes:
    """The messages as pydantic-ai `ModelMessagesTypeAdapter` JSON."""
    return pai.ModelMessagesTypeAdapter.dump_json(to_model_messages(messages, system_prompt))


def messages_from_json(data: bytes | str) -> tuple[str | None, tuple[AgentMessage, ...]]:
    """Read pydantic-ai `ModelMessagesTypeAdapter` JSON back into the project's messages."""
    return from_model_messages(pai.ModelMessagesTypeAdapter.validate_json(data))
