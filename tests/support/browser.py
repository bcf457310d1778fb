"""Headless Chromium for tests that use the web pages as a person would (Playwright, async API).

The browser is Debian's ``chromium`` (``/usr/bin/chromium``, or ``chromium`` on the PATH), never
a Playwright-downloaded build: `.ci/run` installs it, so a missing one is an error, not a skip.
Fixtures (registered for every test by ``tests/conftest.py``):

* ``browser``: one headless Chromium for the whole run (session-scoped);
* ``page``: a fresh context and page per test, closed after it;
* ``console_errors``: what that page's console said at level ``error``, and every uncaught page
  error, for the test to assert empty.

Playwright objects belong to the event loop they were made in, so the fixtures run in the
session's loop, and so must every test that uses them: mark it
``@pytest.mark.asyncio(loop_scope="session")`` (or put `BROWSER_TESTS` in ``pytestmark``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from playwright.async_api import (
    Browser,
    ConsoleMessage,
    Error,
    Page,
    async_playwright,
)

__all__ = [
    "BROWSER_TESTS",
    "CHROMIUM_ARGS",
    "SCREENSHOTS",
    "SCREENSHOTS_VARIABLE",
    "chromium_path",
    "screenshot",
]

ROOT = Path(__file__).resolve().parents[2]

#: The asyncio mark of a test that uses these fixtures (they live in the session's loop).
BROWSER_TESTS = pytest.mark.asyncio(loop_scope="session")

#: Where `screenshot` writes, when ``TEST_SCREENSHOTS=1``.
SCREENSHOTS = ROOT / "docs" / "screenshots"

#: Not ``GATEWAY_*``: `gateway serve` refuses a ``GATEWAY_*`` variable that names no setting, and
#: the gateway processes of the tests inherit the test run's environment.
SCREENSHOTS_VARIABLE = "TEST_SCREENSHOTS"

#: This machine has no network but localhost: Chromium must not try to reach Google's hosts.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str:
    """Debian's Chromium, or a clear error saying how to install it."""
    for candidate in ("/usr/bin/chromium", shutil.which("chromium")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise RuntimeError(
        "browser tests need Debian's Chromium at /usr/bin/chromium (or `chromium` on the PATH): "
        "apt-get install -y chromium  (.ci/run installs it; `playwright install` is not used)"
    )


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser() -> AsyncIterator[Browser]:
    """One headless Chromium for the whole run."""
    executable = chromium_path()
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=executable, headless=True, args=CHROMIUM_ARGS, timeout=30_000
        )
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
def console_errors() -> list[str]:
    """Console errors and uncaught exceptions of the test's `page` (filled as they happen)."""
    return []


@pytest_asyncio.fixture(loop_scope="session")
async def page(browser: Browser, console_errors: list[str]) -> AsyncIterator[Page]:
    """A new page in a new browser context (no shared storage), 900x700, 10 s timeouts."""
    context = await browser.new_context(viewport={"width": 900, "height": 700})
    context.set_default_timeout(10_000)
    opened = await context.new_page()

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            console_errors.append(f"console: {message.text} ({message.location})")

    def on_page_error(error: Error) -> None:
        console_errors.append(f"uncaught: {error.name}: {error.message}")

    opened.on("console", on_console)
    opened.on("pageerror", on_page_error)
    try:
        yield opened
    finally:
        await context.close()


async def screenshot(page: Page, name: str) -> Path | None:
    """Save ``docs/screenshots/<name>.png`` when ``TEST_SCREENSHOTS=1``; else do nothing."""
    if os.environ.get(SCREENSHOTS_VARIABLE) != "1":
        return None
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    return path
