"""The Slack channel: slack-bolt receives (HTTP or Socket Mode), the Web API posts and finds.

Inbound: bolt runs with ``process_before_response`` so that an event is acknowledged only when
its listener returned, which is after the message is in the durable inbox; a listener that
cannot reach the inbox raises, bolt answers 500 (HTTP) or sends no ack (Socket Mode), and Slack
delivers the event again. Which messages are taken, as which thread, is `events.classify`.

Outbound: every message the bot posts carries its delivery id (and its part number) in Slack
message metadata, so `reconcile` finds what an attempt with an unknown outcome posted by
reading the thread from the newest user message on. The Web API client retries nothing by
itself (slack_sdk's default re-sends a post whose answer was lost: a duplicate); the outbox
retries, after reconciling. A reply longer than a message is split into parts; a retry posts
only the parts that are missing.

Authority: the bot removed from a channel, the channel archived or deleted, the app
uninstalled or its token revoked reach the gateway as `AuthorityChange`s (`authority`): it
ends the runs of the threads concerned and posts nothing more there (D267).

Approvals: Approve records the decision at once; Deny opens a dialog for a reason first. Only
the approvers configured for the channel may decide (others are told so, privately, and nothing
is recorded); a click the gateway refuses (no such request, another batch, no longer waiting)
is told why, privately; the first decision for a wait wins (a double click or a second approver
learns who decided). When the wait ends, however it ends, the gateway delivers its close, and
every copy of the request in the thread (the request and its reminders) is rewritten without
buttons to say how it closed, by whom and when.

The channel is five parts over one `SlackLink` (the client, the clock, the bot's identity, the
sink): this module receives; `history` reads threads (late mentions, backfill); `approvals`
takes the buttons' clicks; `delivery` posts, rewrites and reconciles; `live` shows a run's
progress (the thread's status) and streams its answer, which the reply then finishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs

import aiohttp
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from slack_bolt.adapter.fastapi.async_handler import AsyncSlackRequestHandler
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient

from adapters.channel import (
    Acceptance,
    AdapterStartError,
    Capabilities,
    DeliveryReceipt,
    Inbound,
    InboundSink,
    KnownThread,
    NotRouted,
    Outbound,
    Reconciled,
)
from adapters.errors import AdapterError
from adapters.live import LiveUpdate
from adapters.slack.approvals import SlackApprovals
from adapters.slack.authority import AUTHORITY_EVENTS, authority_change
from adapters.slack.delivery import SlackDelivery
from adapters.slack.events import CHANNEL, Classified, classify
from adapters.slack.files import SlackFiles
from adapters.slack.history import SlackHistory
from adapters.slack.link import REFUSED_TOKEN, SlackLink, ts_seconds
from adapters.slack.live import SlackLive
from harness_core import Clock, SystemClock

__all__ = ["SlackChannel", "SlackStartError"]

log = logging.getLogger("adapters.slack")
for _name in ("adapters.slack.sdk", "adapters.slack.bolt"):
    # their debug lines print whole requests and events (a message's text, a user's name):
    # at GATEWAY_LOG_LEVEL=debug too, the logs hold ids and outcomes only
    logging.getLogger(_name).setLevel(logging.INFO)

_MAX_BODY = 1_000_000
_SEEN_EVENTS = 10_000
_CATCH_UP_AFTER_S = 2.0
"""A mention taken this long after it was posted (Slack retried it) has its thread read for
messages let go meanwhile (`SlackHistory.catch_up`)."""
_SIGNATURE = re.compile(r"v0=[0-9a-fA-F]{64}")
"""What Slack's ``X-Slack-Signature`` is: the version, and an HMAC-SHA256 in hex."""
_LAST_RETRY = 3
"""Slack's last retry of an event it got no 200 for: "up to 3 times" (the Events API)."""


class SlackStartError(AdapterStartError):
    """The Slack channel cannot start (a token Slack refuses); the message is one line."""


