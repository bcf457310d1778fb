"""The Slack app manifests ask for exactly what the code uses, and every event they subscribe is
acknowledged by the real bolt app (an unhandled one would be answered 404 and retried by Slack).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from slack_bolt.request.async_request import AsyncBoltRequest

from adapters.slack import SlackChannel
from adapters.slack.authority import AUTHORITY_EVENTS
from tests.adapters.kit import TestSink
from tests.support.fake_slack import FakeSlack, event_envelope, signed_headers

ROOT = Path(__file__).resolve().parents[3]
MANIFESTS = [ROOT / "adapters/slack/manifest.json", ROOT / "adapters/slack/manifest-http.json"]
SOURCES = sorted((ROOT / "adapters/slack").glob("*.py"))

# The bot scopes Slack's documentation lists for each Web API method the adapter calls (for
# history reads: one per kind of conversation the bot serves).
HISTORY = {"channels:history", "groups:history", "im:history", "mpim:history"}
METHOD_SCOPES: dict[str, set[str]] = {
    "auth_test": set(),
    "apps_connections_open": set(),  # the app-level token's connections:write, no bot scope
    "chat_postMessage": {"chat:write"},
    "chat_postEphemeral": {"chat:write"},
    "chat_update": {"chat:write"},
    "conversations_replies": HISTORY,
    "conversations_history": HISTORY,
    "reactions_add": {"reactions:write"},
    "reactions_remove": {"reactions:write"},
    "usergroups_users_list": {"usergroups:read"},
    "views_open": set(),
    "chat_getPermalink": set(),
    "users_conversations": {"channels:read", "groups:read", "im:read", "mpim:read"},
    # accepts chat:write or assistant:write (Slack's changelog, 2026-03-05); chat:write is kept
    "assistant_threads_setStatus": {"chat:write"},
    "chat_stream": {"chat:write"},  # slack_sdk's helper: chat.startStream and chat.appendStream
    "chat_stopStream": {"chat:write"},
    "chat_delete": {"chat:write"},
    # files upload v2 (what slack_sdk's files_upload_v2 calls)
    "files_getUploadURLExternal": {"files:write"},
    "files_completeUploadExternal": {"files:write"},
}
FEATURE_SCOPES = {"assistant_view": {"assistant:write"}}
"""The Agents & AI Apps feature (the assistant thread view, its status) asks for its scope."""
EVENT_SCOPES = {
    "app_mention": {"app_mentions:read"},
    "message.channels": {"channels:history"},
    "message.groups": {"groups:history"},
    "message.im": {"im:history"},
    "message.mpim": {"mpim:history"},
    # authority (D267): a channel's archive, a left or joined member, the app's own events
    "channel_archive": {"channels:read"},
    "channel_unarchive": {"channels:read"},
    "channel_deleted": {"channels:read"},
    "channel_left": {"channels:read"},
    "group_archive": {"groups:read"},
    "group_unarchive": {"groups:read"},
    "group_deleted": {"groups:read"},
    "group_left": {"groups:read"},
    "member_joined_channel": {"channels:read", "groups:read"},
    "member_left_channel": {"channels:read", "groups:read"},
    "app_uninstalled": set(),
    "tokens_revoked": set(),
}


def _load(path: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return manifest


def test_the_scopes_are_exactly_what_the_calls_and_events_need() -> None:
    called = {
        method
        for source in SOURCES
        for method in re.findall(
            r"self\.(?:link\.)?client\.(\w+)\b", source.read_text(encoding="utf-8")
        )
    }
    assert {"chat_postMessage", "auth_test", "views_open"} <= called  # every part is read
    unknown = called - set(METHOD_SCOPES)
    assert unknown == set(), f"add the scopes of {unknown} to this test and the manifests"
    needed = set().union(*(METHOD_SCOPES[m] for m in called))
    if any("url_private" in source.read_text(encoding="utf-8") for source in SOURCES):
        needed.add("files:read")  # shared files are fetched from url_private (D226)
    for path in MANIFESTS:
        manifest = _load(path)
        events = manifest["settings"]["event_subscriptions"]["bot_events"]
        needed_here = needed | set().union(*(EVENT_SCOPES[e] for e in events))
        needed_here |= set().union(*(FEATURE_SCOPES.get(f, set()) for f in manifest["features"]))
        assert set(manifest["oauth_config"]["scopes"]["bot"]) == needed_here, path.name


def test_the_two_manifests_differ_only_in_how_slack_reaches_the_app() -> None:
    socket, http = (_load(path) for path in MANIFESTS)
    assert socket["settings"]["socket_mode_enabled"] is True
    assert http["settings"]["socket_mode_enabled"] is False
    url = http["settings"]["event_subscriptions"].pop("request_url")
    assert url.endswith("/slack/events")
    assert http["settings"]["interactivity"].pop("request_url") == url
    http["settings"]["socket_mode_enabled"] = True
    assert http == socket
    assert socket["settings"]["interactivity"]["is_enabled"] is True
    assert socket["features"]["app_home"]["messages_tab_enabled"] is True  # DMs
    assert socket["features"]["assistant_view"]["assistant_description"]  # Agents & AI Apps


@pytest.fixture
async def slack() -> AsyncIterator[SlackChannel]:
    async with FakeSlack(channels=("C1", "G1", "D1")) as fake:
        channel = SlackChannel(bot_token=fake.bot_token, signing_secret="s", api_url=fake.api_url)
        await channel.start(TestSink(routes={"C1": "s1", "G1": "s1", "D1": "s1"}))
        yield channel
        await channel.close()


async def _dispatch(slack: SlackChannel, event: dict[str, Any]) -> Any:
    raw = json.dumps(event_envelope(event))
    headers: dict[str, str | Sequence[str]] = {
        k.lower(): v for k, v in signed_headers(raw, "s").items()
    }
    headers["content-type"] = "application/json"
    return await slack.app.async_dispatch(AsyncBoltRequest(body=raw, headers=headers))


@pytest.mark.parametrize(
    "event_type", ["app_mention", "message.channels", "message.groups", "message.im"]
)
async def test_every_subscribed_event_is_acknowledged(slack: SlackChannel, event_type: str) -> None:
    subscribed = _load(MANIFESTS[0])["settings"]["event_subscriptions"]["bot_events"]
    assert event_type in subscribed
    kind = event_type.split(".")[0]
    channel = {"message.groups": "G1", "message.im": "D1"}.get(event_type, "C1")
    event = {"type": kind, "channel": channel, "user": "U1", "text": "<@UBOT> hi", "ts": "1.01"}
    response = await _dispatch(slack, event)
    assert response.status == 200, response.body


@pytest.mark.parametrize("event_type", sorted(AUTHORITY_EVENTS))
async def test_every_subscribed_authority_event_is_acknowledged(
    slack: SlackChannel, event_type: str
) -> None:
    subscribed = _load(MANIFESTS[0])["settings"]["event_subscriptions"]["bot_events"]
    assert event_type in subscribed
    event = {"type": event_type, "channel": "C1", "user": "U1", "tokens": {"oauth": ["U1"]}}
    response = await _dispatch(slack, event)
    assert response.status == 200, response.body


async def test_an_event_type_nobody_subscribed_is_still_acknowledged(slack: SlackChannel) -> None:
    response = await _dispatch(slack, {"type": "team_join", "user": {"id": "U1"}})
    assert response.status == 200


async def test_a_failed_identity_check_at_start_does_not_take_others_mentions() -> None:
    async with FakeSlack() as fake:
        fake.fail("auth.test", error="internal_error")  # our check at start fails; bolt's works
        sink = TestSink(routes={"C1": "s1"})
        channel = SlackChannel(bot_token=fake.bot_token, signing_secret="s", api_url=fake.api_url)
        await channel.start(sink)
        try:
            other = {"type": "message", "channel": "C1", "user": "U1", "ts": "1.01"}
            response = await _dispatch(channel, {**other, "text": "<@U0OTHER> hi"})
            assert response.status == 200
            assert sink.inbound == []  # a mention of someone else is not for the bot
            mention = {**other, "ts": "1.02", "text": f"<@{fake.bot_user_id}> hi"}
            assert (await _dispatch(channel, mention)).status == 200
            assert [m.text for m in sink.inbound] == ["hi"]
        finally:
            await channel.close()
