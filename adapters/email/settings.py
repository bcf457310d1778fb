"""The email channel's settings section (``[email]`` in TOML, ``GATEWAY_EMAIL_*`` variables)."""

from __future__ import annotations

import ssl
from typing import Any, ClassVar, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from config.fields import EMAIL, Relation, Relations, comma_separated, is_host, is_loopback
from config.sections import Section

__all__ = ["EmailSettings"]


class EmailSettings(Section):
    """The bot's mailbox: its address, servers, login, approvers and limits."""

    ACCEPTS: ClassVar[dict[str, str]] = {
        "address": "an email address like bot@example.com",
        "password": "the mailbox password (not empty)",
        "link_secret": "a random secret of 32+ characters",
        "approvers": "addresses, comma-separated (a list in TOML)",
        "imap_host": "an IP address or a host name",
        "smtp_host": "an IP address or a host name",
    }

    EXAMPLES: ClassVar[dict[str, Any]] = {
        "address": "agent@example.com",
        "imap_host": "imap.example.com",
        "smtp_host": "smtp.example.com",
        "username": "agent@example.com",
        "password": "...",
        "ca_file": "/etc/ssl/certs/ca-certificates.crt",
        "approvers": ["ops-lead@example.com"],
        "link_secret": "a-random-secret-of-at-least-32-characters",
    }

    address: str | None = Field(
        default=None,
        description="The bot's email address: setting it (with the IMAP and SMTP hosts and the "
        "password) turns the email channel on.",
    )
    name: str = Field(
        default="Agent", min_length=1, max_length=100, description="The From name of replies."
    )
    imap_host: str | None = Field(default=None, description="The IMAP server.")
    imap_port: int = Field(default=993, ge=1, le=65535, description="The IMAP port.")
    imap_security: Literal["tls", "none"] = Field(
        default="tls",
        description="IMAP over TLS (IMAPS), or none (only to a loopback address).",
    )
    smtp_host: str | None = Field(default=None, description="The SMTP submission server.")
    smtp_port: int = Field(default=587, ge=1, le=65535, description="The SMTP port.")
    smtp_security: Literal["starttls", "tls", "none"] = Field(
        default="starttls",
        description="SMTP with STARTTLS (port 587), implicit TLS (465), or none (loopback only).",
    )
    username: str | None = Field(
        default=None, description="The IMAP and SMTP login (default: email_address)."
    )
    password: SecretStr | None = Field(
        default=None, description="The IMAP and SMTP password (never logged or stored)."
    )
    ca_file: str | None = Field(
        default=None,
        description="A CA bundle (PEM) to trust for IMAP and SMTP (a private server's CA).",
    )
    folder: str = Field(default="INBOX", min_length=1, description="The folder read.")
    sent_folder: str = Field(
        default="Sent", min_length=1, description="Where sent replies are filed (and looked for)."
    )
    max_message_bytes: int = Field(
        default=35_000_000,
        ge=10_000,
        le=100_000_000,
        description="Larger mail is never downloaded: its header is read and the sender told. "
        "The default takes a message's 25 MB of files, which base64 makes a third larger.",
    )
    poll_seconds: float = Field(
        default=60.0,
        ge=1,
        le=3600,
        description="How often the folder is checked when the server has no IDLE.",
    )
    replies_per_hour: int = Field(
        default=20,
        ge=1,
        le=1000,
        description="Replies one email thread may get per hour (a loop that slips through the "
        "auto-reply checks stops here).",
    )
    replies_per_address_per_hour: int = Field(
        default=100,
        ge=1,
        le=100_000,
        description="Replies one address may get per hour across its threads (an auto-responder "
        "that answers without threading headers starts a new thread each time: it stops here).",
    )
    working_after_seconds: float = Field(
        default=0.0,
        ge=0,
        le=86_400,
        description="A run still working this long after a mail started it sends one short "
        '"working on it" reply first (0: never).',
    )
    approvers: tuple[str, ...] = Field(
        default=(),
        description="Addresses whose signed approval links work (comma-separated).",
    )
    link_secret: SecretStr | None = Field(
        default=None,
        description="The key that signs approval links in email (32+ characters); without it "
        "an email approval request says to decide elsewhere.",
    )

    @property
    def enabled(self) -> bool:
        """Whether the email channel runs (its address is set)."""
        return self.address is not None

    @field_validator("ca_file")
    @classmethod
    def _ca_file(cls, value: str | None) -> str | None:
        """A bundle that loads: a missing or foreign file failed at start as an unexpected error."""
        if value is None:
            return None
        try:
            ssl.create_default_context(cafile=value)
        except FileNotFoundError:
            raise ValueError("no such file: expected a CA bundle (PEM)") from None
        except IsADirectoryError:
            raise ValueError("a directory: expected a CA bundle (PEM) file") from None
        except PermissionError:
            raise ValueError("cannot be read (permission denied)") from None
        except (ssl.SSLError, OSError, ValueError):
            raise ValueError("holds no certificate: expected a CA bundle (PEM)") from None
        return value

    @field_validator("address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None and not EMAIL.fullmatch(value):
            raise ValueError(f"expected {cls.accepted('address')}")
        return None if value is None else value.lower()

    @field_validator("approvers", mode="before")
    @classmethod
    def _approvers_text(cls, value: Any) -> Any:
        return comma_separated(value)  # a variable: comma-separated

    @field_validator("approvers")
    @classmethod
    def _approvers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for address in value:
            if not EMAIL.fullmatch(address):
                raise ValueError(f"{address!r} is not an email address")
        return tuple(address.lower() for address in value)

    @field_validator("imap_host", "smtp_host")
    @classmethod
    def _host(cls, value: str | None) -> str | None:
        if value is not None and not is_host(value):
            raise ValueError("expected an IP address or a host name (no scheme, no port)")
        return value

    @field_validator("password")
    @classmethod
    def _password(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().strip():
            raise ValueError(f"expected {cls.accepted('password')}")
        return value

    @field_validator("link_secret")
    @classmethod
    def _link_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 32:
            raise ValueError("expected a secret of at least 32 characters")
        return value

    @model_validator(mode="after")
    def _relations(self) -> EmailSettings:
        problems: list[Relation] = []
        given = [
            name
            for name in ("imap_host", "smtp_host", "password", "username", "ca_file", "link_secret")
            if getattr(self, name) is not None
        ] + (["approvers"] if self.approvers else [])
        if self.address is None and given:  # it would start with email off, and say nothing
            said = ", ".join(f"email_{name}" for name in given)
            problems.append(
                Relation(
                    ("address", *given),
                    f"{said} {'is' if len(given) == 1 else 'are'} set but email_address is not: "
                    "the email channel runs only with its address (GATEWAY_EMAIL_ADDRESS, or "
                    "address under [email])",
                )
            )
        if self.address is not None:
            missing = [
                name
                for name in ("imap_host", "smtp_host", "password")
                if getattr(self, name) is None
            ]
            if missing:
                said = ", ".join(f"email_{name}" for name in missing)
                named = ", ".join(f"GATEWAY_EMAIL_{name.upper()}" for name in missing)
                problems.append(
                    Relation(
                        ("address", *missing),
                        f"the email channel needs {said} too ({named}, or the same keys without "
                        "email_ under [email])",
                    )
                )
        for security, host in (
            ("imap_security", self.imap_host),
            ("smtp_security", self.smtp_host),
        ):
            if getattr(self, security) == "none" and host is not None and not is_loopback(host):
                problems.append(
                    Relation(
                        (security, security.replace("security", "host")),
                        "mail without TLS is allowed only to a loopback address (the password "
                        "would cross the network in clear text)",
                    )
                )
        if problems:
            raise Relations(problems)
        return self
