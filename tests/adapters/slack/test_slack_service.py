"""Slack end to end: the whole service with the real slack-bolt app against a local Slack.

Events and clicks arrive as correctly signed HTTP requests at ``/slack/events``; replies go to a
local fake of the Slack Web API (`tests.support.fake_slack`), where the tests read the threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest

from adapters.channel import Unavailable
from adapters.slack import SlackChannel
from adapters.slack.events import classify
from gateway.channels import gateway_settings
from gateway.reminders import remind
from gateway.replies import CUT_OFF_NOTE
from gateway.serve import serve
from gateway.service import Service
from harness_core import SessionError
from tests.support.fake_slack import FakeSlack, Message, event_envelope, form_body, signed_headers
from tests.support.gateway_agent import CUT_OFF_ANSWER, STREAMED_ANSWER
from tests.support.gateway_rig import lane_texts
from tests.support.redis_server import free_port

AGENT = "tests.support.gateway_agent"
FORM = "application/x-www-form-urlencoded"
SECRET = "test-signing-secret"
APPROVER = "U0AAA9"
OPERATOR = "operator-secret-abcdefghijklmnop"


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
        return await lane_texts(self.service.repo, session, lane)


@contextlib.asynccontextmanager
async def _running(
    tmp_path: Any, *, socket_mode: bool, stream: bool = False, **more: Any
) -> AsyncIterator[Rig]:
    """The service with Slack on (HTTP mode, or Socket Mode) against a fresh fake Slack.

    Replies are posted as one message each unless `stream` (these tests read every bot
    message of a thread as a delivery; streamed answers have tests of their own)."""
    async with FakeSlack() as fake:
        mode = {"slack_app_token": fake.app_token} if socket_mode else {}
        settings = gateway_settings(
            store_url=f"sqlite:///{tmp_path}/store.db",
            broker_url=f"sqlite:///{tmp_path}/broker.db",
            web_url=f"sqlite:///{tmp_path}/web.db",
            plugin=AGENT,
            lease_seconds=6,
            renew_seconds=1,
            slack_bot_token=fake.bot_token,
            slack_signing_secret=None if socket_mode else SECRET,
            slack_api_url=fake.api_url,
            slack_approvers={"C1": (APPROVER,)},
            slack_stream=stream,
            ops_tokens=(f"alice:operator:{OPERATOR}",),
            **mode,
            **more,
        )
        service = Service(settings)
        await service.start()
        assert service.app is not None
        transport = httpx.ASGITransport(app=service.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            rig = Rig(service, fake, http)
            yield rig
        # a test may have restarted the service: the one running now is stopped too
        for started in dict.fromkeys((service, rig.service)):
            await started.stop(drain_seconds=2)


@pytest.fixture
async def rig(tmp_path: Any) -> AsyncIterator[Rig]:
    async with _running(tmp_path / "http", socket_mode=False) as running:
        yield running


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


async def test_an_answer_cut_off_at_the_output_limit_says_so_in_the_thread(rig: Rig) -> None:
    event = rig.fake.mention_event("C1", "/cutoff")
    assert (await rig.event(event)).status_code == 200
    [reply] = await rig.bot_replies("C1", event["ts"], 1)
    assert reply.text == f"{CUT_OFF_ANSWER}\n\n{CUT_OFF_NOTE}"


async def test_the_same_message_as_mention_message_and_retry_is_taken_once(rig: Rig) -> None:
    mention = rig.fake.mention_event("C1", "only once")
    message = rig.fake.message_event("C1", mention["ts"])
    first = await rig.event(mention, event_id="Ev1")
    assert first.status_code == 200
    assert (await rig.event(message, event_id="Ev2")).status_code == 200
    assert (await rig.event(mention, event_id="Ev1")).status_code == 200  # Slack's retry
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
    for bad in (
        "{not json",
        "[]",
        '{"type": "event_callback", "event": 5}',
        '{"type": "event_callback", "event": {"text": "no type"}}',
        '{"type": "event_callback", "event": {"x": ' + "[" * 100_000 + "]" * 100_000 + "}}",
        # bolt reads the ids for its context and raised on these (an outside probe: a 500)
        '{"type": "event_callback", "event": {"type": "message", "user": 5, "ts": 1.5}}',
        '{"type": "event_callback", "event": {"type": "message", "channel": {"id": 7}}}',
        '{"type": "event_callback", "team_id": [], "event": {"type": "app_mention"}}',
        '{"type": "event_callback", "event": {"type": "message", "message": {"user": 1}}}',
    ):
        response = await rig.signed(bad, "application/json")
        assert response.status_code == 400, bad[:80]  # the deep one was a 500 (RecursionError)
    # two payload fields: bolt acts on the last, which the shape check must be the one to read
    decoy = urlencode({"payload": json.dumps({"type": "x"})})
    real = urlencode({"payload": json.dumps({"type": "block_actions", "actions": []})})
    assert (await rig.signed(f"{decoy}&{real}", FORM)).status_code == 400
    for payload in (  # bolt failed on these with an empty 500
        {"type": "block_actions", "actions": []},
        {"type": "block_actions", "actions": [{"value": "no action_id"}]},
        {"type": "view_submission", "view": {"id": "V1"}},
    ):
        response = await rig.click(payload)
        assert response.status_code == 400, payload
    unsigned = await rig.http.post("/slack/events", content=raw.encode())
    assert unsigned.status_code == 401
    fresh = str(int(time.time())).encode()
    for signature in (b"v0=\xe9", b"v0=" + "\u00e9".encode() * 32):  # was a 500
        odd = {b"x-slack-request-timestamp": fresh, b"x-slack-signature": signature}
        response = await rig.http.post("/slack/events", content=raw.encode(), headers=odd)
        assert response.status_code == 401, response.text
    for stamp in (b"\xb2", "\u0663".encode()):  # str.isdigit() takes both; int() not "²"
        odd = {b"x-slack-request-timestamp": stamp, b"x-slack-signature": b"v0=00"}
        response = await rig.http.post("/slack/events", content=raw.encode(), headers=odd)
        assert response.status_code == 401
    for body in (b"\xff\xfe{}", gzip.compress(raw.encode())):  # was a 500 and an error log
        odd = {b"x-slack-request-timestamp": fresh, b"x-slack-signature": b"v0=00"}
        response = await rig.http.post("/slack/events", content=body, headers=odd)
        assert response.status_code == 401, response.text
    await asyncio.sleep(0.2)
    broker = rig.service.broker
    assert broker is not None
    backlog = await broker.inbox.backlog()
    assert backlog.pending == 0
    assert rig.fake.bot_messages() == []


async def test_a_request_no_listener_handles_is_one_short_line_quoting_nothing(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """Bolt's warning was lines of suggested code quoting what a person typed (an outside
    probe): a menu's search, a slash command's text."""
    caplog.set_level(logging.INFO)
    suggestion = {
        "type": "block_suggestion",
        "action_id": "pick",
        "block_id": "b1",
        "value": "typed-words-one",
        "user": {"id": "U1"},
        "team": {"id": "T1"},
    }
    command = urlencode(
        {"command": "/deploy", "text": "typed-words-two", "user_id": "U1", "team_id": "T1"}
    )
    for body in (form_body(suggestion), command):
        response = await rig.signed(body, FORM)
        assert response.status_code == 404, response.text
    said = [r for r in caplog.records if r.name.startswith("adapters.slack")]
    assert "typed-words" not in caplog.text
    assert [r.getMessage() for r in said if "not handled" in r.getMessage()] == [
        "slack request not handled"
    ] * 2
    assert not [r for r in said if "Unhandled" in r.getMessage()]


async def test_a_media_type_is_read_without_regard_to_case(rig: Rig) -> None:
    """`APPLICATION/JSON` (the same type, RFC 9110) was a 400; `application/jsonx` was taken."""
    event = rig.fake.mention_event("C1", "shouted type")
    raw = json.dumps(event_envelope(event))
    assert (await rig.signed(raw, "application/jsonx")).status_code == 400
    assert (await rig.signed(raw, "APPLICATION/JSON; Charset=UTF-8")).status_code == 200
    [reply] = await rig.bot_replies("C1", event["ts"], 1)
    assert reply.text == "You said: shouted type"


_CLICK = form_body({"type": "block_actions", "actions": [{"action_id": "approve"}]})
SSL_CHECKS: list[tuple[str, str, bool, int]] = [
    # (body, content type, signed, status). Slack's own check comes unsigned (recorded in
    # slackapi/bolt-js#1397: `ssl_check=1&token=...`, form-encoded, no signature headers).
    ("ssl_check=1&token=xxx", "application/x-www-form-urlencoded", False, 200),
    ("ssl_check=1&token=xxx", "application/x-www-form-urlencoded", True, 200),
    ("token=xxx&ssl_check=1", "application/x-www-form-urlencoded; charset=utf-8", False, 200),
    ("ssl_check=1", "application/x-www-form-urlencoded", False, 200),
    (f"ssl_check=1&{_CLICK}", "application/x-www-form-urlencoded", False, 200),  # answered only
    ("ssl_check=0&token=xxx", "application/x-www-form-urlencoded", False, 401),
    ("ssl_check=true&token=xxx", "application/x-www-form-urlencoded", False, 401),
    ("ssl_check=1&ssl_check=0", "application/x-www-form-urlencoded", False, 401),
    ("ssl_check=1&token=xxx", "application/json", False, 401),
    ('{"ssl_check": "1"}', "application/json", False, 401),
]


async def test_slacks_ssl_check_is_answered_and_does_nothing_else(rig: Rig) -> None:
    for body, content_type, signed, status in SSL_CHECKS:
        headers = {"content-type": content_type}
        if signed:
            headers.update(signed_headers(body, SECRET))
        response = await rig.http.post("/slack/events", content=body.encode(), headers=headers)
        assert response.status_code == status, (body, signed, response.text)
        if status == 200:
            assert response.content == b""
    await asyncio.sleep(0.2)
    broker = rig.service.broker
    assert broker is not None
    assert (await broker.inbox.backlog()).pending == 0
    assert rig.fake.bot_messages() == [] and rig.fake.ephemerals == []


async def _approval(rig: Rig, text: str = "/deploy prod") -> tuple[dict[str, Any], Message]:
    """A mention asking for a deploy; its thread's approval request (with buttons)."""
    event = rig.fake.mention_event("C1", text)
    await rig.event(event)
    [asked] = await rig.bot_replies("C1", event["ts"], 1)
    assert asked.blocks is not None
    assert any(b.get("type") == "actions" for b in asked.blocks), asked.blocks
    assert _delivery_of(asked).startswith("approval_request:slack-C1:")
    return event, asked


