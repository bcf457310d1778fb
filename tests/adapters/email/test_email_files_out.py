"""A tool's file is attached to the email reply: the whole service, real Dovecot and aiosmtpd.

The reply to an ``export`` mail is one message with the text and the CSV attached (its
name, type and bytes); a later reply in the thread carries no attachment, and the thread holds
each reply once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support import report_agent
from tests.support.mail_servers import Dovecot
from tests.support.mail_service import MailDesk, mail_service, plain_text


@pytest.fixture
async def mail(tmp_path: Path, dovecot: Dovecot) -> AsyncIterator[MailDesk]:
    async with mail_service(tmp_path, dovecot, plugin="tests.support.report_agent") as desk:
        yield desk


async def test_a_tools_csv_is_attached_to_the_reply_once(mail: MailDesk) -> None:
    mail.write("please export the tickets")
    [reply] = await mail.replies(1)
    assert reply.get_content_type() == "multipart/mixed"
    assert plain_text(reply).strip() == report_agent.ANSWER
    [attached] = list(reply.iter_attachments())
    assert attached.get_filename() == "tickets.csv"
    assert attached.get_content_type() == "text/csv"
    assert attached.get_payload(decode=True) == report_agent.CSV

    mail.write("thanks")
    replies = await mail.replies(2)
    assert sorted(plain_text(r).strip() for r in replies) == sorted([report_agent.ANSWER, "ok"])
    attachments = [a.get_filename() for r in replies for a in r.iter_attachments()]
    assert attachments == ["tickets.csv"]
