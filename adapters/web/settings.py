"""The web channel's settings section (``[web]`` in TOML, ``GATEWAY_WEB_*`` variables)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, SecretStr, field_validator

from config import Settings
from config.fields import check_tokens, check_url, token_text
from config.sections import Section

__all__ = ["DEFAULT_WEB_URL", "WebSettings", "web_mailbox_url"]

DEFAULT_WEB_URL = "sqlite:///.gateway/web.db"
_SCHEMES = ("sqlite", "redis", "rediss", "redis+cluster", "rediss+cluster", "memory")


class WebSettings(Section):
    """Where the web channel keeps its threads, and who may use it (the channel is always on)."""

    ACCEPTS: ClassVar[dict[str, str]] = {
        "url": "sqlite:///file.db, redis://host:port/db (rediss:// for TLS, "
        "redis+cluster://host:port for a Redis Cluster) or memory://",
        "tokens": "name:secret tokens, comma-separated (a list in TOML): a name of 1-64 of "
        "a-z 0-9 . _ - and a secret of 24+ printable characters, no spaces",
    }

    EXAMPLES: ClassVar[dict[str, Any]] = {
        "url": "redis://localhost:6379/0",
        "tokens": ["alice:replace-with-24-or-more-characters"],
    }

    url: str | None = Field(
        default=None,
        description="Where the web channel keeps its threads: sqlite:///file.db, redis://... "
        f"or memory:// (default: redis_url, else {DEFAULT_WEB_URL}).",
    )

    tokens: tuple[SecretStr, ...] = Field(
        default=(),
        description="Who may use the web channel: name:secret tokens, comma-separated. With "
        "any, every page and request of the channel needs one (a browser signs in once at "
        "/web/login; a client sends Authorization: Bearer <secret>), and a message or decision "
        "is by the token's name. With none, whoever reaches the port may write, under any name.",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        check_url(value, _SCHEMES, cls.accepted("url"))
        from adapters.web.mailbox import MailboxError, check_mailbox_url

        try:  # a path that is a directory, a bad port: said naming the setting, exit 2
            check_mailbox_url(value)
        except MailboxError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("tokens", mode="before")
    @classmethod
    def _tokens_text(cls, value: Any) -> Any:
        return token_text(value, "name:secret")

    @field_validator("tokens")
    @classmethod
    def _tokens(cls, value: tuple[SecretStr, ...]) -> tuple[SecretStr, ...]:
        return check_tokens(value)

    def logins(self) -> dict[str, str]:
        """The tokens as secret -> name (empty: the channel has no login)."""
        pairs = (token.get_secret_value().partition(":") for token in self.tokens)
        return {secret: name for name, _, secret in pairs}

    def effective_url(self, shared_url: str | None) -> str:
        """The mailbox: `url` when set, else the deployment's Redis (`shared_url`), else SQLite."""
        return self.url or shared_url or DEFAULT_WEB_URL


def web_mailbox_url(settings: Settings) -> str:
    """The web channel's mailbox under `settings` (its section's `url`, else Redis, else SQLite)."""
    return settings.section("web", WebSettings).effective_url(settings.redis_url)
