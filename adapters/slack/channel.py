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

Approvals: Approve records the decision at once; Deny opens a dialog for a reason first. Only
the approvers configured for the channel may decide (others are told so, privately, and nothing
is recorded); a click the gateway refuses (no such request, another batch, no longer waiting)
is told why, privately; the first decision for a wait wins (a double click or a second approver
learns who decided). When the wait ends, however it ends, the gateway delivers its close, and
every copy of the request in the thread (the request and its reminders) is rewritten without
buttons to say how it closed, by whom and when.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from slack_bolt.adapter.fastapi.async_handler import AsyncSlackRequestHandler
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient

from adapters.channel import (
    Acceptance,
    AdapterStartError,
    ApprovalClosed,
    Author,
    ContextMessage,
    DecisionInbound,
    DecisionItem,
    DecisionRefused,
    DeliveryError,
    DeliveryReceipt,
    Inbound,
    InboundSink,
    KnownThread,
    NotRouted,
    Outbound,
    Reconciled,
    ThreadRef,
    Unavailable,
    is_copy_of,
)
from adapters.failures import connection_failure
from adapters.slack.events import CHANNEL, classify, clean_text, slack_thread, split_thread
from adapters.slack.render import (
    DecisionTarget,
    approval_blocks,
    close_note,
    closed_blocks,
    decode_decision_value,
    deny_reason_modal,
    failure_blocks,
    fallback_text,
    mention,
    split_text,
    to_mrkdwn,
)
from harness_core import Clock, SystemClock

__all__ = ["SlackChannel", "SlackStartError"]

log = logging.getLogger("adapters.slack")

