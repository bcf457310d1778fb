"""`gateway ask`: the configured model on a durable lane, scripted by default, real over HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from config import Settings
from gateway.ask import ask
from gateway.cli import main
from gateway.models import ModelConfigError, model_from_settings
from harness_core.storage import open_repo
from tests.support.fake_llm import FakeLLM, allow_model_requests


@pytest.fixture
async def fake() -> AsyncIterator[FakeLLM]:
    async with FakeLLM() as server:
        yield server


@pytest.fixture
def allowed() -> Iterator[None]:
    with allow_model_requests():
        yield


def test_ask_with_the_default_scripted_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = f"sqlite:///{tmp_path}/gw.db"
    assert main(["ask", "--store", store, "hello", "there"], settings=Settings()) == 0
    assert "You said: hello there" in capsys.readouterr().out
    assert main(["ask", "--store", store, "again"], settings=Settings()) == 0
    assert "You said: again" in capsys.readouterr().out


def test_a_bad_model_setting_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ModelConfigError, match="provider:model_id"):
        model_from_settings(Settings(model="gpt-4"))
    assert main(["ask", "--store", "memory://", "hi"], settings=Settings(model="nope:x")) == 1
    assert "GATEWAY_MODEL='nope:x'" in capsys.readouterr().err


def stored_bytes(directory: Path) -> bytes:
    return b"".join(p.read_bytes() for p in directory.glob("gw.db*"))


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_ask_a_real_provider_over_http(
    tmp_path: Path, fake: FakeLLM, allowed: None, provider: str
) -> None:
    base = fake.openai_base_url if provider == "openai" else fake.anthropic_base_url
    settings = Settings(
        store_url=f"sqlite:///{tmp_path}/gw.db",
        model=f"{provider}:test-model",
        model_api_key=SecretStr("sk-test-SECRET-KEY"),
        model_base_url=base,
    )
    fake.reply("Tuesdays at two.", input_tokens=12, output_tokens=4)
    repo = open_repo(settings.store_url)
    out: list[str] = []
    try:
        assert await ask(repo, settings, "cli:ops", "deploy window?", out) == 0
    finally:
        await repo.close()
    assert out == ["Tuesdays at two.", f"({provider}:test-model: 12 tokens in, 4 out)"]
    sent = fake.last_request
    assert sent is not None
    auth = sent.headers.get("authorization", "") + sent.headers.get("x-api-key", "")
    assert "sk-test-SECRET-KEY" in auth  # the key reached the provider ...
    assert b"sk-test-SECRET-KEY" not in stored_bytes(tmp_path)  # ... and never the store
