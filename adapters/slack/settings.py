"""The Slack channel's settings section (``[slack]`` in TOML, ``GATEWAY_SLACK_*`` variables)."""

from __future__ import annotations

import re
from typing import Any, ClassVar

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator

from config.fields import Relation, Relations, check_http_url
from config.sections import Section

__all__ = ["SlackSettings"]

_SLACK_CHANNEL = re.compile(r"[CDG][A-Z0-9]{1,30}")
_SLACK_APPROVER = re.compile(r"[UWS][A-Z0-9]{1,30}")
_TOKEN_PREFIX = {"bot_token": "xoxb-", "app_token": "xapp-"}


class SlackSettings(Section):
    """The Slack app's tokens, who may approve where, and how the channel behaves."""

    ACCEPTS: ClassVar[dict[str, str]] = {
        "bot_token": "a bot token (xoxb-...)",
        "app_token": "an app-level token (xapp-...)",
        "signing_secret": "the app's signing secret (not empty)",
        "api_url": "an http:// or https:// URL",
        "file_host": "an http:// or https:// origin like https://files.slack.com",
        "approvers": 'channel id -> user and user group ids: JSON like {"C0123": ["U0456", '
        '"S0789"], "*": ["U0999"]} in GATEWAY_SLACK_APPROVERS, a [slack.approvers] table in TOML',
        "working_reaction": "a reaction name like eyes or hourglass_flowing_sand, or empty",
    }
    EXAMPLES: ClassVar[dict[str, Any]] = {
        "bot_token": "xoxb-...",
        "signing_secret": "...",
        "app_token": "xapp-...",
        "approvers": {"C0123456789": ["U0123456789", "S0123456789"], "*": ["U0987654321"]},
    }
    JSON_FIELDS: ClassVar[frozenset[str]] = frozenset({"approvers"})
    JSON_EXAMPLES: ClassVar[dict[str, str]] = {
        "approvers": 'a JSON object of channel -> approvers, like {"C0123": ["U0456", "S0789"]}',
    }

    bot_token: SecretStr | None = Field(
        default=None,
        description="The Slack app's bot token (xoxb-...): setting it turns the Slack channel on.",
    )
    signing_secret: SecretStr | None = Field(
        default=None,
        description="The Slack app's signing secret: HTTP mode (events and buttons at "
        "/slack/events, every request's signature checked).",
    )
    app_token: SecretStr | None = Field(
        default=None,
        description="An app-level token (xapp-..., connections:write): Socket Mode instead of "
        "HTTP (no public URL needed).",
    )
    api_url: str = Field(
        default="https://slack.com/api/",
        description="The Slack Web API's base URL (tests point it at a local fake).",
    )
    file_host: str = Field(
        default="https://files.slack.com",
        description="The only origin the bot token is sent to for files people share (tests "
        "point it at a local fake).",
    )
    stream: bool = Field(
        default=True,
        description="Stream each answer into its thread while the model writes it "
        "(chat.startStream); false: every reply is one message. The thread's status shows "
        "either way.",
    )
    approvers: dict[str, tuple[str, ...]] = Field(
        default_factory=dict,
        description="Who may press Approve/Deny, by Slack channel id (* for every channel): "
        "user ids (U...) and user group ids (S...). Nobody may approve in a channel not listed.",
    )
    backfill_hours: float = Field(
        default=24.0,
        ge=0,
        le=720,
        description="On start and on every Socket Mode reconnect, messages posted meanwhile in "
        "threads active this many hours are taken in (0: none).",
    )
    working_reaction: str = Field(
        default="eyes",
        pattern=r"^[a-z0-9_+'-]{0,64}$",
        description="The reaction put on a message while the agent works on it (empty: none).",
    )

    @property
    def enabled(self) -> bool:
        """Whether the Slack channel runs (its bot token is set)."""
        return self.bot_token is not None

    @field_validator("bot_token", "app_token", "signing_secret")
    @classmethod
    def _secret(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if value is None:
            return value
        secret = value.get_secret_value()
        prefix = _TOKEN_PREFIX.get(str(info.field_name), "")
        if not secret.strip() or not secret.startswith(prefix) or any(c.isspace() for c in secret):
            raise ValueError(f"expected {cls.accepted(str(info.field_name))}")
        return value

    @field_validator("api_url")
    @classmethod
    def _api_url(cls, value: str) -> str:
        check_http_url(value, cls.accepted("api_url"), query=False)
        return value if value.endswith("/") else value + "/"

    @field_validator("file_host")
    @classmethod
    def _file_host(cls, value: str) -> str:
        parts = check_http_url(value, cls.accepted("file_host"), query=False)
        if parts.path not in ("", "/"):
            raise ValueError(f"expected {cls.accepted('file_host')}")
        return f"{parts.scheme}://{parts.netloc}"

    @field_validator("approvers")
    @classmethod
    def _approvers(cls, value: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        for channel, people in value.items():
            if channel != "*" and not _SLACK_CHANNEL.fullmatch(channel):
                raise ValueError(f"{channel!r} is not a Slack channel id (like C0123ABCD) or *")
            for who in people:
                if not _SLACK_APPROVER.fullmatch(who):
                    raise ValueError(
                        f"{who!r} (for {channel}) is not a Slack user id (U..., W...) or user "
                        "group id (S...)"
                    )
        return value

    @model_validator(mode="after")
    def _relations(self) -> SlackSettings:
        if self.bot_token is not None and self.signing_secret is None and self.app_token is None:
            raise Relations(
                [
                    Relation(
                        ("bot_token", "signing_secret", "app_token"),
                        "the Slack channel needs slack_signing_secret (HTTP mode: "
                        "GATEWAY_SLACK_SIGNING_SECRET, or signing_secret under [slack]) or "
                        "slack_app_token (Socket Mode: GATEWAY_SLACK_APP_TOKEN, or app_token)",
                    )
                ]
            )
        if self.bot_token is None and (
            self.signing_secret is not None or self.app_token is not None or self.approvers
        ):
            raise Relations(
                [
                    Relation(
                        ("bot_token",),
                        "slack_signing_secret, slack_app_token or slack_approvers is set but "
                        "slack_bot_token is not: the Slack channel needs its bot token (xoxb-...: "
                        "GATEWAY_SLACK_BOT_TOKEN, or bot_token under [slack])",
                    )
                ]
            )
        return self
