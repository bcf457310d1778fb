"""A whole `Service` answering mail at a real Dovecot and aiosmtpd, and a person who writes to it.

What the email end-to-end tests share: `mail_service` starts the service with the email channel
pointed at a fresh bot mailbox (the test's plugin and any extra settings), and yields a
`MailDesk` whose person writes mails (with attachments) and reads the bot's replies.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from pathlib import Path
from typing import Any

from gateway.channels import gateway_settings
from gateway.service import Service
from tests.support.mail_servers import Dovecot, MailUser, SmtpServer

__all__ = ["MailDesk", "mail_service", "plain_text"]


class MailDesk:
    """The running service, the bot's mailbox and the person writing to it."""

    def __init__(self, service: Service, dovecot: Dovecot, bot: MailUser, person: MailUser):
        self.service = service
        self.dovecot = dovecot
        self.bot = bot
        self.person = person

    def write(
        self, text: str, *files: tuple[str, bytes, str], subject: str = "Numbers"
    ) -> EmailMessage:
        """Deliver a mail from the person to the bot: `files` are (name, content, media type)."""
        message = EmailMessage()
        message["From"] = f"Person <{self.person.address}>"
        message["To"] = self.bot.address
        message["Date"] = format_datetime(datetime.now(UTC))
        message["Message-ID"] = make_msgid(domain="example.test")
        message["Subject"] = subject
        message.set_content(text)
        for name, content, media_type in files:
            main, sub = media_type.split("/")
            message.add_attachment(content, main, sub, filename=name)
        self.dovecot.deliver(self.bot, bytes(message), sender=self.person.address)
        return message

    def received(self, subject: str = "") -> list[EmailMessage]:
        """The bot's mails in the person's mailbox now (those whose subject holds `subject`)."""
        return [
            m
            for m in self.dovecot.parsed_messages(self.person)
            if self.bot.address in str(m.get("From", "")) and subject in str(m.get("Subject", ""))
        ]

    async def replies(
        self, count: int, *, subject: str = "", timeout_s: float = 15.0
    ) -> list[EmailMessage]:
        """Wait until the person holds `count` of the bot's mails; returns them."""
        deadline = time.monotonic() + timeout_s
        while len(found := self.received(subject)) < count:
            assert time.monotonic() < deadline, [str(m["Subject"]) for m in found]
            await asyncio.sleep(0.1)
        return found


def plain_text(message: EmailMessage) -> str:
    """A mail's plain-text body."""
    body = message.get_body(("plain",))
    assert body is not None
    return str(body.get_content())


@contextlib.asynccontextmanager
async def mail_service(
    tmp_path: Path, dovecot: Dovecot, *, plugin: str, **settings: Any
) -> AsyncIterator[MailDesk]:
    """The service answering a fresh bot mailbox (SQLite everywhere, in `tmp_path`)."""
    bot = dovecot.fresh_user("bot")
    person = dovecot.fresh_user("person")
    with SmtpServer(dovecot, username=bot.address, password=bot.password) as smtp:
        service = Service(
            gateway_settings(
                store_url=f"sqlite:///{tmp_path}/store.db",
                broker_url=f"sqlite:///{tmp_path}/broker.db",
                web_url=f"sqlite:///{tmp_path}/web.db",
                plugin=plugin,
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
                **settings,
            )
        )
        await service.start()
        try:
            yield MailDesk(service, dovecot, bot, person)
        finally:
            await service.stop(drain_seconds=2)
