"""A full Redis (``maxmemory`` under ``noeviction``) is said as full, not "unavailable, retry".

Such a Redis refuses every write until an operator acts: a sender told to retry retried into the
same wall, and nothing said "full" (an outside probe).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from gateway.channels import gateway_settings
from tests.support.redis_server import RedisServer
from tests.support.service_rig import serving


@pytest.mark.parametrize("full", ["inbox", "web"])
async def test_a_full_redis_is_said_to_be_full(tmp_path: Path, full: str) -> None:
    server = RedisServer(tmp_path / "redis", options=("--maxmemory-policy", "noeviction")).start()
    url = f"{server.url}?prefix={full}"
    settings = gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=url if full == "inbox" else f"sqlite:///{tmp_path}/broker.db",
        web_url=url if full == "web" else f"sqlite:///{tmp_path}/web.db",
    )
    try:
        async with serving(settings) as rig:
            admin = redis.Redis(port=server.port)
            try:  # full: what it holds is over its limit (the ballast is not the gateway's)
                for n in range(4):
                    admin.set(f"ballast:{n}", b"x" * 1_000_000)
                admin.config_set("maxmemory", "2mb")
                with pytest.raises(redis.exceptions.ResponseError, match="maxmemory"):
                    admin.set("one-more", b"x")
            finally:
                admin.close()
            refused = await rig.http.post("/web/threads/t/messages", json={"text": "hello"})
            assert refused.status_code == 503, refused.text
            said = refused.json()["error"]["message"]
            assert "store is full (Redis reached its maxmemory)" in said, said
            assert "frees memory or raises maxmemory" in said
    finally:
        server.stop()