class SlackChannel:
    """The Slack channel adapter (a `ChannelAdapter`; see the module docstring)."""

    name = CHANNEL

    def __init__(
        self,
        *,
        bot_token: str,
        signing_secret: str | None = None,
        app_token: str | None = None,
        api_url: str = "https://slack.com/api/",
        approvers: Mapping[str, Sequence[str]] | None = None,
        working_reaction: str = "eyes",
        clock: Clock | None = None,
        call_timeout_s: float = 10.0,
        context_messages: int = 50,
        backfill_hours: float = 24.0,
        late_after_s: float = 60.0,
        file_host: str = "https://files.slack.com",
        stream: bool = True,
    ) -> None:
        if signing_secret is None and app_token is None:
            raise ValueError(
                "Slack needs a signing secret (HTTP mode) or an app token (Socket Mode)"
            )
        self.clock = clock or SystemClock()
        self.socket_mode = app_token is not None
        if signing_secret is not None and app_token is not None:
            # moving from Socket Mode to HTTP, the app token left set: Slack's check of the
            # Request URL failed, and nothing said why (an outside probe)
            log.warning(
                "slack signing secret unused",
                extra={
                    "note": "an app token is set too: Slack is reached by Socket Mode, and "
                    "/slack/events is not served (unset the app token for HTTP mode)"
                },
            )
        self.api_url = api_url
        self.call_timeout_s = int(call_timeout_s)  # what the Web API client takes
        # slack-sdk and bolt log through ours: one JSON line per event, no tracebacks, no tokens
        self.client = AsyncWebClient(
            token=bot_token,
            base_url=api_url,
            timeout=self.call_timeout_s,
            retry_handlers=[],
            logger=logging.getLogger("adapters.slack.sdk"),
        )
        self.link = SlackLink(
            client=self.client,
            clock=self.clock,
            api_url=api_url,
            call_timeout_s=self.call_timeout_s,
        )
        self.approvers = {channel: tuple(people) for channel, people in (approvers or {}).items()}
        """Per channel id (or ``*``), who may decide (shared with `approvals`: edits apply)."""
        self.history = SlackHistory(
            self.link, context_messages=context_messages, backfill_hours=backfill_hours
        )
        self.approvals = SlackApprovals(self.link, self.approvers)
        self.live = SlackLive(self.link)
        self.live.streaming_ok = stream  # off: every reply one message (the status still shows)
        self.delivery = SlackDelivery(
            self.link,
            working_reaction=working_reaction,
            late_after_s=late_after_s,
            live=self.live,
        )
        self._bot_token = bot_token
        self._identifying = asyncio.Lock()
        self._refused_said_ms = -60_000

        async def authorize() -> AuthorizeResult:  # bolt names a method's `self` an argument
            return await self._authorize()

        bolt_log = logging.getLogger("adapters.slack.bolt")
        with _quiet(bolt_log):  # "`token` will be ignored": it is not, authorize gives it back
            self.app = _App(
                client=self.client,
                authorize=authorize,  # bolt's own answered a 5xx of auth.test "please reinstall"
                logger=bolt_log,
                signing_secret=signing_secret or "",
                process_before_response=True,
                request_verification_enabled=not self.socket_mode,
                ssl_check_enabled=False,
                url_verification_enabled=True,
            )
        self._verifier = SignatureVerifier(signing_secret) if signing_secret else None
        self._app_token = app_token
        self._socket: AsyncSocketModeHandler | None = None
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._strangers: set[str] = set()
        """The other workspaces whose events were ignored (each said once)."""
        self._taking: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        """A lock per thread being taken, and how many wait on it: a burst of a thread's
        messages each read the thread's working list and write it back, one at a time."""
        self._register()
        self.router: APIRouter | None = None if self.socket_mode else self._http_router()
        self.body_limits: dict[str, int] = {} if self.socket_mode else {"/slack/": _MAX_BODY}
        """The bound of a request body at ``/slack/events`` (the app refuses more unread)."""
        self.files = SlackFiles(bot_token, file_host=file_host, timeout_s=call_timeout_s)
        self.capabilities = Capabilities(
            decisions=True, approvers=True, edits=True, streaming=stream, files=True
        )
        """Approve/Deny buttons for the configured approvers; an approval's close edits every
        posted copy (chat.update); a run's answer is streamed and its reply finishes the
        stream (`live`)."""

    @property
    def backfilled(self) -> int:
        """Messages taken in by backfills (for tests and logs)."""
        return self.history.backfilled

    async def start(self, sink: InboundSink) -> None:
        """Check the bot token (auth.test), then receive: HTTP routes, or a Socket Mode link.

        Raises:
            SlackStartError: Slack refuses the bot token, or the app token (Socket Mode). A
                network failure is logged instead, in words naming the API's host (D172): the
                channel starts and bolt asks again on the first event.
        """
        self.link.sink = sink
        self.link.receiving = True
        try:
            await self._identify()
        except SlackApiError as exc:
            error = exc.response.get("error")
            if error in REFUSED_TOKEN:
                raise SlackStartError(f"Slack refuses the bot token ({error})") from None
            log.warning("slack auth.test failed", extra={"reason": self.link.api_said(exc)})
        except (aiohttp.ClientError, TimeoutError) as exc:
            reason = self.link.unreachable(exc, "auth.test")
            log.warning("slack unreachable at start", extra={"reason": reason})
        else:
            if self.socket_mode:
                await self._check_app_token()
        if self.socket_mode:
            self._socket = AsyncSocketModeHandler(self.app, self._app_token)
            self._socket.client.message_listeners.append(self._on_socket_message)
            # In the background: slack-sdk retries an unreachable Slack forever, and the rest
            # of the service (web channel, workers, deliveries) must not wait for it.
            self.link.spawn(self._socket.connect_async())  # type: ignore[no-untyped-call]
        else:
            self.history.start_backfill()
        log.info("slack started", extra={"mode": "socket" if self.socket_mode else "http"})

    async def _identify(self) -> None:
        """Learn the bot's and its workspace's ids from Slack (auth.test); raises its failure."""
        identity = await self.link.client.auth_test()
        self.link.bot_user_id = identity.get("user_id")
        self.link.bot_id = identity.get("bot_id")
        self.link.team_id = identity.get("team_id")
        self.link.enterprise_id = identity.get("enterprise_id")
        self.link.enterprise_install = bool(identity.get("is_enterprise_install"))

    async def _identified(self) -> str | None:
        """None once the bot's identity is known (asked of Slack now if need be), else why not.

        While it is unknown no event can be judged (whose mention, which workspace's): bolt's
        own check answered Slack 200 with "please reinstall this app" when auth.test met a
        Slack 5xx, and Slack never sends an answered event again (an outside probe).
        """
        async with self._identifying:  # a burst of events asks once
            if self.link.team_id is not None or self.link.enterprise_id is not None:
                return None
            try:
                await self._identify()
            except SlackApiError as exc:
                return self.link.api_said(exc)
            except (aiohttp.ClientError, TimeoutError) as exc:
                return self.link.unreachable(exc, "auth.test")
            log.info("slack identity learned", extra={"team": self.link.team_id})
            return None

    async def _authorize(self) -> AuthorizeResult:
        """Bolt's authorization of a request: the bot's own identity, which the route checked.

        Raises:
            _IdentityUnknown: it is still unknown (Socket Mode: bolt answers 500, the event
                is not acknowledged, and Slack sends it again).
        """
        why = await self._identified()
        if why is not None:
            raise _IdentityUnknown(f"auth.test: {why}")
        link = self.link
        return AuthorizeResult(
            enterprise_id=link.enterprise_id,
            team_id=link.team_id,
            bot_user_id=link.bot_user_id,
            bot_id=link.bot_id,
            bot_token=self._bot_token,
        )

    async def _check_app_token(self) -> None:
        """Ask Slack for a Socket Mode URL once: a refused app token stops the start.

        (slack-sdk's Socket Mode client would retry a refused token forever, in the background,
        with the service looking healthy.) The URL it hands out is left unused; it expires.
        """
        try:
            await self.link.client.apps_connections_open(app_token=self._app_token or "")
        except SlackApiError as exc:
            error = exc.response.get("error")
            if error in REFUSED_TOKEN:
                raise SlackStartError(f"Slack refuses the app token ({error})") from None
            log.warning(
                "slack apps.connections.open failed", extra={"reason": self.link.api_said(exc)}
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            reason = self.link.unreachable(exc, "apps.connections.open")
            log.warning("slack unreachable at start", extra={"reason": reason})

    async def _on_socket_message(self, _client: Any, message: dict[str, Any], _raw: Any) -> None:
        if message.get("type") == "hello":  # connected, or connected again after a drop
            self.history.start_backfill()

    async def stop(self) -> None:
        """Stop receiving; deliveries keep working until `close`. Idempotent.

        Events and clicks are refused from now on (Slack sends them again), the Socket Mode
        link closes and a running backfill ends.
        """
        self.link.receiving = False
        backfill = self.history.backfilling
        if backfill is not None and not backfill.done():
            backfill.cancel()
        socket, self._socket = self._socket, None
        if socket is not None:
            for task in list(self.link.tasks):  # a connect still retrying
                task.cancel()
            with contextlib.suppress(Exception):
                await socket.close_async()  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        """Stop, let best-effort follow-ups (reactions, message updates) end, close the client."""
        await self.stop()
        if self.link.tasks:
            await asyncio.wait(set(self.link.tasks), timeout=2.0)
        for task in list(self.link.tasks):
            task.cancel()
        self.link.sink = None

    def _http_router(self) -> APIRouter:
        handler = AsyncSlackRequestHandler(self.app)
        router = APIRouter()

        @router.post("/slack/events", include_in_schema=False)
        async def slack_events(request: Request) -> Response:
            """Events and interactivity (one URL): signature first, then the shape, then bolt."""
            body = await request.body()
            if len(body) > _MAX_BODY:
                return _refusal(413, "the request is too large")
            if _ssl_check(body, request.headers.get("content-type", "")):
                return Response(status_code=200)  # Slack's certificate check: unsigned, empty
            if not self._signed(request, body):
                return _refusal(401, "invalid or stale signature")
            if _parse(body, request.headers.get("content-type", "")) is None:
                return _refusal(400, "malformed Slack request")
            why = await self._identified()
            if why is not None:  # a 5xx: Slack sends the event again, where a 200 lost it
                now = self.clock.now_ms()
                if now - self._refused_said_ms >= 60_000:  # once a minute, not once an event
                    self._refused_said_ms = now
                    log.warning(
                        "slack events refused for now", extra={"reason": f"auth.test: {why}"}
                    )
                return _refusal(503, "the bot's identity is not known yet; send it again")
            return await handler.handle(request)

        return router

    def _signed(self, request: Request, body: bytes) -> bool:
        timestamp = request.headers.get("x-slack-request-timestamp", "")
        signature = request.headers.get("x-slack-signature", "")
        if (
            self._verifier is None
            or not (timestamp.isascii() and timestamp.isdigit())
            or len(timestamp) > 12
            or not _SIGNATURE.fullmatch(signature)  # the SDK's compare raised on non-ASCII: a 500
        ):
            return False
        try:
            body.decode("utf-8")  # Slack sends UTF-8; the SDK's check would raise on the rest
        except UnicodeDecodeError:
            return False
        return self._verifier.is_valid(body=body, timestamp=timestamp, signature=signature)

    def _register(self) -> None:
        app = self.app
        app.event("app_mention")(self._on_mention)
        app.event("message")(self._on_message)
        for kind in AUTHORITY_EVENTS:
            app.event(kind)(self._on_authority)
        app.event(re.compile(r".+"))(self._on_other_event)
        app.action("approve")(self.approvals.on_approve)
        app.action("deny")(self.approvals.on_deny)
        app.view("deny_reason")(self.approvals.on_deny_reason)
        app.action("supply")(self.approvals.on_supply)
        app.view("supply_result")(self.approvals.on_supply_result)

    async def _on_mention(
        self,
        event: dict[str, Any],
        body: dict[str, Any],
        context: dict[str, Any],
        request: AsyncBoltRequest,
    ) -> None:
        self._learn_identity(context)
        await self._on_event("app_mention", event, body, last_try=_last_try(request))

    async def _on_message(
        self,
        event: dict[str, Any],
        body: dict[str, Any],
        context: dict[str, Any],
        request: AsyncBoltRequest,
    ) -> None:
        self._learn_identity(context)
        await self._on_event("message", event, body, last_try=_last_try(request))

    def _learn_identity(self, context: Mapping[str, Any]) -> None:
        """The bot's ids from bolt's own auth.test, when ours at start failed.

        Without them any user's mention would read as a mention of the bot.
        """
        if self.link.bot_user_id is None and context.get("bot_user_id"):
            self.link.bot_user_id = str(context["bot_user_id"])
            self.link.bot_id = context.get("bot_id") or self.link.bot_id
        # the install's own workspace (bolt's auth.test), never the request's: an event of
        # another workspace must not become ours
        known = context.get("authorize_result")
        team = getattr(known, "team_id", None)
        if self.link.team_id is None and team:
            self.link.team_id = str(team)
            self.link.enterprise_id = getattr(known, "enterprise_id", None)

    def _foreign(self, body: Mapping[str, Any]) -> bool:
        """Whether an event is another install's (`SlackLink.sent_here`), said once per one."""
        if self.link.sent_here(body):
            return False
        team = str(body.get("team_id") or body.get("enterprise_id") or "?")[:40]
        if team not in self._strangers:
            self._strangers.add(team)
            log.warning(
                "slack event of another workspace ignored",
                extra={"team": team, "ours": self.link.team_id or self.link.enterprise_id},
            )
        return True

    async def _on_authority(
        self, event: dict[str, Any], body: dict[str, Any], context: dict[str, Any]
    ) -> None:
        """The bot lost (or got back) its authority in a channel, or everywhere (D267).

        Acknowledged once the gateway holds the change (`InboundSink.authority`): one it could
        not record raises, bolt answers 500 (HTTP) or sends no ack, and Slack sends it again.
        """
        self._learn_identity(context)
        if self._foreign(body):
            return
        event_id = body.get("event_id")
        if isinstance(event_id, str) and event_id in self._seen:
            return
        change = authority_change(
            event, bot_user_id=self.link.bot_user_id, now_ms=self.link.clock.now_ms()
        )
        if change is None:
            log.debug("slack event not for the bot", extra={"type": str(event.get("type"))})
            return
        await self.link.sink_or_fail().authority(change)
        if isinstance(event_id, str):
            self._remember(event_id)
        log.warning(
            "slack authority " + ("revoked" if change.revoked else "back"),
            extra={"cause": change.cause, "space": change.space or "*"},
        )

    async def _on_other_event(self, body: dict[str, Any]) -> None:
        kind = body.get("event", {}).get("type") if isinstance(body.get("event"), dict) else None
        log.info("slack event ignored", extra={"type": str(kind)})

    async def _on_event(
        self, kind: Any, event: dict[str, Any], body: dict[str, Any], *, last_try: bool = False
    ) -> None:
        if self._foreign(body):
            return
        event_id = body.get("event_id")
        if isinstance(event_id, str) and event_id in self._seen:
            return  # a retry of an event already held (the inbox would say duplicate too)
        classified = classify(
            kind,
            event,
            bot_user_id=self.link.bot_user_id or "",
            bot_id=self.link.bot_id,
            now_ms=self.link.clock.now_ms(),
        )
        inbound = classified.inbound
        if classified.take == "ignore" or inbound is None:
            log.debug("slack event not taken", extra={"reason": classified.reason})
            return
        sink = self.link.sink_or_fail()
        ts = str(event["ts"])
        late = self.link.clock.now_ms() / 1000 - ts_seconds(ts) > _CATCH_UP_AFTER_S
        async with self._one_at_a_time(inbound.thread.lane):
            taken = await self._take(sink, event, classified, inbound, late, last_try)
        if taken is None:
            return
        acceptance, known, inbound = taken
        if isinstance(event_id, str):
            self._remember(event_id)
        fresh = not acceptance.duplicate and not acceptance.revoked
        if fresh and known is None and (classified.joined_midway or late):
            # a message of the thread may have come (and been let go) before the thread was
            # a lane: while this mention waited to be retried, or for its thread's history
            self.link.spawn(self.history.catch_up(inbound.thread, ts))
        if fresh and self.delivery.working_reaction:
            self.delivery.working_on(str(event["channel"]), ts)

    async def _take(
        self,
        sink: InboundSink,
        event: dict[str, Any],
        classified: Classified,
        inbound: Inbound,
        late: bool,
        last_try: bool,
    ) -> tuple[Acceptance, KnownThread | None, Inbound] | None:
        """Hand a classified message to the sink; None when it is not taken.

        Returns what the sink said, the thread as it was known before, and the message as handed.
        `last_try`: Slack will not send this event again (`SlackFiles.incoming`).
        """
        try:
            wanted = classified.take == "if_known" or classified.joined_midway or late
            known = (
                await sink.known(inbound.thread)
                if wanted or self.delivery.working_reaction
                else None
            )
            if classified.take == "if_known" and known is None:
                log.debug("slack event not taken", extra={"reason": "thread without the bot"})
                return None
            if classified.joined_midway and known is None:
                context, omitted = await self.history.before(inbound)
                inbound = inbound.model_copy(
                    update={"context": context, "context_omitted": omitted}
                )
            if self.delivery.working_reaction:
                inbound = await self.delivery.with_working(sink, inbound, known)
            if inbound.attachments:  # held before the message is: a retry fetches nothing again
                incoming = self.files.incoming(event, inbound.attachments, last_try=last_try)
                held = await sink.take_files(inbound.thread, incoming)
                inbound = inbound.model_copy(update={"attachments": held})
            return await sink.accept(inbound), known, inbound
        except NotRouted as exc:
            log.warning("slack message not routed", extra={"reason": str(exc)})
            return None

    @contextlib.asynccontextmanager
    async def _one_at_a_time(self, lane: str) -> AsyncIterator[None]:
        """Hold the thread's taking lock (made when first wanted, dropped when nobody waits)."""
        entry = self._taking.setdefault(lane, (asyncio.Lock(), [0]))
        lock, waiting = entry
        waiting[0] += 1
        try:
            async with lock:
                yield
        finally:
            waiting[0] -= 1
            if not waiting[0]:
                del self._taking[lane]

    def _remember(self, event_id: str) -> None:
        self._seen[event_id] = None
        while len(self._seen) > _SEEN_EVENTS:
            self._seen.popitem(last=False)

    async def deliver(self, outbound: Outbound) -> DeliveryReceipt:
        """Post `outbound` into its thread (`SlackDelivery.deliver`).

        Raises:
            DeliveryError: not delivered, or with an unknown outcome (the retry reconciles).
        """
        return await self.delivery.deliver(outbound)

    async def show(self, update: LiveUpdate) -> None:
        """Show a run's progress or text in its thread (`SlackLive.show`; never raises)."""
        await self.live.show(update)

    async def reconcile(self, outbound: Outbound) -> Reconciled:
        """Whether an earlier attempt of `outbound` is in its thread (`SlackDelivery.reconcile`)."""
        return await self.delivery.reconcile(outbound)

    async def given_up(self, outbound: Outbound, reason: str) -> None:
        """A dead letter: its question stops looking worked on (`SlackDelivery.given_up`)."""
        self.delivery.given_up(outbound)


@contextlib.contextmanager
def _quiet(logger: logging.Logger) -> Iterator[None]:
    """`logger` says nothing below an error meanwhile."""
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


class _IdentityUnknown(AdapterError):
    """The bot's identity could not be learned from Slack (auth.test failed): try again later."""


class _App(AsyncApp):
    """Bolt's app, saying a request no listener handles in one short line.

    Bolt's own warning is lines of suggested code quoting the request's fields (what a person
    typed in a menu's search, a shortcut's or a slash command's text): an outside probe.
    """

    def _handle_unmatched_requests(self, req: AsyncBoltRequest, resp: BoltResponse) -> BoltResponse:
        kind = req.body.get("type") if isinstance(req.body, dict) else None
        if kind is None and isinstance(req.body, dict) and "command" in req.body:
            kind = "slash_command"
        log.info("slack request not handled", extra={"type": str(kind)[:40]})
        return resp


def _last_try(request: AsyncBoltRequest) -> bool:
    """Whether Slack will not send this event again (``X-Slack-Retry-Num``).

    Bolt gives Socket Mode's ``retry_attempt`` as the same header.
    """
    values = request.headers.get("x-slack-retry-num") or ("0",)
    try:
        return int(values[0]) >= _LAST_RETRY
    except ValueError:
        return False


def _media_type(content_type: str) -> str:
    """A ``Content-Type``'s media type, without parameters or case (`APPLICATION/JSON` too)."""
    return content_type.split(";", 1)[0].strip().lower()


def _ssl_check(body: bytes, content_type: str) -> bool:
    """Whether this is Slack's certificate check (``ssl_check=1``, form-encoded).

    Slack sends it without a signature (recorded in slackapi/bolt-js#1397), and bolt answers it
    before verifying one: it gets an empty 200 and nothing else, whatever else the form holds.
    Exactly one ``ssl_check`` of exactly ``1`` (slackapi/bolt-js#2899).
    """
    if _media_type(content_type) != "application/x-www-form-urlencoded":
        return False
    try:
        form = parse_qs(body.decode("utf-8"), keep_blank_values=True)
    except (UnicodeDecodeError, ValueError):
        return False
    return form.get("ssl_check") == ["1"]


def _parse(body: bytes, content_type: str) -> dict[str, Any] | None:
    """The request's JSON (events) or its ``payload`` form field (interactivity); None if bad."""
    media = _media_type(content_type)
    try:
        text = body.decode("utf-8")
        if media == "application/json":
            parsed = json.loads(text)
        elif media == "application/x-www-form-urlencoded":
            form = parse_qs(text, strict_parsing=False)
            if "payload" in form:
                # the last, as bolt reads it (``dict(parse_qsl(...))``): checking the first
                # passed a decoy while bolt acted on another
                parsed = json.loads(form["payload"][-1])
            elif "command" in form or "ssl_check" in form:
                parsed = {key: values[0] for key, values in form.items()}
            else:
                return None
        else:
            return None
    except (UnicodeDecodeError, ValueError, RecursionError):  # nesting past the parser: a 500
        return None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("type", ""), str):
        return None
    return parsed if _shaped(parsed) else None


