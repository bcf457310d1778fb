"""A session's pending items taken fairly: no thread's backlog keeps the others' out of reach.

A session is a whole space (every thread of a Slack channel or a web space), and its inbox is
one queue. The worker read its oldest `PENDING_READ` items and applied them in order: 10,000
messages posted to one web thread held every other thread of the space, an Approve click
included, about ten minutes behind them (an outside probe). Each read now takes at most
`LANE_SHARE` items of a lane (its oldest: a thread's own order is kept), and when a full page
left some out for that, one more page reaches past them for the other lanes' items.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Sequence
from dataclasses import dataclass

from gateway.broker.contract import Inbox, InboxItem

__all__ = ["LANE_SHARE", "PENDING_READ", "Fair", "fair_share", "take_fairly"]

PENDING_READ = 64
"""How many of a session's pending items one read takes (the worker's and the linger's)."""
LANE_SHARE = 16
"""The most items of one lane a read takes while it has more (the rest wait for the next)."""
_FURTHER = PENDING_READ * 16
"""How many pending items the read past a crowded page looks through for other lanes'."""


@dataclass(frozen=True, slots=True)
class Fair:
    """What to apply now, and whether pending items were left for the next read."""

    items: tuple[InboxItem, ...]
    more: bool


def fair_share(page: Sequence[InboxItem], skip: Container[str]) -> Fair:
    """At most `LANE_SHARE` of each lane's items of `page` (in-flight ones, `skip`, count)."""
    seen: Counter[str] = Counter()
    taken: list[InboxItem] = []
    more = False
    for item in page:
        seen[item.lane] += 1
        if seen[item.lane] > LANE_SHARE:
            more = more or item.id not in skip
        elif item.id not in skip:
            taken.append(item)
    return Fair(tuple(taken), more)


async def take_fairly(
    inbox: Inbox, session: str, page: Sequence[InboxItem], skip: Container[str]
) -> Fair:
    """`page` (the session's oldest pending items) shared fairly, read past when it is crowded.

    A full page that left a lane's items out may hide other lanes' behind it: the next
    `_FURTHER` items are read, and theirs taken (each lane still to its share).
    """
    fair = fair_share(page, skip)
    if not fair.more or len(page) < PENDING_READ:
        return fair
    further = await inbox.pending(session, limit=_FURTHER, after=page[-1].id)
    both = fair_share([*page, *further], skip)
    more = both.more or len(further) == _FURTHER
    return Fair(both.items, more)
