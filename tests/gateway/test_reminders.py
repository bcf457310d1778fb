"""Approval reminders: asked again after 1, 2, 4... intervals, once each, only while open.

The sweep is driven directly over a real harness (SQLite store) and a real SQLite broker with a
manual clock; then a whole `Service` on SQLite and on Redis shows a reminder arriving in a web
thread, a decision taken from it, and no reminder after.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters.channel import ThreadRef
from gateway.broker import open_broker
from gateway.broker.contract import Broker
from gateway.channels import gateway_settings
from gateway.reminders import due_reminder, remind, reminder_text
from harness_core import Err, Ok, Tool, approve
from harness_core.models.scripted import tool_call
from tests.support.gateway_rig import decision_body, serving, thread_items, waiting_for_approval
from tests.support.harness_kit import Kit, make_kit

THREAD = ThreadRef(channel="web", space="default", thread="t1")
INTERVAL_MS = 60_000


@pytest.mark.parametrize(
    ("waited_ms", "due"),
    [
        (0, None),
        (59_999, None),
        (60_000, 1),
        (119_999, 1),
        (120_000, 2),
        (239_999, 2),
        (240_000, 3),
        (480_000, 4),
        (86_400_000, 11),  # a day at one a minute: the 11th, not the 1,440th
    ],
)
def test_reminders_come_after_one_two_four_intervals(waited_ms: int, due: int | None) -> None:
    assert due_reminder(waited_ms, INTERVAL_MS) == due


def test_a_reminder_says_since_when_and_how_long() -> None:
    said = reminder_text(1_796_256_000_000, 1_796_256_000_000 + 3 * 3_600_000, "Approve it?")
    assert said == "Still waiting since 2026-12-03 00:00 UTC (3 h). Approve it?"
    assert "(5 min)" in reminder_text(0, 5 * 60_000, "x")
    assert "(4 s)" in reminder_text(0, 4_200, "x")
    assert "(2 days)" in reminder_text(0, 2 * 86_400_000, "x")


@pytest.fixture
def broker(sqlite_broker: Broker) -> Broker:
    return sqlite_broker


async def _waiting(tmp_path: Path, broker: Broker) -> tuple[Kit, Any, str, int]:
    """A web lane whose run waits for approval; (kit, lane, wait id, requested at)."""
    kit, lane, wait_id = await waiting_for_approval(tmp_path, THREAD.lane)
    await broker.threads.remember("s", THREAD.lane, THREAD.model_dump(mode="json"), {})
    request = await kit.storage.get_record(wait_id)
    assert request is not None
    return kit, lane, wait_id, request.timestamp


async def _sweep(kit: Kit, broker: Broker, at_ms: int) -> list[Any]:
    return await remind(kit.repo, broker, now_ms=at_ms, interval_ms=INTERVAL_MS, max_attempts=3)


async def test_a_waiting_request_is_reminded_once_per_step_and_never_after_its_decision(
    tmp_path: Path, broker: Broker
) -> None:
    kit, lane, wait_id, asked_at = await _waiting(tmp_path, broker)
    assert await _sweep(kit, broker, asked_at + INTERVAL_MS - 1) == []

    [first] = await _sweep(kit, broker, asked_at + INTERVAL_MS)
    assert first.delivery_id == f"approval_request:s:{wait_id}:remind-1"
    assert first.kind == "approval_request" and first.thread == THREAD
    assert first.approval is not None and first.approval.wait_id == wait_id  # same buttons
    assert first.text.startswith("Still waiting since ")
    assert first.text.endswith("(1 min). Approval needed before I run deploy.")
    assert await _sweep(kit, broker, asked_at + INTERVAL_MS + 30_000) == []  # already sent

    [later] = await _sweep(kit, broker, asked_at + 5 * INTERVAL_MS)  # 2 was missed: only 3
    assert later.delivery_id.endswith(":remind-3")
    pending = [d.id for d in await broker.outbox.list("pending")]
    assert pending == [first.delivery_id, later.delivery_id]

    required = await lane.resume()
    assert isinstance(required, Err)
    [call] = required.error.pending
    decided = await lane.resume([approve(call)], wait_id=wait_id)
    assert isinstance(decided, Ok) and decided.value.kind == "completed"
    assert await _sweep(kit, broker, asked_at + 100 * INTERVAL_MS) == []


async def test_a_lane_no_channel_answers_gets_no_reminder(tmp_path: Path, broker: Broker) -> None:
    kit, _, _, asked_at = await _waiting(tmp_path, broker)
    empty = open_broker(f"sqlite:///{tmp_path}/empty.db")  # no thread state: `gateway ask`
    try:
        assert await _sweep(kit, empty, asked_at + 10 * INTERVAL_MS) == []
    finally:
        await empty.close()


@pytest.fixture(params=["sqlite", "redis"])
async def reminding(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[httpx.AsyncClient]:
    if request.param == "sqlite":
        urls = {
            "store_url": f"sqlite:///{tmp_path}/store.db",
            "broker_url": f"sqlite:///{tmp_path}/broker.db",
            "web_url": f"sqlite:///{tmp_path}/web.db",
        }
    else:
        url = request.getfixturevalue("redis_server").url
        prefix = request.getfixturevalue("redis_prefix")
        urls = {
            "store_url": f"{url}?prefix={prefix}s",
            "broker_url": f"{url}?prefix={prefix}b",
            "web_url": f"{url}?prefix={prefix}w",
        }
    settings = gateway_settings(
        **urls, plugin="tests.support.gateway_agent", approval_remind_seconds=0.4
    )
    async with serving(settings) as http:
        yield http


async def _items(http: httpx.AsyncClient, kind: str, count: int) -> list[dict[str, Any]]:
    return await thread_items(http, "ship", [kind], count)


async def test_a_reminder_reaches_the_thread_and_its_buttons_decide(
    reminding: httpx.AsyncClient,
) -> None:
    posted = await reminding.post("/web/threads/ship/messages", json={"text": "/deploy prod"})
    assert posted.status_code == 202, posted.text
    asked, reminded = await _items(reminding, "approval_request", 2)
    assert reminded["text"].startswith("Still waiting since ")
    assert reminded["approval"]["wait_id"] == asked["approval"]["wait_id"]
    decided = decision_body(reminded["approval"], approved=True, key="from-the-reminder")
    response = await reminding.post("/web/threads/ship/decisions", json=decided)
    assert response.status_code == 202, response.text
    [reply] = await _items(reminding, "reply", 1)
    assert reply["text"] == "Done: deployed prod"
    requests = len(await _items(reminding, "approval_request", 2))
    await asyncio.sleep(1.0)  # two more intervals: a decided request is not asked again
    assert len(await _items(reminding, "approval_request", 2)) == requests


class _ThreadsFailFor:
    """The broker, except that one lane's thread state cannot be read (a fault injected)."""

    def __init__(self, broker: Broker, lane: str) -> None:
        self._broker = broker
        self._lane = lane
        self.outbox = broker.outbox
        self.marks = broker.marks  # whether the thread's authority was revoked (D267)
        self.threads = self

    async def get(self, session: str, lane: str) -> Any:
        if lane == self._lane:
            raise ConnectionError("the broker did not answer")
        return await self._broker.threads.get(session, lane)


async def test_a_lane_that_cannot_be_read_holds_back_no_other(
    tmp_path: Path, broker: Broker
) -> None:
    tools = [Tool(name="deploy", description="d", execute=_never, requires_approval=True)]
    script = [tool_call("deploy", {}), tool_call("deploy", {})]
    kit = await make_kit("sqlite", tmp_path, script, tools)
    for name in ("web:t1", "web:t2"):
        created = await kit.harness.create_lane(name, None)
        assert isinstance(created, Ok)
        assert isinstance(await created.value.prompt("deploy please"), Ok)
        thread = ThreadRef(channel="web", space="default", thread=name.removeprefix("web:"))
        await broker.threads.remember("s", name, thread.model_dump(mode="json"), {})
    failing: Any = _ThreadsFailFor(broker, "web:t1")
    now = kit.clock.now_ms() + 10 * INTERVAL_MS
    [reminded] = await remind(
        kit.repo, failing, now_ms=now, interval_ms=INTERVAL_MS, max_attempts=3
    )
    assert reminded.thread.lane == "web:t2"


async def _never(args: Any, ctx: Any) -> str:
    raise AssertionError("an approval wait never runs its tool")
