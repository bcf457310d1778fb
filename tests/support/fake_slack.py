"""A local fake of the Slack Web API, response_urls and Socket Mode, for tests.

One aiohttp server on 127.0.0.1 (a free port) keeps an in-memory workspace (channels, messages,
reactions, ephemerals, opened views) and answers:

* the Web API: ``GET|POST /api/<method>`` with JSON, form-encoded or query-string parameters
  (slack_sdk sends all three, depending on the method), checking ``Authorization: Bearer``;
* ``response_url`` posts: ``POST /response/<id>`` (from :meth:`FakeSlack.response_url`);
* Socket Mode: ``apps.connections.open`` hands out ``ws://…/link?ticket=<n>``; the WebSocket
  says ``hello``, :meth:`FakeSlack.send_envelope` pushes envelopes and the client's acks are
  kept by envelope id.

A test points the real SDKs at it::

    async with FakeSlack() as fake:
        client = AsyncWebClient(token=fake.bot_token, base_url=fake.api_url)
        app = AsyncApp(client=client)
        handler = AsyncSocketModeHandler(app, fake.app_token)   # uses app.client's base_url
        await handler.connect_async()
        envelope_id = await fake.send_event(fake.mention_event("C1", "deploy?"))
        ack = await fake.wait_ack(envelope_id)
        [call] = await fake.wait_for_call("chat.postMessage")

Every Web API call is recorded in :attr:`FakeSlack.calls` (once it has been answered or its
answer decided, so a waiter sees its effect in the workspace). Faults are scripted per method and
taken in order, one per call: :meth:`~FakeSlack.rate_limit` (HTTP 429 + ``Retry-After``),
:meth:`~FakeSlack.fail` (a Slack error or an HTTP 5xx), :meth:`~FakeSlack.lose_response` (the
call takes effect, then the connection is dropped, or held open, without an answer: an unknown
outcome for the client); :meth:`~FakeSlack.delay` sleeps before answering. The pseudo-method
``"response_url"`` scripts faults and delays of response_url posts.

Agents & AI Apps: ``assistant.threads.setStatus`` keeps one status per thread
(:attr:`FakeSlack.statuses`, every change in :attr:`FakeSlack.status_log`), cleared as Slack
clears it when the bot posts into the thread; ``chat.startStream`` / ``appendStream`` /
``stopStream`` write one bot message whose :attr:`Message.streaming` stays True until it is
stopped (the text grows with each append, as ``conversations.replies`` lists it meanwhile).
:meth:`~FakeSlack.unsupport` makes a method answer one error on every call (a workspace without
the feature or the scope), where :meth:`~FakeSlack.fail` scripts a few.

Files upload v2 (what slack_sdk's ``files_upload_v2`` calls): ``files.getUploadURLExternal``
hands out a file id and an upload URL at this fake (``POST /upload/v1/<id>``, raw bytes or a
multipart ``file``, no token needed); ``files.completeUploadExternal`` completes the uploads
and, with a ``channel_id`` (and ``thread_ts``), posts one bot message sharing them (its
``files``, as ``conversations.replies`` lists them). :attr:`FakeSlack.uploads` keeps each one.

Builders for inbound traffic: :meth:`~FakeSlack.post_user_message`,
:meth:`~FakeSlack.mention_event`, :meth:`~FakeSlack.block_actions_payload`,
:meth:`~FakeSlack.view_submission_payload` (methods: they read and write the workspace), and the
pure functions :func:`event_envelope`, :func:`signed_headers` and :func:`form_body` for HTTP-mode
requests.

Modelling choices where Slack is vaguer (don't build on them): ``ts`` values are global rather
than per channel; ``conversations.replies`` filters the parent by ``oldest``/``latest`` like any
other message and omits it on later pages; a message posted with an unknown ``thread_ts`` is stored
as a reply anyway; response_urls never expire.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import hashlib
import hmac
import itertools
import json
import re
import time
import urllib.parse
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Self

from aiohttp import WSCloseCode, WSMsgType, web

__all__ = [
    "APP_ID",
    "APP_TOKEN",
    "BOT_ID",
    "BOT_TOKEN",
    "BOT_USER_ID",
    "MAX_BLOCKS",
    "MAX_STREAM_CHARS",
    "MAX_TEXT_CHARS",
    "TEAM_ID",
    "VERIFICATION_TOKEN",
    "Call",
    "Channel",
    "Ephemeral",
    "FakeSlack",
    "Message",
    "ResponsePost",
    "SlackError",
    "Upload",
    "event_envelope",
    "form_body",
    "signed_headers",
]

Json = dict[str, Any]

TEAM_ID = "T1"
APP_ID = "A1"
BOT_USER_ID = "UBOT"
BOT_ID = "BBOT"
BOT_TOKEN = "xoxb-test"
APP_TOKEN = "xapp-test"
VERIFICATION_TOKEN = "fake-verification-token"
"""The deprecated ``token`` field Slack still puts in event and interaction payloads."""
MAX_TEXT_CHARS = 40_000
"""``chat.postMessage``/``chat.update`` text above this is ``msg_too_long``."""
MAX_BLOCKS = 50
"""More blocks than this in one message is ``invalid_blocks``."""
MAX_STREAM_CHARS = 12_000
"""``markdown_text`` per stream call (Slack: "Limit this field to 12,000 characters")."""

_FIRST_TS_US = 1_700_000_000_000_000
_TS_STEP_US = 100
_APP_TOKEN_METHODS = frozenset({"apps.connections.open"})
_MENTION = re.compile(r"<@([UWB][A-Z0-9]+)(?:\|[^>]*)?>")
_event_ids = itertools.count(1)


# -------------------------------------------------------------------------------------------------
# Records


@dataclass
class Call:
    """One Web API call as the fake saw it (``params`` without the token)."""

    method: str
    params: Json
    token: str | None
    time: float
    """``time.time()`` when the request arrived."""
    http_method: str = "POST"
    status: int = 200
    """The HTTP status answered (429 for a scripted rate limit, 5xx for a scripted failure)."""
    response: Json | None = None
    """The JSON answered, or for a lost response the JSON that would have been answered."""
    lost: bool = False
    """The call took effect but its response was dropped (:meth:`FakeSlack.lose_response`)."""

    @property
    def ok(self) -> bool:
        return self.response is not None and self.response.get("ok") is True

    @property
    def error(self) -> str | None:
        return None if self.response is None else self.response.get("error")


@dataclass
class Message:
    """A message in the fake workspace (a user's or the bot's)."""

    channel: str
    ts: str
    text: str = ""
    user: str | None = None
    bot_id: str | None = None
    thread_ts: str | None = None
    """The thread root's ``ts`` for a reply; None for a top-level message (even a parent)."""
    blocks: list[Json] | None = None
    metadata: Json | None = None
    """``{"event_type", "event_payload"}`` as posted; listed only with ``include_all_metadata``."""
    reactions: dict[str, list[str]] = field(default_factory=dict)
    """Reaction name (no colons) → the users who reacted, in order."""
    edited: Json | None = None
    client_msg_id: str | None = None
    subtype: str | None = None
    streaming: bool = False
    """Started by ``chat.startStream`` and not yet stopped (``chat.stopStream``)."""
    files: list[Json] | None = None
    """The files it shares (``files.completeUploadExternal`` into a channel or thread)."""

    @property
    def is_reply(self) -> bool:
        return self.thread_ts is not None and self.thread_ts != self.ts

    @property
    def root_ts(self) -> str:
        return self.thread_ts if self.thread_ts is not None else self.ts


@dataclass
class Upload:
    """A file the bot uploads with files upload v2 (get URL, POST the bytes, complete)."""

    id: str
    filename: str
    length: int
    content: bytes | None = None
    """What was POSTed to its upload URL (None: nothing yet)."""
    upload_token: str | None = None
    """Whether the POST carried ``Authorization``: the upload URL needs no token."""
    completed: bool = False
    title: str | None = None
    shares: list[tuple[str, str | None]] = field(default_factory=list)
    """(channel, thread_ts) it was shared into, in order."""


@dataclass
class Channel:
    """A conversation of the fake workspace and its messages by ``ts``."""

    id: str
    name: str
    messages: dict[str, Message] = field(default_factory=dict)

    @property
    def channel_type(self) -> str:
        """The ``channel_type`` of its message events (from the id prefix, as Slack's ids go)."""
        return {"D": "im", "G": "group"}.get(self.id[:1], "channel")


@dataclass(frozen=True)
class Ephemeral:
    """An ephemeral message (``chat.postEphemeral``, or a response_url answer that is one)."""

    channel: str
    user: str | None
    text: str
    blocks: list[Json] | None
    thread_ts: str | None
    message_ts: str
    via: Literal["chat.postEphemeral", "response_url"] = "chat.postEphemeral"


