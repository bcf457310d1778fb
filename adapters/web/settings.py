"""The web channel's settings section (``[web]`` in TOML, ``GATEWAY_WEB_*`` variables)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, field_validator

from config import Settings
from config.fields import check_url
from config.sections import Section

__all__ = ["DEFAULT_WEB_URL", "WebSettings", "web_mailbox_url"]

DEFAULT_WEB_URL = "sqlite:///.gateway/web.db"
_SCHEMES = ("sqlite", "redis", "rediss", "redis+cluster", "rediss+cluster", "memory")


class WebSettings(Section):
    """Where the web channel keeps its threads (the channel is always on)."""

    ACCEPTS: ClassVar[dict[str, str]] = {
        "url": "sqlite:///file.db, redis://host:port/db (rediss:// for TLS, "
        "redis+cluster://host:port for a Redis Cluster) or memory://",
    }

    EXAMPLES: ClassVar[dict[str, Any]] = {"url": "redis://localhost:6379/0"}

    url: str | None = Field(
        default=None,
        description="Where the web channel keeps its threads: sqlite:///file.db, redis://... "
        f"or memory:// (default: redis_url, else {DEFAULT_WEB_URL}).",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else check_url(value, _SCHEMES, cls.accepted("url"))

    def effective_url(self, shared_url: str | None) -> str:
        """The mailbox: `url` when set, else the deployment's Redis (`shared_url`), else SQLite."""
        return self.url or shared_url or DEFAULT_WEB_URL


def web_mailbox_url(settings: Settings) -> str:
    """The web channel's mailbox under `settings` (its section's `url`, else Redis, else SQLite)."""
    return settings.section("web", WebSettings).effective_url(settings.redis_url)
