"""The /ops page in headless Chromium: sign in from the printed link, find a stuck lane, resume it.

A real `gateway serve` with no tokens configured makes its operator token at first start; the
test opens the sign-in link (`/ops#token=...`) as a person would from the banner. A message
makes the agent charge a card (``replay="never"``) and then run a tool that kills the process,
until the lane is parked stuck. On the page the operator filters stuck lanes, opens the lane,
reads what a resume with ``tool_recovery=never`` does, confirms, and sees the run complete; the
timeline shows the interrupted call, and the card was charged once.

With ``TEST_SCREENSHOTS=1`` it writes ``docs/screenshots/ops-stuck.png`` and
``docs/screenshots/ops-resumed.png``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Dialog, Page, expect

from adapters.web import open_mailbox
from gateway.broker import open_broker
from harness_core.storage import open_repo
from harness_core.testing.builders import user_entry
from tests.support.browser import BROWSER_TESTS, screenshot
from tests.support.gateway_process import GatewayProcess

pytestmark = [pytest.mark.slow, BROWSER_TESTS, pytest.mark.timeout(120)]


async def _answers(web_url: str, thread: str) -> int:
    mailbox = open_mailbox(web_url)
    try:
        items = await mailbox.read("default", thread, after=0, limit=100)
    finally:
        await mailbox.close()
    return sum(1 for item in items if item.kind not in ("message", "decision", "approval_closed"))


async def test_an_operator_resumes_a_stuck_lane_from_the_page(
    tmp_path: Path, page: Page, console_errors: list[str]
) -> None:
    effects = tmp_path / "effects.jsonl"
    settings = {
        "store_url": f"sqlite:///{tmp_path}/store.db",
        "broker_url": f"sqlite:///{tmp_path}/broker.db",
        "web_url": f"sqlite:///{tmp_path}/web.db",
        "plugin": "tests.support.gateway_agent",
        "lease_seconds": "3",
        "renew_seconds": "0.5",
        "max_attempts": "2",
        "token_budget": "5000000",
    }
    gateway = GatewayProcess(
        "gw", tmp_path, settings, extra_env={"AGENT_TEST_EFFECTS": str(effects)}
    ).start()
    try:
        token = (tmp_path / "ops-token").read_text().strip()
        # its stderr is no terminal (a log): the banner says where the token is, not what
        assert f"{gateway.url}/ops (sign in with the operator token kept in " in gateway.tail()
        assert token not in gateway.tail()
        async with httpx.AsyncClient(timeout=10) as http:
            with contextlib.suppress(httpx.HTTPError):  # the tool may kill it before the 202
                await http.post(
                    f"{gateway.url}/web/threads/card/messages",
                    json={"text": "/charge-then-poison"},
                )
        deadline = time.monotonic() + 90
        while not await _answers(settings["web_url"], "card"):  # the stuck notice
            assert time.monotonic() < deadline, gateway.tail()
            if not gateway.alive:
                gateway.restart(wait_ready_s=0)
            await asyncio.sleep(0.1)
        if not gateway.alive:
            gateway.restart()
        gateway.wait_ready()

        await page.goto(f"{gateway.url}/ops#token={token}")  # the link a terminal shows
        await expect(page.get_by_role("heading", name="Gateway operations")).to_be_visible()
        assert "token" not in page.url  # the link's token left the address bar
        await page.get_by_role("button", name="stuck", exact=True).click()
        row = page.locator("#lanes tr", has_text="web:card")
        await expect(row).to_have_count(1)
        await expect(row.locator(".status")).to_have_text("stuck")
        await row.click()
        await expect(page.locator("#lane-title")).to_have_text("web-default / web:card")
        facts = page.locator("#lane-facts .row")
        await expect(facts.filter(has_text="attempts")).to_contain_text("2 of 2")
        await expect(facts.filter(has_text="token budget")).to_contain_text("5000000")
        await page.locator("#lane-actions select").select_option("never")
        consequence = page.locator("#lane-actions .summary")
        await expect(consequence).to_contain_text("poison")
        await expect(consequence).to_contain_text("reported to the model as interrupted")
        await screenshot(page, "ops-stuck")

        asked: list[str] = []

        async def accept(dialog: Dialog) -> None:
            asked.append(dialog.message)
            await dialog.accept()

        page.on("dialog", accept)
        await page.get_by_role("button", name="Resume (fresh attempt budget)").click()
        await expect(page.locator("#lane-note")).to_contain_text("done (completed)", timeout=20_000)
        assert asked and "interrupted" in asked[0]  # the consequence was shown before acting
        await page.get_by_role("button", name="all", exact=True).click()
        await expect(row.locator(".status")).to_have_text("idle")
        timeline = page.locator("#timeline")
        await expect(timeline).to_contain_text("interrupted")
        await expect(page.locator("#audit")).to_contain_text("operator:local")
        await screenshot(page, "ops-resumed")

        await page.get_by_role("button", name="Sign out").click()
        await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
        deadline = time.monotonic() + 20
        while await _answers(settings["web_url"], "card") < 2:  # the reply was delivered
            assert time.monotonic() < deadline, gateway.tail()
            await asyncio.sleep(0.1)
    finally:
        gateway.stop()
    charges = [json.loads(line) for line in effects.read_text().splitlines()]
    assert len(charges) == 1, charges  # the replay="never" tool ran once in total
    assert console_errors == []


async def test_without_a_token_the_page_asks_to_sign_in_and_refuses_a_wrong_one(
    tmp_path: Path, page: Page, console_errors: list[str]
) -> None:
    settings = {
        "store_url": f"sqlite:///{tmp_path}/store.db",
        "broker_url": f"sqlite:///{tmp_path}/broker.db",
        "web_url": f"sqlite:///{tmp_path}/web.db",
    }
    gateway = GatewayProcess("gw", tmp_path, settings).start()
    try:
        await page.goto(f"{gateway.url}/ops")
        await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
        await page.get_by_label("token").fill("not-the-token-at-all-0123456789")
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.locator("#signin-error")).to_contain_text("sign in again")
        token = (tmp_path / "ops-token").read_text().strip()
        await page.get_by_label("token").fill(token)
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.locator("#lanes-empty")).to_be_visible()
        await expect(page.locator("#backlog")).to_contain_text("0 dead letters")
    finally:
        gateway.stop()
    # the refused token's 401 is the only console error a browser reports for it
    assert [e for e in console_errors if "401" not in e] == []


def _settings(tmp_path: Path) -> dict[str, str]:
    """One gateway on three SQLite files with the test agent (its token made at first start)."""
    return {
        "store_url": f"sqlite:///{tmp_path}/store.db",
        "broker_url": f"sqlite:///{tmp_path}/broker.db",
        "web_url": f"sqlite:///{tmp_path}/web.db",
        "plugin": "tests.support.gateway_agent",
    }


async def test_an_operator_supplies_a_result_from_the_page(
    tmp_path: Path, page: Page, console_errors: list[str]
) -> None:
    """D263: the operator deployed by hand; the page answers the pending call with the result."""
    settings = _settings(tmp_path)
    gateway = GatewayProcess("gw", tmp_path, settings).start()
    try:
        token = (tmp_path / "ops-token").read_text().strip()
        async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
            # a right-to-left override in the argument: the panel shows it, not obeys it
            ask = {"text": "/deploy x\u202ey"}
            posted = await http.post("/web/threads/by-hand/messages", json=ask)
            assert posted.status_code == 202, posted.text
            headers = {"Authorization": f"Bearer {token}"}
            deadline = time.monotonic() + 30
            while True:
                lanes = (await http.get("/api/v1/lanes", headers=headers)).json()["items"]
                if any(v["lane"] == "web:by-hand" and v["status"] == "suspended" for v in lanes):
                    break
                assert time.monotonic() < deadline, lanes
                await asyncio.sleep(0.1)

        asked: list[str] = []

        async def confirm(dialog: Dialog) -> None:  # first declined, then accepted
            asked.append(dialog.message)
            await (dialog.accept() if len(asked) > 1 else dialog.dismiss())

        page.on("dialog", confirm)
        await page.goto(f"{gateway.url}/ops#token={token}")
        row = page.locator("#lanes tr", has_text="web:by-hand")
        await expect(row.locator(".status")).to_have_text("suspended")
        await row.click()
        actions = page.locator("#lane-actions")
        await expect(actions).to_contain_text('{"target":"x\\u202ey"}')
        await actions.get_by_role("button", name="Done it myself").click()
        await expect(page.locator("#lane-note")).to_contain_text(
            "Done it myself refused: write what the action did first"
        )
        await actions.get_by_label("result").fill("deployed x by hand")
        # the page refreshes itself (every 3 s, or a filter click): what is typed stays
        async with page.expect_response(lambda r: "/timeline" in r.url):
            await page.locator(".filters button", has_text="all").click()
        await expect(actions.get_by_label("result")).to_have_value("deployed x by hand")
        # it acted at one click: a mis-click beside "Approve all" is not undone
        await actions.get_by_role("button", name="Done it myself").click()
        await expect(page.locator("#lane-note")).not_to_contain_text("done (completed)")
        assert asked[0].startswith("Answer every pending call of web:by-hand with this result?")
        await expect(row.locator(".status")).to_have_text("suspended")  # declined: nothing sent
        await actions.get_by_role("button", name="Done it myself").click()
        await expect(page.locator("#lane-note")).to_contain_text("done (completed)", timeout=20_000)
        timeline = page.locator("#timeline")
        await expect(timeline).to_contain_text("result supplied: deployed x by hand")
        await expect(timeline).to_contain_text("[supplied by operator:local]: deployed x by hand")
        await expect(timeline).not_to_contain_text("tool_started")
        deadline = time.monotonic() + 20
        while await _answers(settings["web_url"], "by-hand") < 2:  # the request, the reply
            assert time.monotonic() < deadline, gateway.tail()
            await asyncio.sleep(0.1)
    finally:
        gateway.stop()
    assert console_errors == []


async def test_an_operator_revokes_a_lane_from_the_page_and_gives_it_back(
    tmp_path: Path, page: Page, console_errors: list[str]
) -> None:
    """D267: Revoke asks why, the lane says it is revoked and by whom; Unrevoke gives it back."""
    settings = _settings(tmp_path)
    gateway = GatewayProcess("gw", tmp_path, settings).start()
    try:
        token = (tmp_path / "ops-token").read_text().strip()
        async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
            posted = await http.post("/web/threads/gone/messages", json={"text": "hello"})
            assert posted.status_code == 202, posted.text
            deadline = time.monotonic() + 20
            while await _answers(settings["web_url"], "gone") < 1:
                assert time.monotonic() < deadline, gateway.tail()
                await asyncio.sleep(0.1)

        answers: list[str] = []

        async def answer(dialog: Dialog) -> None:
            answers.append(dialog.type)
            await dialog.accept("the customer left" if dialog.type == "prompt" else "")

        page.on("dialog", answer)
        await page.goto(f"{gateway.url}/ops#token={token}")
        row = page.locator("#lanes tr", has_text="web:gone")
        await expect(row.locator(".status")).to_have_text("idle")
        await row.click()
        actions = page.locator("#lane-actions")
        await actions.get_by_role("button", name="Revoke", exact=True).click()
        facts = page.locator("#lane-facts")
        await expect(facts).to_contain_text("the customer left", timeout=15_000)
        await expect(facts).to_contain_text("by operator:local")
        await expect(actions.get_by_role("button", name="Revoke", exact=True)).to_have_count(0)
        await actions.get_by_role("button", name="Unrevoke").click()
        await expect(facts).not_to_contain_text("the customer left", timeout=15_000)
        await expect(actions.get_by_role("button", name="Revoke", exact=True)).to_be_visible()
        # the lanes table says why as `ops lanes` does: nothing revoked any more
        await expect(row.locator(".why")).to_have_text("last: completed", timeout=15_000)
        assert answers == ["prompt", "confirm"]
    finally:
        gateway.stop()
    assert console_errors == []


async def test_a_viewer_is_offered_no_action_and_an_operator_after_it_is(
    tmp_path: Path, page: Page, console_errors: list[str]
) -> None:
    """A viewer's page showed every action button, each refused with 403 only once clicked."""
    viewer, operator = "viewer-secret-abcdefghijklmnopqr", "operator-secret-abcdefghijklmnop"
    settings = {
        **_settings(tmp_path),
        "ops_tokens": f"bob:viewer:{viewer},alice:operator:{operator}",
    }
    gateway = GatewayProcess("gw", tmp_path, settings).start()
    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
            posted = await http.post("/web/threads/seen/messages", json={"text": "hello"})
            assert posted.status_code == 202, posted.text
        await page.goto(f"{gateway.url}/ops#token={viewer}")
        await expect(page.locator("#who")).to_have_text("signed in as bob (viewer: reads only)")
        row = page.locator("#lanes tr", has_text="web:seen")
        await expect(row.locator(".status")).to_have_text("idle", timeout=20_000)
        await row.click()
        revoke = page.locator("#lane-actions").get_by_role("button", name="Revoke", exact=True)
        await expect(revoke).to_be_disabled()
        assert "operator token" in (await revoke.get_attribute("title") or "")

        await page.get_by_role("button", name="Sign out").click()
        await page.get_by_label("token").fill(operator)
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.locator("#who")).to_have_text("signed in as alice (operator)")
        await row.click()
        await expect(revoke).to_be_enabled()
    finally:
        gateway.stop()
    assert console_errors == []


