"""Rigs that play each built-in channel's real peer for the channel conformance suite.

Each is a `adapters.conformance.ChannelRig` and an async context manager (a fresh peer each):

* `WebRig`: an HTTP client of the web channel's router (httpx's ASGI transport), over a memory
  mailbox that can lose the answer of a delivery's write or hang (the web channel's peer for
  what it delivers: the store its readers read).
* `SlackRig`: a fake Slack workspace (`tests.support.fake_slack`): events and clicks go to
  slack-bolt as correctly signed HTTP requests (redeliveries as Slack retries them, with the
  same event id), what the bot posts is read back from the fake Web API.
* `EmailRig`: a real Dovecot and an aiosmtpd server: mail arrives with dovecot-lda (as an MTA
  delivers it), "acknowledged" is the channel flagging it handled (``\\Seen``), what the bot
  sent is read from the SMTP server's captures; a `Relay` between the channel and both servers
  can freeze (a hung peer). The channel is built from its settings section, as the service does.
* `WebhookRig`: a Standard Webhooks sender and receiver (`tests.support.webhook_peer`): messages
  and decisions go in as signed requests (a redelivery is the same ``webhook-id`` signed anew),
  what the bot posted is what the receiver took (one per ``webhook-id``, as the spec asks a
  receiver to keep), read back from a real port. Built from its settings section, with or
  without a status URL (`status`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
from fastapi import FastAPI

from adapters.channel import ApprovalView, ChannelAdapter, PendingCall
from adapters.conformance import SESSION, Hostile, Posted, Said
from adapters.email.channel import EmailChannel
from adapters.email.compose import (
    approval_token,
    delivery_mark,
    reply_message_id,
    verify_approval_token,
)
from adapters.email.settings import EmailSettings
from adapters.email.spec import SPEC as EMAIL_SPEC
from adapters.kit import ChannelContext
from adapters.slack.render import encode_decision_value
from adapters.slack.settings import SlackSettings
from adapters.slack.spec import SPEC as SLACK_SPEC
from adapters.web import MemoryMailbox, WebChannel, WebLimits
from adapters.web.mailbox import MailboxUnavailable, NewWebItem, WebAppend, WebItem, WebItemKind
from adapters.webhook.settings import WebhookSettings
from adapters.webhook.spec import SPEC as WEBHOOK_SPEC
from harness_core import SystemClock
from tests.support.fake_slack import FakeSlack, Message, event_envelope, form_body, signed_headers
from tests.support.mail_servers import Dovecot, MailUser, SmtpServer
from tests.support.webhook_peer import WebhookPeer, new_secret

__all__ = ["EmailRig", "Relay", "SlackRig", "WebRig", "WebhookRig"]

CALL_TIMEOUT_S = 10.0
"""A channel call's bound, as the service gives it (`delivery_timeout_seconds`'s default)."""
ACK_WAIT_S = 5.0
"""How long a mail rig waits for the channel to flag a mail handled before saying it did not."""
_DELIVERY_KINDS = frozenset({"reply", "approval_request", "failure_notice", "approval_closed"})


def _refused(response: httpx.Response) -> bool:
    return 400 <= response.status_code < 500


# -- web ----------------------------------------------------------------------------------------


class FaultyMailbox(MemoryMailbox):
    """A memory mailbox whose next delivery write loses its answer, or whose calls all hang."""

    def __init__(self) -> None:
        super().__init__()
        self.lose_next = False
        self.hung = False
        self.released = asyncio.Event()

    async def _gate(self) -> None:
        if self.hung:
            await self.released.wait()

    async def append(self, space: str, thread: str, item: NewWebItem) -> WebAppend:
        await self._gate()
        appended = await super().append(space, thread, item)
        if self.lose_next and item.kind in _DELIVERY_KINDS:
            self.lose_next = False
            raise MailboxUnavailable("the write's answer was lost", unknown_outcome=True)
        return appended

    async def find(
        self, space: str, thread: str, kind: WebItemKind, identity: str
    ) -> WebItem | None:
        await self._gate()
        return await super().find(space, thread, kind, identity)

    async def read(
        self, space: str, thread: str, *, after: int = 0, limit: int = 100
    ) -> tuple[WebItem, ...]:
        await self._gate()
        return await super().read(space, thread, after=after, limit=limit)


class WebRig:
    """The web channel's peer: its HTTP API (ASGI transport) and its mailbox."""

    approver = "ann"
    stranger = "mallory"

    def __init__(self) -> None:
        self.mailbox = FaultyMailbox()
        self.channel: WebChannel | None = None
        self._http: httpx.AsyncClient | None = None
        self._ids = itertools.count(1)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.mailbox.released.set()
        if self._http is not None:
            await self._http.aclose()

    @property
    def http(self) -> httpx.AsyncClient:
        assert self._http is not None, "build the channel first"
        return self._http

    def build(self) -> ChannelAdapter:
        self.channel = WebChannel(
            self.mailbox,
            limits=WebLimits(max_text_chars=1000, max_body_bytes=16_000, keepalive_s=0.2),
        )
        app = FastAPI()
        app.include_router(self.channel.router)
        transport = httpx.ASGITransport(app=app)
        self._http = httpx.AsyncClient(transport=transport, base_url="http://web.test")
        return self.channel

    async def say(self, thread: str, text: str, *, author: str, redeliver: int = 0) -> Said:
        body = {"text": text, "client_message_id": f"m-{next(self._ids)}", "author": author}
        acked = []
        for _ in range(1 + redeliver):
            response = await self.http.post(f"/web/threads/{thread}/messages", json=body)
            acked.append(response.status_code == 202)
        return Said(tuple(acked))

    async def _items(self, thread: str) -> list[dict[str, Any]]:
        response = await self.http.get(f"/web/threads/{thread}")
        assert response.status_code == 200, response.text
        items: list[dict[str, Any]] = response.json()["items"]
        return items

    async def seen(self, thread: str) -> list[Posted]:
        return [
            Posted(
                id=f"default/{thread}#{item['seq']}",
                mark=item["id"],
                text=item["text"],
                controls=("approve", "deny") if item["kind"] == "approval_request" else (),
            )
            for item in await self._items(thread)
            if item["kind"] in _DELIVERY_KINDS
        ]

    def mark_of(self, delivery_id: str) -> str:
        return delivery_id

    async def decide(self, posted: Posted, *, approve: bool, as_user: str) -> None:
        where, seq = posted.id.rsplit("#", 1)
        thread = where.split("/", 1)[1]
        [item] = [i for i in await self._items(thread) if i["seq"] == int(seq)]
        view = item["approval"]
        body = {
            "run_id": view["run_id"],
            "wait_id": view["wait_id"],
            "decisions": [
                {"tool_call_id": c["tool_call_id"], "args_digest": c["args_digest"],
                 "approved": approve}
                for c in view["calls"]
            ],
            "author": as_user,
        }  # fmt: skip
        await self.http.post(f"/web/threads/{thread}/decisions", json=body)

    def hostile(self) -> Sequence[Hostile]:
        messages = "/web/threads/hostile/messages"

        def post(name: str, path: str = messages, **request: Any) -> Hostile:
            async def send() -> bool:
                return _refused(await self.http.post(path, **request))

            return Hostile(name, send)

        decision = {
            "run_id": "run-x",
            "wait_id": "wait-x",
            "decisions": [{"tool_call_id": "c", "args_digest": "d", "approved": True}],
        }
        twice = {**decision, "decisions": decision["decisions"] * 2}  # type: ignore[operator]
        return [
            post("a body that is not JSON", content=b"{not json",
                 headers={"content-type": "application/json"}),
            post("a body that is not application/json", content=b'{"text": "hi"}',
                 headers={"content-type": "text/plain"}),
            post("a body over the limit", json={"text": "x" * 20_000}),
            post("a cross-site post", json={"text": "hi"},
                 headers={"sec-fetch-site": "cross-site"}),
            post("a NUL in the text", json={"text": "a\x00b"}),
            post("an empty text", json={"text": "  "}),
            post("a text over the limit", json={"text": "y" * 1001}),
            post("an unknown field", json={"text": "hi", "admin": True}),
            post("an author that is no name", json={"text": "hi", "author": 5}),
            post("a thread that is no name", "/web/threads/no%20way!/messages",
                 json={"text": "hi"}),
            post("a space that is no name", json={"text": "hi", "space": "../etc"}),
            post("a decision nothing waits for", "/web/threads/hostile/decisions",
                 json=decision),
            post("a call decided twice in one click", "/web/threads/hostile/decisions",
                 json=twice),
        ]  # fmt: skip

    def lose_next_ack(self) -> None:
        self.mailbox.lose_next = True

    async def hang(self) -> bool:
        self.mailbox.hung = True
        return True


