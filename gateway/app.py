"""The HTTP app: health, readiness, the operator API and the routes adapters bring."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, RedirectResponse, Response

from gateway.guards import BodyLimit, BodyWatch, HeadAsGet, HostGuard, HostRule
from gateway.ops.errors import API_PREFIX, install_errors
from gateway.redact import RedactBodies, Redactor

__all__ = ["build_app"]


def build_app(
    routers: Sequence[Any],
    ready: Callable[[], Awaitable[dict[str, str]]],
    *,
    hosts: HostRule,
    body_limits: Mapping[str, int],
    redactor: Redactor | None = None,
    bodies: BodyWatch | None = None,
) -> FastAPI:
    """The service's app with every adapter's router.

    ``/healthz``: the process answers. ``/readyz``: its store and broker answer (503 naming the
    failing part otherwise). Before any route: the request id, then the `hosts` rule, then the
    bodies' bounds (`body_limits` by path prefix; see `gateway.guards`); every response body
    passes through `redactor`.
    """
    app = FastAPI(
        title="durable-gateway",
        summary="The operator API of a durable LLM agent gateway (and the channels' routes).",
        version="1",
        docs_url=None,  # Swagger UI loads from a CDN: the schema is served, the UI is not
        redoc_url=None,
        openapi_url=f"{API_PREFIX}/openapi.json",
    )
    if redactor is not None:
        app.add_middleware(RedactBodies, redactor=redactor)  # added first: innermost
    app.add_middleware(BodyLimit, limits=body_limits, watch=bodies)
    app.add_middleware(HostGuard, rule=hosts)
    app.add_middleware(HeadAsGet)  # HEAD wherever GET: uptime checkers probe with it
    install_errors(app)  # the request-id middleware, outside both

    @app.get("/", include_in_schema=False)
    async def home() -> RedirectResponse:
        return RedirectResponse("/web/", status_code=307)  # the web channel's threads

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        return Response(status_code=204)  # no icon, and no 404 in every browser console

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
