"""The web channel's pages in headless Chromium, used as a person would, against `gateway serve`.

A real gateway process (SQLite store, broker and web mailbox in the test's directory; the scripted
agent of `tests.support.gateway_agent`) serves ``/web/``. A person opens the thread list, opens a
thread, writes in the composer and sees the agent's reply arrive live (Server-Sent Events); a
message that makes the agent call ``deploy`` (a tool that requires approval) shows Approve and
Deny buttons, and a click on one resumes the run. The browser's console must stay free of errors.

With ``TEST_SCREENSHOTS=1`` the tests also write ``docs/screenshots/web-thread.png``,
``docs/screenshots/web-approval.png`` and ``docs/screenshots/web-supplied.png``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Page, Route, expect

from tests.support.browser import BROWSER_TESTS, screenshot
from tests.support.gateway_process import GatewayProcess

pytestmark = [pytest.mark.slow, BROWSER_TESTS, pytest.mark.timeout(40)]

AGENT = "tests.support.gateway_agent"


def _errors(console_errors: list[str]) -> list[str]:
    """The console errors (the app answers /favicon.ico with 204, so there is no 404 either)."""
    return list(console_errors)


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


async def _open_thread(page: Page, gateway: GatewayProcess, thread: str) -> None:
    """From the thread list, open `thread` with the list's form, as a person would."""
    await page.goto(f"{gateway.url}/web/")
    await expect(page.get_by_role("heading", name="Web threads")).to_be_visible()
    await page.get_by_label("thread id").fill(thread)
    await page.get_by_role("button", name="Open thread").click()
    await expect(page).to_have_url(re.compile(rf"/web/threads/{thread}/page\?space=default$"))
    await expect(page.get_by_role("heading", name=thread)).to_be_visible()
    await expect(page.locator("#status")).to_have_text("live")


async def _send(page: Page, text: str, *, author: str = "Ann") -> None:
    await page.get_by_label("your name").fill(author)
    composer = page.get_by_label("message")
    await composer.fill(text)
    await page.get_by_role("button", name="Send").click()
    await expect(composer).to_have_value("")  # accepted: the composer is cleared
    await expect(page.locator("#error")).to_have_text("")


async def test_a_message_typed_in_the_composer_gets_its_reply_live(
    gateway: GatewayProcess, page: Page, console_errors: list[str]
) -> None:
    await _open_thread(page, gateway, "browser-hello")
    await _send(page, "hello from Chromium")

    message = page.locator(".item.message")
    await expect(message).to_have_count(1)
    await expect(message.locator(".text")).to_have_text("hello from Chromium")
    await expect(message.locator(".meta")).to_contain_text("Ann")
    reply = page.locator(".item.reply")
    await expect(reply).to_have_count(1)
    await expect(reply.locator(".text")).to_have_text("You said: hello from Chromium")
    await expect(reply.locator(".meta")).to_contain_text("assistant")

    # Ctrl+Enter sends too; the second reply arrives on the same live stream.
    await page.get_by_label("message").fill("and a second one")
    await page.get_by_label("message").press("Control+Enter")
    await expect(reply).to_have_count(2)
    await expect(reply.nth(1).locator(".text")).to_have_text("You said: and a second one")
    await screenshot(page, "web-thread")

    # The thread list now shows the thread; a reload of its page replays it from the store.
    await page.get_by_role("link", name="threads").click()
    await expect(page.get_by_role("link", name="browser-hello")).to_be_visible()
    await page.get_by_role("link", name="browser-hello").click()
    await expect(page.locator(".item.reply")).to_have_count(2)
    await expect(page.locator(".item.message")).to_have_count(2)

    assert _errors(console_errors) == []


async def test_an_approval_request_is_approved_with_a_click(
    gateway: GatewayProcess, page: Page, console_errors: list[str]
) -> None:
    await _open_thread(page, gateway, "browser-ops")
    await _send(page, "/deploy prod")

    asked = page.locator(".item.approval_request")
    await expect(asked).to_have_count(1)
    await expect(asked.locator(".meta")).to_contain_text("approval needed")
    await expect(asked.locator(".call .label")).to_have_text("deploy")
    await expect(asked.locator(".call pre")).to_contain_text('"target": "prod"')
    approve = asked.get_by_role("button", name="Approve", exact=True)
    deny = asked.get_by_role("button", name="Deny", exact=True)
    await expect(approve).to_be_enabled()
    await expect(deny).to_be_enabled()
    await expect(page.locator(".item.reply")).to_have_count(0)  # the run waits for a person
    await screenshot(page, "web-approval")

    await approve.click()
    # the page's own guess at once, then what the gateway recorded (who, and when)
    await expect(asked.locator(".decided")).to_contain_text(
        re.compile(r"Decision sent by Ann: approved|closed: approved by Ann")
    )
    await expect(approve).to_be_disabled()
    await expect(deny).to_be_disabled()
    await expect(page.locator(".item.decision .text")).to_have_text("Ann: approve")
    reply = page.locator(".item.reply")
    await expect(reply).to_have_count(1)
    await expect(reply.locator(".text")).to_have_text("Done: deployed prod")
    await expect(asked.locator(".decided")).to_contain_text(
        "The approval request for deploy is closed: approved by Ann at "
    )

    assert _errors(console_errors) == []


