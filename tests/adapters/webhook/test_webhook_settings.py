"""The webhook settings: what turns the channel on, what a secret is, secrets never shown."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from adapters.webhook.settings import WebhookSettings
from adapters.webhook.spec import SPEC
from config import Settings, SettingsError
from gateway.channels import (
    channel_lines,
    channel_secrets,
    enabled_specs,
    load_gateway_settings,
)
from harness_core import SystemClock

SECRET = "whsec_" + base64.b64encode(b"webhook-settings-secret-part-32b").decode()
INBOUND = "whsec_" + base64.b64encode(b"a-separate-inbound-secret-of-32b").decode()
ON = {
    "GATEWAY_WEBHOOK_URL": "https://user:urlpassword@receiver.example.com/hooks?token=q",
    "GATEWAY_WEBHOOK_SECRET": SECRET,
}


def _webhook(settings: Settings) -> WebhookSettings:
    return settings.section("webhook", WebhookSettings)


def _refusal(environ: dict[str, str]) -> str:
    with pytest.raises(SettingsError) as caught:
        load_gateway_settings(environ)
    line = str(caught.value)
    assert "\n" not in line and SECRET not in line and INBOUND not in line
    return line


def test_off_by_default_and_on_with_a_url_and_a_secret() -> None:
    assert not _webhook(load_gateway_settings({})).enabled
    assert [spec.name for spec, _ in enabled_specs(load_gateway_settings({}))] == ["web"]
    settings = load_gateway_settings(
        {
            **ON,
            "GATEWAY_WEBHOOK_APPROVERS": "alice, ops-lead",
            "GATEWAY_WEBHOOK_TIMEOUT_SECONDS": "3",
        }
    )
    section = _webhook(settings)
    assert section.enabled and section.approvers == ("alice", "ops-lead")
    assert [spec.name for spec, _ in enabled_specs(settings)] == ["web", "webhook"]
    assert section.inbound_key() == section.outbound_key() == base64.b64decode(SECRET[6:])
    assert SECRET not in repr(settings)


def test_a_separate_inbound_secret_checks_what_comes_in() -> None:
    section = _webhook(load_gateway_settings({**ON, "GATEWAY_WEBHOOK_INBOUND_SECRET": INBOUND}))
    assert section.inbound_key() == base64.b64decode(INBOUND[6:])
    assert section.outbound_key() == base64.b64decode(SECRET[6:])


def test_the_toml_table_reads_the_same(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(
        f'[webhook]\nurl = "http://127.0.0.1:9000/hooks"\nsecret = "{SECRET}"\n'
        'approvers = ["alice"]\nstatus_url = "http://127.0.0.1:9000/status/"\n'
    )
    section = _webhook(load_gateway_settings({}, config_file=path))
    assert section.approvers == ("alice",)
    assert section.status_url == "http://127.0.0.1:9000/status"  # one slash is added per ask


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"GATEWAY_WEBHOOK_URL": "https://r.example.com"}, "needs both webhook_url and webhook"),
        ({"GATEWAY_WEBHOOK_SECRET": SECRET}, "needs both webhook_url and webhook_secret"),
        (
            {"GATEWAY_WEBHOOK_STATUS_URL": "https://r.example.com/s"},
            "webhook_status_url is set but webhook_url is not",
        ),
        ({**ON, "GATEWAY_WEBHOOK_SECRET": "plain-shared-secret"}, "starts with whsec_"),
        ({**ON, "GATEWAY_WEBHOOK_SECRET": "whsec_" + "A" * 16}, "12 bytes"),
        ({**ON, "GATEWAY_WEBHOOK_INBOUND_SECRET": "whsec_!!"}, "not base64"),
        ({**ON, "GATEWAY_WEBHOOK_URL": "ftp://r.example.com/x"}, "http:// or https://"),
        ({**ON, "GATEWAY_WEBHOOK_URL": "https:///nohost"}, "with a host"),
        # each was found only by the first request, or stopped the service without a word
        ({**ON, "GATEWAY_WEBHOOK_URL": "http://127.0.0.1:99999/hook"}, "port from 1 to 65535"),
        ({**ON, "GATEWAY_WEBHOOK_URL": "http://h:abc/hook"}, "port from 1 to 65535"),
        ({**ON, "GATEWAY_WEBHOOK_URL": "http://h:1:1/hook"}, "port from 1 to 65535"),
        ({**ON, "GATEWAY_WEBHOOK_URL": "http://h/hook\n"}, "without spaces or control"),
        ({**ON, "GATEWAY_WEBHOOK_URL": "http://h/hook "}, "without spaces or control"),
        (
            {**ON, "GATEWAY_WEBHOOK_STATUS_URL": "https://h/status?key=abc"},
            "with no ?query or #fragment",
        ),
        ({**ON, "GATEWAY_WEBHOOK_APPROVERS": "alice, bob smith"}, "is not an author id"),
        ({**ON, "GATEWAY_WEBHOOK_TOLERANCE_SECONDS": "5"}, "tolerance_seconds"),
    ],
)
def test_what_cannot_work_is_one_line_naming_it(environ: dict[str, str], expected: str) -> None:
    assert expected in _refusal(environ)


def test_secrets_are_redacted_and_the_banner_shows_no_credentials() -> None:
    settings = load_gateway_settings({**ON, "GATEWAY_WEBHOOK_INBOUND_SECRET": INBOUND})
    hidden = channel_secrets(settings)
    assert {SECRET, INBOUND, "urlpassword"} <= set(hidden)
    [line] = [x for x in channel_lines(settings, SystemClock()) if "Webhook" in x]
    assert "https://receiver.example.com/hooks" in line and "/webhook/events" in line
    assert "urlpassword" not in line and "token=q" not in line and "user" not in line
    assert sorted(SPEC.secrets(_webhook(settings))) == sorted([SECRET, INBOUND, "urlpassword"])
