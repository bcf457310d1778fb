"""An IMAP connection with a timeout around every call and the replies parsed (aioimaplib).

aioimaplib leaves several calls without a timeout (``uid("store")``, IDLE) and keeps waiting on
a connection the server dropped; every call here is bounded, a ``BYE`` or a lost connection is
`ImapGone`, and the caller builds a new connection (decision D92).

aioimaplib also drops the untagged ``* n EXISTS`` a server sends inside the response to another
command (a ``UID STORE``, ``UID FETCH`` or ``UID SEARCH``: only IDLE and NOOP collect them), and
the server announces new mail once: this connection notes every ``EXISTS`` it is told, whatever
the command, and `take_news` says whether one came (decision D138).
"""

from __future__ import annotations

import asyncio
import inspect
import re
import ssl
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

import aioimaplib  # type: ignore[import-untyped]

from adapters.errors import AdapterError
from adapters.failures import connection_failure

__all__ = ["CA_HINT", "ImapConnection", "ImapError", "ImapGone", "ImapRefused", "Selected"]

CA_HINT = "a private CA goes in GATEWAY_EMAIL_CA_FILE"
"""Closes the words of a mail server's certificate nobody trusts (IMAP and SMTP alike)."""

_T = TypeVar("_T")
_EXISTS = re.compile(rb"\*\s+\d+\s+EXISTS\b", re.IGNORECASE)
_IDLE_S = 5 * 60
"""IDLE is renewed this often (RFC 2177 allows 29 minutes; a shorter one notices a silently
dropped connection sooner)."""
_LOGOUT_S = 2.0
_HANGUP_S = 1.0
"""A close waits this long for the server's answer to LOGOUT, then for it to hang up: 3 s at
most, so a channel's stop ends within its deadline (the channel suite's 5 s) whatever the
server does; an answering server takes milliseconds."""


class ImapError(AdapterError):
    """An IMAP command failed; the message is one secret-free line naming the server (D171)."""


class ImapGone(ImapError):
    """The connection is lost (BYE, reset, a call that timed out): build a new one."""


class ImapRefused(ImapError):
    """The server refused the login (wrong credentials): retrying soon will not help."""


@dataclass(frozen=True, slots=True)
class Selected:
    """A selected folder: its UIDVALIDITY and next UID."""

    uidvalidity: int
    uidnext: int


