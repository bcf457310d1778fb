"""Email attachments reach the model: the whole service against a real Dovecot and aiosmtpd.

A CSV arrives as text and an image as an image in the scripted model's request; a file over
the limit and one of a type the agent does not read are refused, the sender is told by mail,
and nothing of them is held.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from pathlib import Path
from typing import Any

import pytest

from gateway.channels import gateway_settings
from gateway.service import Service
from harness_core import ImagePart, TextPart
from tests.support import files_agent
from tests.support.file_samples import CSV, png
from tests.support.mail_servers import Dovecot, MailUser, SmtpServer


class Mail:
    def __init__(self, service: Service, dovecot: Dovecot, bot: MailUser, person: MailUser):
        self.service = service
        self.dovecot = dovecot
        self.bot = bot
        self.person = person

    def write(self, text: str, *files: tuple[str, bytes, str]) -> EmailMessage:
        message = EmailMessage()
        message["From"] = f"Person <{self.person.address}>"
        message["To"] = self.bot.address
        message["Date"] = format_datetime(datetime.now(UTC))
        message["Message-ID"] = make_msgid(domain="example.test")
        message["Subject"] = "Numbers"
        message.set_content(text)
        for name, content, media_type in files:
            main, sub = media_type.split("/")
            message.add_attachment(content, main, sub, filename=name)
        self.dovecot.deliver(self.bot, bytes(message), sender=self.person.address)
        return message

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
async def mail(
    tmp_path: Path, dovecot: Dovecot, request: pytest.FixtureRequest
) -> AsyncIterator[Mail]:
    bot = dovecot.fresh_user("bot")
    person = dovecot.fresh_user("person")
    extra: dict[str, Any] = getattr(request, "param", {})
    with SmtpServer(dovecot, username=bot.address, password=bot.password) as smtp:
        service = Service(
            gateway_settings(
                store_url=f"sqlite:///{tmp_path}/store.db",
                broker_url=f"sqlite:///{tmp_path}/broker.db",
                web_url=f"sqlite:///{tmp_path}/web.db",
                plugin="tests.support.files_agent",
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
                **extra,
            )
        )
        await service.start()
        try:
            yield Mail(service, dovecot, bot, person)
        finally:
            await service.stop(drain_seconds=2)


def _text(message: EmailMessage) -> str:
    body = message.get_body(("plain",))
    assert body is not None
    return str(body.get_content())


async def test_a_csv_and_an_image_reach_the_model_as_text_and_an_image(mail: Mail) -> None:
    image = png(3, 3)
    mail.write(
        "how did the regions do?", ("q3.csv", CSV, "text/csv"), ("chart.png", image, "image/png")
    )
    [reply] = await mail.replies(1)
    parts = files_agent.newest_user_parts()
    assert isinstance(parts[0], TextPart)
    assert "how did the regions do?" in parts[0].text
    assert "[attachment: q3.csv (text/csv" in parts[0].text
    assert parts[1] == TextPart(text="[file: q3.csv]\n" + CSV.decode())
    assert parts[2] == TextPart(text="[file: chart.png]")
    assert isinstance(parts[3], ImagePart)
    assert parts[3].media_type == "image/png"
    assert base64.b64decode(parts[3].data) == image
    assert "image: image/png" in _text(reply)


@pytest.mark.parametrize("mail", [{"file_max_mb": 0.001}], indirect=True)
async def test_oversize_and_unknown_attachments_are_refused_by_mail_and_not_held(
    mail: Mail,
) -> None:
    sent = mail.write(
        "see attached",
        ("huge.log", b"line\n" * 400, "text/plain"),
        ("tool.exe", b"MZ\x90\x00", "application/octet-stream"),
    )
    replies = await mail.replies(2)
    texts = [_text(r) for r in replies]
    [notice] = [t for t in texts if t.startswith("I could not read these files:")]
    assert "huge.log: it is 2.0 KB, over the 1.0 KB limit for one file" in notice
    assert "tool.exe: I do not read application/octet-stream files" in notice
    [part] = files_agent.newest_user_parts()
    assert isinstance(part, TextPart) and "huge.log" in part.text and "not read" in part.text
    broker = mail.service.broker
    assert broker is not None
    session = f"email-{mail.bot.address}"
    for number in range(1, 3):
        key = f"email:{sent['Message-ID']}:part-{number}"
        assert await broker.blobs.find(session, key) is None