async def test_an_operator_sets_a_spent_thread_s_budget_from_the_page(
    tmp_path: Path, page: Page, console_errors: list[str]
) -> None:
    """D295: a thread that spent its budget gets one of its own from the page, then a retry."""
    settings = {**_settings(tmp_path), "token_budget": "1"}
    gateway = GatewayProcess("gw", tmp_path, settings).start()
    try:
        token = (tmp_path / "ops-token").read_text().strip()
        async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
            for count, text in ((1, "hello"), (2, "and again")):
                posted = await http.post("/web/threads/spent/messages", json={"text": text})
                assert posted.status_code == 202, posted.text
                deadline = time.monotonic() + 20
                while await _answers(settings["web_url"], "spent") < count:
                    assert time.monotonic() < deadline, gateway.tail()
                    await asyncio.sleep(0.1)

        typed = iter(["lots", "1,000,000"])

        async def answer(dialog: Dialog) -> None:
            await dialog.accept(next(typed) if dialog.type == "prompt" else "")

        page.on("dialog", answer)
        await page.goto(f"{gateway.url}/ops#token={token}")
        row = page.locator("#lanes tr", has_text="web:spent")
        await expect(row.locator(".status")).to_have_text("failed")
        await row.click()
        facts = page.locator("#lane-facts .row")
        await expect(facts.filter(has_text="token budget")).to_contain_text("1")
        actions = page.locator("#lane-actions")
        button = actions.get_by_role("button", name="Set token budget")
        await button.click()  # "lots": refused on the page, nothing sent
        await expect(page.locator("#lane-note")).to_contain_text("not a number of tokens: lots")
        await button.click()
        await expect(facts.filter(has_text="token budget")).to_contain_text(
            "1000000", timeout=15_000
        )
        await actions.get_by_role("button", name="Retry").click()
        await expect(page.locator("#lane-note")).to_contain_text("completed", timeout=20_000)
        deadline = time.monotonic() + 20
        while await _answers(settings["web_url"], "spent") < 3:  # the retry's answer
            assert time.monotonic() < deadline, gateway.tail()
            await asyncio.sleep(0.1)
    finally:
        gateway.stop()
    assert console_errors == []


