"""Supplying a call's result instead of approving it, through the real paths (D263).

A whole `Service` (SQLite and Redis) with the test agent: an operator answers a pending
``deploy`` with its result over the operator API, a person does from the web channel. The tool
never runs, the agent reads the result, the thread says who supplied it, and the lane's
timeline reads the decision as such; refusals (a viewer, an old wait, bad input) store nothing.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from harness_core.session import StoredRecord
from harness_core.session.records import MAX_SUPPLIED_CHARS
from tests.support.ops_rig import AS_VIEWER, Ops, deployed

BY_HAND = "deployed build 42 by hand\nfrom the release console at 10:02"
WHEN = r"\d{4}-\d\d-\d\d \d\d:\d\d UTC"


@pytest.fixture(params=["sqlite", "redis"])
async def ops(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[Ops]:
    async with deployed(request, tmp_path) as running:
        yield running


async def _thread_item(ops: Ops, thread: str, kind: str) -> dict[str, Any]:
    """The first item of `kind` in a web thread, once it is there."""
    deadline = asyncio.get_running_loop().time() + 15
    while True:
        items = (await ops.http.get(f"/web/threads/{thread}")).json()["items"]
        found = [i for i in items if i["kind"] == kind]
        if found:
            item: dict[str, Any] = found[0]
            return item
        assert asyncio.get_running_loop().time() < deadline, items
        await asyncio.sleep(0.02)


async def _records(ops: Ops, session: str, kind: str) -> list[Any]:
    storage = await ops.repo.open(session)
    try:
        log = await storage.get_log()
        return [r for r in log if isinstance(r, StoredRecord) and r.record.type == kind]
    finally:
        await storage.close()


async def test_an_operator_supplies_the_result_and_the_tool_never_runs(ops: Ops) -> None:
    accepted = await ops.post("by-hand", "/deploy prod")
    session = accepted["session"]
    view = await ops.until_status("web:by-hand", "suspended")
    [call] = view["pending_approvals"]
    call_id = call["tool_call_id"]
    path = f"/lanes/{view['id']}/decisions"

    def body(**choice: Any) -> dict[str, Any]:
        return {"wait_id": view["wait_id"], "approvals": {call_id: {"action": "supply", **choice}}}

    right = body(result=BY_HAND)
    before = await ops.log_size(session)

    viewer = await ops.act(path, right, key="s-viewer", as_=AS_VIEWER)
    assert viewer.status_code == 403 and viewer.json()["error"]["code"] == "forbidden"
    stale = await ops.act(path, {**right, "wait_id": "an-old-wait"}, key="s-stale")
    assert stale.status_code == 409
    error = stale.json()["error"]
    assert error["message"].startswith("the lane is not waiting on that approval")
    assert error["details"] == {"reason": "not_idle_waiting_head", "wait_id": view["wait_id"]}
    bad = {
        "blank": (body(result=" \n\t "), "a non-empty 'result'"),
        "missing": (body(), "a non-empty 'result'"),
        "huge": (body(result="x" * (MAX_SUPPLIED_CHARS + 1)), "at most 100000 characters"),
        "on an approval": (
            {
                "wait_id": view["wait_id"],
                "approvals": {call_id: {"action": "approve", "result": "x"}},
            },
            "'result' and 'is_error' go with supply, not approve",
        ),
    }
    for name, (wrong, said) in bad.items():
        refused = await ops.act(path, wrong, key=f"s-bad-{name.replace(' ', '-')}")
        assert refused.status_code == 400, (name, refused.text)
        fields = refused.json()["error"]["details"]["fields"]
        assert len(fields) == 1, (name, fields)
        [field] = fields
        assert field["field"].startswith(f"approvals.{call_id}"), (name, field)
        assert said in field["reason"], (name, field)
    assert await ops.log_size(session) == before  # refusals stored nothing

    supplied = await ops.act(path, right, key="s-1")
    assert supplied.status_code == 200, supplied.text
    result = supplied.json()
    assert (result["status"], result["kind"], result["outcome"]) == ("done", "decide", "completed")
    replay = await ops.act(path, right, key="s-1")
    assert replay.status_code == 200 and replay.json() == result
    answers = await ops.answers("by-hand", 2)
    assert answers[-1]["text"] == f"Done: {BY_HAND}"  # the agent read the result given

    # the tool never ran, and the one decision holds the result
    assert await _records(ops, session, "tool_started") == []
    [decided] = await _records(ops, session, "approval_decided")
    assert decided.record.decided_by == "operator:alice"
    assert decided.record.decisions[0].supplied.text == BY_HAND

    # the thread says who supplied it, and its first line
    closed = await _thread_item(ops, "by-hand", "approval_closed")
    assert re.fullmatch(
        f"The approval request for deploy is closed: operator:alice supplied the result at "
        f"{WHEN}: deployed build 42 by hand…",
        closed["text"],
    ), closed["text"]
    assert closed["closed"]["outcome"] == "supplied"
    assert closed["closed"]["result"] == "deployed build 42 by hand…"

    # the timeline reads the decision and the result as supplied; the audit names the call
    timeline = (await ops.get(f"/lanes/{view['id']}/timeline"))["items"]
    summaries = [item["summary"] for item in timeline]
    assert (
        f"approval decided by operator:alice: {call_id} result supplied: deployed build 42 by hand…"
    ) in summaries
    assert f"tool_result (deploy) [supplied by operator:alice]: {BY_HAND}" in summaries
    [event] = [
        e for e in (await ops.get("/audit?lane=web:by-hand"))["items"] if e["action"] == "decide"
    ]
    assert event["actor"] == "operator:alice" and event["details"]["supplied"] == [call_id]


async def test_a_failed_action_is_supplied_as_a_failed_call(ops: Ops) -> None:
    accepted = await ops.post("failed", "/deploy prod")
    view = await ops.until_status("web:failed", "suspended")
    [call] = view["pending_approvals"]
    choice = {"action": "supply", "result": "the deploy failed: disk full", "is_error": True}
    body = {"wait_id": view["wait_id"], "approvals": {call["tool_call_id"]: choice}}
    done = await ops.act(f"/lanes/{view['id']}/decisions", body, key="f-1")
    assert done.status_code == 200, done.text
    closed = await _thread_item(ops, "failed", "approval_closed")
    assert "operator:alice supplied the result (the action failed) at " in closed["text"]
    timeline = (await ops.get(f"/lanes/{view['id']}/timeline"))["items"]
    [result] = [i for i in timeline if i["summary"].startswith("tool_result")]
    assert result["data"]["message"]["outcome"] == "error"
    assert any("result supplied (the action failed): the deploy" in i["summary"] for i in timeline)
    assert await _records(ops, accepted["session"], "tool_started") == []


async def test_a_person_supplies_the_result_from_the_web_thread(ops: Ops) -> None:
    accepted = await ops.post("web-hand", "/deploy prod")
    asked = await _thread_item(ops, "web-hand", "approval_request")
    view = asked["approval"]
    [call] = view["calls"]
    path = "/web/threads/web-hand/decisions"

    def click(**item: Any) -> dict[str, Any]:
        decision = {"tool_call_id": call["tool_call_id"], "args_digest": call["args_digest"]}
        return {
            "run_id": view["run_id"],
            "wait_id": view["wait_id"],
            "decisions": [{**decision, "approved": True, **item}],
            "author": "Ann",
        }

    before = await ops.log_size(accepted["session"])
    bad = {
        "blank": (click(result="   "), 400, "empty_text", "'result' is empty"),
        "huge": (click(result="y" * (MAX_SUPPLIED_CHARS + 1)), 400, "text_too_long", "at most"),
        "denied": (click(result="x", approved=False), 400, "invalid_request", "approved: true"),
        "no result": (click(is_error=True), 400, "invalid_request", "'is_error' goes with"),
        "old wait": (
            {**click(result="x"), "wait_id": "an-old-wait"},
            409,
            "no_such_request",
            "Nothing was recorded",
        ),
    }
    for name, (wrong, status, code, said) in bad.items():
        refused = await ops.http.post(path, json=wrong)
        assert refused.status_code == status, (name, refused.text)
        error = refused.json()["error"]
        assert error["code"] == code and said in error["message"], (name, error)
        assert "\n" not in error["message"]
    assert await ops.log_size(accepted["session"]) == before

    sent = await ops.http.post(path, json=click(result="restarted it myself"))
    assert sent.status_code == 202, sent.text
    again = await ops.http.post(path, json=click(result="restarted it myself"))
    assert again.status_code == 202 and again.json()["duplicate"] is True
    answers = await ops.answers("web-hand", 2)
    assert answers[-1]["text"] == "Done: restarted it myself"
    decision = await _thread_item(ops, "web-hand", "decision")
    assert decision["decision"]["decisions"][0]["supplied"] == {
        "text": "restarted it myself",
        "is_error": False,
    }
    closed = await _thread_item(ops, "web-hand", "approval_closed")
    assert re.fullmatch(
        f"The approval request for deploy is closed: Ann supplied the result at {WHEN}: "
        "restarted it myself.",
        closed["text"],
    ), closed["text"]
    assert await _records(ops, accepted["session"], "tool_started") == []