def _buttons(message: Message) -> list[str]:
    return [
        element["action_id"]
        for block in message.blocks or []
        if block.get("type") == "actions"
        for element in block.get("elements", [])
    ]


async def _until(check: Any, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.02)


async def test_an_approver_approves_from_the_button_and_the_run_goes_on(rig: Rig) -> None:
    event, asked = await _approval(rig)
    assert "deploy" in json.dumps(asked.blocks) and "prod" in json.dumps(asked.blocks)
    assert _buttons(asked) == ["approve", "deny", "supply"]
    click = rig.fake.block_actions_payload("C1", asked.ts, "approve", user=APPROVER)
    response = await rig.click(click)
    assert response.status_code == 200, response.text
    again = await rig.click(click)  # a double click (or Slack's retry): one decision
    assert again.status_code == 200
    replies = await rig.bot_replies("C1", event["ts"], 2)
    assert replies[1].text == "Done: deployed prod"
    await _until(lambda: _buttons(rig.fake.message("C1", asked.ts)) == [])
    updated = json.dumps(rig.fake.message("C1", asked.ts).blocks)
    assert f"<@{APPROVER}>" in updated and "Approved" in updated
    await asyncio.sleep(0.3)
    assert len([m for m in rig.fake.thread("C1", event["ts"]) if m.bot_id]) == 2


async def test_someone_else_is_told_privately_and_nothing_is_recorded(rig: Rig) -> None:
    slack = rig.service.adapters["slack"]
    assert isinstance(slack, SlackChannel)
    slack.approvers["*"] = (APPROVER,)  # in the channel's list and in "*": named once
    event, asked = await _approval(rig)
    response = await rig.click(
        rig.fake.block_actions_payload("C1", asked.ts, "approve", user="U0AAA7")
    )
    assert response.status_code == 200
    await _until(lambda: any(e.user == "U0AAA7" for e in rig.fake.ephemerals))
    [note] = [e for e in rig.fake.ephemerals if e.user == "U0AAA7"]
    assert "Only approvers" in note.text and note.text.count(f"<@{APPROVER}>") == 1
    await asyncio.sleep(0.3)
    assert _buttons(rig.fake.message("C1", asked.ts)) == ["approve", "deny", "supply"]
    assert len([m for m in rig.fake.thread("C1", event["ts"]) if m.bot_id]) == 1
    broker = rig.service.broker
    assert broker is not None
    events = await broker.audit.list(session="slack-C1")
    assert not [e for e in events if e.action == "approval decided"]


async def test_deny_asks_a_reason_and_the_run_is_answered_without_the_tool(rig: Rig) -> None:
    event, asked = await _approval(rig)
    response = await rig.click(
        rig.fake.block_actions_payload("C1", asked.ts, "deny", user=APPROVER)
    )
    assert response.status_code == 200
    await rig.fake.wait_for_call("views.open")
    [view_id] = list(rig.fake.views)
    submit = rig.fake.view_submission_payload(
        view_id,
        values={"reason": {"reason": {"type": "plain_text_input", "value": "not on a Friday"}}},
        user=APPROVER,
    )
    response = await rig.click(submit)
    assert response.status_code == 200, response.text
    replies = await rig.bot_replies("C1", event["ts"], 2)
    assert "deployed" not in replies[1].text
    await _until(lambda: _buttons(rig.fake.message("C1", asked.ts)) == [])
    updated = json.dumps(rig.fake.message("C1", asked.ts).blocks)
    assert "Denied" in updated and "not on a Friday" in updated


async def test_an_approver_who_denies_what_they_approved_is_told_nothing_changed(
    rig: Rig,
) -> None:
    """A Deny on a copy of the buttons after one's own Approve was recorded as a duplicate
    and said nothing: the approver believed the deploy was denied."""
    event, asked = await _approval(rig)
    stale_deny = rig.fake.block_actions_payload("C1", asked.ts, "deny", user=APPROVER)
    approve = rig.fake.block_actions_payload("C1", asked.ts, "approve", user=APPROVER)
    await rig.click(approve)
    replies = await rig.bot_replies("C1", event["ts"], 2)
    assert replies[1].text == "Done: deployed prod"
    await rig.click(stale_deny)  # a copy of the buttons another client still showed
    await rig.fake.wait_for_call("views.open")
    [view_id] = list(rig.fake.views)
    reason = {"reason": {"reason": {"type": "plain_text_input", "value": "wrong target"}}}
    submitted = await rig.click(
        rig.fake.view_submission_payload(view_id, values=reason, user=APPROVER)
    )
    assert submitted.status_code == 200
    await _until(lambda: len(rig.fake.ephemerals) >= 1)
    [note] = rig.fake.ephemerals
    assert (note.user, note.text) == (APPROVER, "You already approved this. Nothing was changed.")
    await rig.click(approve)
    await asyncio.sleep(0.3)
    assert len(rig.fake.ephemerals) == 1  # the same button again: a double click, nothing said


