"""Fixtures of the email tests: one real Dovecot per session, an SMTP server per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.mail_servers import Dovecot, MailUser, SmtpServer


@pytest.fixture(scope="session")
def dovecot() -> Iterator[Dovecot]:
    """One Dovecot for the whole run; tests isolate themselves with ``dovecot.fresh_user()``."""
    with Dovecot() as server:
        yield server


@pytest.fixture
def mail_user(dovecot: Dovecot) -> MailUser:
    """A user no other test uses, with an empty INBOX."""
    return dovecot.fresh_user()


@pytest.fixture
def smtp_server(dovecot: Dovecot) -> Iterator[SmtpServer]:
    """STARTTLS + AUTH SMTP (login ``bot@example.test``/``secret``) delivering into ``dovecot``."""
    with SmtpServer(dovecot) as server:
        yield server
