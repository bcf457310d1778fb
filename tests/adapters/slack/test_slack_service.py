"""Slack end to end: the whole service with the real slack-bolt app against a local Slack.

Events and clicks arrive as correctly signed HTTP requests at ``/slack/events``; replies go to a
local fake of the Slack Web API (`tests.support.fake_slack`), where the tests read the threads.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from config import Settings
from gateway.service import Service
from harness_core import UserMessage, message_text
from harness_core.session.entries import MessageEntry
from tests.support.fake_slack import FakeSlack, Message, event_envelope, form_body, signed_headers

AGENT = "tests.support.gateway_agent"
SECRET = "test-signing-secret"
APPROVER = "U9"


class Rig:
    """A running service with Slack on, the fake workspace, and a signed-request client."""

    def __init__(self, service: Service, fake: FakeSlack, http: httpx.AsyncClient) -> None:
        self.service = service
        self.fake = fake
        self.http = http

    async def signed(
        self, raw: str, content_type: str, *, timestamp: int | None = None, secret: str = SECRET
    ) -> httpx.Response:
        headers = {"content-type": content_type, **signed_headers(raw, secret, timestamp)}
        return await self.http.post("/slack/events", content=raw.encode(), headers=headers)

    async def event(self, event: dict[str, Any], **envelope: Any) -> httpx.Response:
        raw = json.dumps(event_envelope(event, **envelope))
        response = await self.signed(raw, "application/json")
        return response

    async def click(self, payload: dict[str, Any]) -> httpx.Response:
        return await self.signed(form_body(payload), "application/x-www-form-urlencoded")

    async def bot_replies(
        self, channel: str, root: str, count: int, timeout_s: float = 10.0
    ) -> list[Message]:
        """Wait until the thread under `root` holds `count` bot messages; return them."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            found = [m for m in self.fake.thread(channel, root) if m.bot_id]
            if len(found) >= count:
                return found
            assert asyncio.get_running_loop().time() < deadline, [m.text for m in found]
            await asyncio.sleep(0.02)

    async def user_texts(self, lane: str, session: str = "slack-C1") -> list[str]:
        assert self.service.repo is not None
        storage = await self.service.repo.open(session)
        try:
            return [
                message_text(stored.entry.message)
                for stored in await storage.read_lane_entries(lane, after=None)
                if isinstance(stored.entry, MessageEntry)
                and isinstance(stored.entry.message, UserMessage)
            ]
        finally:
            await storage.close()


@pytest.fixture
async def rig(tmp_path: Any) -> AsyncIterator[Rig]:
    async with FakeSlack() as fake:
        settings = Settings(
            store_url=f"sqlite:///{tmp_path}/store.db",
            broker_url=f"sqlite:///{tmp_path}/broker.db",
            web_url=f"sqlite:///{tmp_path}/web.db",
            plugin=AGENT,
            lease_seconds=6,
            renew_seconds=1,
            slack_bot_token=fake.bot_token,
            slack_signing_secret=SECRET,
            slack_api_url=fake.api_url,
            slack_approvers={"C1": (APPROVER,)},
        )
        service = Service(settings)
        await service.start()
        assert service.app is not None
        transport = httpx.ASGITransport(app=service.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            yield Rig(service, fake, http)
        await service.stop(drain_seconds=2)


def _delivery_of(message: Message) -> str:
    assert message.metadata is not None
    assert message.metadata["event_type"] == "gateway_delivery"
    return str(message.metadata["event_payload"]["delivery_id"])


async def test_a_mention_is_answered_in_a_thread_under_it(rig: Rig) -> None:
    event = rig.fake.mention_event("C1", "hello there")
    response = await rig.event(event)
    assert response.status_code == 200, response.text
    [reply] = await rig.bot_replies("C1", event["ts"], 1)
    assert reply.text == "You said: hello there"
    assert reply.thread_ts == event["ts"]
    assert _delivery_of(reply).startswith("reply:slack-C1:")
    assert await rig.user_texts(f"slack:C1:{event['ts']}") == ["hello there"]


async def test_the_same_message_as_mention_message_and_retry_is_taken_once(rig: Rig) -> None:
    mention = rig.fake.mention_event("C1", "only once")
    message = rig.fake.message_event("C1", mention["ts"])
    first = await rig.event(mention, event_id="Ev1")
    assert first.status_code == 200
    assert (await rig.event(message, event_id="Ev2")).status_code == 200
    retry = rig.fake  # Slack's retry repeats the event id
    assert retry is not None
    assert (await rig.event(mention, event_id="Ev1")).status_code == 200
    [reply] = await rig.bot_replies("C1", mention["ts"], 1)
    await asyncio.sleep(0.3)  # room for a wrong second reply
    assert len([m for m in rig.fake.thread("C1", mention["ts"]) if m.bot_id]) == 1
    assert reply.text == "You said: only once"
    assert await rig.user_texts(f"slack:C1:{mention['ts']}") == ["only once"]


async def test_a_thread_the_bot_is_in_is_followed_and_others_are_not(rig: Rig) -> None:
    mention = rig.fake.mention_event("C1", "first")
    await rig.event(mention)
    await rig.bot_replies("C1", mention["ts"], 1)
    follow = rig.fake.post_user_message("C1", "second", thread_ts=mention["ts"])
    assert (await rig.event(follow)).status_code == 200
    replies = await rig.bot_replies("C1", mention["ts"], 2)
    assert replies[1].text == "You said: second"
    elsewhere = rig.fake.post_user_message("C1", "not for the bot")
    other_thread = rig.fake.post_user_message("C1", "chatter", thread_ts=elsewhere["ts"])
    for event in (elsewhere, other_thread):
        assert (await rig.event(event)).status_code == 200
    await asyncio.sleep(0.3)
    assert [m for m in rig.fake.thread("C1", elsewhere["ts"]) if m.bot_id] == []


async def test_forged_stale_and_malformed_requests_store_nothing(rig: Rig) -> None:
    raw = json.dumps(event_envelope(rig.fake.mention_event("C1", "forged")))
    forged = await rig.signed(raw, "application/json", secret="not-the-secret")
    assert forged.status_code == 401
    stale = await rig.signed(raw, "application/json", timestamp=1_000_000_000)
    assert stale.status_code == 401
    for bad in ("{not json", "[]", '{"type": "event_callback", "event": 5}'):
        response = await rig.signed(bad, "application/json")
        assert response.status_code == 400, bad
    unsigned = await rig.http.post("/slack/events", content=raw.encode())
    assert unsigned.status_code == 401
    await asyncio.sleep(0.2)
    broker = rig.service.broker
    assert broker is not None
    backlog = await broker.inbox.backlog()
    assert backlog.pending == 0
    assert rig.fake.bot_messages() == []
