"""Email latency: from a mail delivered into the bot's mailbox to its reply accepted by SMTP.

    python bench/email_latency.py              # 30 mails, one after another
    python bench/email_latency.py --mails 100

A private Dovecot (IMAP IDLE) and an aiosmtpd server (STARTTLS + AUTH) on this machine, the
embedded service (SQLite) with the scripted echo model, so no model time is in the figure.
Each mail is delivered with ``dovecot-lda`` (as an MTA would) once the previous reply is in;
the latency is the SMTP server's receipt of the reply minus the end of the delivery. Printed:
p50, p90, p99 and the worst. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from email.message import EmailMessage
from email.utils import make_msgid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/email_latency.py` as well as `-m bench....`
    sys.path.insert(0, str(ROOT))

from bench.gateway_bench import pct  # noqa: E402
from bench.interrupt import run_main  # noqa: E402
from gateway.channels import gateway_settings  # noqa: E402
from gateway.logs import configure  # noqa: E402
from gateway.service import Service  # noqa: E402

try:  # the mail servers of the tests: they need the test extras (aiosmtpd)
    from tests.support.mail_servers import Dovecot, SmtpServer
except ImportError as missing:
    sys.exit(
        f"email_latency: {missing.name} is missing: install the test extras first "
        "(scripts/test does, or .venv/bin/pip install -e '.[test]')"
    )


async def run(mails: int) -> list[float]:
    with Dovecot() as dovecot:
        bot = dovecot.fresh_user("bot")
        person = dovecot.fresh_user("person")
        with SmtpServer(dovecot, username=bot.address, password=bot.password) as smtp:
            work = Path(tempfile.mkdtemp(prefix="email-bench-"))
            settings = gateway_settings(
                store_url=f"sqlite:///{work}/store.db",
                broker_url=f"sqlite:///{work}/broker.db",
                web_url=f"sqlite:///{work}/web.db",
                log_level="warning",
                email_address=bot.address,
                email_imap_host="127.0.0.1",
                email_imap_port=dovecot.port,
                email_imap_security="none",
                email_smtp_host="127.0.0.1",
                email_smtp_port=smtp.port,
                email_password=bot.password,
                email_ca_file=str(smtp.cert_path),
                email_replies_per_hour=1000,
                email_replies_per_address_per_hour=100_000,
            )
            service = Service(settings)
            await service.start()
            latencies: list[float] = []
            try:
                await asyncio.sleep(1.0)  # the first IDLE is up
                for n in range(mails):
                    mail = EmailMessage()
                    mail["From"] = person.address
                    mail["To"] = bot.address
                    mail["Subject"] = f"Question {n}"
                    mail["Message-ID"] = make_msgid(f"q{n}", domain="example.test")
                    mail.set_content(f"question number {n}")
                    before = len(smtp.messages)
                    await asyncio.to_thread(dovecot.deliver, bot, bytes(mail))
                    delivered = time.time()
                    deadline = time.monotonic() + 30
                    while len(smtp.messages) == before:
                        assert time.monotonic() < deadline, f"no reply to mail {n}"
                        await asyncio.sleep(0.005)
                    latencies.append((smtp.messages[-1].received_at - delivered) * 1000)
            finally:
                await service.stop(drain_seconds=1)
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mails", type=int, default=30)
    args = parser.parse_args()
    if args.mails < 1:
        parser.error("--mails: at least 1")
    configure("warning")
    latencies = asyncio.run(run(args.mails))
    print(
        f"email: {len(latencies)} mails, delivered -> reply accepted by SMTP: "
        f"p50 {statistics.median(latencies):.0f} ms, p90 {pct(latencies, 0.9):.0f} ms, "
        f"p99 {pct(latencies, 0.99):.0f} ms, worst {max(latencies):.0f} ms"
    )


if __name__ == "__main__":
    run_main(main)