async def test_two_approvers_racing_make_one_decision_and_the_loser_learns_who(
    rig: Rig,
) -> None:
    event, asked = await _approval(rig)
    adapter: Any = rig.service.adapters["slack"]
    adapter.approvers["C1"] = (APPROVER, "S1")  # U8 may decide through a user group
    rig.fake.usergroups["S1"] = ["U0AAA8"]
    await rig.click(rig.fake.block_actions_payload("C1", asked.ts, "deny", user="U0AAA8"))
    await rig.fake.wait_for_call("views.open")
    [view_id] = list(rig.fake.views)
    approve = rig.fake.block_actions_payload("C1", asked.ts, "approve", user=APPROVER)
    deny = rig.fake.view_submission_payload(view_id, values={}, user="U0AAA8")
    answers = await asyncio.gather(rig.click(approve), rig.click(deny))
    assert [a.status_code for a in answers] == [200, 200]
    replies = await rig.bot_replies("C1", event["ts"], 2)
    await _until(lambda: len(rig.fake.ephemerals) >= 1)
    [note] = rig.fake.ephemerals
    winner = APPROVER if note.user == "U0AAA8" else "U0AAA8"
    verb = "approved" if winner == APPROVER else "denied"
    assert note.text.startswith(f"<@{winner}> already {verb}")
    assert (replies[1].text == "Done: deployed prod") is (winner == APPROVER)
    await _until(lambda: _buttons(rig.fake.message("C1", asked.ts)) == [])
    assert f"<@{winner}>" in json.dumps(rig.fake.message("C1", asked.ts).blocks)
    await asyncio.sleep(0.3)
    assert len([m for m in rig.fake.thread("C1", event["ts"]) if m.bot_id]) == 2


async def _delivered(rig: Rig, reply: Message) -> None:
    """Wait until the outbox holds `reply`'s delivery as delivered."""
    broker = rig.service.broker
    assert broker is not None
    for _ in range(500):
        delivery = await broker.outbox.get(_delivery_of(reply))
        if delivery is not None and delivery.status == "delivered":
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"never delivered: {reply.text!r}")


async def test_a_post_whose_answer_was_lost_is_found_not_posted_again(rig: Rig) -> None:
    rig.fake.lose_response("chat.postMessage")
    event = rig.fake.mention_event("C1", "lost answer")
    await rig.event(event)
    [reply] = await rig.bot_replies("C1", event["ts"], 1)
    assert reply.text == "You said: lost answer"
    await _delivered(rig, reply)
    looked = [
        c
        for c in rig.fake.calls_to("conversations.replies")
        if c.params.get("include_all_metadata")
    ]
    assert looked  # the retry reconciled (read the thread's metadata) before posting
    await asyncio.sleep(0.3)
    assert len([m for m in rig.fake.thread("C1", event["ts"]) if m.bot_id]) == 1


@pytest.mark.parametrize("error", ["internal_error", "fatal_error"])
async def test_a_post_slack_failed_after_it_landed_is_found_not_posted_again(
    rig: Rig, error: str
) -> None:
    """Slack may act and then answer `internal_error` (HTTP 200): the retry posted the reply a
    second time without looking (only a 5xx or a lost answer was an unknown outcome)."""
    rig.fake.fail("chat.postMessage", error=error, acted=True)
    event = rig.fake.mention_event("C1", f"landed {error}")
    await rig.event(event)
    [reply] = await rig.bot_replies("C1", event["ts"], 1)
    await _delivered(rig, reply)
    await asyncio.sleep(0.3)
    assert [m.text for m in rig.fake.thread("C1", event["ts"]) if m.bot_id] == [
        f"You said: landed {error}"
    ]


@pytest.mark.parametrize("said", ["inf", "nan", "1e12"])
async def test_a_retry_after_past_all_reason_is_held_to_the_outbox_s_longest_wait(
    rig: Rig, said: str
) -> None:
    """`1e12` parked the reply for 31 years; `inf` and `nan` failed the attempt with nothing
    recorded, and it waited out its lease."""
    rig.fake.rate_limit("chat.postMessage", retry_after=said)
    event = rig.fake.mention_event("C1", f"wait {said}")
    await rig.event(event)
    broker = rig.service.broker
    assert broker is not None
    for _ in range(500):
        waiting = [d for d in await broker.outbox.list("pending") if d.last_error]
        if waiting:
            break
        await asyncio.sleep(0.02)
    [delivery] = waiting
    assert delivery.last_error == "rate limited by Slack"  # the attempt was recorded
    longest = rig.service.settings.outbox_max_delay_seconds * 1000
    assert delivery.due_at_ms <= time.time() * 1000 + longest


async def test_a_rate_limited_post_waits_as_slack_asks(rig: Rig) -> None:
    rig.fake.rate_limit("chat.postMessage", retry_after=1)
    event = rig.fake.mention_event("C1", "slow down")
    await rig.event(event)
    [reply] = await rig.bot_replies("C1", event["ts"], 1)
    posts = rig.fake.calls_to("chat.postMessage")
    assert len(posts) == 2
    assert posts[1].time - posts[0].time >= 0.95  # Retry-After: 1
    assert reply.text == "You said: slow down"


async def test_a_dm_is_one_conversation_answered_at_the_top(rig: Rig) -> None:
    rig.fake.add_channel("D1")
    first = rig.fake.post_user_message("D1", "hi in private")
    assert (await rig.event(first)).status_code == 200
    await _until(lambda: len(rig.fake.bot_messages("D1")) == 1)
    second = rig.fake.post_user_message("D1", "and again")
    await rig.event(second)
    await _until(lambda: len(rig.fake.bot_messages("D1")) == 2)
    answers = rig.fake.bot_messages("D1")
    assert [m.text for m in answers] == ["You said: hi in private", "You said: and again"]
    assert all(m.thread_ts is None for m in answers)
    texts = await rig.user_texts("slack:D1:dm", session="slack-D1")
    assert texts == ["hi in private", "and again"]


async def test_a_mention_midway_gives_the_agent_the_thread_so_far(rig: Rig) -> None:
    root = rig.fake.post_user_message("C1", "the build is red", user="U0ANN")
    rig.fake.post_user_message("C1", "since this morning", user="U0BOB", thread_ts=root["ts"])
    mention = rig.fake.mention_event("C1", "what broke?", user="U0ANN", thread_ts=root["ts"])
    await rig.event(mention)
    await rig.bot_replies("C1", root["ts"], 1)
    [first] = await rig.user_texts(f"slack:C1:{root['ts']}")
    assert first == (
        "Earlier in this thread:\nU0ANN: the build is red\nU0BOB: since this morning\n\n"
        "The message to you:\nwhat broke?"
    )


async def test_edits_deletions_and_other_events_are_acknowledged_not_taken(rig: Rig) -> None:
    mention = rig.fake.mention_event("C1", "original")
    await rig.event(mention)
    await rig.bot_replies("C1", mention["ts"], 1)
    edit = rig.fake.edit_user_message("C1", mention["ts"], "edited")
    again = rig.fake.app_mention_event("C1", mention["ts"])  # as Slack sends it after an edit
    chatter = rig.fake.post_user_message("C1", "anyone know the deploy window?")
    rig.fake.edit_user_message("C1", chatter["ts"], f"<@{rig.fake.bot_user_id}> deploy window?")
    mentioned_later = rig.fake.app_mention_event("C1", chatter["ts"])
    deletion = rig.fake.delete_user_message("C1", mention["ts"])
    other = {"type": "reaction_added", "user": "U1", "reaction": "tada", "item": {}}
    for event in (edit, again, mentioned_later, deletion, other):
        assert (await rig.event(event)).status_code == 200, event["type"]
    await asyncio.sleep(0.3)
    assert await rig.user_texts(f"slack:C1:{mention['ts']}") == ["original"]
    assert [m for m in rig.fake.thread("C1", chatter["ts"]) if m.bot_id] == []


def test_an_edited_mention_past_the_dedupe_window_is_still_an_edit() -> None:
    """After the inbox forgot the first (a day on), the edit was taken as a new message with
    the first one's id: the worker refused it and the thread got "could not take that"."""
    event = {
        "type": "app_mention",
        "user": "U1",
        "text": "<@UBOT> deploy api, please",
        "ts": "1700000000.000100",
        "channel": "C1",
        "edited": {"user": "U1", "ts": "1700090000.000100"},
    }
    edited = classify("app_mention", event, bot_user_id="UBOT", bot_id="B1", now_ms=0)
    assert (edited.take, edited.reason) == ("ignore", "edit")
    listed = classify(
        "message", event | {"type": "message"}, bot_user_id="UBOT", bot_id="B1", now_ms=0
    )
    assert listed.take == "take"  # a thread read back (a backfill) lists edited messages so


