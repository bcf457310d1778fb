"""An operator replays a stuck thread: `gateway serve` as a process, the operator API over HTTP.

A message makes the agent charge a card (``replay="never"``) and then run a tool that kills
the process; every takeover dies again until the lane is parked stuck after `max_attempts`.
The operator lists it as stuck, reads what a resume would do, resumes it with
``tool_recovery=never``: the run completes, its reply is delivered, the action is in the audit
trail and the card was charged exactly once.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters.web import open_mailbox
from tests.support.gateway_process import GatewayProcess

AGENT = "tests.support.gateway_agent"
OPERATOR = "ops-operator-secret-0123456789"
VIEWER = "ops-viewer-secret-0123456789ab"


async def _answers(web_url: str, thread: str) -> list[Any]:
    mailbox = open_mailbox(web_url)
    try:
        items = await mailbox.read("default", thread, after=0, limit=100)
    finally:
        await mailbox.close()
    return [item for item in items if item.kind not in ("message", "decision", "approval_closed")]


def _api(gateway: GatewayProcess, method: str, path: str, token: str, **kw: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}", **kw.pop("headers", {})}
    return httpx.request(method, f"{gateway.url}/api/v1{path}", headers=headers, timeout=30, **kw)


@pytest.mark.timeout(150)
async def test_a_stuck_lane_is_resumed_with_tool_recovery_never(tmp_path: Path) -> None:
    effects = tmp_path / "effects.jsonl"
    settings = {
        "store_url": f"sqlite:///{tmp_path}/store.db",
        "broker_url": f"sqlite:///{tmp_path}/broker.db",
        "web_url": f"sqlite:///{tmp_path}/web.db",
        "plugin": AGENT,
        "lease_seconds": "3",
        "renew_seconds": "0.5",
        "max_attempts": "2",
        "ops_tokens": f"alice:operator:{OPERATOR},bob:viewer:{VIEWER}",
    }
    gateway = GatewayProcess(
        "gw", tmp_path, settings, extra_env={"AGENT_TEST_EFFECTS": str(effects)}
    ).start()
    try:
        try:  # the tool may kill the process before the 202 leaves it: accepted all the same
            posted = httpx.post(  # noqa: ASYNC210 (a test's client, one request at a time)
                f"{gateway.url}/web/threads/card/messages",
                json={"text": "/charge-then-poison"},
                timeout=10,
            )
            assert posted.status_code == 202, posted.text
        except httpx.RemoteProtocolError:
            pass
        deadline = time.monotonic() + 90
        while not await _answers(settings["web_url"], "card"):  # the stuck notice
            assert time.monotonic() < deadline, gateway.tail()
            if not gateway.alive:
                gateway.restart(wait_ready_s=0)  # it may die again before it is ready
            await asyncio.sleep(0.1)

        for other in ("other-1", "other-2"):  # each a take of the session, past its linger
            await asyncio.sleep(1.5)
            posted = httpx.post(  # noqa: ASYNC210 (a test's client, one request at a time)
                f"{gateway.url}/web/threads/{other}/messages", json={"text": "hi"}, timeout=10
            )
            assert posted.status_code == 202, posted.text
            while not await _answers(settings["web_url"], other):
                assert time.monotonic() < deadline, gateway.tail()
                await asyncio.sleep(0.1)

        listed = _api(gateway, "GET", "/lanes?stuck=true", VIEWER)
        assert listed.status_code == 200, listed.text
        [lane] = listed.json()["items"]
        assert (lane["lane"], lane["status"], lane["attempts"]) == ("web:card", "stuck", 2)
        assert {"resume", "unstick", "abort"} <= set(lane["actions"])
        [call] = lane["interrupted_calls"]  # the charge has its result; the poison has none
        assert (call["tool_name"], call["replay"]) == ("poison", "safe")
        assert "interrupted" in call["on_resume"]["never"]
        assert listed.headers["x-request-id"]

        refused = _api(
            gateway, "POST", f"/lanes/{lane['id']}/unstick", VIEWER,
            json={"tool_recovery": "never"},
        )  # fmt: skip
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "forbidden"

        resumed = _api(
            gateway, "POST", f"/lanes/{lane['id']}/resume", OPERATOR,
            json={"tool_recovery": "never"}, headers={"Idempotency-Key": "fix-card-1"},
        )  # fmt: skip
        assert resumed.status_code == 200, resumed.text
        result = resumed.json()
        assert (result["status"], result["outcome"]) == ("done", "completed")
        again = _api(
            gateway, "POST", f"/lanes/{lane['id']}/resume", OPERATOR,
            json={"tool_recovery": "never"}, headers={"Idempotency-Key": "fix-card-1"},
        )  # fmt: skip
        assert again.status_code == 200 and again.json() == result  # replayed, not redone

        deadline = time.monotonic() + 20
        while len(answers := await _answers(settings["web_url"], "card")) < 2:
            assert time.monotonic() < deadline, gateway.tail()
            await asyncio.sleep(0.1)
        assert answers[-1].kind == "reply" and answers[-1].text.startswith("Done:")

        now = _api(gateway, "GET", f"/lanes/{lane['id']}", VIEWER).json()
        assert now["status"] == "idle" and now["last_outcome"] == "completed"
        timeline = _api(gateway, "GET", f"/lanes/{lane['id']}/timeline?limit=500", VIEWER)
        summaries = [item["summary"] for item in timeline.json()["items"]]
        assert any("poison" in s and "interrupted" in s.lower() for s in summaries), summaries
        lane_trail = [(e["actor"], e["action"]) for e in timeline.json()["audit"]]
        assert ("operator:alice", "resume") in lane_trail  # the action shows in the timeline
        # said once, though its session was taken again (the operator's resume takes it)
        assert [action for _, action in lane_trail].count("lane stuck") == 1, lane_trail
        trail = _api(gateway, "GET", "/audit?lane=web:card", VIEWER).json()["items"]
        mine = [e for e in trail if e["actor"] == "operator:alice"]
        assert [(e["action"], e["outcome"]) for e in mine] == [("resume", "completed")]
        assert mine[0]["details"]["tool_recovery"] == "never" and mine[0]["details"]["unstick"]
    finally:
        gateway.stop()
    assert gateway.tail().count("Traceback") == 0
    charges = [json.loads(line) for line in effects.read_text().splitlines()]
    assert len(charges) == 1, charges  # the replay="never" tool ran once in total