class ImapConnection:
    """One logged-in IMAP connection (one folder selected at a time)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls: bool,
        ssl_context: ssl.SSLContext | None,
        timeout_s: float,
    ) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.ssl_context = ssl_context
        self.timeout_s = timeout_s
        self.lost = asyncio.Event()
        self._imap: Any = None
        self._news = False

    async def open(self, username: str, password: str) -> None:
        """Connect and log in.

        Raises:
            ImapRefused: the credentials were refused.
            ImapGone: the server cannot be reached or does not answer.
        """
        hello = "TLS handshake and greeting" if self.tls else "greeting"
        try:
            if self.tls:
                self._imap = aioimaplib.IMAP4_SSL(
                    self.host, self.port, timeout=self.timeout_s, ssl_context=self.ssl_context
                )
                # IMAP4_SSL takes no conn_lost_cb, but its protocol calls one if it is set
                self._imap.protocol.conn_lost_cb = lambda _exc: self.lost.set()
            else:
                self._imap = aioimaplib.IMAP4(
                    self.host,
                    self.port,
                    timeout=self.timeout_s,
                    conn_lost_cb=lambda _exc: self.lost.set(),
                )
            self._watch_untagged(self._imap.protocol)
        except (OSError, aioimaplib.Abort) as exc:
            raise ImapGone(self._failure(exc, "connecting")) from None
        await self._bounded(self._imap.wait_hello_from_server(), f"connecting: {hello}")
        response = await self._bounded(self._imap.login(username, password), "logging in")
        if response.result != "OK":
            raise ImapRefused(
                f"IMAP server {self.where} refused the login for user {username!r} "
                f"({_first(response)})"
            )

    @property
    def where(self) -> str:
        """``host:port`` of the server, as configured."""
        return f"{self.host}:{self.port}"

    def _failure(self, error: BaseException, phase: str) -> str:
        if isinstance(error, aioimaplib.Abort):  # the client's own words: states, commands
            return f"IMAP connection to {self.where} aborted ({phase}: {str(error)[:160]})"
        return connection_failure(
            error,
            protocol="IMAP",
            host=self.host,
            port=self.port,
            timeout_s=self.timeout_s,
            phase=phase,
            ca_hint=CA_HINT,
        )

    def _watch_untagged(self, protocol: Any) -> None:
        """Note every untagged ``EXISTS``, then let aioimaplib handle (or drop) the line.

        aioimaplib hands an untagged response to the pending sync command (IDLE, SELECT...),
        else to a pending command of the same name, else to a pending NOOP, else drops it: the
        ``EXISTS`` that new mail causes during a ``UID STORE`` is dropped, and the server, having
        announced it, says nothing more when IDLE starts. Its protocol offers no hook for these
        lines, so this wraps the one method every untagged line goes through, on this connection
        only.
        """
        handle = protocol._untagged_response

        def untagged(line: bytes) -> Any:
            if _EXISTS.match(line):
                self._news = True
            return handle(line)

        protocol._untagged_response = untagged

    def take_news(self) -> bool:
        """Whether the server announced messages (``EXISTS``) since the last call; resets."""
        news, self._news = self._news, False
        return news

    @property
    def idling(self) -> bool:
        """Whether an IDLE command is in progress on this connection."""
        return self._imap is not None and bool(self._imap.has_pending_idle())

    @property
    def has_idle(self) -> bool:
        """Whether the server offers IDLE."""
        return self._imap is not None and self._imap.has_capability("IDLE")

    async def select(self, folder: str) -> Selected:
        """Select `folder`; its UIDVALIDITY and UIDNEXT."""
        response = await self._ok(self._imap.select(_quote(folder)), f"select {folder!r}")
        text = b" ".join(
            bytes(line) for line in response.lines if isinstance(line, bytes | bytearray)
        )
        validity = re.search(rb"\[UIDVALIDITY (\d+)\]", text)
        uidnext = re.search(rb"\[UIDNEXT (\d+)\]", text)
        if validity is None:
            raise ImapError(f"IMAP server {self.where} gave no UIDVALIDITY for {folder!r}")
        return Selected(int(validity.group(1)), int(uidnext.group(1)) if uidnext else 0)

    async def uids_after(self, last: int) -> list[int]:
        """UIDs above `last` in the selected folder, ascending."""
        response = await self._ok(self._imap.uid_search(f"UID {last + 1}:*"), "search")
        return sorted(uid for uid in _numbers(response) if uid > last)  # n:* returns the max

    async def unseen(self) -> list[int]:
        """UIDs of the unseen messages of the selected folder, ascending."""
        return sorted(_numbers(await self._ok(self._imap.uid_search("UNSEEN"), "search")))

    async def find(self, message_id: str) -> list[int]:
        """UIDs of the messages with this Message-ID header in the selected folder."""
        response = await self._ok(
            self._imap.uid_search("HEADER", "Message-ID", _quote(message_id)), "search"
        )
        return sorted(_numbers(response))

    async def size(self, uid: int) -> int | None:
        """The message's size in bytes (None: it is gone)."""
        response = await self._ok(self._imap.uid("fetch", str(uid), "(RFC822.SIZE)"), "fetch")
        for line in response.lines:
            if isinstance(line, bytes | bytearray):
                found = re.search(rb"RFC822\.SIZE (\d+)", bytes(line))
                if found:
                    return int(found.group(1))
        return None

    async def fetch(self, uid: int) -> bytes | None:
        """The raw message (without setting the seen flag); None if it is gone."""
        response = await self._ok(self._imap.uid("fetch", str(uid), "(BODY.PEEK[])"), "fetch")
        for line in response.lines:
            if isinstance(line, bytearray):
                return bytes(line)
        return None

    async def fetch_header(self, uid: int) -> bytes | None:
        """The message's header only (a message too large to fetch); None if it is gone."""
        response = await self._ok(self._imap.uid("fetch", str(uid), "(BODY.PEEK[HEADER])"), "fetch")
        for line in response.lines:
            if isinstance(line, bytearray):
                return bytes(line)
        return None

    async def mark_seen(self, uid: int) -> None:
        """Set the seen flag: the message is handled (it is in the inbox, or was skipped)."""
        await self._ok(self._imap.uid("store", str(uid), "+FLAGS.SILENT", r"(\Seen)"), "store")

    async def append(self, raw: bytes, folder: str) -> None:
        """File a message in `folder` (marked seen)."""
        await self._ok(self._imap.append(raw, mailbox=_quote(folder), flags=r"(\Seen)"), "append")

    async def create(self, folder: str) -> None:
        """Create `folder` (an error if it exists)."""
        await self._ok(self._imap.create(_quote(folder)), f"create {folder!r}")

    async def wait_for_news(self, poll_s: float) -> None:
        """Return when the selected folder may have changed: an IDLE push, or a poll interval.

        Raises:
            ImapGone: the server said BYE or the connection dropped meanwhile.
        """
        if not self.has_idle:
            await asyncio.sleep(poll_s)
            await self._ok(self._imap.noop(), "noop")
            return
        idle = await self._bounded(self._imap.idle_start(timeout=_IDLE_S), "IDLE")
        try:
            lines = await self._push_or_lost()
        finally:
            if self._imap.has_pending_idle():
                try:
                    self._imap.idle_done()
                except (RuntimeError, OSError):  # a closed transport (uvloop raises, asyncio not)
                    self.lost.set()
        if self.lost.is_set() or any(
            isinstance(line, bytes | bytearray) and bytes(line).startswith(b"BYE")
            for line in lines or []
        ):
            idle.cancel()
            raise ImapGone(f"IMAP server {self.where} ended the connection (during IDLE)")
        await self._bounded(asyncio.shield(idle), "IDLE")

    async def _push_or_lost(self) -> Any:
        """The server's next IDLE push; None as soon as the connection is lost.

        A connection that ends without a BYE (the server's process killed, a reset) only
        fires the lost callback: the push alone waited out the whole IDLE, five minutes.
        """
        push = asyncio.ensure_future(self._imap.wait_server_push(timeout=_IDLE_S))
        lost = asyncio.ensure_future(self.lost.wait())
        try:
            done, _ = await asyncio.wait({push, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not push.done():
                push.cancel()
        if push not in done:
            return None  # `lost` is set: the caller says the connection is gone
        return push.result()  # its timeout raises, as the push alone did

    async def close(self) -> None:
        """Log out (bounded: `_LOGOUT_S`, `_HANGUP_S`) and drop the connection; never raises.

        aioimaplib never closes its transport itself: after the logout this waits for the
        server to close the connection, and closes the transport if it does not.
        """
        imap, self._imap = self._imap, None
        if imap is None:
            return
        try:
            if not self.lost.is_set():
                await asyncio.wait_for(imap.logout(), timeout=min(self.timeout_s, _LOGOUT_S))
                await asyncio.wait_for(self.lost.wait(), timeout=_HANGUP_S)
        except Exception:  # a connection being dropped may fail in any way
            pass
        transport = getattr(getattr(imap, "protocol", None), "transport", None)
        if transport is not None and not transport.is_closing():
            transport.close()
        for task in list(getattr(imap, "tasks", ())):
            task.cancel()

    async def _ok(self, call: Awaitable[Any], what: str) -> Any:
        response = await self._bounded(call, what)
        if response.result != "OK":
            raise ImapError(f"IMAP {what} failed on {self.where} ({_first(response)})")
        return response

    async def _bounded(self, call: Awaitable[_T], phase: str) -> _T:
        """`call` within the timeout, given up at once if the connection drops meanwhile.

        (A BYE outside IDLE only fires the lost callback; the pending command would wait.)
        `phase` says what the call was for in the error's words.
        """
        if self.lost.is_set():
            if inspect.iscoroutine(call):
                call.close()  # never started: no "coroutine was never awaited" on a dead link
            raise ImapGone(f"the connection to IMAP server {self.where} is lost ({phase})")
        work = asyncio.ensure_future(call)
        lost = asyncio.ensure_future(self.lost.wait())
        try:
            done, _ = await asyncio.wait(
                {work, lost}, timeout=self.timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            if work in done:
                try:
                    return work.result()
                except (OSError, aioimaplib.Abort) as exc:
                    self.lost.set()
                    raise ImapGone(self._failure(exc, phase)) from None
            self.lost.set()
            if lost in done:
                raise ImapGone(f"IMAP server {self.where} closed the connection ({phase})")
            raise ImapGone(
                f"no answer from IMAP server {self.where} within {self.timeout_s:g} s ({phase})"
            )
        finally:
            for task in (work, lost):
                if not task.done():
                    task.cancel()


def _numbers(response: Any) -> list[int]:
    for line in response.lines:
        if isinstance(line, bytes | bytearray) and re.fullmatch(rb"[\d ]*", bytes(line).strip()):
            return [int(n) for n in bytes(line).split()]
    return []


def _first(response: Any) -> str:
    for line in response.lines:
        if isinstance(line, bytes | bytearray):
            return bytes(line).decode("utf-8", "replace")[:120]
    return str(response.result)


def _quote(text: str) -> str:
    """An IMAP quoted string (folder names and header values)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
