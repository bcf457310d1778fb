"""The Slack settings: tokens by kind, one of the two modes, approvers; secrets never shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.slack.settings import SlackSettings
from config import Settings, SettingsError
from gateway.channels import load_gateway_settings

BOT = "xoxb-1234-5678-secretpart"
APP = "xapp-1-A1-secretpart"
SIGNING = "8f742231b10e8888abcd99yyyzzz85a5"


def _slack(settings: Settings) -> SlackSettings:
    return settings.section("slack", SlackSettings)


def _refusal(environ: dict[str, str]) -> str:
    with pytest.raises(SettingsError) as caught:
        load_gateway_settings(environ)
    line = str(caught.value)
    assert "\n" not in line
    for secret in (BOT, APP, SIGNING):
        assert secret not in line
    return line


def test_http_mode_and_socket_mode() -> None:
    http = load_gateway_settings(
        {"GATEWAY_SLACK_BOT_TOKEN": BOT, "GATEWAY_SLACK_SIGNING_SECRET": SIGNING}
    )
    token = _slack(http).bot_token
    assert token is not None and token.get_secret_value() == BOT
    assert _slack(http).app_token is None
    socket = load_gateway_settings({"GATEWAY_SLACK_BOT_TOKEN": BOT, "GATEWAY_SLACK_APP_TOKEN": APP})
    assert _slack(socket).app_token is not None
    assert BOT not in repr(http) and SIGNING not in repr(http) and APP not in repr(socket)


def test_slack_is_off_by_default() -> None:
    settings = load_gateway_settings({})
    assert _slack(settings).bot_token is None
    assert _slack(settings).approvers == {}
    assert _slack(settings).api_url == "https://slack.com/api/"


def test_a_bot_token_without_a_mode_names_both_modes() -> None:
    line = _refusal({"GATEWAY_SLACK_BOT_TOKEN": BOT})
    assert "slack_bot_token=<hidden>" in line
    assert "slack_signing_secret=unset" in line and "slack_app_token=unset" in line
    assert "HTTP mode" in line and "Socket Mode" in line


def test_a_mode_without_a_bot_token_is_refused() -> None:
    line = _refusal({"GATEWAY_SLACK_APP_TOKEN": APP})
    assert "needs its bot token" in line


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("GATEWAY_SLACK_BOT_TOKEN", APP, "expected a bot token (xoxb-...)"),
        ("GATEWAY_SLACK_APP_TOKEN", BOT, "expected an app-level token (xapp-...)"),
        ("GATEWAY_SLACK_BOT_TOKEN", "xoxb- with spaces", "expected a bot token"),
        ("GATEWAY_SLACK_SIGNING_SECRET", "   ", "is set but empty"),
        ("GATEWAY_SLACK_API_URL", "ftp://slack.example", "expected an http:// or https:// URL"),
        ("GATEWAY_SLACK_WORKING_REACTION", "no spaces please", "expected a reaction name"),
    ],
)
def test_a_wrong_token_or_value_is_one_line(variable: str, value: str, expected: str) -> None:
    environ = {"GATEWAY_SLACK_BOT_TOKEN": BOT, "GATEWAY_SLACK_SIGNING_SECRET": SIGNING}
    line = _refusal({**environ, variable: value})
    assert expected in line
    assert value.strip() == "" or "token" not in variable.lower() or value not in line


def test_approvers_by_channel_from_json_and_toml(tmp_path: Path) -> None:
    environ = {
        "GATEWAY_SLACK_BOT_TOKEN": BOT,
        "GATEWAY_SLACK_SIGNING_SECRET": SIGNING,
        "GATEWAY_SLACK_APPROVERS": '{"C0123": ["U0456", "S0789"], "*": ["W0999"]}',
    }
    settings = load_gateway_settings(environ)
    assert _slack(settings).approvers == {"C0123": ("U0456", "S0789"), "*": ("W0999",)}
    toml = tmp_path / "gateway.toml"
    toml.write_text('[slack_approvers]\nC0123 = ["U0456"]\n"*" = ["S0789"]\n', encoding="utf-8")
    tokens = {k: v for k, v in environ.items() if k != "GATEWAY_SLACK_APPROVERS"}
    from_file = load_gateway_settings(tokens, config_file=toml)
    assert _slack(from_file).approvers == {"C0123": ("U0456",), "*": ("S0789",)}
    with pytest.raises(SettingsError, match="slack_approvers is set but slack_bot_token is not"):
        load_gateway_settings({}, config_file=toml)  # Slack off: the approvers would do nothing


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("{bad", "is not JSON"),
        ('{"general": ["U0456"]}', "'general' is not a Slack channel id"),
        ('{"C0123": ["alice"]}', "'alice' (for C0123) is not a Slack user id"),
        ('{"C0123": 5}', "slack_approvers.C0123=5"),
        ('["U0456"]', "slack_approvers="),
    ],
)
def test_bad_approvers_are_one_line(value: str, expected: str) -> None:
    line = _refusal({"GATEWAY_SLACK_APPROVERS": value})
    assert expected in line