def _shaped(parsed: dict[str, Any]) -> bool:
    """Whether a request has the parts bolt reads of its kind (else bolt fails with a 500)."""
    kind = parsed.get("type")
    if kind == "event_callback":
        event = parsed.get("event")
        return (
            isinstance(event, dict)
            and isinstance(event.get("type"), str)
            and all(
                _ids_shaped(part)
                for part in (parsed, event, event.get("message"), event.get("previous_message"))
            )
        )
    if kind == "block_actions":
        actions = parsed.get("actions")
        return (
            isinstance(actions, list)
            and bool(actions)
            and all(isinstance(a, dict) and isinstance(a.get("action_id"), str) for a in actions)
        )
    if kind in ("view_submission", "view_closed"):
        view = parsed.get("view")
        return isinstance(view, dict) and isinstance(view.get("type"), str)
    return True


_IDS = ("user", "channel", "team", "enterprise")
"""What bolt reads of a request (and of its event, message, previous message) for its context:
each a string or an object with a string ``id``, and ``<name>_id`` a string."""


def _ids_shaped(part: Any) -> bool:
    """Whether bolt can read the ids of `part` (an int ``user`` was a TypeError: a 500)."""
    if not isinstance(part, dict):
        return True  # absent: bolt looks elsewhere
    for name in _IDS:
        value = part.get(name)
        if isinstance(value, dict):
            value = value.get("id")
        if not isinstance(value, str | None) or not isinstance(part.get(f"{name}_id"), str | None):
            return False
    return True


def _refusal(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)
