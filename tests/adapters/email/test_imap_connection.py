"""The IMAP connection against a real Dovecot: what a dropped link does to a command."""

from __future__ import annotations

import asyncio
import gc
import warnings

import pytest

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
