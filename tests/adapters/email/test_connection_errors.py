"""A mail server that cannot be reached is said in words, against real sockets (D171).

Each row is a real failure: a name that does not resolve (``.invalid`` is reserved, RFC 2606),
a local port nobody listens on, a local port that accepts and never says a word, Dovecot's
plain IMAP port spoken to as TLS, its IMAPS port with a certificate nobody trusts, and a
password Dovecot (or the SMTP server) refuses. The line names the host and port and never the
password; the SMTP ones are a delivery's failure reason, as ``gateway ops`` shows it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from adapters.channel import DeliveryError, Outbound, ThreadRef
from adapters.email import EmailChannel
from adapters.email.channel import EmailStartError
from adapters.email.imap import CA_HINT, ImapConnection, ImapError, ImapRefused
from adapters.failures import tls_reason
from tests.adapters.kit import TestSink
from tests.support.mail_servers import Dovecot, MailUser, SmtpServer
from tests.support.redis_server import free_port

WRONG = "not-the-password-3f9a"


@dataclass(frozen=True)
class Servers:
    """Where each kind of failure is found on this machine."""

    dovecot: Dovecot
    smtp: SmtpServer
    user: MailUser
    closed: int
    """A port nothing listens on."""
    silent: int
    """A port that accepts and never says a word (no greeting, no TLS handshake)."""


@pytest.fixture
async def servers(dovecot: Dovecot) -> AsyncIterator[Servers]:
    user = dovecot.fresh_user("bot")
    held: list[asyncio.StreamWriter] = []

    async def accept_and_wait(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # kept open, silent, until the test ends

    silent = await asyncio.start_server(accept_and_wait, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    with SmtpServer(dovecot, username=user.address, password=user.password) as smtp:
        yield Servers(dovecot, smtp, user, free_port(), port)
    for writer in held:
        writer.close()
    silent.close()
    await silent.wait_closed()


Where = Callable[[Servers], tuple[str, int, bool, bool]]
"""(host, port, TLS?, the CA trusted?)"""

# (case, where, wrong password?, timeout, the line)
IMAP_FAILURES: list[tuple[str, Where, bool, float, str]] = [
    ("unresolvable", lambda s: ("nonexistent.invalid", 993, True, True), False, 5,
     r"cannot resolve the IMAP host 'nonexistent\.invalid' \(.+\): check the host name"),
    ("nothing-listens", lambda s: ("127.0.0.1", s.closed, True, True), False, 5,
     r"connection refused by 127\.0\.0\.1:{closed}: nothing listens there \(check the IMAP "
     r"host and port\)"),
    ("silent-tls", lambda s: ("127.0.0.1", s.silent, True, True), False, 0.5,
     r"no answer from IMAP server 127\.0\.0\.1:{silent} within 0\.5 s \(connecting: TLS "
     r"handshake and greeting\)"),
    ("silent-plain", lambda s: ("127.0.0.1", s.silent, False, True), False, 0.5,
     r"no answer from IMAP server 127\.0\.0\.1:{silent} within 0\.5 s \(connecting: greeting\)"),
    ("plain-port-as-tls", lambda s: ("127.0.0.1", s.dovecot.port, True, True), False, 5,
     r"TLS handshake with IMAP server 127\.0\.0\.1:{plain} failed: wrong version number \(the "
     r"server does not speak TLS on this port: check the port and its security setting\)"),
    ("untrusted-certificate", lambda s: ("127.0.0.1", s.dovecot.imaps_port or 0, True, False),
     False, 5,
     r"TLS handshake with IMAP server 127\.0\.0\.1:{imaps} failed: its certificate is not "
     r"trusted \(self-signed certificate; a private CA goes in GATEWAY_EMAIL_CA_FILE\)"),
    ("wrong-password", lambda s: ("127.0.0.1", s.dovecot.imaps_port or 0, True, True), True, 8,
     r"IMAP server 127\.0\.0\.1:{imaps} refused the login for user '{user}' "
     r"\(\[AUTHENTICATIONFAILED\] Authentication failed\.\)"),
]  # fmt: skip


def _expected(pattern: str, s: Servers) -> str:
    return (
        pattern.replace("{closed}", str(s.closed))
        .replace("{silent}", str(s.silent))
        .replace("{plain}", str(s.dovecot.port))
        .replace("{imaps}", str(s.dovecot.imaps_port))
        .replace("{user}", re.escape(s.user.address))
    )


@pytest.mark.parametrize(
    ("where", "wrong", "timeout_s", "line"),
    [c[1:] for c in IMAP_FAILURES],
    ids=[c[0] for c in IMAP_FAILURES],
)
async def test_an_imap_server_that_fails_is_said_in_one_line(
    servers: Servers,
    where: Where,
    wrong: bool,
    timeout_s: float,
    line: str,
) -> None:
    host, port, tls, trusted = where(servers)
    context = servers.dovecot.ssl_context if trusted and tls and host == "127.0.0.1" else None
    imap = ImapConnection(host, port, tls=tls, ssl_context=context, timeout_s=timeout_s)
    password = WRONG if wrong else servers.user.password
    try:
        with pytest.raises(ImapError) as raised:
            await imap.open(servers.user.address, password)
    finally:
        await imap.close()
    said = str(raised.value)
    assert re.fullmatch(_expected(line, servers), said), said
    assert isinstance(raised.value, ImapRefused) == wrong
    assert password not in said and "\n" not in said


def _channel(servers: Servers, **smtp: Any) -> EmailChannel:
    settings: dict[str, Any] = {
        "address": servers.user.address,
        "imap_host": "127.0.0.1",
        "imap_port": servers.dovecot.port,
        "imap_tls": False,
        "smtp_host": "127.0.0.1",
        "smtp_port": servers.smtp.port,
        "smtp_security": "starttls",
        "password": servers.user.password,
        "ca_file": str(servers.smtp.cert_path),
        "timeout_s": 5.0,
        **smtp,
    }
    return EmailChannel(**settings)


_OUTBOUND = Outbound(
    delivery_id="reply:s1:run-1",
    thread=ThreadRef(channel="email", space="bot@example.test", thread="<q1@example.test>"),
    kind="reply",
    text="an answer",
    reply_context={"message_id": "<q1@example.test>", "from": "Person <person@example.test>"},
)

# (case, the channel's SMTP settings from the servers, the reason, permanent?)
SMTP_FAILURES: list[tuple[str, Callable[[Servers], dict[str, Any]], str, bool]] = [
    ("unresolvable", lambda s: {"smtp_host": "nonexistent.invalid"},
     r"cannot resolve the SMTP host 'nonexistent\.invalid' \(.+\): check the host name", False),
    ("nothing-listens", lambda s: {"smtp_port": s.closed},
     r"connection refused by 127\.0\.0\.1:{closed}: nothing listens there \(check the SMTP "
     r"host and port\)", False),
    ("silent-tls", lambda s: {"smtp_port": s.silent, "smtp_security": "tls", "timeout_s": 0.5},
     r"no answer from SMTP server 127\.0\.0\.1:{silent} within 0\.5 s \(connecting\)", False),
    ("silent-starttls", lambda s: {"smtp_port": s.silent, "timeout_s": 0.5},
     r"no answer from SMTP server 127\.0\.0\.1:{silent} within 0\.5 s \(connecting\)", False),
    ("plain-port-as-tls", lambda s: {"smtp_security": "tls"},
     r"TLS handshake with SMTP server 127\.0\.0\.1:{smtp} failed: wrong version number \(the "
     r"server does not speak TLS on this port: check the port and its security setting\)",
     False),
    ("untrusted-certificate", lambda s: {"ca_file": None},
     r"TLS handshake with SMTP server 127\.0\.0\.1:{smtp} failed: its certificate is not "
     r"trusted \(self-signed certificate; a private CA goes in GATEWAY_EMAIL_CA_FILE\)", False),
    ("wrong-password", lambda s: {"password": WRONG},
     r"SMTP server 127\.0\.0\.1:{smtp} refused the login for user '{user}' \(535 5\.7\.8 "
     r"Authentication credentials invalid\)", True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("settings", "reason", "permanent"),
    [c[1:] for c in SMTP_FAILURES],
    ids=[c[0] for c in SMTP_FAILURES],
)
async def test_an_smtp_server_that_fails_is_said_in_the_deliverys_reason(
    servers: Servers, settings: Callable[[Servers], dict[str, Any]], reason: str, permanent: bool
) -> None:
    channel = _channel(servers, **settings(servers))
    with pytest.raises(DeliveryError) as raised:
        await channel.deliver(_OUTBOUND)
    said = raised.value.reason
    expected = _expected(reason, servers).replace("{smtp}", str(servers.smtp.port))
    assert re.fullmatch(expected, said), said
    assert raised.value.permanent == permanent
    assert not raised.value.unknown_outcome  # nothing was handed over: nothing to reconcile
    assert WRONG not in said and servers.user.password not in said
    assert servers.smtp.messages == []


async def test_an_unresolvable_imap_host_is_said_in_the_log_and_the_channels_state(
    servers: Servers, caplog: pytest.LogCaptureFixture
) -> None:
    channel = _channel(servers, imap_host="nonexistent.invalid", max_backoff_s=0.2)
    caplog.set_level("WARNING", logger="adapters.email")
    await channel.start(TestSink())
    try:
        for _ in range(100):
            if channel.receiving_error is not None:
                break
            await asyncio.sleep(0.05)
    finally:
        await channel.close()
    expected = "cannot resolve the IMAP host 'nonexistent.invalid'"
    assert channel.receiving_error is not None and channel.receiving_error.startswith(expected)
    [paused, *_] = [r for r in caplog.records if r.getMessage() == "email receiving paused"]
    assert str(getattr(paused, "reason", "")).startswith(expected)  # before: "(gaierror)"


async def test_a_refused_imap_login_stops_the_start_in_one_line(servers: Servers) -> None:
    """It was retried forever in the background while the banner said mail was answered."""
    right = _channel(servers, timeout_s=10.0)
    await right.start(TestSink())  # the right password starts (and an unreachable one, above)
    await right.close()  # (a good login also clears Dovecot's delay for failed ones)
    channel = _channel(servers, password=WRONG, timeout_s=10.0)
    with pytest.raises(EmailStartError) as raised:
        await channel.start(TestSink())
    await channel.close()
    said = str(raised.value)
    assert said.startswith(f"IMAP server 127.0.0.1:{servers.dovecot.port} refused the login")
    assert WRONG not in said


async def test_a_folder_the_server_has_not_stops_the_start_in_one_line(servers: Servers) -> None:
    """It was selected again for ever in the background, a warning each time (an outside probe)."""
    channel = _channel(servers, folder="Bots/Typo", timeout_s=10.0)
    with pytest.raises(EmailStartError) as raised:
        await channel.start(TestSink())
    await channel.close()
    said = str(raised.value)
    assert said.startswith(f"IMAP select 'Bots/Typo' failed on 127.0.0.1:{servers.dovecot.port}")
    assert "Mailbox doesn't exist: Bots/Typo" in said, said  # the server's own words
    assert said.endswith("the folder to read (GATEWAY_EMAIL_FOLDER) must exist on the server")
    assert "\n" not in said


async def test_a_refused_smtp_login_stops_the_start_in_one_line(
    servers: Servers, caplog: pytest.LogCaptureFixture
) -> None:
    """It was first heard of at the first reply, a dead letter at once (an outside probe)."""
    servers.smtp.fail_auth()  # the next connection's login (IMAP's is right)
    channel = _channel(servers, timeout_s=10.0)
    with pytest.raises(EmailStartError) as raised:
        await channel.start(TestSink())
    await channel.close()
    said = str(raised.value)
    assert said.startswith(
        f"SMTP server 127.0.0.1:{servers.smtp.port} refused the login for user "
        f"'{servers.user.address}' (535 "
    ), said
    assert servers.user.password not in said
    # a server that is not there now is a warning: replies are tried again later
    away = _channel(servers, smtp_port=free_port(), timeout_s=2.0)
    with caplog.at_level(logging.WARNING, logger="adapters.email"):
        await away.start(TestSink())
    await away.close()
    [warned] = [r for r in caplog.records if r.getMessage() == "email smtp not usable at start"]
    assert "nothing listens there" in str(getattr(warned, "reason", ""))


def _unverified(code: int, message: str) -> ssl.SSLCertVerificationError:
    error = ssl.SSLCertVerificationError(1, f"[SSL: CERTIFICATE_VERIFY_FAILED] {message}")
    error.verify_code, error.verify_message = code, message
    return error


# (case, what OpenSSL raised, the words) for handshakes the rows above cannot stage locally
TLS_WORDS: list[tuple[str, ssl.SSLError, str]] = [
    ("another-name", _unverified(62, "Hostname mismatch, certificate is not valid for 'x'."),
     "its certificate is for another name (Hostname mismatch, certificate is not valid for "
     "'x'): check the host name"),
    ("expired", _unverified(10, "certificate has expired"),
     "its certificate is not valid now (certificate has expired)"),
    ("unknown-issuer", _unverified(20, "unable to get local issuer certificate"),
     "its certificate is not trusted (unable to get local issuer certificate; a private CA "
     "goes in GATEWAY_EMAIL_CA_FILE)"),
    ("closed-mid-handshake", ssl.SSLEOFError(8, "EOF occurred in violation of protocol"),
     "EOF occurred in violation of protocol"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("error", "words"), [c[1:] for c in TLS_WORDS], ids=[c[0] for c in TLS_WORDS]
)
def test_a_failed_handshake_says_why_in_words(error: ssl.SSLError, words: str) -> None:
    assert tls_reason(error, ca_hint=CA_HINT) == words


async def test_an_address_a_server_without_smtputf8_cannot_take_is_refused_for_good(
    dovecot: Dovecot,
) -> None:
    """A sender `jürgen@` is answered with SMTPUTF8; a server that does not offer it cannot
    take the reply, and no retry changes that: a dead letter in words, nothing sent."""
    user = dovecot.fresh_user("bot")
    with SmtpServer(dovecot, username=user.address, password=user.password, smtputf8=False) as smtp:
        servers = Servers(dovecot, smtp, user, free_port(), free_port())
        channel = _channel(servers)
        context = {**_OUTBOUND.reply_context, "from": "Jürgen <jürgen@example.test>"}
        with pytest.raises(DeliveryError) as raised:
            await channel.deliver(_OUTBOUND.model_copy(update={"reply_context": context}))
        assert raised.value.permanent and not raised.value.unknown_outcome
        assert "SMTPUTF8 is not supported" in raised.value.reason, raised.value.reason
        assert smtp.messages == []


async def test_a_copy_a_server_without_smtputf8_cannot_address_is_left_out_not_the_answer(
    dovecot: Dovecot, caplog: pytest.LogCaptureFixture
) -> None:
    """A person copied as `jürgen@` made the whole reply need SMTPUTF8: on a server without it
    the (ASCII) sender's answer was a dead letter too (an outside probe)."""
    user = dovecot.fresh_user("bot")
    with SmtpServer(dovecot, username=user.address, password=user.password, smtputf8=False) as smtp:
        servers = Servers(dovecot, smtp, user, free_port(), free_port())
        channel = _channel(servers)
        context = {
            **_OUTBOUND.reply_context,
            "cc": ["Jürgen <jürgen@example.test>", "ann@example.test"],
        }
        with caplog.at_level(logging.WARNING, logger="adapters.email"):
            await channel.deliver(_OUTBOUND.model_copy(update={"reply_context": context}))
        [sent] = smtp.messages
        assert sent.rcpt_tos == (user.address, "person@example.test", "ann@example.test")
        [said] = [r for r in caplog.records if r.getMessage() == "email reply copies fewer people"]
        assert (getattr(said, "left_out", None), getattr(said, "reason", None)) == (
            1,
            "no_smtputf8",
        )
