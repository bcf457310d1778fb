"""What the Slack channel reads of threads: earlier messages, and what came while nobody listened.

A mention late in a thread brings the thread's newest messages before it; a backfill takes in
what was posted in the bot's recent threads while no process listened.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
from slack_sdk.errors import SlackApiError

from adapters.channel import (
    Author,
    ContextMessage,
    Inbound,
    InboundSink,
    NotRouted,
    ThreadRef,
    Unavailable,
)
from adapters.slack.events import CHANNEL, classify, clean_text, split_thread
from adapters.slack.link import SCAN_PAGES, SlackLink, retry_after_s, ts_seconds

log = logging.getLogger("adapters.slack")

_T = TypeVar("_T")

_RATE_LIMIT_TRIES = 6
"""How many times a backfill call is made while Slack rate-limits it."""
_MAX_RETRY_AFTER_S = 60.0
"""The longest a backfill waits at once for Slack's rate limit."""
_SKIPS_SAID = 10
"""How many skipped threads the backfill's warning names (it counts them all)."""

_HISTORY_TIMEOUT_S = 1.5
"""How long a late mention waits for its thread's earlier messages before it goes in without."""


class SlackHistory:
    """Reads threads for the channel (see the module docstring)."""

    def __init__(self, link: SlackLink, *, context_messages: int, backfill_hours: float) -> None:
        self.link = link
        self.context_messages = context_messages
        self.backfill_hours = backfill_hours
        self.backfilled = 0
        """Messages taken in by backfills (for tests and logs)."""
        self.backfilling: asyncio.Task[None] | None = None

    def start_backfill(self) -> None:
        """Backfill in the background, unless one is running (at start, and on each reconnect)."""
        if self.backfill_hours > 0 and (self.backfilling is None or self.backfilling.done()):
            self.backfilling = self.link.spawn(self._backfill())

    async def _backfill(self) -> None:
        """Take in what was posted in the bot's recent threads while no process listened.

        For every conversation the bot is in, the threads a lane holds whose newest accepted
        message is younger than `backfill_hours` are read from that message on; each later
        message is handed to the sink like a live event (the inbox deduplicates, so several
        processes backfilling at once, or an event arriving meanwhile, take it once). They are
        taken in the order they were posted: under the default busy policy (steer) they join
        one run, which answers the thread as it now stands.
        """
        sink = self.link.sink
        if sink is None:
            return
        horizon = self.link.clock.now_ms() / 1000 - self.backfill_hours * 3600
        taken = 0
        skipped: list[str] = []  # one thread Slack refuses must not cost every thread after it
        try:
            for channel in await self._rate_limited(self._conversations):
                try:
                    threads = await sink.threads(CHANNEL, channel)
                except NotRouted:
                    continue
                for known in threads:
                    last = str(known.reply_context.get("ts") or "")
                    if ts_seconds(last) < horizon:
                        continue
                    try:
                        taken += await self._rate_limited(
                            functools.partial(self._backfill_thread, sink, known.thread, last)
                        )
                    except SlackApiError as exc:  # that thread's: deleted, left, archived
                        skipped.append(f"{known.thread.lane}: {self.link.api_said(exc)}")
        except (SlackApiError, aiohttp.ClientError, TimeoutError, Unavailable) as exc:
            log.warning("slack backfill stopped", extra={"reason": self._why(exc, "backfill")})
        self.backfilled += taken
        if skipped:
            log.warning(
                "slack backfill skipped threads",
                extra={"count": len(skipped), "threads": skipped[:_SKIPS_SAID]},
            )
        log.info("slack backfill done", extra={"taken": taken, "skipped": len(skipped)})

    def _why(self, exc: BaseException, method: str) -> str:
        """A failure in words: what Slack answered, why it was not reached, or what refused."""
        if isinstance(exc, SlackApiError):
            return self.link.api_said(exc)
        if isinstance(exc, (aiohttp.ClientError, TimeoutError)):
            return self.link.unreachable(exc, method)
        return " ".join(str(exc).split())[:300] or type(exc).__name__

    async def _rate_limited(self, call: Callable[[], Awaitable[_T]]) -> _T:
        """`call`, waited for and made again while Slack rate-limits it (its ``Retry-After``).

        ``conversations.replies`` allows about 50 calls a minute: a gateway restarted with more
        recent threads than that met a 429, which stopped the whole backfill (an outside probe).
        """
        for _ in range(_RATE_LIMIT_TRIES - 1):
            try:
                return await call()
            except SlackApiError as exc:
                wait = retry_after_s(exc)
                if wait is None:
                    raise
                sane = wait if math.isfinite(wait) and wait >= 0 else 1.0
                await self.link.clock.sleep(min(sane, _MAX_RETRY_AFTER_S))
        return await call()  # the last try: its failure is the caller's

    async def _conversations(self) -> list[str]:
        channels, _ = await _pages(
            lambda cursor: self.link.client.users_conversations(
                types="public_channel,private_channel,im,mpim",
                exclude_archived=True,
                limit=200,
                cursor=cursor,
            ),
            "channels",
        )
        return [str(c["id"]) for c in channels if c.get("id")]

    async def catch_up(self, thread: ThreadRef, since: str) -> None:
        """Take in what was posted in `thread` after `since` before the thread was a lane.

        A message in a thread the bot is not in yet is acknowledged and not taken; one that
        came while the mention calling the bot in was still on its way (a retried delivery, a
        read of the thread's history) would be lost. Read once the thread is a lane, so a
        message posted after the read comes as a live event and is taken.
        """
        sink = self.link.sink
        if sink is None:
            return
        try:
            taken = await self._backfill_thread(sink, thread, since)
        except (SlackApiError, aiohttp.ClientError, TimeoutError, Unavailable, NotRouted) as exc:
            log.warning(
                "slack thread catch-up failed",
                extra={"lane": thread.lane, "reason": self._why(exc, "conversations.replies")},
            )
            return
        if taken:
            self.backfilled += taken
            log.info("slack thread caught up", extra={"lane": thread.lane, "taken": taken})

    async def _since(self, channel: str, root: str | None, last: str) -> list[dict[str, Any]]:
        """The messages of a thread (or a DM's top level) after `last`, every page of them."""
        client = self.link.client
        messages, complete = await _pages(
            lambda cursor: (
                client.conversations_replies(
                    channel=channel, ts=root, oldest=last, limit=200, cursor=cursor
                )
                if root is not None
                else client.conversations_history(
                    channel=channel, oldest=last, limit=200, cursor=cursor
                )
            ),
            "messages",
        )
        if not complete:
            log.warning(
                "slack backfill read its page limit",
                extra={"channel": channel, "pages": SCAN_PAGES},
            )
        return messages

    async def _backfill_thread(self, sink: InboundSink, thread: ThreadRef, last: str) -> int:
        channel, root = split_thread(thread)
        messages = await self._since(channel, root, last)
        taken = 0
        for message in sorted(messages, key=lambda m: ts_seconds(str(m.get("ts")))):
            if ts_seconds(str(message.get("ts"))) <= ts_seconds(last):
                continue
            event = {**message, "channel": channel}
            if channel.startswith("D"):
                event["channel_type"] = "im"
            classified = classify(
                "message",
                event,
                bot_user_id=self.link.bot_user_id or "",
                bot_id=self.link.bot_id,
                now_ms=self.link.clock.now_ms(),
            )
            if classified.take == "ignore" or classified.inbound is None:
                continue
            if classified.inbound.thread != thread:
                continue  # a DM's threaded reply seen from its top level: its own lane
            acceptance = await sink.accept(classified.inbound)
            taken += not acceptance.duplicate
        return taken

    async def before(self, inbound: Inbound) -> tuple[tuple[ContextMessage, ...], int]:
        """The thread's newest messages before `inbound`, and how many older ones are left out.

        Slack lists a thread oldest first, 200 a page: every page is read (up to
        `SCAN_PAGES`), so the newest `context_messages` are the ones kept, however long the
        thread. ((), 0) if it cannot be read in time.
        """
        channel, root = split_thread(inbound.thread)
        ts = str(inbound.reply_context.get("ts", ""))
        try:
            found = await asyncio.wait_for(
                self._thread_before(channel, root or ts, ts), timeout=_HISTORY_TIMEOUT_S
            )
        except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
            reason = self._why(exc, "conversations.replies")
            log.warning("slack thread history unavailable", extra={"reason": reason})
            return (), 0
        earlier = []
        for message in found:
            if message.get("ts") == ts:
                continue
            if message.get("bot_id") or message.get("subtype") not in (None, "thread_broadcast"):
                continue
            text = clean_text(str(message.get("text") or ""), self.link.bot_user_id or "")
            if text:
                earlier.append(
                    ContextMessage(author=Author(id=str(message.get("user"))), text=text)
                )
        kept = earlier[-self.context_messages :] if self.context_messages > 0 else []
        return tuple(kept), len(earlier) - len(kept)

    async def _thread_before(self, channel: str, root: str, ts: str) -> list[dict[str, Any]]:
        found, _ = await _pages(
            lambda cursor: self.link.client.conversations_replies(
                channel=channel, ts=root, latest=ts, inclusive=False, limit=200, cursor=cursor
            ),
            "messages",
        )
        return found


async def _pages(
    read: Callable[[str | None], Awaitable[Any]], key: str
) -> tuple[list[dict[str, Any]], bool]:
    """The items under `key` of the pages `read(cursor)` answers; whether that was all.

    At most `SCAN_PAGES` pages are read (200 items each, as every caller asks).
    """
    found: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(SCAN_PAGES):
        answer = await read(cursor)
        found += [item for item in answer.get(key) or [] if isinstance(item, dict)]
        cursor = (answer.get("response_metadata") or {}).get("next_cursor") or None
        if not cursor:
            return found, True
    return found, False
