"""The kill run with email as the channel: mail in through Dovecot, replies out through SMTP.

Three `gateway serve` processes on one Redis all read the bot's mailbox (IMAP IDLE) while one of
them is SIGKILLed every few seconds and restarted; mail is delivered by ``dovecot-lda`` (each
thread's first mail a new subject, the rest replies to it). At the end every delivered mail is
one user entry, every run's reply is in the person's mailbox exactly once (counted there by the
Message-ID derived from the delivery id), and no ``replay="never"`` tool ran twice.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.kill_run import EmailRig, kill_run
from tests.support.mail_servers import Dovecot, SmtpServer
from tests.support.redis_server import RedisServer

# kill rates and deadlines are part of what these measure: scripts/test runs them by themselves
pytestmark = pytest.mark.alone


@pytest.mark.timeout(600)
async def test_three_processes_on_redis_with_email_killed_every_few_seconds(
    tmp_path: Path,
    redis_server: RedisServer,
    redis_prefix: str,
    dovecot: Dovecot,
    capsys: pytest.CaptureFixture[str],
) -> None:
    urls = {
        "store_url": f"{redis_server.url}?prefix={redis_prefix}s",
        "broker_url": f"{redis_server.url}?prefix={redis_prefix}b",
        "web_url": f"{redis_server.url}?prefix={redis_prefix}w",
    }
    bot = dovecot.fresh_user("bot")
    person = dovecot.fresh_user("person")
    with SmtpServer(dovecot, username=bot.address, password=bot.password) as smtp:
        counts = await kill_run(
            tmp_path,
            urls,
            processes=3,
            threads=40,
            messages=240,
            send_seconds=25,
            min_kills=2,
            email=EmailRig(dovecot, smtp, bot, person),
        )
    with capsys.disabled():
        print(f"\nkill run, 3 processes on Redis, email channel: {counts.line()}")
    assert counts.kills >= 2
    assert counts.clean, (counts.line(), counts.problems[:20])
    assert counts.operations > 0 and counts.replies_delivered == counts.operations
    assert counts.charges > 0
