"""What the Slack channel posts, finds again and marks.

Replies in parts, approval requests, failure notices and the closes that rewrite a request's
copies; reconcile by the delivery id in each message's metadata; the working reaction on the
messages a run is answering.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError

from adapters.channel import (
    ApprovalClosed,
    DeliveryError,
    DeliveryReceipt,
    Inbound,
    InboundSink,
    KnownThread,
    Outbound,
    Reconciled,
    ThreadRef,
    Unavailable,
    is_copy_of,
)
from adapters.reply_files import read_reply_files
from adapters.slack.events import split_thread
from adapters.slack.link import (
    METADATA_TYPE,
    REFUSED_TOKEN,
    SCAN_PAGES,
    SlackLink,
    defused,
    retry_after_s,
    ts_key,
    ts_seconds,
)
from adapters.slack.live import SlackLive
from adapters.slack.render import (
    approval_blocks,
    close_note,
    closed_blocks,
    failure_blocks,
    fallback_text,
    split_text,
    to_mrkdwn,
)
from adapters.slack.uploads import SlackUploads
from adapters.unsure import Unsure

log = logging.getLogger("adapters.slack")

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
_NOT_REWRITTEN = frozenset({"cant_update_message", "edit_window_closed", "msg_too_long"})
"""`chat.update` errors that leave a finished stream as it was: the reply is posted instead."""
_MAY_HAVE_ACTED = frozenset(
    {"internal_error", "fatal_error", "service_unavailable", "request_timeout"}
)
"""Slack errors sent with HTTP 200 after which the post may have landed (Slack's own words for
the first two: "it's possible some aspect of the operation succeeded"): reconciled, not posted
again blindly."""
_CLOSE_LOOKBACK_S = 600
"""A close looks for the request's copies from this long before the request was made (clocks
differ: ours stamps the request, Slack stamps the message)."""
_WORKING_MAX = 200
"""The newest messages of a thread that may wear the working reaction (a reply clears them):
a bound for a thread that is never answered, far past a burst a run takes in."""
FAILED_REACTION = "warning"
"""What the newest message a reply answers wears instead of the working reaction once Slack
refused the reply for good (a dead letter: `gateway ops deliveries` shows why)."""
_ADD_WAIT_S = 5.0
"""How long taking the reaction off waits for its putting on, still on its way, to land."""


_SETTLE_S = 20.0
"""How long after the first look that does not find a reply it is "absent" (`Unsure`)."""


class SlackDelivery:
    """Posts, rewrites and finds the gateway's messages in Slack threads."""

    def __init__(
        self,
        link: SlackLink,
        *,
        working_reaction: str,
        late_after_s: float,
        live: SlackLive | None = None,
    ) -> None:
        self.link = link
        self.working_reaction = working_reaction
        self.late_after_s = late_after_s
        self.live = live
        """The live view whose stream a reply finishes (None: every reply is posted)."""
        self._partial: dict[str, dict[int, str]] = {}
        """The parts a reconcile found of a delivery, by number: their ts (a retry posts only
        the others)."""
        self._partial_files: dict[str, set[int]] = {}
        """The files a reconcile found in the thread of a delivery, by place (a retry uploads
        only the others)."""
        self._adding: dict[tuple[str, str], asyncio.Task[None]] = {}
        """Reactions on their way onto messages (channel, ts): taking one off waits for them."""
        self.uploads = SlackUploads(link)
        """A reply's files into its thread (files upload v2), found again by their ids."""
        self.unsure = Unsure(link.clock, settle_s=_SETTLE_S, first_look_begins=False)
        """A post that timed out may still land: Slack applied one 15 s after it came, after
        the client gave up, and the reconcile 2 s after the timeout posted it again (an
        outside probe). Not found, it is "unknown" for a while (D408). Only a timeout seen
        here begins that wait: an answered 500 or a dropped answer is Slack done with it."""

    async def deliver(self, outbound: Outbound) -> DeliveryReceipt:
        """Post the delivery's parts into its thread (those not already there).

        A reply the gateway gives up (a dead letter) is told by `given_up`.

        Raises:
            DeliveryError: see the module docstring; once a part is posted, any later failure
                has an unknown outcome (the retry reconciles and posts only what is missing).
        """
        if outbound.kind == "approval_closed":
            return await self._close(outbound)
        channel, thread_ts = self._where(outbound.thread)
        files = await read_reply_files(self.link.sink, outbound)
        parts = self._parts(outbound)
        there = self._partial.pop(outbound.delivery_id, {})
        shared = self._partial_files.pop(outbound.delivery_id, set())
        if outbound.kind == "reply" and 0 not in there:
            note = await self._superseded_note(channel, thread_ts, outbound)
            if note:
                parts[0] = (f"{note}\n{parts[0][0]}", parts[0][1])
        stream = await self._stream_of(outbound, there)
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
            after = bool(posted or there)
            if number == 0 and stream is not None:
                finished = await self._finish(channel, stream, text, blocks, metadata)
                if finished is not None:
                    posted.append(finished)
                    continue
            posted.append(
                await self._post(channel, thread_ts, text, blocks, metadata, after_post=after)
            )
        for index, file in enumerate(files):  # after the text: never files without an answer
            if index not in shared:
                file_id = await self.uploads.upload(
                    channel, thread_ts, outbound.delivery_id, index, file
                )
                posted.append(f"file:{file_id}")
        if self.live is not None and stream is not None:
            await self.live.finished(outbound)
        if self.working_reaction and outbound.answers:  # a notice on arrival answers nothing
            self.link.spawn(self._answered(channel, outbound))
        return DeliveryReceipt(
            delivery_id=outbound.delivery_id,
            channel_message_ids=tuple(f"{channel}:{ts}" for ts in posted),
            delivered_at_ms=self.link.clock.now_ms(),
        )

    def given_up(self, outbound: Outbound) -> None:
        """A dead letter: its messages lose the working reaction, the newest wears a warning.

        Refused for good or out of attempts; in the background. Only `deliver` swapped it once,
        for a refusal it saw was for good: a reply out of attempts kept "working on it".
        """
        if not (self.working_reaction and outbound.answers):
            return
        with contextlib.suppress(DeliveryError):  # not a Slack thread: nothing wears it
            channel, _ = self._where(outbound.thread)
            self.link.spawn(self._answered(channel, outbound, failed=True))

    async def reconcile(self, outbound: Outbound) -> Reconciled:
        """Look in the thread, from the newest user message on, for the delivery's parts.

        Found, it is the answer: the messages it answers lose the working reaction (a reply
        whose post lost its answer was settled by this, and kept "working on it").
        """
        if outbound.kind == "approval_closed":
            return "absent"  # closing again rewrites the same copies (and posts no second note)
        channel, thread_ts = self._where(outbound.thread)
        wanted = len(self._parts(outbound))
        oldest = str(outbound.reply_context.get("ts") or "0")
        files = sum(1 for file in outbound.files if file.blob is not None)
        try:
            found, shared = await self._posted(channel, thread_ts, oldest, outbound.delivery_id)
            ids = await self.uploads.recorded(outbound.delivery_id) if files else {}
        except (SlackApiError, aiohttp.ClientError, TimeoutError, Unavailable) as exc:
            log.info("slack reconcile failed", extra={"error": type(exc).__name__})
            return "unknown"
        uploaded = {index for index, file_id in ids.items() if file_id in shared}
        if set(found) >= set(range(wanted)) and uploaded >= set(range(files)):
            self.unsure.found(outbound.delivery_id)
            if self.working_reaction and outbound.answers:
                self.link.spawn(self._answered(channel, outbound))
            return "delivered"
        if found:
            self._partial[outbound.delivery_id] = found
        if uploaded:
            self._partial_files[outbound.delivery_id] = uploaded
        return "absent" if self.unsure.absent(outbound.delivery_id) else "unknown"

    def _parts(self, outbound: Outbound) -> list[tuple[str, list[dict[str, Any]] | None]]:
        """What a delivery posts: (text, blocks) per message, in order."""
        text = defused(outbound.text)
        if outbound.kind == "approval_request" and outbound.approval is not None:
            intro = to_mrkdwn(text)
            return [(fallback_text(intro), approval_blocks(outbound.approval, intro=intro))]
        if outbound.kind == "failure_notice":
            return [(fallback_text(to_mrkdwn(text)), failure_blocks(text))]
        parts = split_text(to_mrkdwn(text), _PART_LIMIT) or ["(no text)"]
        return [(part, None) for part in parts]

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
        if ts_seconds(asked) <= 0 or self.link.clock.now_ms() / 1000 - ts_seconds(asked) < (
            self.late_after_s
        ):
            return None
        try:
            if thread_ts is not None:
                answer = await self.link.client.conversations_replies(
                    channel=channel, ts=thread_ts, oldest=asked, limit=50
                )
            else:
                answer = await self.link.client.conversations_history(
                    channel=channel, oldest=asked, limit=50
                )
            newer = [
                m
                for m in answer.get("messages") or []
                if isinstance(m, dict)
                and ts_seconds(str(m.get("ts"))) > ts_seconds(asked)
                and not m.get("bot_id")
            ]
            if not newer:
                return None
            link = await self.link.client.chat_getPermalink(channel=channel, message_ts=asked)
            return f"_Re: <{link['permalink']}|this earlier message>_"
        except (SlackApiError, aiohttp.ClientError, TimeoutError, KeyError, TypeError) as exc:
            log.info("slack late-reply check failed", extra={"error": type(exc).__name__})
            return None

    def _where(self, thread: ThreadRef) -> tuple[str, str | None]:
        try:
            return split_thread(thread)
        except ValueError:
            raise DeliveryError("not a Slack thread", permanent=True) from None

    async def _stream_of(self, outbound: Outbound, there: Mapping[int, str]) -> str | None:
        """The ts of the run's stopped stream the reply finishes, if the run streamed."""
        if self.live is None or not outbound.answers:
            return None
        try:
            return await self.live.take(outbound, there)
        except Unavailable as exc:
            raise DeliveryError(f"the reply's stream cannot be found now: {exc}") from None

    async def _finish(
        self,
        channel: str,
        ts: str,
        text: str,
        blocks: list[dict[str, Any]] | None,
        metadata: dict[str, Any],
    ) -> str | None:
        """Rewrite the run's stream message as the reply's first part; None: post it instead.

        The blocks say the text too: a streamed message's own blocks would otherwise stay. A
        stream Slack will not let be rewritten (`_NOT_REWRITTEN`) is deleted, and the reply is
        posted: a dead letter there left the person the streamed words without the reply's
        files, parts or notes, and the thread marked failed (an outside probe). If the delete
        fails too, the stream stays beside the reply.
        """
        shown = blocks if blocks is not None else [_section(text)]
        try:
            await self.link.client.chat_update(
                channel=channel, ts=ts, text=text, blocks=shown, metadata=metadata
            )
        except SlackApiError as exc:
            error = exc.response.get("error")
            if error == "message_not_found":
                return None  # deleted meanwhile (by a person, a sweep): posted instead
            if error in _NOT_REWRITTEN:
                log.info("slack stream not rewritten", extra={"error": error})
                with contextlib.suppress(SlackApiError, aiohttp.ClientError, TimeoutError):
                    await self.link.client.chat_delete(channel=channel, ts=ts)
                return None
            raise _delivery_error(exc, after_post=False) from None
        except aiohttp.ClientConnectorError as exc:
            raise DeliveryError(self.link.unreachable(exc, "chat.update")) from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            reason = self.link.unreachable(exc, "chat.update")
            raise DeliveryError(reason, unknown_outcome=True) from None
        return ts

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
        delivery_id = str(metadata["event_payload"]["delivery_id"])
        try:
            answer = await self.link.client.chat_postMessage(
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
            reason = self.link.unreachable(exc, "chat.postMessage")
            raise DeliveryError(reason, unknown_outcome=after_post) from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            if isinstance(exc, TimeoutError):  # Slack may yet apply it: the retry waits to see
                self.unsure.lost(delivery_id)  # (a dropped answer is Slack done with it)
            reason = self.link.unreachable(exc, "chat.postMessage")
            raise DeliveryError(reason, unknown_outcome=True) from None
        except asyncio.CancelledError:  # the deliverer's own timeout, or a stop: likewise
            self.unsure.lost(delivery_id)
            raise
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
        note = close_note(
            closed.outcome,
            by=closed.by,
            at_ms=closed.at_ms,
            reason=closed.reason,
            result=closed.result,
            failed=closed.result_is_error,
        )
        updated: list[str] = []
        try:
            copies, noted = await self._copies(channel, thread_ts, oldest, outbound, closed)
            for message in copies:
                text = _request_text(message)
                try:
                    await self.link.client.chat_update(
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
            delivered_at_ms=self.link.clock.now_ms(),
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
        async for message in self._messages_since(channel, thread_ts, oldest):
            delivery = _delivery_of(message)
            if delivery is None or not message.get("ts"):
                continue
            if is_copy_of(delivery, closed.request_delivery_id):
                copies.append(message)
            noted = noted or delivery == outbound.delivery_id
        return copies, noted

    async def _posted(
        self, channel: str, thread_ts: str | None, oldest: str, delivery_id: str
    ) -> tuple[dict[int, str], set[str]]:
        """The delivery's parts in the thread (number to ts), and the file ids shared there."""
        found: dict[int, str] = {}
        shared: set[str] = set()
        async for message in self._messages_since(channel, thread_ts, oldest):
            number = _part_of(message, delivery_id)
            if number is not None:
                found[number] = str(message.get("ts"))
            for file in message.get("files") or ():
                if isinstance(file, Mapping) and isinstance(file.get("id"), str):
                    shared.add(file["id"])
        return found, shared

    async def _messages_since(
        self, channel: str, thread_ts: str | None, oldest: str
    ) -> AsyncIterator[Any]:
        """The thread's messages from `oldest` on, metadata included, page by page.

        Without a thread, the channel's; at most `SCAN_PAGES` pages.
        """
        cursor: str | None = None
        for _ in range(SCAN_PAGES):
            page: dict[str, Any] = {"cursor": cursor} if cursor else {}
            if thread_ts is not None:
                answer = await self.link.client.conversations_replies(
                    channel=channel,
                    ts=thread_ts,
                    oldest=oldest,
                    include_all_metadata=True,
                    limit=200,
                    **page,
                )
            else:
                answer = await self.link.client.conversations_history(
                    channel=channel, oldest=oldest, include_all_metadata=True, limit=200, **page
                )
            for message in answer.get("messages") or []:
                yield message
            cursor = (answer.get("response_metadata") or {}).get("next_cursor") or None
            if not cursor:
                break

    async def with_working(
        self, sink: InboundSink, inbound: Inbound, known: KnownThread | None
    ) -> Inbound:
        """`inbound` naming every message of its thread that still wears the working reaction.

        A message steered into a busy run wears it too, and the reply answers them all: the
        list travels in the reply context (the newest one reaches the delivery) and is pruned
        by the thread's answered mark, which deliveries advance. It holds the newest
        `_WORKING_MAX`; ``working_cut`` names the newest one it dropped (`_sweep` finds those).
        """
        ts = str(inbound.reply_context.get("ts") or "")
        if not ts:
            return inbound
        try:
            answered = await sink.get_mark(_answered_mark(inbound.thread.lane))
        except Unavailable:
            answered = None  # the accept below says so; the list is cosmetic
        floor = ts_key(answered or "0")
        before = known.reply_context if known is not None else {}
        earlier = before.get("working")
        kept = [
            t
            for t in (earlier if isinstance(earlier, (list, tuple)) else ())
            if isinstance(t, str) and t != ts and ts_key(t) > floor
        ]
        working = [*kept[-(_WORKING_MAX - 1) :], ts]
        context = {**inbound.reply_context, "working": working}
        # the messages past the list's bound: the newest of them, for the reply to look for
        # in the thread (a burst of over 200 left the older ones wearing it for good)
        dropped = [t for t in (before.get("working_cut"), *kept[: -(_WORKING_MAX - 1)]) if t]
        cut = max(
            (t for t in dropped if isinstance(t, str) and ts_key(t) > floor),
            key=ts_key,
            default=None,
        )
        if cut is not None:
            context["working_cut"] = cut
        else:
            context.pop("working_cut", None)
        return Inbound.model_validate({**inbound.model_dump(), "reply_context": context})

    async def _answered(self, channel: str, outbound: Outbound, *, failed: bool = False) -> None:
        """Take the working reaction off the messages a delivery answers, and remember them.

        `failed`: the delivery is a dead letter; the newest of them wears `FAILED_REACTION`.
        """
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
        before = await self._mark_answered(outbound.thread.lane, max(working, key=ts_key))
        cut = outbound.reply_context.get("working_cut")
        if isinstance(cut, str) and ts_key(cut) > ts_key(before or "0"):
            await self._sweep(channel, outbound.thread, after=before, through=cut)
        if before is not None and not failed:
            # what an earlier reply answered has lost its reaction already: a burst's lists
            # are built before any answer moves the mark, and each reply took off up to 200
            # again (45,800 useless calls for 1,000 messages: an outside probe)
            working = {ts for ts in working if ts_key(ts) > ts_key(before)}
        for ts in sorted(working, key=ts_key):
            adding = self._adding.get((channel, ts))
            if adding is not None:  # a slow add landing after the remove would stay for good
                await asyncio.wait([adding], timeout=_ADD_WAIT_S)
            await self.react(channel, ts, add=False)
        lane, newest_ts = outbound.thread.lane, max(working, key=ts_key)
        if failed:
            await self.react(channel, newest_ts, add=True, name=FAILED_REACTION)
            await self._put_mark(_failed_mark(lane), newest_ts)
        else:  # a dead letter redelivered: its question no longer looks failed
            await self._clear_failed(channel, lane, working)

    async def _sweep(
        self, channel: str, thread: ThreadRef, *, after: str | None, through: str
    ) -> None:
        """Take the working reaction off the thread's messages past the lists' bound.

        A reply's list names the newest `_WORKING_MAX` messages; older ones of a long burst
        are found in the thread (its pages, best effort) by the reaction this bot put on.
        """
        _, thread_ts = split_thread(thread)
        bot = self.link.bot_user_id
        if thread_ts is None or bot is None:
            return
        wearing = []
        try:
            async for message in self._messages_since(channel, thread_ts, after or "0"):
                ts = str(message.get("ts") or "")
                if not ts or ts_key(ts) <= ts_key(after or "0") or ts_key(ts) > ts_key(through):
                    continue
                for reaction in message.get("reactions") or ():
                    if (
                        isinstance(reaction, Mapping)
                        and reaction.get("name") == self.working_reaction
                        and bot in (reaction.get("users") or ())
                    ):
                        wearing.append(ts)
        except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
            log.debug("slack reaction sweep skipped", extra={"error": type(exc).__name__})
        for ts in wearing:
            await self.react(channel, ts, add=False)

    async def _clear_failed(self, channel: str, lane: str, working: set[str]) -> None:
        """Take the failed reaction off a message this delivery answers, if one wears it."""
        sink = self.link.sink
        if sink is None:
            return
        with contextlib.suppress(Unavailable):
            marked = await sink.get_mark(_failed_mark(lane))
            if marked and marked in working:
                await self.react(channel, marked, add=False, name=FAILED_REACTION)
                await sink.put_mark(_failed_mark(lane), "", expect=marked)

    async def _put_mark(self, mark: str, value: str) -> None:
        if self.link.sink is None:
            return
        with contextlib.suppress(Unavailable):
            current = await self.link.sink.get_mark(mark)
            await self.link.sink.put_mark(mark, value, expect=current)

    async def _mark_answered(self, lane: str, through: str) -> str | None:
        """Move the thread's answered mark to `through`; the mark as it was before.

        None: there was none, it is unknown, or it was past `through` already (so nothing is
        known to have been done: a retry of the same delivery takes off its whole list).
        """
        mark = _answered_mark(lane)
        if self.link.sink is None:
            return None
        with contextlib.suppress(Unavailable):
            for _ in range(3):  # a compare-and-set: another process may answer the thread too
                current = await self.link.sink.get_mark(mark)
                if current is not None and ts_key(current) >= ts_key(through):
                    return None
                if await self.link.sink.put_mark(mark, through, expect=current):
                    return current
        return None

    def working_on(self, channel: str, ts: str) -> None:
        """Put the working reaction on a message, in the background (its reply takes it off)."""
        key = (channel, ts)
        task = self.link.spawn(self.react(channel, ts, add=True))
        self._adding[key] = task
        task.add_done_callback(lambda _: self._adding.pop(key, None))

    async def react(self, channel: str, ts: str, *, add: bool, name: str | None = None) -> None:
        """Put the working reaction (or `name`) on a message, or take it off (best effort)."""
        call = self.link.client.reactions_add if add else self.link.client.reactions_remove
        try:
            await call(channel=channel, timestamp=ts, name=name or self.working_reaction)
        except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
            # already_reacted / no_reaction are normal (a retry, a steered message)
            log.debug("slack reaction skipped", extra={"error": type(exc).__name__})


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


def _failed_mark(lane: str) -> str:
    """The mark naming the message of a lane that wears the failed reaction (a dead letter's)."""
    return f"slack:failed:{lane}"


def _answered_mark(lane: str) -> str:
    """The broker mark holding the newest message of a thread a delivery answered."""
    return f"slack:answered:{lane}"


def _request_text(message: Mapping[str, Any]) -> str:
    """The approval request's words (its section blocks), without its buttons."""
    texts = []
    for block in message.get("blocks") or []:
        if isinstance(block, dict) and block.get("type") == "section":
            text = block.get("text")
            if isinstance(text, dict) and isinstance(text.get("text"), str):
                texts.append(text["text"])
    return "\n\n".join(texts) or str(message.get("text") or "Approval request")


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


def _delivery_error(exc: SlackApiError, *, after_post: bool) -> DeliveryError:
    response = exc.response
    status = getattr(response, "status_code", 200)
    error = str(response.get("error") or f"HTTP {status}")
    seconds = retry_after_s(exc)
    if seconds is not None:
        return DeliveryError(
            "rate limited by Slack", retry_after_s=seconds, unknown_outcome=after_post
        )
    if error in _PERMANENT:
        return DeliveryError(f"Slack: {error}", permanent=True)
    if error in REFUSED_TOKEN:
        # kept for retries (a token put right, and the process restarted, delivers them), but
        # said where an operator looks: each attempt otherwise logs only "delivery failed"
        log.warning(
            "slack refuses the bot token: replies wait until it is put right",
            extra={"reason": error},
        )
    # A server error may come after Slack acted; a refusal (ok: false) did not post anything.
    acted = status >= 500 or error in _MAY_HAVE_ACTED
    return DeliveryError(f"Slack: {error}", unknown_outcome=after_post or acted)
