"""`WebChannel`: the local channel (HTTP JSON, Server-Sent Events and a plain page).

Threads are identified by id within a space (``default`` unless a request names another); the
lane of thread T is ``web:T``. A message people post is kept in the thread's mailbox, then
handed to the gateway's sink, and acknowledged (202) only after both (a mailbox that cannot
hold it refuses the post: 503; a sink that refuses it leaves a notice in the thread); a click
is handed to the sink, then kept. The mailbox holds the replies the gateway delivers too, so a
thread reads back in order and a reconnecting event stream (``Last-Event-ID``) misses nothing.

Endpoints (under the router's prefix, ``/web`` by default; ``space`` is a query parameter of
the GETs and a body field of the POSTs):

* ``POST /web/threads/{thread}/messages`` ``{"text", "client_message_id"?, "author"?,
  "space"?, "files"?}`` -> 202 ``{"item_id", "session", "lane", "duplicate", "message_id", ...}``.
* ``POST /web/uploads/{thread}``: the same, under a larger body limit (`WebLimits`): files
  are ``[{"name", "media_type"?, "data"}]`` with ``data`` in base64, held by the gateway
  before the message is taken (D223).
* ``POST /web/threads/{thread}/decisions`` ``{"run_id", "wait_id", "decisions": [
  {"tool_call_id", "args_digest", "approved", "reason"?, "result"?, "is_error"?}], "author"?,
  "idempotency_key"?, "space"?}`` -> 202 (an Approve or Deny click; with ``result``, a "Done it
  myself": the person did the action and gives its result, the tool does not run).
* ``GET /web/threads/{thread}?after=&limit=`` -> the thread's items, oldest first.
* ``GET /web/threads/{thread}/events?after=&kinds=`` -> ``text/event-stream``: every item after
  ``after`` (or after the ``Last-Event-ID`` header), then each new one as it is appended; the
  event id is the item's ``seq``, the data the item as JSON; a comment every `keepalive_s`.
  With ``live=1`` the stream also carries unnumbered ``live`` events (``event: live``): what a
  run is doing and has written so far (`adapters.web.live`), never stored, never replayed.
* ``GET /web/threads?space=`` -> the space's threads; ``GET /web/threads/{thread}/page`` and
  ``GET /web/`` -> HTML.

Every refusal is one JSON envelope ``{"error": {"code", "message"}}``: 400 for a malformed
request, 403 ``cross_site``, 404 ``not_routed``, 409 for a decision that can change nothing
(``no_such_request``, ``not_the_request``, ``no_longer_waiting``: nothing is stored), 413
``too_large``, 415 (a body that is not ``application/json``), 503 ``unavailable`` with
``Retry-After``, and 401 ``unauthorized`` when the channel has tokens and the request
names none it knows (`adapters.web.login`; without tokens it has no authentication of its own:
bind it to a trusted interface). POSTs must be ``application/json``
and not cross-site (``Sec-Fetch-Site``), so a web page a person visits cannot post or approve
through their browser; a page whose name was rebound to this machine passes that check, so the
gateway's app refuses any ``Host`` it does not serve before this router runs (`gateway.guards`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import hashlib
import json
import logging
import re
import unicodedata
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args
from urllib.parse import parse_qs, quote, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.types import Receive, Scope, Send

from adapters.channel import (
    Acceptance,
    AdapterStartError,
    Attachment,
    Author,
    Capabilities,
    DecisionInbound,
    DecisionItem,
    DecisionRefused,
    DeliveryError,
    DeliveryReceipt,
    Inbound,
    InboundSink,
    IncomingFile,
    NotRouted,
    Outbound,
    Reconciled,
    ThreadRef,
    Unavailable,
)
from adapters.errors import AdapterError
from adapters.json_bodies import blank, body_problem, read_json, result_problem, text_problem
from adapters.live import LiveUpdate
from adapters.numbers import whole_number
from adapters.store_full import STORE_FULL, store_full
from adapters.web.live import LiveBoard, LiveCursor
from adapters.web.login import WebLogin
from adapters.web.mailbox import (
    DEFAULT_MAILBOX_URL,
    MailboxError,
    MailboxUnavailable,
    NewWebItem,
    WebAppend,
    WebDecision,
    WebItem,
    WebItemKind,
    WebMailbox,
    check_name,
    normal_name,
    open_mailbox,
)
from adapters.web.page import content_security_policy, index_page, login_page, thread_page
from harness_core import Clock, IdGenerator, SuppliedResult, SystemClock, Uuid7Ids
from harness_core.backends.urls import without_password

__all__ = ["WebChannel", "WebLimits", "WebStartError"]

log = logging.getLogger("adapters.web")

_ID_CHARS = "ASCII letters, digits, '.', '_', ':', '@' and '-'"
_CLIENT_ID = r"^[A-Za-z0-9._:@-]{1,200}$"
_KINDS: tuple[str, ...] = get_args(WebItemKind)
_WRAPPING = re.compile(r"[ \t\r\n]+")
"""What base64 may be wrapped in (a line end every 76 characters, as `base64` prints it)."""
_DOWN_SAY_EVERY_MS = 60_000
"""How often a mailbox that goes on refusing items is said again."""
_STREAM_PAGE = 50
"""The most items an event stream reads at once: a client that stops reading holds one page."""
_ANSWERS = frozenset({"reply", "failure_notice"})
"""The items that end a run (their id ends with the run's id): nothing more of it is live."""
WebRefusal = Literal[
    "invalid_json",  # 400: a body that is no JSON
    "invalid_request",  # 400: JSON (or a query) the route does not take
    "invalid_text",  # 400: NUL characters or unpaired surrogates
    "invalid_thread",  # 400: a thread name the mailbox refuses
    "invalid_space",  # 400: a space name the mailbox refuses
    "empty_text",  # 400
    "text_too_long",  # 400: text over the length limit
    "unauthorized",  # 401: no token, or one the channel does not know (D380)
    "cross_site",  # 403: a write from another site
    "not_approver",  # 403: a decision from someone the agent's profile does not name
    "not_routed",  # 404: no route takes the space
    "no_such_file",  # 404: a file the space's session does not hold (unknown or expired)
    "no_such_request",  # 409: a decision nothing in the thread waits for
    "not_the_request",  # 409: a decision naming another run, calls or arguments
    "no_longer_waiting",  # 409: the request was decided, stopped or ended (the page says so)
    "message_id_taken",  # 409: a client_message_id that names another message
    "too_slow",  # 408: a body that trickles (a slot held, nothing sent)
    "too_large",  # 413: a body over the limit
    "unsupported_media_type",  # 415
    "unavailable",  # 503: the gateway cannot hold the message now; send again
]
"""The web channel's closed error codes: its page and clients branch on them."""
_REFUSED_DECISION: dict[str, WebRefusal] = {
    "no_wait": "no_such_request",
    "mismatch": "not_the_request",
    "closed": "no_longer_waiting",
    "not_allowed": "not_approver",
}
"""The codes of a decision that can change nothing (`DecisionRefused.code`): 409, or 403 for
one from someone who is not an approver."""
_UNION_TAGS = frozenset({"str", "_AuthorIn"})
"""How pydantic names the branches of ``str | _AuthorIn`` in an error's location."""


@dataclass(frozen=True)
class WebLimits:
    """What the web channel accepts and how it paces its streams."""

    max_text_chars: int = 32_000
    """The longest message text (characters)."""
    max_body_bytes: int = 256 * 1024
    """The largest request body (bytes), refused before it is parsed."""
    max_upload_bytes: int = 36 * 1024 * 1024
    """The largest body of ``POST /uploads/{thread}`` (a message with its files in base64:
    room for the gateway's default 25 MB of files per message; D223)."""
    max_upload_files: int = 20
    """The most files one post names (the gateway's per-message limit applies after)."""
    max_concurrent_uploads: int = 4
    """Uploads read at once by one process; more are refused 503 with ``Retry-After`` before
    their body is read. An upload holds its body, its JSON and its decoded files (about three
    times its size: 100 MB for the largest), so eight at once took 900 MB (an outside probe)."""
    body_idle_s: float = 15.0
    """The longest a request body may send nothing (then 408 ``too_slow``)."""
    body_grace_s: float = 10.0
    min_body_rate: float = 8_192.0
    """Past `body_grace_s`, a body must have come at this many bytes a second on average (a
    35 MB upload over a link of 64 kbit/s would not be taken in any case): a client that
    trickles a body to hold one of the `max_concurrent_uploads` slots is cut off (D305)."""
    max_streams: int = 1_000
    """Event streams one process keeps open at once; more are refused 503 with ``Retry-After``
    (each re-reads the mailbox every `keepalive_s`: 2,000 idle ones cost a third of a core)."""
    max_client_streams: int | None = None
    """Of those, the most one client address holds at once (None: half of `max_streams`)."""
    max_page: int = 500
    """The most items one ``GET`` returns."""
    keepalive_s: float = 15.0
    """How often an idle event stream sends a comment (and re-checks the mailbox)."""
    retry_after_s: int = 2
    """``Retry-After`` of a 503."""
    reconnect_ms: int = 2000
    """The ``retry:`` an event stream tells browsers to wait before reconnecting."""


def _too_slow(what: str) -> _Refused:
    return _Refused(408, "too_slow", f"the request body came too slowly ({what}); send it again")


class WebStartError(AdapterStartError):
    """The web channel's mailbox cannot be used at start (one line)."""


class _Refused(AdapterError):
    """A request refused with one status and one envelope."""

    def __init__(
        self,
        status: int,
        code: WebRefusal,
        message: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code: WebRefusal = code
        self.message = message
        self.headers = dict(headers or {})

    def response(self) -> JSONResponse:
        return JSONResponse(
            {"error": {"code": self.code, "message": self.message}},
            status_code=self.status,
            headers={**self.headers, "Cache-Control": "no-store"},
        )


class _AuthorIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    id: str = Field(min_length=1, max_length=100)
    name: str | None = Field(default=None, max_length=100)


class _FileIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1, max_length=300)
    media_type: str = Field(default="application/octet-stream", min_length=1, max_length=200)
    data: str
    """The content, base64."""


class _MessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    text: str = ""
    """Left out of an upload of files alone (a message needs its text or a file)."""
    client_message_id: str | None = Field(default=None, pattern=_CLIENT_ID)
    author: str | _AuthorIn | None = None
    space: str = "default"
    files: list[_FileIn] = Field(default_factory=list)


class _DecisionItemIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    tool_call_id: str = Field(min_length=1, max_length=200)
    args_digest: str = Field(min_length=1, max_length=200)
    approved: bool
    reason: str | None = Field(default=None, max_length=1000)
    result: str | None = None
    """The call's result when the person did the action themselves (D263)."""
    is_error: bool = False


class _DecisionIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    run_id: str = Field(min_length=1, max_length=200)
    wait_id: str = Field(min_length=1, max_length=200)
    decisions: list[_DecisionItemIn] = Field(min_length=1, max_length=100)
    author: str | _AuthorIn | None = None
    idempotency_key: str | None = Field(default=None, pattern=_CLIENT_ID)
    space: str = "default"


def _refusal(exc: ValidationError) -> _Refused:
    """The clearest 400 for a body that does not fit: its most specific error, named plainly."""
    if any(e["type"] == "string_unicode" for e in exc.errors()):
        return _Refused(400, "invalid_text", "a string is not valid Unicode text")
    message = body_problem(exc, pattern=f"1-200 characters of {_ID_CHARS}", skip=_UNION_TAGS)
    return _Refused(400, "invalid_request", message)


def _check_text(value: str, what: str) -> None:
    """Refuse what no backend should store: NUL characters and unpaired surrogates."""
    if (problem := text_problem(value, what)) is not None:
        raise _Refused(400, "invalid_text", problem)


def _check_result(item: _DecisionItemIn) -> None:
    """Refuse a supplied result that is empty, too long, or not for an approved call (D263)."""
    if (problem := result_problem(item)) is not None:
        raise _Refused(400, *problem)


def _name(value: str, what: Literal["thread", "space"]) -> str:
    try:
        return normal_name(value, what)
    except ValueError as exc:
        code: WebRefusal = "invalid_thread" if what == "thread" else "invalid_space"
        raise _Refused(400, code, str(exc)) from None


_FULL_SAY_EVERY_S = 60.0
"""How often the log may say that every upload slot is taken."""

_OPERATOR_PREFIX = "operator:"
"""How the gateway names an operator who acted (``operator:<token name>``, gateway.ops.auth)."""


def _author(value: str | _AuthorIn | None, signed: str | None = None) -> Author:
    """Who a message or decision is by: the signed-in token's name, else what it says (D380)."""
    if signed is not None:
        given = None if value is None or value == "" else value
        if given is not None and signed not in (
            (given,) if isinstance(given, str) else (given.id, given.name)
        ):
            raise _Refused(
                400,
                "invalid_request",
                f"signed in as {signed!r}: what you send is by that name (leave 'author' out)",
            )
        return Author(id=signed, name=signed)
    if value is None or value == "":
        return Author(id="anonymous")
    if isinstance(value, str):
        if len(value) > 100:
            raise _Refused(400, "invalid_request", "'author' is longer than 100 characters")
        _check_text(value, "'author'")
        _not_an_operator(value, "'author'")
        return Author(id=value, name=value)
    _check_text(value.id, "'author.id'")
    _check_text(value.name or "", "'author.name'")
    _not_an_operator(value.id, "'author.id'")
    _not_an_operator(value.name or "", "'author.name'")  # the name is what a thread shows
    return Author(id=value.id, name=value.name)


_OWN_NAMES = frozenset({"assistant", "agent", "gateway", "system", "operator", "tool"})
"""Names a thread shows for what the gateway wrote (a reply is "assistant" on the page): a
message of "assistant" read as the agent's own reply (an outside probe)."""

_COLONS = frozenset(":\u2236\ua789\u02d0\u05c3\u02f8\ufe13\ufe55\uff1a\u0589\u1361")
"""A colon and the characters that look like one (fullwidth, ratio, modifier letters...)."""


def _not_an_operator(value: str, what: str) -> None:
    """Refuse a name that could pass for an operator's (the gateway writes ``operator:<name>``).

    A web page names itself: a thread saying "approved by operator:admin" would read as an
    operator's decision, and so would `operator\u200b:admin`, `operat\u03bfr:admin` (a Greek
    omicron) or `operator\uff1aadmin` (a fullwidth colon); a right-to-left override shows
    `\u202enimda` as "admin". So a name holds no invisible or direction-changing character
    and no colon or look-alike of one (look-alike letters are too many to list; colons few).
    """
    # format characters (zero-width, direction overrides) and private use; a line break is
    # visible, and the author tag a thread shows makes it one line (`gateway.profiles`)
    if any(unicodedata.category(c) in ("Cf", "Co") for c in value):
        raise _Refused(
            400, "invalid_request", f"{what} holds an invisible or direction-changing character"
        )
    if unicodedata.normalize("NFKC", value).strip().casefold() in _OWN_NAMES:
        raise _Refused(
            400,
            "invalid_request",
            f"{what} may not be {value.strip()!r}: the thread shows the gateway's own "
            "items under that name",
        )
    if any(c in _COLONS for c in unicodedata.normalize("NFKC", value)):
        raise _Refused(
            400,
            "invalid_request",
            f"{what} may not hold a colon (the gateway names operators {_OPERATOR_PREFIX}<name>)",
        )


class WebChannel:
    """The web channel: a `ChannelAdapter` named ``web`` whose `router` the service mounts.

    `mailbox` is a `WebMailbox` or a URL for `open_mailbox` (default: SQLite in
    ``.gateway/web.db``, created on first use); either way the channel owns it. `stop` stops
    receiving (posts are refused with 503, open event streams end) but keeps delivering, so a
    draining deliverer still reaches the threads; `close` (after the deliverer stopped) also
    closes the mailbox. A closed channel opened from a URL reopens it on the next `start`.
    """

    def __init__(
        self,
        mailbox: WebMailbox | str = DEFAULT_MAILBOX_URL,
        *,
        clock: Clock | None = None,
        ids: IdGenerator | None = None,
        limits: WebLimits | None = None,
        prefix: str = "/web",
        login: WebLogin | None = None,
        secure_cookie: bool = False,
    ) -> None:
        self.login = login
        """Who may use the channel (None: whoever reaches it, under any name; D380)."""
        self._secure_cookie = secure_cookie
        """Whether the sign-in cookie is ``Secure`` whatever the request's scheme (the gateway
        is reached over HTTPS through a proxy that speaks HTTP to it)."""
        self._prefix = prefix
        self._url = mailbox if isinstance(mailbox, str) else None
        self.mailbox: WebMailbox = open_mailbox(mailbox) if isinstance(mailbox, str) else mailbox
        self.clock = clock or SystemClock()
        self.ids = ids or Uuid7Ids(self.clock)
        self.limits = limits or WebLimits()
        self._sink: InboundSink | None = None
        self._stopping = asyncio.Event()
        self._closed = False
        self.delivered = 0
        """Deliveries stored (first attempts of their delivery id)."""
        self.repeated = 0
        """Deliveries whose id the thread held already (stored once, counted here)."""
        self._uploads = asyncio.Semaphore(self.limits.max_concurrent_uploads)
        self._uploading: Counter[str] = Counter()
        """Uploads being read, by client address: one client holds at most half the slots."""
        self._streaming: Counter[str] = Counter()
        """Event streams open, by client address (one holds at most half the places)."""
        self._full_said_at = -_FULL_SAY_EVERY_S
        """When the log last said every upload slot was taken (the clock's seconds)."""
        self._down_since: int | None = None
        """When the mailbox began refusing items (the clock's ms; None: it records)."""
        self._down_failures = 0
        self._down_said_ms = 0
        self.streams = 0
        """Event streams open now, counted from the cap's check (`WebLimits.max_streams`)."""
        self.router = self._build_router(prefix)
        self.body_limits: dict[str, int] = {
            prefix + "/": self.limits.max_body_bytes,
            prefix + "/uploads/": self.limits.max_upload_bytes,
        }
        """The bound of a request body under the router's prefix (the app refuses more unread)."""
        self.capabilities = Capabilities(decisions=True, files=True)
        """Approve/Deny buttons on the thread page (a close is an item the page shows)."""
        self.live = LiveBoard()
        """What runs are doing and writing now, per thread (shown on pages, never stored)."""

    @property
    def name(self) -> str:
        """``web``."""
        return "web"

    async def start(self, sink: InboundSink) -> None:
        """Accept posts into `sink` from now on.

        Raises:
            RuntimeError: the channel was closed and its mailbox was given, not a URL.
            WebStartError: the mailbox cannot be read (a file it may not open or make): the
                service started, printed its banner, then answered every post 503 (an
                outside probe), where the store and the broker stop the start.
        """
        if self._closed:
            if self._url is None:
                raise RuntimeError("this web channel was closed with its mailbox")
            self.mailbox = open_mailbox(self._url)
            self._closed = False
        try:
            await self.ready()
        except (MailboxError, OSError) as exc:
            where = f" at {without_password(self._url)}" if self._url else ""
            said = " ".join(str(exc).split())[:300] or type(exc).__name__
            raise WebStartError(
                f"the web channel's mailbox{where} cannot be used ({said}; GATEWAY_WEB_URL)"
            ) from None
        self._stopping = asyncio.Event()
        self._sink = sink

    async def ready(self) -> None:
        """Read the mailbox once (``/readyz``): raises what it raises when it cannot be read.

        A corrupt or unreadable mailbox refused every post (503) while ``/readyz`` said ok.
        """
        await self.mailbox.threads("default", limit=1)

    async def stop(self) -> None:
        """Stop receiving: refuse posts (503) and end open event streams (idempotent).

        Deliveries, reconciliation and reads keep working until `close`.
        """
        self._sink = None
        self._stopping.set()

    async def close(self) -> None:
        """Stop, and close the mailbox (idempotent)."""
        await self.stop()
        if not self._closed:
            self._closed = True
            await self.mailbox.close()

    # -- outbound ------------------------------------------------------------------------------

    async def show(self, update: LiveUpdate) -> None:
        """Show a live update on its thread's open pages (`adapters.LiveView`); never stored."""
        if update.thread.channel == self.name:
            self.live.show(update)

    async def deliver(self, outbound: Outbound) -> DeliveryReceipt:
        """Store the reply in its thread's mailbox, once per delivery id, and wake its streams.

        Raises:
            DeliveryError: permanent for a thread this channel cannot hold; retryable (with
                ``unknown_outcome`` when the write's reply was lost) when the mailbox fails.
        """
        ref = outbound.thread
        if ref.channel != self.name:
            raise DeliveryError(f"not a web thread: channel {ref.channel!r}", permanent=True)
        try:
            check_name(ref.space, "space")
            check_name(ref.thread, "thread")
            item = NewWebItem(
                kind=outbound.kind,
                id=outbound.delivery_id,
                text=outbound.text,
                approval=outbound.approval,
                closed=outbound.closed,
                files=outbound.files,
                at_ms=self.clock.now_ms(),
            )
        except ValidationError as exc:  # short and free of the reply's text
            where = ".".join(str(part) for part in exc.errors()[0]["loc"])
            raise DeliveryError(
                f"not a deliverable web reply: bad {where}", permanent=True
            ) from None
        except ValueError as exc:
            raise DeliveryError(f"not a deliverable web reply: {exc}", permanent=True) from None
        try:
            appended = await self.mailbox.append(ref.space, ref.thread, item)
        except MailboxUnavailable as exc:
            raise DeliveryError(
                f"web mailbox unavailable ({exc.reason.split(':', 1)[0]})",
                unknown_outcome=exc.unknown_outcome,
            ) from exc
        except MailboxError as exc:
            raise DeliveryError(f"web mailbox refused the reply: {exc}") from exc
        if outbound.kind != "approval_closed":  # it ends what the run streamed (a close does not)
            self.live.clear(ref.space, ref.thread)
        if appended.created:
            self.delivered += 1
        else:
            self.repeated += 1
        stored = appended.item
        log.info(
            "web delivered",
            extra={
                "delivery_id": outbound.delivery_id,
                "lane": ref.lane,
                "seq": stored.seq,
                "repeated": not appended.created,
            },
        )
        return DeliveryReceipt(
            delivery_id=outbound.delivery_id,
            channel_message_ids=(f"{ref.space}/{ref.thread}#{stored.seq}",),
            delivered_at_ms=stored.at_ms,
        )

    async def reconcile(self, outbound: Outbound) -> Reconciled:
        """``delivered`` if the thread holds the delivery id, ``absent`` if not."""
        ref = outbound.thread
        try:
            found = await self.mailbox.find(
                ref.space, ref.thread, outbound.kind, outbound.delivery_id
            )
        except MailboxError:
            return "unknown"
        return "absent" if found is None else "delivered"

    # -- inbound -------------------------------------------------------------------------------

    def _sink_or_refuse(self) -> InboundSink:
        if self._sink is None:
            raise _Refused(
                503,
                "unavailable",
                "the web channel is not running; retry later",
                {"Retry-After": str(self.limits.retry_after_s)},
            )
        return self._sink

    async def _body(self, request: Request, *, limit: int | None = None) -> Any:
        # A cross-site page cannot send application/json without a CORS preflight (which this
        # router never grants), nor hide that it is cross-site from a modern browser: a visited
        # web page cannot post messages or approve a call through a person's browser.
        _same_site(request)
        media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media_type != "application/json":
            raise _Refused(
                415, "unsupported_media_type", "the request body must be application/json"
            )
        limit = self.limits.max_body_bytes if limit is None else limit
        declared = request.headers.get("content-length")
        if (
            declared is not None
            and (declared.isascii() and declared.isdigit())
            and (whole_number(declared, limit) is None)
        ):
            raise _Refused(413, "too_large", f"the request body exceeds {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        started = self.clock.now_ms() / 1000
        stream = request.stream().__aiter__()
        while True:
            try:  # a body that trickles holds a connection, and an upload one of few slots
                chunk = await asyncio.wait_for(anext(stream), self.limits.body_idle_s)
            except StopAsyncIteration:
                break
            except TimeoutError:
                raise _too_slow(f"nothing came for {self.limits.body_idle_s:g} s") from None
            size += len(chunk)
            if size > limit:
                raise _Refused(413, "too_large", f"the request body exceeds {limit} bytes")
            chunks.append(chunk)
            elapsed = self.clock.now_ms() / 1000 - started
            if elapsed > self.limits.body_grace_s and size < elapsed * self.limits.min_body_rate:
                raise _too_slow(f"{size} bytes in {elapsed:.0f} s")
        try:
            body = read_json(b"".join(chunks))
        except ValueError as exc:
            raise _Refused(400, "invalid_json", str(exc)) from None
        if not isinstance(body, dict):
            raise _Refused(400, "invalid_request", "the request body must be a JSON object")
        return body

    async def _accept(self, sink: InboundSink, call: Any, what: Any) -> Acceptance:
        try:
            acceptance: Acceptance = await call(what)
        except NotRouted as exc:
            raise _Refused(404, "not_routed", str(exc) or "no session serves this space") from None
        except DecisionRefused as exc:  # it could change nothing: nothing was stored
            status = 403 if exc.code == "not_allowed" else 409
            raise _Refused(status, _REFUSED_DECISION[exc.code], exc.message) from None
        except Unavailable as exc:
            raise _Refused(
                503,
                "unavailable",
                str(exc) or "the gateway cannot hold the message now; retry",
                {"Retry-After": str(self.limits.retry_after_s)},
            ) from None
        return acceptance

    async def _with_files(
        self, sink: InboundSink, inbound: Inbound, files: list[tuple[Attachment, bytes]]
    ) -> Inbound:
        """`inbound` with its files held by the gateway (before it is accepted)."""

        def content(data: bytes) -> Callable[[int], Awaitable[bytes]]:
            async def read(limit: int) -> bytes:
                return data

            return read

        incoming = [
            IncomingFile(attachment, f"{inbound.message_id}:{number}", content(data))
            for number, (attachment, data) in enumerate(files)
        ]
        try:
            taken = await sink.take_files(inbound.thread, incoming)
        except NotRouted as exc:
            raise _Refused(404, "not_routed", str(exc) or "no session serves this space") from None
        except Unavailable as exc:
            raise self._unavailable(str(exc) or "the gateway cannot hold the files now") from None
        return inbound.model_copy(update={"attachments": taken})

    def _unavailable(self, message: str) -> _Refused:
        return _Refused(
            503, "unavailable", message, {"Retry-After": str(self.limits.retry_after_s)}
        )

    async def _record(self, ref: ThreadRef, item: NewWebItem, what: str) -> WebItem:
        """`item` in its thread, durably; 503 (one clear error) when the mailbox cannot hold it."""
        return (await self._append(ref, item, what)).item

    async def _append(self, ref: ThreadRef, item: NewWebItem, what: str) -> WebAppend:
        try:
            appended = await self.mailbox.append(ref.space, ref.thread, item)
        except MailboxError as exc:
            self._refused_item(ref, item, exc)
            if store_full(exc):
                what = f"the web channel's {STORE_FULL}; the message was not taken"
            raise self._unavailable(what) from None
        if self._down_since is not None:
            now = self.clock.now_ms()
            log.info(
                "web mailbox records again",
                extra={
                    "seconds": round((now - self._down_since) / 1000, 1),
                    "failures": self._down_failures,
                },
            )
            self._down_since, self._down_failures = None, 0
        return appended

    def _refused_item(self, ref: ThreadRef, item: NewWebItem, exc: MailboxError) -> None:
        """Said once as the mailbox begins refusing, then once a minute (with a count).

        A line per refused post was as many lines as posts while Redis was down (205 in 90 s
        at 2.5 posts a second: an outside probe), the flood D347 ended for the worker loops.
        """
        now = self.clock.now_ms()
        self._down_failures += 1
        if self._down_since is None:
            self._down_since = self._down_said_ms = now
            log.warning(
                "web mailbox could not record an item",
                extra={"lane": ref.lane, "kind": item.kind, **_failure(exc)},
            )
        elif now - self._down_said_ms >= _DOWN_SAY_EVERY_MS:
            self._down_said_ms = now
            log.warning(
                "web mailbox still cannot record items",
                extra={
                    "seconds": round((now - self._down_since) / 1000),
                    "failures": self._down_failures,
                    **_failure(exc),
                },
            )

    async def _not_taken(
        self, ref: ThreadRef, message_id: str, why: str, *, again: bool = True
    ) -> None:
        """Say in the thread that a message it shows was not taken (it is there, unanswered).

        `again`: sending it again may take it (not when its id names another thread's message:
        the same id is refused for ever, and the notice said to send it again).
        """
        then = " Send it again; it is taken once." if again else ""  # `why` says what to do
        notice = NewWebItem(
            kind="failure_notice",
            id=f"not-taken:{message_id}",
            text=f"This message was not taken: {why}.{then}",
            at_ms=self.clock.now_ms(),
        )
        try:
            await self.mailbox.append(ref.space, ref.thread, notice)
        except MailboxError as exc:  # the 503 still says it; a retry heals the thread
            log.warning(
                "web mailbox could not record a notice",
                extra={"lane": ref.lane, **_failure(exc)},
            )

    async def post_message(self, thread: str, request: Request) -> Response:
        """``POST /threads/{thread}/messages``."""
        return await self._post(thread, request, self.limits.max_body_bytes)

    async def post_upload(self, thread: str, request: Request) -> Response:
        """``POST /uploads/{thread}``: a message with files (base64), under a larger body limit."""
        client = _sharer(request)
        share = max(1, self.limits.max_concurrent_uploads // 2)
        if self._uploading[client] >= share:
            # four uploads trickled just above the rate floor by one client held every slot
            # for an hour; a client's share leaves the others room
            raise self._unavailable(
                f"this client is sending {share} uploads already: nothing was taken; send it "
                "again when one has ended"
            )
        if self._uploads.locked():  # refused before its body is read: it costs nothing yet
            now = self.clock.now_ms() / 1000
            if now - self._full_said_at >= _FULL_SAY_EVERY_S:
                self._full_said_at = now
                log.warning(
                    "web upload refused: every upload slot is taken",
                    extra={"slots": self.limits.max_concurrent_uploads},
                )
            raise self._unavailable(
                "the gateway is taking other uploads now: nothing was taken; send it again"
            )
        self._uploading[client] += 1
        try:
            async with self._uploads:
                return await self._post(thread, request, self.limits.max_upload_bytes)
        finally:
            self._uploading[client] -= 1
            if not self._uploading[client]:
                del self._uploading[client]

    async def _post(self, thread: str, request: Request, limit: int) -> Response:
        thread = _name(thread, "thread")
        raw = await self._body(request, limit=limit)
        try:
            body = _MessageIn.model_validate(raw)
        except ValidationError as exc:
            raise _refusal(exc) from None
        space = _name(body.space, "space")
        files = _files(body.files, self.limits.max_upload_files)
        if blank(body.text) and not files:
            raise _Refused(400, "empty_text", "'text' is empty")
        if len(body.text) > self.limits.max_text_chars:
            raise _Refused(
                400,
                "text_too_long",
                f"'text' has {len(body.text)} characters; at most "
                f"{self.limits.max_text_chars} are accepted",
            )
        _check_text(body.text, "'text'")
        author = _author(body.author, _user(request))
        sink = self._sink_or_refuse()
        now = self.clock.now_ms()
        ref = ThreadRef(channel=self.name, space=space, thread=thread)
        inbound = Inbound(
            thread=ref,
            message_id=body.client_message_id or f"web-{self.ids.next()}",
            author=author,
            text=body.text,
            received_at_ms=now,
        )
        # The thread first (D162): a message is answered only if the thread shows it, in front
        # of its reply; a store that cannot hold it refuses the post before anything is taken.
        item = NewWebItem(
            kind="message",
            id=inbound.message_id,
            text=body.text,
            author=author,
            files=tuple(attachment for attachment, _ in files),  # what was sent, not held
            at_ms=now,
        )
        appended = await self._append(
            ref,
            item,
            # a store that timed out may have held it (Redis paused): "not taken" was wrong,
            # and a client that gave up left it shown and unanswered (an outside probe)
            "the web channel's store is unavailable: the message may not have been taken; "
            "send it again with the same client_message_id (it is taken once)",
        )
        recorded = appended.item
        if not appended.created and not (
            (recorded.text, recorded.author) == (body.text, author)
            and _same_files(recorded.files, item.files)
        ):
            raise _Refused(  # not this message sent again: the thread shows the first one
                409,
                "message_id_taken",
                f"'client_message_id' {inbound.message_id!r} already names another message of "
                "this thread; give each message its own id",
            )
        try:
            if files:
                inbound = await self._with_files(sink, inbound, files)
            acceptance = await self._accept(sink, sink.accept, inbound)
            if acceptance.lane != ref.lane:  # the inbox holds the other thread's message
                raise _Refused(
                    409,
                    "message_id_taken",
                    f"'client_message_id' {inbound.message_id!r} already names a message of "
                    f"another thread ({acceptance.lane}); give each message its own id",
                )
        except _Refused as refused:
            again = refused.code != "message_id_taken"
            await self._not_taken(ref, inbound.message_id, refused.message, again=again)
            raise
        return JSONResponse(
            {
                **acceptance.model_dump(mode="json", exclude={"first"}),
                "message_id": inbound.message_id,
                "space": space,
                "thread": thread,
                "seq": recorded.seq,
            },
            status_code=202,
        )

    async def post_decision(self, thread: str, request: Request) -> Response:
        """``POST /threads/{thread}/decisions``: an Approve or Deny click."""
        thread = _name(thread, "thread")
        raw = await self._body(request)
        try:
            body = _DecisionIn.model_validate(raw)
        except ValidationError as exc:
            raise _refusal(exc) from None
        space = _name(body.space, "space")
        for value in (body.run_id, body.wait_id):
            _check_text(value, "an id")
        for d in body.decisions:
            _check_text(d.tool_call_id + d.args_digest + (d.reason or ""), "a decision")
            _check_result(d)
        ids = [d.tool_call_id for d in body.decisions]
        if len(set(ids)) != len(ids):
            raise _Refused(400, "invalid_request", "a call is decided twice in one click")
        author = _author(body.author, _user(request))
        sink = self._sink_or_refuse()
        decisions = tuple(
            DecisionItem(
                tool_call_id=d.tool_call_id,
                args_digest=d.args_digest,
                approved=d.approved,
                reason=d.reason,
                supplied=None
                if d.result is None
                else SuppliedResult(text=d.result, is_error=d.is_error),
            )
            for d in body.decisions
        )
        key = body.idempotency_key or _decision_key(space, thread, body, decisions)
        ref = ThreadRef(channel=self.name, space=space, thread=thread)
        said = WebDecision(run_id=body.run_id, wait_id=body.wait_id, decisions=decisions)
        now = self.clock.now_ms()
        decision = DecisionInbound(
            thread=ref,
            run_id=body.run_id,
            wait_id=body.wait_id,
            decisions=decisions,
            decided_by=author,
            identified=_user(request) is not None,  # its token names who decided
            idempotency_key=key,
            received_at_ms=now,
        )
        acceptance = await self._accept(sink, sink.decide, decision)
        item = NewWebItem(
            kind="decision",
            # the thread shows a decision once per slot, as the inbox holds it (D151): keyed
            # by the client's key alone, a key reused for the next wait decided it while the
            # answer and the thread named the first decision, and the thread never showed it
            id=decision.slot,
            author=author,
            decision=said,
            at_ms=now,
        )
        # A decision's key makes a retry count once, so it is taken first and refused when
        # the thread cannot show it (D162): sent again once the store is back, it shows.
        recorded = await self._record(
            ref,
            item,
            "the decision was taken, but the web channel's store is unavailable and the thread "
            "does not show it; send it again once the store is back (it counts once)",
        )
        return JSONResponse(
            {
                **acceptance.model_dump(mode="json", exclude_none=True),
                "idempotency_key": key,
                "space": space,
                "thread": thread,
                "seq": recorded.seq,
            },
            status_code=202,
        )

    # -- reading -------------------------------------------------------------------------------

    def _space(self, request: Request) -> str:
        return _name(request.query_params.get("space") or "default", "space")

    @staticmethod
    def _int(request: Request, name: str, default: int, low: int, high: int) -> int:
        raw = request.query_params.get(name)
        if raw is None or raw == "":
            return default
        value = whole_number(raw, high)
        if value is None or value < low:
            raise _Refused(
                400, "invalid_request", f"{name!r} must be a whole number from {low} to {high}"
            )
        return value

    async def _mailbox_call(self, call: Any) -> Any:
        try:
            return await call
        except MailboxError:
            raise _Refused(
                503,
                "unavailable",
                "the web mailbox is unavailable; retry",
                {"Retry-After": str(self.limits.retry_after_s)},
            ) from None

    async def get_thread(self, thread: str, request: Request) -> Response:
        """``GET /threads/{thread}``: the thread's items after ``after``, oldest first."""
        thread = _name(thread, "thread")
        space = self._space(request)
        after = self._int(request, "after", 0, 0, 2**53)
        limit = self._int(request, "limit", self.limits.max_page, 1, self.limits.max_page)
        items: tuple[WebItem, ...] = await self._mailbox_call(
            self.mailbox.read(space, thread, after=after, limit=limit)
        )
        return JSONResponse(
            {
                "space": space,
                "thread": thread,
                "lane": ThreadRef(channel=self.name, space=space, thread=thread).lane,
                "items": [item.model_dump(mode="json") for item in items],
                "next_after": items[-1].seq if items else after,
            },
            headers={"Cache-Control": "no-store"},
        )

    async def get_file(self, blob: str, request: Request) -> Response:
        """``GET /files/{blob}``: a reply's file, as a download (D229).

        The link names the file (``name``, ``type``): the blob is content only. It is always
        served as an attachment with ``nosniff`` and a sandboxing policy, so a file claiming
        to be a page is never rendered as one on this origin.
        """
        space = self._space(request)
        if not _BLOB.fullmatch(blob):
            raise _Refused(404, "no_such_file", "no such file")
        name = request.query_params.get("name") or "file"
        media_type = request.query_params.get("type") or "application/octet-stream"
        if not _MEDIA_TYPE.fullmatch(media_type):
            media_type = "application/octet-stream"
        sink = self._sink_or_refuse()
        try:
            content = await sink.read_file(self.name, space, blob)
        except NotRouted as exc:
            raise _Refused(404, "not_routed", str(exc)) from None
        except Unavailable:
            raise self._unavailable("the file cannot be read now; retry") from None
        if content is None:
            raise _Refused(404, "no_such_file", "no such file (or it is no longer kept)")
        return Response(
            content,
            media_type=media_type,
            headers={
                "Content-Disposition": _attachment_header(name),
                "X-Content-Type-Options": "nosniff",
                "Content-Security-Policy": "sandbox; default-src 'none'",
                "Cache-Control": "private, max-age=3600",
            },
        )

    async def list_threads(self, request: Request) -> Response:
        """``GET /threads``: the space's threads, most recently updated first."""
        space = self._space(request)
        limit = self._int(request, "limit", 100, 1, self.limits.max_page)
        threads = await self._mailbox_call(self.mailbox.threads(space, limit=limit))
        return JSONResponse(
            {"space": space, "threads": [t.model_dump(mode="json") for t in threads]},
            headers={"Cache-Control": "no-store"},
        )

    async def events(self, thread: str, request: Request) -> Response:
        """``GET /threads/{thread}/events``: Server-Sent Events of the thread's items."""
        thread = _name(thread, "thread")
        space = self._space(request)
        resume = request.headers.get("last-event-id")
        if resume is not None and resume.strip() != "":
            resume = resume.strip()
            seq = whole_number(resume, 2**53)
            if seq is None:
                raise _Refused(400, "invalid_request", "'Last-Event-ID' must be a seq number")
            after = seq
        else:
            after = self._int(request, "after", 0, 0, 2**53)
        kinds = _kinds(request.query_params.get("kinds"))
        live = request.query_params.get("live") == "1"
        if self.streams >= self.limits.max_streams:  # each re-reads the mailbox
            raise self._unavailable("too many event streams are open; try again")
        client = _sharer(request)
        share = self.limits.max_client_streams or max(1, self.limits.max_streams // 2)
        if self._streaming[client] >= share:
            # one client that opened every place and read nothing held each thread page of
            # every space dead (503) for as long as it liked (an outside probe)
            raise self._unavailable(
                f"this client has {share} event streams open already; close one, then try again"
            )
        page = min(self.limits.max_page, _STREAM_PAGE)
        # counted from the check until the response ends (`_Counted`): counted only once the
        # body began, a burst passed the check together (1,100 of 1,000; then 1,001)
        self.streams += 1
        self._streaming[client] += 1
        ended = functools.partial(self._stream_ended, client)
        try:
            first: tuple[WebItem, ...] = await self._mailbox_call(
                self.mailbox.read(space, thread, after=after, limit=page)
            )
        except BaseException:
            ended()
            raise
        return _Counted(
            self._stream(space, thread, after, first, kinds, live),
            ended,
            media_type="text/event-stream",
            headers={
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
                "X-Content-Type-Options": "nosniff",
            },
        )

    async def _stream(
        self,
        space: str,
        thread: str,
        after: int,
        first: tuple[WebItem, ...],
        kinds: frozenset[str] | None,
        live: bool,
    ) -> AsyncIterator[str]:
        stopping = self._stopping
        cursor = LiveCursor(self.live, space, thread) if live else None
        # a page is let go once it is sent: an open page's stream held its first page (up to
        # 500 items) for its whole life, 14 MB each on a thread of long replies (a probe)
        items: tuple[WebItem, ...] | None = first
        del first
        after_seq = after
        waiting: asyncio.Future[tuple[WebItem, ...]] | None = None
        try:
            yield f"retry: {self.limits.reconnect_ms}\n\n"
            while True:
                if items:
                    after_seq = items[-1].seq
                    for frame in self._frames(space, thread, items, kinds):
                        yield frame
                    frame = ""
                items = None
                changed = cursor.signal() if cursor is not None else None
                shown = cursor.catch_up() if cursor is not None else None
                if shown is not None:  # no id: a reconnect resumes after the last item
                    yield f"event: live\ndata: {json.dumps(shown, separators=(',', ':'))}\n\n"
                if stopping.is_set():
                    return
                if waiting is None:
                    waiting = self._wait(space, thread, after_seq)
                found = await self._next(waiting, stopping, changed)
                if found is None:
                    return  # stopping, or the mailbox failed: the client reconnects and resumes
                if found == "live":
                    items = None
                    continue
                waiting = None
                items = found
                if not items:
                    yield ": keepalive\n\n"
        finally:
            if waiting is not None and not waiting.done():
                waiting.cancel()

    def _frames(
        self, space: str, thread: str, items: tuple[WebItem, ...], kinds: frozenset[str] | None
    ) -> Iterator[str]:
        """The events of a page of `items` (those of `kinds`), one at a time."""
        for item in items:
            if item.kind in _ANSWERS:  # whichever process delivered it (D282)
                self.live.answered(space, thread, item.id.rpartition(":")[2])
            if kinds is None or item.kind in kinds:
                data = json.dumps(item.model_dump(mode="json"), separators=(",", ":"))
                yield f"id: {item.seq}\ndata: {data}\n\n"

    def _stream_ended(self, client: str) -> None:
        self.streams -= 1
        self._streaming[client] -= 1
        if not self._streaming[client]:
            del self._streaming[client]

    def _wait(self, space: str, thread: str, after: int) -> asyncio.Future[tuple[WebItem, ...]]:
        waiting = asyncio.ensure_future(
            self.mailbox.wait(
                space,
                thread,
                after=after,
                timeout_s=self.limits.keepalive_s,
                limit=min(self.limits.max_page, _STREAM_PAGE),
            )
        )
        waiting.add_done_callback(_retrieve)
        return waiting

    async def _next(
        self,
        waiting: asyncio.Future[tuple[WebItem, ...]],
        stopping: asyncio.Event,
        changed: asyncio.Event | None,
    ) -> tuple[WebItem, ...] | Literal["live"] | None:
        """The items `waiting` found (none after the keepalive interval), or ``live``.

        ``live``: the thread's live state changed first (`waiting` goes on).

        None when the channel stops or the mailbox fails.
        """
        stopped = asyncio.ensure_future(stopping.wait())
        watched: set[asyncio.Future[Any]] = {waiting, stopped}
        live = asyncio.ensure_future(changed.wait()) if changed is not None else None
        if live is not None:
            watched.add(live)
        try:
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if live is not None:
                live.cancel()
        if stopping.is_set() or waiting.cancelled():
            return None
        if not waiting.done():
            return "live"
        try:
            return waiting.result()
        except MailboxError as exc:
            log.warning("web event stream ended", extra={"error": type(exc).__name__})
            return None

    # -- pages ---------------------------------------------------------------------------------

    async def page(self, thread: str, request: Request) -> Response:
        """``GET /threads/{thread}/page``: the thread's page."""
        thread = _name(thread, "thread")
        space = self._space(request)
        return HTMLResponse(
            thread_page(
                space=space,
                thread=thread,
                max_text_chars=self.limits.max_text_chars,
                user=_user(request),
                max_upload_bytes=self.limits.max_upload_bytes,
            ),
            headers=_page_headers(script=True),
        )

    async def index(self, request: Request) -> Response:
        """``GET /``: the space's threads and a form to open one."""
        space = self._space(request)
        threads = await self._mailbox_call(self.mailbox.threads(space, limit=200))
        suggestion = "t-" + self.ids.next().replace("-", "")[-10:]
        return HTMLResponse(
            index_page(
                space=space,
                threads=[(t.thread, t.updated_at_ms) for t in threads],
                suggestion=suggestion,
                user=_user(request),
            ),
            headers=_page_headers(script=False),
        )

    async def open_thread(self, request: Request) -> Response:
        """``GET /open?thread=&space=``: the index form's target, a redirect to the page."""
        thread = _name(request.query_params.get("thread") or "", "thread")
        space = self._space(request)
        return RedirectResponse(f"threads/{thread}/page?space={space}", status_code=303)

    # -- signing in (D380) ---------------------------------------------------------------------

    def _signed_out(self, request: Request, page: bool) -> Response | None:
        """None when `request` may go on (its token's name kept); else what answers it.

        A page sends the browser to the sign-in (and back after it); anything else is 401.
        """
        if self.login is None:
            return None
        name = self.login.who(request)
        if name is not None:
            request.state.web_user = name
            return None
        if page:
            after = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(
                f"{self._prefix}/login?{urlencode({'next': after})}", status_code=303
            )
        return _Refused(
            401,
            "unauthorized",
            "sign in: send Authorization: Bearer <your token>, or open the page again and "
            "sign in there",
            {"WWW-Authenticate": 'Bearer realm="web"'},
        ).response()

    async def login_form(self, request: Request) -> Response:
        """``GET /login``: the sign-in form (the pages send a browser there when signed out)."""
        after = self._after(request.query_params.get("next"))
        if self.login is None:  # nothing to sign in to
            return RedirectResponse(after, status_code=303)
        return HTMLResponse(login_page(after=after), headers=_page_headers(script=False))

    async def sign_in(self, request: Request) -> Response:
        """``POST /login`` (a form: ``token``, ``next``): keeps the browser signed in."""
        if self.login is None:
            return RedirectResponse(f"{self._prefix}/", status_code=303)
        _same_site(request)
        declared = request.headers.get("content-length", "")
        if whole_number(declared, _LOGIN_BYTES) is None:
            raise _Refused(
                413, "too_large", f"a sign-in is a form of at most {_LOGIN_BYTES} bytes, sent whole"
            )
        raw = await request.body()
        try:
            form = parse_qs(raw[:_LOGIN_BYTES].decode("utf-8", "replace"), max_num_fields=4)
        except ValueError:  # more fields than a sign-in has (it was a 500)
            raise _Refused(
                400, "invalid_request", "a sign-in form holds a token and where to go next"
            ) from None
        after = self._after((form.get("next") or [""])[0])
        signed = self.login.signed_in((form.get("token") or [""])[0])
        if signed is None:
            log.warning("web sign-in refused", extra={"client": _address(request)})
            return HTMLResponse(
                login_page(after=after, error="that token is not known here: try again"),
                status_code=401,
                headers=_page_headers(script=False),
            )
        name, cookie = signed
        log.info("web sign-in", extra={"user": name})
        response = RedirectResponse(after, status_code=303)
        response.headers["Set-Cookie"] = WebLogin.cookie_header(
            cookie, path=self._prefix, secure=self._secure_cookie or request.url.scheme == "https"
        )
        return response

    async def sign_out(self, request: Request) -> Response:
        """``POST /logout``: forgets the browser's sign-in."""
        _same_site(request)  # another site's page signed a person out with a form post
        response = RedirectResponse(f"{self._prefix}/login", status_code=303)
        response.headers["Set-Cookie"] = WebLogin.cookie_header(
            "", path=self._prefix, secure=self._secure_cookie or request.url.scheme == "https"
        )
        return response

    def _after(self, given: str | None) -> str:
        """Where a sign-in goes next: a path of this channel only (never another site)."""
        if (
            given
            and given.startswith(f"{self._prefix}/")
            and "//" not in given
            and "\\" not in given
        ):
            return given
        return f"{self._prefix}/"

    # -- the router ----------------------------------------------------------------------------

    def _build_router(self, prefix: str) -> APIRouter:
        router = APIRouter(prefix=prefix, tags=["web channel"])

        def route(
            path: str,
            method: Literal["GET", "POST"],
            handler: Any,
            *,
            with_thread: bool,
            status: int = 200,
            page: bool = False,
            open_to_all: bool = False,
        ) -> None:
            if with_thread:

                async def endpoint_thread(thread: str, request: Request) -> Response:
                    try:
                        if not open_to_all and (shown := self._signed_out(request, page)):
                            return shown
                        response: Response = await handler(thread, request)
                    except _Refused as refused:
                        return refused.response()
                    return response

                endpoint: Any = endpoint_thread
            else:

                async def endpoint_plain(request: Request) -> Response:
                    try:
                        if not open_to_all and (shown := self._signed_out(request, page)):
                            return shown
                        response: Response = await handler(request)
                    except _Refused as refused:
                        return refused.response()
                    return response

                endpoint = endpoint_plain
            router.add_api_route(
                path,
                endpoint,
                methods=[method],
                status_code=status,
                name=f"web.{handler.__name__}",
                summary=(handler.__doc__ or "").split("\n")[0],
                response_class=Response,
            )

        route("/", "GET", self.index, with_thread=False, page=True)
        route("/login", "GET", self.login_form, with_thread=False, open_to_all=True)
        route("/login", "POST", self.sign_in, with_thread=False, open_to_all=True)
        route("/logout", "POST", self.sign_out, with_thread=False, open_to_all=True)
        route("/open", "GET", self.open_thread, with_thread=False, page=True)
        route("/threads", "GET", self.list_threads, with_thread=False)
        route("/threads/{thread}", "GET", self.get_thread, with_thread=True)
        route("/threads/{thread}/messages", "POST", self.post_message, with_thread=True, status=202)
        route("/uploads/{thread}", "POST", self.post_upload, with_thread=True, status=202)
        route(
            "/threads/{thread}/decisions", "POST", self.post_decision, with_thread=True, status=202
        )
        route("/threads/{thread}/events", "GET", self.events, with_thread=True)
        route("/threads/{thread}/page", "GET", self.page, with_thread=True, page=True)

        async def endpoint_file(blob: str, request: Request) -> Response:
            try:
                if shown := self._signed_out(request, False):
                    return shown
                return await self.get_file(blob, request)
            except _Refused as refused:
                return refused.response()

        router.add_api_route(
            "/files/{blob}",
            endpoint_file,
            methods=["GET"],
            name="web.get_file",
            summary="A reply's file, as a download.",
            response_class=Response,
        )
        return router


_LOGIN_BYTES = 4096
"""The largest sign-in form taken (a token and where to go after)."""

_TOKEN = r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*"
_POSTED_TYPE = re.compile(f"{_TOKEN}/{_TOKEN}(;[ -~]*)?")
"""A media type as RFC 6838 names one, parameters allowed (a file's type is shown in replies)."""


def _same_files(recorded: Sequence[Attachment], sent: Sequence[Attachment]) -> bool:
    """Whether a message sent again holds the files its thread recorded.

    Each one's name, type and size, and the digest of its bytes (``ref``): other bytes of one
    name and size were taken as the message sent again (an outside probe). A message recorded
    before its files' digests were kept is judged without them.
    """
    return len(recorded) == len(sent) and all(
        (old.name, old.media_type, old.size) == (new.name, new.media_type, new.size)
        and old.ref in (None, new.ref)
        for old, new in zip(recorded, sent, strict=True)
    )


def _files(given: list[_FileIn], most: int) -> list[tuple[Attachment, bytes]]:
    """The posted files decoded (400 for bad base64 or too many), with their metadata."""
    if len(given) > most:
        raise _Refused(400, "invalid_request", f"{len(given)} files; at most {most} per message")
    out = []
    for number, file in enumerate(given):
        if not _POSTED_TYPE.fullmatch(file.media_type):
            raise _Refused(
                400,
                "invalid_request",
                f"files[{number}].media_type is not a media type (type/subtype, printable ASCII)",
            )
        if any(ord(c) < 32 or ord(c) == 127 for c in file.name):
            raise _Refused(
                400, "invalid_request", f"files[{number}].name must not contain control characters"
            )
        _check_text(file.name, f"files[{number}].name")
        try:
            # line ends and spaces are no data: `base64` prints 76 characters a line, and a
            # file encoded as the command prints it was refused (an outside probe)
            data = base64.b64decode(_WRAPPING.sub("", file.data), validate=True)
        except (binascii.Error, ValueError):
            raise _Refused(
                400, "invalid_request", f"files[{number}].data is not valid base64"
            ) from None
        name = file.name.replace("\\", "/").rsplit("/", 1)[-1].strip() or f"file-{number + 1}"
        digest = f"sha256:{hashlib.sha256(data).hexdigest()}"  # tells a file sent again
        attachment = Attachment(name=name, media_type=file.media_type, size=len(data), ref=digest)
        out.append((attachment, data))
    return out


class _Counted(StreamingResponse):
    """A stream whose place is given back when the response ends, however it ends.

    Its body's own ``finally`` is not enough: a body never started (the client left before the
    headers went) never runs it.
    """

    def __init__(self, content: AsyncIterator[str], ended: Callable[[], None], **more: Any) -> None:
        super().__init__(content, **more)
        self._ended = ended

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._ended()


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a waiter's outcome as seen (a cancelled stream does not read it)."""
    if not task.cancelled():
        task.exception()


def _kinds(raw: str | None) -> frozenset[str] | None:
    if raw is None or raw.strip() == "":
        return None
    kinds = frozenset(k.strip() for k in raw.split(",") if k.strip())
    if not kinds:  # ",,": a stream that could never send anything
        raise _Refused(400, "invalid_request", f"'kinds' names no kind; known: {', '.join(_KINDS)}")
    unknown = sorted(kinds - set(_KINDS))
    if unknown:
        raise _Refused(
            400, "invalid_request", f"unknown kind(s) {unknown}; known: {', '.join(_KINDS)}"
        )
    return kinds


def _decision_key(
    space: str, thread: str, body: _DecisionIn, decisions: tuple[DecisionItem, ...]
) -> str:
    """The same click (same wait, same choices) always has the same key: a double click is one."""
    canonical = json.dumps(
        [space, thread, body.run_id, body.wait_id, [d.model_dump() for d in decisions]],
        sort_keys=True,
        separators=(",", ":"),
    )
    return "web-" + hashlib.sha256(canonical.encode()).hexdigest()[:40]


_BLOB = re.compile(r"sha256:[0-9a-f]{64}")
_MEDIA_TYPE = re.compile(r"[\w.+-]{1,100}/[\w.+-]{1,100}", re.ASCII)


def _attachment_header(name: str) -> str:
    """``Content-Disposition`` for a download named `name` (RFC 6266: ASCII and UTF-8 forms)."""
    plain = "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in name)
    return f"attachment; filename=\"{plain[:200]}\"; filename*=UTF-8''{quote(name[:200], safe='')}"


def _sharer(request: Request) -> str:
    """Who a share of uploads and event streams is counted for: a name, else an address.

    The signed-in name when the channel has tokens; else the client's address (behind a
    proxy on another machine, every user without a login is that one address; uvicorn takes
    ``X-Forwarded-For`` from 127.0.0.1, so a proxy on this machine shows each client).
    """
    user = _user(request)
    if user is not None:
        return f"user:{user}"
    return _address(request)


def _address(request: Request) -> str:
    """The client's address ("-" when the server does not know it)."""
    return request.client.host if request.client is not None else "-"


def _same_site(request: Request) -> None:
    """Refuse (403) a write another site's page made a browser send (``Sec-Fetch-Site``)."""
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        raise _Refused(403, "cross_site", "cross-site requests are refused")


def _user(request: Request) -> str | None:
    """The signed-in name `_signed_out` kept for `request` (None: the channel has no login)."""
    name = getattr(request.state, "web_user", None)
    return name if isinstance(name, str) else None


def _page_headers(*, script: bool) -> dict[str, str]:
    return {
        "Content-Security-Policy": content_security_policy(script=script),
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-store",
    }


def _failure(exc: MailboxError) -> dict[str, str]:
    """What a log line says of a mailbox failure, never an item's text.

    Its type and, where the backend gave one, why (``database or disk is full``: what an
    operator acts on).
    """
    if isinstance(exc, MailboxUnavailable):
        return {"error": type(exc).__name__, "reason": exc.reason}
    return {"error": type(exc).__name__}
