"""A message id a sender uses again is a new message: past the inbox's dedupe window (D342),
and within it when the channel's content digests tell the two apart (D382).

The inbox forgets an id after its window; the session never forgets the entry the first message
became. A sender that reused an id a day later (a per-day counter, a ticket comment's number)
got its message refused with "send it again in other words", which under the same id could
not help, or, with the same text, dropped unanswered.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adapters import Author, Inbound, ThreadRef
from gateway.broker import open_broker
from gateway.broker.contract import Broker
from gateway.channels import gateway_settings
from gateway.intake import Intake
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


def _mail(digest: str | None, *, text: str = "is the build green?", lane: str = "b") -> Inbound:
    return Inbound(
        thread=ThreadRef(channel="email", space="bot@example.test", thread=lane),
        message_id="<fixed@script.example>",
        author=Author(id="ci@example.test"),
        text=text,
        received_at_ms=1_000,
        content_digest=digest,
    )


@pytest.fixture(params=["sqlite", "redis"])
async def any_broker(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Broker]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/broker.db"
    else:
        server = request.getfixturevalue("redis_server")
        url = f"{server.url}?prefix={request.getfixturevalue('redis_prefix')}"
    opened = open_broker(url)
    yield opened
    await opened.close()


async def test_within_the_window_only_another_digest_is_another_message(
    any_broker: Broker,
) -> None:
    """The same mail read again (a crash before it was marked handled, a copy delivered twice)
    carries the same digest: a duplicate. Another mail under its Message-ID carries another:
    ``reused``, and nothing of it is held, so the channel can take it under its own id."""
    intake = Intake(any_broker, lambda channel, space: "s1")
    first = await intake.accept(_mail("h1:aaaa"))
    assert not first.duplicate and not first.reused
    again = await intake.accept(_mail("h1:aaaa", text="read again, cut otherwise"))
    assert again.duplicate and not again.reused and again.item_id == first.item_id
    other = await intake.accept(_mail("h1:bbbb", text="and the tests?"))
    assert other.duplicate and other.reused and other.item_id == first.item_id
    assert "reused" not in again.model_dump() and other.model_dump()["reused"] is True
    own = await intake.accept(_mail("h1:bbbb").model_copy(update={"message_id": "<own>"}))
    assert not own.duplicate
    pending = await any_broker.inbox.pending("s1")
    assert [item.payload["text"] for item in pending] == [
        "is the build green?",
        "is the build green?",
    ]
    assert len({item.id for item in pending}) == 2  # nothing was held for the reused one


async def test_a_message_held_without_a_digest_is_the_same_message_sent_again(
    any_broker: Broker,
) -> None:
    """A mail taken before digests were recorded and read again after an upgrade (a crash in
    between, a UIDVALIDITY resync) is not answered twice; nor is a channel that writes none."""
    intake = Intake(any_broker, lambda channel, space: "s1")
    await intake.accept(_mail(None))
    assert not (await intake.accept(_mail("h1:aaaa", text="other"))).reused
    await intake.accept(_mail("h1:aaaa", lane="c").model_copy(update={"message_id": "<2>"}))
    digestless = _mail(None, lane="c").model_copy(update={"message_id": "<2>"})
    reply = await intake.accept(digestless)
    assert reply.duplicate and not reply.reused