async def test_an_approval_card_shows_format_characters_instead_of_obeying_them(
    gateway: GatewayProcess, page: Page, console_errors: list[str]
) -> None:
    """A right-to-left override in an argument made the card read other values than the ones
    that would run (`"target": "prod\u202e..."` read backwards)."""
    await _open_thread(page, gateway, "browser-bidi")
    await _send(page, "/deploy prod\u202e\u200bgnigats")
    card = page.locator(".item.approval_request .call pre")
    await expect(card).to_contain_text('"target": "prod\\u202e\\u200bgnigats"')
    assert "\u202e" not in await card.inner_text()
    assert _errors(console_errors) == []


async def test_a_denied_call_does_not_run(
    gateway: GatewayProcess, page: Page, console_errors: list[str]
) -> None:
    await _open_thread(page, gateway, "browser-deny")
    await _send(page, "/deploy prod")

    asked = page.locator(".item.approval_request")
    await expect(asked).to_have_count(1)
    await asked.get_by_placeholder("reason (optional)").fill("not on a Friday")
    await asked.get_by_role("button", name="Deny", exact=True).click()
    await expect(asked.locator(".decided")).to_contain_text(
        re.compile(r"Decision sent by Ann: denied|closed: denied by Ann")
    )
    answer = page.locator(".item.reply, .item.failure_notice")
    await expect(answer).to_have_count(1)
    await expect(answer).to_contain_text("not on a Friday")  # the reason reached the agent
    await expect(answer).not_to_contain_text("deployed")

    assert _errors(console_errors) == []


async def test_done_it_myself_gives_the_result_and_the_tool_never_runs(
    gateway: GatewayProcess, page: Page, console_errors: list[str]
) -> None:
    """D263: the person did the action by hand; the agent reads what they wrote instead."""
    await _open_thread(page, gateway, "browser-by-hand")
    await _send(page, "/deploy prod")
    asked = page.locator(".item.approval_request")
    await expect(asked).to_have_count(1)
    result = asked.get_by_label("result")
    await expect(result).to_be_hidden()  # the form opens on demand
    await asked.get_by_role("button", name="Done it myself").click()
    await expect(result).to_be_visible()
    send = asked.get_by_role("button", name="Submit result")
    await send.click()  # nothing written yet: said, nothing sent
    await expect(asked.locator(".error")).to_have_text("write what happened first")
    await expect(page.locator(".item.decision")).to_have_count(0)

    await result.fill("restarted the api by hand\nit is healthy again")
    await send.click()
    await expect(page.locator(".item.decision .text")).to_have_text(
        "Ann supplied the result: restarted the api by hand\u2026"
    )
    reply = page.locator(".item.reply")
    await expect(reply.locator(".text")).to_contain_text("Done: restarted the api by hand")
    await expect(reply.locator(".text")).to_contain_text("it is healthy again")
    await expect(asked.locator(".decided")).to_contain_text(
        "The approval request for deploy is closed: Ann supplied the result at "
    )
    await expect(asked.locator(".decided")).to_contain_text("UTC: restarted the api by hand\u2026")
    await expect(send).to_be_disabled()
    await expect(result).to_be_disabled()
    await expect(reply).not_to_contain_text("deployed")  # the deploy tool never ran
    await screenshot(page, "web-supplied")

    assert _errors(console_errors) == []


async def test_a_stopped_request_closes_its_buttons(
    gateway: GatewayProcess, page: Page, console_errors: list[str]
) -> None:
    await _open_thread(page, gateway, "browser-stop")
    await _send(page, "/deploy prod")
    asked = page.locator(".item.approval_request")
    await expect(asked).to_have_count(1)
    await _send(page, "stop")
    await expect(page.locator(".item.reply .text")).to_have_text("Stopped.")
    await expect(asked.locator(".decided")).to_contain_text("closed: stopped by Ann at ")
    await expect(asked.get_by_role("button", name="Approve", exact=True)).to_be_disabled()
    await page.reload()  # the same from the thread's history
    await expect(page.locator(".item.approval_request .decided")).to_contain_text(
        "closed: stopped by Ann at "
    )

    assert _errors(console_errors) == []


