"""Warm sessions: a worker keeps a session it just served for a short linger (D247).

When a session goes idle (no lane works, nothing pending) its worker does not let it go at
once: for up to the linger it keeps the harness open, the store's writer lease and the inbox
ticket, so the session's next message is served without a take (no lease acquire, no restore,
no reply scan of a take). A lingering session holds no slot: the slot goes back to taking, and
lingering never holds back another session. While it lingers, `until_news` waits for

* news of it (`Inbox.wait`): a message is pending (a free slot of this worker carries on with
  it; with none free it is let go at once, so a free slot of any worker takes it), or its
  ticket changed hands (another worker took it over: it is let go at once);
* a drain or a cut, or the worker needing its place (more sessions linger than it keeps);
* the end of the linger.

The session's ticket stays live (renewed by the worker's loop while it works; a linger is at
most a third of the lease), so no other worker takes it while it lingers, and an idle harness
never renews its lease: a process killed while lingering leaves both to lapse like a process
killed mid-run, and the next one takes over within the lease.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from gateway.broker.contract import Inbox, InboxItem, SessionTicket
from gateway.fair import PENDING_READ
from harness_core import Clock

__all__ = ["Lingered", "until_news"]


@dataclass(frozen=True, slots=True)
class Lingered:
    """How a linger ended.

    `work`: `items` are pending (read after the news position `since`; the worker carries on
    with them without reading them again); `stop`: a drain, a cut or the worker needing its
    place; `lost`: the ticket is no longer the session's; `over`: the linger's time is up (or
    the broker could not be asked).
    """

    end: Literal["work", "stop", "lost", "over"]
    since: int = 0
    items: tuple[InboxItem, ...] = ()


async def until_news(
    inbox: Inbox,
    held: SessionTicket,
    *,
    since: int,
    until_ms: int,
    clock: Clock,
    ends: Sequence[asyncio.Event],
    in_flight: Collection[str] = (),
) -> Lingered:
    """Wait, after the news position `since`, until the lingering session `held` must move.

    `until_ms` ends the linger (on `clock`); any of `ends` set ends it at once.
    """
    stops = [asyncio.ensure_future(event.wait()) for event in ends]
    try:
        while True:
            left = until_ms - clock.now_ms()
            if left <= 0 or any(event.is_set() for event in ends):
                return Lingered("stop" if left > 0 else "over")
            told = asyncio.ensure_future(inbox.wait(held.session, since=since, timeout_ms=left))
            try:
                await asyncio.wait({told, *stops}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                told.cancel()
                await asyncio.gather(told, return_exceptions=True)
            if not told.done() or told.cancelled():
                continue  # an end was set: seen at the top
            if told.exception() is not None:  # the broker is away: let the session go
                return Lingered("over")
            if not told.result():
                continue  # the time is up: seen at the top
            since = await inbox.position()
            pending = await inbox.pending(held.session, limit=PENDING_READ)
            fresh = tuple(item for item in pending if item.id not in in_flight)
            if fresh:
                return Lingered("work", since, fresh)
            if not await inbox.renew(held):  # news without items: the ticket moved
                return Lingered("lost")
    finally:
        for stop in stops:
            stop.cancel()
        await asyncio.gather(*stops, return_exceptions=True)
