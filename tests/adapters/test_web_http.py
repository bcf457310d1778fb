"""The web channel through its real HTTP API (FastAPI app, httpx over ASGI) with a test sink."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from adapters.channel import (
    ApprovalView,
    ChannelAdapter,
    DeliveryError,
    PendingCall,
    Unavailable,
)
from adapters.web import MailboxUnavailable, MemoryMailbox, WebChannel, WebLimits, WebMailbox
from adapters.web.mailbox import MailboxError
from adapters.web.page import _STYLE, _THREAD_SCRIPT
from adapters.web.sqlite import SqliteMailbox
from harness_core import SequentialIds
from harness_core.session.records import MAX_SUPPLIED_CHARS
from harness_core.testing import ManualClock
from tests.adapters.kit import TestSink, outbound

URL = "/web/threads/t1/messages"


def error(response: httpx.Response) -> tuple[int, str]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    assert body["error"]["message"]
    return response.status_code, body["error"]["code"]


def approval(wait_id: str = "wait-1", calls: int = 1) -> ApprovalView:
    return ApprovalView(
        session="s1",
        run_id="run-1",
        wait_id=wait_id,
        calls=tuple(
            PendingCall(
                tool_call_id=f"c{n}",
                tool_name="deploy",
                args={"build": n},
                args_digest=f"digest-{n}",
            )
            for n in range(1, calls + 1)
        ),
    )


def test_web_channel_is_a_channel_adapter(channel: WebChannel) -> None:
    assert isinstance(channel, ChannelAdapter)
    assert channel.name == "web"


# -- posting messages ---------------------------------------------------------------------------


async def test_a_post_becomes_an_inbound_and_is_acknowledged_with_the_acceptance(
    client: httpx.AsyncClient, sink: TestSink, clock: ManualClock
) -> None:
    response = await client.post(
        URL, json={"text": "hello", "client_message_id": "m-1", "author": "ann"}
    )
    assert response.status_code == 202
    assert response.json() == {
        "item_id": "item-1",
        "session": "s1",
        "lane": "web:t1",
        "duplicate": False,
        "message_id": "m-1",
        "space": "default",
        "thread": "t1",
        "seq": 1,
    }
    [inbound] = sink.inbound
    assert inbound.thread.channel == "web" and inbound.thread.space == "default"
    assert inbound.thread.lane == "web:t1"
    assert (inbound.message_id, inbound.text) == ("m-1", "hello")
    assert inbound.author.id == "ann" and inbound.author.name == "ann"
    assert not inbound.author.is_bot
    assert inbound.received_at_ms == clock.now_ms()
    assert inbound.dedupe_key == "web:default:m-1"


async def test_the_post_is_acknowledged_only_after_the_sink_returned(
    client: httpx.AsyncClient, sink: TestSink, channel: WebChannel
) -> None:
    sink.gate = asyncio.Event()
    posting = asyncio.create_task(client.post(URL, json={"text": "hello"}))
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert sink.inbound and not posting.done()
    # the thread holds it before the sink is asked (D162): its reply can only come after it
    assert [i.kind for i in await channel.mailbox.read("default", "t1")] == ["message"]
    sink.gate.set()
    assert (await posting).status_code == 202
    assert len(await channel.mailbox.read("default", "t1")) == 1


async def test_a_message_id_is_generated_when_the_client_sends_none(
    client: httpx.AsyncClient, sink: TestSink
) -> None:
    first = await client.post(URL, json={"text": "one"})
    second = await client.post(URL, json={"text": "one"})
    assert first.json()["message_id"] == "web-id-1"
    assert second.json()["message_id"] == "web-id-2"
    assert [i.message_id for i in sink.inbound] == ["web-id-1", "web-id-2"]


async def test_a_repeated_client_message_id_is_the_same_message(
    client: httpx.AsyncClient, sink: TestSink
) -> None:
    """A client's retry: the sink sees the same dedupe key and answers duplicate."""
    first = await client.post(URL, json={"text": "hello", "client_message_id": "m-1"})
    again = await client.post(URL, json={"text": "hello", "client_message_id": "m-1"})
    assert again.status_code == 202
    assert again.json()["duplicate"] is True
    assert again.json()["item_id"] == first.json()["item_id"]
    assert [i.dedupe_key for i in sink.inbound] == ["web:default:m-1"] * 2
    thread = (await client.get("/web/threads/t1")).json()
    assert [i["id"] for i in thread["items"]] == ["m-1"]  # kept once


async def test_a_client_message_id_naming_another_message_is_refused(
    client: httpx.AsyncClient, sink: TestSink
) -> None:
    await client.post(URL, json={"text": "hello", "client_message_id": "m-1"})
    other_text = await client.post(URL, json={"text": "bye", "client_message_id": "m-1"})
    assert error(other_text) == (409, "message_id_taken")
    assert "another message of this thread" in other_text.json()["error"]["message"]
    thread = (await client.get("/web/threads/t1")).json()["items"]
    assert [(i["id"], i["text"]) for i in thread] == [("m-1", "hello")]  # the first stays
    elsewhere = await client.post(
        "/web/threads/t2/messages", json={"text": "hello", "client_message_id": "m-1"}
    )
    assert error(elsewhere) == (409, "message_id_taken")
    assert "(web:t1)" in elsewhere.json()["error"]["message"]
    shown = (await client.get("/web/threads/t2")).json()["items"]  # shown, and said untaken
    assert [i["kind"] for i in shown] == ["message", "failure_notice"]
    assert "already names a message of another thread" in shown[1]["text"]
    # the same id is refused for ever: the notice no longer says to send it again
    assert shown[1]["text"].endswith("give each message its own id.")
    assert len(sink.accepted) == 1


async def test_the_same_client_id_in_another_space_is_another_message(
    client: httpx.AsyncClient, sink: TestSink
) -> None:
    sink.routes["team"] = "s2"
    await client.post(URL, json={"text": "a", "client_message_id": "m-1"})
    other = await client.post(URL, json={"text": "a", "client_message_id": "m-1", "space": "team"})
    assert other.json()["duplicate"] is False and other.json()["session"] == "s2"


