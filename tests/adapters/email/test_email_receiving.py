"""The receiving loop against a real Dovecot: no mail waits for the next IDLE renewal.

New mail is announced once, as an untagged ``* n EXISTS`` in the response to whatever command
the connection runs when the server notices it. Each case below delivers a mail (with
``dovecot-lda``, as an MTA does) at the moment one of the loop's commands is about to go out,
so its ``EXISTS`` arrives inside that command's response, and the mail must be taken at once:
the IDLE renewal (5 minutes) and the poll interval (10 minutes here) are far beyond the wait.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from itertools import count
from typing import Any

import pytest

from adapters.email import EmailChannel
from adapters.email.imap import ImapConnection
from tests.adapters.kit import TestSink
from tests.support.mail_servers import Dovecot, MailUser

_ids = count()


def _mail(text: str) -> bytes:
    return (
        f"From: Person <person@example.test>\r\nTo: bot@example.test\r\nSubject: {text}\r\n"
        f"Message-ID: <{text.replace(' ', '-')}-{next(_ids)}@example.test>\r\n"
        f"Date: Mon, 30 Nov 2026 14:00:00 +0000\r\n\r\n{text}\r\n"
    ).encode()


async def _until(check: Callable[[], bool], timeout_s: float, what: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what()
        await asyncio.sleep(0.02)


class Receiving:
    """A started channel on a fresh mailbox, idling, with its watermark at the start."""

    def __init__(self, channel: EmailChannel, sink: TestSink, dovecot: Dovecot, bot: MailUser):
        self.channel = channel
        self.sink = sink
        self.dovecot = dovecot
        self.bot = bot

    async def deliver(self, text: str) -> None:
        await asyncio.to_thread(self.dovecot.deliver, self.bot, _mail(text))

    def texts(self) -> list[str]:
        return [inbound.text for inbound in self.sink.inbound]

    async def idle(self) -> None:
        def idling() -> bool:
            imap = self.channel._imap
            return imap is not None and imap.idling

        await _until(idling, 10, lambda: "the channel never went IDLE")


@pytest.fixture
async def receiving(dovecot: Dovecot) -> AsyncIterator[Receiving]:
    bot = dovecot.fresh_user("bot")
    channel = EmailChannel(
        address=bot.address,
        imap_host=dovecot.host,
        imap_port=dovecot.port,
        imap_tls=False,
        smtp_host="127.0.0.1",
        password=bot.password,
        poll_seconds=600,
    )
    sink = TestSink(routes={bot.address: "s1"})
    validity = dovecot.mailbox_status(bot)["uidvalidity"]
    sink.marks[channel.mark_name] = f"{validity}:0"
    await channel.start(sink)
    rig = Receiving(channel, sink, dovecot, bot)
    try:
        await rig.idle()
        yield rig
    finally:
        await channel.close()


# (the connection's method whose command is about to go out, which call of it after the first
# mail): the mail delivered then is announced inside that command's response
MOMENTS = [
    ("search", "uids_after", 1),  # UID SEARCH of the batch (the mail is not in its result)
    ("size-fetch", "size", 1),  # UID FETCH (RFC822.SIZE)
    ("body-fetch", "fetch", 1),  # UID FETCH (BODY.PEEK[])
    ("store", "mark_seen", 1),  # UID STORE +FLAGS.SILENT (\Seen): the case users hit
    ("search-after-batch", "uids_after", 2),  # the search that finds nothing more
]


@pytest.mark.parametrize(("method", "call"), [m[1:] for m in MOMENTS], ids=[m[0] for m in MOMENTS])
async def test_mail_announced_inside_another_commands_response_is_taken_at_once(
    receiving: Receiving, monkeypatch: pytest.MonkeyPatch, method: str, call: int
) -> None:
    original = getattr(ImapConnection, method)
    calls = count(1)
    announced: list[bool] = []

    async def then_mail_arrives(self: ImapConnection, *args: Any) -> Any:
        if next(calls) != call:
            return await original(self, *args)
        await receiving.deliver("the second mail")
        result = await original(self, *args)
        announced.append(bool(getattr(self, "_news", None)))  # the EXISTS came right here
        return result

    monkeypatch.setattr(ImapConnection, method, then_mail_arrives)
    await receiving.deliver("the first mail")
    started = time.monotonic()
    await _until(lambda: len(receiving.sink.inbound) >= 2, 5, lambda: f"{receiving.texts()}")
    assert announced == [True]
    assert receiving.texts() == ["the first mail", "the second mail"]
    assert receiving.channel.connections == 1  # not rescued by a reconnect
    assert time.monotonic() - started < 5


async def test_mail_sent_back_to_back_is_all_taken_at_once(receiving: Receiving) -> None:
    sent = [f"mail {n}" for n in range(12)]
    for group in (sent[:4], sent[4:8], sent[8:]):  # a few arriving at once, three times
        await asyncio.gather(*(receiving.deliver(text) for text in group))
    await _until(
        lambda: len(receiving.sink.inbound) == len(sent), 5, lambda: str(receiving.texts())
    )
    assert sorted(receiving.texts()) == sorted(sent)
    assert receiving.channel.connections == 1