@pytest.fixture
def reminding_gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    settings = {
        "store_url": f"sqlite:///{tmp_path}/store.db",
        "broker_url": f"sqlite:///{tmp_path}/broker.db",
        "web_url": f"sqlite:///{tmp_path}/web.db",
        "plugin": AGENT,
        "approval_remind_seconds": "1",
    }
    process = GatewayProcess("gw", tmp_path, settings).start()
    try:
        yield process
    finally:
        process.stop()


async def test_a_reminder_is_a_second_card_and_one_click_decides_both(
    reminding_gateway: GatewayProcess, page: Page, console_errors: list[str]
) -> None:
    await _open_thread(page, reminding_gateway, "browser-remind")
    await _send(page, "/deploy prod")
    asked = page.locator(".item.approval_request")
    await expect(asked.nth(1)).to_contain_text("Still waiting since")  # the reminder
    await asked.nth(1).get_by_role("button", name="Approve", exact=True).click()
    await expect(page.locator(".item.reply .text")).to_have_text("Done: deployed prod")
    for card in (asked.nth(0), asked.nth(1)):  # every copy of the request is closed
        await expect(card.locator(".decided")).to_contain_text("closed: approved by Ann at ")
        await expect(card.get_by_role("button", name="Deny", exact=True)).to_be_disabled()

    assert _errors(console_errors) == []


# A paste into the composer, and whether the thread takes it: counted as the server counts
# (characters, not UTF-16 units), and never cut without a word (D166).
PASTES = [
    ("x" * 33_000, False),
    ("é" * 32_001, False),
    ("😀" * 16_001, True),  # 32,002 UTF-16 units, 16,001 characters
    ("x" * 32_000, True),
]


async def test_a_paste_over_the_limit_is_said_and_kept_not_cut(
    gateway: GatewayProcess, page: Page, console_errors: list[str]
) -> None:
    await _open_thread(page, gateway, "browser-paste")
    composer = page.get_by_label("message")
    sent = 0
    for text, taken in PASTES:
        await composer.fill("")
        await composer.focus()
        await page.keyboard.insert_text(text)  # what a paste does: maxlength would cut it
        assert await composer.evaluate("box => [...box.value].length") == len(text)
        if not taken:
            said = f"This message has {len(text):,} characters; at most 32,000 are accepted."
            await expect(page.locator("#error")).to_contain_text(said)
            await page.get_by_role("button", name="Send").click()
            await expect(page.locator("#error")).to_contain_text("nothing was sent")
            assert await composer.evaluate("box => [...box.value].length") == len(text)
            continue
        await expect(page.locator("#error")).to_have_text("")
        await page.get_by_role("button", name="Send").click()
        await expect(composer).to_have_value("")
        sent += 1
        await expect(page.locator(".item.reply")).to_have_count(sent)
    messages = page.locator(".item.message .text")
    await expect(messages).to_have_count(sent)
    assert await messages.all_text_contents() == [text for text, taken in PASTES if taken]
    assert _errors(console_errors) == []


# What a person types into the thread list's form, and whether the page opens that thread.
OPENED = [("café", True), ("हिन्दी", True), ("日本", True), ("a b", False), ("😀", False)]


async def test_a_thread_named_in_any_script_opens_from_the_list(
    gateway: GatewayProcess, page: Page, console_errors: list[str]
) -> None:
    await page.goto(f"{gateway.url}/web/")
    box = page.get_by_label("thread id")
    for name, valid in OPENED:
        await box.fill(name)
        assert await box.evaluate("input => input.checkValidity()") is valid, name
    await box.fill("café")
    await page.get_by_role("button", name="Open thread").click()
    await expect(page).to_have_url(re.compile(r"/web/threads/caf%C3%A9/page\?space=default$"))
    await expect(page.get_by_role("heading", name="café")).to_be_visible()
    await expect(page.locator("#status")).to_have_text("live")
    await _send(page, "bonjour")
    await expect(page.locator(".item.reply .text")).to_have_text("You said: bonjour")
    await page.get_by_role("link", name="threads").click()
    await page.get_by_role("link", name="café").click()  # the list links to it, too
    await expect(page.locator(".item.reply")).to_have_count(1)
    assert _errors(console_errors) == []


OPERATOR = "operator-secret-abcdefghijklmnop"


@pytest.fixture
def operated_gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    settings = {
        "store_url": f"sqlite:///{tmp_path}/store.db",
        "broker_url": f"sqlite:///{tmp_path}/broker.db",
        "web_url": f"sqlite:///{tmp_path}/web.db",
        "plugin": AGENT,
        "ops_tokens": f"alice:operator:{OPERATOR}",
    }
    process = GatewayProcess("gw", tmp_path, settings).start()
    try:
        yield process
    finally:
        process.stop()


