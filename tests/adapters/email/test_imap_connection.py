"""The IMAP connection against a real Dovecot: what a dropped link does to a command."""

from __future__ import annotations

import asyncio
import gc
import warnings

import pytest
import uvloop

from adapters.email.imap import ImapConnection, ImapGone
from tests.support.mail_servers import Dovecot, MailUser


async def test_a_command_on_a_dropped_connection_is_refused_without_a_stray_coroutine(
    dovecot: Dovecot, mail_user: MailUser
) -> None:
    conn = ImapConnection(dovecot.host, dovecot.port, tls=False, ssl_context=None, timeout_s=10)
    await conn.open(mail_user.address, mail_user.password)
    conn._imap.protocol.transport.abort()  # the link is gone; the next command must not hang
    await asyncio.wait_for(conn.lost.wait(), 10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ImapGone):
            await conn.append(b"Subject: x\r\n\r\nbody\r\n", "INBOX")
        gc.collect()  # a command coroutine never awaited would warn when collected
    assert not [w for w in caught if "never awaited" in str(w.message)]


def _drop_during_idle(dovecot: Dovecot, user: MailUser, loop: str, drop: str) -> None:
    """IDLE on `loop`, drop the link (`kick`: the server's BYE; `abort`: no word at all), and
    see the wait end `ImapGone` within 10 s."""

    async def scenario() -> None:
        conn = ImapConnection(dovecot.host, dovecot.port, tls=False, ssl_context=None, timeout_s=10)
        await conn.open(user.address, user.password)
        await conn.select("INBOX")
        assert conn.has_idle
        waiting = asyncio.ensure_future(conn.wait_for_news(poll_s=60))
        for _ in range(100):
            await asyncio.sleep(0.05)
            if conn.idling:
                break
        if drop == "kick":
            assert dovecot.kick(user)
        else:
            conn._imap.protocol.transport.abort()  # gone, and nothing said so on the wire
        with pytest.raises(ImapGone):
            await asyncio.wait_for(waiting, 10)
        await conn.close()

    factory = uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(scenario())


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_drop_during_idle_is_the_connection_gone_on_either_loop(
    dovecot: Dovecot, mail_user: MailUser, loop: str
) -> None:
    """On uvloop (serve's default) ending the IDLE on the closed transport raised RuntimeError,
    which no retry took: receiving slept a minute after each server restart or kick."""
    _drop_during_idle(dovecot, mail_user, loop, "kick")


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_link_that_ends_without_a_bye_during_idle_is_gone_at_once(
    dovecot: Dovecot, mail_user: MailUser, loop: str
) -> None:
    """A link that ends with no BYE (the server's imap process killed, a reset) was noticed
    only when the IDLE ran out, five minutes later: the mail in between waited that long."""
    _drop_during_idle(dovecot, mail_user, loop, "abort")
