"""The web channel's own store really down (its redis-server stopped): nothing is half-accepted.

A `Service` keeps its sessions and broker in SQLite and its web threads in a Redis of its own.
While that Redis is stopped a post is refused (503, one JSON error) and the gateway takes
nothing; once it is back the same post is taken, shown once, and answered after it (D162).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.channels import gateway_settings
from harness_core import UserMessage, message_text
from harness_core.session import MessageEntry, StoredEntry
from tests.support.redis_server import RedisServer
from tests.support.service_rig import ServiceRig, serving

AGENT = "tests.support.gateway_agent"


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[tuple[ServiceRig, RedisServer]]:
    web_redis = RedisServer(tmp_path / "web-redis", appendonly=True).start()
    settings = gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"{web_redis.url}?prefix=down",
        plugin=AGENT,
        lease_seconds=6,
        renew_seconds=1,
    )
    try:
        async with serving(settings) as rig:
            yield rig, web_redis
    finally:
        web_redis.stop()


async def _user_messages(rig: ServiceRig, session: str) -> list[str]:
    """What the gateway took: the user messages in the session's log."""
    storage = await rig.repo.open(session)
    try:
        return [
            message_text(item.entry.message)
            for item in await storage.get_log()
            if isinstance(item, StoredEntry)
            and isinstance(item.entry, MessageEntry)
            and isinstance(item.entry.message, UserMessage)
        ]
    finally:
        await storage.close()


async def test_a_post_while_the_web_store_is_down_is_refused_and_taken_once_it_is_back(
    rig: tuple[ServiceRig, RedisServer],
) -> None:
    service, web_redis = rig
    first = await service.post("t-down", "before")
    await service.answers("t-down", 1)

    ready = await service.http.get("/readyz")
    assert ready.status_code == 200 and ready.json()["web"] == "ok", ready.text
    web_redis.stop()
    # not ready: every post is refused (it said ok, and an orchestrator kept sending traffic)
    unready = await service.http.get("/readyz")
    assert unready.status_code == 503 and unready.json()["web"] != "ok", unready.text
    body: dict[str, Any] = {"text": "while down", "client_message_id": "m-down"}
    refused = await service.http.post("/web/threads/t-down/messages", json=body)
    assert refused.status_code == 503, refused.text
    error = refused.json()["error"]
    assert error["code"] == "unavailable" and "may not have been taken" in error["message"]
    assert "retry-after" in refused.headers
    await asyncio.sleep(0.3)  # a worker would have taken it by now
    assert await _user_messages(service, first["session"]) == ["before"]  # nothing taken

    web_redis.start()
    taken = await service.http.post("/web/threads/t-down/messages", json=body)
    assert taken.status_code == 202, taken.text
    answers = await service.answers("t-down", 2)
    assert answers[-1]["text"] == "You said: while down"
    items = (await service.http.get("/web/threads/t-down")).json()["items"]
    assert [(i["kind"], i["text"]) for i in items] == [
        ("message", "before"),
        ("reply", "You said: before"),
        ("message", "while down"),
        ("reply", "You said: while down"),
    ]
    assert await _user_messages(service, first["session"]) == ["before", "while down"]
