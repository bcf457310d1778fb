"""A whole `Service` in the test's process and an HTTP client for its app (ASGI).

What tests of the service's HTTP surface share: post a message through the web channel, wait
for the agent's answers, reach the service's store and broker.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

from config import Settings
from gateway.broker.contract import Broker
from gateway.service import Service, ServiceParts
from harness_core import SessionRepo

__all__ = ["ServiceRig", "serving"]


@contextlib.asynccontextmanager
async def serving(
    settings: Settings, *, drain_seconds: float = 2, parts: ServiceParts | None = None
) -> AsyncIterator[ServiceRig]:
    """The service of `settings` (and `parts`), started, with a client for its app; drained."""
    service = Service(settings, parts)
    await service.start()
    assert service.app is not None
    transport = httpx.ASGITransport(app=service.app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            yield ServiceRig(service, http)
    finally:
        await service.stop(drain_seconds=drain_seconds)


class ServiceRig:
    """A started service and an HTTP client for its app."""

    def __init__(self, service: Service, http: httpx.AsyncClient) -> None:
        self.service = service
        self.http = http

    @property
    def repo(self) -> SessionRepo:
        assert self.service.repo is not None
        return self.service.repo

    @property
    def broker(self) -> Broker:
        assert self.service.broker is not None
        return self.service.broker

    async def post(self, thread: str, text: str) -> dict[str, Any]:
        """Post a message to a web thread (202: durable in the inbox)."""
        response = await self.http.post(f"/web/threads/{thread}/messages", json={"text": text})
        assert response.status_code == 202, response.text
        accepted: dict[str, Any] = response.json()
        return accepted

    async def answers(self, thread: str, count: int) -> list[dict[str, Any]]:
        """Wait until `thread` holds `count` items from the agent; return them."""
        deadline = asyncio.get_running_loop().time() + 15
        while True:
            items = (await self.http.get(f"/web/threads/{thread}")).json()["items"]
            found = [
                i for i in items if i["kind"] not in ("message", "decision", "approval_closed")
            ]
            if len(found) >= count:
                return found
            assert asyncio.get_running_loop().time() < deadline, found
            await asyncio.sleep(0.02)
