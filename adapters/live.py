"""What a thread may show while a run works: progress and the answer as it is written.

Live updates are never durable-critical: the gateway sends them best effort (throttled, at most
about one progress update a second per thread), a channel may drop any of them, and losing one
changes nothing the thread ends with. The durable reply (an `Outbound` through the outbox) is
still the answer; a channel that streamed a run's text finishes or replaces that stream when
the reply is delivered, so a thread ends with exactly one complete answer even after a crash.

A channel that can show them implements `LiveView` (``show``); one that cannot (email) simply
does not, and the gateway sends it nothing.
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

from pydantic import Field

from adapters.channel import ThreadRef
from harness_core.frozen import Frozen

__all__ = ["LiveKind", "LiveUpdate", "LiveView", "shared_prefix"]

LiveKind = Literal["progress", "text", "done"]
"""``progress``: what the run is doing now (`status`); ``text``: the answer so far grew
(`text` from `offset`); ``done``: the run stopped writing (its durable reply follows or was
delivered; a channel ends what it showed)."""


class LiveUpdate(Frozen):
    """One live update of one run in one thread."""

    thread: ThreadRef
    run_id: str
    kind: LiveKind
    status: str | None = None
    """For ``progress``: a short phrase like "is thinking…", "is running tickets.create…",
    "is waiting for approval", "is retrying (rate limited)…"."""
    text: str = ""
    """For ``text``: the characters of the answer from `offset` on (appending them to what was
    shown up to `offset` gives the answer so far; an update seen twice is harmless)."""
    offset: int = Field(default=0, ge=0)
    step: int = Field(default=0, ge=0)
    """Which model request of the run wrote the text (a retried or later request starts its
    answer again: a channel replaces what an earlier step showed)."""
    at_ms: int = 0


@runtime_checkable
class LiveView(Protocol):
    """A channel that shows live updates (Slack's thread status and streams, the web page)."""

    async def show(self, update: LiveUpdate) -> None:
        """Show `update` now, or drop it; never raises for a failed show, never blocks a run.

        Called from the gateway's live task, never from the run: a slow channel delays only
        its own later updates (which the gateway may coalesce or drop).
        """
        ...


def shared_prefix(a: str, b: str) -> int:
    """How many leading characters `a` and `b` share (text usually only grows: fast)."""
    if b.startswith(a):
        return len(a)
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