def test_a_lone_surrogate_is_replaced_where_slack_text_is_read() -> None:
    """No store holds one: each of Slack's retries failed at the inbox, and the message was lost."""
    event = {
        "type": "app_mention",
        "user": "U1",
        "text": "<@UBOT> a \ud800 b",
        "ts": "1700000000.000100",
        "channel": "C1",
        "user_profile": {"display_name": "Ann \udfff"},
        "files": [{"id": "F1", "name": "x\ud800.txt", "mimetype": "text/plain", "size": 1}],
    }
    taken = classify("app_mention", event, bot_user_id="UBOT", bot_id="B1", now_ms=0).inbound
    assert taken is not None
    assert (taken.text, taken.author.name) == ("a \ufffd b", "Ann \ufffd")
    assert taken.attachments[0].name == "x\ufffd.txt"
    taken.model_dump_json().encode("utf-8")  # storable


async def test_a_message_being_worked_on_wears_the_reaction_until_answered(rig: Rig) -> None:
    event = rig.fake.mention_event("C1", "/slow 600")
    await rig.event(event)
    await _until(lambda: "eyes" in rig.fake.message("C1", event["ts"]).reactions)
    await rig.bot_replies("C1", event["ts"], 1)
    await _until(lambda: "eyes" not in rig.fake.message("C1", event["ts"]).reactions)


async def test_a_reply_slack_refuses_for_good_leaves_a_warning_not_the_working_reaction(
    rig: Rig,
) -> None:
    # the thread wore 👀 for good, as if the reply were still on its way
    rig.fake.fail("chat.postMessage", error="restricted_action")
    event = rig.fake.mention_event("C1", "hello")
    await rig.event(event)
    await _until(lambda: "warning" in rig.fake.message("C1", event["ts"]).reactions)
    assert "eyes" not in rig.fake.message("C1", event["ts"]).reactions
    broker = rig.service.broker
    assert broker is not None
    [dead] = await broker.outbox.list("dead")
    assert dead.last_error == "Slack: restricted_action"
    # an operator redelivers it once Slack takes it: the question wore the warning for good
    headers = {"Authorization": f"Bearer {OPERATOR}"}
    redelivered = await rig.http.post(f"/api/v1/deliveries/{dead.id}/redeliver", headers=headers)
    assert redelivered.status_code == 200, redelivered.text
    await rig.bot_replies("C1", event["ts"], 1)
    await _until(lambda: "warning" not in rig.fake.message("C1", event["ts"]).reactions)
    follow = rig.fake.post_user_message("C1", "again", thread_ts=event["ts"])
    await rig.event(follow)
    await rig.bot_replies("C1", event["ts"], 2)
    await _until(lambda: "eyes" not in rig.fake.message("C1", follow["ts"]).reactions)
    assert "warning" not in rig.fake.message("C1", follow["ts"]).reactions


@pytest.fixture
async def two_attempts(tmp_path: Any) -> AsyncIterator[Rig]:
    async with _running(tmp_path / "two", socket_mode=False, outbox_max_attempts=2) as running:
        yield running


async def test_a_reply_out_of_attempts_leaves_a_warning_not_the_working_reaction(
    two_attempts: Rig,
) -> None:
    """Only a refusal `deliver` saw was for good swapped the reaction: a reply that ran out
    of attempts (Slack answering 500 each time) left the question "being worked on" for ever
    (an outside probe)."""
    rig = two_attempts
    rig.fake.fail("chat.postMessage", error="internal_error", status=500, times=10)
    event = rig.fake.mention_event("C1", "hello")
    await rig.event(event)
    await _until(lambda: "warning" in rig.fake.message("C1", event["ts"]).reactions, 30)
    assert "eyes" not in rig.fake.message("C1", event["ts"]).reactions
    broker = rig.service.broker
    assert broker is not None
    [dead] = await broker.outbox.list("dead")
    assert dead.attempts == 2


async def test_a_reply_found_by_reconcile_takes_the_working_reaction_off(rig: Rig) -> None:
    """Its post took effect, its answer was lost, and the retry found it in the thread: the
    reply was there once, and the question wore "working on it" for ever (an outside probe)."""
    rig.fake.lose_response("chat.postMessage")
    event = rig.fake.mention_event("C1", "hello")
    await rig.event(event)
    await _until(lambda: "eyes" in rig.fake.message("C1", event["ts"]).reactions)
    await rig.bot_replies("C1", event["ts"], 1)
    await _until(lambda: "eyes" not in rig.fake.message("C1", event["ts"]).reactions, 30)
    assert len([m for m in rig.fake.thread("C1", event["ts"]) if m.bot_id]) == 1


async def test_a_post_slack_applies_after_it_timed_out_is_not_posted_twice(
    tmp_path: Any,
) -> None:
    """Slack sat on a post past the client's timeout, then applied it: the retry's reconcile,
    two seconds after the timeout, found nothing and posted it again (an outside probe). A
    post that timed out is looked for a while before it is posted again (D408)."""
    async with _running(tmp_path, socket_mode=False, delivery_timeout_seconds=2) as rig:
        rig.fake.delay("chat.postMessage", 5, even_if_left=True)  # applied 5 s after it came
        event = rig.fake.mention_event("C1", "slow post")
        await rig.event(event)
        await rig.bot_replies("C1", event["ts"], 1, timeout_s=20)
        broker = rig.service.broker
        assert broker is not None
        for _ in range(400):
            if not await broker.outbox.list("pending"):
                break
            await asyncio.sleep(0.1)
        [delivered] = await broker.outbox.list("delivered")
        assert delivered.attempts >= 2  # the second attempt looked, and found it
        [first, *again] = [c for c in rig.fake.arrivals if c.method == "chat.postMessage"]
        await asyncio.sleep(max(0.0, first.time + 5.5 - time.time()))  # the late one landed
        assert again == []  # before: posted again two seconds after the timeout
        assert [m.text for m in rig.fake.thread("C1", event["ts"]) if m.bot_id] == [
            "You said: slow post"
        ]


async def test_a_long_answer_is_split_and_a_partial_post_is_completed_not_repeated(
    rig: Rig,
) -> None:
    words = " ".join(f"word{n}" for n in range(1_400))  # about 10,000 characters
    rig.fake.lose_response("chat.postMessage")  # the first part is posted, its answer lost
    event = rig.fake.mention_event("C1", words)
    await rig.event(event)
    parts = await rig.bot_replies("C1", event["ts"], 4, timeout_s=15)
    await asyncio.sleep(0.5)
    parts = [m for m in rig.fake.thread("C1", event["ts"]) if m.bot_id]
    assert all(len(m.text) <= 3_000 for m in parts)
    numbers = [m.metadata["event_payload"]["part"] for m in parts if m.metadata]
    assert sorted(numbers) == list(range(len(parts)))  # each part once
    assert " ".join(m.text for m in parts).split() == f"You said: {words}".split()


@pytest.fixture
async def socket_rig(tmp_path: Any) -> AsyncIterator[Rig]:
    async with _running(tmp_path / "socket", socket_mode=True) as running:
        yield running


async def test_socket_mode_acks_after_the_inbox_and_replies_in_the_thread(
    socket_rig: Rig,
) -> None:
    rig = socket_rig
    assert (await rig.http.post("/slack/events", content=b"{}")).status_code == 404  # no URL
    event = rig.fake.mention_event("C1", "over the socket")
    envelope = await rig.fake.send_event(event)
    assert (await rig.fake.wait_ack(envelope)) == {"envelope_id": envelope}
    [reply] = await rig.bot_replies("C1", event["ts"], 1)
    assert reply.text == "You said: over the socket"
    await rig.fake.disconnect_socket()  # Slack drops the link: the adapter opens a new one
    await rig.fake.wait_connected(1)
    follow = rig.fake.post_user_message("C1", "after the reconnect", thread_ts=event["ts"])
    await rig.fake.wait_ack(await rig.fake.send_event(follow))
    replies = await rig.bot_replies("C1", event["ts"], 2)
    assert replies[1].text == "You said: after the reconnect"


