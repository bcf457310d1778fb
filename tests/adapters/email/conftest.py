"""Fixtures of the email tests: a fresh mail user and an SMTP server per test.

The Dovecot they share (one per session) is `tests/adapters/conftest.py`'s.

At the end of a run that took the reply corpus (``test_corpus.py``), its accuracy is printed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.mail_servers import Dovecot, MailUser, SmtpServer


@pytest.fixture
def mail_user(dovecot: Dovecot) -> MailUser:
    """A user no other test uses, with an empty INBOX."""
    return dovecot.fresh_user()


@pytest.fixture
def smtp_server(dovecot: Dovecot) -> Iterator[SmtpServer]:
    """STARTTLS + AUTH SMTP (login ``bot@example.test``/``secret``) delivering into ``dovecot``."""
    with SmtpServer(dovecot) as server:
        yield server


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print how many corpus mails gave their expected reply text, by client."""
    from tests.adapters.email.corpus_score import SCORES

    if not SCORES:
        return
    exact = sum(SCORES.values())
    terminalreporter.section("email reply corpus: extraction accuracy")
    terminalreporter.write_line(
        f"  {exact} of {len(SCORES)} mails give exactly the text their sender wrote "
        f"({100 * exact / len(SCORES):.1f}%)"
    )
    families: dict[str, list[bool]] = {}
    for name, ok in sorted(SCORES.items()):
        families.setdefault(name.split("-", 1)[0], []).append(ok)
    terminalreporter.write_line(
        "  " + ", ".join(f"{family} {sum(oks)}/{len(oks)}" for family, oks in families.items())
    )
    missed = sorted(name for name, ok in SCORES.items() if not ok)
    if missed:
        terminalreporter.write_line(f"  missed: {', '.join(missed)}")
