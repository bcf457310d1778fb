"""The operator API's error envelope and request ids.

Every response of the app carries ``X-Request-Id`` (the caller's, when it sent a sane one);
every error under ``/api/v1`` is ``{"error": {"code", "message", "details", "request_id"}}``
with the codes of the a13n service: ``invalid_argument`` 400, ``unauthenticated`` 401,
``forbidden`` 403, ``not_found`` 404 (unknown routes and methods too), ``conflict`` 409
(``details.reason``), ``request_timeout`` 408 (a body that stalls or trickles),
``length_required`` 411, ``payload_too_large`` 413 (bodies over `MAX_BODY_BYTES`),
``unknown_host`` 421 (a ``Host`` the gateway does not serve),
``precondition_required`` 428, ``internal`` 500, ``unavailable`` 503.
"""

from __future__ import annotations

import logging
import re
import secrets
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import redis.exceptions as redis
from fastapi import FastAPI, Request
from fastapi.exception_handlers import (
    http_exception_handler,
    request_validation_exception_handler,
)
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from gateway.broker.contract import BrokerError
from gateway.errors import GatewayError
from gateway.logs import event
from harness_core import SessionError

__all__ = [
    "API_PREFIX",
    "MAX_BODY_BYTES",
    "ApiError",
    "ApiErrorCode",
    "envelope",
    "install_errors",
    "request_id",
]

log = logging.getLogger("gateway.ops")

API_PREFIX = "/api/v1"
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{8,128}")
ApiErrorCode = Literal[
    "invalid_argument",  # 400: a malformed request (its fields say which)
    "invalid_cursor",  # 400: a page cursor this gateway did not give out
    "unauthenticated",  # 401
    "forbidden",  # 403: the token's role may not do this
    "not_found",  # 404: no such session, lane, action or route
    "conflict",  # 409: the lane's state refuses the action (`details.reason`)
    "request_timeout",  # 408: the request body came too slowly
    "length_required",  # 411
    "payload_too_large",  # 413
    "unknown_host",  # 421
    "precondition_required",  # 428: an action without its Idempotency-Key
    "internal",  # 500
    "unavailable",  # 503: the store or the broker does not answer
]
"""The envelope's closed ``error.code``: clients branch on it, never on the message."""
_STATUS_CODES: dict[int, ApiErrorCode] = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "not_found",
    408: "request_timeout",
    409: "conflict",
    411: "length_required",
    413: "payload_too_large",
    415: "invalid_argument",
    421: "unknown_host",
    422: "invalid_argument",
    428: "precondition_required",
    503: "unavailable",
}


