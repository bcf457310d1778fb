"""The app's edge: which Host names it answers to and how large a request body may be.

Both guards are plain ASGI middleware that run before any route (inside the request-id
middleware, so a refusal carries its id) and answer at once, without reading the body:

* `HostGuard`: a request naming a host the gateway does not serve is refused 421
  ``unknown_host`` (DNS rebinding: a web page whose name was made to resolve to this machine
  sends its own name as ``Host``, and ``Sec-Fetch-Site`` says same-origin).
* `BodyLimit`: a body over its route class's bound is refused 413 on its ``Content-Length``,
  unread; a body without one (chunked) is read only up to the bound.

`HeadAsGet` passes a HEAD on as a GET (the HTTP server leaves the body out).

Refusals under ``/api/v1`` are the operator API's envelope; everywhere else the channels'
``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from config import Settings
from gateway.errors import GatewayError
from gateway.logs import event
from gateway.ops.errors import API_PREFIX, MAX_BODY_BYTES, ApiError, envelope

__all__ = [
    "DEFAULT_BODY_BYTES",
    "LOOPBACK_NAMES",
    "BodyLimit",
    "HostGuard",
    "HostRule",
    "body_limits",
    "host_rule",
]

log = logging.getLogger("gateway.http")

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
"""The names a browser on this machine uses for it (an address literal is accepted anyway)."""

DEFAULT_BODY_BYTES = 64 * 1024
"""The bound of a route nobody declared one for (pages, health, an adapter that says nothing)."""

_PORT = re.compile(r"(?::[0-9]{0,5})?")


def _in_api(path: str) -> bool:
    return path == API_PREFIX or path.startswith(API_PREFIX + "/")


async def _refuse(
    scope: Scope,
    receive: Receive,
    send: Send,
    error: ApiError,
    channel_code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> None:
    """Answer `error`: the API's envelope under its prefix, the channels' shape elsewhere."""
    if _in_api(scope.get("path", "")):
        response = envelope(Request(scope), error)
    else:
        body = {"error": {"code": channel_code or error.code, "message": error.message}}
        response = JSONResponse(body, status_code=error.status)
        response.headers["Cache-Control"] = "no-store"
    for name, value in (headers or {}).items():
        response.headers[name] = value
    await response(scope, receive, send)


def host_name(header: str) -> str | None:
    """The name a ``Host`` header gives, lower-cased, without its port; None if malformed.

    An IPv6 address comes without its brackets (``[::1]:8787`` -> ``::1``).
    """
    value = header.strip().lower()
    if value.startswith("["):
        name, closing, rest = value[1:].partition("]")
        if not closing:
            return None
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            return None
    else:
        name, colon, port = value.partition(":")
        rest = colon + port
    if not name or not _PORT.fullmatch(rest):
        return None
    return name


@dataclass(frozen=True)
class HostRule:
    """The host names the gateway answers to.

    The loopback names, every address literal (a rebinding needs a name: a page whose origin is
    an address is served by that address, which is this gateway), and `names` (the public URL's
    host and the allow-list). The port is not compared: it is whatever the client connected to
    (a published container port, a proxy's), and a rebinding changes only the name.
    """

    names: frozenset[str] = frozenset()

    def allows(self, header: str | None) -> bool:
        """Whether a request with this ``Host`` header is answered."""
        name = None if header is None else host_name(header)
        if name is None:
            return False
        if name in LOOPBACK_NAMES or name in self.names:
            return True
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True


def host_rule(settings: Settings) -> HostRule:
    """The rule `settings` configure: ``public_url``'s host and ``allowed_hosts``."""
    names = set(settings.allowed_hosts)
    if settings.public_url is not None:
        public = urlsplit(settings.public_url).hostname
        if public:
            names.add(public.lower())
    return HostRule(frozenset(names))


class HostGuard:
    """Refuse (421 ``unknown_host``) a request whose ``Host`` the rule does not allow."""

    def __init__(self, app: ASGIApp, rule: HostRule) -> None:
        self.app = app
        self.rule = rule

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass an allowed request on; answer any other at once."""
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        given = Headers(scope=scope).getlist("host")
        host = given[0] if len(given) == 1 else None  # none, or two that may disagree
        if self.rule.allows(host):
            await self.app(scope, receive, send)
            return
        log.debug(event("host refused", host=(host or "")[:100], path=scope.get("path", "")))
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await _refuse(
            scope,
            receive,
            send,
            ApiError(
                421,
                "unknown_host",
                "this gateway does not answer to the host this request names; add it to "
                "GATEWAY_ALLOWED_HOSTS (or GATEWAY_PUBLIC_URL) if it is this gateway's",
            ),
        )


def body_limits(declared: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """The bounds by path prefix: the operator API's, then what each adapter declared.

    Two adapters declaring one prefix: the smaller bound wins.
    """
    limits = {API_PREFIX: MAX_BODY_BYTES}
    for table in declared:
        for prefix, limit in table.items():
            limits[prefix] = min(limit, limits.get(prefix, limit))
    return limits


class _TooLarge(GatewayError):
    pass


class HeadAsGet:
    """Answer HEAD wherever GET is answered (uptime checkers and load balancers probe with it).

    The route sees a GET; the HTTP server, which knows the request was a HEAD, sends the
    headers without the body.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass a HEAD on as a GET, anything else as it is."""
        if scope["type"] == "http" and scope.get("method") == "HEAD":
            scope = {**scope, "method": "GET"}
        await self.app(scope, receive, send)


class BodyLimit:
    """Bound every request body by its route class, before anything reads it.

    `limits` maps path prefixes to bytes (the longest matching prefix wins; `default` for the
    rest). A declared ``Content-Length`` over the bound is refused 413 at once, unread (the
    HTTP server holds a body to its declared length, so a body within it cannot grow). A body
    of unknown length (``Transfer-Encoding: chunked``) is refused 411 under the operator API (as
    it always was) and elsewhere read here up to the bound: past it, 413 at once, the rest
    unread.
    """

    def __init__(
        self, app: ASGIApp, limits: Mapping[str, int], default: int = DEFAULT_BODY_BYTES
    ) -> None:
        self.app = app
        self.limits = sorted(limits.items(), key=lambda item: len(item[0]), reverse=True)
        self.default = default

    def limit_for(self, path: str) -> int:
        """The bound of a request to `path`."""
        for prefix, limit in self.limits:
            if path.startswith(prefix):
                return limit
        return self.default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer a refused request at once; pass the others on."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope.get("path", ""))
        headers = Headers(scope=scope)
        declared = headers.get("content-length")
        if declared is not None:
            if not declared.isascii() or not declared.isdigit():
                await _refuse(
                    scope,
                    receive,
                    send,
                    ApiError(400, "invalid_argument", "the Content-Length header is not a number"),
                    "invalid_request",
                )
            elif int(declared) > limit:
                await self._too_large(scope, receive, send, limit)
            else:
                await self.app(scope, receive, send)
            return
        if "chunked" not in headers.get("transfer-encoding", "").lower():
            await self.app(scope, receive, send)
            return
        if _in_api(scope.get("path", "")):
            await _refuse(
                scope,
                receive,
                send,
                ApiError(411, "length_required", "send the request body with its length"),
            )
            return
        try:
            first = await _read_up_to(receive, limit)
        except _TooLarge:
            await self._too_large(scope, receive, send, limit)
            return
        if first is None:  # the client went away while sending: nobody to answer
            raise ClientDisconnect  # what the request-id middleware logs as one info line
        await self.app(scope, _replaying(first, receive), send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        await _refuse(
            scope,
            receive,
            send,
            ApiError(
                413,
                "payload_too_large",
                f"the request body exceeds {limit} bytes",
                {"limit_bytes": limit},
            ),
            "too_large",
            {"Connection": "close"},
        )


async def _read_up_to(receive: Receive, limit: int) -> Message | None:
    """The whole body as one message, or None if the client left; `_TooLarge` past `limit`."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if len(body) > limit:
            raise _TooLarge
        if not message.get("more_body", False):
            return {"type": "http.request", "body": bytes(body), "more_body": False}


def _replaying(first: Message, receive: Receive) -> Receive:
    """`receive` that answers `first` once, then the server's own messages (a disconnect)."""
    pending: list[Message] = [first]

    async def replay() -> Any:
        if pending:
            return pending.pop()
        return await receive()

    return replay
