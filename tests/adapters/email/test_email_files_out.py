"""A tool's file is attached to the email reply: the whole service, real Dovecot and aiosmtpd.

The reply to an ``export`` mail is one message with the text and the CSV attached (its
name, type and bytes); a later reply in the thread carries no attachment, and the thread holds
each reply once.
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
from gateway.service import Service
from tests.support import report_agent
from tests.support.mail_servers import Dovecot, MailUser, SmtpServer


class Mail:
    def __init__(self, dovecot: Dovecot, bot: MailUser, person: MailUser) -> None:
        self.dovecot = dovecot
        self.bot = bot
        self.person = person

    def write(self, text: str) -> None:
        message = EmailMessage()
        message["From"] = f"Person <{self.person.address}>"
        message["To"] = self.bot.address
        message["Date"] = format_datetime(datetime.now(UTC))
        message["Message-ID"] = make_msgid(domain="example.test")
        message["Subject"] = "Tickets"
        message.set_content(text)
        self.dovecot.deliver(self.bot, bytes(message), sender=self.person.address)

    async def replies(self, count: int, timeout_s: float = 15.0) -> list[EmailMessage]:
        deadline = time.monotonic() + timeout_s
        while True:
            found = [
                m
                for m in self.dovecot.parsed_messages(self.person)
                if self.bot.address in str(m.get("From", ""))
            ]
            if len(found) >= count:
                return found
            assert time.monotonic() < deadline, [str(m["Subject"]) for m in found]
            await asyncio.sleep(0.1)


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
                plugin="tests.support.report_agent",
                email_address=bot.address,
                email_imap_host="127.0.0.1",
                email_imap_port=dovecot.port,
                email_imap_security="none",
                email_smtp_host="127.0.0.1",
                email_smtp_port=smtp.port,
                email_password=bot.password,
                email_ca_file=str(smtp.cert_path),
                routes=(
                    {"channel": "email", "space": bot.address, "session": f"email-{bot.address}"},
                ),
            )
        )
        await service.start()
        try:
            yield Mail(dovecot, bot, person)
        finally:
            await service.stop(drain_seconds=2)


def _text(message: EmailMessage) -> str:
    body = message.get_body(("plain",))
    assert body is not None
    return str(body.get_content())


async def test_a_tools_csv_is_attached_to_the_reply_once(mail: Mail) -> None:
    mail.write("please export the tickets")
    [reply] = await mail.replies(1)
    assert reply.get_content_type() == "multipart/mixed"
    assert _text(reply).strip() == report_agent.ANSWER
    [attached] = list(reply.iter_attachments())
    assert attached.get_filename() == "tickets.csv"
    assert attached.get_content_type() == "text/csv"
    assert attached.get_payload(decode=True) == report_agent.CSV

    mail.write("thanks")
    replies = await mail.replies(2)
    assert sorted(_text(r).strip() for r in replies) == sorted([report_agent.ANSWER, "ok"])
    attachments = [a.get_filename() for r in replies for a in r.iter_attachments()]
    assert attachments == ["tickets.csv"]
