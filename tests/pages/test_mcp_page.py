"""An MCP server's destructive tool in the web page: it waits for a click, then runs once.

A real `gateway serve` spawns the example ticket desk (`examples/mcp/server.py`) as a stdio MCP
server; the walkthrough's stand-in model (`examples/mcp/agent.py`) calls
``tickets.delete_ticket`` on ``delete <n>``. The desk declares that tool destructive (and
idempotent), so the thread shows Approve and Deny and nothing happens at the desk until the
click; after it the desk deletes the ticket exactly once (its ledger counts the calls).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page, expect

from tests.support.browser import BROWSER_TESTS
from tests.support.gateway_process import GatewayProcess

pytestmark = [pytest.mark.slow, BROWSER_TESTS, pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    (tmp_path / "tickets.json").write_text(
        json.dumps({"next": 2, "tickets": {"1": {"title": "old printer", "priority": "low"}}})
    )
    servers = [
        {
            "name": "tickets",
            "command": sys.executable,
            "args": [str(ROOT / "examples" / "mcp" / "server.py")],
            "env": {
                "TICKETS_FILE": str(tmp_path / "tickets.json"),
                "TICKETS_LEDGER": str(tmp_path / "ledger.jsonl"),
            },
            "trusted": True,
        }
    ]
    settings = {
        "store_url": f"sqlite:///{tmp_path}/store.db",
        "broker_url": f"sqlite:///{tmp_path}/broker.db",
        "web_url": f"sqlite:///{tmp_path}/web.db",
        "plugin": str(ROOT / "examples" / "mcp" / "agent.py"),
        "lease_seconds": "6",
        "renew_seconds": "1",
        "mcp_servers": json.dumps(servers),
    }
    process = GatewayProcess("gw", tmp_path, settings).start()
    try:
        yield process
    finally:
        process.stop()


def _ledger(directory: Path) -> list[dict[str, Any]]:
    path = directory / "ledger.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def test_a_destructive_mcp_call_runs_once_after_approve_on_the_page(
    gateway: GatewayProcess, page: Page, console_errors: list[str]
) -> None:
    await page.goto(f"{gateway.url}/web/threads/desk/page")
    await expect(page.locator("#status")).to_have_text("live")
    await page.get_by_label("your name").fill("Ann")
    await page.get_by_label("message").fill("delete 1")
    await page.get_by_role("button", name="Send").click()

    asked = page.locator(".item.approval_request")
    await expect(asked).to_have_count(1)
    await expect(asked.locator(".call .label")).to_have_text("tickets.delete_ticket")
    await expect(asked.locator(".call pre")).to_contain_text('"number": 1')
    await asyncio.sleep(0.5)
    assert _ledger(gateway.directory) == []  # nothing happens at the desk before the click

    await asked.get_by_role("button", name="Approve", exact=True).click()
    reply = page.locator(".item.reply")
    await expect(reply).to_have_count(1)
    await expect(reply.locator(".text")).to_have_text("Deleted ticket #1: old printer")
    await expect(asked.locator(".decided")).to_contain_text(re.compile(r"closed: approved by Ann"))
    await asyncio.sleep(0.5)
    [deleted] = _ledger(gateway.directory)
    assert deleted["tool"] == "delete_ticket" and deleted["args"] == {"number": 1}
    assert console_errors == []
