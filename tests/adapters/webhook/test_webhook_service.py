"""Webhook end to end: the whole service, signed requests in, signed POSTs to a real receiver.

`gateway serve`'s `Service` runs with the webhook channel on (its settings as a deployment
gives them), the scripted agent of `tests.support.gateway_agent`, SQLite store and broker.
Requests reach its app in-process, signed by `WebhookPeer`; replies go over HTTP to the same
peer on a real port, which checks their signatures with its own code.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.channels import gateway_settings
from gateway.service import Service
from tests.support.gateway_rig import lane_texts
from tests.support.webhook_peer import Post, WebhookPeer, new_secret

AGENT = "tests.support.gateway_agent"
SECRET = new_secret("service")
APPROVER = "alice"
STRANGER = "mallory"
SESSION = "webhook-default"


class Rig:
    """The running service, the peer, and a client for the service's app."""

    def __init__(self, service: Service, peer: WebhookPeer, http: httpx.AsyncClient) -> None:
        self.service = service
        self.peer = peer
        self.http = http

    async def say(self, thread: str, text: str, **extra: Any) -> httpx.Response:
        signing = {k: extra.pop(k) for k in ("msg_id", "timestamp") if k in extra}
        payload = {"thread": thread, "text": text, "author": {"id": "u1"}, **extra}
        return await self.peer.send(self.http, payload, **signing)

    async def texts(self, thread: str) -> list[str]:
        assert self.service.repo is not None
        return await lane_texts(self.service.repo, SESSION, f"webhook:{thread}")

    async def replies(self, thread: str, count: int) -> list[dict[str, Any]]:
        await _until(lambda: len(self.peer.thread(thread)) >= count)
        return self.peer.thread(thread)

    async def delivery(self, delivery_id: str) -> Any:
        assert self.service.broker is not None
        return await self.service.broker.outbox.get(delivery_id)


