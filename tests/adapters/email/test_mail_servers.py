"""Self-tests of the mail rig: real Dovecot and aiosmtpd, driven by aioimaplib and aiosmtplib."""

from __future__ import annotations

import asyncio
import contextlib
import smtplib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import make_msgid
from typing import Any

import aioimaplib  # type: ignore[import-untyped]
import aiosmtplib
import pytest

from tests.support.mail_servers import (
    Dovecot,
    MailServerError,
    MailUser,
    SmtpServer,
    parse_thread,
)

TIMEOUT = 5.0


def raw_message(
    subject: str,
    *,
    to: str = "bot@example.test",
    message_id: str | None = None,
    in_reply_to: str | None = None,
) -> bytes:
    lines = [
        "From: Carol <carol@example.test>",
        f"To: {to}",
        f"Subject: {subject}",
        f"Message-ID: {message_id or make_msgid(domain='example.test')}",
    ]
    if in_reply_to is not None:
        lines += [f"In-Reply-To: {in_reply_to}", f"References: {in_reply_to}"]
    return ("\r\n".join(lines) + "\r\n\r\nHello.\r\n").encode()


def email_message(subject: str, to: str, sender: str = "bot@example.test") -> EmailMessage:
    message = EmailMessage()
    message["From"] = sender
    message["To"] = to
    message["Subject"] = subject
    message["Message-ID"] = make_msgid(domain="example.test")
    message.set_content("Reply body.\n")
    return message


@dataclass
class Imap:
    """An aioimaplib client and an event set when its connection is gone."""

    client: Any  # aioimaplib.IMAP4 (the package ships no type information)
    lost: asyncio.Event

    async def logout(self) -> None:
        await self.client.logout()
        # aioimaplib never closes its transport itself: wait until the server's close has
        # been processed, else the transport outlives the test's loop and a later garbage
        # collection fails some other test with "unclosed transport" (seen with IMAP4_SSL).
        await asyncio.wait_for(self.lost.wait(), TIMEOUT)


async def imap_login(dovecot: Dovecot, user: MailUser, *, tls: bool = False) -> Imap:
    lost = asyncio.Event()
    if tls:
        assert dovecot.imaps_port is not None
        client = aioimaplib.IMAP4_SSL(
            dovecot.host, dovecot.imaps_port, timeout=TIMEOUT, ssl_context=dovecot.ssl_context
        )
        # IMAP4_SSL takes no conn_lost_cb argument; the protocol attribute works all the same.
        client.protocol.conn_lost_cb = lambda exc: lost.set()
    else:
        client = aioimaplib.IMAP4(
            dovecot.host, dovecot.port, timeout=TIMEOUT, conn_lost_cb=lambda exc: lost.set()
        )
    await client.wait_hello_from_server()
    response = await client.login(user.address, user.password)
    assert response.result == "OK", response
    return Imap(client, lost)


def uidvalidity(lines: list[bytes]) -> int:
    for line in lines:
        if b"UIDVALIDITY" in line:
            return int(line.split(b"UIDVALIDITY ")[1].split(b"]")[0].split(b")")[0])
    raise AssertionError(f"no UIDVALIDITY in {lines!r}")


def subjects(dovecot: Dovecot, user: MailUser) -> list[str]:
    return [str(m["Subject"]) for m in dovecot.parsed_messages(user)]


@pytest.fixture
async def plain_smtp(dovecot: Dovecot) -> AsyncIterator[SmtpServer]:
    with SmtpServer(dovecot, tls=False) as server:
        yield server


async def send(
    smtp: SmtpServer, message: EmailMessage, **overrides: object
) -> tuple[dict[str, aiosmtplib.SMTPResponse], str]:
    options: dict[str, object] = {
        "hostname": smtp.host,
        "port": smtp.port,
        "start_tls": True,
        "username": smtp.username,
        "password": smtp.password,
        "tls_context": smtp.ssl_context if smtp.tls else None,
        "timeout": TIMEOUT,
    }
    options.update(overrides)
    return await aiosmtplib.send(message, **options)  # type: ignore[arg-type]


