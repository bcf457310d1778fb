"""A profile's model is served with its own provider's key, and every profile model is checked.

``GATEWAY_MODEL_API_KEY`` and ``GATEWAY_MODEL_BASE_URL`` belong to ``GATEWAY_MODEL``'s provider:
an outside walkthrough found an ``anthropic:`` profile on an ``openai:`` gateway built with the
OpenAI key (sent to Anthropic), and a real profile model on a scripted gateway answered by the
echo while its timeline said the model changed. Real SDKs, over HTTP, against the fake provider.
"""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from config import Profile, Settings
from gateway.models import ModelConfigError, model_from_settings
from harness_core import ModelRef, ModelRequest, TextPart, UserMessage, message_text
from tests.support.fake_llm import FakeLLM

OPENAI = ModelRef(provider="openai", model_id="gpt-4o-mini")
ANTHROPIC = ModelRef(provider="anthropic", model_id="claude-sonnet-5-5")
SCRIPTED = ModelRef(provider="scripted", model_id="echo")


def _ask(model: ModelRef, text: str) -> ModelRequest:
    return ModelRequest(model=model, messages=(UserMessage(content=(TextPart(text=text),)),))


async def test_a_profile_of_another_provider_gets_that_provider_s_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with FakeLLM() as fake:
        monkeypatch.setattr("pydantic_ai.models.ALLOW_MODEL_REQUESTS", True)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-its-own")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.anthropic_base_url)
        settings = Settings(
            model="openai:gpt-4o-mini",
            model_api_key=SecretStr("sk-openai-the-gateway-s"),
            model_base_url=fake.openai_base_url,
            profiles=(Profile(name="claude", model="anthropic:claude-sonnet-5-5"),),
        )
        client, ref = model_from_settings(settings)
        assert ref == OPENAI
        try:
            fake.reply(text="from anthropic")
            fake.reply(text="from openai")
            for model, said in ((ANTHROPIC, "from anthropic"), (OPENAI, "from openai")):
                answer = await client.request(_ask(model, "hello"))
                assert message_text(answer) == said, answer
        finally:
            await client.aclose()  # type: ignore[attr-defined]
        anthropic, openai = fake.requests
        assert anthropic.path.startswith("/v1/messages")
        sent = anthropic.headers.get("x-api-key") or anthropic.headers["authorization"]
        assert sent.removeprefix("Bearer ") == "sk-ant-its-own"
        assert "sk-openai" not in str(anthropic.headers)
        assert openai.headers["authorization"] == "Bearer sk-openai-the-gateway-s"


async def test_a_real_profile_model_on_a_scripted_gateway_is_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with FakeLLM() as fake:
        monkeypatch.setattr("pydantic_ai.models.ALLOW_MODEL_REQUESTS", True)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-env")
        monkeypatch.setenv("OPENAI_BASE_URL", fake.openai_base_url)
        settings = Settings(profiles=(Profile(name="real", model="openai:gpt-4o-mini"),))
        client, ref = model_from_settings(settings)
        assert ref == SCRIPTED
        try:
            fake.reply(text="a real answer")
            real = await client.request(_ask(OPENAI, "hello"))
            echoed = await client.request(_ask(SCRIPTED, "hello"))
        finally:
            await client.aclose()  # type: ignore[attr-defined]
        assert message_text(real) == "a real answer"  # was the echo, silently
        assert message_text(echoed) == "You said: hello"
        assert len(fake.requests) == 1
        assert client.model_info(OPENAI) is not None and client.model_info(SCRIPTED) is not None


@pytest.mark.parametrize(
    ("profile_model", "env", "said"),
    [
        (
            "anthropic:claude-sonnet-5-5",
            {},
            "profile claude: model='anthropic:claude-sonnet-5-5' needs an API key: set "
            "ANTHROPIC_API_KEY",
        ),
        (
            "openai-compatible:llama",
            {"OPENAI_API_KEY": "sk-x"},
            "profile claude: model='openai-compatible:llama' needs the server's URL: "
            "GATEWAY_MODEL_BASE_URL, with GATEWAY_MODEL of the same provider",
        ),
        (
            "nowhere:model",
            {},
            "profile claude: model='nowhere:model': expected provider:model_id with a provider "
            "among openai, openai-responses, anthropic, openai-compatible, scripted",
        ),
    ],
)
def test_a_profile_model_that_cannot_be_served_is_one_line_at_start(
    monkeypatch: pytest.MonkeyPatch, profile_model: str, env: dict[str, str], said: str
) -> None:
    for variable in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    settings = Settings(profiles=(Profile(name="claude", model=profile_model),))
    with pytest.raises(ModelConfigError) as refused:
        model_from_settings(settings)
    assert str(refused.value) == said