@dataclass(frozen=True)
class ResponsePost:
    """One POST to a response_url."""

    url_id: str
    name: str
    body: Json
    time: float


@dataclass
class _ResponseUrl:
    id: str
    name: str
    channel: str | None
    message_ts: str | None
    user: str | None


@dataclass
class _Fault:
    kind: Literal["rate_limit", "fail", "lose"]
    remaining: int
    error: str = "internal_error"
    status: int = 200
    retry_after: int | str = 1
    hang: bool = False
    acted: bool = False


@dataclass
class _Delay:
    seconds: float
    remaining: int | None
    even_if_left: bool = False


class SlackError(Exception):
    """Raised by a method handler: answered as ``{"ok": false, "error": error}``."""

    def __init__(self, error: str, detail: str | None = None) -> None:
        super().__init__(error)
        self.error = error
        self.detail = detail

    def body(self) -> Json:
        body: Json = {"ok": False, "error": self.error}
        if self.detail is not None:
            body["response_metadata"] = {"messages": [f"[ERROR] {self.detail}"]}
        return body


# -------------------------------------------------------------------------------------------------
# Pure builders for HTTP-mode requests


def event_envelope(
    event: Json,
    *,
    event_id: str | None = None,
    team_id: str = TEAM_ID,
    api_app_id: str = APP_ID,
    event_time: int | None = None,
) -> Json:
    """The Events API ``event_callback`` envelope around ``event`` (a fresh ``event_id``)."""
    return {
        "token": VERIFICATION_TOKEN,
        "team_id": team_id,
        "context_team_id": team_id,
        "context_enterprise_id": None,
        "api_app_id": api_app_id,
        "event": event,
        "type": "event_callback",
        "event_id": event_id if event_id is not None else f"Ev{next(_event_ids):010d}",
        "event_time": event_time if event_time is not None else int(time.time()),
        "authorizations": [
            {
                "enterprise_id": None,
                "team_id": team_id,
                "user_id": BOT_USER_ID,
                "is_bot": True,
                "is_enterprise_install": False,
            }
        ],
        "is_ext_shared_channel": False,
    }


