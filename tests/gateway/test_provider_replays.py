"""The configured model (``GATEWAY_MODEL``) against recorded real answers, with the example agent.

`gateway ask` runs ``examples/agent.py`` (its tools take pydantic args models) on every provider
the gateway can be configured with, served by `FakeLLM` the answers the providers recorded
(``tests/support/provider_replays``): the tools' schemas go out, the call comes back and runs,
the answer is printed. A provider's own output cap is delivered with a line saying it was cut
off, and the usage total a provider reported is the one stored.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp import web
from pydantic import BaseModel, Field, SecretStr

from config import Settings
from gateway.ask import AskFailed, ask
from gateway.models import model_from_settings, model_info
from gateway.replies import CUT_OFF_BEFORE_ANSWER, CUT_OFF_NOTE, failure_text
from harness_core import AssistantMessage, ToolResultMessage, message_text
from harness_core.messages import TextPart, UserMessage
from harness_core.models import ModelInfo, ModelRef, ModelRequest, ToolDefinition
from harness_core.models.pydantic_ai import PydanticAIModel
from harness_core.session.records import OperationError
from harness_core.session.types import RecordQuery
from harness_core.storage import open_repo
from tests.support.fake_llm import FakeLLM, Recorded
from tests.support.gateway_rig import lane_texts

EXAMPLE = "examples.agent"


class StatusArgs(BaseModel):
    service: str
    since_hours: int | None = Field(default=None, ge=1)


STAGING = "Staging deploys are open at any time."
CUT = "Hello! Deploys are open Tuesday to Thursday, and the next window"

# provider -> (the tool call, the answer after its result, the answer's text)
PROVIDERS = {
    "openai": ("chat/deploy_window_call_stream.sse", "chat/answer_stream.sse", None),
    "openai-responses": (
        "responses/deploy_window_call_stream.sse",
        "responses/answer_stream.sse",
        None,
    ),
    "anthropic": (
        "messages/deploy_window_call_stream.sse",
        "messages/thinking_answer_stream.sse",
        None,
    ),
    "openai-compatible": (
        "chat/deploy_window_call_stream.sse",
        "chat/think_tags_stream.sse",
        "api is healthy.",
    ),
}


pytestmark = pytest.mark.usefixtures("model_requests")


def settings_for(tmp_path: Path, fake: FakeLLM, provider: str) -> Settings:
    base = fake.anthropic_base_url if provider == "anthropic" else fake.openai_base_url
    return Settings(
        store_url=f"sqlite:///{tmp_path}/gw.db",
        plugin=EXAMPLE,
        model=f"{provider}:gpt-4o-mini",
        model_api_key=SecretStr("sk-test"),
        model_base_url=base,
    )


async def ask_once(settings: Settings, question: str) -> list[str]:
    repo = open_repo(settings.store_url)
    out: list[str] = []
    try:
        assert await ask(repo, settings, "cli:replay", question, out) == 0
    finally:
        await repo.close()
    return out


@pytest.mark.parametrize("provider", list(PROVIDERS))
async def test_the_example_agent_calls_its_pydantic_args_tools(
    tmp_path: Path, fake: FakeLLM, provider: str
) -> None:
    calls, answer, said = PROVIDERS[provider]
    settings = settings_for(tmp_path, fake, provider)
    fake.replay(calls, answer)

    out = await ask_once(settings, "when can I deploy to staging?")

    fake.assert_drained()
    assert out[0] == (said or "Done: the tools answered.")
    first, second = fake.requests
    sent = str(first.body["tools"])
    assert "deploy_window" in sent and "staging" in sent and "note" in sent  # both schemas
    assert STAGING in str(second.body)  # the validated call ran; its result went back
    repo = open_repo(settings.store_url)
    try:
        assert await lane_texts(repo, "cli", "cli:replay", ToolResultMessage) == [STAGING]
    finally:
        await repo.close()


CUT_OFF = {
    "openai": ("chat/length_answer_stream.sse", f"{CUT}\n\n{CUT_OFF_NOTE}"),
    "openai-responses": ("responses/incomplete_stream.sse", f"{CUT}\n\n{CUT_OFF_NOTE}"),
    "anthropic": ("messages/max_tokens_stream.sse", f"{CUT}\n\n{CUT_OFF_NOTE}"),
    "openai-compatible": ("chat/length_in_think_stream.sse", CUT_OFF_BEFORE_ANSWER),
}


@pytest.mark.parametrize("provider", list(CUT_OFF))
async def test_an_answer_cut_off_by_the_providers_cap_is_delivered_and_says_so(
    tmp_path: Path, fake: FakeLLM, provider: str
) -> None:
    replay, shown = CUT_OFF[provider]
    fake.replay(replay)
    out = await ask_once(settings_for(tmp_path, fake, provider), "hello")
    fake.assert_drained()  # no compaction, no retry
    assert out[0] == shown
    assert "<think>" not in out[0] and "Hmm" not in out[0]


async def test_the_usage_total_a_provider_reports_is_stored(tmp_path: Path, fake: FakeLLM) -> None:
    # Gemini's OpenAI-compatible endpoint: 35 in, 12 out, total 109 (its thinking); the call
    # names a tool this agent does not have, so the model hears that and answers
    settings = settings_for(tmp_path, fake, "openai-compatible")
    fake.replay("chat/empty_tool_call_id_stream.sse", "chat/answer_stream.sse")
    assert await ask_once(settings, "how is api?") == [
        "Done: the tools answered.",
        "(openai-compatible:gpt-4o-mini: 220 tokens in, 9 out)",
    ]
    repo = open_repo(settings.store_url)
    try:
        storage = await repo.open("cli")
        found = await storage.find_records(RecordQuery(type="usage", order="oldest_first"))
        await storage.close()
    finally:
        await repo.close()
    assert [u.record.usage.total_tokens for u in found] == [109, 229]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "replay", ["chat/empty_tool_call_id.json", "chat/empty_tool_call_id_stream.sse"]
)
async def test_thinking_tokens_counted_only_in_the_total_are_kept(
    fake: FakeLLM, replay: str
) -> None:
    # Gemini's OpenAI-compatible endpoint: 35 in, 12 out, total 109: its 62 thinking tokens are
    # in the total only. They are billed as output, and pydantic-ai >= 2.78 counts them there
    settings = Settings(
        model="openai-compatible:gemini-2.5-pro",
        model_api_key=SecretStr("sk-test"),
        model_base_url=fake.openai_base_url,
    )
    client, ref = model_from_settings(settings)
    assert isinstance(client, PydanticAIModel)
    fake.replay(replay)
    request = ModelRequest(
        model=ref,
        messages=(UserMessage(content=(TextPart(text="how is api?"),)),),
        tools=(
            ToolDefinition(
                name="service_status",
                description="status",
                parameters=StatusArgs.model_json_schema(),
            ),
        ),
    )
    try:
        message = await client.request(
            request, (lambda _: None) if replay.endswith(".sse") else None
        )
    finally:
        await client.aclose()
    fake.assert_drained()
    assert message.stop_reason == "tool_use", message.error
    assert message.usage is not None
    assert (message.usage.input, message.usage.output, message.usage.total_tokens) == (35, 74, 109)


# provider -> (a recorded whole answer, how many of its events came before the body ended)
CUT_SHORT = {
    "openai": ("chat/answer_stream.sse", 4),  # no chunk with a finish reason, no [DONE]
    "openai-responses": ("responses/answer_stream.sse", 9),  # no response.completed
    "anthropic": ("messages/thinking_answer_stream.sse", 11),  # no message_delta / message_stop
}


@pytest.mark.parametrize("provider", list(CUT_SHORT))
async def test_a_stream_that_ends_before_the_provider_s_end_is_a_lost_connection(
    fake: FakeLLM, provider: str
) -> None:
    """It was delivered as a whole answer: "Done: the" said the thread, and a tool call cut in
    its arguments ran with the tool's defaults. It is retried now (D308)."""
    name, kept = CUT_SHORT[provider]
    whole = Recorded.load(name)
    fake.push(replace(whole, body=b"".join(whole.events()[:kept])))
    message = await _streamed(fake, provider)
    assert message.stop_reason == "error" and message.error is not None
    assert (message.error.kind, message.error.retryable) == ("network", True)


