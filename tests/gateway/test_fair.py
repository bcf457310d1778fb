"""A session's pending items taken fairly: one thread's backlog does not hold the others back.

10,000 messages posted to one web thread held every other thread of the space, an Approve
click included, about ten minutes behind them (an outside probe): the worker read the oldest
64 pending items and the other threads' were never among them.
"""

from __future__ import annotations

from pathlib import Path

from gateway.broker.contract import Broker, NewInboxItem
from gateway.channels import gateway_settings
from gateway.fair import LANE_SHARE, PENDING_READ, take_fairly
from tests.support.service_rig import serving


def _item(n: int, lane: str) -> NewInboxItem:
    return NewInboxItem(
        session="s1", lane=lane, dedupe_key=f"k{n}", kind="message", payload={"text": "hi"}
    )


async def test_a_crowded_page_is_read_past_for_the_other_lanes(sqlite_broker: Broker) -> None:
    inbox = sqlite_broker.inbox
    flood = [(await inbox.append(_item(n, "web:flood"))).item for n in range(300)]
    other = (await inbox.append(_item(300, "web:other"))).item
    page = await inbox.pending("s1", limit=PENDING_READ)
    assert other not in page  # what the worker saw: the flood alone
    fair = await take_fairly(inbox, "s1", page, skip=set())
    assert fair.items == (*flood[:LANE_SHARE], other)  # each lane's oldest, in inbox order
    assert fair.more
    # the flood's items in flight count toward its share: none of them twice, no more of it
    busy = await take_fairly(inbox, "s1", page, skip={i.id for i in flood[:LANE_SHARE]})
    assert busy.items == (other,)


async def test_a_page_of_many_lanes_is_taken_whole_without_a_further_read(
    sqlite_broker: Broker,
) -> None:
    inbox = sqlite_broker.inbox
    for n in range(PENDING_READ):
        await inbox.append(_item(n, f"web:t{n % 8}"))  # 8 a lane: within the share
    page = await inbox.pending("s1", limit=PENDING_READ)
    fair = await take_fairly(inbox, "s1", page, skip=set())
    assert fair.items == page and not fair.more


async def test_a_thread_behind_another_s_held_backlog_is_answered_meanwhile(
    tmp_path: Path,
) -> None:
    """Under ``next_run`` a busy thread's messages stay pending until its run ends: 70 of
    them kept a second thread's message out of every read until that thread's backlog fell
    under a page, several runs later."""
    settings = gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"sqlite:///{tmp_path}/web.db",
        plugin="tests.support.gateway_agent",
        busy_policy="next_run",
    )
    async with serving(settings) as rig:
        await rig.post("flood", "/slow 8000")  # its run works for 8 s
        for n in range(PENDING_READ + 6):
            await rig.post("flood", f"more {n}")
        await rig.post("other", "hello")
        [answer] = await rig.answers("other", 1)
        assert answer["text"] == "You said: hello"
        flood = (await rig.http.get("/web/threads/flood")).json()["items"]
        # answered while the flood's run still works, not after it (nor after its backlog)
        assert [i["kind"] for i in flood].count("reply") == 0