def signed_headers(
    raw_body: str, signing_secret: str, timestamp: int | None = None
) -> dict[str, str]:
    """``X-Slack-Request-Timestamp`` and ``X-Slack-Signature`` (v0, HMAC-SHA256) for a body."""
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    base = f"v0:{stamp}:{raw_body}".encode()
    digest = hmac.new(signing_secret.encode(), base, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": f"v0={digest}"}


def form_body(payload: Json) -> str:
    """An interactivity request body: ``payload=<urlencoded JSON>`` (form-encoded, as Slack)."""
    return urllib.parse.urlencode({"payload": json.dumps(payload)})


# -------------------------------------------------------------------------------------------------
# Parameter helpers (a JSON body keeps types; form and query values are all strings)


def _opt_str(params: Json, key: str) -> str | None:
    value = params.get(key)
    if value is None or value == "":
        return None
    return value if isinstance(value, str) else str(value)


def _req_str(params: Json, key: str) -> str:
    value = _opt_str(params, key)
    if value is None:
        raise SlackError("invalid_arguments", f"missing required field: {key}")
    return value


def _flag(params: Json, key: str) -> bool:
    value = params.get(key)
    if isinstance(value, str):
        return value.lower() in ("1", "true")
    return bool(value)


def _int(params: Json, key: str, default: int) -> int:
    value = params.get(key)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise SlackError("invalid_arguments", f"{key} is not an integer") from None


def _json_value(params: Json, key: str, error: str) -> Any:
    """A structured field: JSON bodies carry it as is, form bodies as a JSON string."""
    value = params.get(key)
    if isinstance(value, str):
        if not value:
            return None
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise SlackError(error, f"{key} is not valid JSON") from None
    return value


def _ts_us(ts: str) -> int:
    """``"1700000000.000100"`` → microseconds, for ordering and windows."""
    seconds, _, fraction = ts.partition(".")
    try:
        return int(seconds) * 1_000_000 + int((fraction or "0").ljust(6, "0")[:6])
    except ValueError:
        raise SlackError("invalid_arguments", f"not a ts: {ts!r}") from None


def _format_ts(us: int) -> str:
    return f"{us // 1_000_000}.{us % 1_000_000:06d}"


def _rich_text(text: str, ts: str) -> list[Json]:
    """The ``rich_text`` block Slack's clients attach to a user's message."""
    elements: list[Json] = []
    position = 0
    for match in _MENTION.finditer(text):
        if match.start() > position:
            elements.append({"type": "text", "text": text[position : match.start()]})
        elements.append({"type": "user", "user_id": match.group(1)})
        position = match.end()
    if position < len(text):
        elements.append({"type": "text", "text": text[position:]})
    block_id = hashlib.sha1(ts.encode()).hexdigest()[:5]
    return [
        {
            "type": "rich_text",
            "block_id": block_id,
            "elements": [{"type": "rich_text_section", "elements": elements}],
        }
    ]


# -------------------------------------------------------------------------------------------------
# The server

_Handler = Callable[[Json], Json]


class FakeSlack:
    """An in-memory Slack workspace served on ``127.0.0.1``; see the module docstring."""

    def __init__(self, *, channels: Iterable[str] = ("C1", "C2"), host: str = "127.0.0.1") -> None:
        self.host = host
        self.port: int | None = None
        self.bot_token = BOT_TOKEN
        self.app_token = APP_TOKEN
        self.bot_user_id = BOT_USER_ID
        self.bot_id = BOT_ID
        self.team_id = TEAM_ID
        self.app_id = APP_ID
        self.channels: dict[str, Channel] = {}
        for channel in channels:
            self.add_channel(channel)
        self.usergroups: dict[str, list[str]] = {}
        """Usergroup id → member user ids, for ``usergroups.users.list``."""
        self.users: dict[str, Json] = {}
        """User id → fields merged over the made-up ``users.info`` user."""
        self.default_limit = 100
        """The page size of ``conversations.*`` when the call gives no ``limit``."""
        self.calls: list[Call] = []
        self.arrivals: list[Call] = []
        """Every call as it arrived, before any scripted delay or fault (`calls`: answered)."""
        self.ephemerals: list[Ephemeral] = []
        self.views: dict[str, Json] = {}
        """Views opened with ``views.open``, by view id."""
        self.responses: list[ResponsePost] = []
        self.socket_connections = 0
        """How many WebSocket connections were ever accepted on ``/link``."""
        self.socket_messages: list[Json] = []
        """Every JSON frame a Socket Mode client sent (acks, mostly)."""
        self.acks: dict[str, Json] = {}
        self.files: dict[str, tuple[str, bytes]] = {}
        """File id → (name, content) of files users shared (``add_file``)."""
        self.file_requests: list[tuple[str, bool]] = []
        """Every request for a file's ``url_private``: (file id, whether the bot token came)."""
        self.uploads: dict[str, Upload] = {}
        """Files the bot uploaded (``files.getUploadURLExternal``), by file id."""
        self._sockets: list[web.WebSocketResponse] = []
        self.statuses: dict[tuple[str, str], str] = {}
        """(channel, thread_ts) → the thread's assistant status (absent: none shown)."""
        self.status_log: list[tuple[str, str, str]] = []
        """Every status change, as (channel, thread_ts, status); "" when it was cleared."""
        self._faults: dict[str, deque[_Fault]] = {}
        self._unsupported: dict[str, str] = {}
        self._delays: dict[str, list[_Delay]] = {}
        self._response_urls: dict[str, _ResponseUrl] = {}
        self._last_ts_us = _FIRST_TS_US
        self._counter = itertools.count(1)
        self._changed = asyncio.Condition()
        self._release = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._methods: dict[str, _Handler] = {
            "auth.test": self._auth_test,
            "chat.postMessage": self._chat_post_message,
            "chat.update": self._chat_update,
            "chat.delete": self._chat_delete,
            "chat.postEphemeral": self._chat_post_ephemeral,
            "chat.getPermalink": self._chat_get_permalink,
            "conversations.replies": self._conversations_replies,
            "conversations.history": self._conversations_history,
            "conversations.info": self._conversations_info,
            "reactions.add": self._reactions_add,
            "reactions.remove": self._reactions_remove,
            "usergroups.users.list": self._usergroups_users_list,
            "users.info": self._users_info,
            "users.conversations": self._users_conversations,
            "views.open": self._views_open,
            "apps.connections.open": self._apps_connections_open,
            "assistant.threads.setStatus": self._assistant_set_status,
            "chat.startStream": self._chat_start_stream,
            "chat.appendStream": self._chat_append_stream,
            "chat.stopStream": self._chat_stop_stream,
            "files.getUploadURLExternal": self._files_get_upload_url,
            "files.completeUploadExternal": self._files_complete_upload,
        }
        self.app = web.Application()
        self.app.router.add_route("*", "/api/{method}", self._api)
        self.app.router.add_post("/response/{id}", self._response_post)
        self.app.router.add_get("/link", self._link)
        self.app.router.add_get("/files-pri/{id}/{name}", self._file_download)
        self.app.router.add_post("/upload/v1/{id}", self._file_upload)
        self.app.router.add_route("*", "/{tail:.*}", self._no_route)

    # ---- lifecycle

    async def start(self) -> Self:
        """Bind a free port and start serving."""
        if self._runner is not None:
            raise RuntimeError("FakeSlack is already started")
        self._release = asyncio.Event()
        runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        await web.TCPSite(runner, self.host, 0).start()
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        """Release held responses, close the WebSockets, stop serving (idempotent)."""
        self._release.set()
        for ws in list(self._sockets):
            with contextlib.suppress(Exception):
                await ws.close(code=WSCloseCode.GOING_AWAY, message=b"fake slack stopped")
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("FakeSlack is not started")
        return f"http://{self.host}:{self.port}"

    @property
    def api_url(self) -> str:
        """``base_url`` for ``AsyncWebClient`` (which urljoins the method name onto it)."""
        return f"{self.base_url}/api/"

    # ---- workspace

    def add_channel(self, channel_id: str, name: str | None = None) -> Channel:
        """Create a conversation (``D…`` ids are DMs, ``G…`` private); idempotent."""
        if channel_id not in self.channels:
            self.channels[channel_id] = Channel(channel_id, name or channel_id.lower())
        return self.channels[channel_id]

    def add_message(
        self,
        channel: str,
        text: str = "",
        *,
        user: str | None = None,
        bot: bool = False,
        ts: str | None = None,
        thread_ts: str | None = None,
        blocks: list[Json] | None = None,
        metadata: Json | None = None,
    ) -> Message:
        """Store a message as if posted: a user's (``user``, default ``U1``) or the bot's."""
        conversation = self._channel_named(channel)
        if ts is None:
            ts = self._next_ts()
        else:
            if ts in conversation.messages:
                raise ValueError(f"{channel} already has a message at ts={ts}")
            # Keep generated ts values increasing past injected ones.
            self._last_ts_us = max(self._last_ts_us, _ts_us(ts))
        if bot:
            message = Message(channel, ts, text, user=self.bot_user_id, bot_id=self.bot_id)
            message.blocks = copy.deepcopy(blocks)
        else:
            message = Message(channel, ts, text, user=user or "U1")
            message.blocks = copy.deepcopy(blocks) if blocks is not None else _rich_text(text, ts)
            message.client_msg_id = str(uuid.uuid4())
        message.thread_ts = thread_ts
        message.metadata = copy.deepcopy(metadata)
        conversation.messages[ts] = message
        return message

    def message(self, channel: str, ts: str) -> Message:
        """The stored message (KeyError if there is none)."""
        return self._channel_named(channel).messages[ts]

    def messages(self, channel: str) -> list[Message]:
        """Every stored message of a channel (replies too), in ``ts`` order."""
        return sorted(self._channel_named(channel).messages.values(), key=lambda m: _ts_us(m.ts))

    def thread(self, channel: str, ts: str) -> list[Message]:
        """The thread rooted at ``ts``: the parent, then its replies in ``ts`` order."""
        conversation = self._channel_named(channel)
        root = conversation.messages[ts]
        return [root, *self._replies(conversation, root.ts)]

    def bot_messages(self, channel: str | None = None) -> list[Message]:
        """The messages the bot posted (in one channel or all), in ``ts`` order."""
        names = [channel] if channel is not None else list(self.channels)
        found = [m for name in names for m in self.messages(name) if m.bot_id == self.bot_id]
        return sorted(found, key=lambda m: _ts_us(m.ts))

    def render(self, message: Message, *, include_metadata: bool = True) -> Json:
        """A message as the Web API lists it (thread summary on a parent, reactions, ...)."""
        out: Json = {"type": "message", "ts": message.ts, "text": message.text}
        if message.subtype is not None:
            out["subtype"] = message.subtype
        if message.user is not None:
            out["user"] = message.user
        if message.bot_id is not None:
            out["bot_id"] = message.bot_id
            out["app_id"] = self.app_id
        if message.client_msg_id is not None:
            out["client_msg_id"] = message.client_msg_id
        out["team"] = self.team_id
        if message.blocks is not None:
            out["blocks"] = copy.deepcopy(message.blocks)
        conversation = self.channels[message.channel]
        if message.is_reply:
            out["thread_ts"] = message.thread_ts
            parent = conversation.messages.get(message.root_ts)
            if parent is not None and parent.user is not None:
                out["parent_user_id"] = parent.user
        else:
            replies = self._replies(conversation, message.ts)
            if replies:
                users = list(dict.fromkeys(r.user for r in replies if r.user is not None))
                out.update(
                    thread_ts=message.ts,
                    reply_count=len(replies),
                    reply_users_count=len(users),
                    latest_reply=replies[-1].ts,
                    reply_users=users,
                    is_locked=False,
                    subscribed=False,
                )
        if message.edited is not None:
            out["edited"] = dict(message.edited)
        if message.reactions:
            out["reactions"] = [
                {"name": name, "users": list(users), "count": len(users)}
                for name, users in message.reactions.items()
            ]
        if message.files is not None:
            out["files"] = copy.deepcopy(message.files)
            out["upload"] = True
        if include_metadata and message.metadata is not None:
            out["metadata"] = copy.deepcopy(message.metadata)
        return out

    # ---- call records

    def calls_to(self, method: str) -> list[Call]:
        return [call for call in self.calls if call.method == method]

    # The waits take `timeout=` (ASYNC109 prefers asyncio.timeout at the call site): a test
    # reads better with the bound next to what it waits for, and a miss raises AssertionError
    # saying what was seen instead of a bare TimeoutError.
    async def wait_for_call(self, method: str, count: int = 1, timeout: float = 5.0) -> list[Call]:  # noqa: ASYNC109
        """Wait until ``method`` was called ``count`` times; returns those calls."""
        await self._wait(
            lambda: len(self.calls_to(method)) >= count,
            timeout,
            lambda: f"{count} call(s) to {method}; saw {[c.method for c in self.calls]}",
        )
        return self.calls_to(method)

    async def wait_for_response(self, count: int = 1, timeout: float = 5.0) -> list[ResponsePost]:  # noqa: ASYNC109
        """Wait until ``count`` response_url posts arrived."""
        await self._wait(
            lambda: len(self.responses) >= count,
            timeout,
            lambda: f"{count} response_url post(s); saw {len(self.responses)}",
        )
        return list(self.responses)

    # ---- faults

    def rate_limit(self, method: str, times: int = 1, retry_after: int | str = 1) -> None:
        """The next ``times`` calls answer HTTP 429, ``Retry-After``, ``ratelimited``.

        A string `retry_after` is sent as it is (what a proxy in between might send).
        """
        self._add_fault(method, _Fault("rate_limit", times, retry_after=retry_after))

    def fail(
        self,
        method: str,
        error: str = "internal_error",
        status: int = 200,
        times: int = 1,
        *,
        acted: bool = False,
    ) -> None:
        """The next ``times`` calls answer ``{"ok": false, "error": error}`` with ``status``.

        `acted`: each call takes effect first (Slack's words for ``internal_error`` and
        ``fatal_error``: "it's possible some aspect of the operation succeeded").
        """
        self._add_fault(method, _Fault("fail", times, error=error, status=status, acted=acted))

    def lose_response(self, method: str, times: int = 1, *, hang: bool = False) -> None:
        """The next ``times`` calls take effect, then get no answer.

        By default the connection is dropped (the client sees ``ServerDisconnectedError``);
        ``hang=True`` holds it open until :meth:`stop` (the client sees its own timeout).
        """
        self._add_fault(method, _Fault("lose", times, hang=hang))

    def unsupport(self, method: str, error: str = "missing_scope") -> None:
        """Every later call of ``method`` answers ``{"ok": false, "error": error}`` (HTTP 200)."""
        self._unsupported[method] = error

    def streams(self, channel: str | None = None) -> list[Message]:
        """The bot's messages still streaming (started, never stopped)."""
        return [m for m in self.bot_messages(channel) if m.streaming]

    def delay(
        self, method: str, seconds: float, times: int | None = 1, *, even_if_left: bool = False
    ) -> None:
        """Sleep ``seconds`` before answering the next ``times`` calls (None: every call).

        `even_if_left`: the call is carried out after the sleep even when its client gave up
        meanwhile, as Slack applies a request it sat on (else it is dropped with the client).
        """
        self._delays.setdefault(method, []).append(_Delay(seconds, times, even_if_left))

    def clear_faults(self) -> None:
        self._faults.clear()
        self._delays.clear()
        self._unsupported.clear()

    # ---- response_url

    def response_url(
        self,
        name: str = "",
        *,
        channel: str | None = None,
        message_ts: str | None = None,
        user: str | None = None,
    ) -> str:
        """A response_url; bound to a message, its posts replace/delete/answer it as Slack does."""
        url_id = f"R{next(self._counter):06d}"
        self._response_urls[url_id] = _ResponseUrl(url_id, name, channel, message_ts, user)
        return f"{self.base_url}/response/{url_id}"

    def add_file(self, name: str, content: bytes, mimetype: str) -> Json:
        """Store a file a user shares; returns its file object (as in a message's ``files``).

        Its ``url_private`` is served at this fake's own address (its file host): only with
        ``Authorization: Bearer <bot token>``, else a redirect to a login page, as Slack does.
        """
        file_id = f"F{next(self._counter):08d}"
        self.files[file_id] = (name, content)
        return {
            "id": file_id,
            "name": name,
            "title": name,
            "mimetype": mimetype,
            "filetype": name.rsplit(".", 1)[-1],
            "size": len(content),
            "mode": "hosted",
            "url_private": f"{self.base_url}/files-pri/{self.team_id}-{file_id}/{name}",
            "url_private_download": (
                f"{self.base_url}/files-pri/{self.team_id}-{file_id}/download/{name}"
            ),
        }

    # ---- inbound traffic builders

    def post_user_message(
        self,
        channel: str,
        text: str,
        user: str = "U1",
        thread_ts: str | None = None,
        ts: str | None = None,
    ) -> Json:
        """Store a user's message; returns its ``message`` event."""
        message = self.add_message(channel, text, user=user, thread_ts=thread_ts, ts=ts)
        return self.message_event(channel, message.ts)

    def mention_event(
        self,
        channel: str,
        text: str,
        user: str = "U1",
        thread_ts: str | None = None,
        ts: str | None = None,
    ) -> Json:
        """Store a user's message mentioning the bot; returns its ``app_mention`` event.

        ``<@UBOT>`` is put in front of ``text`` unless it is already there. The matching
        ``message`` event (Slack sends both) is ``message_event(channel, event["ts"])``.
        """
        mention = f"<@{self.bot_user_id}>"
        if mention not in text:
            text = f"{mention} {text}"
        message = self.add_message(channel, text, user=user, thread_ts=thread_ts, ts=ts)
        return self.app_mention_event(channel, message.ts)

    def message_event(self, channel: str, ts: str) -> Json:
        """The ``message`` event of a stored message."""
        message = self.message(channel, ts)
        event: Json = {
            "type": "message",
            "channel": channel,
            "text": message.text,
            "ts": message.ts,
            "event_ts": message.ts,
            "channel_type": self.channels[channel].channel_type,
            "team": self.team_id,
        }
        if message.user is not None:
            event["user"] = message.user
        if message.bot_id is not None:
            event["bot_id"] = message.bot_id
            event["app_id"] = self.app_id
        if message.client_msg_id is not None:
            event["client_msg_id"] = message.client_msg_id
        if message.blocks is not None:
            event["blocks"] = copy.deepcopy(message.blocks)
        if message.is_reply:
            event["thread_ts"] = message.thread_ts
            parent = self.channels[channel].messages.get(message.root_ts)
            if parent is not None and parent.user is not None:
                event["parent_user_id"] = parent.user
        return event

    def app_mention_event(self, channel: str, ts: str) -> Json:
        """The ``app_mention`` event of a stored message (``thread_ts`` only inside a thread)."""
        message = self.message(channel, ts)
        event: Json = {
            "type": "app_mention",
            "user": message.user,
            "text": message.text,
            "ts": message.ts,
            "channel": channel,
            "event_ts": message.ts,
            "team": self.team_id,
        }
        if message.client_msg_id is not None:
            event["client_msg_id"] = message.client_msg_id
        if message.blocks is not None:
            event["blocks"] = copy.deepcopy(message.blocks)
        if message.is_reply:
            event["thread_ts"] = message.thread_ts
        if message.edited is not None:  # Slack sends an edited mention again, marked so
            event["edited"] = dict(message.edited)
        return event

    def edit_user_message(self, channel: str, ts: str, text: str) -> Json:
        """Change a stored message's text; returns the ``message_changed`` event."""
        message = self.message(channel, ts)
        previous = self.render(message, include_metadata=False)
        event_ts = self._next_ts()
        message.text = text
        if message.client_msg_id is not None:
            message.blocks = _rich_text(text, ts)
        message.edited = {"user": message.user or "", "ts": event_ts}
        current = self.render(message, include_metadata=False)
        return {
            "type": "message",
            "subtype": "message_changed",
            "hidden": True,
            "channel": channel,
            "channel_type": self.channels[channel].channel_type,
            "message": current,
            "previous_message": previous,
            "ts": event_ts,
            "event_ts": event_ts,
        }

    def delete_user_message(self, channel: str, ts: str) -> Json:
        """Remove a stored message; returns the ``message_deleted`` event."""
        message = self.message(channel, ts)
        previous = self.render(message, include_metadata=False)
        del self.channels[channel].messages[ts]
        event_ts = self._next_ts()
        return {
            "type": "message",
            "subtype": "message_deleted",
            "hidden": True,
            "channel": channel,
            "channel_type": self.channels[channel].channel_type,
            "deleted_ts": ts,
            "previous_message": previous,
            "ts": event_ts,
            "event_ts": event_ts,
        }

    def block_actions_payload(
        self,
        channel: str,
        message_ts: str,
        action_id: str,
        *,
        user: str = "U1",
        value: str | None = None,
        block_id: str | None = None,
    ) -> Json:
        """A button click on a stored message (its ``response_url`` is bound to the message).

        The button is looked up by ``action_id`` in the message's blocks for its ``value``,
        ``block_id``, text and style; a button that isn't there (a forged or stale click) needs
        ``value``. The fake must be started (the response_url names its port).
        """
        message = self.message(channel, message_ts)
        found_block, element = _find_action(message.blocks or [], action_id)
        if element is None and value is None:
            raise ValueError(f"no button {action_id!r} on {channel}/{message_ts}; pass value=")
        element = element or {}
        action: Json = {
            "type": element.get("type", "button"),
            "action_id": action_id,
            "block_id": block_id or found_block or "actions",
            "text": element.get("text", {"type": "plain_text", "text": action_id, "emoji": True}),
            "value": value if value is not None else element.get("value"),
            "action_ts": f"{time.time():.6f}",
        }
        if "style" in element:
            action["style"] = element["style"]
        container: Json = {
            "type": "message",
            "message_ts": message_ts,
            "channel_id": channel,
            "is_ephemeral": False,
        }
        if message.is_reply:
            container["thread_ts"] = message.thread_ts
        rendered = self.render(message, include_metadata=False)
        return {
            "type": "block_actions",
            "user": self._user_ref(user),
            "api_app_id": self.app_id,
            "token": VERIFICATION_TOKEN,
            "container": container,
            "trigger_id": self._trigger_id(),
            "team": {"id": self.team_id, "domain": "test"},
            "enterprise": None,
            "is_enterprise_install": False,
            "channel": {"id": channel, "name": self.channels[channel].name},
            "message": rendered,
            "state": {"values": {}},
            "response_url": self.response_url(
                f"block_actions:{action_id}", channel=channel, message_ts=message_ts, user=user
            ),
            "actions": [action],
        }

    def view_submission_payload(
        self,
        view_id: str | None = None,
        *,
        values: dict[str, dict[str, Json]] | None = None,
        callback_id: str | None = None,
        private_metadata: str | None = None,
        user: str = "U1",
    ) -> Json:
        """A modal submit: of a view opened with ``views.open`` (by id), or a made-up one.

        ``values`` is ``state.values``: block_id → action_id → ``{"type", "value"|...}``.
        """
        if view_id is not None:
            view = copy.deepcopy(self.views[view_id])
        else:
            if callback_id is None:
                raise ValueError("a made-up view needs a callback_id")
            view = self._new_view({"type": "modal", "callback_id": callback_id, "blocks": []})
        if callback_id is not None:
            view["callback_id"] = callback_id
        if private_metadata is not None:
            view["private_metadata"] = private_metadata
        view["state"] = {"values": copy.deepcopy(values or {})}
        return {
            "type": "view_submission",
            "team": {"id": self.team_id, "domain": "test"},
            "user": self._user_ref(user),
            "api_app_id": self.app_id,
            "token": VERIFICATION_TOKEN,
            "trigger_id": self._trigger_id(),
            "view": view,
            "response_urls": [],
            "enterprise": None,
            "is_enterprise_install": False,
        }

    # ---- Socket Mode

    @property
    def open_sockets(self) -> int:
        return sum(1 for ws in self._sockets if not ws.closed)

    async def wait_connected(self, connections: int = 1, timeout: float = 5.0) -> None:  # noqa: ASYNC109
        """Wait until ``connections`` were ever accepted and one is open (``hello`` sent)."""
        await self._wait(
            lambda: self.socket_connections >= connections and self.open_sockets > 0,
            timeout,
            lambda: f"{connections} socket connection(s); saw {self.socket_connections}",
        )

    async def send_envelope(
        self,
        type: str = "events_api",
        payload: Json | None = None,
        *,
        retry_attempt: int = 0,
        retry_reason: str = "",
        envelope_id: str | None = None,
        accepts_response_payload: bool | None = None,
        timeout: float = 5.0,  # noqa: ASYNC109
    ) -> str:
        """Push an envelope down the newest open socket (waiting for one); returns its id.

        ``accepts_response_payload`` defaults as Slack's: true for slash commands and
        interactions that can answer (view_submission, block_suggestion), false otherwise.
        """
        await self.wait_connected(1, timeout)
        body = payload or {}
        if accepts_response_payload is None:
            accepts_response_payload = type == "slash_commands" or (
                type == "interactive"
                and body.get("type") in ("view_submission", "block_suggestion")
            )
        envelope_id = envelope_id or f"env-{next(self._counter)}"
        envelope = {
            "envelope_id": envelope_id,
            "type": type,
            "accepts_response_payload": accepts_response_payload,
            "payload": body,
            "retry_attempt": retry_attempt,
            "retry_reason": retry_reason,
        }
        # Slack delivers each envelope on one connection; the newest is the one a reconnecting
        # client keeps.
        ws = [s for s in self._sockets if not s.closed][-1]
        await ws.send_json(envelope)
        return envelope_id

    async def send_event(
        self, event: Json, *, retry_attempt: int = 0, retry_reason: str = ""
    ) -> str:
        """Wrap ``event`` in :func:`event_envelope` and push it; returns the envelope id."""
        return await self.send_envelope(
            "events_api",
            event_envelope(event, team_id=self.team_id, api_app_id=self.app_id),
            retry_attempt=retry_attempt,
            retry_reason=retry_reason,
        )

    async def send_interactive(self, payload: Json) -> str:
        """Push an interaction payload (block_actions, view_submission...)."""
        return await self.send_envelope("interactive", payload)

    async def wait_ack(self, envelope_id: str, timeout: float = 5.0) -> Json:  # noqa: ASYNC109
        """The ack the client sent for ``envelope_id`` (``{"envelope_id"[, "payload"]}``)."""
        await self._wait(
            lambda: envelope_id in self.acks,
            timeout,
            lambda: f"an ack of {envelope_id}; acked {list(self.acks)}",
        )
        return self.acks[envelope_id]

    async def disconnect_socket(self, *, refresh: bool = False) -> None:
        """Close every open socket, or with ``refresh`` ask the clients to reconnect.

        ``refresh`` sends ``{"type": "disconnect", "reason": "refresh_requested"}`` as Slack does
        before rotating a connection; the client then opens a new one and closes the old.
        """
        for ws in [s for s in self._sockets if not s.closed]:
            if refresh:
                await ws.send_json(
                    {
                        "type": "disconnect",
                        "reason": "refresh_requested",
                        "debug_info": {"host": "fake-slack"},
                    }
                )
            else:
                await ws.close(code=WSCloseCode.GOING_AWAY, message=b"fake slack disconnect")

    # ---- HTTP handlers

    async def _file_download(self, request: web.Request) -> web.StreamResponse:
        file_id = request.match_info["id"].rsplit("-", 1)[-1]
        authorized = request.headers.get("Authorization") == f"Bearer {self.bot_token}"
        self.file_requests.append((file_id, authorized))
        if not authorized:  # Slack sends a browser to sign in instead
            raise web.HTTPFound(f"{self.base_url}/signin")
        fault = self._take_fault("files.download")  # `fail("files.download", status=500)`
        if fault is not None:
            return web.Response(status=fault.status, text=fault.error)
        found = self.files.get(file_id)
        if found is None or found[0] != request.match_info["name"]:
            raise web.HTTPNotFound()
        return web.Response(body=found[1], content_type="application/octet-stream")

    async def _file_upload(self, request: web.Request) -> web.StreamResponse:
        """``POST <upload_url>``: the bytes of an upload (raw, or a multipart ``file`` field)."""
        upload = self.uploads.get(request.match_info["id"])
        if upload is None or upload.completed:
            return web.Response(status=404, text="not found")
        if request.content_type == "multipart/form-data":
            form = await request.post()
            field_ = form.get("file")
            data = field_.file.read() if isinstance(field_, web.FileField) else b""
        else:
            data = await request.read()
        if len(data) != upload.length:
            return web.Response(status=400, text="length mismatch")
        upload.content = data
        upload.upload_token = request.headers.get("Authorization")
        return web.Response(text=f"OK - {len(data)}")

    def _files_get_upload_url(self, params: Json) -> Json:
        filename = _req_str(params, "filename")
        length = _int(params, "length", -1)
        if length < 1:
            raise SlackError("invalid_arguments")
        file_id = f"F{next(self._counter):08d}"
        self.uploads[file_id] = Upload(file_id, filename, length)
        return {
            "ok": True,
            "upload_url": f"{self.base_url}/upload/v1/{file_id}",
            "file_id": file_id,
        }

    def _files_complete_upload(self, params: Json) -> Json:
        given = _json_value(params, "files", "invalid_arguments")
        if not isinstance(given, list) or not given:
            raise SlackError("invalid_arguments")
        uploads: list[Upload] = []
        for item in given:
            upload = self.uploads.get(str(item.get("id"))) if isinstance(item, dict) else None
            if upload is None or upload.content is None or upload.completed:
                raise SlackError("file_not_found")
            uploads.append(upload)
        channel_id = _opt_str(params, "channel_id")
        thread_ts = _opt_str(params, "thread_ts")
        for item, upload in zip(given, uploads, strict=True):
            upload.completed = True
            upload.title = str(item.get("title") or upload.filename)
        objects = [self._uploaded_file(upload) for upload in uploads]
        if channel_id is not None:
            conversation = self._channel_named(channel_id)
            message = self.add_message(
                conversation.id,
                _opt_str(params, "initial_comment") or "",
                bot=True,
                thread_ts=thread_ts,
            )
            message.files = copy.deepcopy(objects)
            for upload in uploads:
                upload.shares.append((conversation.id, thread_ts))
        return {"ok": True, "files": [{"id": o["id"], "title": o["title"]} for o in objects]}

    def _uploaded_file(self, upload: Upload) -> Json:
        content = upload.content or b""
        self.files[upload.id] = (upload.filename, content)
        return {
            "id": upload.id,
            "name": upload.filename,
            "title": upload.title or upload.filename,
            "mimetype": "",
            "filetype": upload.filename.rsplit(".", 1)[-1],
            "size": len(content),
            "user": self.bot_user_id,
            "mode": "hosted",
            "url_private": (
                f"{self.base_url}/files-pri/{self.team_id}-{upload.id}/{upload.filename}"
            ),
        }

    async def _api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        arrived = time.time()
        params: Json = {}
        problem: SlackError | None = None
        try:
            params = await _read_params(request)
        except SlackError as error:
            problem = error
        header = request.headers.get("Authorization", "")
        token = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else None
        body_token = params.pop("token", None)
        if token is None and isinstance(body_token, str):
            token = body_token
        call = Call(method, params, token, arrived, http_method=request.method)
        self.arrivals.append(call)
        delay = self._take_delay(method)
        served = self._served(request, call, method, params, token, problem, delay)
        if delay is not None and delay.even_if_left:  # Slack goes on with a call its client left
            return await asyncio.shield(served)
        return await served

    async def _served(
        self,
        request: web.Request,
        call: Call,
        method: str,
        params: Json,
        token: str | None,
        problem: SlackError | None,
        delay: _Delay | None,
    ) -> web.StreamResponse:
        if delay is not None:
            await asyncio.sleep(delay.seconds)
        fault = self._take_fault(method)
        if fault is not None and fault.kind == "rate_limit":
            return await self._answer(
                call,
                {"ok": False, "error": "ratelimited"},
                status=429,
                headers={"Retry-After": str(fault.retry_after)},
            )
        if fault is not None and fault.kind == "fail" and not fault.acted:
            return await self._answer(call, {"ok": False, "error": fault.error}, fault.status)
        handler = self._methods.get(method)
        unsupported = self._unsupported.get(method)
        if unsupported is not None and problem is None:
            problem = SlackError(unsupported)
        if problem is not None:
            body = problem.body()
        elif handler is None:
            body = {"ok": False, "error": "unknown_method"}
        else:
            body = self._auth_error(method, token) or _run(handler, params)
        if fault is not None and fault.kind == "lose":
            return await self._lose(request, call, body, hang=fault.hang)
        if fault is not None and fault.kind == "fail":  # it acted, then said it failed
            return await self._answer(call, {"ok": False, "error": fault.error}, fault.status)
        return await self._answer(call, body)

    async def _response_post(self, request: web.Request) -> web.StreamResponse:
        binding = self._response_urls.get(request.match_info["id"])
        await self._apply_delay("response_url")
        fault = self._take_fault("response_url")
        if fault is not None and fault.kind == "rate_limit":
            return web.json_response(
                {"ok": False, "error": "ratelimited"},
                status=429,
                headers={"Retry-After": str(fault.retry_after)},
            )
        if fault is not None and fault.kind == "fail":
            return web.json_response({"ok": False, "error": fault.error}, status=fault.status)
        if binding is None:
            return web.json_response({"ok": False, "error": "expired_url"}, status=404)
        try:
            body = await _read_params(request)
        except SlackError as error:
            return web.json_response(error.body(), status=400)
        if isinstance(body.get("payload"), str):
            body = _json_value(body, "payload", "invalid_payload") or {}
        self._apply_response(binding, body)
        self.responses.append(ResponsePost(binding.id, binding.name, body, time.time()))
        await self._notify()
        if fault is not None and fault.kind == "lose":
            return await self._drop(request)
        return web.json_response({"ok": True})

    async def _link(self, request: web.Request) -> web.WebSocketResponse:
        # autoping answers the SDK's "sdk-ping-pong" pings (without pongs it reconnects); a short
        # close timeout keeps disconnect_socket()/stop() quick when a client no longer answers.
        ws = web.WebSocketResponse(autoping=True, timeout=1.0)
        await ws.prepare(request)
        self.socket_connections += 1
        self._sockets.append(ws)
        await ws.send_json(
            {
                "type": "hello",
                "num_connections": self.open_sockets,
                "debug_info": {},
                "connection_info": {"app_id": self.app_id},
            }
        )
        await self._notify()
        try:
            async for frame in ws:
                if frame.type is not WSMsgType.TEXT:
                    continue
                try:
                    data = json.loads(frame.data)
                except json.JSONDecodeError:
                    data = {"unparsed": frame.data}
                if not isinstance(data, dict):
                    data = {"unparsed": data}
                self.socket_messages.append(data)
                envelope_id = data.get("envelope_id")
                if isinstance(envelope_id, str):
                    self.acks[envelope_id] = data
                await self._notify()
        finally:
            self._sockets.remove(ws)
            with contextlib.suppress(Exception):
                await self._notify()
        return ws

    async def _no_route(self, request: web.Request) -> web.Response:
        # A JSON error, so that a client pointed at base_url instead of api_url fails loudly
        # with a SlackApiError that says why, not with a content-type error.
        return web.json_response(
            {
                "ok": False,
                "error": "fake_slack_no_route",
                "detail": f"no route {request.method} {request.path}; the Web API is under "
                "/api/ (use fake.api_url as base_url)",
            },
            status=404,
        )

    # ---- Web API methods

    def _auth_test(self, params: Json) -> Json:
        return {
            "ok": True,
            "url": "https://test.slack.com/",
            "team": "Test",
            "user": "bot",
            "team_id": self.team_id,
            "user_id": self.bot_user_id,
            "bot_id": self.bot_id,
            "is_enterprise_install": False,
        }

    def _chat_post_message(self, params: Json) -> Json:
        conversation = self._channel_param(params)
        text = _opt_str(params, "text") or ""
        blocks = _blocks(params)
        if not text and not blocks:
            raise SlackError("no_text")
        if len(text) > MAX_TEXT_CHARS:
            raise SlackError("msg_too_long")
        metadata = _metadata(params)
        message = self.add_message(
            conversation.id,
            text,
            bot=True,
            thread_ts=_opt_str(params, "thread_ts"),
            blocks=blocks,
            metadata=metadata,
        )
        if message.is_reply and _flag(params, "reply_broadcast"):
            message.subtype = "thread_broadcast"
        self._clear_status(conversation.id, message.root_ts)
        rendered = self.render(message)
        return {"ok": True, "channel": conversation.id, "ts": message.ts, "message": rendered}

    def _chat_update(self, params: Json) -> Json:
        conversation = self._channel_param(params)
        message = conversation.messages.get(_req_str(params, "ts"))
        if message is None:
            raise SlackError("message_not_found")
        if message.bot_id != self.bot_id:
            raise SlackError("cant_update_message")
        text = _opt_str(params, "text")
        blocks = _blocks(params)
        if text is not None and len(text) > MAX_TEXT_CHARS:
            raise SlackError("msg_too_long")
        if text is None and blocks is None:
            raise SlackError("no_text")
        metadata = _metadata(params)
        if text is not None:
            message.text = text
        if blocks is not None or "blocks" in params:
            # An explicit empty list clears the blocks (how an approval message drops buttons).
            message.blocks = blocks or None
        if metadata is not None:
            message.metadata = metadata
        message.edited = {"user": self.bot_user_id, "ts": self._next_ts()}
        return {
            "ok": True,
            "channel": conversation.id,
            "ts": message.ts,
            "text": message.text,
            "message": self.render(message),
        }

    def _chat_delete(self, params: Json) -> Json:
        conversation = self._channel_param(params)
        ts = _req_str(params, "ts")
        message = conversation.messages.get(ts)
        if message is None:
            raise SlackError("message_not_found")
        if message.bot_id != self.bot_id:
            raise SlackError("cant_delete_message")
        del conversation.messages[ts]
        return {"ok": True, "channel": conversation.id, "ts": ts}

    def _chat_post_ephemeral(self, params: Json) -> Json:
        conversation = self._channel_param(params)
        user = _opt_str(params, "user")
        if user is None:
            raise SlackError("user_not_in_channel")
        text = _opt_str(params, "text") or ""
        blocks = _blocks(params)
        if not text and not blocks:
            raise SlackError("no_text")
        if len(text) > MAX_TEXT_CHARS:
            raise SlackError("msg_too_long")
        message_ts = self._next_ts()
        self.ephemerals.append(
            Ephemeral(
                conversation.id, user, text, blocks, _opt_str(params, "thread_ts"), message_ts
            )
        )
        return {"ok": True, "message_ts": message_ts}

    def _chat_get_permalink(self, params: Json) -> Json:
        conversation = self._channel_param(params)
        ts = _req_str(params, "message_ts")
        if ts not in conversation.messages:
            raise SlackError("message_not_found")
        return {
            "ok": True,
            "channel": conversation.id,
            "permalink": "https://test.slack.com/archives/"
            f"{conversation.id}/p{ts.replace('.', '')}",
        }

    def _conversations_replies(self, params: Json) -> Json:
        conversation = self._channel_param(params)
        message = conversation.messages.get(_req_str(params, "ts"))
        if message is None:
            raise SlackError("thread_not_found")
        # Slack accepts the ts of any message in the thread.
        root = conversation.messages.get(message.root_ts)
        if root is None:
            raise SlackError("thread_not_found")
        thread = [root, *self._replies(conversation, root.ts)]
        page, cursor = _page(_window(thread, params), params, self.default_limit, descending=False)
        include = _flag(params, "include_all_metadata")
        return {
            "ok": True,
            "messages": [self.render(m, include_metadata=include) for m in page],
            "has_more": bool(cursor),
            "response_metadata": {"next_cursor": cursor},
        }

    def _conversations_history(self, params: Json) -> Json:
        conversation = self._channel_param(params)
        top = [
            m
            for m in conversation.messages.values()
            if not m.is_reply or m.subtype == "thread_broadcast"
        ]
        top.sort(key=lambda m: _ts_us(m.ts), reverse=True)
        page, cursor = _page(_window(top, params), params, self.default_limit, descending=True)
        include = _flag(params, "include_all_metadata")
        return {
            "ok": True,
            "messages": [self.render(m, include_metadata=include) for m in page],
            "has_more": bool(cursor),
            "pin_count": 0,
            "response_metadata": {"next_cursor": cursor},
        }

    def _users_conversations(self, params: Json) -> Json:
        """The conversations the bot is in (all of the fake's), by ``types``, paged by id."""
        types = set((_opt_str(params, "types") or "public_channel").split(","))
        kinds = {"channel": "public_channel", "group": "private_channel", "im": "im"}
        chosen = [
            c
            for c in sorted(self.channels.values(), key=lambda c: c.id)
            if kinds.get(c.channel_type, "public_channel") in types
        ]
        limit = _int(params, "limit", self.default_limit)
        start = int(_opt_str(params, "cursor") or 0)
        page = chosen[start : start + limit]
        cursor = str(start + limit) if start + limit < len(chosen) else ""
        return {
            "ok": True,
            "channels": [{"id": c.id, "name": c.name, "is_member": True} for c in page],
            "response_metadata": {"next_cursor": cursor},
        }

    def _conversations_info(self, params: Json) -> Json:
        conversation = self._channel_param(params)
        kind = conversation.channel_type
        return {
            "ok": True,
            "channel": {
                "id": conversation.id,
                "name": conversation.name,
                "is_channel": kind == "channel",
                "is_group": kind == "group",
                "is_im": kind == "im",
                "is_private": kind != "channel",
                "is_member": True,
                "context_team_id": self.team_id,
            },
        }

    def _reaction_target(self, params: Json) -> tuple[Message, str]:
        conversation = self._channel_param(params)
        message = conversation.messages.get(_req_str(params, "timestamp"))
        if message is None:
            raise SlackError("message_not_found")
        name = (_opt_str(params, "name") or "").strip(":")
        if not name:
            raise SlackError("invalid_name")
        return message, name

    def _reactions_add(self, params: Json) -> Json:
        message, name = self._reaction_target(params)
        users = message.reactions.setdefault(name, [])
        if self.bot_user_id in users:
            raise SlackError("already_reacted")
        users.append(self.bot_user_id)
        return {"ok": True}

    def _reactions_remove(self, params: Json) -> Json:
        message, name = self._reaction_target(params)
        users = message.reactions.get(name, [])
        if self.bot_user_id not in users:
            raise SlackError("no_reaction")
        users.remove(self.bot_user_id)
        if not users:
            del message.reactions[name]
        return {"ok": True}

    def _usergroups_users_list(self, params: Json) -> Json:
        group = _req_str(params, "usergroup")
        if group not in self.usergroups:
            raise SlackError("no_such_subteam")
        return {"ok": True, "users": list(self.usergroups[group])}

    def _users_info(self, params: Json) -> Json:
        user_id = _opt_str(params, "user")
        if user_id is None:
            raise SlackError("user_not_found")
        name = user_id.lower()
        user: Json = {
            "id": user_id,
            "team_id": self.team_id,
            "name": name,
            "real_name": f"User {user_id}",
            "deleted": False,
            "is_bot": user_id == self.bot_user_id,
            "is_admin": False,
            "tz": "UTC",
            "profile": {
                "display_name": name,
                "real_name": f"User {user_id}",
                "email": f"{name}@example.com",
                "team": self.team_id,
            },
        }
        user.update(copy.deepcopy(self.users.get(user_id, {})))
        return {"ok": True, "user": user}

    def _views_open(self, params: Json) -> Json:
        if _opt_str(params, "trigger_id") is None:
            raise SlackError("invalid_arguments", "missing required field: trigger_id")
        view = _json_value(params, "view", "invalid_arguments")
        if not isinstance(view, dict) or "type" not in view:
            raise SlackError("invalid_arguments", "view must be an object with a type")
        opened = self._new_view(view)
        self.views[opened["id"]] = opened
        return {"ok": True, "view": copy.deepcopy(opened)}

    def _apps_connections_open(self, params: Json) -> Json:
        ticket = next(self._counter)
        return {
            "ok": True,
            "url": f"ws://{self.host}:{self.port}/link?ticket={ticket}&app_id={self.app_id}",
        }

    # ---- internals

    def _assistant_set_status(self, params: Json) -> Json:
        channel = _opt_str(params, "channel_id")
        if channel is None or channel not in self.channels:
            raise SlackError("channel_not_found", "Invalid channel_id")
        thread_ts = _opt_str(params, "thread_ts")
        if thread_ts is None or thread_ts not in self.channels[channel].messages:
            raise SlackError("invalid_thread_ts")
        status = params.get("status")
        if not isinstance(status, str):
            raise SlackError("invalid_arguments", "missing required field: status")
        if status:
            self.statuses[(channel, thread_ts)] = status
        else:
            self.statuses.pop((channel, thread_ts), None)
        self.status_log.append((channel, thread_ts, status))
        return {"ok": True}

    def _chat_start_stream(self, params: Json) -> Json:
        conversation = self._channel_param(params)
        thread_ts = _opt_str(params, "thread_ts")
        if thread_ts is None:
            raise SlackError("invalid_arguments", "missing required field: thread_ts")
        if conversation.channel_type != "im":  # a channel: the stream is for one person
            if _opt_str(params, "recipient_team_id") is None:
                raise SlackError("missing_recipient_team_id")
            if _opt_str(params, "recipient_user_id") is None:
                raise SlackError("missing_recipient_user_id")
        text = _stream_text(params)
        if len(text) > MAX_STREAM_CHARS:
            raise SlackError("msg_too_long")
        message = self.add_message(conversation.id, text, bot=True, thread_ts=thread_ts)
        message.subtype, message.streaming = "bot_message", True
        self._clear_status(conversation.id, message.root_ts)
        return {"ok": True, "channel": conversation.id, "ts": message.ts}

    def _streaming(self, params: Json) -> tuple[Channel, Message]:
        conversation = self._channel_param(params)
        message = conversation.messages.get(_req_str(params, "ts"))
        if message is None or message.bot_id != self.bot_id:
            raise SlackError("message_not_found")
        if not message.streaming:
            raise SlackError("message_not_in_streaming_state")
        return conversation, message

    def _chat_append_stream(self, params: Json) -> Json:
        conversation, message = self._streaming(params)
        text = _stream_text(params)
        if not text:
            raise SlackError("no_text")
        if len(text) > MAX_STREAM_CHARS:
            raise SlackError("msg_too_long")
        message.text += text
        return {"ok": True, "channel": conversation.id, "ts": message.ts}

    def _chat_stop_stream(self, params: Json) -> Json:
        conversation, message = self._streaming(params)
        text = _stream_text(params)
        if len(text) > MAX_STREAM_CHARS:
            raise SlackError("msg_too_long")
        blocks = _blocks(params)
        metadata = _metadata(params)
        message.text += text
        if blocks is not None:
            message.blocks = blocks
        if metadata is not None:
            message.metadata = metadata
        message.streaming = False
        return {
            "ok": True,
            "channel": conversation.id,
            "ts": message.ts,
            "message": self.render(message, include_metadata=False),
        }

    def _clear_status(self, channel: str, thread_ts: str) -> None:
        """Slack takes a thread's status down when the app posts into the thread."""
        if self.statuses.pop((channel, thread_ts), None) is not None:
            self.status_log.append((channel, thread_ts, ""))

    def _next_ts(self) -> str:
        # Slack's ts is the posting time (unique per channel): now, or just after the last one.
        self._last_ts_us = max(self._last_ts_us + _TS_STEP_US, int(time.time() * 1_000_000))
        return _format_ts(self._last_ts_us)

    def _trigger_id(self) -> str:
        return f"{next(self._counter)}.{int(time.time())}.{uuid.uuid4().hex[:16]}"

    def _user_ref(self, user: str) -> Json:
        name = user.lower()
        return {"id": user, "username": name, "name": name, "team_id": self.team_id}

    def _new_view(self, view: Json) -> Json:
        view_id = f"V{next(self._counter):06d}"
        opened = copy.deepcopy(view)
        opened.update(
            id=view_id,
            team_id=self.team_id,
            state={"values": {}},
            hash=f"{int(time.time())}.{uuid.uuid4().hex[:8]}",
            root_view_id=view_id,
            previous_view_id=None,
            app_id=self.app_id,
            bot_id=self.bot_id,
        )
        opened.setdefault("private_metadata", "")
        opened.setdefault("callback_id", "")
        opened.setdefault("blocks", [])
        return opened

    def _channel_named(self, channel: str) -> Channel:
        if channel in self.channels:
            return self.channels[channel]
        wanted = channel.removeprefix("#")
        for conversation in self.channels.values():
            if conversation.name == wanted:
                return conversation
        raise KeyError(f"no channel {channel!r} in the fake workspace")

    def _channel_param(self, params: Json) -> Channel:
        name = _opt_str(params, "channel")
        if name is None:
            raise SlackError("channel_not_found")
        try:
            return self._channel_named(name)
        except KeyError:
            raise SlackError("channel_not_found") from None

    @staticmethod
    def _replies(conversation: Channel, root_ts: str) -> list[Message]:
        replies = [
            m for m in conversation.messages.values() if m.is_reply and m.thread_ts == root_ts
        ]
        return sorted(replies, key=lambda m: _ts_us(m.ts))

    def _auth_error(self, method: str, token: str | None) -> Json | None:
        if not token:
            return {"ok": False, "error": "not_authed"}
        wanted = self.app_token if method in _APP_TOKEN_METHODS else self.bot_token
        if token == wanted:
            return None
        if token in (self.app_token, self.bot_token):
            return {"ok": False, "error": "not_allowed_token_type"}
        return {"ok": False, "error": "invalid_auth"}

    def _add_fault(self, method: str, fault: _Fault) -> None:
        if fault.remaining < 1:
            raise ValueError("times must be at least 1")
        self._faults.setdefault(method, deque()).append(fault)

    def _take_fault(self, method: str) -> _Fault | None:
        queue = self._faults.get(method)
        if not queue:
            return None
        fault = queue[0]
        fault.remaining -= 1
        if fault.remaining == 0:
            queue.popleft()
        return fault

    async def _apply_delay(self, method: str) -> None:
        delay = self._take_delay(method)
        if delay is not None:
            await asyncio.sleep(delay.seconds)

    def _take_delay(self, method: str) -> _Delay | None:
        delays = self._delays.get(method)
        if not delays:
            return None
        delay = delays[0]
        if delay.remaining is not None:
            delay.remaining -= 1
            if delay.remaining == 0:
                delays.pop(0)
        return delay

    async def _answer(
        self,
        call: Call,
        body: Json,
        status: int = 200,
        headers: dict[str, str] | None = None,
    ) -> web.Response:
        call.status, call.response = status, body
        self.calls.append(call)
        await self._notify()
        return web.json_response(body, status=status, headers=headers)

    async def _lose(
        self, request: web.Request, call: Call, body: Json, *, hang: bool
    ) -> web.StreamResponse:
        call.response, call.lost = body, True
        self.calls.append(call)
        await self._notify()
        if hang:
            await self._release.wait()
        return await self._drop(request)

    @staticmethod
    async def _drop(request: web.Request) -> web.StreamResponse:
        # Closing the transport before answering: aiohttp's attempt to write the response then
        # fails quietly (a ConnectionError it expects), and the client reads EOF mid-request.
        if request.transport is not None:
            request.transport.close()
        return web.Response(status=204)

    def _apply_response(self, binding: _ResponseUrl, body: Json) -> None:
        channel, message_ts = binding.channel, binding.message_ts
        if channel is None or message_ts is None:
            return
        conversation = self.channels[channel]
        message = conversation.messages.get(message_ts)
        text = _opt_str(body, "text") or ""
        blocks = body.get("blocks") if isinstance(body.get("blocks"), list) else None
        if _flag(body, "delete_original"):
            conversation.messages.pop(message_ts, None)
        elif _flag(body, "replace_original"):
            if message is not None:
                message.text = text
                message.blocks = blocks
                message.edited = {"user": self.bot_user_id, "ts": self._next_ts()}
        elif body.get("response_type") == "in_channel":
            self.add_message(
                channel, text, bot=True, thread_ts=_opt_str(body, "thread_ts"), blocks=blocks
            )
        else:
            self.ephemerals.append(
                Ephemeral(
                    channel,
                    binding.user,
                    text,
                    blocks,
                    _opt_str(body, "thread_ts"),
                    self._next_ts(),
                    via="response_url",
                )
            )

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _wait(
        self, predicate: Callable[[], bool], seconds: float, describe: Callable[[], str]
    ) -> None:
        async def until() -> None:
            async with self._changed:
                await self._changed.wait_for(predicate)

        try:
            await asyncio.wait_for(until(), seconds)
        except TimeoutError:
            raise AssertionError(
                f"FakeSlack: timed out after {seconds}s waiting for {describe()}"
            ) from None


# -------------------------------------------------------------------------------------------------
# Helpers of the handlers


def _run(handler: _Handler, params: Json) -> Json:
    try:
        return handler(params)
    except SlackError as error:
        return error.body()


async def _read_params(request: web.Request) -> Json:
    """Query string + body; later keys win (slack_sdk never sends a key in both)."""
    params: Json = dict(request.query)
    if not request.can_read_body:
        return params
    if request.content_type == "application/json":
        try:
            body = json.loads(await request.text())
        except json.JSONDecodeError:
            raise SlackError("invalid_json") from None
        if not isinstance(body, dict):
            raise SlackError("invalid_json")
        params.update(body)
    elif request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
        form = await request.post()
        params.update({key: value for key, value in form.items() if isinstance(value, str)})
    return params


def _blocks(params: Json) -> list[Json] | None:
    blocks = _json_value(params, "blocks", "invalid_blocks_format")
    if blocks is None:
        return None
    if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
        raise SlackError("invalid_blocks_format")
    if len(blocks) > MAX_BLOCKS or any("type" not in b for b in blocks):
        raise SlackError("invalid_blocks")
    return copy.deepcopy(blocks)


def _metadata(params: Json) -> Json | None:
    metadata = _json_value(params, "metadata", "invalid_metadata_format")
    if metadata is None:
        return None
    if (
        not isinstance(metadata, dict)
        or not isinstance(metadata.get("event_type"), str)
        or not isinstance(metadata.get("event_payload"), dict)
    ):
        raise SlackError("invalid_metadata_format")
    return {"event_type": metadata["event_type"], "event_payload": metadata["event_payload"]}


def _stream_text(params: Json) -> str:
    """The markdown a stream call adds: ``markdown_text`` and the ``markdown_text`` chunks."""
    text = _opt_str(params, "markdown_text") or ""
    chunks = _json_value(params, "chunks", "invalid_chunks")
    if chunks is None:
        return text
    if not isinstance(chunks, list):
        raise SlackError("invalid_chunks")
    for chunk in chunks:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("type"), str):
            raise SlackError("invalid_chunks")
        if chunk["type"] == "markdown_text":
            if not isinstance(chunk.get("text"), str):
                raise SlackError("invalid_chunks")
            text += chunk["text"]
    return text


