"""The Slack channel: slack-bolt in (HTTP or Socket Mode), the Web API out.

The channel's modules (slack-bolt, slack_sdk) are imported when first used, so reading the
settings (`adapters.slack.spec`) costs nothing where Slack is off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adapters.slack.channel import SlackChannel, SlackStartError

__all__ = ["SlackChannel", "SlackStartError"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from adapters.slack import channel

        return getattr(channel, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
