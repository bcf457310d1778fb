"""Real mail servers for tests: a private Dovecot (IMAP/IMAPS) and an aiosmtpd SMTP server.

:class:`Dovecot` runs Debian's ``dovecot`` as root on 127.0.0.1 with everything under its own
temporary directory (config, ``base_dir``, state, log, maildirs, a passwd-file of users, a
self-signed certificate). Mail arrives the way it does in production: :meth:`Dovecot.deliver`
pipes the message into ``dovecot-lda``, so IMAP clients see it through the index and IDLE
pushes. ``doveadm`` drives the rest: :meth:`~Dovecot.kick` drops a user's IMAP connections,
:meth:`~Dovecot.set_uidvalidity` forces a UIDVALIDITY change (``doveadm mailbox update
--uid-validity``), :meth:`~Dovecot.mailbox_uids` and :meth:`~Dovecot.mailbox_status` read a
mailbox; :meth:`~Dovecot.messages` and :meth:`~Dovecot.thread_references` log in over IMAP.

:class:`SmtpServer` is an aiosmtpd server (STARTTLS + AUTH PLAIN/LOGIN, or plain on loopback)
that hands each accepted message to ``dovecot-lda`` for every recipient the Dovecot knows, so a
reply the gateway sends lands in a real mailbox. It records every DATA transaction and injects
faults on request: :meth:`~SmtpServer.refuse_next`, :meth:`~SmtpServer.refuse_recipient`,
:meth:`~SmtpServer.lose_response_after_data` and :meth:`~SmtpServer.fail_auth`.

The SMTP server runs in aiosmtpd's threaded :class:`~aiosmtpd.controller.Controller` (its own
event loop in a daemon thread), not in the test's loop: pytest-asyncio runs here in ``auto``
mode with a function-scoped loop, and a server in its own thread works from sync and async tests
alike and keeps answering while a test blocks its loop with a synchronous helper such as
:meth:`Dovecot.deliver`. Both servers are context managers::

    with Dovecot() as dovecot, SmtpServer(dovecot) as smtp:
        user = dovecot.fresh_user()
        await aiosmtplib.send(msg, hostname=smtp.host, port=smtp.port, start_tls=True,
                              username=smtp.username, password=smtp.password,
                              tls_context=smtp.ssl_context)
        [raw] = dovecot.messages(user)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import email
import functools
import grp
import imaplib
import itertools
import logging
import os
import pwd
import re
import shutil
import socket
import ssl
import subprocess
import tempfile
import textwrap
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from email import policy
from email.message import EmailMessage
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from tests.support.redis_server import free_port

__all__ = [
    "DEFAULT_PASSWORD",
    "Dovecot",
    "MailServerError",
    "MailUser",
    "ReceivedMessage",
    "SmtpServer",
    "TlsCert",
    "make_self_signed_cert",
    "parse_thread",
]

DEFAULT_PASSWORD = "secret"
HOST = "127.0.0.1"
DOVECOT_LDA = "/usr/lib/dovecot/dovecot-lda"
# Dovecot hard-refuses to access mail as uid 0, so mail processes switch to nobody:nogroup.
MAIL_USER = "nobody"
MAIL_GROUP = "nogroup"


class MailServerError(RuntimeError):
    """A mail server did not start, or a command against it failed."""


def _binary(name: str, *fallbacks: str) -> str:
    found = shutil.which(name)
    if found is not None:
        return found
    for path in fallbacks:
        if os.access(path, os.X_OK):
            return path
    raise MailServerError(f"{name} is not installed (apt-get install -y dovecot-imapd)")


# --------------------------------------------------------------------------------------------
# TLS


@dataclass(frozen=True)
class TlsCert:
    """A self-signed certificate for ``localhost`` and ``127.0.0.1`` and its key (PEM files)."""

    cert_path: Path
    key_path: Path

    def client_context(self) -> ssl.SSLContext:
        """A client context that trusts exactly this certificate (hostname checks stay on)."""
        return ssl.create_default_context(cafile=str(self.cert_path))

    def server_context(self) -> ssl.SSLContext:
        """A server context presenting this certificate."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert_path, self.key_path)
        return context


def make_self_signed_cert(directory: Path) -> TlsCert:
    """Write ``cert.pem``/``key.pem`` into ``directory`` with ``openssl`` (P-256: ~10 ms).

    The subjectAltName covers ``localhost`` and ``127.0.0.1`` so clients can keep hostname
    verification on and connect by IP.
    """
    openssl = _binary("openssl")
    cert, key = directory / "cert.pem", directory / "key.pem"
    args = [
        openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "7",
        "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
    ]  # fmt: skip
    done = subprocess.run(args, capture_output=True, check=False)
    if done.returncode != 0:
        raise MailServerError(f"openssl failed: {done.stderr.decode(errors='replace')}")
    return TlsCert(cert, key)


# --------------------------------------------------------------------------------------------
# Dovecot


