"""What a Slack thread shows while a run works: the assistant status and the streamed answer.

Progress is the thread's assistant status (``assistant.threads.setStatus``, "is running
tickets.create…"). A workspace whose app cannot set it (no Agents & AI Apps feature, no scope:
the first refusal says so) is not asked again by this process; its threads keep the working
reaction the message got on arrival, which is the fallback (D217).

The answer is streamed into one bot message with slack_sdk's chat stream helper
(``chat.startStream`` / ``appendStream`` / ``stopStream``). The durable reply finishes that
message rather than posting a second one: `take` hands the delivery the stream's ``ts`` (stopped),
the delivery rewrites it with the reply's text and its delivery metadata (D218). A stream's
identity lives in a broker mark per thread (``slack:stream:<lane>``: the run, its stream
messages, whether a start may have gone out unrecorded), so that a new process finds what a dead
one started: the reply's delivery finishes it, a later run of the thread deletes it (D219).
The thread itself is read (``conversations.replies``, Tier 3) only after a crash or for a mark an
older process wrote, never for a reply finishing its stream as planned (D279).

Streaming is best effort: a rate-limited append, a refused start or an unreachable Slack ends it
for the run (the stream is stopped where it stands and the reply replaces its text: one message);
a refusal meaning the workspace cannot stream at all ends it for the process (D220). A new model
request of the run (a retry, a later step) deletes the earlier step's message and streams again.
A reply's delivery, in whichever process, closes its run's mark: a step the run's process shows
late starts no stream beside the reply and deletes nothing of it (D281). Nothing here raises into
the gateway, and no message carrying a delivery's metadata is deleted.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_chat_stream import AsyncChatStream

from adapters.channel import Outbound, ThreadRef, Unavailable
from adapters.live import LiveUpdate
from adapters.slack.events import split_thread
from adapters.slack.link import METADATA_TYPE, SlackLink, defused, ts_key

__all__ = ["SlackLive", "StreamMark"]

log = logging.getLogger("adapters.slack")

_NOT_HERE = frozenset(
    {
        "missing_scope",
        "not_allowed",
        "not_allowed_token_type",
        "unknown_method",
        "method_deprecated",
        "deprecated_endpoint",
        "access_denied",
        "no_permission",
        "team_access_not_granted",
        "enterprise_is_restricted",
        "channel_type_not_supported",
        "feature_not_enabled",
    }
)
"""Refusals that say the workspace (its app, its scopes, its plan) cannot do it at all."""
_RUNS = 1_000
"""Runs whose live state a process keeps (the oldest is forgotten: its reply still finishes
its stream from the mark)."""
_LOCKS = 64
_OWED = 8
"""Earlier runs' unfinished answers a mark carries (the oldest beyond are left as they are)."""


@dataclass(frozen=True)
class StreamMark:
    """A thread's streams, kept in the broker mark ``slack:stream:<lane>``."""

    run: str
    since: str = ""
    """The ts of the message the run answers: a mark whose `since` is later is a later run's."""
    streams: tuple[str, ...] = ()
    """The stream messages of the run not yet finished or deleted, oldest first (the last is
    the current step's)."""
    starting: bool = False
    """A start may have reached Slack without its ts being recorded (a crash just then)."""
    sweep: str | None = None
    """Where the sweep for such unrecorded streams starts when an earlier run's is owed (an
    earlier run's question); `since` otherwise. Apart from `since`, which orders the runs."""
    answer: str | None = None
    """The stream a delivery of the run's reply is finishing as its answer: out of `streams`,
    so no sweep deletes it, and kept so that a retry of that delivery finishes it again."""
    apart: bool = True
    """The mark's `streams` came from code that moves a stream to `answer` before rewriting it
    (D275), so a listed stream is no delivered reply and a take need not read the thread to
    make sure (D279); stored as ``"v": 2``. False for a mark an older process wrote, and for a
    mark that carries such a mark's `streams` on (until none of them is left)."""
    closed: bool = False
    """A delivery took the run's reply: no stream starts for the run any more. The process
    running it may show a step late (its feed lags; the reply went out from another process):
    that step neither deletes the answer nor streams the answer's text again (D281)."""
    owed: tuple[tuple[str, str], ...] = ()
    """(run, ts): answers earlier runs' deliveries took and have not finished (a retry waiting
    out a 429, or after a crash), carried on when a later run takes the mark over, so the
    retry finishes its stream instead of posting beside it; nobody sweeps them (D281)."""

    def dump(self) -> str:
        """The mark's value (JSON)."""
        data: dict[str, object] = {
            "run": self.run,
            "since": self.since,
            "streams": list(self.streams),
            "starting": self.starting,
        }
        if self.sweep is not None:
            data["sweep"] = self.sweep
        if self.answer is not None:
            data["answer"] = self.answer
        if self.apart:
            data["v"] = 2
        if self.closed:
            data["closed"] = True
        if self.owed:
            data["owed"] = [list(pair) for pair in self.owed]
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def load(cls, raw: str | None) -> StreamMark | None:
        """The mark from its value; None if unset or unreadable (treated as no stream)."""
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            return cls(
                run=str(data["run"]),
                since=str(data.get("since") or ""),
                streams=tuple(str(ts) for ts in data.get("streams") or ()),
                starting=bool(data.get("starting")),
                sweep=str(data["sweep"]) if data.get("sweep") else None,
                answer=str(data["answer"]) if data.get("answer") else None,
                apart=data.get("v") == 2,
                closed=data.get("closed") is True,
                owed=tuple((str(run), str(ts)) for run, ts in data.get("owed") or ()),
            )
        except (ValueError, KeyError, TypeError):
            return None