async def test_a_compatible_server_may_end_its_stream_without_a_finish_reason(
    fake: FakeLLM,
) -> None:
    # some OpenAI-compatible servers never send one: their answers are whole
    whole = Recorded.load("chat/answer_stream.sse")
    fake.push(replace(whole, body=b"".join((*whole.events()[:4], whole.events()[-1]))))
    message = await _streamed(fake, "openai-compatible")
    assert message.stop_reason == "stop" and message_text(message) == "Done: the tools answered."


async def _streamed(fake: FakeLLM, provider: str, *, stream: bool = True) -> AssistantMessage:
    base = fake.anthropic_base_url if provider == "anthropic" else fake.openai_base_url
    settings = Settings(
        model=f"{provider}:gpt-4o-mini", model_api_key=SecretStr("sk-test"), model_base_url=base
    )
    client, ref = model_from_settings(settings)
    assert isinstance(client, PydanticAIModel)
    request = ModelRequest(model=ref, messages=(UserMessage(content=(TextPart(text="hi"),)),))
    try:
        return await client.request(request, (lambda _: None) if stream else None)
    finally:
        await client.aclose()
        fake.assert_drained()


def test_a_model_s_window_is_the_one_its_provider_gives_it() -> None:
    """Every model was taken as 128,000 tokens: Claude's 200,000-token prompts were
    "overflows", and a small local server's window was never known (D310)."""
    assert model_info(ModelRef(provider="anthropic", model_id="claude-sonnet-4-5")) == ModelInfo(
        context_window=200_000, max_output_tokens=8_192
    )
    assert model_info(ModelRef(provider="openai", model_id="gpt-4.1-mini")).context_window == (
        1_000_000
    )
    # a compatible server's model is never looked up; the setting says what it takes
    local = ModelRef(provider="openai-compatible", model_id="gpt-4o-mini")
    assert model_info(local).context_window == 128_000
    assert model_info(local, 8_192) == ModelInfo(context_window=8_192, max_output_tokens=4_096)
    unknown = ModelRef(provider="openai", model_id="gpt-unknown-7")
    assert model_info(unknown).context_window == 128_000