async def _until(check: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def _running(
    tmp_path: Path, *, status_url: bool = True, busy_policy: str = "steer"
) -> AsyncIterator[Rig]:
    async with WebhookPeer(secret=SECRET) as peer:
        settings = gateway_settings(
            store_url=f"sqlite:///{tmp_path}/store.db",
            broker_url=f"sqlite:///{tmp_path}/broker.db",
            web_url=f"sqlite:///{tmp_path}/web.db",
            plugin=AGENT,
            lease_seconds=6,
            renew_seconds=1,
            webhook_url=peer.url,
            webhook_secret=SECRET,
            webhook_status_url=peer.status_url if status_url else None,
            webhook_approvers=(APPROVER,),
            webhook_max_body_bytes=64 * 1024,
            busy_policy=busy_policy,
        )
        service = Service(settings)
        await service.start()
        assert service.app is not None
        assert "webhook" in service.adapters
        transport = httpx.ASGITransport(app=service.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            yield Rig(service, peer, http)
        await service.stop(drain_seconds=2)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with _running(tmp_path) as running:
        yield running


async def test_a_message_is_answered_with_a_signed_post_in_its_thread(rig: Rig) -> None:
    response = await rig.say("t1", "hello", reply_context={"chat": 42})
    assert response.status_code == 202, response.text
    assert (response.json()["session"], response.json()["lane"]) == (SESSION, "webhook:t1")
    [reply] = await rig.replies("t1", 1)
    assert reply["kind"] == "reply" and reply["text"] == "You said: hello"
    assert reply["delivery_id"].startswith(f"reply:{SESSION}:")
    assert (reply["space"], reply["reply_context"]) == ("default", {"chat": 42})
    assert all(p.verified for p in rig.peer.posts)
    assert await rig.texts("t1") == ["hello"]


async def test_a_sender_redelivering_is_taken_and_answered_once(rig: Rig) -> None:
    body, headers = rig.peer.signed(
        {"thread": "t2", "text": "once", "author": {"id": "u1"}}, msg_id="msg_once"
    )
    answers = [await rig.peer.send_raw(rig.http, body, headers) for _ in range(2)]  # a replay
    answers.append(await rig.say("t2", "once", msg_id="msg_once"))  # re-signed redelivery
    assert [a.status_code for a in answers] == [202, 202, 202]
    assert [a.json()["duplicate"] for a in answers] == [False, True, True]
    # the id again with another text is not it sent again: refused, not dropped (D385)
    other = await rig.say("t2", "twice", msg_id="msg_once")
    assert other.status_code == 409 and other.json()["error"]["code"] == "message_id_taken"
    await rig.replies("t2", 1)
    await asyncio.sleep(0.5)  # room for a wrong second reply
    assert [p["text"] for p in rig.peer.thread("t2")] == ["You said: once"]
    assert len([p for p in rig.peer.posts if p.payload.get("thread") == "t2"]) == 1
    assert await rig.texts("t2") == ["once"]
    assert await rig.texts("t2") == ["once"]


async def test_a_refused_post_is_retried_from_the_outbox_until_taken(rig: Rig) -> None:
    rig.peer.fail(503, retry_after="1")
    await rig.say("t3", "try again")
    [reply] = await rig.replies("t3", 1)
    assert [p.status for p in rig.peer.posts] == [503, 200]
    # the peer has the reply before the deliverer settles it: wait for the settlement
    deadline = asyncio.get_running_loop().time() + 10
    while (delivery := await rig.delivery(reply["delivery_id"])).status != "delivered":
        assert asyncio.get_running_loop().time() < deadline, delivery
        await asyncio.sleep(0.02)
    assert (delivery.status, delivery.attempts) == ("delivered", 2)


@pytest.mark.parametrize("status_url", [True, False], ids=["status-url", "no-status-url"])
async def test_a_lost_ack_is_reconciled_and_the_reply_is_taken_once(
    tmp_path: Path, status_url: bool
) -> None:
    async with _running(tmp_path, status_url=status_url) as rig:
        rig.peer.lose_ack()
        await rig.say("t4", "lost")
        [reply] = await rig.replies("t4", 1)
        await _until(lambda: rig.peer.status_asked != [] or len(rig.peer.posts) == 2)

        async def settled() -> Any:
            for _ in range(300):
                delivery = await rig.delivery(reply["delivery_id"])
                if delivery.status != "pending":
                    return delivery
                await asyncio.sleep(0.05)
            raise AssertionError("the delivery never settled")

        delivery = await settled()
        assert delivery.status == "delivered" and delivery.attempts == 2
        posts: list[Post] = [p for p in rig.peer.posts if p.payload["thread"] == "t4"]
        if status_url:  # asked, found, not sent again
            assert len(posts) == 1 and rig.peer.status_asked == [posts[0].webhook_id]
        else:  # sent again under the same id, which the receiver dropped
            assert [p.duplicate for p in posts] == [False, True]
            assert posts[0].webhook_id == posts[1].webhook_id
        assert len(rig.peer.thread("t4")) == 1


def _decision(asked: dict[str, Any], author: str, approved: bool = True) -> dict[str, Any]:
    approval = asked["approval"]
    return {
        "type": "decision",
        "thread": asked["thread"],
        "run_id": approval["run_id"],
        "wait_id": approval["wait_id"],
        "session": approval["session"],
        "decisions": [
            {
                "tool_call_id": c["tool_call_id"],
                "args_digest": c["args_digest"],
                "approved": approved,
            }
            for c in approval["calls"]
        ],
        "author": {"id": author, "name": author.title()},
    }


async def test_an_approval_round_trip_takes_only_an_approver(rig: Rig) -> None:
    await rig.say("t5", "/deploy prod")
    [asked] = await rig.replies("t5", 1)
    assert asked["kind"] == "approval_request"
    [call] = asked["approval"]["calls"]
    assert (call["tool_name"], call["args"]) == ("deploy", {"target": "prod"})

    refused = await rig.peer.send(rig.http, _decision(asked, STRANGER))
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "not_approver"
    assert rig.service.broker is not None
    events = await rig.service.broker.audit.list(session=SESSION)
    assert not [e for e in events if e.action == "approval decided"]

    decided = await rig.peer.send(rig.http, _decision(asked, APPROVER), msg_id="msg_decide")
    assert decided.status_code == 202, decided.text
    again = await rig.peer.send(rig.http, _decision(asked, APPROVER), msg_id="msg_decide")
    assert again.status_code == 202 and again.json()["duplicate"] is True
    assert again.json()["decided_by"]["id"] == APPROVER
    replies = await rig.replies("t5", 3)
    kinds = sorted(r["kind"] for r in replies)
    assert kinds == ["approval_closed", "approval_request", "reply"]
    [done] = [r for r in replies if r["kind"] == "reply"]
    [closed] = [r for r in replies if r["kind"] == "approval_closed"]
    assert done["text"] == "Done: deployed prod"
    assert (closed["closed"]["outcome"], closed["closed"]["by"]) == ("approved", APPROVER)

    late = await rig.peer.send(rig.http, _decision(asked, APPROVER, approved=False))
    assert late.status_code == 409 and late.json()["error"]["code"] == "no_longer_waiting"
    await asyncio.sleep(0.3)
    assert len(rig.peer.thread("t5")) == 3


async def test_under_next_run_each_reply_carries_the_context_of_the_message_it_answers(
    tmp_path: Path,
) -> None:
    """A run's replies went with the thread's newest reply context: that of a message that
    came meanwhile and waited for the next run (a Slack reply took its working reaction off,
    an email answered it before its own run began)."""
    async with _running(tmp_path, busy_policy="next_run") as rig:
        await rig.say("t7", "/deploy prod", reply_context={"m": 1})
        [asked] = await rig.replies("t7", 1)
        assert (asked["kind"], asked["reply_context"]) == ("approval_request", {"m": 1})
        await rig.say("t7", "hello", reply_context={"m": 2})  # waits for the next run
        await rig.replies("t7", 2)  # told it waits
        decided = await rig.peer.send(rig.http, _decision(asked, APPROVER))
        assert decided.status_code == 202, decided.text
        replies = await rig.replies("t7", 5)
    answered = {r["text"]: r["reply_context"] for r in replies if r["kind"] == "reply"}
    assert answered["Done: deployed prod"] == {"m": 1}  # was {"m": 2}
    assert answered["You said: hello"] == {"m": 2}
    [closed] = [r for r in replies if r["kind"] == "approval_closed"]
    assert closed["reply_context"] == {"m": 1}


async def test_a_system_that_did_the_action_supplies_its_result(rig: Rig) -> None:
    """D263: the sender ran the deploy itself; the tool never runs, the agent reads the result."""
    await rig.say("t7", "/deploy prod")
    [asked] = await rig.replies("t7", 1)

    def supplied(**item: Any) -> dict[str, Any]:
        body = _decision(asked, APPROVER)
        body["decisions"] = [{**d, **item} for d in body["decisions"]]
        return body

    for wrong, code in (
        (supplied(result=" "), "empty_text"),
        (supplied(result="done", approved=False), "invalid_request"),
    ):
        refused = await rig.peer.send(rig.http, wrong)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == code
    decided = await rig.peer.send(rig.http, supplied(result="ran it from CI: build 42 is live"))
    assert decided.status_code == 202, decided.text
    replies = await rig.replies("t7", 3)
    [done] = [r for r in replies if r["kind"] == "reply"]
    [closed] = [r for r in replies if r["kind"] == "approval_closed"]
    assert done["text"] == "Done: ran it from CI: build 42 is live"
    assert closed["closed"]["outcome"] == "supplied"
    assert closed["closed"]["result"] == "ran it from CI: build 42 is live"
    assert f"{APPROVER} supplied the result at " in closed["text"]


async def test_hostile_requests_are_refused_and_nothing_is_stored(rig: Rig) -> None:
    body, headers = rig.peer.signed({"thread": "t6", "text": "x"})
    unsigned = {k: v for k, v in headers.items() if k != "webhook-signature"}
    forged = {**headers, "webhook-signature": "v1,AAAA"}
    cases = [
        (await rig.peer.send_raw(rig.http, body, unsigned), 401, "unsigned"),
        (await rig.peer.send_raw(rig.http, body, forged), 401, "bad_signature"),
        (await rig.peer.send(rig.http, b'{"thread": "t6", "text": NaN}'), 400, "invalid_json"),
        (await rig.peer.send(rig.http, {"thread": "t6", "text": 5}), 400, "invalid_request"),
        (await rig.peer.send(rig.http, b""), 400, "invalid_json"),
        (await rig.say("t6", "x" * 70_000), 413, "too_large"),  # the app's edge: unread
    ]
    for response, status, code in cases:
        assert response.status_code == status, (code, response.text)
        assert response.json()["error"]["code"] == code
    assert rig.service.broker is not None
    assert await rig.service.broker.threads.list(SESSION) == ()
    await asyncio.sleep(0.2)
    assert rig.peer.posts == []
    posted = await rig.peer.send(rig.http, {"thread": "t6", "text": "fine"}, msg_id="msg_ok")
    assert posted.status_code == 202
    await rig.replies("t6", 1)