@dataclass
class _Run:
    """One run's live state in this process."""

    run_id: str
    channel: str
    thread_ts: str
    since: str
    user: str | None
    step: int = 0
    answer: str = ""
    """The step's answer so far, as the updates told it."""
    shown: str = ""
    """What the stream holds (a prefix of `answer`)."""
    stream: AsyncChatStream | None = None
    stalled: bool = False
    """The step's text went where the stream cannot follow (an update was lost): the stream
    waits for the reply, which replaces its text."""
    off: bool = False
    """No more streaming for this run (rate limited, refused, unreachable, or finished)."""
    stopped: str | None = None
    """The stream this process saw stopped (the reply finishing it need not stop it again)."""
    errors: list[str] = field(default_factory=list)


class SlackLive:
    """The Slack channel's live view: status, streams, and finishing a stream with its reply."""

    def __init__(self, link: SlackLink) -> None:
        self.link = link
        self.status_ok = True
        """False once the workspace refused a status for good (the reaction stays instead)."""
        self.streaming_ok = True
        """False once the workspace refused a stream for good (the reply comes as one message)."""
        self._runs: OrderedDict[str, _Run] = OrderedDict()
        self._locks = [asyncio.Lock() for _ in range(_LOCKS)]

    def _lock(self, lane: str) -> asyncio.Lock:
        return self._locks[hash(lane) % _LOCKS]

    async def show(self, update: LiveUpdate) -> None:
        """Show `update` in its thread (best effort; never raises, see the module docstring)."""
        try:
            channel, thread_ts = split_thread(update.thread)
        except ValueError:
            return
        if thread_ts is None:
            return  # a DM's top level: no thread to set a status on or stream into
        try:
            if update.kind == "progress":
                await self._status(channel, thread_ts, update.status or "")
                return
            async with self._lock(update.thread.lane):
                if update.kind == "text":
                    await self._text(update, channel, thread_ts)
                else:
                    await self._done(update, channel, thread_ts)
        except Unavailable as exc:
            log.info("slack live update dropped", extra={"reason": str(exc)})
        except Exception as exc:  # a live update must never reach the run: log, drop it
            log.warning("slack live update failed", extra={"error": type(exc).__name__})

    # ---- progress

    async def _status(self, channel: str, thread_ts: str, status: str) -> None:
        if not self.status_ok:
            return
        try:
            await self.link.client.assistant_threads_setStatus(
                channel_id=channel, thread_ts=thread_ts, status=status
            )
        except SlackApiError as exc:
            error = str(exc.response.get("error") or "")
            if error in _NOT_HERE:
                self.status_ok = False
                log.info(
                    "slack thread status unavailable: the working reaction shows progress",
                    extra={"reason": self.link.api_said(exc)},
                )
            else:
                log.debug("slack status skipped", extra={"error": error})
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.debug("slack status skipped", extra={"error": type(exc).__name__})

    # ---- text

    async def _text(self, update: LiveUpdate, channel: str, thread_ts: str) -> None:
        run = await self._run_for(update, channel, thread_ts)
        if run is None or run.off:
            return
        if update.step < run.step:
            return  # an earlier request's text arriving late
        if update.step > run.step:
            await self._restart(update.thread, run, update.step)
        if run.stalled:
            return
        if update.offset > len(run.answer):
            run.stalled = True  # a lost update: the reply fills in what the stream misses
            return
        merged = run.answer[: update.offset] + update.text
        if run.answer.startswith(merged):
            return  # seen before
        run.answer = merged
        if not run.answer.startswith(run.shown):
            run.stalled = True  # the step rewrote what was shown
            return
        await self._append(update.thread, run, _complete(run.answer[len(run.shown) :]))

    async def _run_for(self, update: LiveUpdate, channel: str, thread_ts: str) -> _Run | None:
        lane = update.thread.lane
        run = self._runs.get(lane)
        if run is not None and run.run_id == update.run_id:
            self._runs.move_to_end(lane)
            return run
        sink = self.link.sink
        if sink is None:
            return None
        known = await sink.known(update.thread)
        context: Mapping[str, Any] = known.reply_context if known is not None else {}
        user = context.get("user")
        run = _Run(
            run_id=update.run_id,
            channel=channel,
            thread_ts=thread_ts,
            since=str(context.get("ts") or thread_ts),
            user=user if isinstance(user, str) and user else None,
            step=update.step,
        )
        run.off = not self.streaming_ok or (channel[:1] != "D" and run.user is None)
        self._runs[lane] = run
        while len(self._runs) > _RUNS:
            self._runs.popitem(last=False)
        if not run.off:
            try:
                await self._clear_others(update.thread, run)
            except Unavailable:
                run.off = True  # the mark is left as it was: the next run sweeps again
                raise
        return run

    async def _append(self, thread: ThreadRef, run: _Run, text: str) -> None:
        if not text:
            return
        starting = run.stream is None
        if starting:
            if not await self._record(thread, run, starting=True):
                run.off = True  # the run's reply is out (from another process): nothing to add
                return
            run.stream = await self.link.client.chat_stream(
                channel=run.channel,
                thread_ts=run.thread_ts,
                recipient_team_id=self.link.team_id if run.user else None,
                recipient_user_id=run.user,
                buffer_size=1,  # the gateway coalesces: every update is worth sending now
            )
        stream = run.stream
        assert stream is not None
        try:
            await stream.append(markdown_text=defused(text))
        except SlackApiError as exc:
            await self._give_up(thread, run, exc, starting=starting)
            return
        except (aiohttp.ClientError, TimeoutError) as exc:
            run.errors.append(type(exc).__name__)
            await self._give_up(thread, run, None, starting=starting)
            return
        run.shown += text
        if starting and not await self._record(thread, run, starting=False):
            # the reply went out while this stream started: nobody took it (it was never
            # listed), so it is this run's to delete
            run.off = True
            run.stream = None
            if stream.ts is not None and await self._delete(run.channel, stream.ts):
                await self._settled(thread, run.run_id)

    async def _give_up(
        self, thread: ThreadRef, run: _Run, exc: SlackApiError | None, *, starting: bool
    ) -> None:
        """Stream no more for this run: stop the stream where it stands (the reply replaces it)."""
        run.off = True
        error = str(exc.response.get("error") or "") if exc is not None else "unreachable"
        if exc is not None and exc.response.status_code == 429:
            error = "ratelimited"
        if starting and error in _NOT_HERE:
            self.streaming_ok = False
            log.info(
                "slack streaming unavailable: replies come as one message",
                extra={"reason": error},
            )
        else:
            log.info("slack stream ended early: the reply comes whole", extra={"reason": error})
        stream = run.stream
        if stream is not None and stream.ts is not None:
            if await self._stop(run.channel, stream.ts):
                run.stopped = stream.ts
            run.stream = None
        elif starting and error != "unreachable":
            await self._record(thread, run, starting=False)  # refused: nothing was started

    async def _restart(self, thread: ThreadRef, run: _Run, step: int) -> None:
        """A new model request of the run: its answer replaces the earlier step's message.

        The earlier message leaves the mark before it is deleted, as in a sweep (D275): a
        delivery in another process may have taken it as the run's answer meanwhile, and then
        it is not this run's to delete (D281). The mark says a stream may be unlisted until the
        delete is done, so a crash in between leaves it to the reply's sweep.
        """
        old = run.stream.ts if run.stream is not None else None
        run.step, run.answer, run.shown, run.stream, run.stalled = step, "", "", None, False
        if old is None or not await self._unlist(thread, run.run_id, old):
            return
        if not await self._delete(run.channel, old):
            await self._relist(thread, run.run_id, old)

    async def _done(self, update: LiveUpdate, channel: str, thread_ts: str) -> None:
        """The run stopped writing: take its status down, stop its stream where it stands."""
        await self._status(channel, thread_ts, "")
        run = self._runs.get(update.thread.lane)
        if run is None or run.run_id != update.run_id:
            return
        run.off = True
        if run.stream is not None and run.stream.ts is not None:
            if await self._stop(run.channel, run.stream.ts):
                run.stopped = run.stream.ts
            run.stream = None

    # ---- the durable reply

    async def take(self, outbound: Outbound, posted: Mapping[int, str]) -> str | None:
        """The stopped stream message the reply `outbound` finishes as its first part, if any.

        The run's other stream messages (an earlier step's that could not be deleted then, one
        a dead process started without recording it) are deleted. `posted`: the parts an
        earlier attempt posted (part number -> ts); with part 0 there, no stream is taken. The
        run's mark is closed first: the process running the run starts no stream for it after
        that, nor deletes the one taken here (D281).
        """
        if outbound.kind not in ("reply", "failure_notice") or self.link.sink is None:
            return None
        try:
            channel, thread_ts = split_thread(outbound.thread)
        except ValueError:
            return None
        lane = outbound.thread.lane
        keep = set(posted.values())
        async with self._lock(lane):
            for _ in range(3):  # a compare-and-set: the run's own process may write meanwhile
                mark = await self._mark(lane)
                if mark is None or not outbound.delivery_id.endswith(f":{mark.run}"):
                    owed = _owed(mark, outbound.delivery_id)
                    if owed is not None:  # an earlier attempt's answer, a later run's mark
                        if 0 in posted or owed in keep:
                            return None
                        await self._stop(channel, owed)
                        return owed
                    # the run recorded no stream (yet): its mark is closed all the same, so a
                    # stream its process starts late is not left beside the reply
                    if not self.streaming_ok or thread_ts is None:
                        return None
                    since = str(outbound.reply_context.get("ts") or thread_ts)
                    if mark is not None and ts_key(mark.since) > ts_key(since):
                        return None  # a later run's: this reply is late, its run long over
                    run_id = outbound.delivery_id.rpartition(":")[2]
                    # an earlier run's leftovers go with the mark: its answer a retry still
                    # owes (carried), its listed streams (deleted here, once nobody can take
                    # them: the mark moved), and the sweep for unrecorded ones it is owed (from
                    # that run's question, on the closed mark)
                    closed = StreamMark(run_id, since=since, closed=True, owed=_carried(mark))
                    if mark is not None and mark.starting:
                        closed = replace(closed, sweep=_swept_from(mark), starting=True)
                    if not await self._put(lane, mark, closed):
                        continue
                    if mark is not None and mark.streams:
                        await self._drop(channel, thread_ts, mark)
                    return None
                run = self._runs.get(lane)
                stopped = None
                if run is not None and run.run_id == mark.run:
                    run.off = True  # later text of the run has nothing to show it in
                    run.stream = None
                    stopped = run.stopped
                streams = [ts for ts in mark.streams if ts not in keep]
                # a listed stream that carries a delivery's metadata is an answer already (one
                # a holder older than D275 finished without clearing the mark): never deleted,
                # never rewritten as another reply. Since D275 an answer leaves `streams` before
                # it is rewritten, so a mark written since needs no read of the thread (D279):
                # the read is a Tier 3 call, about 50 a minute for the workspace
                if streams and thread_ts is not None and not mark.apart:
                    answers = await self._delivered(channel, thread_ts, mark, streams)
                    streams = [ts for ts in streams if ts not in answers]
                if 0 in posted:
                    taken = None
                elif mark.answer is not None and mark.answer not in keep:
                    taken = mark.answer  # an earlier attempt's: finishing it again changes nothing
                else:
                    taken = streams[-1] if streams else None
                if mark.closed and (taken is None or mark.answer == taken):
                    break
                # the stream leaves `streams` for `answer` before it becomes the answer: a next
                # run's sweep (`_clear_others`, maybe in another process) never deletes it; if
                # the mark moved to another run meanwhile, that sweep owns the streams and the
                # reply is posted afresh (D275)
                claimed = replace(
                    mark,
                    streams=tuple(ts for ts in mark.streams if ts != taken),
                    answer=taken if taken is not None else mark.answer,
                    closed=True,
                )
                if await self._put(lane, mark, claimed):
                    break
            else:
                return None
            doomed = set(streams) - {taken}
            if mark.starting:
                kept = keep | _answers(mark) | ({taken} if taken is not None else set())
                doomed |= await self._unrecorded(channel, outbound.thread, mark, kept)
            for ts in sorted(doomed, key=ts_key):
                if await self._delete(channel, ts):
                    await self._forget(outbound.thread, mark.run, {ts})
            if taken is not None and taken != stopped:
                await self._stop(channel, taken)
            return taken

    async def finished(self, outbound: Outbound) -> None:
        """The reply `outbound` is delivered: its run has no stream left to finish or sweep."""
        lane = outbound.thread.lane
        try:
            mark = await self._mark(lane)
            if mark is None:
                return
            if outbound.delivery_id.endswith(f":{mark.run}"):
                done = StreamMark(run=mark.run, since=mark.since, closed=True, owed=mark.owed)
                await self._put(lane, mark, done)
            elif _owed(mark, outbound.delivery_id) is not None:
                owed = tuple(p for p in mark.owed if not outbound.delivery_id.endswith(f":{p[0]}"))
                await self._put(lane, mark, replace(mark, owed=owed))
        except Unavailable:
            return  # the next run of the thread sweeps (and spares the reply: it has metadata)

    # ---- marks and sweeps

    async def _mark(self, lane: str) -> StreamMark | None:
        sink = self.link.sink
        if sink is None:
            return None
        return StreamMark.load(await sink.get_mark(_mark_name(lane)))

    async def _put(self, lane: str, expect: StreamMark | None, value: StreamMark) -> bool:
        sink = self.link.sink
        if sink is None:
            return False
        before = expect.dump() if expect is not None else None
        return await sink.put_mark(_mark_name(lane), value.dump(), expect=before)

    async def _record(self, thread: ThreadRef, run: _Run, *, starting: bool) -> bool:
        """Write the run's stream into the thread's mark (before a start, and after it).

        False if a delivery closed the run's mark (its reply is out), or the mark is a later
        run's (it answers a newer message: this run's feed is late): nothing is written. False
        too if a start could not be announced (the mark kept changing): none is made.
        """
        lane = thread.lane
        for _ in range(3):  # a compare-and-set: a delivery in another process may write too
            mark = await self._mark(lane)
            same = mark is not None and mark.run == run.run_id
            if mark is not None and same and mark.closed:
                return False
            if mark is not None and not same and ts_key(mark.since) > ts_key(run.since):
                return False
            streams = mark.streams if mark is not None and same else ()
            answer = mark.answer if mark is not None and same else None
            apart = mark.apart if mark is not None and streams else True
            if run.stream is not None and run.stream.ts not in (None, answer):
                streams = tuple(dict.fromkeys((*streams, run.stream.ts)))
            value = StreamMark(
                run.run_id,
                since=run.since,
                streams=streams,
                starting=starting,
                answer=answer,
                apart=apart,
                owed=mark.owed if mark is not None and same else _carried(mark),
            )
            if await self._put(lane, mark, value):
                return True
        return not starting  # a start the mark cannot announce is not made

    async def _forget(self, thread: ThreadRef, run_id: str, gone: set[str]) -> None:
        lane = thread.lane
        for _ in range(3):
            mark = await self._mark(lane)
            if mark is None or mark.run != run_id:
                return
            streams = tuple(ts for ts in mark.streams if ts not in gone)
            value = replace(mark, streams=streams, apart=mark.apart or not streams)
            if await self._put(lane, mark, value):
                return

    async def _settled(self, thread: ThreadRef, run_id: str) -> None:
        """The run's closed mark need not say a stream may be unrecorded any more.

        Its process deleted the stream it started as the run's reply went out; the reply's
        sweep found any other (the run's own `_clear_others` swept earlier ones). A mark left
        saying so would cost the thread's next reply a read, and keep it from being closed.
        """
        lane = thread.lane
        mark = await self._mark(lane)
        if mark is None or mark.run != run_id or not mark.closed or not mark.starting:
            return
        await self._put(lane, mark, replace(mark, starting=False, sweep=None))

    async def _unlist(self, thread: ThreadRef, run_id: str, ts: str) -> bool:
        """Take stream `ts` out of the run's mark before deleting it; False if it is not there.

        Not there: a delivery took it as the answer, or a sweep took the mark on. The mark is
        left saying a stream may be unlisted (`starting`) until the delete is done.
        """
        lane = thread.lane
        for _ in range(3):
            mark = await self._mark(lane)
            if mark is None or mark.run != run_id or ts not in mark.streams:
                return False
            streams = tuple(s for s in mark.streams if s != ts)
            value = replace(mark, streams=streams, starting=True, apart=mark.apart or not streams)
            if await self._put(lane, mark, value):
                return True
        return False

    async def _relist(self, thread: ThreadRef, run_id: str, ts: str) -> None:
        """Put back a stream `_unlist` took out and could not delete (a later sweep does).

        Oldest first: it is no answer (the last listed stream is the one a reply takes). A
        closed mark's delivery swept the thread for unlisted streams already.
        """
        lane = thread.lane
        for _ in range(3):
            mark = await self._mark(lane)
            if mark is None or mark.run != run_id or mark.closed:
                return
            value = replace(mark, streams=(ts, *mark.streams))
            if await self._put(lane, mark, value):
                return

    async def _clear_others(self, thread: ThreadRef, run: _Run) -> None:
        """Delete what an earlier run of the thread left streaming (its process died).

        Only messages without a delivery's metadata: a reply that finished its stream is kept
        even if the mark still lists it (the process died before saying so).
        """
        for _ in range(3):  # a compare-and-set: a delivery in another process may take a stream
            mark = await self._mark(thread.lane)
            if mark is None or (not mark.streams and not mark.starting):
                return
            doomed = set(mark.streams)
            if mark.starting:
                # a delivery may be rewriting the answer right now (no metadata yet): kept
                spare = _answers(mark)
                doomed |= await self._unrecorded(run.channel, thread, mark, spare)
            # An earlier run's leftovers, or this run's own from a dead process (its model
            # request is retried here): either way this run starts afresh. The mark moves
            # first, so a delivery taking one of these streams as its answer either took it out
            # of the mark before (the put fails: look again) or finds the mark moved and posts
            # its reply afresh; a stream is deleted only once nobody can take it (D275).
            # the run's own mark stays closed if its reply is out (D281)
            same = mark.run == run.run_id
            moved = StreamMark(
                run.run_id,
                since=run.since,
                closed=mark.closed and same,
                owed=mark.owed if same else _carried(mark),
            )
            if not await self._put(thread.lane, mark, moved):
                continue
            answers = await self._delivered(run.channel, run.thread_ts, mark, doomed)
            for ts in sorted(doomed - answers, key=ts_key):
                await self._delete(run.channel, ts)
            return

    async def _drop(self, channel: str, thread_ts: str, mark: StreamMark) -> None:
        """Delete the streams `mark` (moved on) listed, except finished answers (D279)."""
        doomed = set(mark.streams)
        if not mark.apart:
            doomed -= await self._delivered(channel, thread_ts, mark, doomed)
        for ts in sorted(doomed, key=ts_key):
            await self._delete(channel, ts)

    async def _unrecorded(
        self, channel: str, thread: ThreadRef, mark: StreamMark, keep: set[str]
    ) -> set[str]:
        """Streams a dead process started but did not record.

        The bot's messages without delivery metadata after the run's question.
        """
        _, thread_ts = split_thread(thread)
        if thread_ts is None:
            return set()
        found: set[str] = set()
        since = _swept_from(mark)
        for message in await self._read(channel, thread_ts, since or thread_ts):
            ts = str(message.get("ts") or "")
            if (
                ts
                and ts not in keep
                and ts_key(ts) > ts_key(since)
                and message.get("bot_id") == self.link.bot_id
                and not _delivered(message)
            ):
                found.add(ts)
        return found

    async def _delivered(
        self, channel: str, thread_ts: str, mark: StreamMark, candidates: Iterable[str]
    ) -> set[str]:
        """Which of `candidates` carry a delivery's metadata (finished answers: never deleted)."""
        wanted = set(candidates)
        if not wanted:
            return set()
        oldest = min(wanted, key=ts_key)
        messages = await self._read(channel, thread_ts, oldest, inclusive=True)
        return {str(m.get("ts")) for m in messages if str(m.get("ts")) in wanted and _delivered(m)}

    async def _read(
        self, channel: str, thread_ts: str, oldest: str, *, inclusive: bool = False
    ) -> list[dict[str, Any]]:
        try:
            answer = await self.link.client.conversations_replies(
                channel=channel,
                ts=thread_ts,
                oldest=oldest,
                inclusive=inclusive,
                include_all_metadata=True,
                limit=200,
            )
        except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
            raise Unavailable(
                f"the Slack thread could not be read ({type(exc).__name__})"
            ) from None
        return [m for m in answer.get("messages") or [] if isinstance(m, dict)]

    async def _stop(self, channel: str, ts: str) -> bool:
        """Stop a stream; whether it is known to stream no more."""
        try:
            await self.link.client.chat_stopStream(channel=channel, ts=ts)
        except SlackApiError as exc:
            # message_not_in_streaming_state: stopped already (by us, or Slack's own timeout)
            error = exc.response.get("error")
            log.debug("slack stream stop skipped", extra={"error": error})
            return bool(error == "message_not_in_streaming_state")
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.debug("slack stream stop skipped", extra={"error": type(exc).__name__})
            return False
        return True

    async def _delete(self, channel: str, ts: str) -> bool:
        """Delete a stream message; whether it is gone."""
        try:
            await self.link.client.chat_delete(channel=channel, ts=ts)
        except SlackApiError as exc:
            return bool(exc.response.get("error") == "message_not_found")
        except (aiohttp.ClientError, TimeoutError):
            return False
        return True