class ApiError(GatewayError):
    """A refusal with its status, code, message and details (the envelope's fields)."""

    def __init__(
        self,
        status: int,
        code: ApiErrorCode,
        message: str,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code: ApiErrorCode = code
        self.message = message
        self.details = details or {}


def request_id(request: Request) -> str:
    """This request's id (set by the middleware)."""
    value = getattr(request.state, "request_id", None)
    return value if isinstance(value, str) else "unknown"


def _field(error: Any) -> dict[str, str]:
    """One refused field: its dotted name and why (a body that is no JSON names no field)."""
    where = [part for part in error.get("loc", ()) if part != "body"]
    if error.get("type") == "json_invalid":  # its "location" is the character's offset
        at = f" at character {where[0]}" if where else ""
        return {"field": "", "reason": f"the body is not valid JSON{at}"}
    return {
        "field": ".".join(str(part) for part in where),
        "reason": str(error.get("msg", "invalid")),
    }


def _unavailable(exc: BaseException) -> str | None:
    """What a failure that is the store's or the broker's says (None: a defect of ours).

    An operator paged because Redis stalled was told "internal error", as if the gateway had a
    bug: a store or broker that does not answer, or fails, is 503 ``unavailable``.
    """
    if isinstance(exc, TimeoutError | ConnectionError | redis.ConnectionError | redis.TimeoutError):
        return f"the store or the broker does not answer ({type(exc).__name__}): try again"
    part = "store" if isinstance(exc, SessionError) else "broker"
    if isinstance(exc, SessionError | BrokerError) and exc.code == "storage":
        said = " ".join(str(exc).split())[:300]
        return f"the {part} failed: {said}"
    if isinstance(exc, redis.RedisError):
        return f"the store or the broker failed ({type(exc).__name__}): try again"
    return None


def envelope(request: Request, error: ApiError) -> JSONResponse:
    """The error as the API returns it."""
    rid = request_id(request)
    body = {
        "error": {
            "code": error.code,
            "message": error.message,
            "details": error.details,
            "request_id": rid,
        }
    }
    headers = {"X-Request-Id": rid}
    if error.status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="gateway"'
    return JSONResponse(body, status_code=error.status, headers=headers)


def _route(request: Request) -> str:
    """The route's template (``/web/threads/{thread}``), not the path: ids stay out of it."""
    route = request.scope.get("route")
    template = getattr(route, "path", None)
    return template if isinstance(template, str) else "(no route)"


def _frames(exc: BaseException, most: int = 6) -> list[str]:
    """Where `exc` was raised: the innermost frames as ``file:line function``, no message.

    A 500 can be traced from the log alone, and no text the request carried (an exception's
    message may quote it) reaches the log.
    """
    frames = traceback.extract_tb(exc.__traceback__)[-most:]
    return [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames]


def _in_api(request: Request) -> bool:
    return request.url.path == API_PREFIX or request.url.path.startswith(API_PREFIX + "/")


MAX_BODY_BYTES = 1024 * 1024
"""The largest request body the operator API reads (its largest request, a decision batch of
a wide tool call, is a few KiB); `gateway.guards.BodyLimit` refuses larger ones unread."""


def install_errors(app: FastAPI) -> None:
    """Request ids on every response; the envelope for every error under the API prefix.

    The request-id middleware is added last, so it is the outermost: middleware added before
    this call (the edge guards) answers inside it, with the request's id.
    """

    @app.middleware("http")
    async def with_request_id(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        given = request.headers.get("x-request-id", "")
        rid = given if _REQUEST_ID.fullmatch(given) else "req_" + secrets.token_hex(8)
        request.state.request_id = rid
        try:
            response = await call_next(request)
        except ClientDisconnect:  # the client hung up mid-request: nobody to answer
            log.info(event("client disconnected", request_id=rid))
            return Response(status_code=400)  # never sent: uvicorn drops it
        except Exception as exc:  # never a traceback to the caller; the log says where
            log.error(
                event(
                    "request failed",
                    request_id=rid,
                    error=type(exc).__name__,
                    method=request.method,
                    route=_route(request),
                    at=_frames(exc),
                )
            )
            if not _in_api(request):  # a channel's route: its own envelope's shape
                return JSONResponse(
                    {
                        "error": {
                            "code": "internal",
                            "message": f"internal error (request id {rid} in the log)",
                        }
                    },
                    status_code=500,
                    headers={"X-Request-Id": rid, "Cache-Control": "no-store"},
                )
            down = _unavailable(exc)
            response = envelope(
                request,
                ApiError(503, "unavailable", down)
                if down is not None
                else ApiError(500, "internal", "internal error"),
            )
            if down is not None:
                response.headers["Retry-After"] = "5"
        response.headers["X-Request-Id"] = rid
        if _in_api(request):  # threads' contents, for one token's holder: never kept by a cache
            response.headers.setdefault("Cache-Control", "no-store")
        return response

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        return envelope(request, exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        fields = [_field(error) for error in exc.errors()[:20]]
        if not _in_api(request):
            return await request_validation_exception_handler(request, exc)
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        on_body = any(tuple(e.get("loc", ()))[:1] == ("body",) for e in exc.errors())
        if on_body and media != "application/json" and not media.endswith("+json"):
            # the body was not read as JSON at all: "Input should be a valid dictionary or
            # object to extract fields from" said nothing of why
            said = (
                "the body is read as JSON: send it with content-type: application/json "
                f"(not {media or 'none'})"
            )
            return envelope(
                request,
                ApiError(
                    400, "invalid_argument", said, {"fields": [{"field": "", "reason": said}]}
                ),
            )
        return envelope(
            request,
            ApiError(400, "invalid_argument", "the request is not valid", {"fields": fields}),
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if not _in_api(request):
            if exc.status_code in (404, 405):  # the channels' own error shape, not FastAPI's
                code, message = (
                    ("not_found", "no such route")
                    if exc.status_code == 404
                    else ("method_not_allowed", f"{request.method} is not allowed here")
                )
                body = {"error": {"code": code, "message": message}}
                return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)
            return await http_exception_handler(request, exc)
        code = _STATUS_CODES.get(exc.status_code, "internal")
        status = 404 if exc.status_code == 405 else exc.status_code
        message = "no such route" if status == 404 else str(exc.detail)
        return envelope(request, ApiError(status, code, message))
