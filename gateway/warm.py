"""Warm sessions: a slot keeps the session it just served for a short linger (D247).

When a session goes idle (no lane works, nothing pending) its worker does not let it go at
once: for up to the linger it keeps the harness open, the store's writer lease and the inbox
ticket, so the session's next message is served without a take (no lease acquire, no restore,
no reply scan of a take). Meanwhile the slot takes as a free slot would (`take_session`, run
beside the wait): lingering never holds back another session. The linger ends

* with news of the session (`Inbox.wait`): a message is pending (back to work), or the ticket
  changed hands (another worker took it over: the session is let go at once);
* when the concurrent take hands the slot another session (this one is let go for it);
* on a drain (`stopping`) or a cut, and when the linger's time is up.

A take that is still waiting when the linger ends for another reason is cancelled; the broker
hands back anything it took meanwhile (`Inbox.take_session`). The session's ticket stays live
throughout (renewed by the worker's loop), so no other worker takes it while it lingers, and
the lease is never renewed by an idle harness: a process killed while lingering leaves both to
lapse like a process killed mid-run, and the next one takes over within the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from gateway.broker.contract import Inbox, SessionTicket
from harness_core import Clock

__all__ = ["Lingered", "linger"]


@dataclass(frozen=True, slots=True)
class Lingered:
    """How a linger ended.

    `work`: items are pending; `taken`: the slot took `ticket` (serve it instead); `stop`: a
    drain or a cut; `lost`: the ticket is no longer the session's; `over`: the time is up.
    """

    end: Literal["work", "taken", "stop", "lost", "over"]
    ticket: SessionTicket | None = None
    since: int = 0
    """The news position the pending items were read after (`work`)."""


async def linger(
    inbox: Inbox,
    worker: str,
    held: SessionTicket,
    *,
    since: int,
    linger_ms: int,
    clock: Clock,
    ends: Sequence[asyncio.Event],
    in_flight: Collection[str] = (),
) -> Lingered:
    """Keep `held` for up to `linger_ms` after the news position `since` (see the module)."""
    deadline = clock.now_ms() + linger_ms
    take = asyncio.ensure_future(inbox.take_session(worker, wait_ms=linger_ms))
    stops = [asyncio.ensure_future(event.wait()) for event in ends]
    told: asyncio.Task[bool] | None = None
    result = Lingered("over")
    try:
        while True:
            left = deadline - clock.now_ms()
            if left <= 0:
                return result
            told = asyncio.ensure_future(inbox.wait(held.session, since=since, timeout_ms=left))
            done, _ = await asyncio.wait({take, told, *stops}, return_when=asyncio.FIRST_COMPLETED)
            if any(stop in done for stop in stops):
                result = Lingered("stop")
                return result
            if take in done:
                ticket = None if take.exception() is not None else take.result()
                result = Lingered("taken", ticket) if ticket is not None else Lingered("over")
                return result
            if told.exception() is not None:  # the broker is away: let the session go
                return result
            if told.result():
                since = await inbox.position()
                pending = await inbox.pending(held.session, limit=1 + len(in_flight))
                if any(item.id not in in_flight for item in pending):
                    result = Lingered("work", since=since)
                    return result
                if not await inbox.renew(held):  # news without items: the ticket moved
                    result = Lingered("lost")
                    return result
            told = None
    finally:
        for task in (*stops, *([told] if told is not None else [])):
            task.cancel()
        if not take.done():
            take.cancel()  # cancelled, a take hands back what it took meanwhile
        await asyncio.gather(
            take, *stops, *([told] if told is not None else []), return_exceptions=True
        )
        if result.ticket is None and take.done() and not take.cancelled():
            taken = None if take.exception() is not None else take.result()
            if taken is not None:  # it took one as the linger ended another way: hand it back
                with contextlib.suppress(Exception):
                    await inbox.done(taken)
