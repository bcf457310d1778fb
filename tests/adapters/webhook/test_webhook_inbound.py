"""Inbound: signed requests at /webhook/events, every refusal one envelope and nothing stored.

The channel's router runs in an app of its own with a test sink (`tests.adapters.kit.TestSink`)
and a manual clock; the requests are signed by `WebhookPeer`, which shares no code with the
channel's signature check.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from adapters.channel import (
    ApprovalClosed,
    ChannelAdapter,
    DecisionRefused,
    DeliveryError,
    NotRouted,
    Outbound,
    ThreadRef,
)
from adapters.webhook.channel import WebhookChannel, WebhookLimits
from adapters.webhook.delivery import WebhookDelivery
from adapters.webhook.signing import secret_key
from harness_core.testing import ManualClock
from tests.adapters.kit import TestSink, unavailable
from tests.support.webhook_peer import EVENTS, WebhookPeer, new_secret

SECRET = new_secret("inbound")
APPROVER = "alice"
STRANGER = "mallory"


class Rig:
    def __init__(
        self, channel: WebhookChannel, sink: TestSink, clock: ManualClock, http: httpx.AsyncClient
    ) -> None:
        self.channel = channel
        self.sink = sink
        self.clock = clock
        self.http = http
        self.peer = WebhookPeer(secret=SECRET, now=lambda: clock.now_ms() / 1000)

    async def send(self, payload: Any, **signing: Any) -> httpx.Response:
        return await self.peer.send(self.http, payload, **signing)

    async def refused(self, payload: Any, status: int, code: str, **signing: Any) -> str:
        """Send `payload`: refused with `status` and `code`, one envelope, nothing stored."""
        response = await self.send(payload, **signing)
        return self.check_refusal(response, status, code)

    def check_refusal(self, response: httpx.Response, status: int, code: str) -> str:
        assert response.status_code == status, response.text
        body = response.json()
        assert list(body) == ["error"] and set(body["error"]) == {"code", "message"}
        assert body["error"]["code"] == code, body
        assert self.sink.inbound == [] and self.sink.decisions == []
        message: str = body["error"]["message"]
        assert message and "\n" not in message
        return message


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    clock = ManualClock()
    sink = TestSink()
    delivery = WebhookDelivery(
        url="http://127.0.0.1:9/unused", key=secret_key(SECRET), clock=clock, timeout_s=1
    )
    channel = WebhookChannel(
        delivery=delivery,
        inbound_keys=(secret_key(SECRET),),
        approvers=(APPROVER,),
        clock=clock,
        limits=WebhookLimits(max_body_bytes=16384, max_text_chars=100),
    )
    await channel.start(sink)
    app = FastAPI()
    assert channel.router is not None
    app.include_router(channel.router)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        yield Rig(channel, sink, clock, http)
    await channel.close()


MESSAGE = {"thread": "t1", "text": "hello", "author": {"id": "u1", "name": "Una"}}


def _decision(author: str = APPROVER, **extra: Any) -> dict[str, Any]:
    return {
        "type": "decision",
        "thread": "t1",
        "run_id": "run-1",
        "wait_id": "wait-1",
        "decisions": [{"tool_call_id": "call-1", "args_digest": "d1", "approved": True}],
        "author": {"id": author},
        **extra,
    }


async def test_a_signed_message_is_held_then_acknowledged(rig: Rig) -> None:
    response = await rig.send(
        {**MESSAGE, "space": "default", "reply_context": {"chat": 42}}, msg_id="msg_1"
    )
    assert response.status_code == 202, response.text
    answer = response.json()
    assert answer["lane"] == "webhook:t1" and answer["duplicate"] is False
    assert (answer["message_id"], answer["thread"], answer["space"]) == ("msg_1", "t1", "default")
    [inbound] = rig.sink.inbound
    assert inbound.thread.lane == "webhook:t1" and inbound.thread.space == "default"
    assert inbound.message_id == "msg_1"  # the webhook-id, when the body names none
    assert (inbound.author.id, inbound.author.name, inbound.text) == ("u1", "Una", "hello")
    assert dict(inbound.reply_context) == {"chat": 42}
    assert inbound.received_at_ms == rig.clock.now_ms()


async def test_a_redelivery_is_the_same_message_and_a_duplicate(rig: Rig) -> None:
    first = await rig.send(MESSAGE, msg_id="msg_again")
    rig.clock.advance(60_000)
    again = await rig.send(MESSAGE, msg_id="msg_again")  # signed anew, as the spec asks
    named = await rig.send({**MESSAGE, "message_id": "m-7"}, msg_id="msg_a")
    named_again = await rig.send({**MESSAGE, "message_id": "m-7"}, msg_id="msg_b")
    assert [r.status_code for r in (first, again, named, named_again)] == [202] * 4
    assert [r.json()["duplicate"] for r in (first, again, named, named_again)] == [
        False,
        True,
        False,
        True,
    ]
    assert {m.dedupe_key for m in rig.sink.inbound} == {
        "webhook:default:msg_again",
        "webhook:default:m-7",
    }
    reused = await rig.send({**MESSAGE, "thread": "t2", "message_id": "m-7"}, msg_id="msg_c")
    assert reused.status_code == 409  # not m-7 sent again: another thread's message
    assert reused.json()["error"]["code"] == "message_id_taken"
    assert "(webhook:t1)" in reused.json()["error"]["message"]
    for changed in ({"text": "goodbye"}, {"author": {"id": "u2"}}):  # nor another text or author
        other = await rig.send({**MESSAGE, **changed, "message_id": "m-7"}, msg_id="msg_d")
        assert other.status_code == 409, other.text
        assert "another message of this thread" in other.json()["error"]["message"]
    renamed = await rig.send({**MESSAGE, "author": {"id": "u1", "name": "U"}, "message_id": "m-7"})
    assert renamed.json()["duplicate"] is True  # a display name is not the message
    recontext = await rig.send({**MESSAGE, "message_id": "m-7", "reply_context": {"n": 9}})
    assert recontext.json()["duplicate"] is True  # nor what comes back: the first one's stands


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
async def test_an_unsigned_request_is_refused_unread(rig: Rig, missing: str) -> None:
    body, headers = rig.peer.signed(MESSAGE)
    del headers[missing]
    response = await rig.peer.send_raw(rig.http, body, headers)
    assert "webhook-signature" in rig.check_refusal(response, 401, "unsigned")


async def test_headers_and_timestamp_are_checked_before_a_byte_of_the_body_is_read(
    rig: Rig,
) -> None:
    pulled: list[int] = []

    async def body() -> AsyncIterator[bytes]:
        for number in range(3):
            pulled.append(number)
            yield b'{"thread": "t1", "text": "x"}'[number:]

    now = rig.clock.now_ms() // 1000
    _, stale = rig.peer.signed(MESSAGE, timestamp=now - 3600)
    _, unsigned = rig.peer.signed(MESSAGE)
    del unsigned["webhook-signature"]
    for headers, code in ((stale, "stale_timestamp"), (unsigned, "unsigned")):
        response = await rig.http.post(EVENTS, content=body(), headers=headers)
        rig.check_refusal(response, 401, code)
    assert pulled == []


async def test_a_wrong_signature_secret_or_body_is_refused(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="adapters.webhook"):
        await rig.refused(MESSAGE, 401, "bad_signature", secret=new_secret("someone else"))
    # who sent it, under which id: the line said only the code
    [line] = [r for r in caplog.records if r.getMessage() == "webhook refused"]
    assert line.__dict__["code"] == "bad_signature" and line.__dict__["client"]
    assert str(line.__dict__["webhook_id"]).startswith("msg_")
    body, headers = rig.peer.signed(MESSAGE)
    tampered = body.replace(b"hello", b"HELLO")
    rig.check_refusal(await rig.peer.send_raw(rig.http, tampered, headers), 401, "bad_signature")
    forged = {**headers, "webhook-signature": "v1,AAAA v1a,BBBB garbage"}
    rig.check_refusal(await rig.peer.send_raw(rig.http, body, forged), 401, "bad_signature")


async def test_a_stale_or_future_timestamp_is_refused(rig: Rig) -> None:
    now = rig.clock.now_ms() // 1000
    message = await rig.refused(MESSAGE, 401, "stale_timestamp", timestamp=now - 301)
    assert "-301" not in message and "301 s" in message
    await rig.refused(MESSAGE, 401, "stale_timestamp", timestamp=now + 301)
    ok = await rig.send(MESSAGE, timestamp=now - 299)
    assert ok.status_code == 202


async def test_a_captured_request_replayed_later_is_refused(rig: Rig) -> None:
    body, headers = rig.peer.signed(MESSAGE, msg_id="msg_captured")
    assert (await rig.peer.send_raw(rig.http, body, headers)).status_code == 202
    replayed = await rig.peer.send_raw(rig.http, body, headers)  # at once: the same message
    assert replayed.status_code == 202 and replayed.json()["duplicate"] is True
    rig.clock.advance(301_000)
    rig.sink.inbound.clear()
    late = await rig.peer.send_raw(rig.http, body, headers)
    rig.check_refusal(late, 401, "stale_timestamp")


async def test_an_id_with_a_dot_is_refused(rig: Rig) -> None:
    await rig.refused(MESSAGE, 401, "invalid_webhook_id", msg_id="msg.1")


HOSTILE: list[tuple[bytes, str, str]] = [
    (b"", "invalid_json", "empty"),
    (b"   ", "invalid_json", "empty"),
    (b"{not json", "invalid_json", "not valid JSON"),
    (b'{"thread": "t1", "text": NaN}', "invalid_json", "not valid JSON"),
    (b'{"thread": "t1", "text": "x", "reply_context": {"n": Infinity}}', "invalid_json", "JSON"),
    (b"\xff\xfe{}", "invalid_json", "not UTF-8"),
    ('{"thread": "t1", "text": "x"}'.encode("utf-16"), "invalid_json", "not UTF-8"),
    (b'{"thread": "t1", "text": "x", "text": "y"}', "invalid_json", "a key twice"),
    (b'{"thread": "t1", "text": "x", "reply_context": {"k": 1, "k": 2}}', "invalid_json", "twice"),
    (b"[" * 3000 + b"]" * 3000, "invalid_json", "nested too deep"),
    (b'{"thread": "t1", "text": 1' + b"0" * 5000 + b"}", "invalid_json", "not valid JSON"),
    (b"null", "invalid_request", "JSON object"),
    (b'["thread", "text"]', "invalid_request", "JSON object"),
    (b'{"thread": "t1", "text": 5}', "invalid_request", "'text'"),
    (b'{"thread": ["t1"], "text": "x"}', "invalid_request", "'thread'"),
    (b'{"thread": "t1", "text": "x", "author": "bob"}', "invalid_request", "'author'"),
    (b'{"thread": "t1", "text": "x", "author": {"id": ""}}', "invalid_request", "'author.id'"),
    # the gateway's own names for who acted: "[operator:alice] x" read as an operator's
    (
        b'{"thread": "t1", "text": "x", "author": {"id": "operator:alice"}}',
        "invalid_request",
        "operator:",
    ),
    (
        b'{"thread": "t1", "text": "x", "author": {"id": " Gateway:w1"}}',
        "invalid_request",
        "gateway:",
    ),
    (b'{"thread": "t1"}', "invalid_request", "'text' is required"),
    (b'{"text": "x"}', "invalid_request", "'thread' is required"),
    (b'{"thread": "t 1", "text": "x"}', "invalid_request", "'thread'"),
    (b'{"thread": "t1", "space": "../x", "text": "x"}', "invalid_request", "'space'"),
    (b'{"thread": "t1", "space": "' + b"s" * 65 + b'", "text": "x"}', "invalid_request", "1-64"),
    (b'{"thread": "x!#", "text": "x"}', "invalid_request", "'thread' must be 1-200 ASCII"),
    (b'{"thread": "t1", "text": "x", "colour": "red"}', "invalid_request", "unknown field"),
    (b'{"type": "ping", "thread": "t1"}', "invalid_request", "'type'"),
    (b'{"type": 7, "thread": "t1"}', "invalid_request", "'type'"),
    (b'{"thread": "t1", "text": "  \\n "}', "empty_text", "empty"),
    (b'{"thread": "t1", "text": "' + b"x" * 101 + b'"}', "text_too_long", "101 characters"),
    (b'{"thread": "t1", "text": "a\\u0000b"}', "invalid_text", "NUL"),
    (b'{"thread": "t1", "text": "\\ud800"}', "invalid_text", "Unicode"),
    (b'{"thread": "t1", "text": "x", "author": {"id": "\\ud800"}}', "invalid_text", "Unicode"),
    (b'{"thread": "t1", "text": "x", "reply_context": {"k": "\\udfff"}}', "invalid_text", "Uni"),
    (
        b'{"thread": "t1", "text": "x", "reply_context": {"k": "' + b"y" * 4100 + b'"}}',
        "invalid_request",
        "'reply_context'",
    ),
    (
        b'{"thread": "t1", "text": "x", "reply_context": '
        + b'{"a": ' * 70
        + b"1"
        + b"}" * 70
        + b"}",
        "invalid_request",
        "reply_context",
    ),
    (b'{"type": "decision", "thread": "t1"}', "invalid_request", "required"),
]


@pytest.mark.parametrize(("body", "code", "words"), HOSTILE)
async def test_hostile_bodies_are_one_clear_error_and_store_nothing(
    rig: Rig, body: bytes, code: str, words: str
) -> None:
    message = await rig.refused(body, 400, code)
    assert words in message, message


async def test_a_body_over_the_limit_is_refused(rig: Rig) -> None:
    big = {**MESSAGE, "text": "x" * 17000}
    assert "16384 bytes" in await rig.refused(big, 413, "too_large")


async def test_a_body_that_is_not_json_is_refused_as_such(rig: Rig) -> None:
    body, headers = rig.peer.signed(b"text=hello")
    headers["content-type"] = "application/x-www-form-urlencoded"
    response = await rig.peer.send_raw(rig.http, body, headers)
    rig.check_refusal(response, 415, "unsupported_media_type")


async def test_only_an_approver_decides(rig: Rig) -> None:
    message = await rig.refused(_decision(STRANGER), 403, "not_approver")
    assert STRANGER in message
    response = await rig.send(_decision(session="webhook-default"), msg_id="msg_click")
    assert response.status_code == 202, response.text
    [decision] = rig.sink.decisions
    assert (decision.run_id, decision.wait_id, decision.session) == (
        "run-1",
        "wait-1",
        "webhook-default",
    )
    assert decision.decided_by.id == APPROVER
    assert decision.idempotency_key.startswith("webhook-")  # from what it decides, not the id
    [item] = decision.decisions
    assert (item.tool_call_id, item.args_digest, item.approved) == ("call-1", "d1", True)
    assert response.json()["idempotency_key"] == decision.idempotency_key


async def test_the_same_decision_sent_twice_is_one_and_a_named_key_is_kept(rig: Rig) -> None:
    first = await rig.send(_decision(), msg_id="msg_click")
    again = await rig.send(_decision(), msg_id="msg_click_again")  # a double click: a new id
    denied = await rig.send(
        _decision(decisions=[{**_decision()["decisions"][0], "approved": False}])
    )
    named = await rig.send(_decision(idempotency_key="k-1"))
    assert [r.status_code for r in (first, again, denied, named)] == [202] * 4
    assert [r.json()["duplicate"] for r in (first, again, denied, named)] == [
        False,
        True,
        False,
        False,
    ]
    keys = [d.idempotency_key for d in rig.sink.decisions]
    assert keys[0] == keys[1] != keys[2] and keys[3] == "k-1"


async def test_a_decision_deciding_one_call_twice_is_refused(rig: Rig) -> None:
    twice = _decision()
    twice["decisions"] = twice["decisions"] * 2
    assert "twice" in await rig.refused(twice, 400, "invalid_request")


class _RefusingSink(TestSink):
    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.refusal = error

    async def decide(self, decision: Any) -> Any:
        raise self.refusal


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (
            DecisionRefused("no_wait", "nothing waits for wait-1 in this thread"),
            409,
            "no_such_request",
        ),
        (DecisionRefused("mismatch", "it names other calls"), 409, "not_the_request"),
        (
            DecisionRefused(
                "closed",
                "it was approved by bob",
                ApprovalClosed(
                    session="s",
                    run_id="run-1",
                    wait_id="wait-1",
                    request_delivery_id="r",
                    requested_at_ms=1,
                    outcome="approved",
                    at_ms=2,
                ),
            ),
            409,
            "no_longer_waiting",
        ),
        (NotRouted("no session serves this space"), 404, "not_routed"),
        (unavailable(), 503, "unavailable"),
    ],
)
async def test_a_decision_the_gateway_refuses_is_said_plainly(
    rig: Rig, error: Exception, status: int, code: str
) -> None:
    rig.sink = _RefusingSink(error)
    await rig.channel.start(rig.sink)
    response = await rig.send(_decision())
    assert response.status_code == status and response.json()["error"]["code"] == code
    assert response.json()["error"]["message"] == str(error)


async def test_a_sink_that_cannot_hold_it_is_503_and_a_retry_is_taken(rig: Rig) -> None:
    rig.sink.error = unavailable()
    body, headers = rig.peer.signed(MESSAGE, msg_id="msg_retry")
    response = await rig.peer.send_raw(rig.http, body, headers)
    assert response.status_code == 503 and response.headers["retry-after"] == "2"
    assert response.json()["error"]["code"] == "unavailable"
    rig.sink.error = None
    rig.sink.inbound.clear()
    assert (await rig.peer.send_raw(rig.http, body, headers)).status_code == 202
    assert [m.message_id for m in rig.sink.inbound] == ["msg_retry"]


async def test_a_stopped_channel_refuses_and_a_routeless_space_is_404(rig: Rig) -> None:
    rig.sink.routes = {}
    response = await rig.send(MESSAGE)
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_routed"
    rig.sink.inbound.clear()
    await rig.channel.stop()
    await rig.refused(MESSAGE, 503, "unavailable")


async def test_a_reply_for_another_channels_thread_is_a_dead_letter(rig: Rig) -> None:
    other = Outbound(
        delivery_id="reply:s:r",
        thread=ThreadRef(channel="web", space="default", thread="t1"),
        kind="reply",
        text="hi",
    )
    with pytest.raises(DeliveryError) as failed:
        await rig.channel.deliver(other)
    assert failed.value.permanent and "not a webhook thread" in failed.value.reason


def test_the_channel_says_what_it_can_do_and_bounds_its_bodies(rig: Rig) -> None:
    assert isinstance(rig.channel, ChannelAdapter)
    caps = rig.channel.capabilities
    assert (caps.threads, caps.decisions, caps.approvers) == (True, True, True)
    assert not caps.reconciles  # no status URL: it cannot see what arrived (D195)
    assert (caps.edits, caps.streaming, caps.files) == (False, False, False)
    assert rig.channel.body_limits == {"/webhook/": 16384}
    assert rig.channel.name == "webhook"
    assert rig.channel.router is not None
    routes = [(r.path, sorted(r.methods)) for r in rig.channel.router.routes]  # type: ignore[attr-defined]
    assert routes == [(EVENTS, ["POST"])]