async def test_author_forms(client: httpx.AsyncClient, sink: TestSink) -> None:
    await client.post(URL, json={"text": "a"})
    await client.post(URL, json={"text": "b", "author": {"id": "u-7", "name": "Ann"}})
    await client.post(URL, json={"text": "c", "author": None})
    assert [(i.author.id, i.author.name) for i in sink.inbound] == [
        ("anonymous", None),
        ("u-7", "Ann"),
        ("anonymous", None),
    ]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"", 400, "invalid_json"),
        (b"{", 400, "invalid_json"),
        (b"\xff\xfe{}", 400, "invalid_json"),
        ('{"text": "hi"}'.encode("utf-16"), 400, "invalid_json"),  # UTF-8 only, as the webhook
        (b'{"text": "hi", "text": "ho"}', 400, "invalid_json"),  # which one was meant?
        (b'{"text": "hi", "author": {"id": "a", "id": "b"}}', 400, "invalid_json"),
        (b'{"text": NaN}', 400, "invalid_json"),
        (b"[" * 5000 + b"]" * 5000, 400, "invalid_json"),
        (b"[]", 400, "invalid_request"),
        (b'"text"', 400, "invalid_request"),
        (b"{}", 400, "empty_text"),  # no text and no file: nothing to say
        (b'{"text": ""}', 400, "empty_text"),
        (b'{"text": "  \\n\\t "}', 400, "empty_text"),
        (b'{"text": " \\u200b\\ufeff\\u2060 "}', 400, "empty_text"),  # invisible: was taken
        (b'{"text": 5}', 400, "invalid_request"),
        (b'{"text": null}', 400, "invalid_request"),
        (b'{"text": ["a"]}', 400, "invalid_request"),
        (b'{"text": "hi", "txt": "typo"}', 400, "invalid_request"),
        (b'{"text": "a\\u0000b"}', 400, "invalid_text"),
        (b'{"text": "\\ud800"}', 400, "invalid_text"),
        (b'{"text": "hi", "client_message_id": ""}', 400, "invalid_request"),
        (b'{"text": "hi", "client_message_id": "has space"}', 400, "invalid_request"),
        (b'{"text": "hi", "client_message_id": 7}', 400, "invalid_request"),
        (b'{"text": "hi", "space": "a/b"}', 400, "invalid_space"),
        (b'{"text": "hi", "space": ""}', 400, "invalid_space"),
        (b'{"text": "hi", "author": {"name": "no id"}}', 400, "invalid_request"),
        (b'{"text": "hi", "author": {"id": "x", "is_bot": true}}', 400, "invalid_request"),
        (b'{"text": "hi", "author": 12}', 400, "invalid_request"),
        (b'{"text": "hi", "author": "operator:admin"}', 400, "invalid_request"),  # poses
        (b'{"text": "hi", "author": {"id": " Operator:local"}}', 400, "invalid_request"),
        # the name is what the thread shows: "operator:alice: approved"
        (
            b'{"text": "hi", "author": {"id": "u1", "name": "operator:alice"}}',
            400,
            "invalid_request",
        ),
        # what passes for one: a zero-width space, a Greek omicron, a fullwidth colon, and a
        # right-to-left override (U+202E before "nimda" shows it as "admin")
        (b'{"text": "hi", "author": "operator\\u200b:alice"}', 400, "invalid_request"),
        (b'{"text": "hi", "author": "operat\\u03bfr:admin"}', 400, "invalid_request"),
        (
            b'{"text": "hi", "author": {"id": "x", "name": "operator\\uff1aadmin"}}',
            400,
            "invalid_request",
        ),
        (b'{"text": "hi", "author": "\\u202enimda"}', 400, "invalid_request"),
        # the page shows a reply as "assistant": a message of one read as the agent's reply
        (b'{"text": "hi", "author": "Assistant "}', 400, "invalid_request"),
        (b'{"text": "hi", "author": {"id": "u1", "name": "\\uff41gent"}}', 400, "invalid_request"),
        (b'{"text": "hi", "author": {"id": "SYSTEM"}}', 400, "invalid_request"),
        (b'{"text": "hi", "author": "' + b"a" * 101 + b'"}', 400, "invalid_request"),
        (b'{"text": "hi", "author": "a\\u0000"}', 400, "invalid_text"),
        (b'{"text": "hi", "author": {"id": "\\udfff"}}', 400, "invalid_text"),
        (b'{"text": "hi", "space": "' + b"s" * 201 + b'"}', 400, "invalid_space"),
        (b'{"text": "hi", "space": null}', 400, "invalid_request"),
    ],
)
async def test_hostile_bodies_are_refused_clearly(
    client: httpx.AsyncClient, sink: TestSink, body: bytes, status: int, code: str
) -> None:
    response = await client.post(URL, content=body, headers={"content-type": "application/json"})
    assert error(response) == (status, code)
    assert sink.inbound == []


async def test_a_body_with_a_byte_order_mark_is_read_and_a_repeated_key_is_named(
    client: httpx.AsyncClient, sink: TestSink
) -> None:
    marked = await client.post(
        URL, content=b'\xef\xbb\xbf{"text": "hi"}', headers={"content-type": "application/json"}
    )
    assert marked.status_code == 202, marked.text
    assert [item.text for item in sink.inbound] == ["hi"]
    twice = await client.post(
        URL, content=b'{"text": "a", "text": "b"}', headers={"content-type": "application/json"}
    )
    assert "gives a key twice" in twice.json()["error"]["message"]


async def test_a_client_id_outside_ascii_is_refused_by_a_rule_that_says_ascii(
    client: httpx.AsyncClient, sink: TestSink
) -> None:
    response = await client.post(URL, json={"text": "hi", "client_message_id": "é-1"})
    assert error(response) == (400, "invalid_request")
    assert "ASCII letters, digits" in response.json()["error"]["message"]
    decided = await client.post(
        "/web/threads/t1/decisions", json=decision_body(idempotency_key="é-1")
    )
    assert "ASCII letters, digits" in decided.json()["error"]["message"]
    assert sink.inbound == [] and sink.decisions == []


