"""A message id a sender uses again past the inbox's dedupe window is a new message (D342).

The inbox forgets an id after its window; the session never forgets the entry the first message
became. A sender that reused an id a day later (a per-day counter, a ticket comment's number)
got its message refused with "send it again in other words", which under the same id could
not help, or, with the same text, dropped unanswered.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from adapters import Author, Inbound, ThreadRef
from gateway.channels import gateway_settings
from gateway.service import ServiceParts
from tests.support.gateway_rig import lane_texts
from tests.support.service_rig import serving

AGENT = "tests.support.gateway_agent"
DAY_MS = 86_400_000


class _Shifted:
    """The real clock, moved forward on demand (as the days between two messages)."""

    def __init__(self) -> None:
        self.offset_ms = 0

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 + self.offset_ms

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def _message(text: str, clock: _Shifted) -> Inbound:
    return Inbound(
        thread=ThreadRef(channel="web", space="default", thread="daily"),
        message_id="report-1",  # the sender's own counter, reset every day
        author=Author(id="cron"),
        text=text,
        received_at_ms=clock.now_ms(),
    )


async def test_a_message_id_used_again_past_the_window_is_a_new_message(tmp_path: Path) -> None:
    clock = _Shifted()
    settings = gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"sqlite:///{tmp_path}/web.db",
        plugin=AGENT,
    )
    async with serving(settings, parts=ServiceParts(clock=clock)) as rig:
        intake = rig.service.intake
        assert intake is not None
        first = await intake.accept(_message("monday's figures", clock))
        await rig.answers("daily", 1)
        again = await intake.accept(_message("monday's figures", clock))  # within the window
        assert again.duplicate and again.item_id == first.item_id
        for answered, days in enumerate((2, 4), start=2):
            clock.offset_ms = days * DAY_MS  # past the window: the inbox forgot the id
            taken = await intake.accept(_message("tuesday's figures", clock))
            assert not taken.duplicate
            await rig.answers("daily", answered)
        answers = [a["text"] for a in await rig.answers("daily", 3)]
        # other text under the id was refused; the same text was dropped unanswered
        said = ["monday's figures", "tuesday's figures", "tuesday's figures"]
        assert answers == [f"You said: {text}" for text in said]
        assert await lane_texts(rig.repo, "web-default", "web:daily") == said
