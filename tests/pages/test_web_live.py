"""A web thread while the agent works, in headless Chromium against `gateway serve`.

The scripted agent (`tests.support.gateway_agent`) streams its answer in small chunks over
a few seconds (``/stream``), after a tool call for ``/slowstream``. The page shows what the agent
does (the progress line) and the answer as it is written (a dashed "writing..." card), and the
durable reply replaces that card. A gateway killed mid-stream (SIGKILL) and started again
leaves the page with exactly one complete answer: the half-written one is gone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.async_api import Page, expect

from tests.support.browser import BROWSER_TESTS
from tests.support.gateway_agent import STREAMED_ANSWER
from tests.support.gateway_process import GatewayProcess

pytestmark = [pytest.mark.slow, BROWSER_TESTS, pytest.mark.timeout(90)]

AGENT = "tests.support.gateway_agent"
FIRST_WORDS = STREAMED_ANSWER[:12]


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    settings = {
        "store_url": f"sqlite:///{tmp_path}/store.db",
        "broker_url": f"sqlite:///{tmp_path}/broker.db",
        "web_url": f"sqlite:///{tmp_path}/web.db",
        "plugin": AGENT,
        "lease_seconds": "6",
        "renew_seconds": "1",
    }
    process = GatewayProcess("gw", tmp_path, settings).start()
    try:
        yield process
    finally:
        process.stop()


async def _open(page: Page, gateway: GatewayProcess, thread: str) -> None:
    await page.goto(f"{gateway.url}/web/threads/{thread}/page?space=default")
    await expect(page.locator("#status")).to_have_text("live")


async def _send(page: Page, text: str) -> None:
    composer = page.get_by_label("message")
    await composer.fill(text)
    await page.get_by_role("button", name="Send").click()
    await expect(composer).to_have_value("")


async def test_progress_and_streamed_text_show_before_the_answer_which_replaces_them(
    gateway: GatewayProcess, page: Page, console_errors: list[str]
) -> None:
    await _open(page, gateway, "live-hello")
    await _send(page, "/slowstream")

    working = page.locator("#working")
    await expect(working).to_have_text("the agent is running slow…")
    writing = page.locator("#live")
    # the card exists only until the reply arrives: seeing it is seeing it first
    await expect(writing.locator(".text")).to_contain_text(FIRST_WORDS)
    await expect(writing.locator(".meta")).to_contain_text("writing")
    partial = await writing.locator(".text").text_content()
    assert partial is not None and STREAMED_ANSWER.startswith(partial)
    assert await page.locator(".item.reply:not(.live)").count() == 0

    reply = page.locator(".item.reply:not(.live)")
    await expect(reply).to_have_count(1)
    await expect(reply.locator(".text")).to_have_text(STREAMED_ANSWER)
    await expect(writing).to_have_count(0)
    await expect(working).to_have_text("")

    await page.reload()  # the thread reads back with one answer, nothing live
    await expect(page.locator(".item.reply")).to_have_count(1)
    await expect(page.locator("#live")).to_have_count(0)
    assert console_errors == []


async def test_a_gateway_killed_mid_stream_leaves_one_complete_answer(
    gateway: GatewayProcess, page: Page, console_errors: list[str]
) -> None:
    await _open(page, gateway, "live-kill")
    await _send(page, "/stream")
    writing = page.locator("#live .text")
    await expect(writing).to_contain_text(FIRST_WORDS)
    partial = await writing.text_content()
    assert partial is not None and partial != STREAMED_ANSWER  # cut mid-stream

    gateway.kill()
    gateway.restart()

    reply = page.locator(".item.reply")  # the live card is one too, until it goes
    await expect(page.locator(".item.reply:not(.live)")).to_have_count(1)
    await expect(reply).to_have_count(1)
    await expect(reply.locator(".text")).to_have_text(STREAMED_ANSWER)
    await expect(page.locator("#live")).to_have_count(0)

    await page.reload()
    await expect(page.locator(".item.reply")).to_have_count(1)
    await expect(page.locator(".item.reply .text")).to_have_text(STREAMED_ANSWER)
    # the browser logged the dropped stream while the gateway was down, and nothing else
    assert all("events" in error or "ERR_" in error for error in console_errors), console_errors