# -- Slack --------------------------------------------------------------------------------------

SLACK_SECRET = "suite-signing-secret"
SLACK_CHANNEL = "C1"
_SLACK_METHODS = (
    "auth.test",
    "chat.postMessage",
    "chat.update",
    "chat.postEphemeral",
    "chat.getPermalink",
    "conversations.replies",
    "conversations.history",
    "reactions.add",
    "reactions.remove",
    "usergroups.users.list",
    "users.conversations",
    "views.open",
)


class SlackRig:
    """Slack's side of the Slack channel: a fake workspace, signed requests into slack-bolt."""

    approver = "U0APPROVER"
    stranger = "U0STRANGER"

    def __init__(self) -> None:
        self.fake = FakeSlack(channels=(SLACK_CHANNEL,))
        self.roots: dict[str, str] = {}
        self._http: httpx.AsyncClient | None = None
        self._events = itertools.count(1)

    async def __aenter__(self) -> Self:
        await self.fake.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            await self._http.aclose()
        await self.fake.stop()

    @property
    def http(self) -> httpx.AsyncClient:
        assert self._http is not None, "build the channel first"
        return self._http

    def build(self) -> ChannelAdapter:
        section = SlackSettings(
            bot_token=self.fake.bot_token,
            signing_secret=SLACK_SECRET,
            api_url=self.fake.api_url,
            approvers={SLACK_CHANNEL: (self.approver,)},
        )
        context = ChannelContext(clock=SystemClock(), call_timeout_s=CALL_TIMEOUT_S)
        adapter = SLACK_SPEC.build(section, context)
        assert adapter.router is not None, "HTTP mode mounts /slack/events"
        app = FastAPI()
        app.include_router(adapter.router)
        transport = httpx.ASGITransport(app=app)
        self._http = httpx.AsyncClient(transport=transport, base_url="http://gateway.test")
        return adapter

    async def signed(
        self,
        raw: str,
        content_type: str,
        *,
        secret: str = SLACK_SECRET,
        timestamp: int | None = None,
        retry: int = 0,
    ) -> httpx.Response:
        headers = {"content-type": content_type, **signed_headers(raw, secret, timestamp)}
        if retry:  # as Slack marks a redelivery
            headers |= {"x-slack-retry-num": str(retry), "x-slack-retry-reason": "http_timeout"}
        return await self.http.post("/slack/events", content=raw.encode(), headers=headers)

    async def say(self, thread: str, text: str, *, author: str, redeliver: int = 0) -> Said:
        root = self.roots.get(thread)
        if root is None:  # a mention at the top of the channel: Slack sends it twice
            mention = self.fake.mention_event(SLACK_CHANNEL, text, user=author)
            self.roots[thread] = root = str(mention["ts"])
            events = [mention, self.fake.message_event(SLACK_CHANNEL, root)]
        else:
            events = [self.fake.post_user_message(SLACK_CHANNEL, text, user=author, thread_ts=root)]
        ids = [f"Ev{next(self._events):08d}" for _ in events]
        acked = []
        for attempt in range(1 + redeliver):
            answers = [
                await self.signed(
                    json.dumps(event_envelope(event, event_id=event_id)),
                    "application/json",
                    retry=attempt,
                )
                for event, event_id in zip(events, ids, strict=True)
            ]
            acked.append(all(answer.status_code == 200 for answer in answers))
        return Said(tuple(acked))

    async def seen(self, thread: str) -> list[Posted]:
        bot = [m for m in self.fake.thread(SLACK_CHANNEL, self.roots[thread]) if m.bot_id]
        return [_slack_posted(message) for message in bot]

    def mark_of(self, delivery_id: str) -> str:
        return delivery_id

    async def click(self, payload: dict[str, Any]) -> httpx.Response:
        return await self.signed(form_body(payload), "application/x-www-form-urlencoded")

    async def decide(self, posted: Posted, *, approve: bool, as_user: str) -> None:
        channel, ts = posted.id.split(":", 1)
        opened = set(self.fake.views)
        action = "approve" if approve else "deny"
        await self.click(self.fake.block_actions_payload(channel, ts, action, user=as_user))
        for view_id in [v for v in self.fake.views if v not in opened]:  # the Deny dialog
            reason = {"reason": {"reason": {"type": "plain_text_input", "value": "not now"}}}
            submit = self.fake.view_submission_payload(view_id, values=reason, user=as_user)
            await self.click(submit)

    def hostile(self) -> Sequence[Hostile]:
        def envelope() -> str:
            event = self.fake.mention_event(SLACK_CHANNEL, "let me in", user=self.stranger)
            return json.dumps(event_envelope(event))

        def signed(name: str, body: Callable[[], str], **how: Any) -> Hostile:
            async def send() -> bool:
                return _refused(await self.signed(body(), "application/json", **how))

            return Hostile(name, send)

        async def unsigned() -> bool:
            raw = envelope().encode()
            headers = {"content-type": "application/json"}
            return _refused(await self.http.post("/slack/events", content=raw, headers=headers))

        async def forged_click() -> bool:
            """A correctly signed click naming a request nobody made: refused, and told so."""
            asked = self.fake.add_message(SLACK_CHANNEL, "a message with a forged button")
            call = PendingCall(tool_call_id="c9", tool_name="deploy", args={}, args_digest="d9")
            view = ApprovalView(session=SESSION, run_id="run-9", wait_id="wait-9", calls=(call,))
            click = self.fake.block_actions_payload(
                SLACK_CHANNEL,
                asked.ts,
                "approve",
                user=self.approver,
                value=encode_decision_value(view),
            )
            told = len(self.fake.ephemerals)
            if (await self.click(click)).status_code != 200:
                return False
            deadline = time.monotonic() + 5
            while True:  # the clicker is told after the acknowledgement
                if len(self.fake.ephemerals) > told:
                    return True
                if time.monotonic() > deadline:
                    return False
                await asyncio.sleep(0.02)

        now = int(time.time())
        return [
            signed("a forged signature", envelope, secret="not-the-signing-secret"),
            Hostile("no signature", unsigned),
            signed("a replayed request (a stale timestamp)", envelope, timestamp=now - 600),
            signed("a timestamp from the future", envelope, timestamp=now + 600),
            signed("a body that is not JSON", lambda: "{not json"),
            signed("an event that is no object", lambda: '{"type": "event_callback", "event": 5}'),
            signed("a body over the limit", lambda: json.dumps({"type": "x" * 1_100_000})),
            Hostile("a signed click naming a request nobody made", forged_click),
        ]

    def lose_next_ack(self) -> None:
        self.fake.lose_response("chat.postMessage")

    async def hang(self) -> bool:
        for method in _SLACK_METHODS:
            self.fake.lose_response(method, times=1000, hang=True)
        return True


