"""`/readyz` with a Redis that stalls: every part probed at once, so the answer comes in one
probe's time (a load balancer's health check gives up after a few seconds)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from gateway.channels import gateway_settings
from gateway.service import _PROBE_TIMEOUT_S, Service
from tests.support.redis_server import RedisServer


async def test_a_stalled_redis_is_reported_within_one_probe_s_time(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    service = Service(
        gateway_settings(
            store_url=f"{server.url}?prefix=s",
            broker_url=f"{server.url}?prefix=b",
            web_url=f"{server.url}?prefix=w",
        )
    )
    await service.start()
    assert server.process is not None
    try:
        assert await service.readiness() == {
            "broker": "ok",
            "store": "ok",
            "web": "ok",
            "redis_write": "ok",  # a scripted write (D403)
        }
        os.kill(server.process.pid, signal.SIGSTOP)
        began = time.monotonic()
        try:
            said = await service.readiness()
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        took = time.monotonic() - began
        assert set(said) == {"broker", "store", "web", "redis_write"}
        assert "ok" not in said.values()
        # one after another, the three probes took three probes' time: 15 s
        assert took < 2 * _PROBE_TIMEOUT_S, took
    finally:
        await service.stop(drain_seconds=1)
        server.stop()
