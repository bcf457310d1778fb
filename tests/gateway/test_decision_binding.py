"""Decisions bound all the way, and requests that say how they closed (issue 24: 10, 16, 20, 22).

A whole `Service` on SQLite with the real web channel and the operator API. A decision names a
thread, a wait, its run and the exact batch (calls and digests): each is checked against the store
before anything is held, so a forged or misdirected one is refused in its own response (409),
stores nothing, and never takes the slot of the genuine decision under the same key. When a wait
ends (a decision from anywhere, a stop, an operator's abort) the thread gets one
``approval_closed`` item saying how and by whom.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from gateway.channels import gateway_settings
from gateway.service import Service
from tests.support.gateway_rig import decision_body
from tests.support.service_rig import ServiceRig

AGENT = "tests.support.gateway_agent"
OPERATOR = "operator-secret-abcdefghijklmnop"
AS_OPERATOR = {"Authorization": f"Bearer {OPERATOR}"}
SESSION = "web-default"

Forge = Callable[[dict[str, Any], dict[str, Any]], None]
"""Turns the genuine decision body into a hostile one (given another thread's request)."""


@pytest.fixture
async def rig(tmp_path: Any) -> AsyncIterator[ServiceRig]:
    settings = gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"sqlite:///{tmp_path}/web.db",
        plugin=AGENT,
        lease_seconds=6,
        renew_seconds=1,
        ops_tokens=(f"alice:operator:{OPERATOR}",),
    )
    service = Service(settings)
    await service.start()
    assert service.app is not None
    transport = httpx.ASGITransport(app=service.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        yield ServiceRig(service, http)
    await service.stop(drain_seconds=2)


async def _asked(rig: ServiceRig, thread: str) -> dict[str, Any]:
    """Ask for a deploy in `thread`; the approval request's view once it is there."""
    await rig.post(thread, "/deploy prod")
    [asked] = await rig.answers(thread, 1)
    assert asked["kind"] == "approval_request"
    approval: dict[str, Any] = asked["approval"]
    return approval


async def _items(rig: ServiceRig, thread: str, kind: str) -> list[dict[str, Any]]:
    items = (await rig.http.get(f"/web/threads/{thread}")).json()["items"]
    return [item for item in items if item["kind"] == kind]


async def _until_items(rig: ServiceRig, thread: str, kind: str, count: int) -> list[dict[str, Any]]:
    deadline = asyncio.get_running_loop().time() + 15
    while len(found := await _items(rig, thread, kind)) < count:
        assert asyncio.get_running_loop().time() < deadline, found
        await asyncio.sleep(0.02)
    return found


def _other_request(body: dict[str, Any], other: dict[str, Any]) -> None:
    body.update(decision_body(other, approved=True, key=body["idempotency_key"]))


def _extra_call(body: dict[str, Any], other: dict[str, Any]) -> None:
    body["decisions"].append({**body["decisions"][0], "tool_call_id": "call-extra"})


HOSTILE: list[Any] = [
    pytest.param(lambda b, o: b.update(wait_id="w-made-up"), "no_such_request", id="made-up wait"),
    pytest.param(_other_request, "no_such_request", id="another thread's request"),
    pytest.param(lambda b, o: b.update(run_id=o["run_id"]), "not_the_request", id="another run"),
    pytest.param(
        lambda b, o: b["decisions"][0].update(args_digest="sha256:" + "0" * 64),
        "not_the_request",
        id="other arguments",
    ),
    pytest.param(
        lambda b, o: b["decisions"][0].update(tool_call_id="call-x"),
        "not_the_request",
        id="another call",
    ),
    pytest.param(_extra_call, "not_the_request", id="an extra call"),
    pytest.param(lambda b, o: b.update(wait_id="x" * 200), "no_such_request", id="a huge wait id"),
    pytest.param(lambda b, o: b.update(wait_id="../..%00"), "no_such_request", id="a path wait id"),
]


@pytest.mark.parametrize(("forge", "code"), HOSTILE)
async def test_a_forged_decision_is_refused_and_the_genuine_one_still_decides(
    rig: ServiceRig, forge: Forge, code: str
) -> None:
    other = await _asked(rig, "elsewhere")
    approval = await _asked(rig, "ship")
    genuine = decision_body(approval, approved=True, key="click-1")
    forged = copy.deepcopy(genuine)  # the same client key: it must not take the genuine's slot
    forge(forged, other)
    refused = await rig.http.post("/web/threads/ship/decisions", json=forged)
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == code
    assert refused.json()["error"]["message"].endswith("Nothing was recorded.")
    accepted = await rig.http.post("/web/threads/ship/decisions", json=genuine)
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["duplicate"] is False
    answers = await rig.answers("ship", 2)
    assert answers[1]["text"] == "Done: deployed prod"
    assert len(await _items(rig, "ship", "decision")) == 1  # the forged one stored nothing


async def test_a_key_reused_for_another_request_is_another_decision(rig: ServiceRig) -> None:
    first = await _asked(rig, "ship")
    accepted = await rig.http.post(
        "/web/threads/ship/decisions", json=decision_body(first, approved=True, key="k")
    )
    assert accepted.status_code == 202, accepted.text
    assert (await rig.answers("ship", 2))[1]["text"] == "Done: deployed prod"
    await rig.post("ship", "/deploy staging")  # the same thread asks again
    second = (await _until_items(rig, "ship", "approval_request", 2))[1]["approval"]
    again = await rig.http.post(
        "/web/threads/ship/decisions", json=decision_body(second, approved=True, key="k")
    )
    assert again.status_code == 202, again.text
    assert again.json()["duplicate"] is False
    replies = await _until_items(rig, "ship", "reply", 2)
    assert replies[1]["text"] == "Done: deployed staging"


async def _no_history(rig: ServiceRig, thread: str) -> None:
    """Nothing: the thread was never written to."""


async def _answered(rig: ServiceRig, thread: str) -> None:
    await rig.post(thread, "hello")
    await rig.answers(thread, 1)


async def _decided(rig: ServiceRig, thread: str) -> None:
    approval = await _asked(rig, thread)
    body = decision_body(approval, approved=True, key="first")
    assert (await rig.http.post(f"/web/threads/{thread}/decisions", json=body)).status_code == 202
    await rig.answers(thread, 2)


@pytest.mark.parametrize(
    "history",
    [
        pytest.param(_no_history, id="a thread that never was"),
        pytest.param(_answered, id="a thread with no request"),
        pytest.param(_decided, id="a thread whose request was decided"),
    ],
)
async def test_a_decision_where_nothing_waits_is_told_so_and_creates_nothing(
    rig: ServiceRig, history: Callable[[ServiceRig, str], Any]
) -> None:
    await history(rig, "quiet")
    before = (await rig.http.get("/web/threads/quiet")).json()["items"]
    made_up = {
        "run_id": "r-made-up",
        "wait_id": "w-made-up",
        "decisions": [{"tool_call_id": "c1", "args_digest": "sha256:x", "approved": True}],
    }
    response = await rig.http.post("/web/threads/quiet/decisions", json=made_up)
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert error["code"] == "no_such_request"
    assert error["message"].startswith("Nothing waits for a decision here")
    assert "no longer waiting" not in error["message"]  # a made-up wait never waited
    await asyncio.sleep(0.3)
    assert (await rig.http.get("/web/threads/quiet")).json()["items"] == before
    assert await rig.broker.inbox.pending(SESSION, limit=10) == ()
    if history is _no_history:  # no thread, no lane: not even the session was created
        assert await rig.broker.threads.get(SESSION, "web:quiet") is None
        assert SESSION not in [meta.id for meta in await rig.repo.list()]
    else:  # the thread's lane holds what it held
        storage = await rig.repo.open(SESSION)
        try:
            assert "web:quiet" in [pointer.lane for pointer in await storage.get_lanes()]
        finally:
            await storage.close()


async def _decide_from_the_api(rig: ServiceRig, thread: str) -> None:
    lane = await _lane_view(rig, thread)
    [call] = lane["pending_approvals"]
    body = {"wait_id": lane["wait_id"], "approvals": {call["tool_call_id"]: {"action": "approve"}}}
    headers = {**AS_OPERATOR, "Idempotency-Key": "api-1"}
    response = await rig.http.post(
        f"/api/v1/lanes/{lane['id']}/decisions", json=body, headers=headers
    )
    assert response.status_code == 200, response.text


async def _abort_from_the_api(rig: ServiceRig, thread: str) -> None:
    lane = await _lane_view(rig, thread)
    headers = {**AS_OPERATOR, "Idempotency-Key": "abort-1"}
    response = await rig.http.post(f"/api/v1/lanes/{lane['id']}/abort", headers=headers)
    assert response.status_code == 200, response.text


async def _stop_in_the_thread(rig: ServiceRig, thread: str) -> None:
    response = await rig.http.post(
        f"/web/threads/{thread}/messages", json={"text": "stop", "author": "carol"}
    )
    assert response.status_code == 202, response.text


async def _lane_view(rig: ServiceRig, thread: str) -> dict[str, Any]:
    response = await rig.http.get("/api/v1/lanes", headers=AS_OPERATOR)
    [view] = [v for v in response.json()["items"] if v["lane"] == f"web:{thread}"]
    found: dict[str, Any] = view
    return found


@pytest.mark.parametrize(
    ("close", "said"),
    [
        pytest.param(_decide_from_the_api, "approved by operator:alice", id="an API decision"),
        pytest.param(_abort_from_the_api, "stopped by operator:alice", id="an API abort"),
        pytest.param(_stop_in_the_thread, "stopped by carol", id="a stop in the thread"),
    ],
)
async def test_a_request_closed_elsewhere_says_what_was_decided_and_by_whom(
    rig: ServiceRig, close: Callable[[ServiceRig, str], Any], said: str
) -> None:
    approval = await _asked(rig, "ship")
    await close(rig, "ship")
    [closed] = await _until_items(rig, "ship", "approval_closed", 1)
    assert said in closed["text"] and closed["text"].startswith("The approval request for deploy")
    assert closed["closed"]["wait_id"] == approval["wait_id"]
    await asyncio.sleep(0.3)
    assert len(await _items(rig, "ship", "approval_closed")) == 1  # one close per wait
    late = await rig.http.post(
        "/web/threads/ship/decisions", json=decision_body(approval, approved=True, key="late")
    )
    assert late.status_code == 409 and said in late.json()["error"]["message"]