async def test_huge_text_is_refused(client: httpx.AsyncClient, sink: TestSink) -> None:
    response = await client.post(URL, json={"text": "x" * 1001})
    assert error(response) == (400, "text_too_long")
    assert "1000" in response.json()["error"]["message"]
    assert (await client.post(URL, json={"text": "x" * 1000})).status_code == 202
    assert (await client.post(URL, json={"text": "\U0001f600" * 1000})).status_code == 202


async def test_a_huge_body_is_refused_before_it_is_read(
    client: httpx.AsyncClient, sink: TestSink
) -> None:
    response = await client.post(URL, json={"text": "x" * 20_000})
    assert error(response) == (413, "too_large")

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: capped while streaming
        for _ in range(100):
            yield b" " * 1000

    json_type = {"content-type": "application/json"}
    streamed = await client.post(URL, content=chunks(), headers=json_type)
    assert error(streamed) == (413, "too_large")
    assert sink.inbound == []


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("text/plain", 415),  # what a cross-site <form enctype="text/plain"> sends
        ("application/x-www-form-urlencoded", 415),
        ("multipart/form-data; boundary=x", 415),
        ("", 415),
        ("application/json; charset=utf-8", 202),
        ("Application/JSON", 202),
    ],
)
async def test_posts_must_be_json(
    client: httpx.AsyncClient, sink: TestSink, content_type: str, status: int
) -> None:
    body = json.dumps({"text": "hi"}).encode()
    for path in (URL, "/web/threads/t1/decisions"):
        payload = body if path == URL else json.dumps(decision_body()).encode()
        response = await client.post(path, content=payload, headers={"content-type": content_type})
        assert response.status_code == status
        if status == 415:
            assert error(response) == (415, "unsupported_media_type")
    if status == 415:
        assert sink.inbound == [] and sink.decisions == []


@pytest.mark.parametrize(
    ("site", "status"),
    [("cross-site", 403), ("same-site", 403), ("same-origin", 202), ("none", 202)],
)
async def test_cross_site_posts_are_refused(
    client: httpx.AsyncClient, sink: TestSink, site: str, status: int
) -> None:
    """A page on another site (another port of localhost is same-site) cannot post or approve."""
    headers = {"sec-fetch-site": site}
    message = await client.post(URL, json={"text": "hi"}, headers=headers)
    decision = await client.post("/web/threads/t1/decisions", json=decision_body(), headers=headers)
    assert (message.status_code, decision.status_code) == (status, status)
    if status == 403:
        assert error(message) == (403, "cross_site")
        assert sink.inbound == [] and sink.decisions == []


# A thread id as sent in the URL, and the thread it names (None: refused with the rule).
# The rule says "letters (of any script)" and means it (D165); one spelling per thread (NFC).
THREAD_NAMES = [
    ("a", "a"),
    ("A-b_c.d", "A-b_c.d"),
    ("0" * 200, "0" * 200),
    (".a", ".a"),
    ("-", "-"),
    ("caf%C3%A9", "café"),  # é composed
    ("cafe%CC%81", "café"),  # é typed as e + a combining accent: the same thread
    ("%C3%A9" * 200, "é" * 200),
    ("e%CC%81" * 200, "é" * 200),  # 400 code points as sent, 200 composed
    ("%E6%97%A5%E6%9C%AC", "日本"),
    ("%D0%BF%D1%80%D0%B8%D0%B2%D0%B5%D1%82", "привет"),
    ("%E0%A4%B9%E0%A4%BF%E0%A4%A8%E0%A5%8D%E0%A4%A6%E0%A5%80", "हिन्दी"),  # marks after letters
    ("%D9%A3%D9%A4", "٣٤"),  # Arabic-Indic digits
    ("bad%20id", None),
    ("a" * 201, None),
    ("%C3%A9" * 201, None),
    ("...", None),
    ("t%00", None),
    ("%F0%9F%98%80", None),  # an emoji is no letter
    ("a%7Bb%7D", None),
    ("a:b", None),
    ("%CC%81a", None),  # a mark with nothing to mark
    ("a-%CC%81", None),
    ("a%E2%80%8Bb", None),  # zero-width space
    ("%E2%80%AEabc", None),  # right-to-left override
    ("%C2%B2", None),  # superscript two: a number, not a digit
    ("%E2%85%AB", None),  # Roman numeral twelve
    ("a%EF%BC%8Fb", None),  # fullwidth solidus
    ("%ED%A0%80", None),  # a lone surrogate's bytes
]


@pytest.mark.parametrize(("sent", "thread"), THREAD_NAMES)
async def test_thread_ids(
    client: httpx.AsyncClient, sink: TestSink, sent: str, thread: str | None
) -> None:
    posted = await client.post(f"/web/threads/{sent}/messages", json={"text": "hi"})
    read = await client.get(f"/web/threads/{sent}")
    if thread is None:
        assert error(posted) == (400, "invalid_thread")
        assert posted.json()["error"]["message"] == (
            "thread must be 1-200 letters (of any script), digits, '.', '_' and '-', not only "
            "dots, in Unicode's composed form (NFC)"
        )
        assert error(read) == (400, "invalid_thread")
        assert sink.inbound == []
        return
    assert posted.status_code == 202, posted.text
    assert posted.json()["thread"] == thread and posted.json()["lane"] == f"web:{thread}"
    [inbound] = sink.inbound
    assert inbound.thread.thread == thread
    assert [i["text"] for i in read.json()["items"]] == ["hi"]
    assert read.json()["thread"] == thread


@pytest.mark.parametrize(
    ("space", "taken"), [("équipe", True), ("e\u0301quipe", True), ("a b", False)]
)
async def test_spaces_follow_the_same_rule(
    client: httpx.AsyncClient, sink: TestSink, space: str, taken: bool
) -> None:
    sink.routes = {"équipe": "s-equipe"}
    posted = await client.post(URL, json={"text": "hi", "space": space})
    if not taken:
        assert error(posted) == (400, "invalid_space")
        return
    assert posted.status_code == 202 and posted.json()["space"] == "équipe"
    assert posted.json()["session"] == "s-equipe"


