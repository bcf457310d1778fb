"""Slack takes the bot's authority away: its runs there end ``authority_revoked``, nothing more is
posted, messages are kept and not run, operators see why (D267).

The whole service with the real slack-bolt app: Slack's events (``member_left_channel``,
``channel_archive``, ``app_uninstalled``, ``tokens_revoked``, and ``member_joined_channel`` that
gives it back) arrive as correctly signed HTTP requests at ``/slack/events``; what the bot does
is read from the fake Slack Web API's call log, the store and the operator API.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import httpx
import pytest

from gateway.channels import gateway_settings
from gateway.service import Service
from harness_core import SessionError
from harness_core.session import RecordQuery
from harness_core.session.records import OperationFinished
from tests.support.fake_slack import TEAM_ID, FakeSlack, Message, event_envelope, signed_headers
from tests.support.gateway_rig import lane_texts

AGENT = "tests.support.gateway_agent"
SECRET = "test-signing-secret"
OPERATOR = "operator-secret-abcdefghijklmnop"
_T = TypeVar("_T")


class Rig:
    """The service with Slack on (HTTP mode), the fake workspace, a signed-request client."""

    def __init__(self, service: Service, fake: FakeSlack, http: httpx.AsyncClient) -> None:
        self.service = service
        self.fake = fake
        self.http = http

    async def event(self, event: dict[str, Any], **envelope: Any) -> httpx.Response:
        raw = json.dumps(event_envelope(event, **envelope))
        headers = {"content-type": "application/json", **signed_headers(raw, SECRET)}
        return await self.http.post("/slack/events", content=raw.encode(), headers=headers)

    async def ops(self, method: str, path: str, body: Any = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {OPERATOR}", "Idempotency-Key": f"k-{path}"}
        return await self.http.request(method, f"/api/v1{path}", json=body, headers=headers)

    async def lane(self, session: str, lane: str) -> dict[str, Any]:
        response = await self.ops("GET", f"/lanes?session={session}&lane={lane}")
        [view] = response.json()["items"]
        return dict(view)

    async def records(self, session: str, lane: str, kind: str) -> list[Any]:
        assert self.service.repo is not None
        try:
            storage = await self.service.repo.open(session)
        except SessionError:
            return []  # the worker has not created it yet
        try:
            found = await storage.find_records(
                RecordQuery(lane=lane, type=kind, order="oldest_first")  # type: ignore[arg-type]
            )
        finally:
            await storage.close()
        return [stored.record for stored in found]

    async def until_record(self, session: str, lane: str, kind: str) -> Any:
        async def found() -> Any:
            records = await self.records(session, lane, kind)
            return records[-1] if records else None

        return await until(found)

    def calls_into(self, channel: str, since: int) -> list[str]:
        """The Web API calls since `since` that act in `channel` (post, edit, react, status)."""
        return [c.method for c in self.fake.calls[since:] if c.params.get("channel") == channel]

    async def audit(self, action: str) -> list[dict[str, Any]]:
        response = await self.ops("GET", "/audit?limit=100")
        return [e for e in response.json()["items"] if e["action"] == action]


async def until(probe: Callable[[], Awaitable[_T | None]], timeout_s: float = 15.0) -> _T:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = await probe()
        if value is not None and value is not False:
            return value
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


@pytest.fixture
async def rig(tmp_path: Any) -> AsyncIterator[Rig]:
    async with FakeSlack(channels=("C1", "C2")) as fake:
        settings = gateway_settings(
            store_url=f"sqlite:///{tmp_path}/store.db",
            broker_url=f"sqlite:///{tmp_path}/broker.db",
            web_url=f"sqlite:///{tmp_path}/web.db",
            plugin=AGENT,
            lease_seconds=6,
            renew_seconds=1,
            slack_bot_token=fake.bot_token,
            slack_signing_secret=SECRET,
            slack_api_url=fake.api_url,
            slack_stream=False,
            ops_tokens=(f"alice:operator:{OPERATOR}",),
        )
        service = Service(settings)
        await service.start()
        assert service.app is not None
        transport = httpx.ASGITransport(app=service.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            yield Rig(service, fake, http)
        await service.stop(drain_seconds=2)


def _bot_left(fake: FakeSlack, channel: str = "C1") -> dict[str, Any]:
    return {
        "type": "member_left_channel",
        "user": fake.bot_user_id,
        "channel": channel,
        "channel_type": "C",
        "team": TEAM_ID,
    }


async def _working(rig: Rig, channel: str, text: str) -> tuple[dict[str, Any], str]:
    """A mention starting a run in `channel`, once its tool runs; the event and its lane."""
    root = rig.fake.mention_event(channel, text)
    assert (await rig.event(root)).status_code == 200
    lane = f"slack:{channel}:{root['ts']}"
    await rig.until_record(f"slack-{channel}", lane, "tool_started")
    return root, lane


def _revoked_end(finished: OperationFinished, says: str) -> None:
    assert finished.outcome == "aborted"
    assert finished.error is not None
    assert finished.error.code == "authority_revoked"
    assert says in finished.error.message


async def test_the_bot_removed_mid_tool_ends_the_run_and_posts_nothing(rig: Rig) -> None:
    root, lane = await _working(rig, "C1", "/slow 2500")
    steer = rig.fake.post_user_message("C1", "and one more thing", thread_ts=root["ts"])
    assert (await rig.event(steer)).status_code == 200
    await rig.until_record("slack-C1", lane, "queue_enqueued")  # queued on the busy run
    since = len(rig.fake.calls)

    response = await rig.event(_bot_left(rig.fake), event_id="EvLeft1")
    assert response.status_code == 200, response.text

    finished = await rig.until_record("slack-C1", lane, "operation_finished")
    _revoked_end(finished, "the bot was removed from the channel")
    await asyncio.sleep(0.5)  # room for a wrong reply, a status, a reaction
    assert rig.calls_into("C1", since) == []  # the tool's answer never went out
    assert [m for m in rig.fake.thread("C1", root["ts"]) if m.bot_id] == []
    # the queued message is kept (its record) and was never run
    assert await lane_texts(_repo(rig), "slack-C1", lane) == ["/slow 2500"]
    [ended] = [e for e in await rig.audit("revoked run aborted") if e["lane"] == lane]
    assert ended["outcome"] == "authority_revoked"
    assert ended["details"]["queued_not_run"] == 1

    # Slack's retry of the event, and the same event under another id: nothing changes
    assert (await rig.event(_bot_left(rig.fake), event_id="EvLeft1")).status_code == 200
    assert (await rig.event(_bot_left(rig.fake), event_id="EvLeft2")).status_code == 200
    [revoked] = await rig.audit("authority revoked")
    assert revoked["details"]["scope_name"] == "slack space C1"

    # operators see why, when and by whom
    view = await rig.lane("slack-C1", lane)
    assert view["revoked"]["why"] == "the bot was removed from the channel"
    assert (view["revoked"]["scope"], view["revoked"]["by"]) == ("space", "slack")
    assert view["revoked"]["at_ms"] == revoked["details"]["at_ms"]
    assert (view["last_outcome"], view["error"]["code"]) == ("aborted", "authority_revoked")
    assert view["actions"] == ["unrevoke"]

    # a message that still reaches the thread is kept, not run, and nothing is said
    broker = rig.service.broker
    assert broker is not None
    refused = (await broker.inbox.backlog()).dead
    since = len(rig.fake.calls)
    late = rig.fake.post_user_message("C1", "are you there?", thread_ts=root["ts"])
    assert (await rig.event(late)).status_code == 200
    assert (await broker.inbox.backlog()).dead == refused + 1
    await asyncio.sleep(0.3)
    assert rig.calls_into("C1", since) == []  # not even the working reaction
    assert await lane_texts(_repo(rig), "slack-C1", lane) == ["/slow 2500"]


async def test_an_archived_channel_ends_a_wait_and_its_close_is_a_dead_letter(rig: Rig) -> None:
    root = rig.fake.mention_event("C1", "/deploy prod")
    assert (await rig.event(root)).status_code == 200
    lane = f"slack:C1:{root['ts']}"
    [request] = await _bot_messages(rig, "C1", root["ts"], 1)
    await rig.fake.wait_for_call("reactions.remove")  # the request answered the mention
    since = len(rig.fake.calls)

    archived = {"type": "channel_archive", "channel": "C1", "user": "U0ADMIN"}
    assert (await rig.event(archived)).status_code == 200

    finished = await rig.until_record("slack-C1", lane, "operation_finished")
    _revoked_end(finished, "the channel was archived")
    broker = rig.service.broker
    assert broker is not None

    async def dead_close() -> Any:
        dead = await broker.outbox.list("dead")
        return next((d for d in dead if d.id.startswith("approval_closed:")), None)

    close = await until(dead_close)
    assert close.last_error is not None and close.last_error.startswith("authority_revoked: ")
    await asyncio.sleep(0.3)
    assert rig.calls_into("C1", since) == []  # the request was never edited
    assert rig.fake.message("C1", request.ts).text == request.text
    view = await rig.lane("slack-C1", lane)
    assert (view["revoked"]["by"], view["revoked"]["scope"]) == ("slack:U0ADMIN", "space")


@pytest.mark.parametrize(
    ("event", "says"),
    [
        ({"type": "app_uninstalled"}, "the Slack app was uninstalled"),
        (
            {"type": "tokens_revoked", "tokens": {"oauth": ["U1"], "bot": ["UBOT"]}},
            "the bot's Slack token was revoked",
        ),
    ],
    ids=["app_uninstalled", "tokens_revoked"],
)
async def test_the_app_gone_ends_every_slack_run(
    rig: Rig, event: dict[str, Any], says: str
) -> None:
    _, first = await _working(rig, "C1", "/slow 2500")
    _, second = await _working(rig, "C2", "/slow 2500")
    since = len(rig.fake.calls)
    users_only = {"type": "tokens_revoked", "tokens": {"oauth": ["U1"], "bot": []}}
    assert (await rig.event(users_only)).status_code == 200  # the bot still posts
    assert (await rig.lane("slack-C1", first))["revoked"] is None

    assert (await rig.event(event)).status_code == 200

    for session, lane in (("slack-C1", first), ("slack-C2", second)):
        _revoked_end(await rig.until_record(session, lane, "operation_finished"), says)
        view = await rig.lane(session, lane)
        assert view["revoked"]["scope_name"] == "every slack thread"
    await asyncio.sleep(0.5)
    assert rig.calls_into("C1", since) == rig.calls_into("C2", since) == []


async def test_the_bot_added_again_gets_its_authority_back(rig: Rig) -> None:
    root = rig.fake.mention_event("C1", "hello")
    assert (await rig.event(root)).status_code == 200
    await _bot_messages(rig, "C1", root["ts"], 1)
    lane = f"slack:C1:{root['ts']}"
    someone = {**_bot_left(rig.fake), "user": "U1"}
    assert (await rig.event(someone)).status_code == 200  # another member: nothing
    assert (await rig.lane("slack-C1", lane))["revoked"] is None

    assert (await rig.event(_bot_left(rig.fake))).status_code == 200
    assert (await rig.lane("slack-C1", lane))["revoked"] is not None
    unarchived = {"type": "channel_unarchive", "channel": "C1", "user": "U1"}
    assert (await rig.event(unarchived)).status_code == 200  # lifts an archive, not a removal
    assert (await rig.lane("slack-C1", lane))["revoked"] is not None

    joined = {"type": "member_joined_channel", "user": rig.fake.bot_user_id, "channel": "C1"}
    assert (await rig.event({**joined, "channel_type": "C", "inviter": "U1"})).status_code == 200
    assert (await rig.lane("slack-C1", lane))["revoked"] is None
    [back] = await rig.audit("authority restored")
    assert back["details"]["restored_by"] == "slack:U1"
    again = rig.fake.post_user_message("C1", "still there?", thread_ts=root["ts"])
    assert (await rig.event(again)).status_code == 200
    replies = await _bot_messages(rig, "C1", root["ts"], 2)
    assert replies[1].text == "You said: still there?"


async def _bot_messages(rig: Rig, channel: str, root: str, count: int) -> list[Message]:
    async def found() -> list[Message] | None:
        messages = [m for m in rig.fake.thread(channel, root) if m.bot_id]
        return messages if len(messages) >= count else None

    return await until(found)


def _repo(rig: Rig) -> Any:
    assert rig.service.repo is not None
    return rig.service.repo


async def test_another_workspace_s_events_change_nothing_here(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """An app installed in two workspaces gets both's events at one URL, signed alike: the
    other's ``app_uninstalled`` cut the bot off in every thread here, and its mentions were
    answered with this workspace's token."""
    root = rig.fake.mention_event("C1", "hello")
    assert (await rig.event(root)).status_code == 200
    await _bot_messages(rig, "C1", root["ts"], 1)
    lane = f"slack:C1:{root['ts']}"
    since = len(rig.fake.calls)

    with caplog.at_level("WARNING", logger="adapters.slack"):
        gone = await rig.event({"type": "app_uninstalled"}, team_id="T999")
        theirs = rig.fake.mention_event("C2", "answer me from T999")
        asked = await rig.event(theirs, team_id="T999")
    assert (gone.status_code, asked.status_code) == (200, 200)  # acknowledged, not taken
    assert (await rig.lane("slack-C1", lane))["revoked"] is None
    said = [
        r for r in caplog.records if r.getMessage() == "slack event of another workspace ignored"
    ]
    assert len(said) == 1 and getattr(said[0], "team", None) == "T999"  # said once

    again = rig.fake.post_user_message("C1", "still there?", thread_ts=root["ts"])
    assert (await rig.event(again)).status_code == 200  # ours: answered
    replies = await _bot_messages(rig, "C1", root["ts"], 2)
    assert replies[1].text == "You said: still there?"
    await asyncio.sleep(0.5)
    assert rig.calls_into("C2", since) == []  # the other workspace's mention: never answered