def _window(messages: list[Message], params: Json) -> list[Message]:
    """``oldest``/``latest`` bounds, exclusive unless ``inclusive``."""
    oldest = _opt_str(params, "oldest")
    latest = _opt_str(params, "latest")
    inclusive = _flag(params, "inclusive")
    low = _ts_us(oldest) if oldest is not None else None
    high = _ts_us(latest) if latest is not None else None

    def inside(message: Message) -> bool:
        us = _ts_us(message.ts)
        if low is not None and (us < low or (us == low and not inclusive)):
            return False
        return not (high is not None and (us > high or (us == high and not inclusive)))

    return [m for m in messages if inside(m)]


def _page(
    messages: list[Message], params: Json, default_limit: int, *, descending: bool
) -> tuple[list[Message], str]:
    """One page and the next cursor ("" when done). The cursor names the next message's ts,
    so messages posted between pages don't shift it."""
    limit = max(1, _int(params, "limit", default_limit))
    start = 0
    cursor = _opt_str(params, "cursor")
    if cursor is not None:
        try:
            kind, _, ts = base64.urlsafe_b64decode(cursor.encode()).decode().partition(":")
            from_us = _ts_us(ts)
        except (ValueError, SlackError):
            raise SlackError("invalid_cursor") from None
        if kind != "next_ts":
            raise SlackError("invalid_cursor")
        start = next(
            (
                index
                for index, m in enumerate(messages)
                if (_ts_us(m.ts) <= from_us if descending else _ts_us(m.ts) >= from_us)
            ),
            len(messages),
        )
    page = messages[start : start + limit]
    rest = messages[start + limit :]
    next_cursor = (
        base64.urlsafe_b64encode(f"next_ts:{rest[0].ts}".encode()).decode() if rest else ""
    )
    return page, next_cursor


def _find_action(blocks: list[Json], action_id: str) -> tuple[str | None, Json | None]:
    for block in blocks:
        elements = list(block.get("elements") or [])
        accessory = block.get("accessory")
        if isinstance(accessory, dict):
            elements.append(accessory)
        for element in elements:
            if isinstance(element, dict) and element.get("action_id") == action_id:
                return block.get("block_id"), element
    return None, None
