"""Live updates: a run's harness events become its thread's progress and streamed text.

The worker watches each session's harness with `LivePublisher.watch`. Each event of a lane is
folded into that lane's feed: the latest progress phrase, the answer text of the current model
request, whether the run stopped. Folding is all the run ever does (no await, no I/O), so a
slow, hung or failing channel never slows or fails a run. Each feed has its own task that shows
what changed to the thread's channel (`adapters.LiveView`): text as soon as the channel took the
previous update (what piled up meanwhile goes as one update from the last shown offset),
progress at most once per `progress_ms` per thread (the latest phrase wins), and ``done`` when
the run ends. A feed holds at most one pending update of each kind, so it is bounded however
fast the model writes. Nothing here is durable: the reply through the outbox is the answer.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from adapters import LiveUpdate, LiveView, ThreadRef, shared_prefix
from gateway.logs import event
from harness_core import AssistantMessage, Clock, TextPart
from harness_core.events import EventBus

__all__ = ["LivePublisher", "ThreadOf", "live_views", "retry_wait"]

log = logging.getLogger("gateway.live")

PROGRESS_MS: Final = 1_000
"""At most one progress update per thread this often (issue 27)."""
SHOW_TIMEOUT_S: Final = 5.0
"""A channel's `show` taking longer is given up (the feed goes on with newer updates)."""

ThreadOf = Callable[[str], Awaitable[ThreadRef | None]]
"""The thread a lane of the watched session answers (None: unknown: nothing is shown)."""

THINKING: Final = "is thinking…"
WAITING: Final = "is waiting for approval"


def live_views(adapters: Mapping[str, object]) -> dict[str, LiveView]:
    """The channels among `adapters` that show live updates, by name."""
    return {name: a for name, a in adapters.items() if isinstance(a, LiveView)}


def answer_text(message: AssistantMessage) -> str:
    """The answer's text so far (its text parts: tool calls and thinking are not shown)."""
    return "".join(part.text for part in message.content if isinstance(part, TextPart))


def retry_wait(delay_ms: int) -> str | None:
    """How long a retry waits, as a person reads it ("in 2 s"); None: it goes at once.

    A retry sent at once (images withheld, D289) says no wait; a wait is a whole second or more
    (round() halves to even: 0.5 s would read "in 0 s").
    """
    return f"in {max(round(delay_ms / 1000), 1)} s" if delay_ms > 0 else None


def _status(event_: Any) -> str | None:
    """The progress phrase an event means (None: it changes nothing shown)."""
    kind = event_.type
    if kind in ("run_start", "run_resume", "turn_start", "retry_start"):
        return THINKING
    if kind == "tool_start":
        return f"is running {event_.tool_name}…"
    if kind == "retry_scheduled":
        wait = retry_wait(event_.delay_ms)
        when = f" {wait}" if wait else ""
        return f"is retrying{when} (attempt {event_.attempt + 1} of {event_.max_attempts})…"
    if kind == "compaction_start":
        return "is compacting the conversation…"
    if kind == "run_suspend":
        return WAITING if event_.reason == "approval" else "is waiting for the model…"
    return None


@dataclass(eq=False)
class _Feed:
    """One lane's pending live updates (at most one of each kind) and its task."""

    lane: str
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    run_id: str = ""
    step: int = 0
    text: str = ""
    """The current model request's answer so far."""
    status: str | None = None
    """The newest progress phrase not yet shown."""
    done: bool = False
    """The run stopped writing: ``done`` is owed."""
    ended: bool = False
    """``done`` was shown and nothing came since: the feed may go."""
    shown_step: int = -1
    shown_text: str = ""
    last_progress_ms: int | None = None
    shown_status: str | None = None
    """The phrase the channel shows now (the same phrase again is not sent)."""
    later: asyncio.Task[None] | None = None
    """A wake-up for throttled progress (on the injected clock)."""

    def fold(self, event_: Any, steps: Iterator[int]) -> bool:
        """Take `event_` in; whether anything is new to show."""
        kind = event_.type
        run_id = getattr(event_, "run_id", None)
        if isinstance(run_id, str) and run_id and run_id != self.run_id:
            self.run_id = run_id  # a new run (or a resumed one): its text starts again
            self.step = next(steps)
            self.text = ""
            self.done = False
            self.shown_status = None
        if kind == "message_update":
            written = answer_text(event_.message)
            if written == self.text:
                return False
            self.text = written
            self.ended = False
            return True
        if kind == "turn_start" or (kind == "retry_start" and event_.step == "assistant"):
            self.step = next(steps)  # a new model request: what the last one wrote is replaced
            self.text = ""
        if kind == "run_end":
            self.done = True
            self.status = None  # what it was doing is over: only the end is worth showing
            return True
        status = _status(event_)
        if status is None:
            return False
        self.done = False
        self.ended = False
        self.status = status
        return True


