"""A broker outage is said once as it begins, once a minute while it lasts, once as it ends (D347).

Before, each worker slot's take and the deliverer's claim logged a line per failure: about 240
lines a minute while Redis was down, none saying why, and nothing when it came back.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters.web import open_mailbox
from gateway.broker.contract import BrokerError
from gateway.channels import gateway_settings
from gateway.outage import REMIND_MS, SETTLE_MS, Outage
from harness_core.testing import ManualClock
from tests.support.gateway_process import GatewayProcess
from tests.support.redis_server import RedisServer
from tests.support.service_rig import serving

AGENT = "tests.support.gateway_agent"


def _said(caplog: pytest.LogCaptureFixture) -> list[tuple[str, dict[str, Any]]]:
    return [
        (r.getMessage(), dict(getattr(r.msg, "fields", {})))
        for r in caplog.records
        if r.name == "test.outage"
    ]


def test_an_outage_is_said_as_it_begins_each_minute_and_as_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    outage = Outage("broker", clock, logging.getLogger("test.outage"))
    down = BrokerError("storage", "redis take failed: Error 111 connecting. Connection refused.")
    caplog.set_level(logging.INFO, logger="test.outage")
    outage.ok("take")  # nothing to say while all is well
    for _ in range(59):  # a slot retrying each second
        outage.failed("take", down)
        outage.failed("claim", down)
        clock.advance(1000)
    [(name, fields)] = _said(caplog)
    assert name == "broker unavailable"
    assert fields["code"] == "storage" and "Connection refused" in fields["reason"]
    clock.advance(1000)
    outage.failed("take", down)
    assert _said(caplog)[-1] == (
        "broker still unavailable",
        {
            "seconds": REMIND_MS // 1000,
            "failures": 119,
            "parts": ["claim", "take"],
            "error": "BrokerError",
            "code": "storage",
            "reason": str(down),
        },
    )
    outage.ok("take")  # it failed just now: one success is no proof yet
    assert len(_said(caplog)) == 2 and outage.down
    clock.advance(SETTLE_MS)
    outage.ok("take")  # the claims still fail: not over yet
    assert len(_said(caplog)) == 2 and outage.down
    outage.ok("claim")
    assert _said(caplog)[-1] == ("broker available again", {"seconds": 65.0, "failures": 119})
    assert outage.failures == 0  # counted anew
    outage.failed("claim", down)  # a new outage is said anew
    assert _said(caplog)[-1][0] == "broker unavailable"


def test_a_part_that_fails_each_second_between_successes_is_one_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A Redis user without XAUTOCLAIM: the take's recovery failed each second, and the takes
    between (nothing due: the server never asked) counted as proof it answered. The log said
    "unavailable" and "available again" each second, 7,200 lines an hour (an outside probe)."""
    clock = ManualClock()
    outage = Outage("broker", clock, logging.getLogger("test.outage"))
    refused = BrokerError("storage", "redis autoclaim failed: no permissions to run 'xautoclaim'")
    caplog.set_level(logging.INFO, logger="test.outage")
    for _ in range(180):
        outage.failed("take", refused)
        clock.advance(600)
        outage.ok("take")
        clock.advance(400)
    said = [name for name, _ in _said(caplog)]
    assert said == ["broker unavailable"] + ["broker still unavailable"] * 2


def _lines(gateway: GatewayProcess, after: int) -> list[dict[str, Any]]:
    lines = gateway.log_path.read_text().splitlines()[after:]
    return [json.loads(line) for line in lines if line.startswith("{")]


def _post(gateway: GatewayProcess, text: str) -> None:
    response = httpx.post(f"{gateway.url}/web/threads/t/messages", json={"text": text}, timeout=10)
    assert response.status_code == 202, response.text


async def _replies(web_url: str) -> int:
    mailbox = open_mailbox(web_url)
    try:
        items = await mailbox.read("default", "t", after=0, limit=100)
    finally:
        await mailbox.close()
    return len([item for item in items if item.kind == "reply"])


async def _until(done: Callable[[], Awaitable[bool]], gateway: GatewayProcess) -> None:
    deadline = time.monotonic() + 15
    while not await done():
        assert time.monotonic() < deadline, gateway.tail(60)
        await asyncio.sleep(0.1)


async def test_redis_down_for_seconds_is_two_lines_in_the_log(tmp_path: Path) -> None:
    """`gateway serve` on Redis; Redis is killed for 5 s and started again: one warning as it
    goes (with its reason), one line as it is back, and a message is answered after."""
    server = RedisServer(tmp_path / "redis", appendonly=True).start()
    url = f"{server.url}?prefix=down"
    settings = {"store_url": url, "broker_url": url, "web_url": url, "plugin": AGENT}
    gateway = GatewayProcess("gw", tmp_path, settings).start()

    async def answered(count: int) -> None:
        async def done() -> bool:
            return await _replies(url) >= count

        await _until(done, gateway)

    async def back() -> bool:
        return any(e["event"] == "broker available again" for e in _lines(gateway, before))

    try:
        _post(gateway, "before")
        await answered(1)
        before = len(gateway.log_path.read_text().splitlines())
        server.kill()
        await asyncio.sleep(5)
        down = _lines(gateway, before)
        server.start()  # the same data directory
        await _until(back, gateway)
        _post(gateway, "after")
        await answered(2)
        after = _lines(gateway, before)
    finally:
        gateway.stop()
        server.stop()
    said = [e for e in down if e["event"].startswith("broker")]
    assert [e["event"] for e in said] == ["broker unavailable"], down
    assert said[0]["level"] == "warning" and "redis" in said[0]["reason"], said
    assert not [e for e in down if e["event"] in ("take failed", "claim failed")]
    assert len([e for e in down if e["level"] == "warning"]) <= 4, down  # was about 20
    [again] = [e for e in after if e["event"] == "broker available again"]
    assert again["seconds"] >= 5 and again["failures"] >= 5, again


async def test_a_session_the_broker_fails_mid_way_is_taken_again_soon_not_after_its_lapse(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 10 s Redis pause timed out a message's ack: the session failed, its ticket was left
    to lapse, and every thread of the space waited 30 s more (an outside probe). The session
    was let go already: its ticket goes back now (owed while the broker does not answer)."""
    settings = gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"sqlite:///{tmp_path}/web.db",
        plugin="tests.support.gateway_agent",
        lease_seconds=30,
    )
    caplog.set_level(logging.INFO, logger="gateway.worker")
    async with serving(settings) as rig:
        assert rig.service.broker is not None
        inbox = rig.service.broker.inbox
        real = inbox.ack
        failed: list[str] = []

        async def ack(session: str, item_id: str) -> None:
            if not failed:  # the broker's first answer is lost (a timeout)
                failed.append(item_id)
                raise BrokerError("storage", "redis inbox_ack failed: Timeout reading")
            await real(session, item_id)

        inbox.ack = ack  # type: ignore[method-assign]
        await rig.post("t1", "hello")
        [answer] = await rig.answers("t1", 1)  # within 15 s, where the lapse took 30
    assert answer["text"] == "You said: hello" and failed
    said = [r for r in caplog.records if r.getMessage() == "session interrupted"]
    assert said and said[0].levelname == "WARNING"
    assert not [r for r in caplog.records if r.getMessage() == "session failed"]
