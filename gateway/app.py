"""The HTTP app: health, readiness, and the routes adapters bring (the web channel, Slack later)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

__all__ = ["build_app"]


def build_app(routers: Sequence[Any], ready: Callable[[], Awaitable[dict[str, str]]]) -> FastAPI:
    """The service's app with every adapter's router.

    ``/healthz``: the process answers. ``/readyz``: its store and broker answer (503 naming the
    failing part otherwise).
    """
    app = FastAPI(title="durable-gateway", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        checks = await ready()
        failing = {name: state for name, state in checks.items() if state != "ok"}
        status = 503 if failing else 200
        return JSONResponse({"status": "ok" if not failing else "unavailable", **checks}, status)

    for router in routers:
        app.include_router(router)
    return app