# -- Dovecot -----------------------------------------------------------------------------------


async def test_deliver_then_idle_sees_exists_push(dovecot: Dovecot, mail_user: MailUser) -> None:
    dovecot.deliver(mail_user, raw_message("first"))
    session = await imap_login(dovecot, mail_user)
    imap = session.client
    selected = await imap.select("INBOX")
    assert b"1 EXISTS" in selected.lines
    assert imap.has_capability("IDLE")

    idle = await asyncio.wait_for(imap.idle_start(timeout=60), TIMEOUT)
    await asyncio.to_thread(dovecot.deliver, mail_user, raw_message("second"))
    pushed = await imap.wait_server_push(timeout=TIMEOUT)
    imap.idle_done()
    await asyncio.wait_for(idle, TIMEOUT)

    assert b"2 EXISTS" in pushed
    assert dovecot.mailbox_uids(mail_user) == [1, 2]
    assert subjects(dovecot, mail_user) == ["first", "second"]
    await session.logout()


async def test_kick_ends_idle(dovecot: Dovecot, mail_user: MailUser) -> None:
    session = await imap_login(dovecot, mail_user)
    imap = session.client
    await imap.select("INBOX")
    idle = await asyncio.wait_for(imap.idle_start(timeout=60), TIMEOUT)

    assert await asyncio.to_thread(dovecot.kick, mail_user)
    pushed = await imap.wait_server_push(timeout=TIMEOUT)
    await asyncio.wait_for(session.lost.wait(), TIMEOUT)

    assert any(line.startswith(b"BYE") for line in pushed), pushed
    # aioimaplib never completes the IDLE task after a BYE (see the rig's report): cancel it.
    assert not idle.done()
    idle.cancel()
    assert not dovecot.kick(mail_user)  # nobody left to kick


async def test_imaps_with_the_rig_certificate(dovecot: Dovecot, mail_user: MailUser) -> None:
    session = await imap_login(dovecot, mail_user, tls=True)
    assert (await session.client.select("INBOX")).result == "OK"
    await session.logout()


async def test_uidvalidity_change_is_visible(dovecot: Dovecot, mail_user: MailUser) -> None:
    dovecot.deliver(mail_user, raw_message("kept"))
    session = await imap_login(dovecot, mail_user)
    imap = session.client
    before = uidvalidity((await imap.select("INBOX")).lines)

    after = await asyncio.to_thread(dovecot.set_uidvalidity, mail_user)
    assert after == before + 1

    # The session that had INBOX selected is thrown out (BYE + close) at its next command;
    # aioimaplib reports that only through conn_lost_cb, the command hangs until its timeout.
    noop = asyncio.ensure_future(imap.noop())
    await asyncio.wait_for(session.lost.wait(), TIMEOUT)
    assert not noop.done()
    noop.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await noop

    again = await imap_login(dovecot, mail_user)
    fresh = again.client
    status = await fresh.status("INBOX", "(UIDVALIDITY MESSAGES)")
    assert uidvalidity(status.lines) == after
    assert uidvalidity((await fresh.select("INBOX")).lines) == after
    # messages and UIDs survive; only UIDVALIDITY changed
    assert dovecot.mailbox_uids(mail_user) == [1]
    assert dovecot.set_uidvalidity(mail_user, value=7) == 7
    assert dovecot.mailbox_status(mail_user)["uidvalidity"] == 7
    await again.logout()


def test_thread_references_groups_a_reply(dovecot: Dovecot, mail_user: MailUser) -> None:
    root_id = make_msgid(domain="example.test")
    dovecot.deliver(mail_user, raw_message("question", message_id=root_id))
    dovecot.deliver(mail_user, raw_message("unrelated"))
    dovecot.deliver(mail_user, raw_message("Re: question", in_reply_to=root_id))

    assert dovecot.thread_references(mail_user) == [[1, 3], [2]]
    assert dovecot.raw_thread_references(mail_user) == b"(1 3)(2)"