def _carried(mark: StreamMark | None) -> tuple[tuple[str, str], ...]:
    """What a later run's mark owes of `mark` (another run's): its owed answers, and its own."""
    if mark is None:
        return ()
    owed = mark.owed if mark.answer is None else (*mark.owed, (mark.run, mark.answer))
    return owed[-_OWED:]


def _swept_from(mark: StreamMark) -> str:
    """Where a sweep of `mark`'s unrecorded streams starts (see `StreamMark.sweep`)."""
    return mark.sweep if mark.sweep is not None else mark.since


def _answers(mark: StreamMark) -> set[str]:
    """The streams `mark` knows deliveries took as answers (no sweep deletes them)."""
    return {ts for ts in (mark.answer, *(ts for _, ts in mark.owed)) if ts is not None}


def _owed(mark: StreamMark | None, delivery_id: str) -> str | None:
    """The answer `mark` owes the delivery `delivery_id`, if any (see `StreamMark.owed`)."""
    for run, ts in mark.owed if mark is not None else ():
        if delivery_id.endswith(f":{run}"):
            return ts
    return None


def _mark_name(lane: str) -> str:
    return f"slack:stream:{lane}"


def _delivered(message: Mapping[str, Any]) -> bool:
    metadata = message.get("metadata")
    return isinstance(metadata, dict) and metadata.get("event_type") == METADATA_TYPE


_OPEN_TAIL = 200
"""The longest unfinished ``<!...`` a stream holds back (a ping's label is shorter)."""


def _complete(text: str) -> str:
    """`text` up to a ``<`` that may open a ping not finished yet (the next update ends it).

    A model's ``<!channel>`` comes in pieces (``<!c``, ``hann``, ``el>``): each piece is
    harmless alone, and `defused` sees a ping only whole, so the stream shows none of it until
    it is (then defused) or is plainly not one.
    """
    start = text.rfind("<")
    if start < 0:
        return text
    tail = text[start:]
    if ">" in tail or len(tail) > _OPEN_TAIL or not (tail == "<" or tail.startswith("<!")):
        return text
    return text[:start]
