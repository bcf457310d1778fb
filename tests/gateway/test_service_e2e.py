"""The service end to end: messages in through the web channel's HTTP API, replies out.

Each test runs a whole `Service` (store, broker, workers, deliverer, the real web channel wrapped
by a recording sink) on SQLite, on one Redis and on a local 3-master Redis Cluster (store, broker
and web channel all on it), and talks to it over HTTP (ASGI).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from adapters.channel import Author, ContextMessage, DecisionItem
from adapters.testing import RecordingChannel
from adapters.web import WebChannel, open_mailbox
from adapters.web.settings import web_mailbox_url
from gateway.broker.contract import NewInboxItem
from gateway.channels import gateway_settings
from gateway.replies import (
    CUT_OFF_NOTE,
    LATE_DECISION_TEXT,
    MISMATCHED_DECISION_TEXT,
    REFUSED_TEXT,
)
from gateway.service import Service, ServiceParts
from harness_core import HarnessClosed
from tests.support.gateway_agent import CUT_OFF_ANSWER, STREAMED_ANSWER
from tests.support.gateway_rig import decision_body, lane_texts

AGENT = "tests.support.gateway_agent"


class Gateway:
    """A running service and an HTTP client for its web channel."""

    def __init__(self, service: Service, fake: RecordingChannel, http: httpx.AsyncClient) -> None:
        self.service = service
        self.fake = fake
        self.http = http

    async def post(self, thread: str, text: str, **body: Any) -> dict[str, Any]:
        response = await self.http.post(
            f"/web/threads/{thread}/messages", json={"text": text, **body}
        )
        assert response.status_code == 202, response.text
        accepted: dict[str, Any] = response.json()
        return accepted

    async def items(self, thread: str) -> list[dict[str, Any]]:
        response = await self.http.get(f"/web/threads/{thread}")
        assert response.status_code == 200, response.text
        items: list[dict[str, Any]] = response.json()["items"]
        return items

    async def answers(
        self, thread: str, count: int, timeout_s: float = 15.0
    ) -> list[dict[str, Any]]:
        """Wait until `thread` has `count` items from the agent; return them."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            found = [i for i in await self.items(thread) if i["kind"] != "message"]
            found = [i for i in found if i["kind"] not in ("decision", "approval_closed")]
            if len(found) >= count:
                return found
            assert asyncio.get_running_loop().time() < deadline, f"{thread}: {found}"
            await asyncio.sleep(0.02)

    async def user_texts(self, session: str, lane: str) -> list[str]:
        """The user messages the lane's log holds (read without a lease)."""
        assert self.service.repo is not None
        return await lane_texts(self.service.repo, session, lane)


def _urls(backend: str, request: pytest.FixtureRequest, tmp_path: Any) -> dict[str, str]:
    if backend == "sqlite":
        return {
            "store_url": f"sqlite:///{tmp_path}/store.db",
            "broker_url": f"sqlite:///{tmp_path}/broker.db",
            "web_url": f"sqlite:///{tmp_path}/web.db",
        }
    prefix = request.getfixturevalue("redis_prefix")
    if backend == "redis-cluster":
        cluster = request.getfixturevalue("redis_cluster")
        url = cluster.url
    else:
        url = request.getfixturevalue("redis_server").url
    return {
        "store_url": f"{url}?prefix={prefix}s",
        "broker_url": f"{url}?prefix={prefix}b",
        "web_url": f"{url}?prefix={prefix}w",
    }


