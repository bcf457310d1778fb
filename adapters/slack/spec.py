"""The Slack channel in the registry: on when ``[slack] bot_token`` is set."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import SecretStr

from adapters.channel import ChannelAdapter
from adapters.kit import ChannelContext, ChannelSpec
from adapters.slack.settings import SlackSettings

__all__ = ["SPEC"]


def _secret(value: SecretStr | None) -> str | None:
    return None if value is None else value.get_secret_value()


def _build(section: SlackSettings, context: ChannelContext) -> ChannelAdapter:
    from adapters.slack.channel import SlackChannel

    assert section.bot_token is not None  # `enabled`
    return SlackChannel(
        bot_token=section.bot_token.get_secret_value(),
        signing_secret=_secret(section.signing_secret),
        app_token=_secret(section.app_token),
        api_url=section.api_url,
        approvers=section.approvers,
        working_reaction=section.working_reaction,
        clock=context.clock,
        call_timeout_s=context.call_timeout_s,
        backfill_hours=section.backfill_hours,
        file_host=section.file_host,
        stream=section.stream,
    )


def _describe(section: SlackSettings, context: ChannelContext) -> Sequence[str]:
    if section.app_token is not None:
        return ["  Slack: Socket Mode (mention the bot in a channel it was invited to)"]
    return [f"  Slack: HTTP mode, events and buttons at {context.base_url}/slack/events"]


SPEC = ChannelSpec(
    name="slack",
    section=SlackSettings,
    enabled=lambda section: section.enabled,
    build=_build,
    describe=_describe,
)
