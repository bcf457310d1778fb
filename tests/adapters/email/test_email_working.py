"""Email's one "working on it" reply (D214): sent once when a run outlasts the setting, else none.

The whole service against a real Dovecot and aiosmtpd, the scripted agent of
`tests.support.gateway_agent` (``/slow <ms>`` calls a tool that takes that long). With
``GATEWAY_EMAIL_WORKING_AFTER_SECONDS`` at 0.5 a slow run's thread gets the notice and then its
answer; a quick run gets only its answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from email.message import EmailMessage
from pathlib import Path

import pytest

from gateway.replies import WORKING_TEXT
from tests.support.mail_servers import Dovecot
from tests.support.mail_service import MailDesk, mail_service, plain_text

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


@pytest.fixture
async def mail(tmp_path: Path, dovecot: Dovecot) -> AsyncIterator[MailDesk]:
    async with mail_service(
        tmp_path, dovecot, plugin="tests.support.gateway_agent", email_working_after_seconds=0.5
    ) as desk:
        yield desk


def _texts(mails: list[EmailMessage]) -> list[str]:
    return [plain_text(m).strip() for m in mails]


async def test_a_slow_run_says_it_is_working_once_then_answers(mail: MailDesk) -> None:
    mail.write("/slow 2500", subject="Slow one")
    notice, answer = _texts(await mail.replies(2, subject="Slow one", timeout_s=20))
    assert notice == WORKING_TEXT
    assert answer.startswith("Done:"), answer
    await asyncio.sleep(0.5)
    assert len(mail.received("Slow one")) == 2


async def test_a_quick_run_only_answers(mail: MailDesk) -> None:
    mail.write("hello there", subject="Quick one")
    [answer] = _texts(await mail.replies(1, subject="Quick one", timeout_s=20))
    assert answer == "You said: hello there"
    await asyncio.sleep(1.0)  # past the setting: no notice follows
    assert _texts(mail.received("Quick one")) == [answer]
