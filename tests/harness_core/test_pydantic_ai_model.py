"""`PydanticAIModel` under the harness, over real HTTP to the fake OpenAI / Anthropic servers.

The real pydantic-ai and SDK code runs; only the provider is local. Plain answers (streamed),
tool calls, `length`, 429/500 retried durably by the harness (SDK retries are off), a context
window error classified for compaction, background responses as deferred handles (pending ->
ready, terminal failure, cancel on abort), and a model this deployment cannot build.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.models import Model

from harness_core.hooks import RequestOptions
from harness_core.messages import ImagePart, TextPart, message_text
from harness_core.models import ModelRef, ModelRequest
from harness_core.models.pydantic_ai import PydanticAIModel
from harness_core.result import Ok
from harness_core.session.types import RecordQuery
from harness_core.tools import ToolContext, ToolOutput, tool
from tests.support.fake_llm import (
    FakeLLM,
    anthropic_model,
    openai_chat_model,
    openai_responses_model,
)
from tests.support.file_samples import image
from tests.support.harness_kit import Kit, make_kit

BUILDERS: dict[str, Callable[[FakeLLM], Model]] = {
    "openai": openai_chat_model,
    "openai-responses": openai_responses_model,
    "anthropic": anthropic_model,
}


pytestmark = pytest.mark.usefixtures("model_requests")


def client_for(fake: FakeLLM) -> PydanticAIModel:
    return PydanticAIModel(
        lambda ref: BUILDERS[ref.provider](fake) if ref.provider in BUILDERS else None
    )


async def kit_for(tmp_path: Path, fake: FakeLLM, provider: str, **options: Any) -> Kit:
    kit = await make_kit("memory", tmp_path, **options)
    kit.harness._rt.model = client_for(fake)  # the same harness, talking HTTP
    await kit.harness.set_model(ModelRef(provider=provider, model_id="m"))
    return kit


@tool(replay="safe")
async def deploy(args: dict[str, Any], ctx: ToolContext) -> str:
    """Deploy a build."""
    return f"deployed {args['build']}"


@pytest.mark.parametrize("provider", list(BUILDERS))
async def test_a_streamed_answer_with_usage_in_the_ledger(
    tmp_path: Path, fake: FakeLLM, provider: str
) -> None:
    kit = await kit_for(tmp_path, fake, provider)
    updates: list[Any] = []
    kit.harness.events.on("message_update", updates.append)
    fake.reply("Tuesdays 14:00-16:00 UTC.", input_tokens=21, output_tokens=7)
    outcome = await kit.harness.prompt("deploy window?")
    assert isinstance(outcome, Ok) and outcome.value.kind == "completed"
    final = outcome.value.final_message
    assert final is not None and message_text(final) == "Tuesdays 14:00-16:00 UTC."
    assert updates, "streamed deltas surface as message_update events"
    usage = await kit.storage.find_records(RecordQuery(type="usage"))
    assert [(u.record.usage.input, u.record.usage.output) for u in usage] == [(21, 7)]  # type: ignore[union-attr]
    sent = fake.last_request
    assert sent is not None and sent.stream


@pytest.mark.parametrize("provider", list(BUILDERS))
async def test_a_tool_call_runs_and_its_result_goes_back(
    tmp_path: Path, fake: FakeLLM, provider: str
) -> None:
    kit = await kit_for(tmp_path, fake, provider, tools=[deploy])
    fake.reply(tool_calls=[("deploy", {"build": 42})])
    fake.reply("deployed it")
    outcome = await kit.harness.prompt("ship 42")
    assert isinstance(outcome, Ok) and outcome.value.kind == "completed"
    first, second = fake.requests_to(
        "chat"
        if provider == "openai"
        else "responses"
        if provider == "openai-responses"
        else "messages"
    )
    assert "deploy" in str(first.body.get("tools"))
    assert "deployed 42" in str(second.body)  # the tool result went back to the provider


_DASHBOARD = base64.b64encode(image("png")).decode()


@tool(replay="safe")
async def screenshot(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    """Take a screenshot of the dashboard."""
    return ToolOutput(
        content=(
            TextPart(text="the dashboard:"),
            ImagePart(media_type="image/png", data=_DASHBOARD),
        )
    )


@pytest.mark.parametrize("provider", list(BUILDERS))
async def test_a_tools_image_goes_back_to_the_provider(
    tmp_path: Path, fake: FakeLLM, provider: str
) -> None:
    kit = await kit_for(tmp_path, fake, provider, tools=[screenshot])
    fake.reply(tool_calls=[("screenshot", {})])
    fake.reply("the dashboard is green")
    outcome = await kit.harness.prompt("how does the dashboard look?")
    assert isinstance(outcome, Ok) and outcome.value.kind == "completed"
    second = fake.requests[-1].body
    # the image's bytes are in the request, in the provider's own image shape
    assert _DASHBOARD in json.dumps(second)
    assert "the dashboard:" in json.dumps(second)


async def test_length_is_classified_against_the_cap(tmp_path: Path, fake: FakeLLM) -> None:
    kit = await kit_for(
        tmp_path, fake, "openai", request_options=RequestOptions(max_output_tokens=5)
    )
    fake.reply("cut off", finish="length", output_tokens=5)
    outcome = await kit.harness.prompt("write a novel")
    assert isinstance(outcome, Ok)
    final = outcome.value.final_message
    assert final is not None and final.stop_reason == "length"  # the cap was reached: genuine
    assert fake.last_request is not None
    assert fake.last_request.body["max_completion_tokens"] == 5


@pytest.mark.parametrize("status", [429, 500])
async def test_provider_errors_are_retried_durably(
    tmp_path: Path, fake: FakeLLM, status: int
) -> None:
    kit = await kit_for(tmp_path, fake, "anthropic")
    fake.fail(status)
    fake.reply("fine now")
    outcome = await kit.harness.prompt("hello")
    assert isinstance(outcome, Ok) and outcome.value.kind == "completed"
    attempts = await kit.storage.find_records(
        RecordQuery(type="step_attempt", order="oldest_first")
    )
    assert [a.record.attempt for a in attempts] == [1, 2]  # type: ignore[union-attr]
    assert len(fake.requests_to("messages")) == 2  # the SDK did not retry on its own


async def test_errors_are_classified_in_band(fake: FakeLLM) -> None:
    client = client_for(fake)
    request = ModelRequest(model=ModelRef(provider="openai", model_id="m"), messages=())
    fake.fail(429)
    limited = await client.request(request)
    assert limited.error is not None and (limited.error.kind, limited.error.retryable) == (
        "rate_limit",
        True,
    )
    fake.fail_context_length()
    overflow = await client.request(request)
    assert overflow.error is not None and overflow.error.kind == "context_overflow"
    fake.fail(400, "bad field")
    rejected = await client.request(request)
    assert rejected.error is not None and (rejected.error.kind, rejected.error.retryable) == (
        "invalid_request",
        False,
    )
    missing = ModelRequest(model=ModelRef(provider="nowhere", model_id="m"), messages=())
    assert client.model_info(missing.model) is None  # a missing identity, not a crash
    assert (await client.request(missing)).stop_reason == "error"


async def test_a_background_response_is_a_deferred_handle(tmp_path: Path, fake: FakeLLM) -> None:
    kit = await kit_for(
        tmp_path, fake, "openai-responses", request_options=RequestOptions(deferred=True)
    )
    fake.reply("the long answer", pending_polls=1)
    first = await kit.harness.prompt("think hard")
    assert isinstance(first, Ok) and first.value.kind == "suspended"
    handle = first.value.deferred
    assert handle is not None and handle.id.startswith("resp_")
    assert fake.last_request is not None and fake.last_request.body["background"] is True
    pending = await kit.harness.resume()  # one poll: still in progress
    assert isinstance(pending, Ok) and pending.value.kind == "suspended"
    ready = await kit.harness.resume()
    assert isinstance(ready, Ok) and ready.value.kind == "completed"
    assert ready.value.final_message is not None
    assert message_text(ready.value.final_message) == "the long answer"
    assert len(fake.requests_to("responses")) == 1  # polls are GETs, never a second POST
    assert len(fake.requests_to("responses.retrieve")) == 2


async def test_a_background_failure_fails_the_run(tmp_path: Path, fake: FakeLLM) -> None:
    kit = await kit_for(
        tmp_path, fake, "openai-responses", request_options=RequestOptions(deferred=True)
    )
    fake.reply("never", background_outcome="failed", background_error="boom")
    first = await kit.harness.prompt("think hard")
    assert isinstance(first, Ok) and first.value.kind == "suspended"
    failed = await kit.harness.resume()
    assert isinstance(failed, Ok) and failed.value.kind == "failed"


async def test_abort_cancels_a_background_response(tmp_path: Path, fake: FakeLLM) -> None:
    kit = await kit_for(
        tmp_path, fake, "openai-responses", request_options=RequestOptions(deferred=True)
    )
    fake.reply("never needed", pending_polls=5)
    first = await kit.harness.prompt("think hard")
    assert isinstance(first, Ok) and first.value.kind == "suspended"
    assert isinstance(await kit.harness.abort(), Ok)
    await kit.harness.wait_for_idle()
    assert len(fake.requests_to("responses.cancel")) == 1
    (job,) = fake.background_jobs.values()
    assert job.status == "cancelled"
