"""Every provider path against recorded real answers, with pydantic-args tools.

Each exchange is a harness run over real HTTP: the real SDK and pydantic-ai read answers shaped
as the providers sent them (``tests/support/provider_replays``, from pydantic-ai's recorded
cassettes: streamed and unstreamed tool calls, parallel calls, an empty call id, reasoning in
every provider's field, ``<think>`` tags in the text, a chunk after the usage), the tools validate
their arguments with their pydantic models (nested objects, enums, optional fields, arrays) and
run, and the results go back to the provider. A new shape is one line in `EXCHANGES`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, Field
from pydantic_ai.models import Model

from harness_core.messages import (
    AssistantMessage,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolResultMessage,
    UserMessage,
    message_text,
)
from harness_core.models import ModelRef, ModelRequest
from harness_core.models.pydantic_ai import PydanticAIModel
from harness_core.result import Ok
from harness_core.session.entries import MessageEntry
from harness_core.session.types import EntryQuery, RecordQuery
from harness_core.tools import Tool, ToolContext
from tests.support.fake_llm import (
    FakeLLM,
    anthropic_model,
    openai_chat_model,
    openai_responses_model,
)
from tests.support.harness_kit import make_kit


class Window(BaseModel):
    """When a deploy may run (UTC)."""

    start: str = Field(pattern=r"^\d\d:\d\d$", description="HH:MM")
    end: str = Field(pattern=r"^\d\d:\d\d$", description="HH:MM")


class DeployArgs(BaseModel):
    """A deploy: every kind of field a real args model has."""

    service: str = Field(min_length=1, description="The service, like api or web.")
    environment: Literal["production", "staging"] = "staging"
    window: Window | None = None
    tags: list[str] = Field(default_factory=list)
    dry_run: bool = False


class StatusArgs(BaseModel):
    """A status look-up."""

    service: str
    since_hours: int | None = Field(default=None, ge=1)


RAN: list[tuple[str, BaseModel]] = []
"""What the tools ran with, validated (reset by a fixture)."""


async def deploy(args: DeployArgs, ctx: ToolContext) -> str:
    RAN.append(("deploy", args))
    return f"{args.service} deployed to {args.environment}"


async def service_status(args: StatusArgs, ctx: ToolContext) -> str:
    RAN.append(("service_status", args))
    return f"{args.service} is healthy"


TOOLS = [
    Tool(
        name="deploy",
        description="Deploy a service.",
        execute=deploy,
        args_model=DeployArgs,
        replay="safe",
    ),
    Tool(
        name="service_status",
        description="How a service is doing.",
        execute=service_status,
        args_model=StatusArgs,
        replay="safe",
    ),
]

DEPLOY_API = DeployArgs(
    service="api",
    environment="production",
    window=Window(start="10:00", end="12:00"),
    tags=["hotfix", "db"],
)
STATUS_API = StatusArgs(service="api")
STATUS_WEB = StatusArgs(service="web", since_hours=6)

BUILDERS: dict[str, Callable[[FakeLLM], Model]] = {
    "chat": openai_chat_model,
    "responses": openai_responses_model,
    "messages": anthropic_model,
}
PROVIDER = {"chat": "openai", "responses": "openai-responses", "messages": "anthropic"}


@dataclass(frozen=True)
class Exchange:
    """A prompt answered by recorded answers: first the tool calls, then the final answer."""

    calls: str
    answer: str
    ran: tuple[tuple[str, BaseModel], ...]
    text: str
    thinking: bool = False
    """Whether the final answer kept reasoning as thinking (never as its text)."""

    @property
    def api(self) -> str:
        return self.calls.split("/")[0]

    @property
    def stream(self) -> bool:
        return self.calls.endswith(".sse")


DONE = "Done: the tools answered."
EXCHANGES = {
    "openai chat: a streamed call with nested, enum and array args": Exchange(
        "chat/tool_call_stream.sse", "chat/answer_stream.sse", (("deploy", DEPLOY_API),), DONE
    ),
    "openai chat: parallel calls streamed, a chunk after the usage": Exchange(
        "chat/parallel_tool_calls_stream.sse",
        "chat/moderation_after_usage_stream.sse",
        (("service_status", STATUS_API), ("service_status", STATUS_WEB)),
        "api is healthy.",
    ),
    "deepseek: parallel calls with reasoning_content, unstreamed": Exchange(
        "chat/parallel_tool_calls.json",
        "chat/answer.json",
        (("service_status", STATUS_API), ("service_status", STATUS_WEB)),
        DONE,
    ),
    "deepseek: reasoning_content streamed, usage in the finish chunk": Exchange(
        "chat/tool_call_stream.sse",
        "chat/deepseek_reasoning_stream.sse",
        (("deploy", DEPLOY_API),),
        "api is healthy.",
        thinking=True,
    ),
    "gemini (openai-compatible): an empty tool-call id": Exchange(
        "chat/empty_tool_call_id.json",
        "chat/answer.json",
        (("service_status", StatusArgs(service="api", since_hours=24)),),
        DONE,
    ),
    "gemini (openai-compatible): an empty tool-call id, streamed": Exchange(
        "chat/empty_tool_call_id_stream.sse",
        "chat/answer_stream.sse",
        (("service_status", StatusArgs(service="api", since_hours=24)),),
        DONE,
    ),
    "openrouter: reasoning streamed, comments, usage after the finish": Exchange(
        "chat/parallel_tool_calls_stream.sse",
        "chat/openrouter_reasoning_stream.sse",
        (("service_status", STATUS_API), ("service_status", STATUS_WEB)),
        "api is healthy.",
        thinking=True,
    ),
    "ollama: a call beside its reasoning, empty content": Exchange(
        "chat/ollama_reasoning_tool_call.json",
        "chat/answer.json",
        (("deploy", DeployArgs(service="web", environment="staging", dry_run=True)),),
        DONE,
    ),
    "vllm: a chatcmpl-tool id, then <think> in the text": Exchange(
        "chat/vllm_reasoning_tool_call.json",
        "chat/think_content.json",
        (("deploy", DEPLOY_API),),
        "api is healthy.",
        thinking=True,
    ),
    "deepseek-r1: <think> tags streamed as their own tokens": Exchange(
        "chat/tool_call_stream.sse",
        "chat/think_tags_stream.sse",
        (("deploy", DEPLOY_API),),
        "api is healthy.",
        thinking=True,
    ),
    "deepseek-r1: <think> tags inside longer deltas": Exchange(
        "chat/tool_call_stream.sse",
        "chat/think_glued_stream.sse",
        (("deploy", DEPLOY_API),),
        "api is healthy.",
        thinking=True,
    ),
    "deepseek-r1: </think> glued to the answer": Exchange(
        "chat/tool_call_stream.sse",
        "chat/think_close_glued_stream.sse",
        (("deploy", DEPLOY_API),),
        "api is healthy.",
        thinking=True,
    ),
    "openai responses: a streamed call": Exchange(
        "responses/tool_call_stream.sse",
        "responses/answer_stream.sse",
        (("deploy", DEPLOY_API),),
        DONE,
    ),
    "openai responses: parallel calls, unstreamed": Exchange(
        "responses/parallel_tool_calls.json",
        "responses/answer.json",
        (("service_status", STATUS_API), ("service_status", STATUS_WEB)),
        DONE,
    ),
    "openai responses: a call after a reasoning item": Exchange(
        "responses/reasoning_tool_call.json",
        "responses/answer.json",
        (("deploy", DEPLOY_API),),
        DONE,
    ),
    "anthropic: text then two streamed tool_use blocks, then thinking": Exchange(
        "messages/tool_call_stream.sse",
        "messages/thinking_answer_stream.sse",
        (("deploy", DEPLOY_API), ("service_status", StatusArgs(service="web"))),
        DONE,
        thinking=True,
    ),
    "anthropic: parallel tool_use, unstreamed": Exchange(
        "messages/parallel_tool_calls.json",
        "messages/answer.json",
        (("service_status", STATUS_API), ("service_status", STATUS_WEB)),
        DONE,
    ),
}


pytestmark = pytest.mark.usefixtures("model_requests")


@pytest.fixture(autouse=True)
def _no_calls_yet() -> None:
    RAN.clear()


@pytest.mark.parametrize("exchange", list(EXCHANGES.values()), ids=list(EXCHANGES))
async def test_a_recorded_exchange_runs_the_tools_and_answers(
    tmp_path: Path, fake: FakeLLM, exchange: Exchange
) -> None:
    kit = await make_kit("memory", tmp_path, tools=TOOLS)
    client = PydanticAIModel(lambda ref: BUILDERS[exchange.api](fake), stream=exchange.stream)
    kit.harness._rt.model = client  # the same harness, talking HTTP
    await kit.harness.set_model(ModelRef(provider=PROVIDER[exchange.api], model_id="m"))
    fake.replay(exchange.calls, exchange.answer)
    partials: list[str] = []
    kit.harness.events.on("message_update", lambda e: partials.append(message_text(e.message)))

    outcome = await kit.harness.prompt("deploy api and tell me how api and web are")

    assert isinstance(outcome, Ok) and outcome.value.kind == "completed", outcome
    fake.assert_drained()
    assert list(exchange.ran) == RAN  # each tool ran once, with its validated pydantic args
    final = outcome.value.final_message
    assert final is not None and message_text(final).strip() == exchange.text
    assert "<think>" not in message_text(final) and "</think>" not in message_text(final)
    assert any(isinstance(p, ThinkingPart) for p in final.content) is exchange.thinking
    assert bool(partials) is exchange.stream  # streamed answers show progress ...
    assert not [p for p in partials if "think>" in p or "Okay" in p]  # ... never the thinking

    first, second = fake.requests
    sent = str(first.body["tools"])
    for name in ("deploy", "service_status", "production", "since_hours", "Window"):
        assert name in sent  # the whole schema went out: nested model, enum, optional field
    entries = await kit.storage.find_entries(EntryQuery(type="message", order="oldest_first"))
    messages = [e.entry.message for e in entries if isinstance(e.entry, MessageEntry)]
    calls = [p for m in messages if isinstance(m, AssistantMessage) for p in m.content]
    call_ids = [p.id for p in calls if isinstance(p, ToolCallPart)]
    results = [m for m in messages if isinstance(m, ToolResultMessage)]
    assert [r.tool_call_id for r in results] == call_ids and all(call_ids)
    assert all(r.outcome == "ok" for r in results)
    for call_id in call_ids:
        assert call_id in str(second.body)  # each result went back under its call's id
    usage = await kit.storage.find_records(RecordQuery(type="usage", order="oldest_first"))
    assert len(usage) == 2 and all(u.record.usage.input > 0 for u in usage)  # type: ignore[union-attr]


CUT = "Hello! Deploys are open Tuesday to Thursday, and the next window"
LENGTH_STOPS = {
    # (the recorded answer, the text kept; None: no text came, only thinking)
    "openai chat, streamed": ("chat/length_answer_stream.sse", CUT),
    "openai responses, streamed": ("responses/incomplete_stream.sse", CUT),
    "openai responses, unstreamed": ("responses/incomplete_max_output_tokens.json", CUT),
    "anthropic, streamed": ("messages/max_tokens_stream.sse", CUT),
    "anthropic, unstreamed": ("messages/max_tokens.json", CUT),
    "deepseek-r1, cut inside <think>": ("chat/length_in_think_stream.sse", None),
    "deepseek-r1, cut inside a glued <think>": ("chat/length_in_think_glued_stream.sse", None),
}


@pytest.mark.parametrize(("replay", "kept"), list(LENGTH_STOPS.values()), ids=list(LENGTH_STOPS))
async def test_the_providers_own_output_cap_keeps_what_came(
    tmp_path: Path, fake: FakeLLM, replay: str, kept: str | None
) -> None:
    # issue 24: one word in, no caller cap, the provider stops at 100 tokens of its own limit
    kit = await make_kit("memory", tmp_path, tools=TOOLS)
    api = replay.split("/")[0]
    client = PydanticAIModel(lambda ref: BUILDERS[api](fake), stream=replay.endswith(".sse"))
    kit.harness._rt.model = client
    await kit.harness.set_model(ModelRef(provider=PROVIDER[api], model_id="m"))
    fake.replay(replay)
    partials: list[str] = []
    kit.harness.events.on("message_update", lambda e: partials.append(message_text(e.message)))

    outcome = await kit.harness.prompt("hello")

    assert isinstance(outcome, Ok) and outcome.value.kind == "completed", outcome
    fake.assert_drained()  # one request: nothing compacted, nothing retried
    final = outcome.value.final_message
    assert final is not None and final.stop_reason == "length"
    assert (message_text(final) or None) == kept  # the thinking never becomes the answer
    assert any(isinstance(p, ThinkingPart) for p in final.content) is (kept is None)
    assert not [p for p in partials if "think>" in p or "Hmm" in p]  # nor while it streamed
    usage = await kit.storage.find_records(RecordQuery(type="usage"))
    assert [u.record.usage.output for u in usage] == [100]  # type: ignore[union-attr]


class Node(BaseModel):
    """A recursive model: its schema refers to itself."""

    name: str
    children: list[Node] = Field(default_factory=list)


class Cat(BaseModel):
    kind: Literal["cat"] = "cat"
    lives: int = 9


class Dog(BaseModel):
    kind: Literal["dog"] = "dog"
    good: bool = True


class Pet(BaseModel):
    pet: Cat | Dog = Field(discriminator="kind")


class Deep(BaseModel):
    level: Deep | None = None
    limits: dict[str, int] = Field(default_factory=dict)
    priority: Literal[1, 2, 3] = 2
    at: str | None = Field(default=None, json_schema_extra={"format": "date-time"})


ARGS_SCHEMAS: dict[str, type[BaseModel]] = {
    "nested, enum, optional, array": DeployArgs,
    "recursive": Node,
    "discriminated union": Pet,
    "self-nesting, a map, an int enum, a format": Deep,
}
ANSWERS = {
    "chat": "chat/answer.json",
    "responses": "responses/answer.json",
    "messages": "messages/answer.json",
}


@pytest.mark.parametrize("api", list(ANSWERS))
@pytest.mark.parametrize("args", list(ARGS_SCHEMAS.values()), ids=list(ARGS_SCHEMAS))
async def test_every_kind_of_args_schema_goes_out_unchanged_for_the_next_request(
    fake: FakeLLM, api: str, args: type[BaseModel]
) -> None:
    tool = Tool(name="act", description="Act.", execute=deploy, args_model=args)
    definition = tool.definition()
    request = ModelRequest(
        model=ModelRef(provider=PROVIDER[api], model_id="m"),
        messages=(UserMessage(content=(TextPart(text="go"),)),),
        tools=(definition,),
    )
    client = PydanticAIModel(lambda ref: BUILDERS[api](fake), stream=False)
    fake.replay(ANSWERS[api], ANSWERS[api])
    first = await client.request(request)
    second = await client.request(request)  # the same frozen definition, sent again
    fake.assert_drained()
    assert (first.stop_reason, second.stop_reason) == ("stop", "stop"), (first.error, second.error)
    sent = [r.body["tools"] for r in fake.requests]
    assert sent[0] == sent[1]  # nothing was edited in place between the two
    assert definition == tool.definition()  # nor in the stored definition