METADATA_TYPE = "gateway_delivery"
"""The Slack message metadata event type of everything the bot posts."""
_PART_LIMIT = 3_000
"""Characters per posted part (a section block's limit)."""
_PERMANENT = frozenset(
    {
        "channel_not_found",
        "not_in_channel",
        "is_archived",
        "thread_not_found",
        "msg_too_long",
        "invalid_blocks",
        "invalid_metadata_format",
        "restricted_action",
        "cannot_reply_to_message",
    }
)
"""Slack errors that a retry cannot fix (the delivery becomes a dead letter at once)."""
_BAD_TOKEN = frozenset(
    {"invalid_auth", "not_authed", "account_inactive", "token_revoked", "not_allowed_token_type"}
)
_MAX_BODY = 1_000_000
_SEEN_EVENTS = 10_000
_HISTORY_TIMEOUT_S = 1.5
_GROUP_TTL_MS = 60_000
_SCAN_PAGES = 10
_CLOSE_LOOKBACK_S = 600
"""A close looks for the request's copies from this long before the request was made (clocks
differ: ours stamps the request, Slack stamps the message)."""
_WORKING_MAX = 20
"""The newest messages of a thread that may wear the working reaction (a reply clears them)."""
_PING = re.compile(r"<!(here|channel|everyone|subteam\^[A-Z0-9]+)(?:\|[^>]*)?>")


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
    ) -> None:
        if signing_secret is None and app_token is None:
            raise ValueError(
                "Slack needs a signing secret (HTTP mode) or an app token (Socket Mode)"
            )
        self.clock = clock or SystemClock()
        self.approvers = {channel: tuple(people) for channel, people in (approvers or {}).items()}
        self.working_reaction = working_reaction
        self.context_messages = context_messages
        self.backfill_hours = backfill_hours
        self.late_after_s = late_after_s
        self.backfilled = 0
        """Messages taken in by backfills (for tests and logs)."""
        self._backfilling: asyncio.Task[None] | None = None
        self.socket_mode = app_token is not None
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
        self.app = AsyncApp(
            client=self.client,
            logger=logging.getLogger("adapters.slack.bolt"),
            signing_secret=signing_secret or "",
            process_before_response=True,
            request_verification_enabled=not self.socket_mode,
            ssl_check_enabled=False,
            url_verification_enabled=True,
        )
        self._verifier = SignatureVerifier(signing_secret) if signing_secret else None
        self._app_token = app_token
        self._socket: AsyncSocketModeHandler | None = None
        self._sink: InboundSink | None = None
        self._bot_user_id: str | None = None
        self._bot_id: str | None = None
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._partial: dict[str, set[int]] = {}
        self._groups: dict[str, tuple[int, frozenset[str]]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._register()
        self.router: APIRouter | None = None if self.socket_mode else self._http_router()
        self.body_limits: dict[str, int] = {} if self.socket_mode else {"/slack/": _MAX_BODY}
        """The bound of a request body at ``/slack/events`` (the app refuses more unread)."""

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self, sink: InboundSink) -> None:
        """Check the bot token (auth.test), then receive: HTTP routes, or a Socket Mode link.

        Raises:
            SlackStartError: Slack refuses the bot token, or the app token (Socket Mode). A
                network failure is logged instead, in words naming the API's host (D172): the
                channel starts and bolt asks again on the first event.
        """
        self._sink = sink
        try:
            identity = await self.client.auth_test()
            self._bot_user_id = identity.get("user_id")
            self._bot_id = identity.get("bot_id")
        except SlackApiError as exc:
            error = exc.response.get("error")
            if error in _BAD_TOKEN:
                raise SlackStartError(f"Slack refuses the bot token ({error})") from None
            log.warning("slack auth.test failed", extra={"reason": self._api_said(exc)})
        except (aiohttp.ClientError, TimeoutError) as exc:
            reason = self._unreachable(exc, "auth.test")
            log.warning("slack unreachable at start", extra={"reason": reason})
        else:
            if self.socket_mode:
                await self._check_app_token()
        if self.socket_mode:
            self._socket = AsyncSocketModeHandler(self.app, self._app_token)
            self._socket.client.message_listeners.append(self._on_socket_message)
            # In the background: slack-sdk retries an unreachable Slack forever, and the rest
            # of the service (web channel, workers, deliveries) must not wait for it.
            self._spawn(self._socket.connect_async())  # type: ignore[no-untyped-call]
        else:
            self._start_backfill()
        log.info("slack started", extra={"mode": "socket" if self.socket_mode else "http"})

    async def _check_app_token(self) -> None:
        """Ask Slack for a Socket Mode URL once: a refused app token stops the start.

        (slack-sdk's Socket Mode client would retry a refused token forever, in the background,
        with the service looking healthy.) The URL it hands out is left unused; it expires.
        """
        try:
            await self.client.apps_connections_open(app_token=self._app_token or "")
        except SlackApiError as exc:
            error = exc.response.get("error")
            if error in _BAD_TOKEN:
                raise SlackStartError(f"Slack refuses the app token ({error})") from None
            log.warning("slack apps.connections.open failed", extra={"reason": self._api_said(exc)})
        except (aiohttp.ClientError, TimeoutError) as exc:
            reason = self._unreachable(exc, "apps.connections.open")
            log.warning("slack unreachable at start", extra={"reason": reason})

    def _unreachable(self, error: BaseException, method: str) -> str:
        """Why the Web API could not be reached, in words naming its host and port."""
        url = urlsplit(self.api_url)
        try:
            port = url.port or (80 if url.scheme == "http" else 443)
        except ValueError:  # not a port: the host's words still help
            port = 0
        return connection_failure(
            error,
            protocol="Slack API",
            host=url.hostname or self.api_url,
            port=port,
            timeout_s=self.call_timeout_s,
            phase=method,
        )

    def _api_said(self, error: SlackApiError) -> str:
        """What the Web API answered instead of ``ok``, in words (a URL that is not Slack's)."""
        said = error.response.get("error") if isinstance(error.response.data, dict) else None
        status = error.response.status_code
        if said:
            return f"Slack answered {said} (HTTP {status})"
        return (
            f"{self.api_url} did not answer as the Slack Web API does (HTTP {status}, "
            "not Slack's JSON): check the API URL"
        )

    async def _on_socket_message(self, _client: Any, message: dict[str, Any], _raw: Any) -> None:
        if message.get("type") == "hello":  # connected, or connected again after a drop
            self._start_backfill()

    # -- backfill -------------------------------------------------------------------------

    def _start_backfill(self) -> None:
        if self.backfill_hours > 0 and (self._backfilling is None or self._backfilling.done()):
            self._backfilling = asyncio.ensure_future(self._backfill())
            self._tasks.add(self._backfilling)
            self._backfilling.add_done_callback(self._tasks.discard)

    async def _backfill(self) -> None:
        """Take in what was posted in the bot's recent threads while no process listened.

        For every conversation the bot is in, the threads a lane holds whose newest accepted
        message is younger than `backfill_hours` are read from that message on; each later
        message is handed to the sink like a live event (the inbox deduplicates, so several
        processes backfilling at once, or an event arriving meanwhile, take it once). They are
        taken in the order they were posted: under the default busy policy (steer) they join
        one run, which answers the thread as it now stands.
        """
        sink = self._sink
        if sink is None:
            return
        horizon = self.clock.now_ms() / 1000 - self.backfill_hours * 3600
        taken = 0
        try:
            for channel in await self._conversations():
                try:
                    threads = await sink.threads(CHANNEL, channel)
                except NotRouted:
                    continue
                for known in threads:
                    last = str(known.reply_context.get("ts") or "")
                    if _ts_seconds(last) >= horizon:
                        taken += await self._backfill_thread(sink, known.thread, last)
        except (SlackApiError, aiohttp.ClientError, TimeoutError, Unavailable) as exc:
            log.warning("slack backfill stopped", extra={"error": type(exc).__name__})
        self.backfilled += taken
        log.info("slack backfill done", extra={"taken": taken})

    async def _conversations(self) -> list[str]:
        found: list[str] = []
        cursor: str | None = None
        for _ in range(_SCAN_PAGES):
            answer = await self.client.users_conversations(
                types="public_channel,private_channel,im,mpim",
                exclude_archived=True,
                limit=200,
                **({"cursor": cursor} if cursor else {}),
            )
            found += [str(c["id"]) for c in answer.get("channels") or [] if c.get("id")]
            cursor = (answer.get("response_metadata") or {}).get("next_cursor") or None
            if not cursor:
                break
        return found

    async def _backfill_thread(self, sink: InboundSink, thread: ThreadRef, last: str) -> int:
        channel, root = split_thread(thread)
        if root is not None:
            answer = await self.client.conversations_replies(
                channel=channel, ts=root, oldest=last, limit=200
            )
        else:
            answer = await self.client.conversations_history(
                channel=channel, oldest=last, limit=200
            )
        messages = [m for m in answer.get("messages") or [] if isinstance(m, dict)]
        taken = 0
        for message in sorted(messages, key=lambda m: _ts_seconds(str(m.get("ts")))):
            if _ts_seconds(str(message.get("ts"))) <= _ts_seconds(last):
                continue
            event = {**message, "channel": channel}
            if channel.startswith("D"):
                event["channel_type"] = "im"
            classified = classify(
                "message",
                event,
                bot_user_id=self._bot_user_id or "",
                bot_id=self._bot_id,
                now_ms=self.clock.now_ms(),
            )
            if classified.take == "ignore" or classified.inbound is None:
                continue
            if classified.inbound.thread != thread:
                continue  # a DM's threaded reply seen from its top level: its own lane
            acceptance = await sink.accept(classified.inbound)
            taken += not acceptance.duplicate
        return taken

    async def stop(self) -> None:
        """Stop receiving (close the Socket Mode link); idempotent."""
        socket, self._socket = self._socket, None
        if socket is not None:
            for task in list(self._tasks):  # a connect still retrying
                task.cancel()
            with contextlib.suppress(Exception):
                await socket.close_async()  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        """Stop, let best-effort follow-ups (reactions, message updates) end, close the client."""
        await self.stop()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=2.0)
        for task in list(self._tasks):
            task.cancel()
        self._sink = None

    # -- inbound: HTTP -----------------------------------------------------------------------

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
            return await handler.handle(request)

        return router

    def _signed(self, request: Request, body: bytes) -> bool:
        timestamp = request.headers.get("x-slack-request-timestamp", "")
        signature = request.headers.get("x-slack-signature", "")
        if self._verifier is None or not timestamp.isdigit() or len(timestamp) > 12:
            return False
        return self._verifier.is_valid(body=body, timestamp=timestamp, signature=signature)

    # -- inbound: listeners ----------------------------------------------------------------------

    def _register(self) -> None:
        app = self.app
        app.event("app_mention")(self._on_mention)
        app.event("message")(self._on_message)
        app.event(re.compile(r".+"))(self._on_other_event)
        app.action("approve")(self._on_approve)
        app.action("deny")(self._on_deny)
        app.view("deny_reason")(self._on_deny_reason)

    async def _on_mention(
        self, event: dict[str, Any], body: dict[str, Any], context: dict[str, Any]
    ) -> None:
        self._learn_identity(context)
        await self._on_event("app_mention", event, body)

    async def _on_message(
        self, event: dict[str, Any], body: dict[str, Any], context: dict[str, Any]
    ) -> None:
        self._learn_identity(context)
        await self._on_event("message", event, body)

    def _learn_identity(self, context: Mapping[str, Any]) -> None:
        """The bot's ids from bolt's own auth.test, when ours at start failed.

        Without them any user's mention would read as a mention of the bot.
        """
        if self._bot_user_id is None and context.get("bot_user_id"):
            self._bot_user_id = str(context["bot_user_id"])
            self._bot_id = context.get("bot_id") or self._bot_id

    async def _on_other_event(self, body: dict[str, Any]) -> None:
        kind = body.get("event", {}).get("type") if isinstance(body.get("event"), dict) else None
        log.info("slack event ignored", extra={"type": str(kind)})

    async def _on_event(self, kind: Any, event: dict[str, Any], body: dict[str, Any]) -> None:
        event_id = body.get("event_id")
        if isinstance(event_id, str) and event_id in self._seen:
            return  # a retry of an event already held (the inbox would say duplicate too)
        classified = classify(
            kind,
            event,
            bot_user_id=self._bot_user_id or "",
            bot_id=self._bot_id,
            now_ms=self.clock.now_ms(),
        )
        inbound = classified.inbound
        if classified.take == "ignore" or inbound is None:
            log.debug("slack event not taken", extra={"reason": classified.reason})
            return
        sink = self._sink_or_fail()
        try:
            wanted = classified.take == "if_known" or classified.joined_midway
            known = await sink.known(inbound.thread) if wanted or self.working_reaction else None
            if classified.take == "if_known" and known is None:
                log.debug("slack event not taken", extra={"reason": "thread without the bot"})
                return
            if classified.joined_midway and known is None:
                context, omitted = await self._history(inbound)
                inbound = inbound.model_copy(
                    update={"context": context, "context_omitted": omitted}
                )
            if self.working_reaction:
                inbound = await self._with_working(sink, inbound, known)
            acceptance = await sink.accept(inbound)
        except NotRouted as exc:
            log.warning("slack message not routed", extra={"reason": str(exc)})
            return
        if isinstance(event_id, str):
            self._remember(event_id)
        if not acceptance.duplicate and self.working_reaction:
            channel, ts = str(event["channel"]), str(event["ts"])
            self._spawn(self._react(channel, ts, add=True))

    def _remember(self, event_id: str) -> None:
        self._seen[event_id] = None
        while len(self._seen) > _SEEN_EVENTS:
            self._seen.popitem(last=False)

    async def _history(self, inbound: Inbound) -> tuple[tuple[ContextMessage, ...], int]:
        """The thread's newest messages before `inbound`, and how many older ones are left out.

        Slack lists a thread oldest first, 200 a page: every page is read (up to
        `_SCAN_PAGES`), so the newest `context_messages` are the ones kept, however long the
        thread. ((), 0) if it cannot be read in time.
        """
        channel, root = split_thread(inbound.thread)
        ts = str(inbound.reply_context.get("ts", ""))
        try:
            found = await asyncio.wait_for(
                self._thread_before(channel, root or ts, ts), timeout=_HISTORY_TIMEOUT_S
            )
        except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
            log.warning("slack thread history unavailable", extra={"error": type(exc).__name__})
            return (), 0
        earlier = []
        for message in found:
            if message.get("ts") == ts:
                continue
            if message.get("bot_id") or message.get("subtype") not in (None, "thread_broadcast"):
                continue
            text = clean_text(str(message.get("text") or ""), self._bot_user_id or "")
            if text:
                earlier.append(
                    ContextMessage(author=Author(id=str(message.get("user"))), text=text)
                )
        kept = earlier[-self.context_messages :] if self.context_messages > 0 else []
        return tuple(kept), len(earlier) - len(kept)

    async def _thread_before(self, channel: str, root: str, ts: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        cursor: str | None = None
        for _ in range(_SCAN_PAGES):
            answer = await self.client.conversations_replies(
                channel=channel,
                ts=root,
                latest=ts,
                inclusive=False,
                limit=200,
                cursor=cursor,
            )
            found += [m for m in answer.get("messages") or [] if isinstance(m, dict)]
            cursor = (answer.get("response_metadata") or {}).get("next_cursor") or None
            if not cursor:
                break
        return found

    # -- approvals -------------------------------------------------------------------------

    async def _on_approve(
        self, ack: Callable[..., Awaitable[Any]], body: dict[str, Any], action: dict[str, Any]
    ) -> None:
        click = _Click.of(body)
        if click is None:
            await ack()
            return
        target = await self._target(click, str(action.get("value", "")))
        if target is None or not await self._may_decide(click):
            await ack()
            return
        acceptance = await self._decide(click, target, approved=True, reason=None)
        await ack()
        if acceptance is not None:
            self._spawn(self._after_decision(click, acceptance, approved=True, reason=None))

    async def _on_deny(
        self,
        ack: Callable[..., Awaitable[Any]],
        body: dict[str, Any],
        action: dict[str, Any],
    ) -> None:
        click = _Click.of(body)
        await ack()
        if click is None:
            return
        value = str(action.get("value", ""))
        if await self._target(click, value) is None or not await self._may_decide(click):
            return
        metadata = json.dumps(
            {"v": value, "c": click.channel, "m": click.message_ts, "t": click.thread_ts},
            separators=(",", ":"),
            ensure_ascii=False,
        )
        try:
            await self.client.views_open(
                trigger_id=str(body.get("trigger_id", "")), view=deny_reason_modal(metadata)
            )
        except (SlackApiError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("slack deny dialog failed", extra={"error": type(exc).__name__})
            await self._tell(click, "Sorry, the Deny dialog could not open. Please try again.")

    async def _on_deny_reason(
        self, ack: Callable[..., Awaitable[Any]], body: dict[str, Any], view: dict[str, Any]
    ) -> None:
        try:
            metadata = json.loads(str(view.get("private_metadata", "")))
            value = str(metadata["v"])
            user = body["user"]
            click = _Click(
                user=str(user["id"]),
                user_name=user.get("name"),
                channel=str(metadata["c"]),
                message_ts=str(metadata["m"]),
                thread_ts=None if metadata.get("t") is None else str(metadata["t"]),
            )
        except (ValueError, KeyError, TypeError):
            await ack()
            log.warning("slack deny dialog malformed")
            return
        reason = _reason_of(view)
        target = await self._target(click, value)
        if target is None or not await self._may_decide(click):
            await ack()
            return
        acceptance = await self._decide(click, target, approved=False, reason=reason)
        await ack()
        if acceptance is not None:
            self._spawn(self._after_decision(click, acceptance, approved=False, reason=reason))

    async def _target(self, click: _Click, value: str) -> DecisionTarget | None:
        try:
            return decode_decision_value(value)
        except ValueError as exc:
            log.warning("slack decision malformed", extra={"reason": str(exc)[:200]})
            await self._tell(click, "Sorry, this button cannot be read. Nothing was recorded.")
            return None

    async def _may_decide(self, click: _Click) -> bool:
        """Whether the clicker is an approver here; if not, they are told so, privately."""
        allowed = self.approvers.get(click.channel, ()) + self.approvers.get("*", ())
        if click.user in allowed:
            return True
        for group in (who for who in allowed if who.startswith("S")):
            if click.user in await self._group_members(group):
                return True
        log.info("slack decision refused", extra={"user": click.user, "channel": click.channel})
        if allowed:
            people = ", ".join(
                f"<!subteam^{w}>" if w.startswith("S") else f"<@{w}>" for w in allowed
            )
            await self._tell(
                click, f"Only approvers can decide this ({people}). Nothing was recorded."
            )
        else:
            await self._tell(
                click,
                "Nobody may approve in this channel yet: an operator has to name the approvers "
                "(GATEWAY_SLACK_APPROVERS). Nothing was recorded.",
            )
        return False

    async def _group_members(self, group: str) -> frozenset[str]:
        now = self.clock.now_ms()
        cached = self._groups.get(group)
        if cached is not None and now - cached[0] < _GROUP_TTL_MS:
            return cached[1]
        try:
            answer = await self.client.usergroups_users_list(usergroup=group)
            members = frozenset(str(u) for u in answer.get("users") or [])
        except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
            log.warning(
                "slack user group unavailable", extra={"group": group, "error": type(exc).__name__}
            )
            return cached[1] if cached is not None else frozenset()
        self._groups[group] = (now, members)
        return members

    async def _decide(
        self, click: _Click, target: DecisionTarget, *, approved: bool, reason: str | None
    ) -> Acceptance | None:
        """Hold the decision durably (raises Unavailable: Slack then shows the click failed)."""
        decision = DecisionInbound(
            thread=slack_thread(click.channel, click.thread_ts),
            run_id=target.run_id,
            wait_id=target.wait_id,
            decisions=tuple(
                DecisionItem(
                    tool_call_id=call_id, args_digest=digest, approved=approved, reason=reason
                )
                for call_id, digest in target.calls
            ),
            decided_by=Author(id=click.user, name=click.user_name),
            idempotency_key=f"slack:{target.wait_id}",
            received_at_ms=self.clock.now_ms(),
            session=target.session,
        )
        try:
            return await self._sink_or_fail().decide(decision)
        except DecisionRefused as refused:
            log.info("slack decision refused", extra={"reason": refused.code})
            closed = refused.closed
            # told after the ack (Slack wants one within 3 s): nothing was recorded either way
            self._spawn(
                self._tell(click, refused.message if closed is None else _closed_tell(closed))
            )
            return None
        except NotRouted as exc:
            log.warning("slack decision not routed", extra={"reason": str(exc)})
            await self._tell(
                click, "Sorry, this thread is not served any more. Nothing was recorded."
            )
            return None

    async def _after_decision(
        self, click: _Click, acceptance: Acceptance, *, approved: bool, reason: str | None
    ) -> None:
        """Tell a second clicker who took the decision.

        The request's copies are rewritten by its close once the decision is applied: never
        here, where it is not applied yet (it may still lose to another one).
        """
        first = acceptance.first if acceptance.duplicate else None
        if first is not None and first.decided_by.id != click.user:
            verb = "approved" if all(item.approved for item in first.decisions) else "denied"
            await self._tell(
                click, f"<@{first.decided_by.id}> already {verb} this. Nothing was changed."
            )

    async def _message(self, channel: str, ts: str, thread_ts: str | None) -> dict[str, Any]:
        """One message of a channel (the approval request, to rewrite it without buttons)."""
        if thread_ts is not None:
            # Slack lists a thread's parent first whatever the window: room for it and ours
            answer = await self.client.conversations_replies(
                channel=channel, ts=thread_ts, latest=ts, oldest=ts, inclusive=True, limit=2
            )
        else:
            answer = await self.client.conversations_history(
                channel=channel, latest=ts, oldest=ts, inclusive=True, limit=1
            )
        for message in answer.get("messages") or []:
            if isinstance(message, dict) and message.get("ts") == ts:
                return message
        return {}

    async def _tell(self, click: _Click, text: str) -> None:
        """A private note to the clicker in the thread (best effort)."""
        try:
            await self.client.chat_postEphemeral(
                channel=click.channel,
                user=click.user,
                text=text,
                thread_ts=click.thread_ts,
            )
        except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
            log.warning("slack ephemeral failed", extra={"error": type(exc).__name__})

    # -- outbound -------------------------------------------------------------------------------

    def _parts(self, outbound: Outbound) -> list[tuple[str, list[dict[str, Any]] | None]]:
        """What a delivery posts: (text, blocks) per message, in order."""
        text = _defused(outbound.text)
        if outbound.kind == "approval_request" and outbound.approval is not None:
            intro = to_mrkdwn(text)
            return [(fallback_text(intro), approval_blocks(outbound.approval, intro=intro))]
        if outbound.kind == "failure_notice":
            return [(fallback_text(to_mrkdwn(text)), failure_blocks(text))]
        parts = split_text(to_mrkdwn(text), _PART_LIMIT) or ["(no text)"]
        return [(part, None) for part in parts]

    async def deliver(self, outbound: Outbound) -> DeliveryReceipt:
        """Post the delivery's parts into its thread (those not already there).

        Raises:
            DeliveryError: see the module docstring; once a part is posted, any later failure
                has an unknown outcome (the retry reconciles and posts only what is missing).
        """
        if outbound.kind == "approval_closed":
            return await self._close(outbound)
        channel, thread_ts = self._where(outbound.thread)
        parts = self._parts(outbound)
        there = self._partial.pop(outbound.delivery_id, set())
        if outbound.kind == "reply" and 0 not in there:
            note = await self._superseded_note(channel, thread_ts, outbound)
            if note:
                parts[0] = (f"{note}\n{parts[0][0]}", parts[0][1])
        posted: list[str] = []
        for number, (text, blocks) in enumerate(parts):
            if number in there:
                continue
            metadata = {
                "event_type": METADATA_TYPE,
                "event_payload": {
                    "delivery_id": outbound.delivery_id,
                    "part": number,
                    "parts": len(parts),
                },
            }
            posted.append(
                await self._post(
                    channel, thread_ts, text, blocks, metadata, after_post=bool(posted or there)
                )
            )
        if self.working_reaction and outbound.answers:  # a notice on arrival answers nothing
            self._spawn(self._answered(channel, outbound))
        return DeliveryReceipt(
            delivery_id=outbound.delivery_id,
            channel_message_ids=tuple(f"{channel}:{ts}" for ts in posted),
            delivered_at_ms=self.clock.now_ms(),
        )

    async def _superseded_note(
        self, channel: str, thread_ts: str | None, outbound: Outbound
    ) -> str | None:
        """A line saying which message a late reply answers, when the thread has moved on.

        A reply goes out late when the service was down or Slack refused it for a while. If
        people wrote in the thread after the message it answers, it is not posted as if it
        were the answer to the newest one: it opens with a link to its question. (The newer
        messages get their own answer: they are in the inbox.)
        """
        asked = str(outbound.reply_context.get("ts") or "")
        if _ts_seconds(asked) <= 0 or self.clock.now_ms() / 1000 - _ts_seconds(asked) < (
            self.late_after_s
        ):
            return None
        try:
            if thread_ts is not None:
                answer = await self.client.conversations_replies(
                    channel=channel, ts=thread_ts, oldest=asked, limit=50
                )
            else:
                answer = await self.client.conversations_history(
                    channel=channel, oldest=asked, limit=50
                )
            newer = [
                m
                for m in answer.get("messages") or []
                if isinstance(m, dict)
                and _ts_seconds(str(m.get("ts"))) > _ts_seconds(asked)
                and not m.get("bot_id")
            ]
            if not newer:
                return None
            link = await self.client.chat_getPermalink(channel=channel, message_ts=asked)
            return f"_Re: <{link['permalink']}|this earlier message>_"
        except (SlackApiError, aiohttp.ClientError, TimeoutError, KeyError, TypeError) as exc:
            log.info("slack late-reply check failed", extra={"error": type(exc).__name__})
            return None

    def _where(self, thread: ThreadRef) -> tuple[str, str | None]:
        try:
            return split_thread(thread)
        except ValueError:
            raise DeliveryError("not a Slack thread", permanent=True) from None

    async def _post(
        self,
        channel: str,
        thread_ts: str | None,
        text: str,
        blocks: list[dict[str, Any]] | None,
        metadata: dict[str, Any],
        *,
        after_post: bool,
    ) -> str:
        where: dict[str, Any] = {"thread_ts": thread_ts} if thread_ts else {}
        if blocks is not None:
            where["blocks"] = blocks
        try:
            answer = await self.client.chat_postMessage(
                channel=channel,
                text=text,
                metadata=metadata,
                unfurl_links=False,
                unfurl_media=False,
                **where,
            )
        except SlackApiError as exc:
            raise _delivery_error(exc, after_post=after_post) from None
        except aiohttp.ClientConnectorError as exc:
            reason = self._unreachable(exc, "chat.postMessage")
            raise DeliveryError(reason, unknown_outcome=after_post) from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            reason = self._unreachable(exc, "chat.postMessage")
            raise DeliveryError(reason, unknown_outcome=True) from None
        return str(answer.get("ts"))

    async def _close(self, outbound: Outbound) -> DeliveryReceipt:
        """Rewrite every copy of a closed request in its thread (the request, its reminders).

        Each copy keeps its words and loses its buttons, under a line saying how the request
        closed, by whom and when. Doing it again rewrites the same copies. A thread with no copy
        (the request was never posted: closed first, or refused by Slack) gets the close as a
        message of its own, once.

        Raises:
            DeliveryError: Slack could not be read or refused an update (retried).
        """
        closed = outbound.closed
        if closed is None:
            raise DeliveryError("a close without the request it closes", permanent=True)
        channel, thread_ts = self._where(outbound.thread)
        oldest = f"{max(closed.requested_at_ms / 1000 - _CLOSE_LOOKBACK_S, 0):.6f}"
        note = close_note(closed.outcome, by=closed.by, at_ms=closed.at_ms, reason=closed.reason)
        updated: list[str] = []
        try:
            copies, noted = await self._copies(channel, thread_ts, oldest, outbound, closed)
            for message in copies:
                text = _request_text(message)
                try:
                    await self.client.chat_update(
                        channel=channel,
                        ts=str(message["ts"]),
                        text=fallback_text(text),
                        blocks=closed_blocks(text, note),
                    )
                except SlackApiError as exc:
                    if exc.response.get("error") != "message_not_found":  # deleted: nothing left
                        raise
                updated.append(f"{channel}:{message['ts']}")
        except SlackApiError as exc:
            raise _delivery_error(exc, after_post=False) from None
        except (aiohttp.ClientError, TimeoutError):
            raise DeliveryError("no answer from Slack") from None
        if not copies and not noted:
            metadata = {
                "event_type": METADATA_TYPE,
                "event_payload": {"delivery_id": outbound.delivery_id, "part": 0, "parts": 1},
            }
            # said as Slack says it on a copy (a decider's id as a mention), in a message of its own
            ts = await self._post(channel, thread_ts, note, None, metadata, after_post=False)
            updated.append(f"{channel}:{ts}")
        return DeliveryReceipt(
            delivery_id=outbound.delivery_id,
            channel_message_ids=tuple(updated),
            delivered_at_ms=self.clock.now_ms(),
        )

    async def _copies(
        self,
        channel: str,
        thread_ts: str | None,
        oldest: str,
        outbound: Outbound,
        closed: ApprovalClosed,
    ) -> tuple[list[dict[str, Any]], bool]:
        """The thread's copies of the closed request, and whether the close was posted already."""
        copies: list[dict[str, Any]] = []
        noted = False
        cursor: str | None = None
        for _ in range(_SCAN_PAGES):
            page: dict[str, Any] = {"cursor": cursor} if cursor else {}
            if thread_ts is not None:
                answer = await self.client.conversations_replies(
                    channel=channel,
                    ts=thread_ts,
                    oldest=oldest,
                    include_all_metadata=True,
                    limit=200,
                    **page,
                )
            else:
                answer = await self.client.conversations_history(
                    channel=channel, oldest=oldest, include_all_metadata=True, limit=200, **page
                )
            for message in answer.get("messages") or []:
                delivery = _delivery_of(message)
                if delivery is None or not message.get("ts"):
                    continue
                if is_copy_of(delivery, closed.request_delivery_id):
                    copies.append(message)
                noted = noted or delivery == outbound.delivery_id
            cursor = (answer.get("response_metadata") or {}).get("next_cursor") or None
            if not cursor:
                break
        return copies, noted

    async def reconcile(self, outbound: Outbound) -> Reconciled:
        """Look in the thread, from the newest user message on, for the delivery's parts."""
        if outbound.kind == "approval_closed":
            return "absent"  # closing again rewrites the same copies (and posts no second note)
        channel, thread_ts = self._where(outbound.thread)
        wanted = len(self._parts(outbound))
        oldest = str(outbound.reply_context.get("ts") or "0")
        try:
            found = await self._posted_parts(channel, thread_ts, oldest, outbound.delivery_id)
        except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
            log.info("slack reconcile failed", extra={"error": type(exc).__name__})
            return "unknown"
        if found >= set(range(wanted)):
            return "delivered"
        if found:
            self._partial[outbound.delivery_id] = found
        return "absent"

    async def _posted_parts(
        self, channel: str, thread_ts: str | None, oldest: str, delivery_id: str
    ) -> set[int]:
        found: set[int] = set()
        cursor: str | None = None
        for _ in range(_SCAN_PAGES):
            page: dict[str, Any] = {"cursor": cursor} if cursor else {}
            if thread_ts is not None:
                answer = await self.client.conversations_replies(
                    channel=channel,
                    ts=thread_ts,
                    oldest=oldest,
                    include_all_metadata=True,
                    limit=200,
                    **page,
                )
            else:
                answer = await self.client.conversations_history(
                    channel=channel, oldest=oldest, include_all_metadata=True, limit=200, **page
                )
            for message in answer.get("messages") or []:
                number = _part_of(message, delivery_id)
                if number is not None:
                    found.add(number)
            cursor = (answer.get("response_metadata") or {}).get("next_cursor") or None
            if not cursor:
                break
        return found

    # -- the working reaction -----------------------------------------------------------------

    async def _with_working(
        self, sink: InboundSink, inbound: Inbound, known: KnownThread | None
    ) -> Inbound:
        """`inbound` naming every message of its thread that still wears the working reaction.

        A message steered into a busy run wears it too, and the reply answers them all: the
        list travels in the reply context (the newest one reaches the delivery) and is pruned
        by the thread's answered mark, which deliveries advance.
        """
        ts = str(inbound.reply_context.get("ts") or "")
        if not ts:
            return inbound
        try:
            answered = await sink.get_mark(_answered_mark(inbound.thread.lane))
        except Unavailable:
            answered = None  # the accept below says so; the list is cosmetic
        earlier = known.reply_context.get("working") if known is not None else None
        kept = [
            t
            for t in (earlier if isinstance(earlier, (list, tuple)) else ())
            if isinstance(t, str) and t != ts and _ts_key(t) > _ts_key(answered or "0")
        ]
        working = [*kept[-(_WORKING_MAX - 1) :], ts]
        context = {**inbound.reply_context, "working": working}
        return Inbound.model_validate({**inbound.model_dump(), "reply_context": context})

    async def _answered(self, channel: str, outbound: Outbound) -> None:
        """Take the working reaction off the messages a delivery answers, and remember them."""
        listed = outbound.reply_context.get("working")
        newest = outbound.reply_context.get("ts")
        working = (
            {str(t) for t in listed if isinstance(t, str)}
            if isinstance(listed, (list, tuple))
            else set()
        )
        if isinstance(newest, str) and newest:
            working.add(newest)
        if not working:
            return
        # The mark first: a person who sees the reaction go and writes at once must find these
        # messages answered (else the next reply would list them again).
        await self._mark_answered(outbound.thread.lane, max(working, key=_ts_key))
        for ts in sorted(working, key=_ts_key):
            await self._react(channel, ts, add=False)

    async def _mark_answered(self, lane: str, through: str) -> None:
        mark = _answered_mark(lane)
        if self._sink is None:
            return
        with contextlib.suppress(Unavailable):
            for _ in range(3):  # a compare-and-set: another process may answer the thread too
                current = await self._sink.get_mark(mark)
                if current is not None and _ts_key(current) >= _ts_key(through):
                    return
                if await self._sink.put_mark(mark, through, expect=current):
                    return

    # -- small helpers ---------------------------------------------------------------------

    async def _react(self, channel: str, ts: str, *, add: bool) -> None:
        call = self.client.reactions_add if add else self.client.reactions_remove
        try:
            await call(channel=channel, timestamp=ts, name=self.working_reaction)
        except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
            # already_reacted / no_reaction are normal (a retry, a steered message)
            log.debug("slack reaction skipped", extra={"error": type(exc).__name__})

    def _spawn(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _sink_or_fail(self) -> InboundSink:
        if self._sink is None:
            raise Unavailable("the Slack channel is not started")
        return self._sink


def _answered_mark(lane: str) -> str:
    """The broker mark holding the newest message of a thread a delivery answered."""
    return f"slack:answered:{lane}"


def _ts_key(ts: str) -> tuple[int, int]:
    """A Slack ts (``1700000000.000100``) as a sortable pair; anything else sorts first."""
    seconds, _, fraction = ts.partition(".")
    try:
        return int(seconds), int(fraction.ljust(6, "0")[:6] or "0")
    except ValueError:
        return (-1, 0)


class _Click:
    """Who clicked which approval message, where."""

    def __init__(
        self,
        *,
        user: str,
        user_name: str | None,
        channel: str,
        message_ts: str,
        thread_ts: str | None,
    ) -> None:
        self.user = user
        self.user_name = user_name
        self.channel = channel
        self.message_ts = message_ts
        self.thread_ts = thread_ts

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> _Click | None:
        """The click of a ``block_actions`` payload (None when a part is missing)."""
        try:
            user = body["user"]
            message = body.get("message") or {}
            container = body.get("container") or {}
            channel = (body.get("channel") or {}).get("id") or container.get("channel_id")
            ts = message.get("ts") or container.get("message_ts")
            if not channel or not ts:
                return None
            thread_ts = message.get("thread_ts") or container.get("thread_ts")
            return cls(
                user=str(user["id"]),
                user_name=user.get("name") or user.get("username"),
                channel=str(channel),
                message_ts=str(ts),
                thread_ts=None if thread_ts is None else str(thread_ts),
            )
        except (KeyError, TypeError, AttributeError):
            return None


def _ts_seconds(ts: str) -> float:
    """A Slack ``ts`` as seconds since the epoch (0 for anything that is not one)."""
    try:
        return float(ts) if re.fullmatch(r"\d{1,12}\.\d{1,9}", ts) else 0.0
    except ValueError:
        return 0.0


def _defused(text: str) -> str:
    """`text` without pings of a room or a user group (a model must not page people)."""
    return _PING.sub(lambda found: "@" + found.group(1).replace("subteam^", ""), text)


def _request_text(message: Mapping[str, Any]) -> str:
    """The approval request's words (its section blocks), without its buttons."""
    texts = []
    for block in message.get("blocks") or []:
        if isinstance(block, dict) and block.get("type") == "section":
            text = block.get("text")
            if isinstance(text, dict) and isinstance(text.get("text"), str):
                texts.append(text["text"])
    return "\n\n".join(texts) or str(message.get("text") or "Approval request")


def _reason_of(view: Mapping[str, Any]) -> str | None:
    try:
        value = view["state"]["values"]["reason"]["reason"].get("value")
    except (KeyError, TypeError, AttributeError):
        return None
    return value.strip()[:500] or None if isinstance(value, str) else None


def _payload_of(message: Any) -> dict[str, Any] | None:
    """The gateway's metadata payload of a message the bot posted (None for any other)."""
    if not isinstance(message, dict):
        return None
    metadata = message.get("metadata")
    if not isinstance(metadata, dict) or metadata.get("event_type") != METADATA_TYPE:
        return None
    payload = metadata.get("event_payload")
    return payload if isinstance(payload, dict) else None


def _delivery_of(message: Any) -> str | None:
    payload = _payload_of(message)
    delivery = payload.get("delivery_id") if payload is not None else None
    return delivery if isinstance(delivery, str) else None


def _part_of(message: Any, delivery_id: str) -> int | None:
    payload = _payload_of(message)
    if payload is None or payload.get("delivery_id") != delivery_id:
        return None
    part = payload.get("part")
    return part if isinstance(part, int) else None


def _closed_tell(closed: ApprovalClosed) -> str:
    """What a clicker is told, privately, about a request that closed before their click."""
    who = mention(closed.by) if closed.by else "someone"
    if closed.outcome in ("approved", "denied"):
        return f"{who} already {closed.outcome} this. Nothing was changed."
    if closed.outcome == "decided":
        return f"{who} already decided this. Nothing was changed."
    if closed.outcome == "stopped":
        return f"This request was stopped{' by ' + who if closed.by else ''}. Nothing was changed."
    return "This request is no longer waiting: its run ended. Nothing was changed."


def _delivery_error(exc: SlackApiError, *, after_post: bool) -> DeliveryError:
    response = exc.response
    status = getattr(response, "status_code", 200)
    error = str(response.get("error") or f"HTTP {status}")
    if status == 429:
        retry = response.headers.get("Retry-After") or response.headers.get("retry-after")
        try:
            seconds = float(retry) if retry is not None else 1.0
        except ValueError:
            seconds = 1.0
        return DeliveryError(
            "rate limited by Slack", retry_after_s=seconds, unknown_outcome=after_post
        )
    if error in _PERMANENT:
        return DeliveryError(f"Slack: {error}", permanent=True)
    # A server error may come after Slack acted; a refusal (ok: false) did not post anything.
    return DeliveryError(f"Slack: {error}", unknown_outcome=after_post or status >= 500)


def _ssl_check(body: bytes, content_type: str) -> bool:
    """Whether this is Slack's certificate check (``ssl_check=1``, form-encoded).

    Slack sends it without a signature (recorded in slackapi/bolt-js#1397), and bolt answers it
    before verifying one: it gets an empty 200 and nothing else, whatever else the form holds.
    Exactly one ``ssl_check`` of exactly ``1`` (slackapi/bolt-js#2899).
    """
    if content_type.split(";", 1)[0].strip().lower() != "application/x-www-form-urlencoded":
        return False
    try:
        form = parse_qs(body.decode("utf-8"), keep_blank_values=True)
    except (UnicodeDecodeError, ValueError):
        return False
    return form.get("ssl_check") == ["1"]


def _parse(body: bytes, content_type: str) -> dict[str, Any] | None:
    """The request's JSON (events) or its ``payload`` form field (interactivity); None if bad."""
    try:
        text = body.decode("utf-8")
        if content_type.startswith("application/json"):
            parsed = json.loads(text)
        elif content_type.startswith("application/x-www-form-urlencoded"):
            form = parse_qs(text, strict_parsing=False)
            if "payload" in form:
                parsed = json.loads(form["payload"][0])
            elif "command" in form or "ssl_check" in form:
                parsed = {key: values[0] for key, values in form.items()}
            else:
                return None
        else:
            return None
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("type", ""), str):
        return None
    if parsed.get("type") == "event_callback" and not isinstance(parsed.get("event"), dict):
        return None
    return parsed


def _refusal(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)