async def test_socket_mode_approval_click(socket_rig: Rig) -> None:
    rig = socket_rig
    event = rig.fake.mention_event("C1", "/deploy prod")
    await rig.fake.wait_ack(await rig.fake.send_event(event))
    [asked] = await rig.bot_replies("C1", event["ts"], 1)
    click = rig.fake.block_actions_payload("C1", asked.ts, "approve", user=APPROVER)
    await rig.fake.wait_ack(await rig.fake.send_interactive(click))
    replies = await rig.bot_replies("C1", event["ts"], 2)
    assert replies[1].text == "Done: deployed prod"


async def test_an_event_the_inbox_cannot_hold_is_not_acknowledged(
    rig: Rig, socket_rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    for each in (rig, socket_rig):
        intake = each.service.intake
        assert intake is not None

        async def down(inbound: Any) -> Any:
            raise Unavailable("the inbox is down")

        monkeypatch.setattr(intake, "accept", down)
    response = await rig.event(rig.fake.mention_event("C1", "not now"))
    assert response.status_code == 500  # Slack delivers it again
    envelope = await socket_rig.fake.send_event(socket_rig.fake.mention_event("C1", "not now"))
    await asyncio.sleep(0.5)
    assert envelope not in socket_rig.fake.acks  # Slack delivers it again


async def test_a_member_whose_id_starts_with_the_bot_s_is_not_the_bot(rig: Rig) -> None:
    """`<@UBOT2>` was taken as a mention of `UBOT`: the bot answered, and inside a thread it
    was never in, read the thread's history to the model and followed it after."""
    top = rig.fake.post_user_message("C1", "hey <@UBOT2> can you review this?")
    root = rig.fake.post_user_message("C1", "team chat")
    inside = rig.fake.post_user_message("C1", "<@UBOTTOM|tom> what do you think?", root["ts"])
    for event in (top, root, inside):
        assert (await rig.event(event)).status_code == 200
    mention = rig.fake.mention_event("C1", "and the bot?")
    await rig.event(mention)
    await rig.bot_replies("C1", mention["ts"], 1)  # everything before it was handled
    for ts in (top["ts"], root["ts"]):
        assert [m for m in rig.fake.thread("C1", ts) if m.bot_id] == []
    with pytest.raises(SessionError, match="does not exist"):  # nothing of it reached a lane
        await rig.user_texts(f"slack:C1:{root['ts']}")


async def test_the_agent_cannot_ping_the_whole_channel(rig: Rig) -> None:
    text = (
        "<!channel> wake up <!here|here> and <!everyone>, <!subteam^S0OPS|@ops>, "
        "<!Channel> <!HERE> <!group> <!here >"  # spellings Slack may read as the same
    )
    event = rig.fake.mention_event("C1", text)
    await rig.event(event)
    [reply] = await rig.bot_replies("C1", event["ts"], 1)
    assert "<!" not in reply.text
    assert "@channel" in reply.text and "@here" in reply.text and "@everyone" in reply.text
    assert "@S0OPS" in reply.text
    assert "@Channel @HERE @group @here" in reply.text


async def _answered_then_stopped(rig: Rig) -> str:
    """A mention answered, then the service stopped: the thread's root ts."""
    mention = rig.fake.mention_event("C1", "before the restart")
    await rig.event(mention)
    await rig.bot_replies("C1", mention["ts"], 1)
    await rig.service.stop(drain_seconds=1)
    return str(mention["ts"])


async def _restarted(rig: Rig) -> Any:
    """A new service on the same settings (its backfill begins): its Slack adapter."""
    rig.service = Service(rig.service.settings)
    await rig.service.start()
    assert rig.service.app is not None
    rig.http._transport = httpx.ASGITransport(app=rig.service.app)
    return rig.service.adapters["slack"]


async def test_messages_posted_while_down_are_backfilled_after_a_restart(rig: Rig) -> None:
    root = await _answered_then_stopped(rig)
    rig.fake.post_user_message("C1", "while you were away", thread_ts=root)
    rig.fake.post_user_message("C1", "<@UBOT> still there?", thread_ts=root)
    rig.fake.post_user_message(
        "C1", "unrelated", thread_ts=rig.fake.post_user_message("C1", "x")["ts"]
    )
    adapter = await _restarted(rig)
    await _until(lambda: adapter.backfilled == 2)

    def answered(text: str) -> bool:
        # one reply for both backfilled messages (the second steered the run) or one each
        return any(m.bot_id and text in m.text for m in rig.fake.thread("C1", root))

    await _until(lambda: answered("still there?"))
    texts = await rig.user_texts(f"slack:C1:{root}")
    assert texts[:1] == ["before the restart"]
    assert sorted(texts[1:]) == ["still there?", "while you were away"]
    again = rig.fake.post_user_message("C1", "live again", thread_ts=root)
    await rig.event(again)  # a live event of a message the backfill could also see: once
    await _until(lambda: answered("live again"))
    assert (await rig.user_texts(f"slack:C1:{root}")).count("live again") == 1


async def test_a_backfill_reads_every_page_of_what_was_posted_while_down(rig: Rig) -> None:
    """It read one page of 200: the rest of a busy thread's messages were never taken."""
    root = await _answered_then_stopped(rig)
    for n in range(250):
        rig.fake.post_user_message("C1", f"note {n}", thread_ts=root)
    adapter = await _restarted(rig)
    await _until(lambda: adapter.backfilled == 250, timeout_s=30)
    replies = rig.fake.calls_to("conversations.replies")
    assert len(replies) >= 2 and replies[-1].params.get("cursor")  # the second page was read


async def test_a_backfill_skips_a_thread_slack_refuses_and_waits_out_its_rate_limit(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """One ``thread_not_found`` or one 429 stopped the whole backfill, every thread after it,
    at every start, logged as "SlackApiError" (an outside probe)."""
    caplog.set_level(logging.INFO, logger="adapters.slack")
    roots = []
    for said in ("first thread", "second thread"):
        mention = rig.fake.mention_event("C1", said)
        await rig.event(mention)
        await rig.bot_replies("C1", mention["ts"], 1)
        roots.append(str(mention["ts"]))
    await rig.service.stop(drain_seconds=1)
    for root in roots:
        rig.fake.post_user_message("C1", f"while away in {root}", thread_ts=root)
    rig.fake.fail("conversations.replies", error="thread_not_found")  # the first thread read
    rig.fake.rate_limit("conversations.replies", retry_after=1)  # the second, once
    caplog.clear()
    adapter = await _restarted(rig)
    await _until(lambda: any(r.getMessage() == "slack backfill done" for r in caplog.records))
    assert adapter.backfilled == 1
    [skipped] = [r for r in caplog.records if r.getMessage() == "slack backfill skipped threads"]
    assert getattr(skipped, "count", None) == 1
    [why] = getattr(skipped, "threads", [])
    assert why.startswith("slack:C1:") and "Slack answered thread_not_found (HTTP 200)" in why
    reads = rig.fake.calls_to("conversations.replies")
    assert reads[-1].time - reads[-2].time >= 0.95  # Retry-After: 1
    assert "slack backfill stopped" not in caplog.text


async def test_a_follow_up_that_came_while_the_mention_read_its_thread_is_answered(
    rig: Rig,
) -> None:
    """A mention inside a thread reads the thread's history first; a message of that thread
    arriving meanwhile found no lane and was acknowledged and let go."""
    root = rig.fake.post_user_message("C1", "the deploy is stuck")["ts"]
    rig.fake.delay("conversations.replies", 0.8)
    mention = rig.fake.mention_event("C1", "can you help", thread_ts=root)
    calling = asyncio.ensure_future(rig.event(mention))
    await rig.fake.wait_for_call("conversations.replies")
    follow = rig.fake.post_user_message("C1", "with the deploy config", thread_ts=root)
    assert (await rig.event(follow)).status_code == 200  # before the thread is a lane
    assert (await calling).status_code == 200
    await _until(
        lambda: any(
            "with the deploy config" in m.text for m in rig.fake.thread("C1", root) if m.bot_id
        )
    )
    texts = await rig.user_texts(f"slack:C1:{root}")
    assert [t.rsplit("\n", 1)[-1] for t in texts] == ["can you help", "with the deploy config"]


async def test_a_follow_up_to_a_mention_slack_delivered_late_is_answered(rig: Rig) -> None:
    """The mention's first delivery failed; Slack retried it a minute on. A message in its
    thread meanwhile found no lane and was let go."""
    posted = f"{time.time() - 60:.6f}"
    mention = rig.fake.mention_event("C1", "is the deploy window open?", ts=posted)
    follow = rig.fake.post_user_message("C1", "for api", thread_ts=posted)
    assert (await rig.event(follow)).status_code == 200  # the thread is no lane yet
    assert (await rig.event(mention)).status_code == 200  # the retry
    await _until(
        lambda: any("for api" in m.text for m in rig.fake.thread("C1", posted) if m.bot_id)
    )
    assert await rig.user_texts(f"slack:C1:{posted}") == ["is the deploy window open?", "for api"]


async def test_a_late_reply_in_a_thread_that_moved_on_links_its_question(rig: Rig) -> None:
    adapter: Any = rig.service.adapters["slack"]
    adapter.delivery.late_after_s = 0.0
    rig.fake.fail("chat.postMessage", error="internal_error")  # refused: retried in ~2 s
    event = rig.fake.mention_event("C1", "first question")
    await rig.event(event)
    await rig.fake.wait_for_call("chat.postMessage")
    rig.fake.post_user_message("C1", "a newer message", thread_ts=event["ts"])
    [reply] = await rig.bot_replies("C1", event["ts"], 1)
    assert reply.text.startswith("_Re: <https://test.slack.com/archives/C1/p")
    assert reply.text.endswith("You said: first question")
    on_time = rig.fake.mention_event("C1", "second question")
    await rig.event(on_time)
    [plain] = await rig.bot_replies("C1", on_time["ts"], 1)
    assert plain.text == "You said: second question"  # nothing newer in its thread


async def test_a_bot_token_slack_refuses_stops_serve_with_one_line(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    async with FakeSlack() as fake:
        settings = gateway_settings(
            store_url=f"sqlite:///{tmp_path}/store.db",
            broker_url=f"sqlite:///{tmp_path}/broker.db",
            web_url=f"sqlite:///{tmp_path}/web.db",
            slack_bot_token="xoxb-revoked-secretpart",
            slack_signing_secret=SECRET,
            slack_api_url=fake.api_url,
        )
        assert await serve(settings.replace(port=free_port())) == 1
    err = capsys.readouterr().err
    assert "gateway: Slack refuses the bot token (invalid_auth)" in err.splitlines()
    assert "Traceback" not in err and "secretpart" not in err


async def test_an_unreachable_slack_does_not_hold_up_the_service(tmp_path: Any) -> None:
    settings = gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"sqlite:///{tmp_path}/web.db",
        slack_bot_token="xoxb-test",
        slack_app_token="xapp-test",
        slack_api_url=f"http://127.0.0.1:{free_port()}/api/",  # nothing listens
    )
    service = Service(settings)
    await asyncio.wait_for(service.start(), timeout=10)  # Socket Mode keeps trying meanwhile
    try:
        assert service.app is not None
        transport = httpx.ASGITransport(app=service.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            posted = await http.post("/web/threads/t/messages", json={"text": "still here"})
            assert posted.status_code == 202
    finally:
        await asyncio.wait_for(service.stop(drain_seconds=1), timeout=15)


async def test_malformed_clicks_are_refused_or_ignored_and_record_nothing(rig: Rig) -> None:
    for raw in ("payload=%7Bnot-json", "nothing=here", "payload=%5B%5D"):
        response = await rig.signed(raw, "application/x-www-form-urlencoded")
        assert response.status_code == 400, raw
    event, asked = await _approval(rig)
    forged = rig.fake.block_actions_payload(
        "C1", asked.ts, "approve", user=APPROVER, value='{"v":1,"s":"x"}'
    )
    forged["actions"][0]["value"] = "not a decision"
    assert (await rig.click(forged)).status_code == 200
    await _until(lambda: len(rig.fake.ephemerals) == 1)
    assert "cannot be read" in rig.fake.ephemerals[0].text
    await asyncio.sleep(0.3)
    assert _buttons(rig.fake.message("C1", asked.ts)) == ["approve", "deny", "supply"]
    assert len([m for m in rig.fake.thread("C1", event["ts"]) if m.bot_id]) == 1


async def test_every_message_a_reply_answers_loses_the_reaction(rig: Rig) -> None:
    first = rig.fake.mention_event("C1", "/slow 800")
    await rig.event(first)
    await _until(lambda: "eyes" in rig.fake.message("C1", first["ts"]).reactions)
    steered = rig.fake.mention_event("C1", "and this too", thread_ts=first["ts"])
    await rig.event(steered)
    await _until(lambda: "eyes" in rig.fake.message("C1", steered["ts"]).reactions)
    await rig.bot_replies("C1", first["ts"], 1)
    await _until(lambda: "eyes" not in rig.fake.message("C1", steered["ts"]).reactions)
    await _until(lambda: "eyes" not in rig.fake.message("C1", first["ts"]).reactions)
    # the next message of the thread: its answer takes the reaction off it alone (the two
    # answered before are not asked again)
    removals = len(rig.fake.calls_to("reactions.remove"))
    later = rig.fake.mention_event("C1", "one more", thread_ts=first["ts"])
    await rig.event(later)
    await rig.bot_replies("C1", first["ts"], 2)
    await _until(lambda: "eyes" not in rig.fake.message("C1", later["ts"]).reactions)
    await asyncio.sleep(0.2)
    asked = [c.params["timestamp"] for c in rig.fake.calls_to("reactions.remove")[removals:]]
    assert asked == [later["ts"]]


async def test_a_burst_of_follow_ups_all_lose_the_reaction(rig: Rig) -> None:
    """Follow-ups that came together each wrote the thread's working list over the others'
    (4 of 5 kept the reaction for good, 119 of 121), and only the newest 20 were listed."""
    first = rig.fake.mention_event("C1", "/slow 1500")
    await rig.event(first)
    await _until(lambda: "eyes" in rig.fake.message("C1", first["ts"]).reactions)
    burst = [rig.fake.post_user_message("C1", f"and {n}", thread_ts=first["ts"]) for n in range(30)]
    await asyncio.gather(*(rig.event(event) for event in burst))
    every = [first["ts"], *(event["ts"] for event in burst)]
    await _until(lambda: all("eyes" in rig.fake.message("C1", ts).reactions for ts in every))
    await _until(
        lambda: all("eyes" not in rig.fake.message("C1", ts).reactions for ts in every), 20
    )
    await asyncio.sleep(0.3)
    # each message asked once: every reply took off its whole list again, what an earlier
    # reply had taken off included (45,800 useless calls for 1,000 messages: an outside probe)
    asked = [c.params["timestamp"] for c in rig.fake.calls_to("reactions.remove")]
    assert sorted(asked) == sorted(every)


async def test_a_reaction_slow_to_land_is_still_taken_off(rig: Rig) -> None:
    """The add, slow at Slack, landed after the reply had taken it off: it stayed for good."""
    rig.fake.delay("reactions.add", 1.0)
    event = rig.fake.mention_event("C1", "quick one")
    await rig.event(event)
    await rig.bot_replies("C1", event["ts"], 1)
    await _until(lambda: bool(rig.fake.calls_to("reactions.remove")))
    await asyncio.sleep(1.2)  # past the add's landing
    assert "eyes" not in rig.fake.message("C1", event["ts"]).reactions


async def test_stop_in_a_slack_thread_stops_the_turn_and_clears_the_reactions(rig: Rig) -> None:
    first = rig.fake.mention_event("C1", "/slow 2500")
    await rig.event(first)
    await _until(lambda: "eyes" in rig.fake.message("C1", first["ts"]).reactions)
    stop = rig.fake.mention_event("C1", "stop", thread_ts=first["ts"])  # "<@UBOT> stop"
    await rig.event(stop)
    [answer] = await rig.bot_replies("C1", first["ts"], 1)
    assert answer.text == "Stopped."
    for message in (first, stop):
        await _until(lambda m=message: "eyes" not in rig.fake.message("C1", m["ts"]).reactions)
    await asyncio.sleep(2.7)  # the aborted tool's sleep ends: no answer of the stopped run
    assert [m.text for m in rig.fake.thread("C1", first["ts"]) if m.bot_id] == ["Stopped."]


def _value(message: Message) -> str:
    """The decision value the message's Approve button carries."""
    [value] = [
        element["value"]
        for block in message.blocks or []
        if block.get("type") == "actions"
        for element in block.get("elements", [])
        if element.get("action_id") == "approve"
    ]
    return str(value)


def _forge(value: str, change: Callable[[dict[str, Any]], Any]) -> str:
    data = json.loads(value)
    change(data)
    return json.dumps(data, separators=(",", ":"))


FORGED_CLICKS: list[Any] = [
    pytest.param(
        lambda v: v["c"][0].__setitem__(1, "sha256:" + "0" * 64), "does not match", id="digest"
    ),
    pytest.param(lambda v: v.update(r="r-other"), "does not match", id="another run"),
    pytest.param(lambda v: v.update(s="slack-C2"), "does not match", id="another session"),
    pytest.param(lambda v: v["c"].append(["call-extra", "sha256:x"]), "does not match", id="extra"),
    pytest.param(lambda v: v["c"][0].__setitem__(0, "call-x"), "does not match", id="another call"),
    pytest.param(lambda v: v.update(w="w-made-up"), "Nothing waits", id="a made-up wait"),
]


@pytest.mark.parametrize(("change", "told"), FORGED_CLICKS)
async def test_a_signed_click_naming_another_batch_is_refused_and_the_genuine_one_decides(
    rig: Rig, change: Callable[[dict[str, Any]], Any], told: str
) -> None:
    event, asked = await _approval(rig)
    forged = _forge(_value(asked), change)
    click = rig.fake.block_actions_payload("C1", asked.ts, "approve", user=APPROVER, value=forged)
    assert (await rig.click(click)).status_code == 200
    await _until(lambda: len(rig.fake.ephemerals) == 1)
    assert told in rig.fake.ephemerals[0].text and rig.fake.ephemerals[0].user == APPROVER
    assert _buttons(rig.fake.message("C1", asked.ts)) == ["approve", "deny", "supply"]
    genuine = rig.fake.block_actions_payload("C1", asked.ts, "approve", user=APPROVER)
    assert (await rig.click(genuine)).status_code == 200
    replies = await rig.bot_replies("C1", event["ts"], 2)
    assert replies[1].text == "Done: deployed prod"
    await asyncio.sleep(0.3)
    assert len([m for m in rig.fake.thread("C1", event["ts"]) if m.bot_id]) == 2


async def _remind(rig: Rig) -> None:
    """Post a reminder of every waiting request now (a sweep whose interval has passed)."""
    service = rig.service
    assert service.repo is not None and service.broker is not None
    sent = await remind(
        service.repo,
        service.broker,
        now_ms=int(time.time() * 1000),
        interval_ms=1,
        max_attempts=3,
    )
    assert len(sent) == 1


async def _click_the_reminder(rig: Rig, copies: list[Message]) -> None:
    click = rig.fake.block_actions_payload("C1", copies[1].ts, "approve", user=APPROVER)
    assert (await rig.click(click)).status_code == 200


async def _decide_from_the_api(rig: Rig, copies: list[Message]) -> None:
    await _operate(rig, "decisions")


async def _abort_from_the_api(rig: Rig, copies: list[Message]) -> None:
    await _operate(rig, "abort")


async def _operate(rig: Rig, action: str) -> None:
    headers = {"Authorization": f"Bearer {OPERATOR}", "Idempotency-Key": f"key-{action}"}
    lanes = (await rig.http.get("/api/v1/lanes", headers=headers)).json()["items"]
    [lane] = [v for v in lanes if v["suspended"] == "approval"]
    body = None
    if action == "decisions":
        [call] = lane["pending_approvals"]
        approvals = {call["tool_call_id"]: {"action": "approve"}}
        body = {"wait_id": lane["wait_id"], "approvals": approvals}
    response = await rig.http.post(
        f"/api/v1/lanes/{lane['id']}/{action}", json=body, headers=headers
    )
    assert response.status_code == 200, response.text


async def _stop_in_the_thread(rig: Rig, copies: list[Message]) -> None:
    stop = rig.fake.mention_event("C1", "stop", user="U0AAA7", thread_ts=copies[0].thread_ts)
    await rig.event(stop)


@pytest.mark.parametrize(
    ("close", "said", "late_told"),
    [
        # the approver clicking their own decision again is the same decision: nothing to say
        pytest.param(
            _click_the_reminder, f"Approved by <@{APPROVER}>", False, id="a reminder's button"
        ),
        pytest.param(_decide_from_the_api, "Approved by operator:alice", True, id="API decision"),
        pytest.param(_abort_from_the_api, "stopped by operator:alice", True, id="API abort"),
        pytest.param(_stop_in_the_thread, "stopped by <@U0AAA7>", True, id="a stop in the thread"),
    ],
)
async def test_every_copy_of_a_request_closes_however_its_wait_ends(
    rig: Rig, close: Callable[[Rig, list[Message]], Any], said: str, late_told: bool
) -> None:
    event, asked = await _approval(rig)
    await _remind(rig)
    copies = await rig.bot_replies("C1", event["ts"], 2)
    assert [_buttons(m) for m in copies] == [["approve", "deny", "supply"]] * 2
    assert _delivery_of(copies[1]).startswith(_delivery_of(asked) + ":remind-")
    value = _value(copies[0])  # what a client that has not refreshed still shows
    await close(rig, copies)
    for copy in copies:
        await _until(lambda c=copy: _buttons(rig.fake.message("C1", c.ts)) == [])
        assert said in json.dumps(rig.fake.message("C1", copy.ts).blocks, ensure_ascii=False)
        assert "Still waiting" in copy.text or copy.ts == asked.ts  # its words are kept
    late = rig.fake.block_actions_payload("C1", copies[0].ts, "approve", user=APPROVER, value=value)
    assert (await rig.click(late)).status_code == 200  # an old view of it: nothing posted
    if late_told:
        await _until(lambda: any("Nothing was changed" in e.text for e in rig.fake.ephemerals))
    await asyncio.sleep(0.3)
    bots = [m for m in rig.fake.thread("C1", event["ts"]) if m.bot_id]
    assert all("That decision changed nothing" not in m.text for m in bots)


async def test_socket_mode_backfills_what_was_posted_while_the_link_was_down(
    socket_rig: Rig,
) -> None:
    rig = socket_rig
    adapter: Any = rig.service.adapters["slack"]
    event = rig.fake.mention_event("C1", "before the drop")
    await rig.fake.wait_ack(await rig.fake.send_event(event))
    await rig.bot_replies("C1", event["ts"], 1)
    await _until(lambda: adapter.history.backfilling is None or adapter.history.backfilling.done())
    before = adapter.backfilled
    await rig.fake.disconnect_socket()  # Slack drops the link; the next hello backfills
    missed = rig.fake.post_user_message("C1", "sent while the link was down", thread_ts=event["ts"])
    await rig.fake.wait_connected(2)
    replies = await rig.bot_replies("C1", event["ts"], 2)
    assert replies[1].text == "You said: sent while the link was down"
    assert adapter.backfilled == before + 1
    again = await rig.fake.send_event(missed)  # Slack's own late delivery of it: taken once
    await rig.fake.wait_ack(again)
    await asyncio.sleep(0.3)
    texts = await rig.user_texts(f"slack:C1:{event['ts']}")
    assert texts.count("sent while the link was down") == 1


async def test_a_request_slack_refused_is_closed_by_a_message_of_its_own(rig: Rig) -> None:
    rig.fake.fail("chat.postMessage", error="invalid_blocks")  # the request: a dead letter
    event = rig.fake.mention_event("C1", "/deploy prod")
    await rig.event(event)
    broker = rig.service.broker
    assert broker is not None
    await _until(lambda: rig.fake.calls_to("chat.postMessage") != [])
    for _ in range(200):
        dead = await broker.outbox.list("dead")
        if dead:
            break
        await asyncio.sleep(0.02)
    assert [d.id.startswith("approval_request:") for d in dead] == [True]
    await _decide_from_the_api(rig, [])
    replies = await rig.bot_replies("C1", event["ts"], 2)
    assert replies[0].text.startswith("✅ Approved by operator:alice at ")  # said, once
    assert replies[1].text == "Done: deployed prod"
    await asyncio.sleep(0.3)
    assert len([m for m in rig.fake.thread("C1", event["ts"]) if m.bot_id]) == 2


# (case, the text as Slack sends it, the text the person typed, (kept, total) or None). The
# limit counts the characters the person typed: Slack's escapes are read back first (D169).
_LIMIT = 40_000
TEXT_CUTS: list[tuple[str, str, str, tuple[int, int] | None]] = [
    ("just-under", "a" * (_LIMIT - 1), "a" * (_LIMIT - 1), None),
    ("at", "a" * _LIMIT, "a" * _LIMIT, None),
    ("just-over", "a" * (_LIMIT + 1), "a" * (_LIMIT + 1), (_LIMIT, _LIMIT + 1)),
    ("far-over", "word " * 12_000, ("word " * 12_000).strip(), (_LIMIT, 59_999)),
    ("accented-at", "é" * _LIMIT, "é" * _LIMIT, None),  # 80,000 bytes: characters count
    ("emoji-over", "😀" * (_LIMIT + 1), "😀" * (_LIMIT + 1), (_LIMIT, _LIMIT + 1)),
    # an accent written as a letter and a combining mark that straddles the limit: both go
    (
        "combining-at-the-limit",
        "x" + "e\u0301" * 20_000,
        "x" + "e\u0301" * 20_000,
        (39_999, 40_001),
    ),
    ("escapes-under", "&lt;" * 10_001, "<" * 10_001, None),  # 40,004 as sent, 10,001 typed
    ("escapes-over", "&amp;" * (_LIMIT + 1), "&" * (_LIMIT + 1), (_LIMIT, _LIMIT + 1)),
]


@pytest.mark.parametrize(
    ("sent", "typed", "cut"), [c[1:] for c in TEXT_CUTS], ids=[c[0] for c in TEXT_CUTS]
)
async def test_a_message_over_the_limit_is_cut_and_said_once_in_the_thread(
    rig: Rig, sent: str, typed: str, cut: tuple[int, int] | None
) -> None:
    event = rig.fake.mention_event("C1", sent)
    message = rig.fake.message_event("C1", event["ts"])
    assert (await rig.event(event, event_id="Ev1")).status_code == 200
    assert (await rig.event(message, event_id="Ev2")).status_code == 200  # the same message
    assert (await rig.event(event, event_id="Ev1")).status_code == 200  # Slack's retry
    lane = f"slack:C1:{event['ts']}"
    await _until(lambda: any(_delivery_of(m).startswith("reply:") for m in _bot(rig, event)))
    await _until(lambda: "eyes" not in rig.fake.message("C1", event["ts"]).reactions)
    await asyncio.sleep(0.3)  # room for a wrong second notice
    notices = [m for m in _bot(rig, event) if ":cut:" in _delivery_of(m)]
    [got] = await rig.user_texts(lane)
    if cut is None:
        assert got == typed
        assert notices == []
        return
    kept, total = cut
    note = f"[This message was cut: you have its first {kept:,} of {total:,} characters."
    assert got == f"{typed[:kept]}\n{note} The sender has been told.]"
    [notice] = notices
    assert f"I read only its first {kept:,} of {total:,} characters" in notice.text
    assert notice.thread_ts == event["ts"]
    # the notice answers nothing: the reply alone takes the working reaction off
    removed = [c.params["timestamp"] for c in rig.fake.calls_to("reactions.remove")]
    assert removed == [event["ts"]]


def _bot(rig: Rig, event: dict[str, Any]) -> list[Message]:
    return [m for m in rig.fake.thread("C1", event["ts"]) if m.bot_id]


async def test_a_cut_notice_the_outbox_could_not_hold_is_sent_on_slacks_retry_once(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = rig.service.broker
    assert broker is not None
    enqueue = broker.outbox.enqueue
    failed: list[str] = []

    async def down_once(delivery_id: str, *args: Any, **kwargs: Any) -> bool:
        if ":cut:" in delivery_id and not failed:  # the message is in the inbox, not its notice
            failed.append(delivery_id)
            raise ConnectionError("the broker went away")
        return await enqueue(delivery_id, *args, **kwargs)

    monkeypatch.setattr(broker.outbox, "enqueue", down_once)
    event = rig.fake.mention_event("C1", "a" * (_LIMIT + 1))
    assert (await rig.event(event, event_id="Ev1")).status_code == 500  # Slack sends it again
    assert (await rig.event(event, event_id="Ev1")).status_code == 200
    await _until(lambda: any(_delivery_of(m).startswith("reply:") for m in _bot(rig, event)))
    await asyncio.sleep(0.3)
    assert failed and [":cut:" in _delivery_of(m) for m in _bot(rig, event)].count(True) == 1
    assert len(await rig.user_texts(f"slack:C1:{event['ts']}")) == 1


async def test_a_mention_late_in_a_long_thread_gives_the_agent_its_newest_messages(
    rig: Rig,
) -> None:
    root = rig.fake.post_user_message("C1", "message 0", user="U0ANN")
    for number in range(1, 260):  # more than one page of conversations.replies
        rig.fake.post_user_message("C1", f"message {number}", user="U0BOB", thread_ts=root["ts"])
    mention = rig.fake.mention_event("C1", "so?", user="U0ANN", thread_ts=root["ts"])
    await rig.event(mention)
    await rig.bot_replies("C1", root["ts"], 1)
    [first] = await rig.user_texts(f"slack:C1:{root['ts']}")
    shown = "\n".join(f"U0BOB: message {n}" for n in range(210, 260))  # before: 150 to 199
    assert first == (
        "Earlier in this thread:\n(210 earlier messages are not shown.)\n"
        f"{shown}\n\nThe message to you:\nso?"
    )


@pytest.fixture
async def streaming(tmp_path: Any) -> AsyncIterator[Rig]:
    async with _running(tmp_path / "stream", socket_mode=False, stream=True) as running:
        yield running


async def test_a_streamed_answer_shows_its_status_and_stream_then_is_one_message(
    streaming: Rig,
) -> None:
    """Through the whole service: the thread's status while it works, the answer streamed
    into one message, and the durable reply finishing that message, not posting another."""
    event = streaming.fake.mention_event("C1", "/slowstream")
    await streaming.event(event)
    await streaming.fake.wait_for_call("assistant.threads.setStatus", timeout=15)
    await _until(lambda: any("slow" in status for _, _, status in streaming.fake.status_log))
    await streaming.fake.wait_for_call("chat.startStream", timeout=15)
    await streaming.fake.wait_for_call("chat.appendStream", timeout=15)
    [reply] = await streaming.bot_replies("C1", event["ts"], 1, timeout_s=20)
    # the stream stops with the whole text, then the durable reply marks it as delivered
    await _until(lambda: streaming.fake.message("C1", reply.ts).metadata is not None, 20)
    assert reply.text == STREAMED_ANSWER and not streaming.fake.streams("C1")
    assert _delivery_of(streaming.fake.message("C1", reply.ts)).startswith("reply:slack-C1:")
    await asyncio.sleep(0.3)
    assert [m.text for m in streaming.fake.thread("C1", event["ts"]) if m.bot_id] == [
        STREAMED_ANSWER
    ]
    assert streaming.fake.status_log[-1][2] == ""  # the status cleared at the end
