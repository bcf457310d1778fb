r"""The email channel: IMAP IDLE (or polling) in, SMTP out, a durable UID watermark between.

Inbound: one receiving loop per process selects the folder, takes every message above the
watermark (the broker mark ``email:<address>:<folder>`` = ``<UIDVALIDITY>:<last UID>``) in UID
order, hands each to the inbox, then marks it ``\\Seen`` on the server and moves the mark (a
compare-and-set: processes sharing the mailbox never move it back). A message is marked only
after the inbox holds it, so a crash in between takes it again, and the inbox deduplicates it by
its ``Message-ID``. On the first start (no mark) and after a UIDVALIDITY change the loop takes
the folder's unseen messages instead (handled ones were marked ``\\Seen``; the inbox dedupes
the rest by Message-ID). Mail that must not be answered (auto-replies, lists, bounces, our own)
and mail that cannot be read (oversized, malformed) is marked and counted, never retried
forever and never a stop for its neighbours. Any IMAP failure ends the connection; a new one
is built after a backoff (tenacity: exponential with jitter, capped).

Outbound: a reply threads (``In-Reply-To``, ``References``, ``Re:``) and carries a Message-ID
derived from its delivery id, so `reconcile` looks for that id in the Sent folder and in the
bot's own folder (every reply is Bcc'd to the bot) before a retry sends again. Refused
recipients, refused logins and an exceeded per-thread reply rate are permanent: a dead letter
with the reason, not an endless retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import logging
import ssl
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from email.utils import getaddresses, parseaddr
from typing import Any
from urllib.parse import urlencode

import aiosmtplib
from fastapi import APIRouter
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    wait_exponential_jitter,
)

from adapters.channel import (
    Acceptance,
    AdapterStartError,
    Capabilities,
    DeliveryError,
    DeliveryReceipt,
    FileRefused,
    Inbound,
    InboundSink,
    IncomingFile,
    NotRouted,
    Outbound,
    Reconciled,
    Unavailable,
)
from adapters.email.approvals import approval_router
from adapters.email.compose import approval_token, compose_reply, reply_message_id
from adapters.email.imap import CA_HINT, ImapConnection, ImapError, ImapGone, ImapRefused
from adapters.email.message import attachment_content, email_thread, parse, parse_head
from adapters.errors import AdapterError
from adapters.failures import connection_failure
from adapters.reply_files import ReplyFile, read_reply_files
from adapters.unsure import Unsure
from harness_core import Clock, SystemClock

__all__ = ["EmailChannel", "EmailStartError"]

log = logging.getLogger("adapters.email")


class _NotTaken(AdapterError):
    """A mail in hand could not be taken (a fault of ours on it): tried again, then skipped."""


CHANNEL = "email"
_HOUR_MS = 3_600_000
_UNANSWERED_PEOPLE = frozenset(
    {"malformed", "undecodable", "no_sender", "not_routed", "unreadable"}
)
"""Skips of mail a person may have written (logged as warnings)."""
_UNREADABLE_AFTER = 3
"""Reads of one message that failed (the server refused or dropped the FETCH) before it is
skipped: a message the server cannot render held up every later mail for good."""
_START_CHECK_S = 10.0
"""The longest a start waits for the IMAP server to take or refuse the login."""


def _temporary(said: str) -> bool:
    """Whether an IMAP refusal says to try again later (RFC 5530's response codes)."""
    return any(code in said.upper() for code in ("[UNAVAILABLE]", "[INUSE]", "[LIMIT]"))


class EmailStartError(AdapterStartError):
    """The IMAP server refuses the bot's login or its folder at start (one line, no password)."""


class EmailChannel:
    """The email channel adapter (a `ChannelAdapter`; see the module docstring)."""

    name = CHANNEL

    def __init__(
        self,
        *,
        address: str,
        display_name: str = "Agent",
        imap_host: str,
        imap_port: int = 993,
        imap_tls: bool = True,
        smtp_host: str,
        smtp_port: int = 587,
        smtp_security: str = "starttls",
        username: str | None = None,
        password: str,
        ca_file: str | None = None,
        folder: str = "INBOX",
        sent_folder: str = "Sent",
        max_message_bytes: int = 35_000_000,
        poll_seconds: float = 60.0,
        replies_per_hour: int = 20,
        replies_per_address: int = 100,
        timeout_s: float = 30.0,
        clock: Clock | None = None,
        max_backoff_s: float = 60.0,
        approvers: Sequence[str] = (),
        link_secret: str | None = None,
        public_url: str | None = None,
        link_days: float = 30.0,
    ) -> None:
        self.address = address.lower()
        self.domain = self.address.rsplit("@", 1)[1]
        self.display_name = display_name
        self.imap_host, self.imap_port, self.imap_tls = imap_host, imap_port, imap_tls
        self.smtp_host, self.smtp_port, self.smtp_security = smtp_host, smtp_port, smtp_security
        self.username = username or address
        self._password = password
        self.folder = folder
        self.sent_folder = sent_folder
        self.max_message_bytes = max_message_bytes
        self.poll_seconds = poll_seconds
        self.replies_per_hour = replies_per_hour
        self.replies_per_address = replies_per_address
        self.timeout_s = timeout_s
        self.clock = clock or SystemClock()
        self.max_backoff_s = max_backoff_s
        self.recheck_s = 1.0
        """How long `reconcile` waits before looking a second time."""
        self.unsure = Unsure(self.clock, settle_s=30.0)
        """How long after a send whose answer was lost a reply not found yet is "unknown", not
        "absent": a queueing server files our Bcc copy seconds later (D408)."""
        self.ssl_context = ssl.create_default_context(cafile=ca_file) if ca_file else None
        self.skipped: Counter[str] = Counter()
        """Messages not taken, by reason (``auto_submitted``, ``oversized``...)."""
        self._unreadable: Counter[int] = Counter()
        """Failed reads per UID (a success forgets it): `_UNREADABLE_AFTER` skips it."""
        self._faulted: Counter[int] = Counter()
        """Mails in hand that the gateway's own code failed on, by UID (skipped at the third)."""
        self.taken = 0
        self.connections = 0
        """IMAP connections opened by the receiving loop (a reconnect adds one)."""
        self.receiving_error: str | None = None
        """Why receiving is paused, in words naming the server (None while it receives)."""
        self._sink: InboundSink | None = None
        self._loop: asyncio.Task[None] | None = None
        self._sent: dict[str, deque[int]] = {}
        self._imap: ImapConnection | None = None
        self.approvers = frozenset(a.lower() for a in approvers)
        self.link_key = link_secret.encode() if link_secret else None
        self.public_url = public_url.rstrip("/") if public_url else None
        self.link_days = link_days
        self.router: APIRouter | None = (
            approval_router(self) if self.link_key and self.public_url else None
        )
        self.body_limits: dict[str, int] = {}
        """The approval pages take small forms only (the edge's default bound)."""
        links = self.router is not None
        self.capabilities = Capabilities(decisions=links, approvers=links, files=True)
        """Signed approval links decide only with a link secret and a public URL, and only for
        the approvers' addresses."""

    @property
    def mark_name(self) -> str:
        """The broker mark holding this mailbox's watermark."""
        return f"email:{self.address}:{self.folder}"

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self, sink: InboundSink) -> None:
        """Check the login once, then start the receiving loop in the background.

        Raises:
            EmailStartError: the IMAP or SMTP server refuses the login (the password, the user):
                retrying cannot help, and a service that looked up while answering no mail
                would hide it. A server that cannot be reached now is logged and retried.
        """
        await self._check_login()
        await self._check_smtp()
        self._sink = sink
        self._loop = asyncio.ensure_future(self._receive_supervised())
        log.info("email started", extra={"address": self.address, "folder": self.folder})

    def _imap_connection(self, timeout_s: float) -> ImapConnection:
        return ImapConnection(
            self.imap_host,
            self.imap_port,
            tls=self.imap_tls,
            ssl_context=self.ssl_context,
            timeout_s=timeout_s,
        )

    async def _check_login(self) -> None:
        imap = self._imap_connection(min(self.timeout_s, _START_CHECK_S))
        try:
            await asyncio.wait_for(imap.open(self.username, self._password), _START_CHECK_S)
        except (ImapError, OSError, TimeoutError) as exc:
            await imap.close()
            if isinstance(exc, ImapRefused) and not _temporary(str(exc)):
                raise EmailStartError(str(exc)) from None
            return  # the receiving loop says why, in words, and retries
        try:
            # a folder the server has not (a typo, a filter's folder never made) was retried
            # for ever in the background, a warning a minute, while no mail was answered
            await asyncio.wait_for(imap.select(self.folder), _START_CHECK_S)
        except ImapGone:
            pass
        except ImapError as exc:
            if not _temporary(str(exc)):
                raise EmailStartError(
                    f"{exc}: the folder to read (GATEWAY_EMAIL_FOLDER) must exist on the server"
                ) from None
        except (OSError, TimeoutError):
            pass
        finally:
            await imap.close()

    async def _check_smtp(self) -> None:
        """Log in to the SMTP server once, as IMAP is: a refused login stops the start.

        It was first heard of at the first reply, which became a dead letter (an outside
        probe). A server that cannot be reached now is a warning: replies are tried again.
        """
        client = self._smtp_client(min(self.timeout_s, _START_CHECK_S))
        try:
            await asyncio.wait_for(client.connect(), _START_CHECK_S)
        except aiosmtplib.SMTPAuthenticationError as exc:
            raise EmailStartError(
                f"SMTP server {self.smtp_host}:{self.smtp_port} refused the login for user "
                f"{self.username!r} ({exc.code} {_said(exc.message)})"
            ) from None
        except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
            log.warning(
                "email smtp not usable at start",
                extra={"reason": self._smtp_failure(exc, "connecting")},
            )
        finally:
            await self._hang_up(client)

    async def _hang_up(self, client: aiosmtplib.SMTP) -> None:
        """Say QUIT, briefly; the connection is done with whatever it answers."""
        if client.is_connected:
            try:
                await asyncio.wait_for(client.quit(), timeout=min(self.timeout_s, 5))
            except Exception:
                client.close()

    def _smtp_client(self, timeout_s: float) -> aiosmtplib.SMTP:
        """A client of the SMTP server: TLS as configured, and the login, at its connect."""
        return aiosmtplib.SMTP(
            hostname=self.smtp_host,
            port=self.smtp_port,
            username=self.username,
            password=self._password,
            start_tls=self.smtp_security == "starttls",
            use_tls=self.smtp_security == "tls",
            tls_context=self.ssl_context,
            timeout=timeout_s,
        )

    async def stop(self) -> None:
        """Stop receiving (mail and approval links); deliveries keep working. Idempotent."""
        self._sink = None
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)
        imap, self._imap = self._imap, None
        if imap is not None:
            await imap.close()

    async def close(self) -> None:
        """Stop (the SMTP side holds no connection between sends)."""
        await self.stop()

    # -- inbound ---------------------------------------------------------------------------------

    async def _receive_supervised(self) -> None:
        """Receive until stopped; a failure nobody foresaw is logged and receiving starts over."""
        while True:
            try:
                await self._receive_forever()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.error(
                    "email receiving failed",
                    extra={"error": type(exc).__name__, "reason": str(exc)[:200]},
                )
                await asyncio.sleep(self.max_backoff_s)

    async def _receive_forever(self) -> None:
        def waiting(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome is not None else None
            self.receiving_error = str(error)[:500]
            log.warning(
                "email receiving paused",
                extra={
                    "error": type(error).__name__,
                    "reason": self.receiving_error,
                    "retry_in_s": round(state.upcoming_sleep, 1),
                },
            )

        retrying = AsyncRetrying(
            retry=retry_if_exception_type(
                (ImapError, Unavailable, OSError, TimeoutError, _NotTaken)
            ),
            wait=wait_exponential_jitter(multiplier=0.5, max=self.max_backoff_s),
            before_sleep=waiting,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                await self._receive_once()

    async def _receive_once(self) -> None:
        """One connection: select, take what is new, then wait for news and take it, forever."""
        imap = self._imap_connection(self.timeout_s)
        self._imap = imap
        self.connections += 1
        try:
            try:
                await imap.open(self.username, self._password)
            except ImapRefused as exc:
                log.error("email login refused", extra={"reason": str(exc)})
                raise
            selected = await imap.select(self.folder)
            if self.receiving_error is not None:
                log.info("email receiving again", extra={"server": imap.where})
            self.receiving_error = None
            while True:
                await self._take_new(imap, selected.uidvalidity)
                await imap.wait_for_news(self.poll_seconds)
        except ImapGone as exc:
            log.warning("email connection lost", extra={"reason": str(exc)})
            raise
        finally:
            if self._imap is imap:
                self._imap = None
            await imap.close()

    async def _take_new(self, imap: ImapConnection, uidvalidity: int) -> None:
        """Take batches until a search finds nothing and no new mail was announced meanwhile.

        Mail that arrives while a batch is taken is announced (``EXISTS``) inside the response
        to one of its commands, once: the server does not announce it again when IDLE starts,
        so a batch is followed by another search before the loop idles (decision D138).
        """
        floor = 0  # taken by this loop: never again in it, even if the mark could not move
        while True:
            imap.take_news()  # what was announced so far, the next search sees
            top = await self._take_batch(imap, uidvalidity, floor)
            if top:
                floor = top
            elif not imap.take_news():
                return

    async def _take_batch(self, imap: ImapConnection, uidvalidity: int, floor: int) -> int:
        """Take every message above the watermark and `floor`; the highest UID taken (or 0)."""
        sink = self._sink_or_fail()
        mark = await sink.get_mark(self.mark_name)
        validity, last = _split_mark(mark)
        if mark is None or validity != uidvalidity:
            if mark is not None:
                log.warning(
                    "email uidvalidity changed",
                    extra={"was": validity, "now": uidvalidity, "folder": self.folder},
                )
            uids = await imap.unseen()  # handled mail is \Seen; the inbox dedupes the rest
            last = 0
        else:
            uids = await imap.uids_after(max(last, floor))
        uids = [uid for uid in uids if uid > floor]
        for uid in uids:
            await self._take(imap, uid)
            mark = await self._advance(sink, mark, f"{uidvalidity}:{max(uid, last)}")
        return uids[-1] if uids else 0

    async def _take(self, imap: ImapConnection, uid: int) -> None:
        """Hand one message to the inbox (or skip it), then mark it handled on the server."""
        sink = self._sink_or_fail()
        if max(self._unreadable[uid], self._faulted[uid]) >= _UNREADABLE_AFTER:
            self._unreadable.pop(uid, None)
            self._faulted.pop(uid, None)
            self._skip(uid, "unreadable")
            with contextlib.suppress(ImapError, OSError, TimeoutError):  # best effort: the mark
                await imap.mark_seen(uid)  # moves past it whatever the server says
            return
        try:
            size = await imap.size(uid)
            if size is None:
                return  # expunged meanwhile
            oversized = size > self.max_message_bytes
            # a message too large to read is taken from its header: its sender is told (D169)
            raw = await (imap.fetch_header(uid) if oversized else imap.fetch(uid))
        except (ImapError, OSError, TimeoutError):
            self._unreadable[uid] += 1
            raise
        self._unreadable.pop(uid, None)
        if raw is None:
            return
        read = functools.partial(parse_head, size=size) if oversized else parse
        # a hostile header is costly to parse (50,000 addresses: seconds): off the event loop
        parsed = await asyncio.to_thread(
            read,
            raw,
            mailbox_address=self.address,
            own_domain_ids=self.domain,
            max_bytes=self.max_message_bytes,
            now_ms=self.clock.now_ms(),
        )
        if parsed.inbound is None:
            self._skip(uid, parsed.reason)
        else:
            try:
                # a reply names its thread in headers the sender wrote; so does a new mail
                # whose own Message-ID is a thread's root (one day on, past the inbox's dedupe,
                # a stranger's mail with it was taken into that thread as its newest)
                inbound = await self._own_thread_unless_in_it(sink, parsed.inbound)
                acceptance = await self._hand_over(sink, inbound, raw, uid)
            except NotRouted as exc:
                self._skip(uid, "not_routed")
                log.warning("email not routed", extra={"reason": str(exc)})
            except (Unavailable, ImapError, OSError, TimeoutError):
                raise  # the gateway's or the server's, for now: the same mail is taken again
            except Exception as exc:
                # the mail in hand: what failed on it fails again, and held up every mail
                # after it; tried again soon, then skipped (unreadable) after its third try
                self._faulted[uid] += 1
                raise _NotTaken(
                    f"mail uid {uid} could not be taken ({type(exc).__name__}); try "
                    f"{self._faulted[uid]} of {_UNREADABLE_AFTER}"
                ) from exc
            else:
                self._faulted.pop(uid, None)
                self.taken += not acceptance.duplicate
                log.info(
                    "email taken",
                    extra={
                        "uid": uid,
                        "lane": acceptance.lane,
                        "duplicate": acceptance.duplicate,
                        "oversized": oversized,
                    },
                )
        await imap.mark_seen(uid)

    async def _own_thread_unless_in_it(self, sink: InboundSink, inbound: Inbound) -> Inbound:
        """`inbound`, moved to a thread of its own when its sender is not in the one it names.

        `References` is the sender's to write: anyone who learned a thread's root Message-ID
        could write into it, read what the agent knows there in the answer (sent to them
        alone), stop its run or take its approval reminders. A thread's people are the
        addresses its messages came from and went to (From, To, Cc), kept with the newest
        (``people``, D363); a mail from anyone else naming the thread goes to the thread
        ``<root> from <address>``, the same for each of their mails, so their own
        conversation holds together (D302).
        """
        known = await sink.known(inbound.thread)
        sender = inbound.author.id.lower()
        if known is None:
            return inbound
        people = _people(known.reply_context)
        if sender in people:
            # the newest message's people alone: a colleague in Cc who answered the bot alone
            # made the thread's author an outsider of their own thread
            newest = _people(inbound.reply_context)
            kept = sorted(newest) + sorted(people - newest)[: max(0, _MAX_PEOPLE - len(newest))]
            context = {**inbound.reply_context, "people": kept}
            return Inbound.model_validate({**inbound.model_dump(), "reply_context": context})
        root = inbound.thread.thread
        own = f"{root} from {sender}"
        if len(own) > _MAX_OWN_THREAD:  # a root holds at most 250 characters: this fits
            own = f"{root} from {hashlib.sha256(sender.encode()).hexdigest()[:16]}"
        log.info("email from outside its thread", extra={"lane": inbound.thread.lane})
        return inbound.model_copy(update={"thread": email_thread(self.address, own)})

    async def _hand_over(
        self, sink: InboundSink, inbound: Inbound, raw: bytes, uid: int
    ) -> Acceptance:
        """Accept `inbound`, under its own id when another mail took its Message-ID (D382).

        Its files are held under the mail's own id from the start, so a mail that reuses a
        Message-ID gets its own files, and a part the first mail lacks is not left held under
        the first's key, never read.
        """
        own = _own_id(inbound)
        files = own.message_id
        acceptance = await sink.accept(await self._with_files(sink, inbound, raw, files))
        if acceptance.reused:  # another mail took this Message-ID first
            acceptance = await sink.accept(await self._with_files(sink, own, raw, files))
            log.warning(
                "email reused a Message-ID: taken under its own id",
                extra={"uid": uid, "lane": acceptance.lane},
            )
        return acceptance

    async def _with_files(
        self, sink: InboundSink, inbound: Inbound, raw: bytes, key: str
    ) -> Inbound:
        """`inbound` with its attachments' content held (before it is accepted; D226).

        The content comes from the message already read: a retried take (a crash before the
        message was marked handled) finds it held under `key` (the mail's own id) and part.
        """
        if not inbound.attachments:
            return inbound

        def reader(ref: str) -> Callable[[int], Awaitable[bytes]]:
            async def read(limit: int) -> bytes:
                try:  # a whole message parsed again: off the event loop, as `parse` is
                    content = await asyncio.to_thread(attachment_content, raw, ref)
                except Exception:  # the message is in hand: what fails on it fails for good
                    content = None  # (taken for "later", it held up every mail after it)
                if content is None:
                    raise FileRefused("its content could not be decoded")
                return content

            return read

        incoming = [
            IncomingFile(a, f"{key}:{a.ref}", reader(a.ref or "")) for a in inbound.attachments
        ]
        taken = await sink.take_files(inbound.thread, incoming)
        return inbound.model_copy(update={"attachments": taken})

    def _skip(self, uid: int, reason: str) -> None:
        self.skipped[reason] += 1
        # a person's mail left unanswered is an operator's to look at (the uid finds it in the
        # folder); machine mail not answered is the loop guard working
        level = logging.WARNING if reason in _UNANSWERED_PEOPLE else logging.INFO
        log.log(level, "email skipped", extra={"uid": uid, "reason": reason})

    async def _advance(self, sink: InboundSink, mark: str | None, value: str) -> str | None:
        """Move the watermark to `value` unless another process moved it further."""
        for _ in range(5):
            have, want = _split_mark(mark), _split_mark(value)
            if mark is not None and have[0] == want[0] and have[1] >= want[1]:
                return mark  # another process got further in the same UIDVALIDITY
            if await sink.put_mark(self.mark_name, value, expect=mark):
                return value
            mark = await sink.get_mark(self.mark_name)
        return mark

    # -- outbound ------------------------------------------------------------------------------

    async def deliver(self, outbound: Outbound) -> DeliveryReceipt:
        """Send the reply by SMTP, then file it in the Sent folder (best effort).

        Raises:
            DeliveryError: see the module docstring.
        """
        if _closed_by_asker(outbound):  # they closed it from their own link: they know
            return DeliveryReceipt(
                delivery_id=outbound.delivery_id, delivered_at_ms=self.clock.now_ms()
            )
        held = self._take_rate(outbound)  # before the send: deliveries run side by side
        try:
            files = await read_reply_files(self._sink, outbound)
            message = self._compose(outbound, files)
            # Bcc ourselves, first: servers that deliver in order file our copy before
            # anyone's, so a reply someone received is one `reconcile` can find; those an
            # earlier attempt reached are not sent it again (a retry after a refusal for later)
            kept = await self._reached(outbound.delivery_id)
            reached = frozenset(kept.split()) if kept else frozenset()

            def unreached(message: EmailMessage) -> list[str]:
                return [
                    r for r in [self.address, *_recipients(message)] if r.lower() not in reached
                ]

            recipients = unreached(message)
            try:
                try:
                    refused = await self._send(message, recipients)
                except _NoSmtpUtf8:
                    # nothing was sent: without the copies the server cannot address, the
                    # sender still gets the answer (a copied jürgen@ killed it for everyone)
                    narrowed = self._compose(outbound, files, ascii_copies=True)
                    if getattr(narrowed.policy, "utf8", False):  # the sender's, or ours
                        raise
                    message, recipients = narrowed, unreached(narrowed)
                    refused = await self._send(message, recipients)
            except DeliveryError as exc:
                if exc.unknown_outcome:  # it may have been taken: reconcile waits to see
                    self.unsure.lost(outbound.delivery_id)
                raise
            if refused:
                await self._partly_refused(outbound.delivery_id, recipients, refused, kept)
        except BaseException:
            for sent, stamp in held:  # nothing went out: it does not count
                sent.remove(stamp)
            raise
        await self._file_sent(message)
        return DeliveryReceipt(
            delivery_id=outbound.delivery_id,
            channel_message_ids=(str(message["Message-ID"]),),
            delivered_at_ms=self.clock.now_ms(),
        )

    async def _reached(self, delivery_id: str) -> str | None:
        """Whom earlier attempts reached, spaces between (None: none was refused in part)."""
        if self._sink is None:
            return None
        return await self._sink.get_mark(_reached_mark(delivery_id))

    async def _partly_refused(
        self,
        delivery_id: str,
        recipients: list[str],
        refused: Mapping[str, aiosmtplib.SMTPResponse],
        kept: str | None,
    ) -> None:
        """Settle a send the server refused for some recipients (it took it for the rest).

        Refused for good (5xx), they are said in the log and the reply stands. Refused for
        later (4xx: greylisting, a full mailbox), the delivery fails for later too, the ones
        it reached kept in a broker mark: the retry sends it to the others only. A 4xx for a
        Cc was taken for delivered, and that person never got the answer (an outside probe).
        """
        reached = frozenset(kept.split()) if kept else frozenset()
        said = {str(address).lower(): response for address, response in refused.items()}
        people = {a.lower() for a in recipients if a != self.address}
        codes = sorted({str(getattr(r, "code", "?")) for r in said.values()})
        log.warning("email recipients refused", extra={"count": len(said), "codes": codes})
        if people <= set(said) and not reached - {self.address.lower()}:
            # only our own Bcc copy went out: nobody the reply is for received it
            answers = list(said.values())
            raise DeliveryError(_refused(answers), permanent=_for_good(answers))
        later = [r for r in said.values() if not _for_good([r])]
        if not later:
            return  # the rest have it; those refused for good are in the log
        now = reached | {a.lower() for a in recipients if a.lower() not in said}
        mark = _reached_mark(delivery_id)  # as this attempt read it: another's move is said
        if not await self._sink_or_fail().put_mark(mark, " ".join(sorted(now)), expect=kept):
            log.warning("email reached recipients not kept", extra={"delivery": delivery_id})
        raise DeliveryError(
            f"{_refused(later)} for {len(later)} of {len(people)} recipients, to be tried again "
            "(the others have it)"
        )

    async def _send(
        self, message: EmailMessage, recipients: list[str]
    ) -> dict[str, aiosmtplib.SMTPResponse]:
        """Connect (TLS, login), then send; the refused recipients.

        Raises:
            DeliveryError: in words naming the server (D171). A failure before the message
                was handed over (connecting, TLS, login) is certain: nothing was sent; one
                while sending has an unknown outcome (the server may have taken it).
        """
        where = f"{self.smtp_host}:{self.smtp_port}"
        client = self._smtp_client(self.timeout_s)
        phase = "connecting"
        try:
            await client.connect()  # and STARTTLS, and the login
            phase = "sending"
            refused, _ = await client.send_message(
                message, sender=self.address, recipients=recipients
            )
        except aiosmtplib.SMTPRecipientsRefused as exc:
            raise DeliveryError(
                _refused(exc.recipients), permanent=_for_good(exc.recipients)
            ) from None
        except aiosmtplib.SMTPNotSupported as exc:
            if phase != "sending":
                raise DeliveryError(self._smtp_failure(exc, phase)) from None
            # an address with a non-ASCII local part, and a server without SMTPUTF8: nothing
            # was sent, and sending again cannot help until the server changes
            raise _NoSmtpUtf8(
                f"SMTP server {where} cannot take this message: {_said(str(exc))}",
                permanent=True,
            ) from None
        except aiosmtplib.SMTPAuthenticationError as exc:
            raise DeliveryError(
                f"SMTP server {where} refused the login for user {self.username!r} "
                f"({exc.code} {_said(exc.message)})",
                permanent=True,
            ) from None
        except aiosmtplib.SMTPResponseException as exc:
            said = f"{exc.code} {_said(exc.message)}"
            if isinstance(exc, aiosmtplib.SMTPConnectResponseError):  # its greeting: retried
                raise DeliveryError(
                    f"SMTP server {where} refused the connection ({said})"
                ) from None
            what = "the message" if phase == "sending" else "the session"
            raise DeliveryError(
                f"SMTP server {where} refused {what} ({said})", permanent=500 <= exc.code < 600
            ) from None
        except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
            # while sending, the connection broke: the server may have taken the message
            raise DeliveryError(
                self._smtp_failure(exc, phase), unknown_outcome=phase == "sending"
            ) from None
        finally:
            await self._hang_up(client)  # sent or not, the connection is done with
        return dict(refused)

    def _smtp_failure(self, error: BaseException, phase: str) -> str:
        if isinstance(error, aiosmtplib.SMTPException) and not isinstance(
            error, (ConnectionError, TimeoutError)
        ):  # the client's own words (no STARTTLS offered, no AUTH...): no secret in them
            return f"SMTP server {self.smtp_host}:{self.smtp_port}: {_said(str(error))} ({phase})"
        return connection_failure(
            error,
            protocol="SMTP",
            host=self.smtp_host,
            port=self.smtp_port,
            timeout_s=self.timeout_s,
            phase=phase,
            ca_hint=CA_HINT,
        )

    def _compose(
        self, outbound: Outbound, files: Sequence[ReplyFile] = (), *, ascii_copies: bool = False
    ) -> EmailMessage:
        now = datetime.fromtimestamp(self.clock.now_ms() / 1000, tz=UTC)
        try:
            return compose_reply(
                outbound,
                from_address=self.address,
                from_name=self.display_name,
                domain=self.domain,
                now=now,
                approval_links=self._approval_links(outbound, now),
                files=files,
                ascii_copies=ascii_copies,
            )
        except ValueError as exc:  # no one to answer (the thread's sender is the bot...)
            raise DeliveryError(f"cannot compose the reply: {exc}", permanent=True) from None

    def _approval_links(self, outbound: Outbound, now: datetime) -> dict[str, str] | None:
        """Signed approve/deny links, when the thread's author is an approver (else none).

        The approval request goes to the author alone; a link works only for the pending
        batch it names, only from an approver, and once (decision D93).
        """
        view = outbound.approval
        if outbound.kind != "approval_request" or view is None:
            return None
        if self.link_key is None or self.public_url is None:
            return None
        author = parseaddr(str(outbound.reply_context.get("from") or ""))[1].lower()
        if author not in self.approvers:
            return None
        links = {}
        for decision in ("approve", "deny"):
            try:
                token = approval_token(
                    key=self.link_key,
                    session=view.session,
                    run_id=view.run_id,
                    wait_id=view.wait_id,
                    calls=[(c.tool_call_id, c.args_digest) for c in view.calls],
                    approver=author,
                    decision=decision,
                    expires_at=now + timedelta(days=self.link_days),
                )
            except ValueError:  # a batch too large for a link: the request goes out without
                return None  # links (it says to decide elsewhere), never as a dead letter
            lane = outbound.thread.lane
            query = urlencode({"lane": lane, "sig": self.lane_signature(token, lane)})
            links[decision] = f"{self.public_url}/email/approvals/{token}?{query}"
        return links

    def lane_signature(self, token: str, lane: str) -> str:
        """Binds a link's lane to its token (the token names the batch, the lane routes it)."""
        assert self.link_key is not None
        mac = hmac.new(self.link_key, f"lane\n{token}\n{lane}".encode(), hashlib.sha256)
        return mac.hexdigest()[:32]

    def _take_rate(self, outbound: Outbound) -> list[tuple[deque[int], int]]:
        """Count this reply against the loop breakers; what was counted (or a dead letter).

        The bounds are per thread, and per person across threads. An auto-responder that
        answers without `In-Reply-To` or `References` starts a new thread with each answer:
        only the per-person bound stops that loop.
        """
        now = self.clock.now_ms()
        person = parseaddr(str(outbound.reply_context.get("from") or ""))[1].lower()
        bounds = (
            (outbound.thread.lane, self.replies_per_hour, "this thread"),
            (f"to {person}", self.replies_per_address, "this address"),
        )
        counted: list[deque[int]] = []
        for key, limit, what in bounds:
            sent = self._sent.setdefault(key, deque())
            while sent and now - sent[0] > _HOUR_MS:
                sent.popleft()
            if len(sent) >= limit:
                raise DeliveryError(
                    f"reply rate limit: {len(sent)} replies to {what} within an hour",
                    permanent=True,
                )
            counted.append(sent)
        for sent in counted:
            sent.append(now)
        return [(sent, now) for sent in counted]

    async def _file_sent(self, message: EmailMessage) -> None:
        imap = await self._side_connection()
        if imap is None:
            return
        try:
            try:
                await imap.append(bytes(message), self.sent_folder)
            except ImapGone:
                raise
            except ImapError:  # most likely no such folder yet: create it, once
                await imap.create(self.sent_folder)
                await imap.append(bytes(message), self.sent_folder)
        except ImapError as exc:
            log.warning("email sent copy not filed", extra={"reason": str(exc)})
        finally:
            await imap.close()

    async def reconcile(self, outbound: Outbound) -> Reconciled:
        """Whether a reply with this delivery's Message-ID is in the Sent folder or our folder."""
        message_id = reply_message_id(outbound.delivery_id, self.domain, outbound.thread.thread)
        # an attempt made before the ids carried their thread (D345) was sent under this one
        plain = reply_message_id(outbound.delivery_id, self.domain)
        wanted = (message_id,) if plain == message_id else (message_id, plain)
        imap = await self._side_connection()
        if imap is None:
            return "unknown"
        try:
            # where a copy may be: Sent (filed after a send), our folder (the server's copy of
            # our Bcc), and INBOX, where that copy lands when a filter moves the people's mail
            # to our folder but not the bot's own
            folders = dict.fromkeys((self.sent_folder, self.folder, "INBOX"))
            for look in range(2):
                if look:  # a copy the server took may still be on its way to our folder
                    await asyncio.sleep(self.recheck_s)
                for folder in folders:
                    try:
                        await imap.select(folder)
                    except ImapGone:
                        raise
                    except ImapError:
                        continue  # no such folder
                    for one in wanted:
                        if await imap.find(one):
                            self.unsure.found(outbound.delivery_id)
                            return "delivered"
            # a server that queues may file our copy later: "unknown" (look again) until the
            # doubt is 30 s old, in this process or the next (a restart forgot it, and the
            # second copy went out while the first was still queued: an outside probe)
            return "absent" if self.unsure.absent(outbound.delivery_id) else "unknown"
        except ImapError as exc:
            log.info("email reconcile failed", extra={"reason": str(exc)})
            return "unknown"
        finally:
            await imap.close()

    async def _side_connection(self) -> ImapConnection | None:
        """A short-lived IMAP connection for writes and lookups (the loop's one is IDLE)."""
        imap = self._imap_connection(self.timeout_s)
        try:
            await imap.open(self.username, self._password)
        except ImapError as exc:
            log.warning("email side connection failed", extra={"reason": str(exc)})
            await imap.close()
            return None
        return imap

    @property
    def sink(self) -> InboundSink | None:
        """Where decisions from approval links go (None until started)."""
        return self._sink

    def _sink_or_fail(self) -> InboundSink:
        if self._sink is None:
            raise Unavailable("the email channel is not started")
        return self._sink


def _split_mark(mark: str | None) -> tuple[int, int]:
    if not mark:
        return (0, 0)
    validity, _, last = mark.partition(":")
    try:
        return (int(validity), int(last))
    except ValueError:
        return (0, 0)


def _recipients(message: EmailMessage) -> list[str]:
    pairs = getaddresses([str(v) for k in ("To", "Cc") for v in message.get_all(k, [])])
    return [address.lower() for _, address in pairs if address]


def _said(text: str) -> str:
    """A server's words as one short line."""
    return " ".join(str(text).split())[:160]


_MAX_OWN_THREAD = 480
"""The longest thread name of a mail from outside the thread it names (a lane holds 512)."""


_MAX_PEOPLE = 100
"""The most addresses a thread keeps as its people (the newest message's first)."""


def _people(context: Mapping[str, Any]) -> frozenset[str]:
    """The addresses a thread's messages came from and went to (lower case)."""
    found: set[str] = set()
    for key in ("from", "to", "cc", "people"):
        value = context.get(key)
        # a stored reply context comes back frozen: its lists are tuples
        for item in value if isinstance(value, list | tuple) else [value] if value else []:
            address = parseaddr(str(item))[1].lower()
            if address:
                found.add(address)
    return frozenset(found)


def _reached_mark(delivery_id: str) -> str:
    """The broker mark naming whom a partly refused delivery reached (spaces between)."""
    return f"email:reached:{delivery_id}"


def _for_good(refusals: Sequence[Any]) -> bool:
    """Whether every refusal is permanent (5xx).

    A 4xx (greylisting, a full mailbox, a rate limit) says to try again later: the outbox does.
    """
    return all(str(getattr(r, "code", "5")).startswith("5") for r in refusals)


def _refused(recipients: Sequence[Any]) -> str:
    codes = sorted({str(getattr(r, "code", "?")) for r in recipients})
    return f"recipients refused ({', '.join(codes)})"


def _closed_by_asker(outbound: Outbound) -> bool:
    """A close of a request its recipient decided (the thread learns it from the answer).

    Mail cannot be edited: a closed request's links stay in the mailbox, so the close is a short
    reply to the person the request went to, unless that person closed it themselves (from its
    links, or by a ``stop``, which is answered anyway).
    """
    closed = outbound.closed
    if outbound.kind != "approval_closed" or closed is None or closed.by is None:
        return False
    asker = parseaddr(str(outbound.reply_context.get("from") or ""))[1].lower()
    return bool(asker) and closed.by.lower() == asker


class _NoSmtpUtf8(DeliveryError):
    """The message needs SMTPUTF8 (an address's local part is not ASCII); the server lacks it."""


def _own_id(inbound: Inbound) -> Inbound:
    """`inbound` under an id of its own: its Message-ID and its content digest (D382).

    The same for each read of the same mail, so a retried take is still a duplicate; the
    reply still answers the Message-ID the sender wrote (``reply_context``).
    """
    assert inbound.content_digest is not None, "only a digest tells the mail apart"
    return inbound.model_copy(
        update={"message_id": f"{inbound.message_id}#{inbound.content_digest}"}
    )
