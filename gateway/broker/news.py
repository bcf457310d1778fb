"""Inbox news a session's holder waits on, and takes that a cancellation never strands.

Both brokers keep, per session, the newest position at which something happened to it that
its holder must look at (an item appended while the session was held, its ticket taken over
or handed back): `Inbox.wait` compares that with the position the holder read from. The record
is bounded: past its cap it is cleared, and every position before the clear then counts as
news (a wake for nothing costs a read; a missed one would strand a message until the next).
A holder waits on its own session's event (`waiter`, D250), so news of one session wakes only the
holders of that one: dozens of lingering sessions would otherwise all wake, and sleep again, at
every message of every session.

A take step (a claim and the bookkeeping around it) runs to its end once started: cancelling
the caller waits for it and hands back a session it took, so a worker may take while it waits
for something else (a lingering session's next message) and cancel the take when that comes.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from typing import TypeVar

from gateway.broker.contract import SessionTicket

__all__ = ["SessionNews", "whole_take"]

_T = TypeVar("_T")

NEWS_CAP = 10_000
"""Sessions whose news positions are kept before the record is cleared."""


class SessionNews:
    """The newest news position per session, bounded (see the module docstring)."""

    def __init__(self, cap: int = NEWS_CAP) -> None:
        self._latest: dict[str, int] = {}
        self._forgotten = -1
        """News at a position up to this one may have been cleared from the record."""
        self._cap = cap
        self._waiters: weakref.WeakValueDictionary[str, asyncio.Event] = (
            weakref.WeakValueDictionary()
        )
        """Each waited-on session's next-news event (dropped with its last waiter)."""

    def waiter(self, session: str) -> asyncio.Event:
        """Set by the next news of `session` (take it before `since`, wait on it after)."""
        event = self._waiters.get(session)
        if event is None:
            event = self._waiters[session] = asyncio.Event()
        return event

    def note(self, session: str, at: int) -> None:
        """`session` had news at position `at`."""
        if session not in self._latest and len(self._latest) >= self._cap:
            self._forgotten = max(self._forgotten, *self._latest.values())
            self._latest.clear()
            self.wake_all()  # every position before the clear is news now
        if at > self._latest.get(session, -1):
            self._latest[session] = at
        event = self._waiters.pop(session, None)
        if event is not None:
            event.set()

    def wake_all(self) -> None:
        """Wake every waiter (what they wait for may have happened unseen)."""
        events = list(self._waiters.values())
        self._waiters.clear()
        for event in events:
            event.set()

    def since(self, session: str, position: int) -> bool:
        """Whether `session` may have had news after `position`."""
        return self._latest.get(session, -1) > position or self._forgotten > position


async def _outlast(task: asyncio.Future[_T]) -> _T | None:
    """`task`'s result once it ends, whatever cancels the caller meanwhile (None: it raised)."""
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            continue
        except Exception:
            return None
    return None if task.cancelled() or task.exception() is not None else task.result()


async def whole_take(
    step: Awaitable[_T], hand_back: Callable[[SessionTicket], Awaitable[None]]
) -> _T:
    """Run one take step to its end; if the caller was cancelled meanwhile, hand back its ticket.

    The step's result is whatever it returns; a `SessionTicket` among them is what was taken.
    The cancellation goes on once that session is ready again for the next take.
    """
    task = asyncio.ensure_future(step)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        taken = await _outlast(task)
        if isinstance(taken, SessionTicket):
            await _outlast(asyncio.ensure_future(hand_back(taken)))
        raise
