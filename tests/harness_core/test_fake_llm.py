"""The fake LLM server against the real SDKs: pydantic-ai's direct API over real HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import pytest
from pydantic_ai import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolDefinition,
    ToolReturnPart,
)
from pydantic_ai import models as pai_models
from pydantic_ai.direct import model_request, model_request_stream
from pydantic_ai.exceptions import (
    ModelAPIError,
    ModelContextWindowExceededError,
    ModelHTTPError,
    ModelOverloadedError,
    ModelRateLimitError,
    ModelServerError,
    SuspendedResponseExpired,
)
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.models.openai import OpenAIResponsesModelSettings
from pydantic_ai.settings import ModelSettings

from tests.support.fake_llm import (
    FakeLLM,
    Hang,
    Reply,
    allow_model_requests,
    anthropic_model,
    openai_chat_model,
    openai_responses_model,
)

MODELS: dict[str, Callable[[FakeLLM], Model]] = {
    "chat": openai_chat_model,
    "responses": openai_responses_model,
    "anthropic": anthropic_model,
}
KINDS = list(MODELS)
ENDPOINT = {"chat": "chat", "responses": "responses", "anthropic": "messages"}
DEPLOY = ToolDefinition(
    name="deploy",
    description="Deploy a build",
    parameters_json_schema={
        "type": "object",
        "properties": {"build": {"type": "integer"}},
        "required": ["build"],
    },
)
TOOLS = ModelRequestParameters(function_tools=[DEPLOY], allow_text_output=True)
BACKGROUND: OpenAIResponsesModelSettings = {"openai_background": True}
PROMPT: list[ModelMessage] = [ModelRequest.user_text_prompt("deploy 42", instructions="Be brief.")]


pytestmark = pytest.mark.usefixtures("model_requests")


async def ask(
    model: Model,
    messages: list[ModelMessage] = PROMPT,
    *,
    stream: bool = False,
    settings: ModelSettings | None = None,
    params: ModelRequestParameters | None = None,
) -> ModelResponse:
    if not stream:
        return await model_request(
            model, messages, model_settings=settings, model_request_parameters=params
        )
    async with model_request_stream(
        model, messages, model_settings=settings, model_request_parameters=params
    ) as streamed:
        async for _ in streamed:
            pass
    return streamed.get()


# ---- success shapes


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("kind", KINDS)
async def test_plain_text_with_usage(fake: FakeLLM, kind: str, stream: bool) -> None:
    model = MODELS[kind](fake)
    fake.reply("hello streaming world", input_tokens=12, output_tokens=3, cache_read_tokens=2)

    response = await ask(model, stream=stream, settings={"max_tokens": 64})

    assert [p.content for p in response.parts if isinstance(p, TextPart)] == [
        "hello streaming world"
    ]
    assert response.finish_reason == "stop"
    assert response.state == "complete"
    assert response.usage.input_tokens == 12
    assert response.usage.output_tokens == 3
    assert response.usage.cache_read_tokens == 2
    assert response.provider_response_id is not None
    sent = fake.last_request
    assert sent.api == ENDPOINT[kind]
    assert sent.json["stream"] is stream
    assert sent.json["model"] == response.model_name
    token_field = {
        "chat": "max_completion_tokens",
        "responses": "max_output_tokens",
        "anthropic": "max_tokens",
    }[kind]
    assert sent.json[token_field] == 64
    if kind == "chat" and stream:
        assert sent.json["stream_options"] == {"include_usage": True}
    fake.assert_drained()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("kind", KINDS)
async def test_tool_call_round_trip(fake: FakeLLM, kind: str, stream: bool) -> None:
    model = MODELS[kind](fake)
    fake.reply(tool_calls=[("deploy", {"build": 42}, "call_7")])
    fake.reply("deployed: ok build 42")

    first = await ask(model, stream=stream, params=TOOLS)

    (call,) = first.parts
    assert isinstance(call, ToolCallPart)
    assert (call.tool_name, call.args_as_dict(), call.tool_call_id) == (
        "deploy",
        {"build": 42},
        "call_7",
    )
    # The Responses API has no tool-call status: a response with calls is just `completed`.
    assert first.finish_reason == ("stop" if kind == "responses" else "tool_call")
    tools_sent = fake.last_request.json["tools"]
    assert len(tools_sent) == 1 and "deploy" in str(tools_sent[0])

    result = ToolReturnPart("deploy", "ok build 42", tool_call_id=call.tool_call_id)
    second = await ask(model, [*PROMPT, first, ModelRequest(parts=[result])], params=TOOLS)

    assert second.text == "deployed: ok build 42"
    body = fake.last_request.json
    if kind == "chat":
        assert body["messages"][-1] == {
            "role": "tool",
            "tool_call_id": "call_7",
            "content": "ok build 42",
        }
    elif kind == "responses":
        outputs = [i for i in body["input"] if i.get("type") == "function_call_output"]
        assert [(o["call_id"], o["output"]) for o in outputs] == [("call_7", "ok build 42")]
    else:
        block = body["messages"][-1]["content"][0]
        assert (block["type"], block["tool_use_id"]) == ("tool_result", "call_7")
    fake.assert_drained()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(
    ("kind", "raw"),
    [("chat", "length"), ("responses", "max_output_tokens"), ("anthropic", "max_tokens")],
)
async def test_length_finish(fake: FakeLLM, kind: str, raw: str, stream: bool) -> None:
    model = MODELS[kind](fake)
    fake.reply("cut", finish="length")

    response = await ask(model, stream=stream)

    assert response.text == "cut"
    assert response.finish_reason == "length"
    assert response.provider_details is not None
    assert response.provider_details["finish_reason"] == raw


async def test_text_and_tool_calls_in_one_stream_keep_their_order(fake: FakeLLM) -> None:
    model = anthropic_model(fake)
    fake.reply(
        stream_chunks=["Deploying ", "now."],
        tool_calls=[("deploy", {"build": 1}), ("deploy", '{"build": 2}')],
    )

    response = await ask(model, stream=True, params=TOOLS)

    kinds = [type(p).__name__ for p in response.parts]
    assert kinds == ["TextPart", "ToolCallPart", "ToolCallPart"]
    calls = [p for p in response.parts if isinstance(p, ToolCallPart)]
    assert [c.args_as_dict() for c in calls] == [{"build": 1}, {"build": 2}]
    assert all(c.tool_call_id.startswith("toolu_fake") for c in calls)


# ---- errors


@pytest.mark.parametrize("kind", KINDS)
async def test_500_then_success_is_not_retried_by_the_sdk(fake: FakeLLM, kind: str) -> None:
    model = MODELS[kind](fake)
    fake.fail(500)
    fake.reply("recovered")

    with pytest.raises(ModelHTTPError) as failed:
        await ask(model)
    assert failed.value.status_code == 500
    assert isinstance(failed.value, ModelServerError)
    assert len(fake.requests) == 1  # max_retries=0: the SDK didn't retry on its own

    assert (await ask(model)).text == "recovered"
    assert len(fake.requests) == 2
    fake.assert_drained()


@pytest.mark.parametrize("kind", KINDS)
async def test_429_is_a_rate_limit_http_error(fake: FakeLLM, kind: str) -> None:
    model = MODELS[kind](fake)
    fake.fail(429)

    with pytest.raises(ModelHTTPError) as failed:
        await ask(model)

    error = failed.value
    assert error.status_code == 429
    assert isinstance(error, ModelRateLimitError)
    assert error.retry_after == 0
    assert isinstance(error.body, dict)
    if kind == "anthropic":
        assert error.body["error"]["type"] == "rate_limit_error"
    else:
        assert error.body["code"] == "rate_limit_exceeded"
    assert len(fake.requests) == 1


@pytest.mark.parametrize("kind", KINDS)
async def test_context_length_400(fake: FakeLLM, kind: str) -> None:
    model = MODELS[kind](fake)
    fake.fail_context_length()
    fake.fail(400, "Bad field")

    with pytest.raises(ModelHTTPError) as too_long:
        await ask(model)
    assert too_long.value.status_code == 400
    assert isinstance(too_long.value, ModelContextWindowExceededError)
    with pytest.raises(ModelHTTPError) as rejected:
        await ask(model)
    assert rejected.value.status_code == 400
    assert not isinstance(rejected.value, ModelContextWindowExceededError)


async def test_anthropic_overloaded_inside_a_stream(fake: FakeLLM) -> None:
    model = anthropic_model(fake)
    fake.fail(529, in_stream=True)

    with pytest.raises(ModelHTTPError) as overloaded:
        await ask(model, stream=True)

    assert isinstance(overloaded.value, ModelOverloadedError)
    assert overloaded.value.in_stream
    assert overloaded.value.status_code == 529  # the status Anthropic uses for it outside a stream


@pytest.mark.parametrize("kind", ["chat", "responses"])
async def test_openai_error_inside_a_stream(fake: FakeLLM, kind: str) -> None:
    model = MODELS[kind](fake)
    fake.fail(429, in_stream=True)

    with pytest.raises(ModelRateLimitError) as limited:
        await ask(model, stream=True)

    assert limited.value.in_stream


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["tickets.create", "x" * 65])
async def test_a_tool_name_the_providers_refuse_is_a_400(
    fake: FakeLLM, kind: str, name: str
) -> None:
    model = MODELS[kind](fake)
    fake.reply("kept for the next request")
    bad = ToolDefinition(name=name, description="d", parameters_json_schema={"type": "object"})
    params = ModelRequestParameters(function_tools=[bad], allow_text_output=True)

    with pytest.raises(ModelHTTPError) as refused:
        await ask(model, params=params)

    assert refused.value.status_code == 400 and name in str(refused.value.body)
    assert fake.refused_tool_names == 1
    history: list[ModelMessage] = [
        *PROMPT,
        ModelResponse(parts=[ToolCallPart(tool_name=name, args={}, tool_call_id="c1")]),
        ModelRequest(parts=[ToolReturnPart(tool_name=name, content="ok", tool_call_id="c1")]),
    ]
    with pytest.raises(ModelHTTPError):
        await ask(model, history, params=TOOLS)  # a call in the history is checked too
    assert fake.refused_tool_names == 2
    assert (await ask(model, params=TOOLS)).parts  # the scripted reply was not taken


async def test_an_empty_queue_answers_a_loud_500(fake: FakeLLM) -> None:
    model = openai_chat_model(fake)

    with pytest.raises(ModelHTTPError) as unscripted:
        await ask(model)

    assert unscripted.value.status_code == 500
    assert "no scripted reply left" in str(unscripted.value.body)
    assert fake.unscripted == 1
    with pytest.raises(AssertionError, match="found no scripted reply"):
        fake.assert_drained()


async def test_leftover_script_fails_assert_drained(fake: FakeLLM) -> None:
    fake.push(Reply(text="never asked"))
    with pytest.raises(AssertionError, match="never requested"):
        fake.assert_drained()


async def test_unknown_routes_are_recorded_and_404(fake: FakeLLM) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{fake.openai_base_url}/embeddings", json={"input": "x"}) as answer,
    ):
        assert answer.status == 404
        body = await answer.json()
    assert body["error"]["code"] == "unknown_url"
    assert fake.last_request.api == "unknown"
    assert fake.last_request.json == {"input": "x"}


# ---- Responses API background mode


async def test_background_response_polls_until_complete(fake: FakeLLM) -> None:
    model = openai_responses_model(fake)
    fake.reply("background result", pending_polls=2, input_tokens=20, output_tokens=6)

    queued = await ask(model, settings=BACKGROUND)

    assert queued.state == "suspended"
    assert queued.provider_response_id is not None
    assert queued.parts == []
    assert queued.provider_details is not None
    assert queued.provider_details["background"] is True
    assert queued.provider_details["finish_reason"] == "queued"
    assert fake.last_request.json["background"] is True

    # Persist and reload the history, then resume: each call polls (GET), never re-POSTs.
    blob = ModelMessagesTypeAdapter.dump_json([*PROMPT, queued])
    history = ModelMessagesTypeAdapter.validate_json(blob)
    states = []
    while True:
        polled = await ask(model, history)
        states.append(polled.state)
        if polled.state != "suspended":
            break
        history = [*history[:-1], polled]

    assert states == ["suspended", "suspended", "complete"]
    assert polled.text == "background result"
    assert polled.finish_reason == "stop"
    assert polled.provider_response_id == queued.provider_response_id
    assert (polled.usage.input_tokens, polled.usage.output_tokens) == (20, 6)
    assert [r.api for r in fake.requests] == ["responses"] + ["responses.retrieve"] * 3
    assert fake.background_jobs[queued.provider_response_id].polls == 3


async def test_background_length_and_streamed_resume(fake: FakeLLM) -> None:
    model = openai_responses_model(fake)
    fake.reply("cut", finish="length")

    queued = await ask(model, settings=BACKGROUND)
    finished = await ask(model, [*PROMPT, queued], stream=True)

    assert (finished.state, finished.finish_reason, finished.text) == ("complete", "length", "cut")
    assert fake.last_request.api == "responses.retrieve"


async def test_background_failure_raises_when_polled(fake: FakeLLM) -> None:
    model = openai_responses_model(fake)
    fake.reply("unused", background_outcome="failed", background_error="worker crashed")

    queued = await ask(model, settings=BACKGROUND)
    with pytest.raises(ModelAPIError, match="worker crashed") as failed:
        await ask(model, [*PROMPT, queued])

    # A failed job arrives in a 200 body: the error has a category but no HTTP status.
    assert isinstance(failed.value, ModelServerError)
    assert not isinstance(failed.value, ModelHTTPError)
    assert failed.value.provider_error_code == "server_error"


async def test_cancel_suspended_response(fake: FakeLLM) -> None:
    model = openai_responses_model(fake)
    fake.reply("never delivered", pending_polls=10)
    queued = await ask(model, settings=BACKGROUND)
    assert queued.provider_response_id is not None

    with pai_models.override_allow_model_requests(False):
        await model.cancel_suspended_response(queued)  # deliberately not gated by the flag

    assert fake.last_request.method == "POST"
    assert fake.last_request.path == f"/v1/responses/{queued.provider_response_id}/cancel"
    assert fake.background_jobs[queued.provider_response_id].status == "cancelled"
    polled = await ask(model, [*PROMPT, queued])
    assert (polled.state, polled.finish_reason, polled.parts) == ("complete", "error", [])
    assert polled.provider_details is not None
    assert polled.provider_details["finish_reason"] == "cancelled"


async def test_cancelling_a_foreground_response_sends_nothing(fake: FakeLLM) -> None:
    model = openai_responses_model(fake)
    fake.reply("done")
    response = await ask(model)

    await model.cancel_suspended_response(response)

    assert [r.api for r in fake.requests] == ["responses"]


async def test_an_expired_background_job(fake: FakeLLM) -> None:
    model = openai_responses_model(fake)
    fake.reply("gone")
    queued = await ask(model, settings=BACKGROUND)
    assert queued.provider_response_id is not None
    del fake.background_jobs[queued.provider_response_id]

    with pytest.raises(SuspendedResponseExpired):
        await ask(model, [*PROMPT, queued])


# ---- ALLOW_MODEL_REQUESTS, holding a request in flight


async def test_allow_model_requests_false_blocks_models_on_the_fake(fake: FakeLLM) -> None:
    model = anthropic_model(fake)
    fake.reply("allowed")

    with pai_models.override_allow_model_requests(False):
        with pytest.raises(RuntimeError, match="ALLOW_MODEL_REQUESTS is False"):
            await ask(model)
        assert fake.requests == []
        with allow_model_requests():
            assert (await ask(model)).text == "allowed"
        assert pai_models.ALLOW_MODEL_REQUESTS is False


async def test_hang_holds_a_request_in_flight_until_released(fake: FakeLLM) -> None:
    model = openai_chat_model(fake)
    fake.hang(then=Reply(text="late answer"))

    call = asyncio.create_task(ask(model))
    await fake.wait_for_requests(1)
    assert not call.done()
    assert fake.last_request.api == "chat"

    fake.release_hung()
    assert (await call).text == "late answer"


async def test_a_cancelled_call_on_a_hung_request_and_stop(fake: FakeLLM) -> None:
    model = anthropic_model(fake)
    fake.hang()

    call = asyncio.create_task(ask(model))
    await fake.wait_for_requests(1)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await fake.stop()  # releases the held handler, whose client is gone; nothing is raised
    assert fake.requests[0].answered_with == Hang()
