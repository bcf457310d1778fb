"""The webhook channel's settings (``[webhook]`` in TOML, ``GATEWAY_WEBHOOK_*`` variables)."""

from __future__ import annotations

import re
from typing import Any, ClassVar

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator

from adapters.webhook.signing import secret_key
from config.fields import Relation, Relations, check_http_url, comma_separated
from config.sections import Section

__all__ = ["WebhookSettings"]

_APPROVER = re.compile(r"[^\s,]{1,100}")


class WebhookSettings(Section):
    """Where replies go, the shared secrets, who may approve, and the channel's bounds."""

    ACCEPTS: ClassVar[dict[str, str]] = {
        "url": "an http:// or https:// URL",
        "secret": "a Standard Webhooks secret: whsec_ then base64 of 24 to 64 random bytes",
        "inbound_secret": "a Standard Webhooks secret: whsec_ then base64 of 24 to 64 random bytes",
        "status_url": "an http:// or https:// URL",
        "approvers": "author ids, comma-separated (a list in TOML)",
    }
    EXAMPLES: ClassVar[dict[str, Any]] = {
        "url": "https://receiver.example.com/gateway",
        "secret": "whsec_cGxhY2Vob2xkZXItcmVwbGFjZS1tZS0wMTIz",  # "placeholder-replace-me-0123"
        "inbound_secret": "whsec_YW5vdGhlci1wbGFjZWhvbGRlci1yZXBsYWNlLW1l",
        "status_url": "https://receiver.example.com/gateway/deliveries",
        "approvers": ["alice", "ops-lead"],
    }

    url: str | None = Field(
        default=None,
        description="Where replies are POSTed (signed JSON): setting it with webhook_secret turns "
        "the webhook channel on; messages come in at /webhook/events.",
    )
    secret: SecretStr | None = Field(
        default=None,
        description="The shared secret that signs what the gateway POSTs, and checks what it "
        "receives unless webhook_inbound_secret is set (openssl rand -base64 32, after whsec_).",
    )
    inbound_secret: SecretStr | None = Field(
        default=None,
        description="A separate secret for what the gateway receives at /webhook/events "
        "(default: webhook_secret).",
    )
    status_url: str | None = Field(
        default=None,
        description="Where the gateway asks whether a POST whose answer was lost arrived: GET "
        "<status_url>/<webhook-id>, 2xx yes, 404 no. Without it such a POST is sent again "
        "under the same webhook-id, for the receiver to drop.",
    )
    approvers: tuple[str, ...] = Field(
        default=(),
        description="Author ids whose decisions (approve, deny) are taken; nobody's when empty.",
    )
    timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="How long one POST may take (at most delivery_timeout_seconds); past it the "
        "outcome is unknown and the retry asks or sends again under the same webhook-id.",
    )
    tolerance_seconds: int = Field(
        default=300,
        ge=10,
        le=3600,
        description="How far a request's webhook-timestamp may be from this gateway's clock "
        "(older requests are refused as replays).",
    )
    max_body_bytes: int = Field(
        default=256 * 1024,
        ge=1024,
        le=10_000_000,
        description="The largest request body taken at /webhook/events.",
    )
    max_text_chars: int = Field(
        default=32_000,
        ge=1,
        le=1_000_000,
        description="The longest message text taken (longer messages are refused).",
    )

    @property
    def enabled(self) -> bool:
        """Whether the webhook channel runs (its URL and secret are set)."""
        return self.url is not None and self.secret is not None

    def inbound_key(self) -> bytes:
        """The HMAC key requests to /webhook/events are checked with."""
        secret = self.inbound_secret or self.secret
        assert secret is not None  # `enabled`
        return secret_key(secret.get_secret_value())

    def outbound_key(self) -> bytes:
        """The HMAC key the gateway signs its POSTs with."""
        assert self.secret is not None  # `enabled`
        return secret_key(self.secret.get_secret_value())

    @field_validator("url", "status_url")
    @classmethod
    def _url(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return value
        name = str(info.field_name)
        # the status URL gets /<webhook-id> appended: a query would take it in
        check_http_url(value, cls.accepted(name), query=name != "status_url")
        return value.rstrip("/") if name == "status_url" else value

    @field_validator("secret", "inbound_secret")
    @classmethod
    def _secret(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if value is not None:
            try:
                secret_key(value.get_secret_value())
            except ValueError as exc:
                raise ValueError(f"expected {cls.accepted(str(info.field_name))} ({exc})") from None
        return value

    @field_validator("approvers", mode="before")
    @classmethod
    def _approvers_text(cls, value: Any) -> Any:
        return comma_separated(value)  # a variable: comma-separated

    @field_validator("approvers")
    @classmethod
    def _approvers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for who in value:
            if not _APPROVER.fullmatch(who):
                raise ValueError(f"{who!r} is not an author id (1-100 characters, no spaces)")
        return value

    @model_validator(mode="after")
    def _relations(self) -> WebhookSettings:
        problems: list[Relation] = []
        if (self.url is None) != (self.secret is None):
            problems.append(
                Relation(
                    ("url", "secret"),
                    "the webhook channel needs both webhook_url and webhook_secret",
                )
            )
        if self.url is None:
            extra = [
                name for name in ("inbound_secret", "status_url") if getattr(self, name) is not None
            ]
            if extra:
                said = ", ".join(f"webhook_{name}" for name in extra)
                problems.append(
                    Relation(
                        ("url", *extra),
                        f"{said} is set but webhook_url is not: the webhook channel is off",
                    )
                )
        if problems:
            raise Relations(problems)
        return self