async def test_a_paid_answer_within_the_model_s_window_is_delivered(
    tmp_path: Path, fake: FakeLLM
) -> None:
    """A 150,000-token prompt answered by Claude was thrown away as an overflow of the
    128,000 every model was taken to have: charged, and never shown."""
    settings = settings_for(tmp_path, fake, "anthropic").replace(model="anthropic:claude-haiku-4-5")
    fake.reply("a fine answer", input_tokens=150_000, output_tokens=20)
    out = await ask_once(settings, "summarize the incident log")
    fake.assert_drained()
    assert out[0] == "a fine answer"


def test_the_configured_window_is_the_model_s() -> None:
    settings = Settings(
        model="openai-compatible:qwen3-8b",
        model_api_key=SecretStr("sk-test"),
        model_base_url="http://127.0.0.1:9/v1",
        model_context_window=8_192,
    )
    client, ref = model_from_settings(settings)
    assert client.model_info(ref) == ModelInfo(context_window=8_192, max_output_tokens=4_096)


async def test_a_stream_of_keep_alives_alone_times_out() -> None:
    """A provider that sends an SSE comment every few seconds (OpenRouter while it queues, a
    proxy) and never the answer held the run for as long as it kept on: the HTTP client's
    timeout counts bytes, and it never saw silence."""

    async def trickle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        while True:
            await response.write(b": OPENROUTER PROCESSING\n\n")
            await asyncio.sleep(0.1)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", trickle)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    settings = Settings(
        model="openai-compatible:some-model",
        model_api_key=SecretStr("sk-test"),
        model_base_url=f"http://127.0.0.1:{port}/v1",
        model_timeout_seconds=1.0,
    )
    client, ref = model_from_settings(settings)
    assert isinstance(client, PydanticAIModel)
    request = ModelRequest(model=ref, messages=(UserMessage(content=(TextPart(text="hi"),)),))
    try:
        async with asyncio.timeout(10):
            message = await client.request(request, lambda _: None)
    finally:
        await client.aclose()
        await runner.cleanup()
    assert message.error is not None
    assert (message.error.kind, message.error.retryable) == ("timeout", True)
    assert message.error.message == "the provider sent no part of the answer within 1 s"


@pytest.mark.parametrize("stream", [True, False])
async def test_an_answer_of_nothing_is_asked_again(fake: FakeLLM, stream: bool) -> None:
    """A 200 with no choices (or an empty turn) was delivered as "(The run ended without a
    text answer.)", and never asked again (D312)."""
    fake.reply(None)
    message = await _streamed(fake, "openai-compatible", stream=stream)
    assert message.error is not None
    assert (message.error.kind, message.error.retryable) == ("server", True)


DECLINED = "I'm sorry, but I can't help with that."


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("provider", ["openai", "openai-responses", "anthropic"])
async def test_a_model_that_declines_is_heard_in_its_own_words(
    fake: FakeLLM, provider: str, stream: bool
) -> None:
    """A refusal was "the provider ended the response: content_filter" (its words dropped), and
    the thread read only that the provider declined."""
    fake.reply(None, refusal=DECLINED)
    message = await _streamed(fake, provider, stream=stream)
    assert message.stop_reason == "error" and message.error is not None
    assert (message.error.kind, message.error.retryable) == ("content_filter", False)
    assert message.error.message == f"the model declined: {DECLINED}"
    assert failure_text(OperationError(code="content_filter", message=message.error.message)) == (
        f'Sorry, the model declined to answer this: "{DECLINED}" (content_filter).'
    )


async def test_a_declined_question_is_answered_once_in_the_model_s_words(
    tmp_path: Path, fake: FakeLLM
) -> None:
    fake.reply(None, refusal=DECLINED)
    repo = open_repo(f"sqlite:///{tmp_path}/gw.db")
    try:
        with pytest.raises(AskFailed, match="the model declined: I'm sorry"):
            await ask(repo, settings_for(tmp_path, fake, "openai"), "cli:replay", "how?", [])
    finally:
        await repo.close()
    fake.assert_drained()  # not asked again: asking again declines again
