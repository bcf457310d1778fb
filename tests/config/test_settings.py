"""Settings: defaults, environment, and refusal of unknown GATEWAY_* variables."""

from __future__ import annotations

import pytest

from config import Settings, UnknownSetting, load_settings


def test_the_embedded_default_store() -> None:
    assert load_settings({}).store_url == "sqlite:///.gateway/gateway.db"


def test_the_store_comes_from_the_environment() -> None:
    settings = load_settings({"GATEWAY_STORE_URL": "redis://cache:6379/2", "PATH": "/bin"})
    assert settings == Settings(store_url="redis://cache:6379/2")


def test_a_misspelt_variable_is_an_error_naming_it() -> None:
    with pytest.raises(UnknownSetting) as caught:
        load_settings({"GATEWAY_STORE_ULR": "sqlite:///x.db"})
    assert "GATEWAY_STORE_ULR" in str(caught.value)
    assert "GATEWAY_STORE_URL" in str(caught.value)


def test_the_process_environment_is_read(monkeypatch) -> None:
    monkeypatch.setenv("GATEWAY_STORE_URL", "memory://")
    assert load_settings().store_url == "memory://"
