"""The operator API's test rig: a whole `Service` on SQLite or Redis, its tokens and clients.

Each deployment runs the test agent (tests/support/gateway_agent.py) and is talked to over
ASGI: messages in through the web channel, the operator API under /api/v1.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from gateway.channels import gateway_settings
from gateway.service import Service
from tests.support.service_rig import ServiceRig

AGENT = "tests.support.gateway_agent"
OPERATOR = "operator-secret-abcdefghijklmnop"
VIEWER = "viewer-secret-abcdefghijklmnopqr"
AS_OPERATOR = {"Authorization": f"Bearer {OPERATOR}"}
AS_VIEWER = {"Authorization": f"Bearer {VIEWER}"}


class Ops(ServiceRig):
    """A service and clients for its web channel and its operator API."""

    async def get(self, path: str, headers: dict[str, str] = AS_VIEWER) -> Any:
        response = await self.http.get(f"/api/v1{path}", headers=headers)
        assert response.status_code == 200, response.text
        return response.json()

    async def act(
        self,
        path: str,
        body: Any = None,
        *,
        key: str | None = None,
        as_: dict[str, str] = AS_OPERATOR,
    ) -> httpx.Response:
        headers = dict(as_)
        if key is not None:
            headers["Idempotency-Key"] = key
        return await self.http.post(f"/api/v1{path}", json=body, headers=headers)

    async def lane(self, lane: str) -> dict[str, Any]:
        [found] = [v for v in (await self.get("/lanes"))["items"] if v["lane"] == lane]
        view: dict[str, Any] = found
        return view

    async def until_status(self, lane: str, *statuses: str) -> dict[str, Any]:
        deadline = asyncio.get_running_loop().time() + 15
        while True:
            found = [v for v in (await self.get("/lanes"))["items"] if v["lane"] == lane]
            if found and found[0]["status"] in statuses:
                view: dict[str, Any] = found[0]
                return view
            assert asyncio.get_running_loop().time() < deadline, found
            await asyncio.sleep(0.05)

    async def log_size(self, session: str) -> int:
        storage = await self.repo.open(session)
        try:
            return len(await storage.get_log())
        finally:
            await storage.close()


def backend_urls(backend: str, request: pytest.FixtureRequest, tmp_path: Any) -> dict[str, str]:
    """The store, broker and web URLs of a deployment on `backend` (sqlite or redis)."""
    if backend == "sqlite":
        return {
            "store_url": f"sqlite:///{tmp_path}/store.db",
            "broker_url": f"sqlite:///{tmp_path}/broker.db",
            "web_url": f"sqlite:///{tmp_path}/web.db",
        }
    prefix = request.getfixturevalue("redis_prefix")
    url = request.getfixturevalue("redis_server").url
    return {
        "store_url": f"{url}?prefix={prefix}s",
        "broker_url": f"{url}?prefix={prefix}b",
        "web_url": f"{url}?prefix={prefix}w",
    }


@contextlib.asynccontextmanager
async def deployed(
    request: pytest.FixtureRequest, tmp_path: Any, **settings: Any
) -> AsyncIterator[Ops]:
    """A started service on ``request.param``'s backend, with an operator and a viewer token."""
    service = Service(
        gateway_settings(
            **{
                **backend_urls(request.param, request, tmp_path),
                "plugin": AGENT,
                "lease_seconds": 6,
                "renew_seconds": 1,
                "ops_tokens": (f"alice:operator:{OPERATOR}", f"bob:viewer:{VIEWER}"),
                **settings,
            }
        )
    )
    await service.start()
    assert service.app is not None
    transport = httpx.ASGITransport(app=service.app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            yield Ops(service, http)
    finally:
        await service.stop(drain_seconds=2)