def test_parse_thread() -> None:
    assert parse_thread(b"") == []
    assert parse_thread(b"(1)(2 3 (4)(5 6))") == [[1], [2, 3, 4, 5, 6]]
    with pytest.raises(ValueError, match="unbalanced"):
        parse_thread("(1 2")


def test_fresh_users_are_independent(dovecot: Dovecot) -> None:
    first, second = dovecot.fresh_user(), dovecot.fresh_user()
    assert first.address != second.address
    dovecot.deliver(first, raw_message("only for first"))
    assert dovecot.mailbox_uids(first) == [1]
    assert dovecot.mailbox_uids(second) == []
    assert dovecot.mailbox_status(second)["messages"] == 0
    with pytest.raises(MailServerError, match="exited with 67"):
        dovecot.deliver("nobody-here@example.test", raw_message("lost"))


def test_deliver_into_another_mailbox(dovecot: Dovecot, mail_user: MailUser) -> None:
    dovecot.deliver(mail_user, raw_message("filed"), mailbox="Archive/2026")
    assert dovecot.mailbox_uids(mail_user, "Archive/2026") == [1]
    assert dovecot.mailbox_uids(mail_user) == []
    assert "Archive/2026" in dovecot.doveadm("mailbox", "list", "-u", mail_user.address)


def test_start_failure_reports_the_log() -> None:
    # Bound but not listening: a connect is refused and Dovecot's bind fails.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        server = Dovecot(tls=False, port=taken.getsockname()[1])
        try:
            with pytest.raises(MailServerError, match="Address already in use") as failed:
                server.start()
        finally:
            server.stop()
    assert "master: Fatal" in str(failed.value)


# -- SMTP --------------------------------------------------------------------------------------


async def test_starttls_auth_send_lands_in_mailbox(
    dovecot: Dovecot, smtp_server: SmtpServer, mail_user: MailUser
) -> None:
    refused, reply = await send(smtp_server, email_message("via smtp", mail_user.address))

    assert refused == {}
    assert reply.startswith("2.0.0")
    [received] = smtp_server.messages
    assert received.mail_from == "bot@example.test"
    assert received.rcpt_tos == (mail_user.address,)
    assert received.delivered_to == (mail_user.address,)
    assert received.tls and received.auth_login == "bot@example.test"
    assert received.message["Subject"] == "via smtp"
    assert subjects(dovecot, mail_user) == ["via smtp"]


async def test_unknown_recipients_are_recorded_not_delivered(
    dovecot: Dovecot, smtp_server: SmtpServer, mail_user: MailUser
) -> None:
    message = email_message("two rcpts", f"{mail_user.address}, stranger@elsewhere.test")
    await send(smtp_server, message)
    [received] = await smtp_server.wait_for_messages(1)
    assert received.rcpt_tos == (mail_user.address, "stranger@elsewhere.test")
    assert received.delivered_to == (mail_user.address,)
    assert dovecot.mailbox_uids(mail_user) == [1]


async def test_auth_is_required(smtp_server: SmtpServer, mail_user: MailUser) -> None:
    with pytest.raises(aiosmtplib.SMTPSenderRefused) as refused:
        await send(smtp_server, email_message("anon", mail_user.address), username=None)
    assert refused.value.code == 530

    with pytest.raises(aiosmtplib.SMTPAuthenticationError) as wrong:
        await send(smtp_server, email_message("bad pw", mail_user.address), password="nope")
    assert wrong.value.code == 535
    assert smtp_server.messages == []


async def test_fail_auth(smtp_server: SmtpServer, mail_user: MailUser) -> None:
    smtp_server.fail_auth()
    with pytest.raises(aiosmtplib.SMTPAuthenticationError) as failed:
        await send(smtp_server, email_message("first try", mail_user.address))
    assert failed.value.code == 535
    # aiosmtplib tried PLAIN, then LOGIN, on the failing connection
    assert smtp_server.auth_attempts == 2
    await send(smtp_server, email_message("second try", mail_user.address))
    assert smtp_server.auth_attempts == 3
    assert [m.message["Subject"] for m in smtp_server.messages] == ["second try"]


