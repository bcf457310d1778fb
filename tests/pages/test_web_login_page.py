"""Signing in to the web channel in headless Chromium (D380), against `gateway serve` with tokens.

A person opens a thread's page signed out, is sent to the sign-in, types their token, is sent
back, writes without a name box (the message is by the token's name), gets the reply live over
the event stream (the cookie carries it), and signs out.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Page, expect

from tests.support.browser import BROWSER_TESTS
from tests.support.gateway_process import GatewayProcess, serving

pytestmark = [pytest.mark.slow, BROWSER_TESTS, pytest.mark.timeout(40)]

SECRET = "carol-secret-0123456789abcdef"


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    with serving(
        tmp_path, web_tokens=f"carol:{SECRET}", plugin="tests.support.gateway_agent"
    ) as process:
        yield process


async def test_a_person_signs_in_writes_by_their_name_and_signs_out(
    gateway: GatewayProcess, page: Page, console_errors: list[str]
) -> None:
    await page.goto(f"{gateway.url}/web/threads/signed/page")
    await expect(page).to_have_url(re.compile(r"/web/login\?next="))
    await page.get_by_label("token").fill("not-the-token")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("alert")).to_contain_text("not known here")
    await page.get_by_label("token").fill(SECRET)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page).to_have_url(re.compile(r"/web/threads/signed/page$"))
    await expect(page.locator("#status")).to_have_text("live")
    await expect(page.locator("header")).to_contain_text("signed in as carol")
    await expect(page.get_by_label("your name")).to_be_hidden()

    composer = page.get_by_label("message")
    await composer.fill("hello, signed in")
    await page.get_by_role("button", name="Send").click()
    await expect(composer).to_have_value("")
    message = page.locator(".item.message")
    await expect(message.locator(".meta")).to_contain_text("carol")
    reply = page.locator(".item.reply")
    await expect(reply.locator(".text")).to_have_text("You said: hello, signed in")

    # the cookie is the browser's: a client without the token reads nothing
    async with httpx.AsyncClient() as client:
        thread = await client.get(f"{gateway.url}/web/threads/signed")
    assert thread.status_code == 401

    # a sign-in that ended (the cookie gone) while the page is open: said, not retried
    await page.context.clear_cookies()
    gateway.terminate()  # the open stream ends; the browser's reconnect is refused
    gateway.restart()
    await expect(page.locator("#status")).to_have_text(
        "signed out: reload the page to sign in again", timeout=15_000
    )

    await page.get_by_role("button", name="Sign out").click()
    await expect(page).to_have_url(re.compile(r"/web/login$"))
    await page.goto(f"{gateway.url}/web/threads/signed/page")
    await expect(page).to_have_url(re.compile(r"/web/login\?next="))
    # the errors: the refused sign-in's page came with its 401, the stream's and its probe's,
    # and the stream's while the gateway restarted
    assert [e for e in console_errors if "401" not in e and "CONNECTION_REFUSED" not in e] == []
