"""Email's one "working on it" reply (D214): sent once when a run outlasts the setting, else none.

The whole service against a real Dovecot and aiosmtpd, the scripted agent of
`tests.support.gateway_agent` (``/slow <ms>`` calls a tool that takes that long). With
``GATEWAY_EMAIL_WORKING_AFTER_SECONDS`` at 0.5 a slow run's thread gets the notice and then its
answer; a quick run gets only its answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from pathlib import Path

import pytest

from gateway.channels import gateway_settings
from gateway.replies import WORKING_TEXT
from gateway.service import Service
from tests.support.mail_servers import Dovecot, MailUser, SmtpServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


class Mail:
    def __init__(self, dovecot: Dovecot, bot: MailUser, person: MailUser) -> None:
        self.dovecot = dovecot
        self.bot = bot
        self.person = person

    def write(self, text: str, subject: str) -> None:
        message = EmailMessage()
        message["From"] = f"Person <{self.person.address}>"
        message["To"] = self.bot.address
        message["Date"] = format_datetime(datetime.now(UTC))
        message["Message-ID"] = make_msgid(domain="example.test")
        message["Subject"] = subject
        message.set_content(text)
        self.dovecot.deliver(self.bot, bytes(message), sender=self.person.address)

    def replies(self, subject: str) -> list[str]:
        return [
            str(body.get_content()).strip()
            for m in self.dovecot.parsed_messages(self.person)
            if self.bot.address in str(m.get("From", "")) and subject in str(m["Subject"])
            if (body := m.get_body(("plain",))) is not None
        ]

    async def until(self, subject: str, count: int) -> list[str]:
        deadline = time.monotonic() + 20
        while len(found := self.replies(subject)) < count:
            assert time.monotonic() < deadline, found
            await asyncio.sleep(0.1)
        return found


@pytest.fixture
async def mail(tmp_path: Path, dovecot: Dovecot) -> AsyncIterator[Mail]:
    bot = dovecot.fresh_user("bot")
    person = dovecot.fresh_user("person")
    with SmtpServer(dovecot, username=bot.address, password=bot.password) as smtp:
        service = Service(
            gateway_settings(
                store_url=f"sqlite:///{tmp_path}/store.db",
                broker_url=f"sqlite:///{tmp_path}/broker.db",
                web_url=f"sqlite:///{tmp_path}/web.db",
                plugin="tests.support.gateway_agent",
                email_address=bot.address,
                email_imap_host="127.0.0.1",
                email_imap_port=dovecot.port,
                email_imap_security="none",
                email_smtp_host="127.0.0.1",
                email_smtp_port=smtp.port,
                email_password=bot.password,
                email_ca_file=str(smtp.cert_path),
                email_working_after_seconds=0.5,
            )
        )
        await service.start()
        try:
            yield Mail(dovecot, bot, person)
        finally:
            await service.stop(drain_seconds=2)


async def test_a_slow_run_says_it_is_working_once_then_answers(mail: Mail) -> None:
    mail.write("/slow 2500", "Slow one")
    notice, answer = await mail.until("Slow one", 2)
    assert notice == WORKING_TEXT
    assert answer.startswith("Done:"), answer
    await asyncio.sleep(0.5)
    assert len(mail.replies("Slow one")) == 2


async def test_a_quick_run_only_answers(mail: Mail) -> None:
    mail.write("hello there", "Quick one")
    [answer] = await mail.until("Quick one", 1)
    assert answer == "You said: hello there"
    await asyncio.sleep(1.0)  # past the setting: no notice follows
    assert mail.replies("Quick one") == [answer]