async def test_an_unrouted_space_is_404_and_the_thread_says_it_was_not_taken(
    client: httpx.AsyncClient, sink: TestSink
) -> None:
    response = await client.post(URL, json={"text": "hi", "space": "nowhere"})
    assert error(response) == (404, "not_routed")
    assert "nowhere" in response.json()["error"]["message"]
    items = (await client.get("/web/threads/t1?space=nowhere")).json()["items"]
    assert [i["kind"] for i in items] == ["message", "failure_notice"]  # shown, and not taken
    assert "not taken" in items[1]["text"] and "nowhere" in items[1]["text"]


async def test_an_unavailable_gateway_is_503_with_retry_after(
    client: httpx.AsyncClient, sink: TestSink
) -> None:
    sink.error = Unavailable("inbox is down")
    for _ in range(2):  # refused twice: one notice
        response = await client.post(URL, json={"text": "hi", "client_message_id": "m-1"})
        assert error(response) == (503, "unavailable")
        assert response.headers["retry-after"] == "2"
    items = (await client.get("/web/threads/t1")).json()["items"]
    assert [(i["kind"], i["id"]) for i in items] == [
        ("message", "m-1"),
        ("failure_notice", "not-taken:m-1"),
    ]
    assert items[1]["text"].startswith("This message was not taken: inbox is down.")
    sink.error = None
    retried = await client.post(URL, json={"text": "hi", "client_message_id": "m-1"})
    assert retried.status_code == 202 and retried.json()["duplicate"] is False
    assert retried.json()["seq"] == 1  # the message the thread shows, once
    assert len((await client.get("/web/threads/t1")).json()["items"]) == 2


async def test_a_channel_that_is_not_running_refuses_posts_with_503(
    client: httpx.AsyncClient, channel: WebChannel, sink: TestSink
) -> None:
    await channel.stop()
    response = await client.post(URL, json={"text": "hi"})
    assert error(response) == (503, "unavailable")
    assert "retry-after" in response.headers
    await channel.start(sink)
    assert (await client.post(URL, json={"text": "hi"})).status_code == 202


async def test_a_stopped_channel_still_delivers_and_reads(
    client: httpx.AsyncClient, channel: WebChannel
) -> None:
    """The service stops adapters first, then drains its deliverer: replies still land."""
    await channel.stop()
    await channel.deliver(outbound("t1", "reply:run-1"))
    assert await channel.reconcile(outbound("t1", "reply:run-1")) == "delivered"
    assert len((await client.get("/web/threads/t1")).json()["items"]) == 1


async def test_closing_closes_the_mailbox(tmp_path: Path, sink: TestSink) -> None:
    web = WebChannel(SqliteMailbox(tmp_path / "web.db"), clock=ManualClock())
    await web.start(sink)
    await web.deliver(outbound("t1", "reply:1"))
    await web.close()
    with pytest.raises(DeliveryError) as caught:
        await web.deliver(outbound("t1", "reply:2"))
    assert not caught.value.permanent
    await web.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        await web.start(sink)


async def test_a_channel_opened_from_a_url_reopens_after_closing(
    tmp_path: Path, sink: TestSink
) -> None:
    web = WebChannel(f"sqlite:///{tmp_path}/web.db", clock=ManualClock())
    assert not (tmp_path / "web.db").exists()  # nothing is created before it is used
    await web.start(sink)
    await web.deliver(outbound("t1", "reply:1"))
    await web.close()
    await web.start(sink)
    assert [i.id for i in await web.mailbox.read("default", "t1")] == ["reply:1"]
    await web.close()


