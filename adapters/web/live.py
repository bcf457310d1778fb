"""The web threads' live view: what each run is doing and has written so far, in memory only.

`LiveBoard` keeps, per thread, the newest live state the gateway showed (`adapters.LiveUpdate`:
the run, its current model request's text so far, its progress phrase, whether it stopped) and
wakes the thread's event streams when it changes. Each stream sends what changed since it last
looked (`LiveCursor.catch_up`): a stream never queues, however fast the text grows, so a slow
browser only gets fewer, larger updates. Nothing here is stored: a restarted process starts
empty, and the durable reply (the mailbox) is the answer; delivering it clears the thread's
live state, and the page replaces what it streamed with the reply.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

from adapters.live import LiveUpdate, shared_prefix

__all__ = ["LiveBoard", "LiveCursor"]

MAX_THREADS: Final = 10_000
"""Threads whose live state is kept at once (the oldest changed is forgotten first)."""

_Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class _State:
    run_id: str
    step: int
    text: str
    status: str | None
    done: bool


class LiveBoard:
    """Per thread: the newest live state, and a signal its event streams wait on."""

    def __init__(self, max_threads: int = MAX_THREADS) -> None:
        self._states: OrderedDict[_Key, _State] = OrderedDict()
        self._signals: OrderedDict[_Key, asyncio.Event] = OrderedDict()
        self._cleared: OrderedDict[_Key, tuple[str, int]] = OrderedDict()
        """Per thread: the run and step whose answer was delivered last (a late update of it
        must not show it again under its reply)."""
        self._answered: OrderedDict[_Key, str] = OrderedDict()
        """Per thread: the newest run whose answer the thread holds, whoever delivered it (a
        stream of this process read it from the mailbox): nothing more of it shows."""
        self._max = max_threads

    def show(self, update: LiveUpdate) -> None:
        """Fold `update` into its thread's state and wake the thread's streams."""
        key = (update.thread.space, update.thread.thread)
        if self._cleared.get(key) == (update.run_id, update.step):
            return
        if self._answered.get(key) == update.run_id:
            return
        old = self._states.get(key)
        same = old is not None and (old.run_id, old.step) == (update.run_id, update.step)
        text = old.text if same and old is not None else ""
        status = old.status if old is not None and old.run_id == update.run_id else None
        done = False
        if update.kind == "text":
            if update.offset > len(text):
                return  # a gap (an update was lost): the next model request starts whole
            text = text[: update.offset] + update.text
        elif update.kind == "progress":
            status = update.status
        else:
            status, done = None, True
            if not text:  # nothing written: nothing to keep showing
                self.clear(*key)
                return
        self._states[key] = _State(update.run_id, update.step, text, status, done)
        self._states.move_to_end(key)
        while len(self._states) > self._max:
            self._states.popitem(last=False)
        self._wake(key)

    def clear(self, space: str, thread: str) -> None:
        """The thread's answer was delivered: what was streamed goes (streams are woken)."""
        key = (space, thread)
        old = self._states.pop(key, None)
        if old is not None:
            self._cleared[key] = (old.run_id, old.step)
            self._cleared.move_to_end(key)
            while len(self._cleared) > self._max:
                self._cleared.popitem(last=False)
            self._wake(key)

    def answered(self, space: str, thread: str, run_id: str) -> None:
        """Run `run_id`'s answer is in the thread: nothing more of the run shows.

        What it streamed goes. Another process may have delivered the answer: its board was
        cleared then, not this one (D282).
        """
        key = (space, thread)
        self._answered[key] = run_id
        self._answered.move_to_end(key)
        while len(self._answered) > self._max:
            self._answered.popitem(last=False)
        state = self._states.get(key)
        if state is not None and state.run_id == run_id:
            self.clear(space, thread)

    def signal(self, space: str, thread: str) -> asyncio.Event:
        """An event set at the thread's next change (take it before reading the state).

        At most `max_threads` are kept, as the states are: a stream of each of 20,000 thread
        names left 1.4 KB apiece that nothing freed (an outside probe). The oldest one let go
        is set first: its streams look again and take a new one (a wake for nothing, never a
        change missed).
        """
        key = (space, thread)
        signal = self._signals.get(key)
        if signal is None:
            signal = self._signals[key] = asyncio.Event()
            while len(self._signals) > self._max:
                _, oldest = self._signals.popitem(last=False)
                oldest.set()
        return signal

    def state(self, space: str, thread: str) -> _State | None:
        """The thread's live state (None: nothing live)."""
        return self._states.get((space, thread))

    def _wake(self, key: _Key) -> None:
        signal = self._signals.pop(key, None)
        if signal is not None:
            signal.set()


class LiveCursor:
    """What one event stream has sent of its thread's live state."""

    def __init__(self, board: LiveBoard, space: str, thread: str) -> None:
        self._board = board
        self._space = space
        self._thread = thread
        self._sent: _State | None = None

    def signal(self) -> asyncio.Event:
        """Set at the thread's next change (take it before `catch_up`)."""
        return self._board.signal(self._space, self._thread)

    def catch_up(self) -> dict[str, Any] | None:
        """The ``live`` event that brings the stream up to date (None: nothing changed).

        ``{"run_id", "step", "offset", "text", "status", "done"}``: the text from `offset` on
        replaces what the page shows from there (a new run or step starts at 0); ``run_id``
        None means the thread shows nothing live any more (its answer was delivered).
        """
        now = self._board.state(self._space, self._thread)
        sent, self._sent = self._sent, now
        if now is None:
            if sent is None:
                return None
            return {"run_id": None, "step": 0, "offset": 0, "text": "", "status": None,
                    "done": True}  # fmt: skip
        if sent == now:
            return None
        offset = 0
        if sent is not None and (sent.run_id, sent.step) == (now.run_id, now.step):
            offset = shared_prefix(sent.text, now.text)
        return {
            "run_id": now.run_id,
            "step": now.step,
            "offset": offset,
            "text": now.text[offset:],
            "status": now.status,
            "done": now.done,
        }
