"""MCP tools through `gateway serve` killed mid-call: never twice unless safe, and the thread told.

A real gateway process (SQLite store, broker and web mailbox in the test's directory) runs the
walkthrough's stand-in model (`examples/mcp/agent.py`) with the example ticket desk
(`examples/mcp/server.py`) as a stdio MCP server it spawns. The desk appends one ledger line per
change it makes (with the idempotency key the gateway sent in ``_meta``), so the test counts what
happened at the server, not what the gateway believes. SIGKILL lands while a call is in progress
at the server (its change already made): a call that is not safe to repeat (``create_ticket``:
neither read-only nor idempotent) is not made again and the thread says it may have happened; an
idempotent one (``set_priority``) is made again exactly once, under the same key.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters.web import open_mailbox
from tests.support.gateway_process import GatewayProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

ROOT = Path(__file__).resolve().parents[3]
SERVER = ROOT / "examples" / "mcp" / "server.py"
AGENT = ROOT / "examples" / "mcp" / "agent.py"


def _gateway(tmp_path: Path, *, slow_seconds: float) -> GatewayProcess:
    servers = [
        {
            "name": "tickets",
            "command": sys.executable,
            "args": [str(SERVER)],
            "env": {
                "TICKETS_FILE": str(tmp_path / "tickets.json"),
                "TICKETS_LEDGER": str(tmp_path / "ledger.jsonl"),
                "TICKETS_SLOW_SECONDS": str(slow_seconds),
            },
            "trusted": True,
        }
    ]
    settings = {
        "store_url": f"sqlite:///{tmp_path}/store.db",
        "broker_url": f"sqlite:///{tmp_path}/broker.db",
        "web_url": f"sqlite:///{tmp_path}/web.db",
        "plugin": str(AGENT),
        "lease_seconds": "3",
        "renew_seconds": "0.5",
        "mcp_servers": json.dumps(servers),
    }
    return GatewayProcess("gw", tmp_path, settings)


def _slow(gateway: GatewayProcess, seconds: float) -> None:
    """The next incarnation's desk answers after `seconds` (0: at once)."""
    servers = json.loads(gateway.env["GATEWAY_MCP_SERVERS"])
    servers[0]["env"]["TICKETS_SLOW_SECONDS"] = str(seconds)
    gateway.env["GATEWAY_MCP_SERVERS"] = json.dumps(servers)


def _desk(tmp_path: Path, tickets: dict[str, Any]) -> None:
    (tmp_path / "tickets.json").write_text(
        json.dumps({"next": len(tickets) + 1, "tickets": tickets})
    )


def _ledger(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "ledger.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _post(gateway: GatewayProcess, thread: str, text: str) -> None:
    response = httpx.post(
        f"{gateway.url}/web/threads/{thread}/messages", json={"text": text}, timeout=10
    )
    assert response.status_code == 202, response.text


async def _until_ledger(tmp_path: Path, count: int, gateway: GatewayProcess) -> None:
    deadline = time.monotonic() + 30
    while len(_ledger(tmp_path)) < count:
        assert time.monotonic() < deadline, gateway.tail()
        await asyncio.sleep(0.02)


async def _replies(web_url: str, thread: str, count: int, gateway: GatewayProcess) -> list[str]:
    """Wait until the web thread holds `count` replies; their texts."""
    deadline = time.monotonic() + 30
    while True:
        mailbox = open_mailbox(web_url)
        try:
            items = await mailbox.read("default", thread, after=0, limit=100)
        finally:
            await mailbox.close()
        texts = [item.text for item in items if item.kind == "reply"]
        if len(texts) >= count:
            return texts
        assert time.monotonic() < deadline, (texts, gateway.tail())
        await asyncio.sleep(0.05)


async def test_a_non_idempotent_call_cut_by_sigkill_is_not_made_again_and_the_thread_is_told(
    tmp_path: Path,
) -> None:
    gateway = _gateway(tmp_path, slow_seconds=60).start()
    try:
        _post(gateway, "desk", "create printer on fire")
        await _until_ledger(tmp_path, 1, gateway)  # the desk made the ticket, still answering
        gateway.kill()
        _slow(gateway, 0)
        gateway.restart()

        [answer] = await _replies(f"sqlite:///{tmp_path}/web.db", "desk", 1, gateway)
        assert "may or may not have happened" in answer, answer
        await asyncio.sleep(1.0)  # time enough for a wrong second call to reach the desk
        [made] = _ledger(tmp_path)
        assert made["tool"] == "create_ticket"
        assert made["key"] is not None  # the idempotency key went out in `_meta`
        tickets = json.loads((tmp_path / "tickets.json").read_text())["tickets"]
        assert [t["title"] for t in tickets.values()] == ["printer on fire"]
    finally:
        gateway.stop()


async def test_an_idempotent_call_cut_by_sigkill_is_made_again_exactly_once(
    tmp_path: Path,
) -> None:
    _desk(tmp_path, {"1": {"title": "printer on fire", "priority": "normal"}})
    gateway = _gateway(tmp_path, slow_seconds=60).start()
    try:
        _post(gateway, "desk", "priority 1 high")
        await _until_ledger(tmp_path, 1, gateway)
        gateway.kill()
        _slow(gateway, 0)
        gateway.restart()

        [answer] = await _replies(f"sqlite:///{tmp_path}/web.db", "desk", 1, gateway)
        assert answer == "Ticket #1 is now high priority."
        await asyncio.sleep(1.0)
        first, again = _ledger(tmp_path)
        assert first["tool"] == again["tool"] == "set_priority"
        assert first["key"] == again["key"] is not None  # the same call, deduplicable
        assert first["pid"] != again["pid"]  # by the desk the new incarnation started
    finally:
        gateway.stop()
