"""The service's settings, read from ``GATEWAY_*`` environment variables (and a ``.env`` file)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["BusyPolicy", "LogLevel", "Route", "Settings", "UnknownSetting", "load_settings"]


BusyPolicy = Literal["steer", "follow_up", "next_run"]
LogLevel = Literal["debug", "info", "warning", "error"]


class Route(BaseModel):
    """Threads of a channel's space go to a session (several spaces may share one session)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    channel: str = Field(description="web, slack, email...")
    space: str = Field(
        default="*", description="A web space, a Slack channel id, an email address; * for all."
    )
    session: str = Field(description="The session the threads become lanes of.")


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
    redis_url: str | None = Field(
        default=None,
        description="A Redis server (redis://host:port/db, rediss:// for TLS): store and broker "
        "both live there unless store_url/broker_url say otherwise; several `gateway serve` "
        "processes share it.",
    )
    broker_url: str | None = Field(
        default=None,
        description="Where the inbox, outbox and audit trail live: sqlite:///file.db or "
        "redis://... (default: redis_url, else sqlite:///.gateway/broker.db).",
    )
    host: str = Field(default="127.0.0.1", description="The HTTP server's address.")
    port: int = Field(default=8787, ge=1, le=65535, description="The HTTP server's port.")
    routes: tuple[Route, ...] = Field(
        default=(),
        description="Channel -> session bindings, first match wins; a thread whose space no "
        "route names goes to the session `<channel>-<space>`.",
    )
    busy_policy: BusyPolicy = Field(
        default="steer",
        description="What a message does to a lane that is busy: steer the running operation "
        "(seen at its next checkpoint), follow_up (taken when it would stop) or next_run.",
    )
    worker_slots: int = Field(
        default=4, ge=1, le=128, description="Sessions one process works on at once."
    )
    lease_seconds: float = Field(
        default=30.0, ge=3, le=300, description="A session's writer lease (takeover after it)."
    )
    renew_seconds: float = Field(
        default=5.0, gt=0, description="How often a working session's lease is renewed."
    )
    max_attempts: int = Field(
        default=3,
        ge=1,
        le=20,
        description="Interrupted executions of one operation before its lane is parked stuck.",
    )
    drain_seconds: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="On SIGTERM: how long running steps get to reach a checkpoint.",
    )
    inbox_dedupe_seconds: float = Field(
        default=86_400.0, ge=60, description="How long a message id is remembered (dedupe)."
    )
    outbox_max_attempts: int = Field(
        default=12, ge=1, le=100, description="Delivery attempts before a dead letter."
    )
    outbox_lease_seconds: float = Field(
        default=60.0, gt=0, description="How long one delivery attempt may take."
    )
    outbox_max_delay_seconds: float = Field(
        default=3600.0, gt=0, description="The longest wait between delivery attempts."
    )
    log_level: LogLevel = Field(default="info", description="debug, info, warning or error.")


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
