"""A Redis that may lose the gateway's state is named at start, and a fault says why (D309).

With ``maxmemory-policy allkeys-lru`` an outside probe watched Redis evict the gateway's own
keys: the session's stream then refused every write (``XADD ID equal or smaller``), messages
were accepted and never answered, and nothing said why.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from redis.asyncio import Redis

from gateway.channels import gateway_settings
from harness_core.backends.redis import server_config
from tests.support.redis_server import RedisServer
from tests.support.service_rig import serving


async def test_a_redis_that_may_evict_keys_is_named_at_start(
    redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"{redis_server.url}?prefix=evict{tmp_path.name[-8:]}"
    settings = gateway_settings(
        store_url=url, broker_url=url, web_url=f"sqlite:///{tmp_path}/web.db"
    )
    admin = Redis(port=redis_server.port)
    try:
        await admin.config_set("maxmemory-policy", "allkeys-lru")
        with caplog.at_level(logging.WARNING, logger="gateway.service"):
            async with serving(settings):
                pass
        await admin.config_set("maxmemory-policy", "noeviction")
        warned = [r for r in caplog.records if "may evict" in r.getMessage()]
        assert len(warned) == 1  # the store and the broker on one server: one line
        fields = getattr(warned[0].msg, "fields", {})
        assert fields["maxmemory_policy"] == "allkeys-lru"
        assert "noeviction" in fields["fix"]
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="gateway.service"):
            async with serving(settings):
                pass
        assert not [r for r in caplog.records if "may evict" in r.getMessage()]
    finally:
        await admin.config_set("maxmemory-policy", "noeviction")
        await admin.aclose()


async def test_a_redis_that_keeps_no_log_of_its_writes_is_named_at_start(
    redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without AOF a restarted Redis had lost every message it acknowledged since its last
    snapshot, ids reused, and no line said why."""
    url = f"{redis_server.url}?prefix=aof{tmp_path.name[-8:]}"
    settings = gateway_settings(
        store_url=url, broker_url=url, web_url=f"sqlite:///{tmp_path}/web.db"
    )
    admin = Redis(port=redis_server.port, decode_responses=True)
    was = str((await admin.config_get("appendonly"))["appendonly"])
    try:
        for appendonly in ("no", "yes"):
            await admin.config_set("appendonly", appendonly)
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="gateway.service"):
                async with serving(settings):
                    pass
            warned = [r for r in caplog.records if "no log of its writes" in r.getMessage()]
            assert len(warned) == (1 if appendonly == "no" else 0), appendonly
    finally:
        await admin.config_set("appendonly", was)
        await admin.aclose()


async def test_a_session_fault_is_logged_with_its_reason(
    redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What eviction did to a session (its seq allocator gone, its streams kept): every take
    faulted, and the log said only ``HarnessFault``; the reason took a debugger to find."""
    prefix = f"fault{tmp_path.name[-8:]}"
    url = f"{redis_server.url}?prefix={prefix}"
    settings = gateway_settings(
        store_url=url,
        broker_url=url,
        web_url=f"sqlite:///{tmp_path}/web.db",
        lease_seconds=6,
        renew_seconds=1,
    )
    admin = Redis(port=redis_server.port, decode_responses=True)
    try:
        with caplog.at_level(logging.ERROR, logger="gateway.worker"):
            async with serving(settings) as rig:
                await rig.post("t1", "first")
                await rig.answers("t1", 1)
                await admin.hset(f"{prefix}:{{web-default}}:meta", "seq", 0)  # as if evicted
                await rig.post("t1", "second")
                for _ in range(400):
                    if any("session faulted" in r.getMessage() for r in caplog.records):
                        break
                    await asyncio.sleep(0.025)
        [fault, *_] = [r for r in caplog.records if r.getMessage() == "session faulted"]
        fields = getattr(fault.msg, "fields", {})
        assert fields["error"] == "HarnessFault"
        assert "XADD" in fields["reason"] and "\n" not in fields["reason"]
    finally:
        await admin.aclose()


async def test_a_redis_that_refuses_config_is_still_checked(tmp_path: Path) -> None:
    """Managed services rename or forbid CONFIG: the start then said nothing of a Redis that
    keeps no log of its writes or may evict keys. INFO says both."""
    server = RedisServer(
        tmp_path / "redis", options=("--rename-command", "CONFIG", "", "--maxmemory-policy",
        "allkeys-lru"),
    ).start()  # fmt: skip
    try:
        found = await server_config(server.url, "maxmemory-policy", "appendonly")
        assert found == {"maxmemory-policy": "allkeys-lru", "appendonly": "no"}
    finally:
        server.stop()