class _BrokenMailbox(MemoryMailbox):
    """A memory mailbox whose writes fail while `broken` (reads still answer)."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error
        self.broken = True

    async def append(self, space, thread, item):
        if self.broken:
            raise self.error
        return await super().append(space, thread, item)


@contextlib.asynccontextmanager
async def _broken_client(
    mailbox: WebMailbox, clock: ManualClock, sink: TestSink
) -> AsyncIterator[tuple[httpx.AsyncClient, WebChannel]]:
    """A started channel on `mailbox` and a client of its routes; the channel closed after."""
    web = WebChannel(mailbox, clock=clock, ids=SequentialIds())
    await web.start(sink)
    app = FastAPI()
    app.include_router(web.router)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://x"
        ) as client:
            yield client, web
    finally:
        await web.close()


# Every way the web channel's own store can fail a write: the post is refused, nothing is taken.
STORE_FAILURES = [
    MailboxUnavailable("sqlite: OperationalError: disk I/O error"),
    MailboxUnavailable("redis: ConnectionError", unknown_outcome=True),
    MailboxError("corrupt item"),
]


@pytest.mark.parametrize("failure", STORE_FAILURES, ids=lambda e: str(e).split(":")[0])
async def test_a_message_the_store_cannot_hold_is_refused_and_not_taken(
    clock: ManualClock, sink: TestSink, failure: Exception
) -> None:
    """Never a 202 for a message the thread does not show (D162): it is not half-accepted."""
    mailbox = _BrokenMailbox(failure)
    web = WebChannel(mailbox, clock=clock, ids=SequentialIds())
    await web.start(sink)
    app = FastAPI()
    app.include_router(web.router)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
        for body in ({"text": "hi", "client_message_id": "m-1"}, {"text": "no id"}):
            first = await c.post(URL, json=body)
            assert error(first) == (503, "unavailable")
            assert "store is unavailable" in first.json()["error"]["message"]
            assert first.headers["retry-after"] == "2"
        assert sink.inbound == []  # nothing reached the gateway
        mailbox.broken = False
        again = await c.post(URL, json={"text": "hi", "client_message_id": "m-1"})
        assert again.status_code == 202 and again.json()["duplicate"] is False
        assert again.json()["seq"] == 1
    await web.close()


async def test_the_log_says_why_the_store_could_not_hold_a_message(
    clock: ManualClock, sink: TestSink, caplog: pytest.LogCaptureFixture
) -> None:
    full = "sqlite: OperationalError: database or disk is full"
    web = WebChannel(_BrokenMailbox(MailboxUnavailable(full)), clock=clock, ids=SequentialIds())
    await web.start(sink)
    app = FastAPI()
    app.include_router(web.router)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
        refused = await c.post(URL, json={"text": "a secret plan"})
    await web.close()
    assert error(refused) == (503, "unavailable")
    [record] = [
        r for r in caplog.records if r.getMessage() == "web mailbox could not record an item"
    ]
    assert (record.error, record.reason) == ("MailboxUnavailable", full)  # type: ignore[attr-defined]
    assert "secret plan" not in repr(record.__dict__)


async def test_a_store_that_keeps_refusing_is_said_once_a_minute_and_its_end_once(
    clock: ManualClock, sink: TestSink, caplog: pytest.LogCaptureFixture
) -> None:
    """A line per refused post was as many lines as posts while Redis was down (a probe)."""
    mailbox = _BrokenMailbox(MailboxUnavailable("redis: ConnectionError: refused"))
    caplog.set_level(logging.INFO, logger="adapters.web")
    async with _broken_client(mailbox, clock, sink) as (c, _):
        for _ in range(150):  # a post every second for 150 s
            assert (await c.post(URL, json={"text": "hi"})).status_code == 503
            clock.advance(1_000)
        mailbox.broken = False
        assert (await c.post(URL, json={"text": "hi"})).status_code == 202
        assert (await c.post(URL, json={"text": "hi again"})).status_code == 202
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("web mailbox")]
    assert said == [
        "web mailbox could not record an item",
        "web mailbox still cannot record items",
        "web mailbox still cannot record items",
        "web mailbox records again",
    ]
    [back] = [r for r in caplog.records if r.getMessage() == "web mailbox records again"]
    assert (back.seconds, back.failures) == (150.0, 150)  # type: ignore[attr-defined]


async def test_a_decision_the_store_cannot_show_is_503_and_counts_once_when_sent_again(
    clock: ManualClock, sink: TestSink
) -> None:
    """A click is taken first (its key makes a retry count once), then refused until shown."""
    mailbox = _BrokenMailbox(MailboxUnavailable("down"))
    async with _broken_client(mailbox, clock, sink) as (c, _):
        first = await c.post("/web/threads/t1/decisions", json=decision_body())
        assert error(first) == (503, "unavailable")
        assert "send it again once the store is back" in first.json()["error"]["message"]
        mailbox.broken = False
        again = await c.post("/web/threads/t1/decisions", json=decision_body())
        assert again.status_code == 202 and again.json()["duplicate"] is True
        assert again.json()["seq"] == 1
    assert len(sink.accepted) == 1


# -- reading a thread ---------------------------------------------------------------------------


async def test_a_thread_reads_back_messages_and_replies_in_order(
    client: httpx.AsyncClient, channel: WebChannel, clock: ManualClock
) -> None:
    await client.post(URL, json={"text": "question", "client_message_id": "m-1", "author": "ann"})
    clock.advance(10)
    await channel.deliver(outbound("t1", "reply:run-1", text="answer"))
    clock.advance(10)
    await channel.deliver(outbound("t1", "notice:run-2", kind="failure_notice", text="failed"))
    body = (await client.get("/web/threads/t1")).json()
    assert body["lane"] == "web:t1" and body["next_after"] == 3
    assert [(i["seq"], i["kind"], i["id"], i["text"]) for i in body["items"]] == [
        (1, "message", "m-1", "question"),
        (2, "reply", "reply:run-1", "answer"),
        (3, "failure_notice", "notice:run-2", "failed"),
    ]
    assert body["items"][0]["author"] == {"id": "ann", "name": "ann", "is_bot": False}
    page = (await client.get("/web/threads/t1?after=1&limit=1")).json()
    assert [i["seq"] for i in page["items"]] == [2] and page["next_after"] == 2
    empty = (await client.get("/web/threads/t1?after=3")).json()
    assert empty["items"] == [] and empty["next_after"] == 3


# "²" passes str.isdigit() and fails int(); "٣" passes both: neither is a number here
_BAD_QUERIES = ["after=-1", "after=x", "limit=0", "limit=501", "space=a%20b", "after=%C2%B2"]
_BAD_QUERIES += ["limit=%C2%B2", "after=%D9%A3"]
# int() raises past 4,300 digits: a 500 before the bound was checked (an outside probe)
_BAD_QUERIES += ["after=" + "9" * 4301, "limit=" + "9" * 5000, "after=" + "0" * 5000 + "1x"]


@pytest.mark.parametrize("query", _BAD_QUERIES)
async def test_bad_query_parameters_are_400(client: httpx.AsyncClient, query: str) -> None:
    status, _ = error(await client.get(f"/web/threads/t1?{query}"))
    assert status == 400
    if not query.startswith("after="):  # the list of threads has no 'after'
        status, _ = error(await client.get(f"/web/threads?{query}"))
        assert status == 400


async def test_threads_are_listed(client: httpx.AsyncClient, clock: ManualClock) -> None:
    await client.post("/web/threads/first/messages", json={"text": "a"})
    clock.advance(5)
    await client.post("/web/threads/second/messages", json={"text": "b"})
    listed = (await client.get("/web/threads")).json()
    assert [t["thread"] for t in listed["threads"]] == ["second", "first"]
    assert (await client.get("/web/threads?space=other")).json()["threads"] == []


async def test_an_unavailable_mailbox_is_503_on_reads(clock: ManualClock, sink: TestSink) -> None:
    class Down(MemoryMailbox):
        async def read(self, space, thread, *, after=0, limit=100):
            raise MailboxUnavailable("down")

    web = WebChannel(Down(), clock=clock)
    app = FastAPI()
    app.include_router(web.router)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
        response = await c.get("/web/threads/t1")
        assert error(response) == (503, "unavailable") and "retry-after" in response.headers
        assert error(await c.get("/web/threads/t1/events")) == (503, "unavailable")


# -- decisions ----------------------------------------------------------------------------------


def decision_body(**overrides: object) -> dict[str, object]:
    body: dict[str, object] = {
        "run_id": "run-1",
        "wait_id": "wait-1",
        "decisions": [{"tool_call_id": "c1", "args_digest": "digest-1", "approved": True}],
        "author": "ann",
    }
    return {**body, **overrides}


async def test_a_click_becomes_a_decision(client: httpx.AsyncClient, sink: TestSink) -> None:
    response = await client.post("/web/threads/t1/decisions", json=decision_body())
    assert response.status_code == 202
    assert response.json()["lane"] == "web:t1" and response.json()["seq"] == 1
    [decision] = sink.decisions
    assert (decision.run_id, decision.wait_id) == ("run-1", "wait-1")
    assert decision.decided_by.id == "ann"
    [item] = decision.decisions
    assert (item.tool_call_id, item.args_digest, item.approved) == ("c1", "digest-1", True)
    assert decision.idempotency_key == response.json()["idempotency_key"]
    shown = (await client.get("/web/threads/t1")).json()["items"]
    assert shown[0]["kind"] == "decision" and shown[0]["decision"]["wait_id"] == "wait-1"


async def test_a_double_click_is_one_decision(client: httpx.AsyncClient, sink: TestSink) -> None:
    first = await client.post("/web/threads/t1/decisions", json=decision_body())
    second = await client.post("/web/threads/t1/decisions", json=decision_body())
    assert second.json()["duplicate"] is True
    assert sink.decisions[0].idempotency_key == sink.decisions[1].idempotency_key
    assert first.json()["idempotency_key"].startswith("web-")
    deny = decision_body(
        decisions=[{"tool_call_id": "c1", "args_digest": "digest-1", "approved": False}]
    )
    other = await client.post("/web/threads/t1/decisions", json=deny)
    assert other.json()["idempotency_key"] != first.json()["idempotency_key"]
    assert len((await client.get("/web/threads/t1")).json()["items"]) == 2


async def test_a_client_idempotency_key_is_used(client: httpx.AsyncClient, sink: TestSink) -> None:
    await client.post("/web/threads/t1/decisions", json=decision_body(idempotency_key="click-9"))
    assert sink.decisions[0].idempotency_key == "click-9"
    again = await client.post(
        "/web/threads/t1/decisions", json=decision_body(idempotency_key="click-9")
    )
    assert again.status_code == 202  # a retry of the same decision


async def test_a_key_reused_for_the_next_wait_shows_its_own_decision(
    client: httpx.AsyncClient, sink: TestSink
) -> None:
    """A client reused its key for the next wait: the decision took effect (D151), while the
    answer and the thread named the first decision, and the thread never showed the second
    (an outside probe). The thread keys a decision as the inbox does: by its slot."""
    first = await client.post("/web/threads/t1/decisions", json=decision_body(idempotency_key="k1"))
    deny = decision_body(
        wait_id="wait-2",
        decisions=[{"tool_call_id": "c2", "args_digest": "digest-2", "approved": False}],
        idempotency_key="k1",
    )
    second = await client.post("/web/threads/t1/decisions", json=deny)
    assert second.status_code == 202 and second.json()["seq"] != first.json()["seq"]
    shown = (await client.get("/web/threads/t1")).json()["items"]
    assert [i["decision"]["wait_id"] for i in shown] == ["wait-1", "wait-2"]
    again = await client.post("/web/threads/t1/decisions", json=deny)  # a retry: shown once
    assert again.json()["seq"] == second.json()["seq"]
    assert len((await client.get("/web/threads/t1")).json()["items"]) == 2


@pytest.mark.parametrize(
    ("override", "code"),
    [
        ({"decisions": []}, "invalid_request"),
        ({"decisions": [{"tool_call_id": "c1", "approved": True}]}, "invalid_request"),
        ({"run_id": ""}, "invalid_request"),
        ({"wait_id": None}, "invalid_request"),
        (
            {"decisions": [{"tool_call_id": "c1", "args_digest": "d", "approved": "yes"}]},
            "invalid_request",
        ),
        (
            {
                "decisions": [
                    {"tool_call_id": "c1", "args_digest": "d", "approved": True},
                    {"tool_call_id": "c1", "args_digest": "d", "approved": False},
                ]
            },
            "invalid_request",
        ),
        ({"space": "../x"}, "invalid_space"),
        ({"extra": 1}, "invalid_request"),
    ],
)
async def test_malformed_decisions_are_refused(
    client: httpx.AsyncClient, sink: TestSink, override: dict[str, object], code: str
) -> None:
    response = await client.post("/web/threads/t1/decisions", json=decision_body(**override))
    assert error(response) == (400, code)
    assert sink.decisions == []


async def test_decisions_map_sink_errors(client: httpx.AsyncClient, sink: TestSink) -> None:
    sink.error = Unavailable("down")
    assert error(await client.post("/web/threads/t1/decisions", json=decision_body())) == (
        503,
        "unavailable",
    )
    sink.error = None
    response = await client.post("/web/threads/t1/decisions", json=decision_body(space="x"))
    assert error(response) == (404, "not_routed")


# -- delivering ---------------------------------------------------------------------------------


async def test_delivering_twice_stores_once(channel: WebChannel, clock: ManualClock) -> None:
    first = await channel.deliver(outbound("t1", "reply:run-1", text="answer"))
    clock.advance(1000)
    again = await channel.deliver(outbound("t1", "reply:run-1", text="answer"))
    assert first == again  # the same receipt: the first delivery's
    assert first.channel_message_ids == ("default/t1#1",)
    assert len(await channel.mailbox.read("default", "t1")) == 1
    assert (channel.delivered, channel.repeated) == (1, 1)


async def test_reconcile_answers_from_the_mailbox(channel: WebChannel) -> None:
    sent = outbound("t1", "reply:run-1")
    assert await channel.reconcile(sent) == "absent"
    await channel.deliver(sent)
    assert await channel.reconcile(sent) == "delivered"
    assert await channel.reconcile(outbound("t2", "reply:run-1")) == "absent"


async def test_reconcile_is_unknown_when_the_mailbox_cannot_answer(clock: ManualClock) -> None:
    class Down(MemoryMailbox):
        async def find(self, space, thread, kind, identity):
            raise MailboxUnavailable("down")

    assert await WebChannel(Down(), clock=clock).reconcile(outbound()) == "unknown"


async def test_an_approval_request_keeps_its_wait_and_digests(channel: WebChannel) -> None:
    view = approval(calls=2)
    await channel.deliver(
        outbound("t1", "approval:wait-1", kind="approval_request", text="May I?", approval=view)
    )
    [item] = await channel.mailbox.read("default", "t1")
    assert item.kind == "approval_request" and item.approval == view


async def test_deliveries_the_web_cannot_hold_are_permanent_errors(channel: WebChannel) -> None:
    with pytest.raises(DeliveryError) as slack:
        await channel.deliver(outbound(channel="slack"))
    assert slack.value.permanent
    with pytest.raises(DeliveryError) as bad:
        await channel.deliver(outbound("not a thread id"))
    assert bad.value.permanent
    with pytest.raises(DeliveryError) as long_id:
        await channel.deliver(outbound("t1", "x" * 2000, text="secret-ish reply text"))
    assert long_id.value.permanent
    assert long_id.value.reason == "not a deliverable web reply: bad id"


@pytest.mark.parametrize("unknown", [False, True])
async def test_a_mailbox_failure_is_a_retryable_delivery_error(
    clock: ManualClock, unknown: bool
) -> None:
    class Down(MemoryMailbox):
        async def append(self, space, thread, item):
            raise MailboxUnavailable("sqlite: OperationalError: disk I/O", unknown_outcome=unknown)

    with pytest.raises(DeliveryError) as caught:
        await WebChannel(Down(), clock=clock).deliver(outbound())
    assert not caught.value.permanent
    assert caught.value.unknown_outcome is unknown
    assert caught.value.reason == "web mailbox unavailable (sqlite)"


async def test_deliveries_on_every_mailbox_backend(mailbox: WebMailbox) -> None:
    web = WebChannel(mailbox, clock=ManualClock())
    sent = outbound("t1", "reply:run-1", text="answer")
    assert await web.reconcile(sent) == "absent"
    receipt = await web.deliver(sent)
    assert await web.deliver(sent) == receipt
    assert await web.reconcile(sent) == "delivered"
    assert [i.text for i in await mailbox.read("default", "t1")] == ["answer"]


# -- pages --------------------------------------------------------------------------------------


async def test_the_thread_page_is_plain_html_with_a_strict_policy(
    client: httpx.AsyncClient, channel: WebChannel
) -> None:
    await channel.deliver(outbound("t1", "reply:x", text="<script>alert('reply')</script>"))
    response = await client.get("/web/threads/t1/page")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    page = response.text
    assert "alert('reply')" not in page  # replies arrive as data, shown with textContent
    assert "innerHTML" not in page and "insertAdjacentHTML" not in page
    assert not re.search(r"(src|href)=\"(https?:)?//", page)  # no external assets
    policy = response.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy
    assert "'unsafe-inline'" not in policy
    assert page.count("<script>") == 1 and _THREAD_SCRIPT in page and _STYLE in page
    assert 'EventSource("events?' in page
    config = re.search(r'<script type="application/json" id="config">(.*?)</script>', page)
    assert config is not None
    assert json.loads(config.group(1)) == {
        "space": "default",
        "thread": "t1",
        "max_text_chars": 1000,
        "max_supplied_chars": MAX_SUPPLIED_CHARS,
        "max_upload_bytes": WebLimits().max_upload_bytes,
    }
    assert "maxlength" not in page.split('id="text"')[1].split(">")[0]  # a paste is never cut


async def test_the_policy_hashes_match_the_inline_blocks(client: httpx.AsyncClient) -> None:
    import base64
    import hashlib

    policy = (await client.get("/web/threads/t1/page")).headers["content-security-policy"]
    for block in (_THREAD_SCRIPT, _STYLE):
        digest = base64.b64encode(hashlib.sha256(block.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in policy


async def test_the_index_lists_threads_and_opens_one(
    client: httpx.AsyncClient, clock: ManualClock
) -> None:
    await client.post("/web/threads/alpha/messages", json={"text": "a"})
    await client.post("/web/threads/caf%C3%A9/messages", json={"text": "b"})
    index = await client.get("/web/")
    assert index.status_code == 200 and "<script" not in index.text
    assert 'href="threads/alpha/page?space=default"' in index.text
    assert 'href="threads/caf%C3%A9/page?space=default">café</a>' in index.text
    assert 'title="1-200 letters (of any script)' in index.text  # the form says the rule
    assert "script-src 'none'" in index.headers["content-security-policy"]
    opened = await client.get("/web/open?thread=beta&space=default")
    assert opened.status_code == 303
    assert opened.headers["location"] == "threads/beta/page?space=default"
    assert error(await client.get("/web/open?thread=b%20ad")) == (400, "invalid_thread")
    accented = await client.get("/web/open?thread=cafe%CC%81&space=default")
    assert accented.headers["location"] == "threads/caf%C3%A9/page?space=default"


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_page_script_parses(tmp_path: Path) -> None:
    script = tmp_path / "page.js"
    script.write_text(_THREAD_SCRIPT)
    result = subprocess.run(
        ["node", "--check", str(script)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


async def test_uploads_beyond_the_concurrent_bound_are_refused_before_their_body(
    clock: ManualClock, sink: TestSink
) -> None:
    """Eight uploads of 35 MB at once took 900 MB: past the bound one is 503, unread."""
    web = WebChannel(MemoryMailbox(), clock=clock, limits=WebLimits(max_concurrent_uploads=1))
    await web.start(sink)
    app = FastAPI()
    app.include_router(web.router)
    release, reading = asyncio.Event(), asyncio.Event()
    read: list[bytes] = []

    async def slow_body() -> AsyncIterator[bytes]:
        yield b'{"text": "first", '
        reading.set()  # the route reads its body: it holds its slot
        await release.wait()  # a slow sender
        yield b'"files": []}'

    async def refused_body() -> AsyncIterator[bytes]:
        read.append(b"x")  # would show that the refused upload's body was read
        yield b'{"text": "second", "files": []}'

    headers = {"content-type": "application/json"}
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://web.test"
        ) as http:
            first = asyncio.create_task(
                http.post("/web/uploads/t1", content=slow_body(), headers=headers)
            )
            await asyncio.wait_for(reading.wait(), 5)
            second = await http.post("/web/uploads/t2", content=refused_body(), headers=headers)
            assert error(second) == (503, "unavailable")
            assert second.headers["retry-after"] == "2"
            assert read == [] and [i.text for i in sink.inbound] == []
            release.set()
            assert (await first).status_code == 202
            again = await http.post("/web/uploads/t2", json={"text": "second", "files": []})
            assert again.status_code == 202, again.text
            assert [i.text for i in sink.inbound] == ["first", "second"]
    finally:
        await web.close()


async def test_a_body_that_trickles_is_cut_off_and_frees_its_upload_slot(sink: TestSink) -> None:
    """Four uploads that sent their headers, then a byte now and then, held every upload slot
    for as long as they liked: every real upload got 503."""
    clock = ManualClock(1_000_000)
    limits = WebLimits(
        max_concurrent_uploads=1, body_idle_s=0.3, body_grace_s=1.0, min_body_rate=1000
    )
    web = WebChannel(MemoryMailbox(), clock=clock, limits=limits)
    await web.start(sink)
    app = FastAPI()
    app.include_router(web.router)

    async def silent() -> AsyncIterator[bytes]:
        yield b'{"text": "slow", '
        await asyncio.sleep(5)  # then nothing: cut after `body_idle_s`
        yield b'"files": []}'

    async def trickle() -> AsyncIterator[bytes]:
        for char in b'{"text": "trickled", "files": []}':
            clock.advance(200)  # a byte every 0.2 s: well under 1,000 bytes a second
            await asyncio.sleep(0.01)
            yield bytes([char])

    headers = {"content-type": "application/json"}
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://web.test"
        ) as http:
            for body in (silent(), trickle()):
                cut = await http.post("/web/uploads/t1", content=body, headers=headers)
                assert error(cut) == (408, "too_slow"), cut.text
            again = await http.post("/web/uploads/t2", json={"text": "on time", "files": []})
            assert again.status_code == 202, again.text  # the slot is free
            assert [i.text for i in sink.inbound] == ["on time"]
    finally:
        await web.close()


async def test_one_client_holds_at_most_half_the_upload_slots(
    clock: ManualClock, sink: TestSink, caplog: pytest.LogCaptureFixture
) -> None:
    """Four uploads trickled just above the rate floor by one client held all four slots for
    an hour: everyone else got 503, and nothing was logged."""
    web = WebChannel(MemoryMailbox(), clock=clock, limits=WebLimits(max_concurrent_uploads=4))
    await web.start(sink)
    app = FastAPI()
    app.include_router(web.router)
    release = asyncio.Event()
    reading: list[asyncio.Event] = []

    def slow_body(text: str) -> AsyncIterator[bytes]:
        started = asyncio.Event()
        reading.append(started)

        async def body() -> AsyncIterator[bytes]:
            yield b'{"text": "' + text.encode() + b'", '
            started.set()
            await release.wait()
            yield b'"files": []}'

        return body()

    headers = {"content-type": "application/json"}

    def client(host: str) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=app, client=(host, 1234))
        return httpx.AsyncClient(transport=transport, base_url="http://web.test")

    try:
        async with client("10.0.0.1") as mallory, client("10.0.0.2") as ann:
            held = [
                asyncio.create_task(
                    mallory.post(f"/web/uploads/m{n}", content=slow_body(f"m{n}"), headers=headers)
                )
                for n in range(2)
            ]
            await asyncio.wait_for(asyncio.gather(*(r.wait() for r in reading)), 5)
            third = await mallory.post("/web/uploads/m2", json={"text": "m2", "files": []})
            assert error(third) == (503, "unavailable")
            assert "this client is sending 2 uploads already" in third.text
            # the others still get in: two slots are left
            more = [
                asyncio.create_task(
                    ann.post(f"/web/uploads/a{n}", content=slow_body(f"a{n}"), headers=headers)
                )
                for n in range(2)
            ]
            await asyncio.wait_for(asyncio.gather(*(r.wait() for r in reading[2:])), 5)
            with caplog.at_level(logging.WARNING, logger="adapters.web"):
                async with client("10.0.0.3") as bob:
                    full = await bob.post("/web/uploads/b", json={"text": "b", "files": []})
            assert error(full) == (503, "unavailable")
            assert any("every upload slot is taken" in r.getMessage() for r in caplog.records)
            release.set()
            for task in (*held, *more):
                assert (await task).status_code == 202
    finally:
        await web.close()


async def test_a_mailbox_that_cannot_be_opened_stops_the_start_in_one_line(
    tmp_path: Path,
) -> None:
    """The service started, said "open ... and write", then answered every post 503 (an
    outside probe); the store and the broker stop the start, and so does the mailbox now."""
    from adapters.web.channel import WebStartError

    (tmp_path / "taken.db").write_bytes(b"not a database, only bytes " * 200)
    url = f"sqlite:///{tmp_path}/taken.db"
    channel = WebChannel(url)
    with pytest.raises(WebStartError) as raised:
        await channel.start(TestSink())
    await channel.close()
    said = str(raised.value)
    assert said.startswith(f"the web channel's mailbox at {url} cannot be used (")
    assert said.endswith("; GATEWAY_WEB_URL)") and "\n" not in said
    fine = WebChannel(f"sqlite:///{tmp_path}/web.db")  # a new file is made: that starts
    await fine.start(TestSink())
    await fine.close()