def _slack_posted(message: Message) -> Posted:
    metadata = message.metadata or {}
    payload = metadata.get("event_payload") if metadata.get("event_type") else None
    payload = payload if isinstance(payload, dict) else {}
    texts: list[str] = []
    controls: list[str] = []
    for block in message.blocks or []:
        if block.get("type") == "section":
            texts.append(str((block.get("text") or {}).get("text", "")))
        elif block.get("type") == "context":
            texts += [str(e.get("text", "")) for e in block.get("elements") or []]
        elif block.get("type") == "actions":
            controls += [str(e.get("action_id")) for e in block.get("elements") or []]
    return Posted(
        id=f"{message.channel}:{message.ts}",
        mark=payload.get("delivery_id"),
        part=payload.get("part"),
        text="\n".join(texts) or message.text,
        controls=tuple(controls),
    )


# -- email --------------------------------------------------------------------------------------

PUBLIC_URL = "https://gateway.example.test"
LINK_SECRET = "suite-link-secret-of-at-least-32-characters"
_LINK = re.compile(r"https?://\S+/email/approvals/\S+")


class Relay:
    """A TCP relay to a server that can freeze: connections stay open, nothing passes."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.port = 0
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> Relay:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    def freeze(self) -> None:
        """From now on nothing passes either way, and new connections are held unanswered."""
        self._flowing.clear()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        upstream: asyncio.StreamWriter | None = None
        try:
            await self._flowing.wait()
            up_reader, upstream = await asyncio.open_connection(*self.upstream)
            await asyncio.gather(self._pump(reader, upstream), self._pump(up_reader, writer))
        except (OSError, asyncio.CancelledError):  # cancelled by `close` only: the relay ends
            pass
        finally:
            self._tasks.discard(task)
            for each in (writer, upstream):
                if each is not None:
                    each.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()


@dataclass
class _MailThread:
    subject: str
    root: str
    ids: list[str] = field(default_factory=list)


class EmailRig:
    """The people writing to the bot's mailbox, and the mail servers, as the email peer."""

    def __init__(self, dovecot: Dovecot, *, links: bool = True) -> None:
        self.dovecot = dovecot
        self.links = links
        self.bot: MailUser = dovecot.fresh_user("bot")
        self.approver = dovecot.fresh_user("ann").address
        self.stranger = dovecot.fresh_user("mallory").address
        self.domain = self.bot.address.rsplit("@", 1)[1]
        self.smtp = SmtpServer(dovecot, username=self.bot.address, password=self.bot.password)
        self.imap_relay = Relay(dovecot.host, dovecot.port)
        self.smtp_relay: Relay | None = None
        self.channel: EmailChannel | None = None
        self.threads: dict[str, _MailThread] = {}
        self._http: httpx.AsyncClient | None = None

    async def __aenter__(self) -> Self:
        self.smtp.start()
        self.smtp_relay = await Relay(self.smtp.host, self.smtp.port).start()
        await self.imap_relay.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._http is not None:
            await self._http.aclose()
        for relay in (self.imap_relay, self.smtp_relay):
            if relay is not None:
                await relay.close()
        await asyncio.to_thread(self.smtp.stop)

    def build(self) -> ChannelAdapter:
        assert self.smtp_relay is not None and self.smtp.tls_cert is not None
        section = EmailSettings(
            address=self.bot.address,
            imap_host="127.0.0.1",
            imap_port=self.imap_relay.port,
            imap_security="none",
            smtp_host="127.0.0.1",
            smtp_port=self.smtp_relay.port,
            smtp_security="starttls",
            password=self.bot.password,
            ca_file=str(self.smtp.cert_path),
            approvers=(self.approver,),
            link_secret=LINK_SECRET if self.links else None,
            poll_seconds=600,
        )
        context = ChannelContext(
            clock=SystemClock(), call_timeout_s=CALL_TIMEOUT_S, public_url=PUBLIC_URL
        )
        adapter = EMAIL_SPEC.build(section, context)
        assert isinstance(adapter, EmailChannel)
        self.channel = adapter
        if adapter.router is not None:
            app = FastAPI()
            app.include_router(adapter.router)
            transport = httpx.ASGITransport(app=app)
            self._http = httpx.AsyncClient(transport=transport, base_url=PUBLIC_URL)
        return adapter

    @property
    def http(self) -> httpx.AsyncClient:
        assert self._http is not None, "the channel has no approval links"
        return self._http

    # -- in ----------------------------------------------------------------------------------

    async def say(self, thread: str, text: str, *, author: str, redeliver: int = 0) -> Said:
        known = self.threads.get(thread)
        message = EmailMessage()
        message["From"] = author
        message["To"] = self.bot.address
        message["Date"] = format_datetime(datetime.now(UTC))
        message["Message-ID"] = message_id = make_msgid(domain="example.test")
        if known is None:
            known = self.threads[thread] = _MailThread(f"About {thread}", message_id)
            message["Subject"] = known.subject
        else:
            message["Subject"] = f"Re: {known.subject}"
            message["In-Reply-To"] = known.ids[-1]
            message["References"] = " ".join(known.ids)
        known.ids.append(message_id)
        message.set_content(text)
        for _ in range(1 + redeliver):
            await self.deliver(bytes(message), sender=author)
        return Said(await self.handled(message_id, 1 + redeliver))

    async def deliver(self, raw: bytes, *, sender: str = "someone@example.test") -> None:
        await asyncio.to_thread(self.dovecot.deliver, self.bot, raw, sender=sender)

    async def handled(self, message_id: str, copies: int) -> tuple[bool, ...]:
        """Per copy of the mail in the bot's INBOX: flagged handled (``\\Seen``) by the channel.

        Waits until every copy is, or `ACK_WAIT_S`.
        """
        deadline = time.monotonic() + ACK_WAIT_S
        while True:
            flags = await asyncio.to_thread(self._seen_flags, message_id)
            if (len(flags) >= copies and all(flags)) or time.monotonic() > deadline:
                return tuple(flags) + (False,) * (copies - len(flags))
            await asyncio.sleep(0.05)

    def _seen_flags(self, message_id: str) -> list[bool]:
        with self.dovecot.imap(self.bot) as client:
            _, found = client.uid("SEARCH", "HEADER", "Message-ID", f'"{message_id}"')
            uids = (found[0] or b"").split()
            if not uids:
                return []
            _, data = client.uid("FETCH", b",".join(uids).decode(), "(FLAGS)")
        # by message number, the last word kept: the server also reports flags the channel
        # changed meanwhile, unasked, in the same response
        seen = {line.split()[0]: b"\\Seen" in line for line in data if isinstance(line, bytes)}
        return list(seen.values())

    # -- out ---------------------------------------------------------------------------------

    async def seen(self, thread: str) -> list[Posted]:
        root = self.threads[thread].root
        posted = []
        for received in self.smtp.messages:
            message = received.message
            if root not in str(message.get("References", "")).split():
                continue
            body = message.get_body(("plain",))
            text = str(body.get_content()) if body is not None else ""
            message_id = str(message["Message-ID"]).strip()
            links = _LINK.findall(text)
            controls = ("approve", "deny") if len(links) >= 2 else ()
            mark = delivery_mark(message_id)  # the id carries its thread as well (D345)
            posted.append(Posted(id=message_id, mark=mark, text=text, controls=controls))
        return posted

    def mark_of(self, delivery_id: str) -> str:
        return reply_message_id(delivery_id, self.domain)

    async def decide(self, posted: Posted, *, approve: bool, as_user: str) -> None:
        approve_link, deny_link = _LINK.findall(posted.text)[:2]
        link = self._link_for(approve_link if approve else deny_link, as_user)
        page = await self.http.get(link)  # the confirmation page (a GET decides nothing)
        assert page.status_code in (200, 403), page.text
        await self.http.post(link)

    def _link_for(self, link: str, person: str) -> str:
        """`link` as it would be had it been sent to `person` (sent before they lost the right)."""
        parts = urlsplit(link)
        token = parts.path.rsplit("/", 1)[1]
        lane = parse_qs(parts.query)["lane"][0]
        claims = verify_approval_token(token, key=LINK_SECRET.encode(), now=datetime.now(UTC))
        if claims.approver == person.lower():
            return link
        return self._signed_link(
            approval_token(
                key=LINK_SECRET.encode(),
                session=claims.session,
                run_id=claims.run_id,
                wait_id=claims.wait_id,
                calls=claims.calls,
                approver=person,
                decision=claims.decision,
                expires_at=datetime.now(UTC) + timedelta(days=1),
            ),
            lane,
        )

    def _signed_link(
        self, token: str, lane: str, *, sig: str | None = None, signed_lane: str | None = None
    ) -> str:
        """A link as the channel makes one (its lane signed), or as someone changed it."""
        assert self.channel is not None
        signature = sig or self.channel.lane_signature(token, signed_lane or lane)
        query = urlencode({"lane": lane, "sig": signature})
        return f"{PUBLIC_URL}/email/approvals/{token}?{query}"

    # -- hostile -----------------------------------------------------------------------------

    def hostile(self) -> Sequence[Hostile]:
        mails: list[tuple[str, dict[str, str]]] = [
            ("an auto-reply", {"Auto-Submitted": "auto-replied"}),
            ("a bounce", {"From": "MAILER-DAEMON@example.test",
                          "Content-Type": "multipart/report; report-type=delivery-status"}),
            ("mail from a list", {"List-Id": "<ops.lists.example.test>"}),
            ("bulk mail", {"Precedence": "bulk"}),
            ("mail from the bot's own address", {"From": self.bot.address}),
            ("the bot's own Message-ID (a loop)",
             {"Message-ID": reply_message_id("reply:elsewhere", self.domain)}),
            ("mail without a sender", {"From": ""}),
        ]  # fmt: skip
        found: list[Hostile] = [Hostile(name, self._set_aside(headers)) for name, headers in mails]
        if self.links:
            found += [
                Hostile("a forged approval link", self._link_refused(forged=True)),
                Hostile("a link moved to another thread", self._link_refused(moved=True)),
                Hostile("an expired approval link", self._link_refused(expired=True)),
                Hostile("a link for an address that is no approver", self._link_refused()),
            ]
        return found

    def _set_aside(self, headers: dict[str, str]) -> Callable[[], Awaitable[bool]]:
        async def send() -> bool:
            fields = {
                "From": self.stranger,
                "To": self.bot.address,
                "Subject": "Hostile",
                "Date": format_datetime(datetime.now(UTC)),
                "Message-ID": make_msgid(domain="example.test"),
                "Content-Type": "text/plain; charset=utf-8",
                **headers,
            }
            body = "Please answer this."
            if fields["Content-Type"].startswith("multipart/"):
                fields["Content-Type"] += '; boundary="b1"'
                body = (
                    "--b1\r\nContent-Type: text/plain\r\n\r\nDelivery failed.\r\n"
                    "--b1\r\nContent-Type: message/delivery-status\r\n\r\n"
                    "Reporting-MTA: dns; mx.example.test\r\n\r\n"
                    "Final-Recipient: rfc822; gone@example.test\r\nAction: failed\r\n"
                    "Status: 5.1.1\r\n\r\n--b1--"
                )
            head = "".join(f"{name}: {value}\r\n" for name, value in fields.items() if value)
            await self.deliver(f"{head}\r\n{body}\r\n".encode())
            return all(await self.handled(fields["Message-ID"], 1))

        return send

    def _link_refused(
        self, *, forged: bool = False, moved: bool = False, expired: bool = False
    ) -> Callable[[], Awaitable[bool]]:
        async def send() -> bool:
            lane = "email:<hostile@example.test>"
            when = datetime.now(UTC) + (timedelta(seconds=-60) if expired else timedelta(days=1))
            token = approval_token(
                key=(b"x" * 40) if forged else LINK_SECRET.encode(),
                session=SESSION,
                run_id="run-h",
                wait_id="wait-h",
                calls=[("call-h", "digest-h")],
                approver=self.approver if (forged or moved or expired) else self.stranger,
                decision="approve",
                expires_at=when,
            )
            link = self._signed_link(token, lane)
            if moved:
                link = self._signed_link(token, "email:<other@example.test>", signed_lane=lane)
            answers = [await self.http.get(link), await self.http.post(link)]
            return all(_refused(answer) for answer in answers)

        return send

    # -- faults ------------------------------------------------------------------------------

    def lose_next_ack(self) -> None:
        self.smtp.lose_response_after_data()

    async def hang(self) -> bool:
        assert self.smtp_relay is not None
        self.imap_relay.freeze()
        self.smtp_relay.freeze()
        return True


