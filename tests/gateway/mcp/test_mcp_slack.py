"""An MCP server's destructive tool in Slack: Approve and Deny buttons, then one call at the server.

The whole service with the real slack-bolt app against the local fake Slack (signed requests),
the walkthrough's stand-in model (`examples/mcp/agent.py`) and the example ticket desk
(`examples/mcp/server.py`) spawned as a stdio MCP server. ``delete <n>`` calls
``tickets.delete_ticket``, which the desk declares destructive: the thread gets the approval
request with buttons, nothing reaches the desk until an approver clicks, and a double click (or
Slack's retry) still makes one call.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.channels import gateway_settings
from gateway.service import Service
from tests.support.fake_slack import FakeSlack, Message, event_envelope, form_body, signed_headers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parents[3]
SECRET = "test-signing-secret"
APPROVER = "U0AAA9"


class Rig:
    def __init__(self, fake: FakeSlack, http: httpx.AsyncClient, directory: Path) -> None:
        self.fake = fake
        self.http = http
        self.directory = directory

    async def signed(self, raw: str, content_type: str) -> httpx.Response:
        headers = {"content-type": content_type, **signed_headers(raw, SECRET)}
        return await self.http.post("/slack/events", content=raw.encode(), headers=headers)

    async def bot_replies(self, channel: str, root: str, count: int) -> list[Message]:
        deadline = asyncio.get_running_loop().time() + 20
        while True:
            found = [m for m in self.fake.thread(channel, root) if m.bot_id]
            if len(found) >= count:
                return found
            assert asyncio.get_running_loop().time() < deadline, [m.text for m in found]
            await asyncio.sleep(0.02)

    def ledger(self) -> list[dict[str, Any]]:
        path = self.directory / "ledger.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    (tmp_path / "tickets.json").write_text(
        json.dumps({"next": 2, "tickets": {"1": {"title": "old printer", "priority": "low"}}})
    )
    server = {
        "name": "tickets",
        "command": sys.executable,
        "args": [str(ROOT / "examples" / "mcp" / "server.py")],
        "env": {
            "TICKETS_FILE": str(tmp_path / "tickets.json"),
            "TICKETS_LEDGER": str(tmp_path / "ledger.jsonl"),
        },
        "trusted": True,
    }
    async with FakeSlack() as fake:
        settings = gateway_settings(
            store_url=f"sqlite:///{tmp_path}/store.db",
            broker_url=f"sqlite:///{tmp_path}/broker.db",
            web_url=f"sqlite:///{tmp_path}/web.db",
            plugin=str(ROOT / "examples" / "mcp" / "agent.py"),
            lease_seconds=6,
            renew_seconds=1,
            slack_bot_token=fake.bot_token,
            slack_signing_secret=SECRET,
            slack_api_url=fake.api_url,
            slack_approvers={"C1": (APPROVER,)},
            mcp_servers=(server,),
        )
        service = Service(settings)
        await service.start()
        assert service.app is not None
        transport = httpx.ASGITransport(app=service.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            yield Rig(fake, http, tmp_path)
        await service.stop(drain_seconds=2)


async def test_a_destructive_mcp_call_runs_once_after_approve_from_slacks_button(
    rig: Rig,
) -> None:
    event = rig.fake.mention_event("C1", "delete 1")
    response = await rig.signed(json.dumps(event_envelope(event)), "application/json")
    assert response.status_code == 200, response.text
    [asked] = await rig.bot_replies("C1", event["ts"], 1)
    assert "tickets.delete_ticket" in json.dumps(asked.blocks)
    await asyncio.sleep(0.5)
    assert rig.ledger() == []  # nothing at the desk before the click

    click = rig.fake.block_actions_payload("C1", asked.ts, "approve", user=APPROVER)
    for _ in range(2):  # a double click, or Slack's retry: one decision, one call
        answered = await rig.signed(form_body(click), "application/x-www-form-urlencoded")
        assert answered.status_code == 200, answered.text
    replies = await rig.bot_replies("C1", event["ts"], 2)
    assert replies[1].text == "Deleted ticket #1: old printer"
    await asyncio.sleep(0.5)
    [deleted] = rig.ledger()
    assert deleted["tool"] == "delete_ticket" and deleted["key"] is not None
