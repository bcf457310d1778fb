"""An operator revokes a lane or a whole session, and gives it back (D267), over the real API.

A whole `Service` (SQLite and Redis) with the test agent; messages in through the web channel.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.broker.contract import NewInboxItem
from gateway.operator_actions import OperatorAction, read_result
from tests.support.gateway_rig import decision_body
from tests.support.ops_rig import AS_VIEWER, Ops, deployed


@pytest.fixture(params=["sqlite", "redis"])
async def ops(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[Ops]:
    async with deployed(request, tmp_path) as running:
        yield running


async def _agent_items(ops: Ops, thread: str) -> list[dict[str, Any]]:
    items = (await ops.http.get(f"/web/threads/{thread}")).json()["items"]
    return [i for i in items if i["kind"] not in ("message", "decision", "approval_closed")]


async def test_a_revoked_lane_ends_its_run_keeps_its_messages_and_comes_back(ops: Ops) -> None:
    await ops.post("work", "/slow 2500")
    view = await ops.until_status("web:work", "running")
    path = f"/lanes/{view['id']}"
    body = {"reason": "the customer left"}
    viewer = await ops.act(f"{path}/revoke", body, as_=AS_VIEWER)
    assert viewer.status_code == 403

    revoked = await ops.act(f"{path}/revoke", body)
    assert revoked.status_code == 200, revoked.text
    said = revoked.json()
    assert said["changed"] is True
    assert (said["revoked"]["why"], said["revoked"]["by"]) == (
        "the customer left",
        "operator:alice",
    )
    again = await ops.act(f"{path}/revoke", {"reason": "twice"})
    assert again.json() == {**said, "changed": False}  # the first revocation stays

    view = await ops.until_status("web:work", "idle")
    assert (view["last_outcome"], view["error"]["code"]) == ("aborted", "authority_revoked")
    assert view["error"]["message"] == "the customer left"
    assert view["revoked"]["scope"] == "lane" and view["actions"] == ["unrevoke"]
    timeline = (await ops.get(f"{path}/timeline"))["items"]
    [end] = [i for i in timeline if i["type"] == "operation_finished"]
    assert end["data"]["error"]["code"] == "authority_revoked"
    for refused in ("rewind", "retry"):
        answer = await ops.act(
            f"{path}/{refused}", {"entry_id": "x"} if refused == "rewind" else None
        )
        assert answer.status_code == 409, answer.text
        assert answer.json()["error"]["details"]["reason"] == "authority_revoked"

    # an action that passed the API's check before the revocation is refused by the worker
    raced = OperatorAction(
        id="act_raced",
        kind="rewind",
        session=view["session"],
        lane="web:work",
        actor="operator:alice",
        entry_id=timeline[0]["id"],
        idempotency_key="raced",
        requested_at_ms=0,
    )
    await ops.broker.inbox.append(
        NewInboxItem(
            session=view["session"],
            lane="web:work",
            dedupe_key="operator:act_raced",
            kind="operator",
            payload=raced.model_dump(mode="json"),
        )
    )
    deadline = asyncio.get_running_loop().time() + 10
    while (result := await read_result(ops.broker, "act_raced")) is None:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.05)
    assert result.status == "refused" and result.error is not None
    assert result.error["code"] == "authority_revoked"

    rejected = (await ops.get("/backlog"))["inbox_rejected"]
    await ops.post("work", "hello?")  # accepted (202) and kept: never run, never answered
    assert (await ops.get("/backlog"))["inbox_rejected"] == rejected + 1
    await asyncio.sleep(0.5)
    assert await _agent_items(ops, "work") == []
    trail = (await ops.get("/audit?lane=web:work"))["items"]
    actions = [(e["action"], e["outcome"]) for e in trail]
    assert ("authority revoked", "revoked") in actions
    assert ("revoked run aborted", "authority_revoked") in actions
    assert ("revoked message kept", "authority_revoked") in actions

    back = await ops.act(f"{path}/unrevoke", {"reason": "they are back"})
    assert back.status_code == 200, back.text
    assert back.json()["changed"] is True and back.json()["revoked"] is None
    assert back.json()["restored_by"] == "operator:alice"
    assert (await ops.lane("web:work"))["revoked"] is None
    await ops.post("work", "back?")
    [reply] = await ops.answers("work", 1)
    assert reply["text"] == "You said: back?"


async def test_a_revoked_session_covers_every_lane_until_it_is_given_back(ops: Ops) -> None:
    await ops.post("one", "hello")
    await ops.answers("one", 1)
    session = (await ops.lane("web:one"))["session"]
    await ops.post("two", "/deploy prod")
    await ops.until_status("web:two", "suspended")
    [request] = [a for a in await ops.answers("two", 1) if a["kind"] == "approval_request"]
    assert (await ops.act("/sessions/nowhere/revoke")).status_code == 404

    revoked = await ops.act(f"/sessions/{session}/revoke", {"reason": "audit hold"})
    assert revoked.status_code == 200, revoked.text
    two = await ops.until_status("web:two", "idle")  # the approval wait ended, revoked
    assert two["error"]["code"] == "authority_revoked"
    for lane in ("web:one", "web:two"):
        seen = await ops.lane(lane)
        assert (seen["revoked"]["scope"], seen["revoked"]["why"]) == ("session", "audit hold")
    [listed] = (await ops.get("/sessions"))["items"]
    assert listed["revoked"]["why"] == "audit hold"
    click = decision_body(request["approval"], approved=True, key="late-click")
    late = await ops.http.post("/web/threads/two/decisions", json=click)
    assert late.status_code == 409 and "authority was revoked" in late.text, late.text
    broker = ops.broker

    async def dead_close() -> Any:
        return [d for d in await broker.outbox.list("dead") if d.id.startswith("approval_closed")]

    deadline = asyncio.get_running_loop().time() + 10
    while not await dead_close():  # the request's close is held as a dead letter, unsent
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.05)
    [close] = await dead_close()
    assert close.last_error.startswith("authority_revoked: audit hold")
    held = await ops.act(f"/deliveries/{close.id}/redeliver")  # a dead letter again at once
    assert held.status_code == 409, held.text
    assert held.json()["error"]["details"]["reason"] == "authority_revoked"
    assert "unrevoke it first" in held.json()["error"]["message"]

    back = await ops.act(f"/sessions/{session}/unrevoke")
    assert back.status_code == 200 and back.json()["changed"] is True, back.text
    assert (await ops.lane("web:one"))["revoked"] is None
    again = await ops.act(f"/sessions/{session}/unrevoke")
    assert again.json()["changed"] is False
    sent = await broker.outbox.get(close.id)  # the close held back goes as the authority does
    assert sent is not None and sent.status != "dead", sent
    await ops.post("one", "and now?")
    answers = await ops.answers("one", 2)
    assert answers[-1]["text"] == "You said: and now?"
