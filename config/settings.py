"""The service's settings, read from ``GATEWAY_*`` environment variables (and a ``.env`` file)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "UnknownSetting", "load_settings"]


class Settings(BaseSettings):
    """Everything the gateway reads from its environment.

    `load_settings` refuses unknown ``GATEWAY_*`` variables, so a typo fails at start-up
    instead of being ignored. Tests build `Settings(...)` directly.
    """

    model_config = SettingsConfigDict(
        env_prefix="GATEWAY_", env_file=".env", extra="forbid", frozen=True
    )

    store_url: str = Field(
        default="sqlite:///.gateway/gateway.db",
        description="Where sessions live: sqlite:///file.db (embedded default), "
        "redis://host:port/db (distributed), jsonl:///dir or memory://.",
    )
    model: str = Field(
        default="scripted:echo",
        description="The model, as provider:model_id: openai:gpt-4.1-mini, "
        "openai-responses:gpt-5 (background requests), anthropic:claude-sonnet-4-5, "
        "openai-compatible:<model> (with model_base_url: vLLM, Ollama, OpenRouter...), "
        "or scripted:echo (no key needed: repeats the message back).",
    )
    model_api_key: SecretStr | None = Field(
        default=None, description="The provider's API key (never logged or stored)."
    )
    model_base_url: str | None = Field(
        default=None, description="Base URL of an OpenAI-compatible or proxy endpoint."
    )
    model_max_output_tokens: int | None = Field(
        default=None, gt=0, description="Cap on a model answer's tokens (default: the model's)."
    )


class UnknownSetting(ValueError):
    """A ``GATEWAY_*`` variable names no setting (most likely a typo)."""


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read the settings from the environment (called once, by the entry point only).

    Raises:
        UnknownSetting: a ``GATEWAY_*`` variable names no setting.
        pydantic.ValidationError: a setting has an invalid value.
    """
    env = os.environ if environ is None else environ
    known = {f"GATEWAY_{name}".upper() for name in Settings.model_fields}
    unknown = sorted(
        key for key in env if key.upper().startswith("GATEWAY_") and key.upper() not in known
    )
    if unknown:
        raise UnknownSetting(
            f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    if environ is None:
        return Settings()
    return Settings.model_validate(_lowered(environ))


def _lowered(environ: Mapping[str, str]) -> dict[str, str]:
    return {
        key[len("GATEWAY_") :].lower(): value
        for key, value in environ.items()
        if key.upper().startswith("GATEWAY_")
    }
