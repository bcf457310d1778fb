"""Provider-safe tool names (D209): harness names out as the providers accept, calls back as named.

The real pydantic-ai and SDK code runs against the fake OpenAI / Anthropic servers, which refuse
(400) a tool name outside ``^[a-zA-Z0-9_-]{1,64}$`` as the real APIs do: a dotted MCP-style name
and a 100-character one go out valid, the model's calls come back to the right harness tools,
the history (calls and results) goes out encoded on the next request and is stored with harness
names, and two names that sanitize alike stay two tools.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import messages as pai
from pydantic_ai.models import Model

from harness_core.hooks import RequestOptions
from harness_core.messages import (
    AssistantMessage,
    TextPart,
    ToolCallPart,
    ToolResultMessage,
    UserMessage,
    message_text,
)
from harness_core.models import ModelRef, ModelRequest, ToolDefinition
from harness_core.models.conversion import from_model_response, to_model_messages
from harness_core.models.pydantic_ai import PydanticAIModel
from harness_core.models.scripted import text, tool_calls
from harness_core.models.tool_names import ToolNameClash, ToolNames, is_wire_safe, wire_name
from harness_core.result import Ok
from harness_core.session import EntryQuery, MessageEntry
from harness_core.tools import Tool, ToolContext
from tests.support.fake_llm import (
    FakeLLM,
    anthropic_model,
    openai_chat_model,
    openai_responses_model,
)
from tests.support.harness_kit import Kit, make_kit

BUILDERS: dict[str, Callable[[FakeLLM], Model]] = {
    "openai": openai_chat_model,
    "openai-responses": openai_responses_model,
    "anthropic": anthropic_model,
}
API = {"openai": "chat", "openai-responses": "responses", "anthropic": "messages"}
SAFE = re.compile(r"[a-zA-Z0-9_-]{1,64}")

DOTTED = "tickets.create"
TWIN = "tickets:create"  # sanitizes exactly as DOTTED does
LONG = "a" * 40 + "." + "b" * 59  # 100 characters
PLAIN = "search_docs"


def named(name: str) -> Tool:
    async def run(args: Any, ctx: ToolContext) -> str:
        return f"{ran(name)} with {args.get('n')}"

    return Tool(
        name=name,
        description=f"the tool {name}",
        execute=run,
        parameters={"type": "object", "properties": {"n": {"type": "integer"}}},
        replay="safe",
    )


TOOLS = [named(DOTTED), named(TWIN), named(LONG), named(PLAIN)]


def ran(name: str) -> str:
    """What the tool named `name` answers (without its name, which must not go out)."""
    return f"tool #{[DOTTED, TWIN, LONG, PLAIN].index(name)} ran"


pytestmark = pytest.mark.usefixtures("model_requests")


def client_for(fake: FakeLLM) -> PydanticAIModel:
    return PydanticAIModel(
        lambda ref: BUILDERS[ref.provider](fake) if ref.provider in BUILDERS else None
    )


async def kit_for(tmp_path: Path, fake: FakeLLM, provider: str, **options: Any) -> Kit:
    kit = await make_kit("memory", tmp_path, tools=TOOLS, **options)
    kit.harness._rt.model = client_for(fake)  # the same harness, talking HTTP
    await kit.harness.set_model(ModelRef(provider=provider, model_id="m"))
    return kit


async def stored_messages(kit: Kit) -> list[Any]:
    entries = await kit.storage.find_entries(EntryQuery(type="message", order="oldest_first"))
    return [e.entry.message for e in entries if isinstance(e.entry, MessageEntry)]


def sent_tool_names(body: dict[str, Any], api: str) -> list[str]:
    tools = body.get("tools") or []
    if api == "chat":
        return [t["function"]["name"] for t in tools]
    return [t["name"] for t in tools]


# ---- the mapping


def test_a_valid_name_stays_as_it_is() -> None:
    assert wire_name(PLAIN) == PLAIN
    assert wire_name("x" * 64) == "x" * 64
    assert wire_name("a-b_C9") == "a-b_C9"


@pytest.mark.parametrize("name", [DOTTED, LONG, "x" * 65, "", "日本.検索", "a b/c", "ü" * 200])
def test_any_other_name_becomes_a_safe_one_deterministically(name: str) -> None:
    wire = wire_name(name)
    assert SAFE.fullmatch(wire) and is_wire_safe(wire)
    assert wire != name
    assert wire == wire_name(name)  # a pure function: a history encodes alike on every request


def test_the_readable_part_is_kept() -> None:
    assert wire_name(DOTTED).startswith("tickets_create_")
    assert len(wire_name(LONG)) == 64 and wire_name(LONG).startswith("a" * 40 + "_b")


def test_names_that_sanitize_alike_stay_distinct() -> None:
    assert wire_name(DOTTED) != wire_name(TWIN)
    assert wire_name("x" * 65) != wire_name("x" * 66)  # alike after the cut too
    names = ToolNames(tool.name for tool in TOOLS)
    for tool in TOOLS:
        assert names.decode(wire_name(tool.name)) == tool.name
    assert names.decode("not_a_tool") == "not_a_tool"  # unknown: passes through
    assert names.encoded == {wire_name(n): n for n in (DOTTED, TWIN, LONG)}


def test_a_safe_name_shaped_like_an_encoding_is_a_clash() -> None:
    with pytest.raises(ToolNameClash, match=r"tickets\.create"):
        ToolNames([DOTTED, wire_name(DOTTED)])


async def test_a_clash_is_an_invalid_request_in_band(fake: FakeLLM) -> None:
    request = ModelRequest(
        model=ModelRef(provider="openai", model_id="m"),
        messages=(UserMessage(content=(TextPart(text="hi"),)),),
        tools=(
            ToolDefinition(name=DOTTED, description="one"),
            ToolDefinition(name=wire_name(DOTTED), description="two"),
        ),
    )
    answer = await client_for(fake).request(request)
    assert answer.stop_reason == "error" and answer.error is not None
    assert answer.error.kind == "invalid_request" and not answer.error.retryable
    assert "would both be called" in answer.error.message
    assert fake.requests == []  # refused before anything was sent


def test_the_history_is_encoded_for_the_wire_only() -> None:
    history = (
        UserMessage(content=(TextPart(text="go"),)),
        AssistantMessage(
            content=(ToolCallPart(id="c1", name=DOTTED, arguments={"n": 1}),),
            stop_reason="tool_use",
        ),
        ToolResultMessage(tool_call_id="c1", tool_name=DOTTED, content=(TextPart(text="ok"),)),
    )
    wire = to_model_messages(history, wire_names=True)
    call = wire[1].parts[0]
    result = wire[2].parts[0]
    assert isinstance(call, pai.ToolCallPart) and call.tool_name == wire_name(DOTTED)
    assert isinstance(result, pai.ToolReturnPart) and result.tool_name == wire_name(DOTTED)
    kept = to_model_messages(history)  # portable state: the harness's names
    assert [p.tool_name for m in kept[1:] for p in m.parts] == [DOTTED, DOTTED]  # type: ignore[union-attr]
    response = pai.ModelResponse(parts=[pai.ToolCallPart(tool_name=wire_name(LONG), args={})])
    names = ToolNames([LONG])
    [decoded] = from_model_response(response, tool_names=names).content
    assert isinstance(decoded, ToolCallPart) and decoded.name == LONG
    [raw] = from_model_response(response).content
    assert isinstance(raw, ToolCallPart) and raw.name == wire_name(LONG)


# ---- over the wire, with the real SDKs


@pytest.mark.parametrize("provider", list(BUILDERS))
async def test_calls_come_back_to_the_harness_tools_and_the_history_round_trips(
    tmp_path: Path, fake: FakeLLM, provider: str
) -> None:
    kit = await kit_for(tmp_path, fake, provider)
    fake.reply(tool_calls=[(wire_name(DOTTED), {"n": 1}), (wire_name(LONG), {"n": 2})])
    fake.reply(tool_calls=[(wire_name(TWIN), {"n": 3}), (PLAIN, {"n": 4})])
    fake.reply("all done")
    outcome = await kit.harness.prompt("make the tickets")
    assert isinstance(outcome, Ok) and outcome.value.kind == "completed"
    assert fake.refused_tool_names == 0 and fake.unscripted == 0

    first, second, third = fake.requests_to(API[provider])  # type: ignore[arg-type]
    names = sent_tool_names(first.body, API[provider])
    assert sorted(names) == sorted(wire_name(t.name) for t in TOOLS)
    assert all(SAFE.fullmatch(n) for n in names) and len(set(names)) == len(TOOLS)
    # the calls and results of earlier steps go back under their wire names
    assert wire_name(DOTTED) in str(second.body) and wire_name(LONG) in str(second.body)
    history = str(third.body.get("messages", third.body.get("input")))
    assert DOTTED not in history and TWIN not in history and LONG not in history
    assert f"{ran(DOTTED)} with 1" in str(second.body)
    assert f"{ran(LONG)} with 2" in str(second.body)
    assert f"{ran(TWIN)} with 3" in str(third.body) and f"{ran(PLAIN)} with 4" in str(third.body)

    # stored as the harness names them: the right tool ran for each call
    stored = await stored_messages(kit)
    calls = [p for m in stored if isinstance(m, AssistantMessage) for p in m.content]
    assert [(c.name, c.arguments["n"]) for c in calls if isinstance(c, ToolCallPart)] == [
        (DOTTED, 1),
        (LONG, 2),
        (TWIN, 3),
        (PLAIN, 4),
    ]
    results = [m for m in stored if isinstance(m, ToolResultMessage)]
    assert [(r.tool_name, r.outcome) for r in results] == [
        (DOTTED, "ok"),
        (LONG, "ok"),
        (TWIN, "ok"),
        (PLAIN, "ok"),
    ]
    assert [message_text(r) for r in results] == [
        f"{ran(DOTTED)} with 1",
        f"{ran(LONG)} with 2",
        f"{ran(TWIN)} with 3",
        f"{ran(PLAIN)} with 4",
    ]


@pytest.mark.parametrize("provider", list(BUILDERS))
async def test_a_streamed_partial_call_is_named_as_the_harness_names_it(
    tmp_path: Path, fake: FakeLLM, provider: str
) -> None:
    kit = await kit_for(tmp_path, fake, provider)
    partial_names: set[str] = set()

    def seen(event: Any) -> None:
        message = getattr(event, "message", None)
        for part in getattr(message, "content", ()):
            if isinstance(part, ToolCallPart):
                partial_names.add(part.name)

    kit.harness.events.on("message_update", seen)
    fake.reply(tool_calls=[(wire_name(DOTTED), {"n": 5})])
    fake.reply("ok")
    outcome = await kit.harness.prompt("go")
    assert isinstance(outcome, Ok) and outcome.value.kind == "completed"
    assert partial_names == {DOTTED}


@pytest.mark.parametrize("provider", list(BUILDERS))
async def test_an_unknown_name_passes_through_as_an_unknown_tool(
    tmp_path: Path, fake: FakeLLM, provider: str
) -> None:
    kit = await kit_for(tmp_path, fake, provider)
    fake.reply(tool_calls=[("tickets_delete", {"n": 1})])
    fake.reply("sorry")
    outcome = await kit.harness.prompt("delete")
    assert isinstance(outcome, Ok) and outcome.value.kind == "completed"
    results = [m for m in await stored_messages(kit) if isinstance(m, ToolResultMessage)]
    assert [(r.tool_name, r.outcome) for r in results] == [("tickets_delete", "error")]
    assert "There is no tool named 'tickets_delete'" in message_text(results[0])


async def test_a_deferred_answer_reads_its_calls_back_by_the_names_it_sent(
    tmp_path: Path, fake: FakeLLM
) -> None:
    kit = await kit_for(
        tmp_path, fake, "openai-responses", request_options=RequestOptions(deferred=True)
    )
    fake.reply(tool_calls=[(wire_name(LONG), {"n": 7})], pending_polls=1)
    fake.reply("done")
    first = await kit.harness.prompt("think hard")
    assert isinstance(first, Ok) and first.value.kind == "suspended"
    handle = first.value.deferred
    assert handle is not None and isinstance(handle.data, Mapping)
    assert handle.data["tool_names"] == {wire_name(n): n for n in (DOTTED, TWIN, LONG)}
    pending = await kit.harness.resume()
    assert isinstance(pending, Ok) and pending.value.kind == "suspended"
    done = await kit.harness.resume()
    assert isinstance(done, Ok), done
    results = [m for m in await stored_messages(kit) if isinstance(m, ToolResultMessage)]
    assert [(r.tool_name, message_text(r)) for r in results] == [(LONG, f"{ran(LONG)} with 7")]


async def test_the_scripted_model_keeps_harness_names(tmp_path: Path) -> None:
    kit = await make_kit(
        "memory", tmp_path, [tool_calls((DOTTED, {"n": 9}, None)), text("ok")], tools=TOOLS
    )
    await kit.harness.prompt("go")
    assert DOTTED in [t.name for t in kit.model.requests[0].tools]
    results = [m for m in await stored_messages(kit) if isinstance(m, ToolResultMessage)]
    assert results and results[0].tool_name == DOTTED
