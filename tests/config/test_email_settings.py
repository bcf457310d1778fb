"""The email settings: what turns the channel on, TLS except to loopback, secrets never shown."""

from __future__ import annotations

import pytest

from adapters.email.settings import EmailSettings
from config import Settings, SettingsError
from gateway.channels import load_gateway_settings

PASSWORD = "mailbox-password-secretpart"
ON = {
    "GATEWAY_EMAIL_ADDRESS": "Agent@Example.com",
    "GATEWAY_EMAIL_IMAP_HOST": "imap.example.com",
    "GATEWAY_EMAIL_SMTP_HOST": "smtp.example.com",
    "GATEWAY_EMAIL_PASSWORD": PASSWORD,
}


def _email(settings: Settings) -> EmailSettings:
    return settings.section("email", EmailSettings)


def _refusal(environ: dict[str, str]) -> str:
    with pytest.raises(SettingsError) as caught:
        load_gateway_settings(environ)
    line = str(caught.value)
    assert "\n" not in line and PASSWORD not in line
    return line


def test_the_email_channel_with_safe_defaults() -> None:
    settings = load_gateway_settings(ON)
    assert _email(settings).address == "agent@example.com"
    assert (_email(settings).imap_port, _email(settings).imap_security) == (993, "tls")
    assert (_email(settings).smtp_port, _email(settings).smtp_security) == (587, "starttls")
    assert _email(settings).password is not None and PASSWORD not in repr(settings)


def test_an_address_alone_names_what_is_missing() -> None:
    line = _refusal({"GATEWAY_EMAIL_ADDRESS": "bot@example.com"})
    assert "needs email_imap_host, email_smtp_host, email_password too" in line


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"GATEWAY_EMAIL_IMAP_HOST": "imap.x"}, "email_imap_host is set"),
        ({"GATEWAY_EMAIL_PASSWORD": PASSWORD}, "email_password is set"),
        (
            {k: v for k, v in ON.items() if k != "GATEWAY_EMAIL_ADDRESS"},
            "email_imap_host, email_smtp_host, email_password are set",
        ),
        ({"GATEWAY_EMAIL_APPROVERS": "ann@example.com"}, "email_approvers is set"),
    ],
)
def test_half_a_mailbox_without_its_address_is_refused(given: dict[str, str], said: str) -> None:
    """It started with email off and said nothing (an outside probe's half configuration)."""
    line = _refusal(given)
    assert f"{said} but email_address is not: the email channel runs only with its address" in line


@pytest.mark.parametrize("kind", ["IMAP", "SMTP"])
def test_clear_text_mail_only_to_loopback(kind: str) -> None:
    line = _refusal({**ON, f"GATEWAY_EMAIL_{kind}_SECURITY": "none"})
    assert "only to a loopback address" in line
    loopback = {
        **ON,
        f"GATEWAY_EMAIL_{kind}_SECURITY": "none",
        f"GATEWAY_EMAIL_{kind}_HOST": "127.0.0.1",
    }
    assert _email(load_gateway_settings(loopback)).address == "agent@example.com"


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("GATEWAY_EMAIL_ADDRESS", "not-an-address", "expected an email address"),
        ("GATEWAY_EMAIL_APPROVERS", "ok@example.com, nope", "'nope' is not an email address"),
        ("GATEWAY_EMAIL_LINK_SECRET", "short", "at least 32 characters"),
        ("GATEWAY_EMAIL_IMAP_HOST", "imaps://imap.example.com", "expected an IP address or a host"),
        ("GATEWAY_PUBLIC_URL", "gateway.example.com", "expected an http:// or https:// URL"),
        # a CA bundle that cannot load was "unexpected error: FileNotFoundError" at start
        ("GATEWAY_EMAIL_CA_FILE", "/nonexistent/ca.pem", "no such file: expected a CA bundle"),
        ("GATEWAY_EMAIL_CA_FILE", "/etc/hostname", "holds no certificate"),
        ("GATEWAY_EMAIL_CA_FILE", "/etc", "a directory"),
    ],
)
def test_bad_email_values_are_one_line(variable: str, value: str, expected: str) -> None:
    line = _refusal({**ON, variable: value})
    assert expected in line
    assert "short" not in line or variable != "GATEWAY_EMAIL_LINK_SECRET"


def test_approvers_are_comma_separated_and_lowercased() -> None:
    settings = load_gateway_settings(
        {**ON, "GATEWAY_EMAIL_APPROVERS": "Ann@Example.com, bob@example.com"}
    )
    assert _email(settings).approvers == ("ann@example.com", "bob@example.com")


def test_a_blank_password_from_a_file_is_refused(tmp_path) -> None:
    toml = tmp_path / "gateway.toml"
    toml.write_text('email_password = "   "\n', encoding="utf-8")
    with pytest.raises(SettingsError) as caught:
        load_gateway_settings({}, config_file=toml)
    assert "email_password=<hidden>" in str(caught.value)
    assert "expected the mailbox password (not empty)" in str(caught.value)