class LivePublisher:
    """Folds harness events into per-lane feeds and shows them to channels, best effort."""

    def __init__(
        self,
        views: Mapping[str, LiveView],
        clock: Clock,
        *,
        progress_ms: int = PROGRESS_MS,
        show_timeout_s: float = SHOW_TIMEOUT_S,
    ) -> None:
        self._views = dict(views)
        self._clock = clock
        self._progress_ms = progress_ms
        self._timeout_s = show_timeout_s
        self._feeds: dict[tuple[int, str], _Feed] = {}
        self._steps = itertools.count(1)
        """Numbers model requests across every feed: a (run, step) pair never comes back in
        this process, even for a run a later take resumes (a channel may ignore a closed one)."""
        self._muted: set[str] = set()
        """Runs whose thread's authority was revoked: nothing more of them is shown (D267)."""
        self.shown = 0
        """Updates channels took."""
        self.failed = 0
        """Updates a channel raised on or did not take in time (dropped)."""

    @property
    def active(self) -> bool:
        """Whether any channel shows live updates (else watching is not worth it)."""
        return bool(self._views)

    def watch(self, events: EventBus, thread_of: ThreadOf) -> Callable[[], None]:
        """Show the live updates of the lanes behind `events`; returns `off`.

        `off` stops folding new events; what a feed holds still goes out (its ``done``).
        """
        if not self._views:
            return lambda: None
        key = id(events)
        # the lanes this watch found no live channel for: their events are ignored at once
        silent: set[str] = set()

        def listener(event_: Any) -> None:
            lane = event_.lane
            if lane is None or lane in silent or getattr(event_, "run_id", None) in self._muted:
                return
            try:
                feed = self._feeds.get((key, lane))
                if feed is None:
                    feed = _Feed(lane=lane)
                    self._feeds[(key, lane)] = feed
                    feed.task = asyncio.get_running_loop().create_task(
                        self._drain(key, feed, thread_of, silent), name=f"live {lane}"
                    )
                if feed.fold(event_, self._steps):
                    feed.wake.set()
            except Exception as exc:  # a live update is never worth a run
                log.debug(event("live update dropped", lane=lane, error=type(exc).__name__))

        return events.on(None, listener)

    def mute(self, run_id: str) -> None:
        """Show nothing more of run `run_id`, not even its end (its thread's authority is gone).

        Where it ran, the bot may no longer speak: what a feed of it holds is dropped (D267).
        """
        self._muted.add(run_id)
        for key, feed in list(self._feeds.items()):
            if feed.run_id == run_id:
                self._feeds.pop(key, None)
                for task in (feed.task, feed.later):
                    if task is not None:
                        task.cancel()

    async def close(self) -> None:
        """Stop every feed (what they hold is dropped: it was never more than a courtesy)."""
        tasks = [t for f in self._feeds.values() for t in (f.task, f.later) if t is not None]
        self._feeds.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _drain(self, key: int, feed: _Feed, thread_of: ThreadOf, silent: set[str]) -> None:
        try:
            thread = await thread_of(feed.lane)
        except Exception:
            thread = None
        view = self._views.get(thread.channel) if thread is not None else None
        if thread is None or view is None:
            silent.add(feed.lane)
            self._feeds.pop((key, feed.lane), None)
            return
        while True:
            await feed.wake.wait()
            feed.wake.clear()
            await self._text(feed, thread, view)
            await self._progress(feed, thread, view)
            if feed.text != feed.shown_text or feed.step != feed.shown_step:
                feed.wake.set()  # written while the last update was shown: that goes first
                continue
            if feed.done:  # after the run's last text
                feed.done = False
                feed.ended = True
                await self._show(view, self._update(feed, thread, "done"))
            if feed.ended and not feed.wake.is_set() and feed.later is None:
                # nothing owed: the feed goes (the lane's next event makes a new one)
                self._feeds.pop((key, feed.lane), None)
                return

    async def _text(self, feed: _Feed, thread: ThreadRef, view: LiveView) -> None:
        if feed.shown_step != feed.step:
            feed.shown_step = feed.step
            feed.shown_text = ""
        written = feed.text
        if written == feed.shown_text:
            return
        offset = shared_prefix(feed.shown_text, written)
        update = self._update(feed, thread, "text", text=written[offset:], offset=offset)
        feed.shown_text = written  # taken or dropped, it is not sent again
        await self._show(view, update)

    async def _progress(self, feed: _Feed, thread: ThreadRef, view: LiveView) -> None:
        if feed.status is not None and feed.status == feed.shown_status:
            feed.status = None  # already said (a new turn "is thinking…" again)
        if feed.status is None or feed.later is not None:
            return
        now = self._clock.now_ms()
        last = feed.last_progress_ms
        if last is not None and now - last < self._progress_ms:
            feed.later = asyncio.ensure_future(self._later(feed, last + self._progress_ms))
            return
        status, feed.status = feed.status, None
        feed.last_progress_ms = now
        feed.shown_status = status
        await self._show(view, self._update(feed, thread, "progress", status=status))

    async def _later(self, feed: _Feed, due_ms: int) -> None:
        await self._clock.sleep(max(due_ms - self._clock.now_ms(), 0) / 1000)
        feed.later = None
        feed.wake.set()

    def _update(self, feed: _Feed, thread: ThreadRef, kind: Any, **fields: Any) -> LiveUpdate:
        return LiveUpdate(
            thread=thread,
            run_id=feed.run_id,
            kind=kind,
            step=feed.step,
            at_ms=self._clock.now_ms(),
            **fields,
        )

    async def _show(self, view: LiveView, update: LiveUpdate) -> None:
        try:
            await asyncio.wait_for(view.show(update), self._timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # TimeoutError included: the next update may fare better
            self.failed += 1
            log.debug(event("live update not shown", kind=update.kind, error=type(exc).__name__))
        else:
            self.shown += 1