@dataclass(frozen=True)
class MailUser:
    """A Dovecot user: log in to IMAP with ``address``/``password``; mail to ``address``."""

    address: str
    password: str = DEFAULT_PASSWORD

    def __str__(self) -> str:
        return self.address


def _address(user: str | MailUser) -> str:
    return user.address if isinstance(user, MailUser) else user


def _imap_quote(mailbox: str) -> str:
    # imaplib sends arguments verbatim; a mailbox name with a space must be a quoted string.
    return '"' + mailbox.replace("\\", "\\\\").replace('"', '\\"') + '"'


def parse_thread(line: bytes | str) -> list[list[int]]:
    """Split a THREAD response (``(1 2)(3 (4)(5))``) into threads, each a list of UIDs.

    Each top-level parenthesised group is one thread; its UIDs are listed depth-first, i.e.
    in the order the response names them (the tree shape below the root is dropped).
    """
    text = line.decode() if isinstance(line, bytes) else line
    threads: list[list[int]] = []
    depth = 0
    for token in re.findall(r"\(|\)|\d+", text):
        if token == "(":
            if depth == 0:
                threads.append([])
            depth += 1
        elif token == ")":
            depth -= 1
        elif depth > 0:
            threads[-1].append(int(token))
        else:
            # a bare number outside parentheses is not valid THREAD syntax
            raise ValueError(f"malformed THREAD response: {text!r}")
    if depth != 0:
        raise ValueError(f"unbalanced THREAD response: {text!r}")
    return threads


