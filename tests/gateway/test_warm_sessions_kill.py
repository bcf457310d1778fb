"""A process SIGKILLed while its session lingers: the other process answers within the lease.

Two real `gateway serve` processes on the same SQLite files. The first message's session
lingers in the process that served it (the operator API names that process as the holder of
the session's lease while nothing runs); that process is SIGKILLed mid-linger. Its lease and
ticket lapse like those of a process killed mid-run (an idle harness renews nothing, D247):
the next message of that thread is answered by the other process within the lease and a
second, and every message is answered exactly once.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters.web import open_mailbox
from gateway.incarnation import parse
from tests.support.gateway_process import GatewayProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

LEASE_S = 6.0
LINGER_S = 2.0  # at most a third of the lease


async def _replies(web_url: str, thread: str) -> list[str]:
    mailbox = open_mailbox(web_url)
    try:
        items = await mailbox.read("default", thread, after=0, limit=100)
    finally:
        await mailbox.close()
    return [item.text for item in items if item.kind == "reply"]


async def _until_replies(web_url: str, thread: str, count: int, timeout_s: float) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while len(replies := await _replies(web_url, thread)) < count:
        assert time.monotonic() < deadline, replies
        await asyncio.sleep(0.05)
    return replies


async def _holder(http: httpx.AsyncClient, token: str) -> str | None:
    answer = await http.get("/api/v1/lanes", headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.text
    [lane] = [v for v in answer.json()["items"] if v["lane"] == "web:warm"]
    assert lane["status"] == "idle", lane
    holder: str | None = lane["held_by"]
    return holder


async def test_a_process_killed_while_its_session_lingers_is_taken_over_within_the_lease(
    tmp_path: Path,
) -> None:
    settings: dict[str, Any] = {
        "store_url": f"sqlite:///{tmp_path}/store.db",
        "broker_url": f"sqlite:///{tmp_path}/broker.db",
        "web_url": f"sqlite:///{tmp_path}/web.db",
        "lease_seconds": str(LEASE_S),
        "renew_seconds": "1",
        "linger_seconds": str(LINGER_S),
    }
    first = GatewayProcess("a", tmp_path, settings).start()
    second = GatewayProcess("b", tmp_path, settings).start()
    try:
        token = (tmp_path / "ops-token").read_text().strip()
        async with httpx.AsyncClient(base_url=first.url, timeout=10) as http:
            posted = await http.post("/web/threads/warm/messages", json={"text": "one"})
            assert posted.status_code == 202, posted.text
            await _until_replies(settings["web_url"], "warm", 1, 20)
            holder = await _holder(http, token)  # idle, and still held: it lingers
        assert holder is not None
        incarnation = parse(holder)
        assert incarnation is not None
        by_pid = {p.process.pid: p for p in (first, second) if p.process is not None}
        lingering = by_pid[incarnation.pid]
        other = second if lingering is first else first
        lingering.kill()

        killed_at = time.monotonic()
        async with httpx.AsyncClient(base_url=other.url, timeout=10) as http:
            posted = await http.post("/web/threads/warm/messages", json={"text": "two"})
            assert posted.status_code == 202, posted.text
        replies = await _until_replies(settings["web_url"], "warm", 2, LEASE_S + 10)
        assert time.monotonic() - killed_at <= LEASE_S + 1, "taken over later than the lease + 1 s"
        await asyncio.sleep(LINGER_S)  # a reply sent twice would show by now
        assert await _replies(settings["web_url"], "warm") == replies
        assert [text.rsplit(": ", 1)[-1] for text in replies] == ["one", "two"], replies
    finally:
        first.stop()
        second.stop()
