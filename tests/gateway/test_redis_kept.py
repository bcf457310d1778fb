"""A Redis that lost the gateway's data (flushed, restarted empty) is said, in every process (D348).

Before, a ``FLUSHALL`` or a Redis restarted with nothing on disk went by without a word: the
accepted messages, the sessions and the replies were gone, and the log said nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from pathlib import Path

import pytest
import redis

from gateway.kept import MARK, KeptWatch
from tests.support.gateway_process import GatewayProcess
from tests.support.redis_server import RedisServer

AGENT = "tests.support.gateway_agent"


async def test_every_process_says_a_flushed_redis_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = RedisServer(tmp_path / "redis").start()
    store, broker = f"{server.url}?prefix=st", f"{server.url}?prefix=br"
    one = KeptWatch.of([(store, "gw"), (broker, "gwb")], random.Random(1))
    two = KeptWatch.of([(store, "gw"), (broker, "gwb")], random.Random(2))
    other = KeptWatch.of([("sqlite:///x.db", "gw"), ("memory://", "gwb")], random.Random(3))
    assert one is not None and two is not None and other is None
    client = redis.Redis(port=server.port)
    try:
        caplog.set_level(logging.ERROR, logger="gateway.kept")
        assert await one.check() == [] and await two.check() == []  # the first looks learn
        assert await one.check() == [] and await two.check() == []
        assert client.keys("*") == [f"st:{MARK}".encode()]  # one mark: the store's prefix
        client.flushall()
        assert await one.check() == [server.url]  # writes a new mark
        assert await two.check() == [server.url]  # finds another than it saw
        assert await one.check() == [] and await two.check() == []  # said once per loss
        server.kill()
        assert await one.check() == []  # unreachable: the outage says so, not this
        server.start()  # no AOF, no snapshot: empty
        assert await one.check() == [server.url]
        assert await two.check() == [server.url]
    finally:
        await one.close()
        await two.close()
        client.close()
        server.stop()
    lost = [r for r in caplog.records if r.getMessage() == "redis lost the gateway's data"]
    assert len(lost) == 4
    assert getattr(lost[0].msg, "fields", {})["url"] == server.url


async def test_gateway_serve_says_a_redis_restarted_empty(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()  # no AOF: a restart is empty
    url = f"{server.url}?prefix=gone"
    settings = {"store_url": url, "broker_url": url, "web_url": url, "plugin": AGENT}
    gateway = GatewayProcess("gw", tmp_path, settings).start()
    try:
        server.kill()
        server.start()
        deadline = time.monotonic() + 15  # a look every 10 s
        while "redis lost the gateway's data" not in gateway.log_path.read_text():
            assert time.monotonic() < deadline, gateway.tail(40)
            await asyncio.sleep(0.2)
    finally:
        gateway.stop()
        server.stop()
    lines = [json.loads(x) for x in gateway.log_path.read_text().splitlines() if x[:1] == "{"]
    [lost] = [e for e in lines if e["event"] == "redis lost the gateway's data"]
    assert lost["level"] == "error" and lost["url"] == server.url, lost
