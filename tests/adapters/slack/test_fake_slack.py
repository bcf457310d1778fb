"""FakeSlack proven against the real slack_sdk and slack_bolt, not against itself.

Web API calls go through ``AsyncWebClient(base_url=fake.api_url)``, Socket Mode through Bolt's
``AsyncSocketModeHandler``, signatures through ``SignatureVerifier`` and Bolt's own request
verification.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any

import aiohttp
import pytest
from slack_bolt import BoltResponse
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncAck, AsyncApp, AsyncRespond, AsyncSay
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient

from tests.support.fake_slack import (
    BOT_USER_ID,
    FakeSlack,
    event_envelope,
    form_body,
    signed_headers,
)

SECRET = "shh-signing-secret"


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as running:
        yield running


def web_client(fake: FakeSlack, **kwargs: Any) -> AsyncWebClient:
    return AsyncWebClient(token=fake.bot_token, base_url=fake.api_url, **kwargs)


async def slack_error(call: Awaitable[Any]) -> str:
    with pytest.raises(SlackApiError) as raised:
        await call
    return str(raised.value.response["error"])


def approval_blocks(request_id: str) -> list[dict[str, Any]]:
    return [
        {"type": "section", "text": {"type": "mrkdwn", "text": "Deploy build 42?"}},
        {
            "type": "actions",
            "block_id": "approval",
            "elements": [
                {
                    "type": "button",
                    "action_id": "approve",
                    "style": "primary",
                    "value": request_id,
                    "text": {"type": "plain_text", "text": "Approve"},
                },
                {
                    "type": "button",
                    "action_id": "deny",
                    "style": "danger",
                    "value": request_id,
                    "text": {"type": "plain_text", "text": "Deny"},
                },
            ],
        },
    ]


# -------------------------------------------------------------------------------------------------
# Web API


async def test_auth_test_names_the_bot(fake: FakeSlack) -> None:
    response = await web_client(fake).auth_test()
    assert response["user_id"] == "UBOT"
    assert response["bot_id"] == "BBOT"
    assert response["team_id"] == "T1"
    [call] = fake.calls_to("auth.test")
    assert call.token == "xoxb-test"
    assert fake.api_url == f"http://127.0.0.1:{fake.port}/api/"


async def test_metadata_is_listed_only_with_include_all_metadata(fake: FakeSlack) -> None:
    client = web_client(fake)
    root = fake.post_user_message("C1", "deploy please")
    metadata = {"event_type": "gateway_reply", "event_payload": {"turn": "t-1", "n": 2}}
    posted = await client.chat_postMessage(
        channel="C1", thread_ts=root["ts"], text="on it", metadata=metadata, unfurl_links=False
    )
    assert posted["message"]["metadata"] == metadata
    assert posted["message"]["bot_id"] == "BBOT"
    stored = fake.message("C1", posted["ts"])
    assert (stored.user, stored.thread_ts, stored.metadata) == ("UBOT", root["ts"], metadata)

    with_metadata = await client.conversations_replies(
        channel="C1", ts=root["ts"], include_all_metadata=True
    )
    messages = with_metadata["messages"]
    assert [m["ts"] for m in messages] == [root["ts"], posted["ts"]]
    assert messages[0]["reply_count"] == 1
    assert messages[0]["thread_ts"] == root["ts"]
    assert messages[1]["metadata"] == metadata
    assert messages[1]["parent_user_id"] == "U1"

    plain = await client.conversations_replies(channel="C1", ts=root["ts"])
    assert all("metadata" not in m for m in plain["messages"])
    # conversations.replies is a GET with a query string; the flag arrived as "1".
    assert fake.calls_to("conversations.replies")[0].http_method == "GET"


async def test_replies_paginate_through_the_sdk_iterator(fake: FakeSlack) -> None:
    client = web_client(fake)
    root = fake.post_user_message("C1", "thread")
    replies = [fake.post_user_message("C1", f"r{i}", thread_ts=root["ts"]) for i in range(4)]
    first = await client.conversations_replies(channel="C1", ts=root["ts"], limit=2)
    pages: list[list[str]] = []
    has_more: list[bool] = []
    # The SDK's iterator refills the same response object with each page.
    async for page in first:
        pages.append([m["ts"] for m in page["messages"]])
        has_more.append(page["has_more"])
    assert pages == [
        [root["ts"], replies[0]["ts"]],
        [replies[1]["ts"], replies[2]["ts"]],
        [replies[3]["ts"]],
    ]
    assert has_more == [True, True, False]
    assert [c.params.get("cursor") is None for c in fake.calls] == [True, False, False]

    # Any message of the thread names it; a window cuts it (exclusive unless inclusive).
    by_reply = await client.conversations_replies(channel="C1", ts=replies[2]["ts"])
    assert len(by_reply["messages"]) == 5
    window = await client.conversations_replies(
        channel="C1", ts=root["ts"], oldest=replies[0]["ts"], latest=replies[2]["ts"]
    )
    assert [m["ts"] for m in window["messages"]] == [replies[1]["ts"]]
    inclusive = await client.conversations_replies(
        channel="C1",
        ts=root["ts"],
        oldest=replies[0]["ts"],
        latest=replies[2]["ts"],
        inclusive=True,
    )
    assert len(inclusive["messages"]) == 3
    assert await slack_error(client.conversations_replies(channel="C1", ts="1.000001")) == (
        "thread_not_found"
    )


async def test_history_lists_top_level_messages_newest_first(fake: FakeSlack) -> None:
    client = web_client(fake)
    fake.add_message("C1", "old", ts="1600000000.000100")
    first = fake.post_user_message("C1", "one")
    fake.post_user_message("C1", "reply", thread_ts=first["ts"])
    second = await client.chat_postMessage(channel="C1", text="two")
    history = await client.conversations_history(channel="C1", limit=2)
    assert [m["ts"] for m in history["messages"]] == [second["ts"], first["ts"]]
    assert history["has_more"] is True
    rest = await client.conversations_history(
        channel="C1", cursor=history["response_metadata"]["next_cursor"]
    )
    assert [m["text"] for m in rest["messages"]] == ["old"]
    # Generated ts values keep increasing past injected ones.
    assert float(second["ts"]) > float(first["ts"]) > 1_600_000_000.0001


async def test_form_encoded_bodies_are_accepted(fake: FakeSlack) -> None:
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "*hi*"}}]
    response = await web_client(fake).api_call(
        "chat.postMessage", data={"channel": "C1", "text": "hi", "blocks": json.dumps(blocks)}
    )
    assert response["ok"] is True
    assert fake.message("C1", response["ts"]).blocks == blocks


async def test_update_reactions_and_limits(fake: FakeSlack) -> None:
    client = web_client(fake)
    posted = await client.chat_postMessage(
        channel="C1", text="Deploy?", blocks=approval_blocks("r1")
    )
    updated = await client.chat_update(channel="C1", ts=posted["ts"], text="approved", blocks=[])
    assert updated["message"]["text"] == "approved"
    stored = fake.message("C1", posted["ts"])
    assert stored.blocks is None and stored.edited is not None

    await client.reactions_add(channel="C1", timestamp=posted["ts"], name="eyes")
    assert fake.message("C1", posted["ts"]).reactions == {"eyes": ["UBOT"]}
    assert await slack_error(
        client.reactions_add(channel="C1", timestamp=posted["ts"], name=":eyes:")
    ) == ("already_reacted")
    await client.reactions_remove(channel="C1", timestamp=posted["ts"], name="eyes")
    assert await slack_error(
        client.reactions_remove(channel="C1", timestamp=posted["ts"], name="eyes")
    ) == ("no_reaction")

    user = fake.post_user_message("C1", "mine")
    too_many = [{"type": "divider"}] * 51
    errors = [
        await slack_error(client.chat_postMessage(channel="C404", text="x")),
        await slack_error(client.chat_postMessage(channel="C1", text="x" * 40_001)),
        await slack_error(client.chat_postMessage(channel="C1", text="x", blocks=too_many)),
        await slack_error(client.chat_update(channel="C1", ts="1.000001", text="x")),
        await slack_error(client.chat_update(channel="C1", ts=user["ts"], text="x")),
    ]
    assert errors == [
        "channel_not_found",
        "msg_too_long",
        "invalid_blocks",
        "message_not_found",
        "cant_update_message",
    ]
    # 40,000 characters and 50 blocks are still fine.
    await client.chat_postMessage(channel="C1", text="x" * 40_000, blocks=too_many[:50])


async def test_ephemerals_usergroups_users_and_views(fake: FakeSlack) -> None:
    client = web_client(fake)
    fake.usergroups["S1"] = ["U1", "U2"]
    assert (await client.usergroups_users_list(usergroup="S1"))["users"] == ["U1", "U2"]
    assert await slack_error(client.usergroups_users_list(usergroup="S9")) == "no_such_subteam"

    info = await client.users_info(user="U7")
    assert info["user"]["name"] == "u7"

    await client.chat_postEphemeral(channel="C1", user="U2", text="only you", thread_ts="1.5")
    [ephemeral] = fake.ephemerals
    assert (ephemeral.user, ephemeral.text, ephemeral.thread_ts) == ("U2", "only you", "1.5")
    assert fake.messages("C1") == []

    view = {
        "type": "modal",
        "callback_id": "deny_reason",
        "private_metadata": "req-1",
        "title": {"type": "plain_text", "text": "Why?"},
        "blocks": [],
    }
    opened = await client.views_open(trigger_id="123.456.abc", view=view)
    view_id = opened["view"]["id"]
    assert fake.views[view_id]["callback_id"] == "deny_reason"
    submit = fake.view_submission_payload(
        view_id, values={"reason": {"text": {"type": "plain_text_input", "value": "risky"}}}
    )
    assert submit["view"]["private_metadata"] == "req-1"
    assert submit["view"]["state"]["values"]["reason"]["text"]["value"] == "risky"


async def test_unknown_methods_are_answered_and_recorded(fake: FakeSlack) -> None:
    assert await slack_error(web_client(fake).api_call("pins.add", json={"x": 1})) == (
        "unknown_method"
    )
    [call] = fake.calls_to("pins.add")
    assert call.params == {"x": 1} and call.error == "unknown_method"


async def test_tokens_are_checked(fake: FakeSlack) -> None:
    wrong = AsyncWebClient(token="xoxb-wrong", base_url=fake.api_url)
    assert await slack_error(wrong.chat_postMessage(channel="C1", text="x")) == "invalid_auth"
    app_token = AsyncWebClient(token=fake.app_token, base_url=fake.api_url)
    assert await slack_error(app_token.chat_postMessage(channel="C1", text="x")) == (
        "not_allowed_token_type"
    )
    anonymous = AsyncWebClient(base_url=fake.api_url)
    assert await slack_error(anonymous.auth_test()) == "not_authed"
    # apps.connections.open wants the app token, passed per call by the SDK.
    bot = web_client(fake)
    assert await slack_error(bot.apps_connections_open(app_token="xapp-wrong")) == "invalid_auth"
    opened = await bot.apps_connections_open(app_token=fake.app_token)
    assert opened["url"].startswith(f"ws://127.0.0.1:{fake.port}/link")
    assert fake.messages("C1") == []


# -------------------------------------------------------------------------------------------------
# Faults


async def test_a_429_is_retried_by_the_rate_limit_handler(fake: FakeSlack) -> None:
    fake.rate_limit("chat.postMessage", times=1, retry_after=0)
    client = web_client(fake, retry_handlers=[AsyncRateLimitErrorRetryHandler(max_retry_count=1)])
    response = await client.chat_postMessage(channel="C1", text="after the limit")
    assert response["ok"] is True
    calls = fake.calls_to("chat.postMessage")
    assert [call.status for call in calls] == [429, 200]
    assert len(fake.messages("C1")) == 1


async def test_a_429_without_the_handler_is_an_error_with_retry_after(fake: FakeSlack) -> None:
    fake.rate_limit("chat.postMessage", retry_after=7)
    with pytest.raises(SlackApiError) as raised:
        await web_client(fake).chat_postMessage(channel="C1", text="x")
    assert raised.value.response.status_code == 429
    assert raised.value.response["error"] == "ratelimited"
    assert raised.value.response.headers["Retry-After"] == "7"
    assert fake.messages("C1") == []


async def test_scripted_failures_are_taken_in_order(fake: FakeSlack) -> None:
    client = web_client(fake)
    fake.fail("chat.postMessage", error="fatal_error")
    fake.fail("chat.postMessage", status=503, times=2)
    assert await slack_error(client.chat_postMessage(channel="C1", text="x")) == "fatal_error"
    for _ in range(2):
        with pytest.raises(SlackApiError) as raised:
            await client.chat_postMessage(channel="C1", text="x")
        assert raised.value.response.status_code == 503
    assert (await client.chat_postMessage(channel="C1", text="x"))["ok"] is True
    assert [c.status for c in fake.calls_to("chat.postMessage")] == [200, 503, 503, 200]


async def test_a_lost_response_raises_but_the_message_is_stored(fake: FakeSlack) -> None:
    fake.lose_response("chat.postMessage")
    client = web_client(fake, timeout=2, retry_handlers=[])
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await client.chat_postMessage(channel="C1", text="did it post?")
    [stored] = fake.messages("C1")
    assert stored.text == "did it post?"
    [call] = fake.calls_to("chat.postMessage")
    assert call.lost and call.ok


async def test_the_default_client_retries_a_dropped_response_and_posts_twice(
    fake: FakeSlack,
) -> None:
    # async_default_handlers() = [AsyncConnectionErrorRetryHandler()]: a dropped connection is
    # retried once, so a post whose answer was lost is made again.
    fake.lose_response("chat.postMessage")
    response = await web_client(fake, timeout=5).chat_postMessage(channel="C1", text="dup")
    assert response["ok"] is True
    assert [m.text for m in fake.messages("C1")] == ["dup", "dup"]


async def test_a_hung_response_times_out_and_is_not_retried(fake: FakeSlack) -> None:
    fake.lose_response("chat.postMessage", hang=True)
    with pytest.raises(asyncio.TimeoutError):
        await web_client(fake, timeout=1).chat_postMessage(channel="C1", text="slow")
    assert len(fake.calls_to("chat.postMessage")) == 1
    assert [m.text for m in fake.messages("C1")] == ["slow"]


async def test_delay_and_wait_for_call(fake: FakeSlack) -> None:
    fake.delay("auth.test", 0.3)
    client = web_client(fake)
    started = time.monotonic()
    pending = asyncio.ensure_future(client.auth_test())
    [call] = await fake.wait_for_call("auth.test")
    assert time.monotonic() - started >= 0.3
    assert call.ok
    await pending
    with pytest.raises(AssertionError, match="2 call"):
        await fake.wait_for_call("auth.test", count=2, timeout=0.1)


async def test_base_url_slash_is_added_by_the_sdk_and_a_wrong_path_fails_loudly(
    fake: FakeSlack,
) -> None:
    no_slash = AsyncWebClient(token=fake.bot_token, base_url=fake.api_url.rstrip("/"))
    assert (await no_slash.auth_test())["ok"] is True
    no_api = AsyncWebClient(token=fake.bot_token, base_url=fake.base_url)
    assert await slack_error(no_api.auth_test()) == "fake_slack_no_route"
    assert len(fake.calls) == 1


# -------------------------------------------------------------------------------------------------
# Socket Mode with Bolt


@pytest.fixture
async def app(fake: FakeSlack) -> AsyncApp:
    return AsyncApp(client=web_client(fake))


@pytest.fixture
async def handler(app: AsyncApp, fake: FakeSlack) -> AsyncIterator[AsyncSocketModeHandler]:
    # The handler's web client defaults to app.client, so apps.connections.open goes to the fake.
    socket_mode = AsyncSocketModeHandler(app, fake.app_token)
    yield socket_mode
    await socket_mode.close_async()  # type: ignore[no-untyped-call]


async def test_bolt_receives_a_mention_acks_it_and_reconnects(
    fake: FakeSlack, app: AsyncApp, handler: AsyncSocketModeHandler
) -> None:
    seen: list[dict[str, Any]] = []

    @app.event("app_mention")
    async def on_mention(event: dict[str, Any], say: AsyncSay) -> None:
        seen.append(event)
        await say(text="on it", thread_ts=event.get("thread_ts") or event["ts"])

    await handler.connect_async()  # type: ignore[no-untyped-call]
    await fake.wait_connected(1)
    mention = fake.mention_event("C1", "deploy build 42")
    assert mention["text"] == f"<@{BOT_USER_ID}> deploy build 42"
    envelope_id = await fake.send_event(mention)
    assert await fake.wait_ack(envelope_id) == {"envelope_id": envelope_id}
    [post] = await fake.wait_for_call("chat.postMessage")
    assert post.params["thread_ts"] == mention["ts"]
    assert seen[0]["ts"] == mention["ts"]
    assert [c.method for c in fake.calls][:2] == ["apps.connections.open", "auth.test"]

    await fake.disconnect_socket()
    await fake.wait_connected(2)
    assert len(fake.calls_to("apps.connections.open")) == 2
    again = await fake.send_event(fake.mention_event("C1", "again"), retry_attempt=1)
    await fake.wait_ack(again)
    await fake.wait_for_call("chat.postMessage", count=2)

    await fake.disconnect_socket(refresh=True)
    await fake.wait_connected(3)
    third = await fake.send_event(fake.mention_event("C1", "third"))
    await fake.wait_ack(third)


async def test_an_unhandled_event_is_not_acked_in_socket_mode(
    fake: FakeSlack, app: AsyncApp, handler: AsyncSocketModeHandler
) -> None:
    @app.event("app_mention")
    async def on_mention() -> None:
        return None

    await handler.connect_async()  # type: ignore[no-untyped-call]
    root = fake.post_user_message("C1", "hello")
    reaction = {
        "type": "reaction_added",
        "user": "U1",
        "reaction": "eyes",
        "item": {"type": "message", "channel": "C1", "ts": root["ts"]},
        "event_ts": root["ts"],
    }
    unhandled = await fake.send_event(reaction)
    handled = await fake.send_event(fake.mention_event("C1", "hi"))
    await fake.wait_ack(handled)
    # Bolt answers 404 for an event without a listener, and the handler sends no ack then, so
    # Slack would redeliver it.
    with pytest.raises(AssertionError, match="an ack of"):
        await fake.wait_ack(unhandled, timeout=0.3)


async def test_bolt_button_click_updates_the_message_and_responds(
    fake: FakeSlack, app: AsyncApp, handler: AsyncSocketModeHandler
) -> None:
    decisions: list[tuple[str, str, str]] = []

    @app.action(re.compile("^(approve|deny)$"))
    async def on_decision(
        ack: AsyncAck,
        body: dict[str, Any],
        action: dict[str, Any],
        respond: AsyncRespond,
        client: AsyncWebClient,
    ) -> None:
        await ack()
        decisions.append((body["user"]["id"], action["action_id"], action["value"]))
        await client.chat_update(
            channel=body["channel"]["id"], ts=body["message"]["ts"], text="approved", blocks=[]
        )
        await respond(text="recorded", replace_original=False, response_type="ephemeral")

    @app.view("deny_reason")
    async def on_submit(ack: AsyncAck, view: dict[str, Any]) -> None:
        await ack(response_action="errors", errors={"reason": "too short"})

    await handler.connect_async()  # type: ignore[no-untyped-call]
    root = fake.post_user_message("C1", "deploy?")
    posted = await web_client(fake).chat_postMessage(
        channel="C1", thread_ts=root["ts"], text="Deploy?", blocks=approval_blocks("req-1")
    )
    click = fake.block_actions_payload("C1", posted["ts"], "approve", user="U2")
    assert click["container"]["thread_ts"] == root["ts"]
    assert click["actions"][0]["block_id"] == "approval"
    envelope_id = await fake.send_interactive(click)
    await fake.wait_ack(envelope_id)
    [response] = await fake.wait_for_response()
    assert response.body["text"] == "recorded"
    assert decisions == [("U2", "approve", "req-1")]
    await fake.wait_for_call("chat.update")
    assert fake.message("C1", posted["ts"]).text == "approved"
    assert [(e.user, e.via) for e in fake.ephemerals] == [("U2", "response_url")]

    submit = fake.view_submission_payload(callback_id="deny_reason", private_metadata="req-1")
    submitted = await fake.send_interactive(submit)
    ack = await fake.wait_ack(submitted)
    assert ack["payload"] == {"response_action": "errors", "errors": {"reason": "too short"}}


# -------------------------------------------------------------------------------------------------
# HTTP-mode builders


def test_signed_headers_pass_the_sdk_verifier() -> None:
    raw = json.dumps(event_envelope({"type": "app_mention", "text": "hi"}))
    headers = signed_headers(raw, SECRET)
    verifier = SignatureVerifier(SECRET)
    timestamp = headers["X-Slack-Request-Timestamp"]
    assert verifier.is_valid(raw, timestamp, headers["X-Slack-Signature"])
    assert not verifier.is_valid(raw + " ", timestamp, headers["X-Slack-Signature"])
    old = signed_headers(raw, SECRET, timestamp=int(time.time()) - 400)
    assert not verifier.is_valid(raw, old["X-Slack-Request-Timestamp"], old["X-Slack-Signature"])


async def test_bolt_http_mode_accepts_a_signed_form_body(fake: FakeSlack) -> None:
    app = AsyncApp(client=web_client(fake), signing_secret=SECRET)
    clicks: list[str] = []

    @app.action("deny")
    async def on_deny(ack: AsyncAck, action: dict[str, Any]) -> None:
        # Before ack(): async_dispatch returns as soon as the listener acks.
        clicks.append(action["value"])
        await ack()

    posted = fake.add_message("C1", "Deploy?", bot=True, blocks=approval_blocks("req-9"))
    raw = form_body(fake.block_actions_payload("C1", posted.ts, "deny"))

    def request(body: str, headers: dict[str, str]) -> AsyncBoltRequest:
        lowered: dict[str, str | Sequence[str]] = {k.lower(): [v] for k, v in headers.items()}
        lowered["content-type"] = ["application/x-www-form-urlencoded"]
        return AsyncBoltRequest(body=body, headers=lowered)

    answer: BoltResponse = await app.async_dispatch(request(raw, signed_headers(raw, SECRET)))
    assert answer.status == 200
    assert clicks == ["req-9"]
    forged = await app.async_dispatch(request(raw, signed_headers(raw, "other-secret")))
    assert forged.status == 401


def test_event_builders_have_slacks_shape() -> None:
    fake = FakeSlack()
    root = fake.post_user_message("C1", "hello <@U2>")
    assert root["channel_type"] == "channel" and "thread_ts" not in root
    assert root["blocks"][0]["elements"][0]["elements"][1] == {"type": "user", "user_id": "U2"}
    reply = fake.post_user_message("C1", "in thread", user="U3", thread_ts=root["ts"])
    assert reply["thread_ts"] == root["ts"] and reply["parent_user_id"] == "U1"
    mention = fake.mention_event("C1", f"<@{BOT_USER_ID}> hi", thread_ts=root["ts"])
    assert mention["type"] == "app_mention" and mention["thread_ts"] == root["ts"]
    assert fake.message_event("C1", mention["ts"])["type"] == "message"
    first, second = event_envelope(root), event_envelope(root)
    assert first["type"] == "event_callback" and first["event"] == root
    assert first["event_id"] != second["event_id"]
    assert first["authorizations"][0]["user_id"] == BOT_USER_ID
    edited = fake.edit_user_message("C1", root["ts"], "hello again")
    assert edited["subtype"] == "message_changed"
    assert edited["previous_message"]["text"] == "hello <@U2>"
    assert edited["message"]["text"] == "hello again"


# ---- Agents & AI Apps: thread status, streams


async def test_a_stream_through_slack_sdks_helper_grows_one_message_until_stopped(
    fake: FakeSlack,
) -> None:
    client = web_client(fake)
    root = fake.add_message("C1", "question")
    stream = await client.chat_stream(
        channel="C1",
        thread_ts=root.ts,
        recipient_team_id=fake.team_id,
        recipient_user_id="U1",
        buffer_size=1,
    )
    started = await stream.append(markdown_text="**hello")
    assert started is not None and started["ok"] and started["channel"] == "C1"
    assert started["ts"] == stream.ts
    message = fake.message("C1", str(stream.ts))
    assert message.streaming and message.text == "**hello" and message.thread_ts == root.ts
    listed = await client.conversations_replies(channel="C1", ts=root.ts)
    assert [m["text"] for m in listed["messages"]] == ["question", "**hello"]
    appended = await stream.append(markdown_text=" world**")
    assert appended is not None and appended["ts"] == stream.ts
    stopped = await stream.stop(metadata={"event_type": "e", "event_payload": {"k": 1}})
    assert stopped["message"]["text"] == "**hello world**"
    assert stopped["message"]["subtype"] == "bot_message"
    assert fake.streams() == []
    assert message.metadata == {"event_type": "e", "event_payload": {"k": 1}}
    late = client.chat_appendStream(channel="C1", ts=str(stream.ts), markdown_text="!")
    assert await slack_error(late) == "message_not_in_streaming_state"
    again = client.chat_stopStream(channel="C1", ts=str(stream.ts))
    assert await slack_error(again) == "message_not_in_streaming_state"


async def test_a_stream_in_a_channel_names_its_recipient(fake: FakeSlack) -> None:
    client = web_client(fake)
    root = fake.add_message("C1", "question")
    start = client.chat_startStream(channel="C1", thread_ts=root.ts, markdown_text="hi")
    assert await slack_error(start) == "missing_recipient_team_id"
    fake.add_channel("D1")
    dm_root = fake.add_message("D1", "question")
    ok = await client.chat_startStream(channel="D1", thread_ts=dm_root.ts, markdown_text="hi")
    assert ok["ok"] and fake.streams("D1")[0].text == "hi"
    wrong = client.chat_appendStream(channel="C1", ts="1.000001", markdown_text="x")
    assert await slack_error(wrong) == "message_not_found"


async def test_a_rate_limited_append_answers_429_and_leaves_the_stream_as_it_was(
    fake: FakeSlack,
) -> None:
    client = web_client(fake)
    root = fake.add_message("C1", "question")
    fake.rate_limit("chat.appendStream", retry_after=7)
    started = await client.chat_startStream(
        channel="C1", thread_ts=root.ts, recipient_team_id="T1", recipient_user_id="U1"
    )
    with pytest.raises(SlackApiError) as raised:
        await client.chat_appendStream(channel="C1", ts=started["ts"], markdown_text="x")
    assert raised.value.response.status_code == 429
    assert raised.value.response.headers["Retry-After"] == "7"
    assert raised.value.response["error"] == "ratelimited"
    assert fake.message("C1", started["ts"]).text == ""


async def test_the_thread_status_is_set_cleared_and_taken_down_by_a_reply(fake: FakeSlack) -> None:
    client = web_client(fake)
    root = fake.add_message("C1", "question")
    answer = await client.assistant_threads_setStatus(
        channel_id="C1", thread_ts=root.ts, status="is thinking…"
    )
    assert answer.data == {"ok": True}
    assert fake.statuses == {("C1", root.ts): "is thinking…"}
    await client.assistant_threads_setStatus(channel_id="C1", thread_ts=root.ts, status="")
    assert fake.statuses == {}
    await client.assistant_threads_setStatus(channel_id="C1", thread_ts=root.ts, status="is x…")
    await client.chat_postMessage(channel="C1", thread_ts=root.ts, text="done")
    assert fake.statuses == {}
    assert [s for _, _, s in fake.status_log] == ["is thinking…", "", "is x…", ""]
    bad = client.assistant_threads_setStatus(channel_id="C9", thread_ts=root.ts, status="x")
    assert await slack_error(bad) == "channel_not_found"
    fake.unsupport("assistant.threads.setStatus", "missing_scope")
    refused = client.assistant_threads_setStatus(channel_id="C1", thread_ts=root.ts, status="x")
    assert await slack_error(refused) == "missing_scope"
    assert (
        await slack_error(
            client.assistant_threads_setStatus(channel_id="C1", thread_ts=root.ts, status="y")
        )
        == "missing_scope"
    )  # every call, not a few