async def test_a_long_lane_shows_its_newest_items_and_retrying_replies_are_listed(
    tmp_path: Path, page: Page, console_errors: list[str]
) -> None:
    """A thread that ran for days showed its first 500 items on /ops and nothing said more
    existed; a reply retrying for hours showed only as "oldest 0 s" (an outside probe)."""
    settings = {
        "store_url": f"sqlite:///{tmp_path}/store.db",
        "broker_url": f"sqlite:///{tmp_path}/broker.db",
        "web_url": f"sqlite:///{tmp_path}/web.db",
        "plugin": "tests.support.gateway_agent",
    }
    repo = open_repo(settings["store_url"])
    await repo.create("web-default")
    lease = await repo.acquire_lease("web-default", owner="seed", ttl_ms=60_000)
    storage = await repo.open("web-default", lease=lease)
    await storage.create_lane("web:long", None)
    for n in range(700):
        await storage.append_entry(user_entry(f"u{n}", f"message {n}"), "web:long")
    await storage.close()
    await repo.release_lease(lease)
    await repo.close()
    broker = open_broker(settings["broker_url"])
    now = int(time.time() * 1000)
    await broker.outbox.enqueue(
        "reply:web-default:slow", "web-default", "web:long", {"text": "hi"}, now_ms=now
    )
    [claimed] = await broker.outbox.claim("seed", now_ms=now, limit=1, lease_ms=1_000)
    await broker.outbox.settle_retry(
        claimed, due_at_ms=now + 3_600_000, reason="HTTP 503", unknown_outcome=False, now_ms=now
    )
    await broker.close()
    gateway = GatewayProcess("gw", tmp_path, settings).start()
    try:
        token = (tmp_path / "ops-token").read_text().strip()
        await page.goto(f"{gateway.url}/ops#token={token}")
        await expect(page.locator("#backlog")).to_contain_text("oldest due")
        retrying = page.locator("#retrying tr")
        await expect(retrying).to_have_count(1)
        await expect(retrying).to_contain_text("HTTP 503")
        await page.locator("#lanes tr", has_text="web:long").click()
        await expect(page.locator("#timeline")).to_contain_text("message 699")
        rows = page.locator("#timeline tr")
        await expect(rows).to_have_count(500)
        await expect(rows.first).to_contain_text("message 200")  # 700 - 500: the newest
        await expect(page.locator("#timeline-more")).to_contain_text("newest 500")
    finally:
        gateway.stop()
    assert console_errors == []
