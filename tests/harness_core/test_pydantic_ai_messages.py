"""Messages to pydantic-ai and back: the shapes providers see, and a lossless JSON round trip."""

from __future__ import annotations

import base64

import pytest
from pydantic_ai import messages as pai

from harness_core.messages import (
    AgentMessage,
    AssistantMessage,
    ImagePart,
    TextPart,
    ThinkingPart,
    TokenUsage,
    ToolCallPart,
    ToolResultMessage,
    UserMessage,
)
from harness_core.models.conversion import (
    from_model_response,
    message_json,
    messages_from_json,
    to_model_messages,
)

PNG = base64.b64encode(b"\x89PNG fake").decode()

CONVERSATION: tuple[AgentMessage, ...] = (
    UserMessage(content=(TextPart(text="deploy 42"),)),
    AssistantMessage(
        content=(
            ThinkingPart(thinking="check the build first", signature="sig-1"),
            TextPart(text="Deploying."),
            ToolCallPart(id="c1", name="deploy", arguments={"build": 42}),
            ToolCallPart(id="c2", name="notify", arguments={"to": ["ops"]}),
            ToolCallPart(id="c3", name="screenshot", arguments={}),
        ),
        stop_reason="tool_use",
        usage=TokenUsage(input=40, output=8, total_tokens=48),
    ),
    ToolResultMessage(tool_call_id="c1", tool_name="deploy", content=(TextPart(text="ok"),)),
    ToolResultMessage(
        tool_call_id="c2",
        tool_name="notify",
        content=(TextPart(text="may have happened"),),
        outcome="interrupted",
    ),
    ToolResultMessage(
        tool_call_id="c3",
        tool_name="screenshot",
        content=(TextPart(text="the dashboard:"), ImagePart(media_type="image/png", data=PNG)),
    ),
    UserMessage(content=(TextPart(text="and this"), ImagePart(media_type="image/png", data=PNG))),
    AssistantMessage(content=(TextPart(text="done"),), stop_reason="stop"),
)


def comparable(message: AgentMessage) -> object:
    if isinstance(message, AssistantMessage):
        return (message.role, message.content, message.stop_reason)
    return message


def test_the_history_has_the_shape_providers_expect() -> None:
    history = to_model_messages(CONVERSATION, "You are a deploy bot.")
    kinds = [type(m).__name__ for m in history]
    assert kinds == ["ModelRequest", "ModelResponse", "ModelRequest", "ModelResponse"]
    first = history[0]
    assert isinstance(first, pai.ModelRequest)
    assert [type(p).__name__ for p in first.parts] == ["SystemPromptPart", "UserPromptPart"]
    results = history[2]
    assert isinstance(results, pai.ModelRequest)
    returns = [p for p in results.parts if isinstance(p, pai.ToolReturnPart)]
    assert [(p.tool_call_id, p.outcome) for p in returns] == [
        ("c1", "success"),
        ("c2", "interrupted"),
        ("c3", "success"),
    ]
    # a text-only result is one string, as it always went; a tool's image goes with its text
    assert [returns[0].content, returns[1].content] == ["ok", "may have happened"]
    assert returns[2].content == [
        "the dashboard:",
        pai.BinaryContent(data=b"\x89PNG fake", media_type="image/png"),
    ]
    response = history[1]
    assert isinstance(response, pai.ModelResponse)
    calls = [p for p in response.parts if isinstance(p, pai.ToolCallPart)]
    assert [(c.tool_name, c.args_as_dict()) for c in calls] == [
        ("deploy", {"build": 42}),
        ("notify", {"to": ["ops"]}),
        ("screenshot", {}),
    ]


def test_a_json_round_trip_keeps_every_message() -> None:
    blob = message_json(CONVERSATION, "You are a deploy bot.")
    system, back = messages_from_json(blob)
    assert system == "You are a deploy bot."
    assert [comparable(m) for m in back] == [comparable(m) for m in CONVERSATION]
    assert pai.ModelMessagesTypeAdapter.validate_json(blob)  # it is pydantic-ai's own format
    _, twice = messages_from_json(message_json(back, system))
    assert twice == back  # stable from the first trip on


def _think(content: str, id: str | None = "content") -> pai.ThinkingPart:
    return pai.ThinkingPart(content=content, id=id)


# (case, pydantic-ai's parts, the thinking kept, the answer's text)
THINK_CASES = [
    ("a leading block", [pai.TextPart("<think>a</think>\n\nb")], ["a"], "b"),
    ("blank space before the tag", [pai.TextPart(" \n<think>a</think>b")], ["a"], "b"),
    ("unterminated: still thinking", [pai.TextPart("<think>a")], ["a"], ""),
    ("only the opening tag so far", [pai.TextPart("<think>")], [""], ""),
    ("a block and nothing after it", [pai.TextPart("<think>a</think>")], ["a"], ""),
    (
        "a tag later in the answer is text",
        [pai.TextPart("b <think>a</think>")],
        [],
        "b <think>a</think>",
    ),
    (
        "another tag name is text",
        [pai.TextPart("<thinking>a</thinking>b")],
        [],
        "<thinking>a</thinking>b",
    ),
    (
        "a second text part is text",
        [pai.TextPart("b"), pai.TextPart("<think>a</think>")],
        [],
        "b<think>a</think>",
    ),
    ("</think> glued to the answer", [_think("a</think>\n\nb")], ["a"], "b"),
    (
        "a provider's reasoning field is kept whole",
        [_think("a</think>b", "reasoning_content")],
        ["a</think>b"],
        "",
    ),
    (
        "an indented answer keeps its indent",
        [_think("a"), pai.TextPart("\n    code")],
        ["a"],
        "    code",
    ),
]


@pytest.mark.parametrize(
    ("parts", "thinking", "text"), [c[1:] for c in THINK_CASES], ids=[c[0] for c in THINK_CASES]
)
def test_think_tags_in_an_answer_are_thinking(
    parts: list[pai.ModelResponsePart], thinking: list[str], text: str
) -> None:
    message = from_model_response(pai.ModelResponse(parts=parts))
    assert [p.thinking for p in message.content if isinstance(p, ThinkingPart)] == thinking
    assert "".join(p.text for p in message.content if isinstance(p, TextPart)) == text
