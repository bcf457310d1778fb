"""The /ops page's MCP servers section in headless Chromium (D210).

A whole `Service` runs in the test's process behind a real HTTP server; what its MCP tool source
would say is injected through `Service.mcp_health`. Without servers the section is not shown;
with three, each is a row: transport, target, state (with the next restart), trusted, how many
tools (the names on hover), restarts, calls / failures and the last error (and what a stdio
server printed to stderr as it stopped). With
``TEST_SCREENSHOTS=1`` it writes ``docs/screenshots/ops-mcp.png``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import Page, expect

from gateway.channels import gateway_settings
from gateway.mcp.health import McpServerHealth
from gateway.service import Service
from tests.adapters.kit import serve
from tests.ops.test_mcp import BROKEN
from tests.support.browser import BROWSER_TESTS, screenshot

pytestmark = [pytest.mark.slow, BROWSER_TESTS, pytest.mark.timeout(60)]

OPERATOR = "page-operator-secret-0123456789"
AT_MS = 1_767_225_600_000  # 2026-01-01 00:00:00 UTC
SERVERS = (
    McpServerHealth(
        name="tickets",
        transport="stdio",
        target="tickets-server",
        state="ready",
        trusted=False,
        tools=("tickets.create", "tickets.list"),
        calls=12,
        failures=1,
        last_error="tickets.create: no answer in 30 s",
    ),
    McpServerHealth(
        name="deploys",
        transport="http",
        target="https://deploys.example/mcp",
        state="restarting",
        trusted=True,
        tools=(),
        restarts=3,
        calls=4,
        failures=4,
        last_error="connection refused",
        retry_at_ms=AT_MS + 90_000,
    ),
    BROKEN,  # a stdio server that stopped, with what it printed to stderr
)


async def _service(tmp_path: Path) -> Service:
    service = Service(
        gateway_settings(
            store_url=f"sqlite:///{tmp_path}/store.db",
            broker_url=f"sqlite:///{tmp_path}/broker.db",
            web_url=f"sqlite:///{tmp_path}/web.db",
            plugin="tests.support.gateway_agent",
            ops_tokens=(f"alice:operator:{OPERATOR}",),
        )
    )
    await service.start()
    return service


async def test_a_sign_in_link_opened_in_a_tab_showing_the_page_signs_in(
    tmp_path: Path, page: Page, console_errors: list[str]
) -> None:
    """A hash change loads nothing: the link did not sign in, and its token stayed in the
    address bar and the history (an outside probe). The page reads it on the change too."""
    service = await _service(tmp_path)
    assert service.app is not None
    try:
        async with serve(service.app) as server:
            await page.goto(f"{server.url}/ops")
            await expect(page.locator("#signin")).to_be_visible()
            await page.goto(f"{server.url}/ops#token={OPERATOR}")  # the same document
            await expect(page.locator("#lanes-empty")).to_be_visible()
            await expect(page.locator("#signin")).to_be_hidden()
            assert "token" not in page.url
            assert console_errors == []
    finally:
        await service.stop(drain_seconds=0.1)


async def test_the_mcp_servers_section_shows_only_with_servers(
    tmp_path: Path, page: Page, console_errors: list[str]
) -> None:
    service = await _service(tmp_path)
    servers: list[McpServerHealth] = []
    service.mcp_health = lambda: tuple(servers)
    assert service.app is not None
    try:
        async with serve(service.app) as server:
            await page.goto(f"{server.url}/ops#token={OPERATOR}")
            await expect(page.locator("#lanes-empty")).to_be_visible()  # the page has loaded
            await expect(page.locator("#mcp")).to_be_hidden()
            await expect(page.get_by_role("heading", name="MCP servers")).to_have_count(0)

            servers.extend(SERVERS)
            await page.reload()
            await expect(page.get_by_role("heading", name="MCP servers")).to_be_visible()
            rows = page.locator("#mcp-servers tr")
            await expect(rows).to_have_count(3)
            await expect(rows.nth(0).locator("td")).to_have_text(
                [
                    "tickets",
                    "stdio",
                    "tickets-server",
                    "ready",
                    "no",
                    "2",
                    "0",
                    "12 / 1",
                    "tickets.create: no answer in 30 s",
                ]
            )
            await expect(rows.nth(0).locator("td").nth(5)).to_have_attribute(
                "title", "tickets.create\ntickets.list"
            )
            await expect(rows.nth(1).locator("td")).to_have_text(
                [
                    "deploys",
                    "http",
                    "https://deploys.example/mcp",
                    "restarting (next 00:01:30)",
                    "yes",
                    "0",
                    "3",
                    "4 / 4",
                    "connection refused",
                ]
            )
            await expect(rows.nth(1).locator(".status")).to_have_class("status restarting")
            # what a stdio server printed as it stopped, under its last error
            await expect(rows.nth(2).locator("td").nth(8)).to_have_text(
                "the connection closed (the server exited or closed its output)"
                "stderr: ModuleNotFoundError: No module named 'crm_mcp'"
            )
            await expect(rows.nth(2).locator(".stderr")).to_be_visible()
            await screenshot(page, "ops-mcp")
    finally:
        await service.stop(drain_seconds=1)
    assert console_errors == []
