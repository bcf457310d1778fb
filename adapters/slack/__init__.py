"""The Slack channel: slack-bolt in (HTTP or Socket Mode), the Web API out."""

from adapters.slack.channel import SlackChannel, SlackStartError

__all__ = ["SlackChannel", "SlackStartError"]