@pytest.fixture(params=["sqlite", "redis", "redis-cluster"])
async def gateway(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[Gateway]:
    settings = gateway_settings(
        **_urls(request.param, request, tmp_path),
        plugin=AGENT,
        lease_seconds=6,
        renew_seconds=1,
        worker_slots=4,
    )
    web = WebChannel(open_mailbox(web_mailbox_url(settings)))
    fake = RecordingChannel(inner=web)
    service = Service(settings, ServiceParts(adapters=[fake]))
    await service.start()
    assert service.app is not None
    transport = httpx.ASGITransport(app=service.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        yield Gateway(service, fake, http)
    await service.stop(drain_seconds=2)


async def test_a_message_goes_in_and_its_reply_comes_out(gateway: Gateway) -> None:
    accepted = await gateway.post("hello", "hello there")
    assert accepted["lane"] == "web:hello" and accepted["duplicate"] is False
    [reply] = await gateway.answers("hello", 1)
    assert reply["kind"] == "reply" and reply["text"] == "You said: hello there"
    assert gateway.fake.duplicates() == {}
    health = await gateway.http.get("/readyz")
    assert health.status_code == 200, health.text


async def test_an_answer_cut_off_at_the_output_limit_is_delivered_and_says_so(
    gateway: Gateway,
) -> None:
    await gateway.post("cut", "/cutoff")
    [reply] = await gateway.answers("cut", 1)
    assert reply["kind"] == "reply" and reply["text"] == f"{CUT_OFF_ANSWER}\n\n{CUT_OFF_NOTE}"


async def test_a_redelivered_message_is_one_user_entry_and_one_reply(gateway: Gateway) -> None:
    first = await gateway.post("dup", "only once", client_message_id="m-1")
    again = await gateway.post("dup", "only once", client_message_id="m-1")
    assert again["duplicate"] is True and again["item_id"] == first["item_id"]
    [reply] = await gateway.answers("dup", 1)
    await asyncio.sleep(0.3)  # room for a wrong second reply
    assert [i["kind"] for i in await gateway.items("dup") if i["kind"] != "message"] == ["reply"]
    assert reply["text"] == "You said: only once"
    assert await gateway.user_texts(first["session"], "web:dup") == ["only once"]
    assert gateway.fake.duplicates() == {}


async def test_a_message_id_of_another_thread_is_refused_not_lost(gateway: Gateway) -> None:
    await gateway.post("xa", "in a", client_message_id="same-1")
    refused = await gateway.http.post(
        "/web/threads/xb/messages", json={"text": "in b", "client_message_id": "same-1"}
    )
    assert refused.status_code == 409, refused.text  # was 202 "duplicate", and never answered
    assert refused.json()["error"]["code"] == "message_id_taken"
    [answer] = await gateway.answers("xa", 1)
    assert answer["text"] == "You said: in a"
    [notice] = await gateway.answers("xb", 1)
    assert notice["kind"] == "failure_notice" and "another thread (web:xa)" in notice["text"]


async def test_a_message_to_a_busy_lane_steers_its_run(gateway: Gateway) -> None:
    await gateway.post("busy", "/slow 800")
    await _until_running(gateway, "web:busy")
    await gateway.post("busy", "and also this")
    [reply] = await gateway.answers("busy", 1)
    assert reply["text"] == "You said: and also this"  # the steered message reached the run
    await asyncio.sleep(0.3)
    assert len([i for i in await gateway.items("busy") if i["kind"] == "reply"]) == 1


async def test_an_answer_given_before_a_steered_message_reaches_the_thread(
    gateway: Gateway,
) -> None:
    for thread in ("quick", "failing"):
        await gateway.post(thread, "/stream")  # an answer without a tool call, about 4 s long
    for thread, then in (("quick", "and also this"), ("failing", "/fail")):
        await _until_running(gateway, f"web:{thread}")
        await gateway.post(thread, then)  # taken when that answer ends, in the same run
    [reply] = await gateway.answers("quick", 1)
    assert reply["text"] == f"{STREAMED_ANSWER}\n\nYou said: and also this"
    [notice] = await gateway.answers("failing", 1)  # the run failed after it had answered
    assert notice["kind"] == "reply"  # an answer, then the notice (not cut as a notice is)
    assert notice["text"].startswith(f"{STREAMED_ANSWER}\n\nSorry")
    await asyncio.sleep(0.3)
    for thread in ("quick", "failing"):
        assert len(await gateway.answers(thread, 1)) == 1


async def test_stop_in_the_thread_aborts_the_running_turn(gateway: Gateway) -> None:
    await gateway.post("halt", "/slow 4000")
    await _until_running(gateway, "web:halt")
    await gateway.post("halt", "and this too")  # steered: queued for the run's next checkpoint
    await gateway.post("halt", "Stop!")
    [answer] = await gateway.answers("halt", 1)
    assert answer["kind"] == "reply"
    assert answer["text"] == "Stopped. The 1 message sent while I was working went with it."
    await asyncio.sleep(0.3)  # room for a wrong reply of the aborted run
    assert [i["text"] for i in await gateway.answers("halt", 1)] == [answer["text"]]
    assert await gateway.user_texts("web-default", "web:halt") == ["/slow 4000"]
    # neither the steered message (dropped with the run, as the answer says) nor "Stop!" reached
    # the model
    await _until_idle(gateway, "web:halt")  # the aborted tool ends when its sleep does
    await gateway.post("halt", "stop")  # the lane is idle now: an ordinary message
    answers = await gateway.answers("halt", 2)
    assert answers[1]["text"] == "You said: stop"
    scraped = (await gateway.http.get("/metrics")).text
    assert 'gateway_messages_accepted_total{channel="web"} 4.0' in scraped  # the stop counts


async def test_an_approval_is_asked_in_the_thread_and_the_decision_answers(
    gateway: Gateway,
) -> None:
    await gateway.post("ops", "/deploy prod")
    [asked] = await gateway.answers("ops", 1)
    assert asked["kind"] == "approval_request"
    approval = asked["approval"]
    [call] = approval["calls"]
    assert call["tool_name"] == "deploy" and call["args"] == {"target": "prod"}
    body = decision_body(approval, approved=True, key="click-1")
    for _ in range(2):  # a double click is one decision
        response = await gateway.http.post("/web/threads/ops/decisions", json=body)
        assert response.status_code == 202, response.text
    answers = await gateway.answers("ops", 2)
    assert answers[1]["kind"] == "reply" and answers[1]["text"] == "Done: deployed prod"
    await asyncio.sleep(0.3)
    assert len(await gateway.answers("ops", 2)) == 2
    assert gateway.fake.duplicates() == {}


async def test_a_decision_that_changes_nothing_is_told_so(gateway: Gateway) -> None:
    await gateway.post("late", "/deploy prod")
    [asked] = await gateway.answers("late", 1)
    await gateway.post("late", "stop")
    answers = await gateway.answers("late", 2)
    assert answers[1]["text"] == "Stopped."
    clicked = decision_body(asked["approval"], approved=True, key="click-after-stop")
    response = await gateway.http.post("/web/threads/late/decisions", json=clicked)
    assert response.status_code == 409, response.text  # told at once, and nothing is stored
    error = response.json()["error"]
    assert error["code"] == "no_longer_waiting" and "stopped by anonymous" in error["message"]
    await asyncio.sleep(0.3)
    assert [a["kind"] for a in await gateway.answers("late", 2)].count("reply") == 1  # "Stopped."

    await gateway.post("twice", "/deploy prod")  # two people decide the same request
    [asked] = await gateway.answers("twice", 1)
    first = decision_body(asked["approval"], approved=True, key="ann")
    second = decision_body(asked["approval"], approved=False, key="bob")
    statuses = []
    for body in (first, second):
        response = await gateway.http.post("/web/threads/twice/decisions", json=body)
        statuses.append(response.status_code)
    # one decision a wait: bob's is refused at once, applied or not (it was taken, then
    # answered "changed nothing", when it came before ann's was applied)
    assert statuses == [202, 409], statuses
    assert "approved by anonymous" in response.json()["error"]["message"]
    answers = await gateway.answers("twice", 2)
    assert answers[1]["text"] == "Done: deployed prod"
    for order in ((True, False), (False, True)):  # Approve and Deny at the same moment
        thread = f"race-{order[0]}"
        await gateway.post(thread, "/deploy prod")
        [asked] = await gateway.answers(thread, 1)
        clicks = [
            decision_body(asked["approval"], approved=approved, key=f"k-{approved}")
            for approved in order
        ]
        sent = await asyncio.gather(
            *(gateway.http.post(f"/web/threads/{thread}/decisions", json=c) for c in clicks)
        )
        assert sorted(r.status_code for r in sent) == [202, 409], [r.text for r in sent]
        [won] = [c for c, r in zip(clicks, sent, strict=True) if r.status_code == 202]
        answers = await gateway.answers(thread, 2)
        expected = "Done: deployed prod" if won["decisions"][0]["approved"] else None
        if expected is not None:
            assert answers[1]["text"] == expected
        await asyncio.sleep(0.3)
        texts = [a["text"] for a in await gateway.answers(thread, 2)]
        assert LATE_DECISION_TEXT not in texts and len(texts) == 2, texts
        decided = [i for i in await gateway.items(thread) if i["kind"] == "decision"]
        assert len(decided) == 1  # the thread shows the one that counted

    await gateway.post("other", "/deploy prod")  # a decision for other arguments
    [asked] = await gateway.answers("other", 1)
    forged = decision_body(asked["approval"], approved=True, key="forged")
    forged["decisions"][0]["args_digest"] = "sha256:" + "0" * 64
    response = await gateway.http.post("/web/threads/other/decisions", json=forged)
    assert response.status_code == 409, response.text
    assert response.json()["error"]["code"] == "not_the_request"
    assert MISMATCHED_DECISION_TEXT.startswith("That decision changed nothing")


async def test_a_denied_call_is_answered_without_running_it(gateway: Gateway) -> None:
    await gateway.post("deny", "/deploy prod")
    [asked] = await gateway.answers("deny", 1)
    approval = asked["approval"]
    [call] = approval["calls"]
    response = await gateway.http.post(
        "/web/threads/deny/decisions",
        json={
            "run_id": approval["run_id"],
            "wait_id": approval["wait_id"],
            "decisions": [
                {
                    "tool_call_id": call["tool_call_id"],
                    "args_digest": call["args_digest"],
                    "approved": False,
                    "reason": "not today",
                }
            ],
        },
    )
    assert response.status_code == 202, response.text
    answers = await gateway.answers("deny", 2)
    assert answers[1]["kind"] == "reply"
    assert "deployed" not in answers[1]["text"]


async def test_threads_are_lanes_of_one_session_and_work_side_by_side(gateway: Gateway) -> None:
    accepted = await asyncio.gather(*(gateway.post(f"t{n}", f"message {n}") for n in range(12)))
    assert len({a["session"] for a in accepted}) == 1
    for n in range(12):
        [reply] = await gateway.answers(f"t{n}", 1)
        assert reply["text"] == f"You said: message {n}"
    assert gateway.fake.duplicates() == {}


async def test_a_message_the_lane_cannot_take_is_refused_and_the_thread_told(
    gateway: Gateway,
) -> None:
    await gateway.post("odd", "first")  # the thread exists: the intake remembered it
    await gateway.answers("odd", 1)
    broker = gateway.service.broker
    assert broker is not None
    broken = NewInboxItem(
        session="web-default",
        lane="web:odd",
        dedupe_key="web:default:odd:broken",
        kind="message",
        payload={"not": "an inbound message"},
    )
    await broker.inbox.append(broken)
    answers = await gateway.answers("odd", 2)
    assert answers[1]["kind"] == "failure_notice"
    assert answers[1]["text"] == REFUSED_TEXT
    again = await broker.inbox.append(broken)  # the same key: the item as it is now
    assert again.duplicate
    assert again.item.status == "rejected"
    assert again.item.reason is not None
    assert again.item.reason.startswith("malformed message")


async def _open_operations(gateway: Gateway, lane: str) -> list[str | None]:
    """The operation ids the workers' harnesses hold for `lane` (None: idle there)."""
    assert gateway.service.worker is not None
    held: list[str | None] = []
    for session in list(gateway.service.worker.active.values()):
        try:
            lanes = await session.harness.lanes()
        except HarnessClosed:  # released between the listing and the read: not held any more
            continue
        held.extend(info.operation_id for info in lanes if info.name == lane)
    return held


async def _until_running(gateway: Gateway, lane: str, timeout_s: float = 10.0) -> None:
    """Wait until a worker holds `lane` with an operation open."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not any(await _open_operations(gateway, lane)):
        assert asyncio.get_running_loop().time() < deadline, f"{lane} never ran"
        await asyncio.sleep(0.01)


async def _until_idle(gateway: Gateway, lane: str, timeout_s: float = 15.0) -> None:
    """Wait until no worker holds `lane` with an operation open."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while any(await _open_operations(gateway, lane)):
        assert asyncio.get_running_loop().time() < deadline, f"{lane} never went idle"
        await asyncio.sleep(0.02)


async def test_a_thread_joined_midway_gives_its_first_message_the_context(
    gateway: Gateway,
) -> None:
    earlier = [
        ContextMessage(author=Author(id="U1", name="ann"), text="the build is red"),
        ContextMessage(author=Author(id="U2"), text="since this morning"),
    ]
    first = await gateway.fake.send("mid", "what broke?", context=earlier)
    await gateway.answers("mid", 1)
    await gateway.fake.send("mid", "and now?", context=earlier)  # the lane has its own history
    await gateway.answers("mid", 2)
    texts = await gateway.user_texts(first.session, "web:mid")
    assert texts == [
        "Earlier in this thread:\nann: the build is red\nU2: since this morning\n\n"
        "The message to you:\nwhat broke?",
        "and now?",
    ]


async def test_the_intake_knows_the_threads_it_holds(gateway: Gateway) -> None:
    intake = gateway.service.intake
    assert intake is not None
    ref = gateway.fake.thread_ref("known", "default")
    assert await intake.known(ref) is None
    await gateway.post("known", "hi", space="default")
    known = await intake.known(ref)
    assert known is not None and known.thread == ref and known.session == "web-default"
    assert [k.thread.thread for k in await intake.threads("web", "default")] == ["known"]
    assert await intake.threads("web", "elsewhere") == ()


async def test_a_second_decision_under_the_same_key_learns_the_first(gateway: Gateway) -> None:
    ref = gateway.fake.thread_ref("race", "default")
    await gateway.post("race", "/deploy prod", space="default")
    [asked] = await gateway.answers("race", 1)
    approval = asked["approval"]
    [call] = approval["calls"]
    accepted = []
    for who, approved in (("ann", True), ("bob", False)):
        accepted.append(
            await gateway.fake.decide(
                ref,
                run_id=approval["run_id"],
                wait_id=approval["wait_id"],
                decisions=[
                    DecisionItem(
                        tool_call_id=call["tool_call_id"],
                        args_digest=call["args_digest"],
                        approved=approved,
                    )
                ],
                idempotency_key="wait:w1",
                decided_by=who,
            )
        )
    assert accepted[0].duplicate is False and accepted[0].first is None
    assert accepted[1].duplicate is True and accepted[1].first is not None
    assert accepted[1].first.decided_by.id == "ann"
    assert accepted[1].first.decisions[0].approved is True


async def test_the_intake_keeps_an_adapters_marks(gateway: Gateway) -> None:
    intake = gateway.service.intake
    assert intake is not None
    assert await intake.get_mark("email:bot:INBOX") is None
    assert await intake.put_mark("email:bot:INBOX", "1:5", expect=None)
    assert not await intake.put_mark("email:bot:INBOX", "1:6", expect=None)
    assert await intake.put_mark("email:bot:INBOX", "1:6", expect="1:5")
    assert await intake.get_mark("email:bot:INBOX") == "1:6"