# -- webhook ------------------------------------------------------------------------------------

WEBHOOK_MAX_TEXT = 1000


class WebhookRig:
    """The system behind a webhook: it signs what it sends, and receives on a real port.

    With `status` the channel asks the receiver's status URL what arrived; without, it cannot
    know (D195). `strays` lists every ``webhook-id`` the receiver was sent again although it
    had taken it: with a status URL there is none to drop, the channel found what arrived.
    """

    approver = "alice"
    stranger = "mallory"

    def __init__(self, *, status: bool = True) -> None:
        self.status = status
        self.peer = WebhookPeer(secret=new_secret("suite"))
        self.channel: ChannelAdapter | None = None
        self._http: httpx.AsyncClient | None = None
        self._ids = itertools.count(1)

    async def __aenter__(self) -> Self:
        await self.peer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            await self._http.aclose()
        await self.peer.stop()

    @property
    def http(self) -> httpx.AsyncClient:
        assert self._http is not None, "build the channel first"
        return self._http

    @property
    def strays(self) -> list[str]:
        """The webhook-ids the receiver was sent again after taking them (it dropped them)."""
        return [post.webhook_id for post in self.peer.posts if post.duplicate]

    def build(self) -> ChannelAdapter:
        section = WebhookSettings(
            url=self.peer.url,
            secret=self.peer.secret,
            status_url=self.peer.status_url if self.status else None,
            approvers=(self.approver,),
            max_text_chars=WEBHOOK_MAX_TEXT,
        )
        context = ChannelContext(clock=SystemClock(), call_timeout_s=CALL_TIMEOUT_S)
        self.channel = adapter = WEBHOOK_SPEC.build(section, context)
        assert adapter.router is not None, "the channel mounts /webhook/events"
        app = FastAPI()
        app.include_router(adapter.router)
        transport = httpx.ASGITransport(app=app)
        self._http = httpx.AsyncClient(transport=transport, base_url="http://gateway.test")
        return adapter

    def _msg_id(self) -> str:
        return f"msg_suite{next(self._ids)}"

    async def say(self, thread: str, text: str, *, author: str, redeliver: int = 0) -> Said:
        payload = {"thread": thread, "text": text, "author": {"id": author}}
        msg_id = self._msg_id()
        acked = []
        for _ in range(1 + redeliver):  # a sender's retry: the same id, signed anew
            response = await self.peer.send(self.http, payload, msg_id=msg_id)
            acked.append(response.status_code == 202)
        return Said(tuple(acked))

    def _taken(self, thread: str) -> list[tuple[str, dict[str, Any]]]:
        return [
            (webhook_id, post.payload)
            for webhook_id, post in self.peer.taken.items()
            if post.payload.get("thread") == thread
        ]

    async def seen(self, thread: str) -> list[Posted]:
        return [
            Posted(
                id=webhook_id,
                mark=payload.get("delivery_id"),
                text=str(payload.get("text", "")),
                controls=("approve", "deny") if payload.get("approval") else (),
            )
            for webhook_id, payload in self._taken(thread)
        ]

    def mark_of(self, delivery_id: str) -> str:
        return delivery_id

    async def decide(self, posted: Posted, *, approve: bool, as_user: str) -> None:
        payload = self.peer.taken[posted.id].payload
        view = payload["approval"]
        decision = {
            "type": "decision",
            "thread": payload["thread"],
            "space": payload["space"],
            "session": view["session"],
            "run_id": view["run_id"],
            "wait_id": view["wait_id"],
            "decisions": [
                {"tool_call_id": c["tool_call_id"], "args_digest": c["args_digest"],
                 "approved": approve} | ({} if approve else {"reason": "not now"})
                for c in view["calls"]
            ],
            "author": {"id": as_user},
        }  # fmt: skip
        await self.peer.send(self.http, decision)

    def hostile(self) -> Sequence[Hostile]:
        message = {"thread": "hostile", "text": "let me in", "author": {"id": self.stranger}}

        def signed(name: str, payload: Any, **how: Any) -> Hostile:
            async def send() -> bool:
                return _refused(await self.peer.send(self.http, payload, **how))

            return Hostile(name, send)

        def raw(name: str, body: bytes, headers: Callable[[bytes], dict[str, str]]) -> Hostile:
            async def send() -> bool:
                answer = await self.peer.send_raw(self.http, body, headers(body))
                return _refused(answer)

            return Hostile(name, send)

        def unsigned(body: bytes) -> dict[str, str]:
            return {"content-type": "application/json"}

        def as_text(body: bytes) -> dict[str, str]:
            return self.peer.signed(body)[1] | {"content-type": "text/plain"}

        def swapped(body: bytes) -> dict[str, str]:
            """The headers of another body: a captured signature on a changed request."""
            return self.peer.signed(json.dumps({**message, "text": "hello"}).encode())[1]

        decision = {
            "type": "decision",
            "thread": "hostile",
            "run_id": "run-x",
            "wait_id": "wait-x",
            "decisions": [{"tool_call_id": "c", "args_digest": "d", "approved": True}],
            "author": {"id": self.approver},
        }
        twice = {**decision, "decisions": decision["decisions"] * 2}  # type: ignore[operator]
        now = int(time.time())
        body = json.dumps(message).encode()
        return [
            signed("a forged signature", message, secret=new_secret("not-the-secret")),
            raw("no signature", body, unsigned),
            raw("a captured signature on another body", body, swapped),
            signed("a replayed request (a stale timestamp)", message, timestamp=now - 600),
            signed("a timestamp from the future", message, timestamp=now + 600),
            signed("a webhook-id with a dot", message, msg_id="msg.dotted"),
            signed("a body that is not JSON", b"{not json"),
            raw("a body that is not application/json", body, as_text),
            signed("a body that is no object", [message]),
            signed("a body over the limit", {**message, "text": "x" * 300_000}),
            signed("an unknown type", {**message, "type": "admin"}),
            signed("an unknown field", {**message, "admin": True}),
            signed("a NUL in the text", {**message, "text": "a\x00b"}),
            signed("an empty text", {**message, "text": "  "}),
            signed("a text over the limit", {**message, "text": "y" * (WEBHOOK_MAX_TEXT + 1)}),
            signed("a thread that is no name", {**message, "thread": "no way!"}),
            signed("a reply context over the limit",
                   {**message, "reply_context": {"x": "z" * 5000}}),
            signed("a decision from someone who is no approver",
                   {**decision, "author": {"id": self.stranger}}),
            signed("a decision nothing waits for", decision),
            signed("a call decided twice in one request", twice),
        ]  # fmt: skip

    def lose_next_ack(self) -> None:
        self.peer.lose_ack()

    async def hang(self) -> bool:
        self.peer.lose_ack(times=1000, hang=True)
        return True