class Dovecot:
    """A private Dovecot on 127.0.0.1: IMAP (and IMAPS) on free ports, maildirs in a temp dir.

    Each user has a passwd-file of its own (``passwd.d/<address>``, ``{PLAIN}`` password) that
    Dovecot reads at first use, so :meth:`add_user` and :meth:`fresh_user` work at once while
    the server runs. Each user's mail is
    in ``<root>/mail/<domain>/<local part>`` (maildir). Authentication is plaintext
    (``disable_plaintext_auth = no``); IMAPS uses :attr:`tls_cert`, which clients trust
    through :attr:`ssl_context`.

    Args:
        users: (address, password) pairs to create; defaults to ``bot@example.test`` and
            ``alice@example.test`` with password ``secret``.
        tls: also listen for IMAPS (implicit TLS) with a self-signed certificate.
        port: the plaintext IMAP port (default: a free one).
        keep_files: leave the temp directory behind on :meth:`stop` (for debugging).
    """

    DEFAULT_USERS = (
        ("bot@example.test", DEFAULT_PASSWORD),
        ("alice@example.test", DEFAULT_PASSWORD),
    )

    def __init__(
        self,
        users: Iterable[tuple[str, str]] = DEFAULT_USERS,
        *,
        tls: bool = True,
        port: int | None = None,
        keep_files: bool = False,
    ) -> None:
        self.dovecot_binary = _binary("dovecot", "/usr/sbin/dovecot")
        self.doveadm_binary = _binary("doveadm", "/usr/bin/doveadm")
        if not os.access(DOVECOT_LDA, os.X_OK):
            raise MailServerError(f"{DOVECOT_LDA} is missing (apt-get install -y dovecot-core)")
        self.host = HOST
        self.port = port if port is not None else free_port()
        self.imaps_port: int | None = free_port() if tls else None
        self.keep_files = keep_files
        # mkdtemp makes a 0700 directory; the mail processes run as nobody and must traverse it.
        # (pytest's tmp_path is under a 0700 basetemp, hence our own directory in /tmp.)
        self.root = Path(tempfile.mkdtemp(prefix="dovecot-"))
        self.root.chmod(0o755)
        self.config_path = self.root / "dovecot.conf"
        self.log_path = self.root / "dovecot.log"
        self.passwd_dir = self.root / "passwd.d"
        self.tls_cert: TlsCert | None = make_self_signed_cert(self.root) if tls else None
        self._users: dict[str, MailUser] = {}
        self._users_lock = threading.Lock()
        self._fresh = itertools.count(1)
        self.process: subprocess.Popen[bytes] | None = None
        self.passwd_dir.mkdir()
        for address, password in users:
            self.add_user(address, password)
        self._write_config()

    # -- lifecycle -----------------------------------------------------------------------

    def _write_config(self) -> None:
        root = self.root
        ssl_lines = "ssl = no"
        imaps = "port = 0"
        if self.tls_cert is not None:
            ssl_lines = (
                f"ssl = yes\nssl_cert = <{self.tls_cert.cert_path}\n"
                f"ssl_key = <{self.tls_cert.key_path}"
            )
            imaps = f"address = {HOST}\n    port = {self.imaps_port}"
        for name in ("run", "state", "mail", "home"):
            (root / name).mkdir(exist_ok=True)
        uid, gid = pwd.getpwnam(MAIL_USER).pw_uid, grp.getgrnam(MAIL_GROUP).gr_gid
        for name in ("mail", "home"):
            os.chown(root / name, uid, gid)
        config = f"""\
            # Written by tests/support/mail_servers.py; /etc/dovecot is ignored because of -c.
            base_dir = {root}/run
            state_dir = {root}/state
            log_path = {self.log_path}
            info_log_path = {self.log_path}
            protocols = imap
            listen = {HOST}
            {{ssl}}
            disable_plaintext_auth = no
            auth_mechanisms = plain login
            mail_location = maildir:{root}/mail/%d/%n
            mail_uid = {MAIL_USER}
            mail_gid = {MAIL_GROUP}
            first_valid_uid = 1
            # tests open several sessions per user (IDLE + writer + rig helpers); default is 10
            mail_max_userip_connections = 100
            # nothing here needs to survive a power cut
            mail_fsync = never
            lda_mailbox_autocreate = yes
            passdb {{
              driver = passwd-file
              args = scheme=PLAIN username_format=%u {self.passwd_dir}/%Lu
            }}
            userdb {{
              driver = passwd-file
              args = username_format=%u {self.passwd_dir}/%Lu
              default_fields = home={root}/home/%d/%n
            }}
            namespace inbox {{
              inbox = yes
              separator = /
            }}
            service imap-login {{
              inet_listener imap {{
                address = {HOST}
                port = {self.port}
              }}
              inet_listener imaps {{
                {{imaps}}
              }}
            }}
            """
        text = textwrap.dedent(config).replace("{ssl}", ssl_lines).replace("{imaps}", imaps)
        self.config_path.write_text(text)

    def _write_passwd_file(self, user: MailUser) -> None:
        # One passwd-file per user (the path in the config is .../passwd.d/%Lu): Dovecot's auth
        # process stats an open passwd-file at most once per second, so a user appended to a
        # shared file is "unknown" for up to a second, while a new file is read at first use.
        if any(c in user.address for c in ":/\n") or any(c in user.password for c in ":\n"):
            raise ValueError(f"unusable user for a passwd-file: {user.address!r}")
        path = self.passwd_dir / user.address.lower()
        temporary = path.with_suffix(".tmp")
        temporary.write_text(f"{user.address}:{{PLAIN}}{user.password}::::::\n")
        # atomic, so a concurrent lookup never reads half a line
        os.replace(temporary, path)

    def start(self) -> Dovecot:
        """Start the master process (``dovecot -F``) and wait for its IMAP greeting (~30 ms).

        Raises:
            MailServerError: Dovecot exited or did not greet within 10 s; the message carries
                the tail of its log and stderr. The temp directory is kept for inspection.
        """
        if self.process is not None:
            raise MailServerError("dovecot is already running")
        stderr = (self.root / "dovecot.stderr").open("wb")
        try:
            self.process = subprocess.Popen(
                [self.dovecot_binary, "-F", "-c", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
            )
        finally:
            stderr.close()
        deadline = time.monotonic() + 10
        # Wait for Dovecot's own greeting on the IMAP port, not just an open port: if someone
        # else holds the port, Dovecot dies on bind while a connect would still succeed.
        while not self._greets(self.port):
            if self.process.poll() is not None:
                code = self.process.returncode
                self.process = None
                raise MailServerError(
                    f"dovecot exited with {code} before greeting on {HOST}:{self.port}\n"
                    f"{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop(remove=False)
                raise MailServerError(
                    f"dovecot did not greet on {HOST}:{self.port} within 10 s\n{self.log_tail()}"
                )
            time.sleep(0.02)
        return self

    def _greets(self, port: int) -> bool:
        try:
            with socket.create_connection((HOST, port), timeout=0.5) as sock:
                return sock.recv(200).startswith(b"* OK")
        except OSError:
            return False

    def stop(self, *, remove: bool = True) -> None:
        """Stop the master (SIGTERM; it takes its IMAP sessions down) and remove the temp dir.

        Args:
            remove: delete the temp directory (unless ``keep_files`` was set).
        """
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        if remove and not self.keep_files:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Dovecot:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def log_tail(self, chars: int = 3000) -> str:
        """The end of Dovecot's log file and of its stderr (where config errors go)."""
        parts = []
        for path in (self.log_path, self.root / "dovecot.stderr"):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace")[-chars:]
                if text:
                    parts.append(f"--- {path.name} ({path})\n{text}")
        return "\n".join(parts) or f"(no log in {self.root})"

    # -- users ---------------------------------------------------------------------------

    @property
    def users(self) -> dict[str, MailUser]:
        """Known users by lower-cased address (a copy)."""
        with self._users_lock:
            return dict(self._users)

    def has_user(self, address: str) -> bool:
        """Whether ``address`` is a user of this Dovecot (case-insensitive)."""
        with self._users_lock:
            return address.lower() in self._users

    def user(self, address: str) -> MailUser:
        """The user with this address.

        Raises:
            KeyError: no such user.
        """
        with self._users_lock:
            return self._users[address.lower()]

    def add_user(self, address: str, password: str = DEFAULT_PASSWORD) -> MailUser:
        """Add a user; the running server knows it at once.

        Raises:
            ValueError: the user exists already (a changed password could stay unseen by
                Dovecot for up to a second), or the address/password cannot go in a passwd-file.
        """
        user = MailUser(address, password)
        with self._users_lock:
            if address.lower() in self._users:
                raise ValueError(f"user {address} exists already")
            self._write_passwd_file(user)
            self._users[address.lower()] = user
        return user

    def fresh_user(self, prefix: str = "user", domain: str = "example.test") -> MailUser:
        """A new user with an empty INBOX (already created, so it has a UIDVALIDITY).

        Use one per test to keep tests on the session-wide server independent.
        """
        user = self.add_user(f"{prefix}{next(self._fresh)}@{domain}")
        self.mailbox_status(user)  # materialises the maildir and INBOX
        return user

    # -- mail ----------------------------------------------------------------------------

    def deliver(
        self,
        user: str | MailUser,
        raw_message: bytes,
        *,
        sender: str = "sender@example.test",
        mailbox: str | None = None,
    ) -> None:
        """Deliver like an MTA does: ``dovecot-lda -d user -f sender [-m mailbox] < message``.

        Args:
            user: the recipient (must be a user of this Dovecot).
            raw_message: the RFC 5322 message; CRLF or LF line ends both work (maildir stores
                LF, IMAP serves CRLF).
            sender: the envelope sender (``-f``).
            mailbox: deliver into this mailbox instead of INBOX (created if missing).

        Raises:
            MailServerError: the LDA failed (exit 67 = unknown user, 75 = temporary failure).
        """
        args = [DOVECOT_LDA, "-c", str(self.config_path), "-d", _address(user), "-f", sender]
        if mailbox is not None:
            args += ["-m", mailbox]
        done = subprocess.run(args, input=raw_message, capture_output=True, check=False)
        if done.returncode != 0:
            raise MailServerError(
                f"dovecot-lda -d {_address(user)} exited with {done.returncode}: "
                f"{done.stderr.decode(errors='replace').strip()}\n{self.log_tail(1000)}"
            )

    def doveadm(self, *args: str) -> str:
        """Run ``doveadm -c <this config> *args`` and return its stdout.

        Example: ``dovecot.doveadm("mailbox", "list", "-u", "bot@example.test")``.

        Raises:
            MailServerError: doveadm exited non-zero (e.g. 67 unknown user, 68 no such mailbox).
        """
        return self._doveadm(args)[1]

    def _doveadm(self, args: Iterable[str], ok: Iterable[int] = (0,)) -> tuple[int, str]:
        command = [self.doveadm_binary, "-c", str(self.config_path), *args]
        done = subprocess.run(command, capture_output=True, check=False)
        if done.returncode not in ok:
            raise MailServerError(
                f"doveadm {' '.join(args)} exited with {done.returncode}: "
                f"{done.stderr.decode(errors='replace').strip()}"
            )
        return done.returncode, done.stdout.decode(errors="replace")

    def _tab_rows(self, *args: str) -> list[dict[str, str]]:
        # -f tab prints a header line of field names, then one tab-separated line per row.
        lines = self.doveadm("-f", "tab", *args).splitlines()
        if not lines:
            return []
        header = lines[0].split("\t")
        return [dict(zip(header, line.split("\t"), strict=False)) for line in lines[1:] if line]

    def kick(self, user: str | MailUser) -> bool:
        """Drop all of the user's IMAP connections (``doveadm kick``).

        The server sends ``* BYE`` and closes the socket; an IDLE in progress ends that way.

        Returns:
            Whether any connection was kicked (doveadm exits 68 when there was none).
        """
        code, _ = self._doveadm(["kick", _address(user)], ok=(0, 68))
        return code == 0

    def create_mailbox(self, user: str | MailUser, mailbox: str) -> None:
        """Create a mailbox (``doveadm mailbox create``)."""
        self.doveadm("mailbox", "create", "-u", _address(user), mailbox)

    def mailbox_status(self, user: str | MailUser, mailbox: str = "INBOX") -> dict[str, int]:
        """``messages``, ``recent``, ``unseen``, ``uidnext``, ``uidvalidity``, ``highestmodseq``."""
        fields = "messages recent unseen uidnext uidvalidity highestmodseq"
        rows = self._tab_rows("mailbox", "status", "-u", _address(user), fields, mailbox)
        if not rows:
            raise MailServerError(f"no status for {mailbox!r} of {_address(user)}")
        return {key: int(value) for key, value in rows[0].items() if value.isdigit()}

    def set_uidvalidity(
        self, user: str | MailUser, mailbox: str = "INBOX", value: int | None = None
    ) -> int:
        """Force a UIDVALIDITY change (``doveadm mailbox update --uid-validity``).

        The messages and their UIDs stay as they are; only UIDVALIDITY changes, which is what
        a client must treat as "everything you cached about UIDs is void". A session that has
        the mailbox selected is disconnected by Dovecot at its next command with ``* BYE IMAP
        session state is inconsistent, please relogin.``

        Args:
            user: the mailbox owner.
            mailbox: the mailbox to change.
            value: the new UIDVALIDITY (any 32-bit value, lower works too); default: old + 1.

        Returns:
            The new UIDVALIDITY.
        """
        if value is None:
            value = self.mailbox_status(user, mailbox)["uidvalidity"] + 1
        self.doveadm(
            "mailbox", "update", "-u", _address(user), "--uid-validity", str(value), mailbox
        )
        return value

    def mailbox_uids(self, user: str | MailUser, mailbox: str = "INBOX") -> list[int]:
        """The UIDs in the mailbox, ascending (``doveadm fetch uid``)."""
        rows = self._tab_rows("fetch", "-u", _address(user), "uid", "mailbox", mailbox, "ALL")
        return sorted(int(row["uid"]) for row in rows)

    @contextlib.contextmanager
    def imap(self, user: str | MailUser, mailbox: str = "INBOX") -> Iterator[imaplib.IMAP4]:
        """A stdlib :class:`imaplib.IMAP4` session, logged in, with ``mailbox`` EXAMINEd.

        EXAMINE (read-only) leaves \\Seen and \\Recent alone, so the rig's peeking does not
        disturb what the code under test sees.
        """
        address = _address(user)
        password = self.user(address).password
        client = imaplib.IMAP4(self.host, self.port, timeout=10)
        try:
            client.login(address, password)
            status, data = client.select(_imap_quote(mailbox), readonly=True)
            if status != "OK":
                raise MailServerError(f"EXAMINE {mailbox} for {address}: {status} {data!r}")
            yield client
        finally:
            with contextlib.suppress(imaplib.IMAP4.error, OSError):
                client.logout()

    def messages(self, user: str | MailUser, mailbox: str = "INBOX") -> list[bytes]:
        """The raw messages in the mailbox in UID order, as IMAP serves them (CRLF lines)."""
        with self.imap(user, mailbox) as client:
            status, data = client.uid("FETCH", "1:*", "(UID BODY.PEEK[])")
        if status != "OK":
            raise MailServerError(f"UID FETCH failed: {status} {data!r}")
        # imaplib returns (b'1 (UID 5 BODY[] {123}', literal) tuples interleaved with b')'.
        return [bytes(item[1]) for item in data if isinstance(item, tuple)]

    def parsed_messages(self, user: str | MailUser, mailbox: str = "INBOX") -> list[EmailMessage]:
        """:meth:`messages`, parsed with :data:`email.policy.default`."""
        parsed = []
        for raw in self.messages(user, mailbox):
            message = email.message_from_bytes(raw, policy=policy.default)
            assert isinstance(message, EmailMessage)
            parsed.append(message)
        return parsed

    def raw_thread_references(self, user: str | MailUser, mailbox: str = "INBOX") -> bytes:
        """The payload of ``* THREAD`` to ``UID THREAD REFERENCES UTF-8 ALL`` (``b""`` if none)."""
        with self.imap(user, mailbox) as client:
            status, data = client.uid("THREAD", "REFERENCES", "UTF-8", "ALL")
        if status != "OK":
            raise MailServerError(f"UID THREAD failed: {status} {data!r}")
        return b"".join(item for item in data if isinstance(item, bytes))

    def thread_references(self, user: str | MailUser, mailbox: str = "INBOX") -> list[list[int]]:
        """``UID THREAD REFERENCES UTF-8 ALL``: one list of UIDs per thread.

        A message and its reply (linked by In-Reply-To/References) come back in one list; see
        :func:`parse_thread` for the flattening.
        """
        return parse_thread(self.raw_thread_references(user, mailbox))

    @property
    def ssl_context(self) -> ssl.SSLContext:
        """A client context trusting this server's certificate (for IMAPS)."""
        if self.tls_cert is None:
            raise MailServerError("this Dovecot was started with tls=False")
        return self.tls_cert.client_context()


# --------------------------------------------------------------------------------------------
# SMTP

Outcome = Literal["accepted", "response_lost", "refused", "delivery_failed"]


@dataclass(frozen=True)
class ReceivedMessage:
    """One DATA transaction the SMTP server saw.

    Attributes:
        mail_from: the envelope sender (MAIL FROM).
        rcpt_tos: the accepted envelope recipients (RCPT TO), in order.
        data: the message bytes as received (after dot-unstuffing; CRLF line ends).
        received_at: ``time.time()`` when DATA completed.
        outcome: ``accepted``; ``response_lost`` (accepted and delivered, but the connection
            was dropped before the final reply); ``refused`` (a scripted refusal at DATA);
            ``delivery_failed`` (dovecot-lda failed, the client got a 451).
        delivered_to: the recipients that were handed to Dovecot.
        auth_login: the AUTH identity, if the session authenticated.
        tls: whether the session ran under STARTTLS.
    """

    mail_from: str
    rcpt_tos: tuple[str, ...]
    data: bytes
    received_at: float
    outcome: Outcome
    delivered_to: tuple[str, ...]
    auth_login: str | None
    tls: bool

    @property
    def message(self) -> EmailMessage:
        """The data parsed with :data:`email.policy.default`."""
        parsed = email.message_from_bytes(self.data, policy=policy.default)
        assert isinstance(parsed, EmailMessage)
        return parsed


@dataclass
class _Refusal:
    code: int
    message: str
    stage: str
    times: int


class _PortZeroController(Controller):
    """aiosmtpd's Controller, able to bind port 0.

    ``Controller.start()`` opens a test connection to ``self.port`` to make the server build
    its protocol; with port 0 that connection is refused. Reading the bound port first fixes
    that, and a port the kernel picks cannot be stolen between "find a free port" and "bind".
    """

    def _trigger_server(self) -> None:
        assert isinstance(self.server, asyncio.Server)
        self.port = int(self.server.sockets[0].getsockname()[1])
        super()._trigger_server()  # type: ignore[no-untyped-call]  # aiosmtpd leaves it untyped


class _Handler:
    """aiosmtpd hooks: enforce AUTH, apply scripted faults, deliver to Dovecot, record."""

    def __init__(self, owner: SmtpServer) -> None:
        self.owner = owner

    async def handle_MAIL(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        mail_options: list[str],
    ) -> str:
        # We enforce AUTH here instead of aiosmtpd's auth_required: in plain mode that flag
        # needs auth_require_tls=False, which makes aiosmtpd call warnings.warn() in its own
        # thread, and pytest's filterwarnings=error turns that into a failed server.
        if self.owner.require_auth and not session.authenticated:
            return "530 5.7.0 Authentication required"
        refusal = self.owner._take_refusal("MAIL")
        if refusal is not None:
            return refusal
        # Returning a status means aiosmtpd no longer fills the envelope itself.
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 OK"

    async def handle_RCPT(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        rcpt_options: list[str],
    ) -> str:
        refused = self.owner._refused_recipient(address)
        if refused is not None:
            return refused
        refusal = self.owner._take_refusal("RCPT")
        if refusal is not None:
            return refusal
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(rcpt_options)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        owner = self.owner
        raw = bytes(envelope.original_content or b"")
        sender = envelope.mail_from or ""
        login = session.auth_data.login if isinstance(session.auth_data, LoginPassword) else None
        seen = ReceivedMessage(
            mail_from=sender,
            rcpt_tos=tuple(envelope.rcpt_tos),
            data=raw,
            received_at=time.time(),
            outcome="accepted",
            delivered_to=(),
            auth_login=login.decode(errors="replace") if login is not None else None,
            tls=session.ssl is not None,
        )
        refusal = owner._take_refusal("DATA")
        if refusal is not None:
            owner._record(dataclasses.replace(seen, outcome="refused"))
            return refusal
        delivered: list[str] = []
        if owner.dovecot is not None:
            dovecot = owner.dovecot
            loop = asyncio.get_running_loop()

            async def deliver_all() -> str | None:
                for rcpt in envelope.rcpt_tos:
                    if not dovecot.has_user(rcpt):
                        continue
                    deliver = functools.partial(dovecot.deliver, rcpt, raw, sender=sender)
                    try:
                        # dovecot-lda is a subprocess; keep the server loop free meanwhile.
                        await loop.run_in_executor(None, deliver)
                    except MailServerError as error:
                        failed = dataclasses.replace(
                            seen, outcome="delivery_failed", delivered_to=tuple(delivered)
                        )
                        owner._record(failed)
                        first_line = str(error).splitlines()[0]
                        return f"451 4.3.0 Local delivery failed: {first_line}"[:500]
                    delivered.append(rcpt)
                return None

            queued = owner._queued_loss()
            if queued:  # taken, the answer lost, delivered from the queue later
                owner._record(dataclasses.replace(seen, outcome="response_lost"))

                async def later() -> None:
                    await asyncio.sleep(queued)
                    await deliver_all()

                queue = asyncio.ensure_future(later())
                owner._queue_tasks.add(queue)
                queue.add_done_callback(owner._queue_tasks.discard)
                assert isinstance(server.transport, asyncio.Transport)
                server.transport.abort()
                return "250 OK (never sent)"
            # Like a real MTA once it has the final dot: every recipient gets the message even
            # if the client hangs up meanwhile (aiosmtpd cancels the handler when it does).
            refused = await asyncio.shield(deliver_all())
            if refused is not None:
                return refused
        if owner._take_lose_response():
            owner._record(
                dataclasses.replace(seen, outcome="response_lost", delivered_to=tuple(delivered))
            )
            # abort() (not close()) drops the TCP connection at once, without a TLS
            # close_notify: the client sent its final dot and never hears back.
            assert isinstance(server.transport, asyncio.Transport)
            server.transport.abort()
            return "250 OK (never sent)"
        owner._record(dataclasses.replace(seen, delivered_to=tuple(delivered)))
        return "250 2.0.0 Message accepted for delivery"


class SmtpServer:
    """An aiosmtpd SMTP server on 127.0.0.1 (a kernel-chosen port) in a background thread.

    With ``tls=True`` (default) it offers STARTTLS and requires it before AUTH and MAIL; the
    client trusts it through :attr:`ssl_context` (or :attr:`cert_path`). AUTH PLAIN and LOGIN
    are checked against :attr:`username`/:attr:`password`; with ``require_auth=True``
    (default) MAIL FROM without AUTH gets ``530 5.7.0``. With ``tls=False`` there is no
    STARTTLS and AUTH runs in the clear (loopback only).

    Each accepted message is delivered to every recipient that ``dovecot`` knows (others are
    only recorded) before the final ``250``, so once the client has its reply the message is
    in the mailbox.

    Faults are scripted and consumed in order; they are thread-safe to set from the test.

    Args:
        dovecot: where to deliver; ``None`` makes a pure sink.
        username: the AUTH login to accept.
        password: its password.
        tls: offer (and require) STARTTLS.
        require_auth: refuse MAIL FROM before a successful AUTH.
        cert: the certificate to present; default: the Dovecot's, else a new one.
    """

    def __init__(
        self,
        dovecot: Dovecot | None = None,
        *,
        username: str = "bot@example.test",
        password: str = DEFAULT_PASSWORD,
        tls: bool = True,
        require_auth: bool = True,
        cert: TlsCert | None = None,
        smtputf8: bool = True,
    ) -> None:
        self.dovecot = dovecot
        self.smtputf8 = smtputf8
        """Offer SMTPUTF8 (RFC 6531), as Postfix, Gmail and Exchange do."""
        self.username = username
        self.password = password
        self.tls = tls
        self.require_auth = require_auth
        self.host = HOST
        self.port = 0
        self._own_dir: Path | None = None
        if cert is None and tls:
            if dovecot is not None and dovecot.tls_cert is not None:
                cert = dovecot.tls_cert
            else:
                self._own_dir = Path(tempfile.mkdtemp(prefix="smtp-"))
                cert = make_self_signed_cert(self._own_dir)
        self.tls_cert = cert
        self._lock = threading.Lock()
        self._received: list[ReceivedMessage] = []
        self._refusals: list[_Refusal] = []
        self._refused_recipients: dict[str, str] = {}
        self._lose_responses = 0
        self._queue_s = 0.0
        self._queue_tasks: set[asyncio.Future[None]] = set()
        self._auth_failures = 0
        self._auth_judged: weakref.WeakSet[Session] = weakref.WeakSet()
        self._auth_failing: weakref.WeakSet[Session] = weakref.WeakSet()
        self.auth_attempts = 0
        self._controller: _PortZeroController | None = None

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> SmtpServer:
        """Bind and start answering (the server thread is up when this returns)."""
        # aiosmtpd logs every AUTH as a deprecation warning: noise in every failing test's output
        logging.getLogger("mail.log").setLevel(logging.ERROR)
        if self._controller is not None:
            raise MailServerError("the SMTP server is already running")
        tls_context = self.tls_cert.server_context() if self.tls_cert and self.tls else None
        controller = _PortZeroController(
            _Handler(self),
            hostname=HOST,
            port=0,
            # a fixed name: aiosmtpd's default is socket.getfqdn(), a DNS lookup per session
            server_hostname="localhost",
            tls_context=tls_context,
            require_starttls=tls_context is not None,
            authenticator=self._authenticate,
            auth_require_tls=tls_context is not None,
            enable_SMTPUTF8=self.smtputf8,
            ready_timeout=10.0,
        )
        controller.start()
        self._controller = controller
        self.port = controller.port
        return self

    def stop(self) -> None:
        """Stop the server thread (open sessions are cancelled) and remove its temp files."""
        if self._controller is not None:
            self._controller.stop()
            self._controller = None
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
            self._own_dir = None

    def __enter__(self) -> SmtpServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def ssl_context(self) -> ssl.SSLContext:
        """A client context that trusts this server's certificate (pass as ``tls_context``)."""
        if self.tls_cert is None:
            raise MailServerError("this SMTP server runs without TLS")
        return self.tls_cert.client_context()

    @property
    def cert_path(self) -> Path:
        """The PEM certificate to trust (a CA file of one self-signed certificate)."""
        if self.tls_cert is None:
            raise MailServerError("this SMTP server runs without TLS")
        return self.tls_cert.cert_path

    # -- what was received ---------------------------------------------------------------

    @property
    def transactions(self) -> list[ReceivedMessage]:
        """Every completed DATA transaction, refused ones included, in order (a copy)."""
        with self._lock:
            return list(self._received)

    @property
    def messages(self) -> list[ReceivedMessage]:
        """The messages the server took responsibility for (``accepted``, ``response_lost``)."""
        return [m for m in self.transactions if m.outcome in ("accepted", "response_lost")]

    async def wait_for_messages(self, count: int, timeout_s: float = 5.0) -> list[ReceivedMessage]:
        """Wait until :attr:`messages` holds at least ``count`` messages; return them.

        Raises:
            TimeoutError: fewer arrived within ``timeout_s`` seconds.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            messages = self.messages
            if len(messages) >= count:
                return messages
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(messages)} of {count} messages after {timeout_s} s")
            await asyncio.sleep(0.02)

    def _record(self, message: ReceivedMessage) -> None:
        with self._lock:
            self._received.append(message)

    # -- fault injection -----------------------------------------------------------------

    def refuse_next(
        self,
        code: int = 451,
        message: str = "4.3.0 Temporary failure, try again later",
        times: int = 1,
        *,
        at: Literal["MAIL", "RCPT", "DATA"] = "DATA",
    ) -> None:
        """Answer the next ``times`` commands of kind ``at`` with ``code message``.

        At ``DATA`` the refusal is the reply to the final dot (the message was transferred,
        is recorded with outcome ``refused`` and is *not* delivered). 4xx = temporary,
        5xx = permanent.
        """
        with self._lock:
            self._refusals.append(_Refusal(code, message, at, times))

    def refuse_recipient(
        self, address: str, code: int = 550, message: str = "5.1.1 Mailbox unavailable"
    ) -> None:
        """Refuse RCPT TO ``address`` (case-insensitive) until :meth:`reset_faults`."""
        with self._lock:
            self._refused_recipients[address.lower()] = f"{code} {message}"

    def lose_response_after_data(self, times: int = 1, *, queue_s: float = 0.0) -> None:
        """For the next ``times`` messages: deliver, then drop the connection before the 250.

        The client sees the connection die after its final dot (aiosmtplib raises
        ``SMTPServerDisconnected``), yet the message is in the mailbox: an unknown outcome.
        `queue_s`: the message is delivered that long after the drop, as an MTA's queue does
        (Postfix behind a content filter, Gmail, Office 365 take seconds).
        """
        with self._lock:
            self._lose_responses += times
            self._queue_s = queue_s

    def fail_auth(self, times: int = 1) -> None:
        """Make the next ``times`` connections that AUTH fail every attempt with ``535 5.7.8``.

        Counted per connection, not per AUTH command: aiosmtplib's ``login()`` tries each
        advertised mechanism (PLAIN, then LOGIN) until one succeeds, so failing one attempt
        would be invisible to it.
        """
        with self._lock:
            self._auth_failures += times

    def reset_faults(self) -> None:
        """Forget every scripted fault that has not fired yet."""
        with self._lock:
            self._refusals.clear()
            self._refused_recipients.clear()
            self._lose_responses = 0
            self._auth_failures = 0

    def _take_refusal(self, stage: str) -> str | None:
        with self._lock:
            for refusal in self._refusals:
                if refusal.stage == stage:
                    refusal.times -= 1
                    if refusal.times <= 0:
                        self._refusals.remove(refusal)
                    return f"{refusal.code} {refusal.message}"
        return None

    def _refused_recipient(self, address: str) -> str | None:
        with self._lock:
            return self._refused_recipients.get(address.lower())

    def _queued_loss(self) -> float:
        """The queue delay of the next lost response, taken (0: none is queued)."""
        with self._lock:
            if self._lose_responses > 0 and self._queue_s > 0:
                self._lose_responses -= 1
                return self._queue_s
        return 0.0

    def _take_lose_response(self) -> bool:
        with self._lock:
            if self._lose_responses > 0:
                self._lose_responses -= 1
                return True
        return False

    def _authenticate(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        mechanism: str,
        auth_data: Any,
    ) -> AuthResult:
        # handled=False on failure: with the default handled=True aiosmtpd sends nothing and
        # the client hangs until its read timeout.
        with self._lock:
            self.auth_attempts += 1
            if session not in self._auth_judged:
                self._auth_judged.add(session)
                if self._auth_failures > 0:
                    self._auth_failures -= 1
                    self._auth_failing.add(session)
            if session in self._auth_failing:
                return AuthResult(success=False, handled=False)
        ok = isinstance(auth_data, LoginPassword) and auth_data == (
            self.username.encode(),
            self.password.encode(),
        )
        if not ok:
            return AuthResult(success=False, handled=False)
        return AuthResult(success=True, auth_data=auth_data)