async def test_a_card_decided_from_the_api_says_what_and_by_whom(
    operated_gateway: GatewayProcess, page: Page, console_errors: list[str]
) -> None:
    await _open_thread(page, operated_gateway, "browser-api")
    await _send(page, "/deploy prod")
    asked = page.locator(".item.approval_request")
    await expect(asked).to_have_count(1)
    headers = {"Authorization": f"Bearer {OPERATOR}", "Idempotency-Key": "page-api-1"}
    async with httpx.AsyncClient(base_url=f"{operated_gateway.url}/api/v1") as api:
        lanes = (await api.get("/lanes", headers=headers)).json()["items"]
        [lane] = [v for v in lanes if v["lane"] == "web:browser-api"]
        [call] = lane["pending_approvals"]
        body = {
            "wait_id": lane["wait_id"],
            "approvals": {call["tool_call_id"]: {"action": "approve"}},
        }
        decided = await api.post(f"/lanes/{lane['id']}/decisions", json=body, headers=headers)
        assert decided.status_code == 200, decided.text
    await expect(page.locator(".item.reply .text")).to_have_text("Done: deployed prod")
    await expect(asked.locator(".decided")).to_contain_text(
        "The approval request for deploy is closed: approved by operator:alice at "
    )
    await expect(asked.get_by_role("button", name="Approve", exact=True)).to_be_disabled()
    await page.reload()  # the same from the thread's history
    await expect(page.locator(".item.approval_request .decided")).to_contain_text(
        "approved by operator:alice"
    )
    await expect(page.locator(".item.approval_closed")).to_have_count(0)  # its card says it

    assert _errors(console_errors) == []


async def test_a_file_attached_in_the_composer_reaches_the_agent(
    gateway: GatewayProcess, page: Page, console_errors: list[str], tmp_path: Path
) -> None:
    await _open_thread(page, gateway, "browser-file")
    report = tmp_path / "report.csv"
    report.write_text("region,sales\nnorth,12\nsouth,30\n")
    await page.get_by_label("attach files").set_input_files(str(report))
    await _send(page, "what is in this report?")
    await expect(page.get_by_label("attach files")).to_have_value("")  # cleared once sent
    # the message shows what it brought, by name, type and size (the thread keeps none of it)
    sent = page.locator(".item.message .files .file")
    await expect(sent).to_have_text(["report.csv (text/csv, 31 bytes)"])

    reply = page.locator(".item.reply")
    await expect(reply).to_have_count(1)
    # the agent read the file's rows (the stand-in echoes everything it was given)
    await expect(reply.locator(".text")).to_contain_text("south,30")
    await expect(reply.locator(".text")).to_contain_text("report.csv")
    # too large to send at all: said in the person's terms before a byte is read (the 413
    # came after 40 MB were encoded, in the request body's bytes)
    huge = tmp_path / "huge.bin"
    with huge.open("wb") as sparse:
        sparse.truncate(30_000_000)
    await page.get_by_label("attach files").set_input_files(str(huge))
    await page.get_by_label("message").fill("and this one?")
    await page.get_by_role("button", name="Send").click()
    await expect(page.locator("#error")).to_have_text(
        "These files are 30 MB together; at most about 28.3 MB can be sent at once: "
        "nothing was sent."
    )
    await expect(page.locator(".item.message")).to_have_count(1)
    assert _errors(console_errors) == []


async def test_a_stream_refused_once_is_opened_again_and_shows_what_came(
    gateway: GatewayProcess, page: Page, console_errors: list[str]
) -> None:
    """A 503 on the thread's stream (the gateway busy or restarting, a proxy's 502) closed it
    for good: "reconnecting..." forever, and nothing sent after it, the person's own message
    included, was shown until a reload."""
    refused: list[str] = []

    async def refuse_once(route: Route) -> None:
        if not refused:
            refused.append(route.request.url)
            await route.fulfill(status=503, body="too many event streams are open")
            return
        await route.continue_()

    await page.route(re.compile(r"/events\?"), refuse_once)
    await page.goto(f"{gateway.url}/web/threads/refused/page?space=default")
    await expect(page.locator("#status")).to_have_text("live", timeout=10_000)
    assert refused  # the first stream was refused; the one that is live was opened again
    await _send(page, "after the refusal")
    await expect(page.locator(".item.reply .text")).to_have_text("You said: after the refusal")
    assert [e for e in _errors(console_errors) if "503" not in e] == []
