"""Email attachments reach the model: the whole service against a real Dovecot and aiosmtpd.

A CSV arrives as text and an image as an image in the scripted model's request; a file over
the limit and one of a type the agent does not read are refused, the sender is told by mail,
and nothing of them is held.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from harness_core import ImagePart, TextPart
from tests.support import files_agent
from tests.support.file_samples import CSV, png
from tests.support.mail_servers import Dovecot
from tests.support.mail_service import MailDesk, mail_service, plain_text


@pytest.fixture
async def mail(
    tmp_path: Path, dovecot: Dovecot, request: pytest.FixtureRequest
) -> AsyncIterator[MailDesk]:
    extra: dict[str, Any] = getattr(request, "param", {})
    async with mail_service(tmp_path, dovecot, plugin="tests.support.files_agent", **extra) as desk:
        yield desk


async def test_a_csv_and_an_image_reach_the_model_as_text_and_an_image(mail: MailDesk) -> None:
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
    assert "image: image/png" in plain_text(reply)


@pytest.mark.parametrize("mail", [{"file_max_mb": 0.001}], indirect=True)
async def test_oversize_and_unknown_attachments_are_refused_by_mail_and_not_held(
    mail: MailDesk,
) -> None:
    sent = mail.write(
        "see attached",
        ("huge.log", b"line\n" * 400, "text/plain"),
        ("tool.exe", b"MZ\x90\x00", "application/octet-stream"),
    )
    replies = await mail.replies(2)
    texts = [plain_text(r) for r in replies]
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


def _forward_that_cannot_be_written_again(person: str, bot: str) -> bytes:
    """A forwarded mail (``message/rfc822``, named ``notes.txt``) whose own ``To:`` holds an
    encoded word that decodes to CR LF: Python's mail generator refuses to write it again."""
    inner = (
        b"From: carol@example.test\nTo: =?utf-8?b?" + b"QUJD" * 60
        + b"?= <x@example.test>, =?utf-8?q?=0D=0Ainjected?= <z@example.test>\n"
        b"Subject: notes\nContent-Type: text/plain\n\n\n"
    )  # fmt: skip
    return (
        (
            f"From: Person <{person}>\nTo: {bot}\nSubject: fwd\n"
            "Message-ID: <fwd-crlf@example.test>\nMIME-Version: 1.0\n"
            "Content-Type: multipart/mixed; boundary=B\n\n"
            "--B\nContent-Type: text/plain\n\nsee the attached notes\n"
            "--B\nContent-Type: message/rfc822; name=notes.txt\n"
            "Content-Disposition: attachment; filename=notes.txt\n\n"
        ).encode()
        + inner
        + b"\n--B--\n"
    )


async def test_an_attachment_that_cannot_be_decoded_is_refused_and_the_mail_after_it_answered(
    mail: MailDesk,
) -> None:
    """Taken for "the files cannot be held now", it was tried again and again, for ever: no
    mail to the bot was answered after it (an outside probe)."""
    raw = _forward_that_cannot_be_written_again(mail.person.address, mail.bot.address)
    mail.dovecot.deliver(mail.bot, raw, sender=mail.person.address)
    mail.write("and this one?", subject="After")
    replies = await mail.replies(3, timeout_s=30)
    texts = [plain_text(r) for r in replies]
    [notice] = [t for t in texts if t.startswith("I could not read the file notes.txt")]
    assert "its content could not be decoded" in notice
    assert any("see the attached notes" in t for t in texts)  # the mail itself: answered
    assert len(mail.received("After")) == 1  # and the one after it


def test_the_default_mail_size_takes_a_message_s_files_once_encoded() -> None:
    """At 10 MB a mail with one 9 MB attachment (12.3 MB in base64) was "too large to read",
    though files of up to 10 MB are taken, 25 MB a message (an outside probe)."""
    from adapters.email.settings import EmailSettings
    from config import Settings

    files = Settings().files_per_message_mb * 1_000_000
    assert EmailSettings().max_message_bytes >= files * 4 / 3