async def test_refuse_next_at_data_then_accept(
    dovecot: Dovecot, smtp_server: SmtpServer, mail_user: MailUser
) -> None:
    smtp_server.refuse_next(451, "4.3.0 Try later")
    with pytest.raises(aiosmtplib.SMTPDataError) as refused:
        await send(smtp_server, email_message("retry me", mail_user.address))
    assert refused.value.code == 451
    assert dovecot.mailbox_uids(mail_user) == []

    await send(smtp_server, email_message("retry me", mail_user.address))
    assert [t.outcome for t in smtp_server.transactions] == ["refused", "accepted"]
    assert dovecot.mailbox_uids(mail_user) == [1]


async def test_refuse_next_at_rcpt_and_refuse_recipient(
    smtp_server: SmtpServer, mail_user: MailUser
) -> None:
    smtp_server.refuse_next(452, "4.2.2 Mailbox full", at="RCPT")
    with pytest.raises(aiosmtplib.SMTPRecipientsRefused) as temporary:
        await send(smtp_server, email_message("full", mail_user.address))
    assert [r.code for r in temporary.value.recipients] == [452]

    smtp_server.refuse_recipient(mail_user.address.upper())
    with pytest.raises(aiosmtplib.SMTPRecipientsRefused) as permanent:
        await send(smtp_server, email_message("gone", mail_user.address))
    assert [r.code for r in permanent.value.recipients] == [550]

    smtp_server.reset_faults()
    await send(smtp_server, email_message("fine", mail_user.address))
    assert len(smtp_server.messages) == 1


async def test_lose_response_after_data(
    dovecot: Dovecot, smtp_server: SmtpServer, mail_user: MailUser
) -> None:
    smtp_server.lose_response_after_data()
    with pytest.raises(aiosmtplib.SMTPServerDisconnected):
        await send(smtp_server, email_message("unknown outcome", mail_user.address))

    [received] = smtp_server.messages
    assert received.outcome == "response_lost"
    assert subjects(dovecot, mail_user) == ["unknown outcome"]
    # the server is fine afterwards
    await send(smtp_server, email_message("next", mail_user.address))
    assert subjects(dovecot, mail_user) == ["unknown outcome", "next"]


async def test_plain_mode(dovecot: Dovecot, plain_smtp: SmtpServer, mail_user: MailUser) -> None:
    with pytest.raises(MailServerError):
        _ = plain_smtp.ssl_context
    await send(plain_smtp, email_message("plain", mail_user.address), start_tls=False)
    [received] = plain_smtp.messages
    assert not received.tls
    assert subjects(dovecot, mail_user) == ["plain"]


async def test_smtp_reply_reaches_an_idle_client(
    dovecot: Dovecot, smtp_server: SmtpServer, mail_user: MailUser
) -> None:
    session = await imap_login(dovecot, mail_user)
    imap = session.client
    await imap.select("INBOX")
    idle = await asyncio.wait_for(imap.idle_start(timeout=60), TIMEOUT)
    await send(smtp_server, email_message("pushed", mail_user.address))
    pushed = await imap.wait_server_push(timeout=TIMEOUT)
    imap.idle_done()
    await asyncio.wait_for(idle, TIMEOUT)
    assert b"1 EXISTS" in pushed
    await session.logout()


def test_auth_is_offered_only_after_starttls(smtp_server: SmtpServer) -> None:
    with smtplib.SMTP(smtp_server.host, smtp_server.port, timeout=TIMEOUT) as client:
        client.ehlo()
        assert client.has_extn("starttls")
        assert not client.has_extn("auth")
        assert client.mail("bot@example.test")[0] == 530
        client.starttls(context=smtp_server.ssl_context)
        client.ehlo()
        assert client.has_extn("auth")
        assert set(client.esmtp_features["auth"].split()) == {"PLAIN", "LOGIN"}
