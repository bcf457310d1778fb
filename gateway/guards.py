"""The app's edge: which Host names it answers to and how large a request body may be.

Both guards are plain ASGI middleware that run before any route (inside the request-id
middleware, so a refusal carries its id):

* `HostGuard`: a request naming a host the gateway does not serve is refused 421
  ``unknown_host`` (DNS rebinding: a web page whose name was made to resolve to this machine
  sends its own name as ``Host``, and ``Sec-Fetch-Site`` says same-origin).
* `BodyLimit`: a body over its route class's bound is refused 413 on its ``Content-Length``,
  unread; any body is read only as its route reads it, up to the bound and at a pace
  (`BodyPace`: 408 when it stalls or trickles), and one still coming when the drain begins is
  answered 503 (`BodyWatch`).

`HeadAsGet` passes a HEAD on as a GET (the HTTP server leaves the body out).

Refusals under ``/api/v1`` are the operator API's envelope; everywhere else the channels'
``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from adapters import whole_number
from config import Settings
from gateway.errors import GatewayError
from gateway.logs import event
from gateway.ops.errors import API_PREFIX, MAX_BODY_BYTES, ApiError, envelope

__all__ = [
    "DEFAULT_BODY_BYTES",
    "LOOPBACK_NAMES",
    "BodyLimit",
    "BodyPace",
    "BodyWatch",
    "HeadAsGet",
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


class _HeadSent(GatewayError):
    """A HEAD's headers went: the route's body is not wanted (an event stream never ends)."""


class HeadAsGet:
    """Answer HEAD wherever GET is answered (uptime checkers and load balancers probe with it).

    The route sees a GET; the HTTP server, which knows the request was a HEAD, sends the
    headers without the body. The response ends with its headers: a route still writing its
    body is stopped (an event stream's HEAD never ended, and held the connection and a
    stream's place).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass a HEAD on as a GET, anything else as it is."""
        if scope["type"] != "http" or scope.get("method") != "HEAD":
            await self.app(scope, receive, send)
            return
        ended = False

        async def headers_only(message: Message) -> None:
            nonlocal ended
            if ended:
                if message.get("more_body", False):
                    raise _HeadSent  # a body still being written: stop its route
                return
            if message["type"] == "http.response.start":
                await send(message)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                ended = True

        with contextlib.suppress(_HeadSent):
            await self.app({**scope, "method": "GET"}, receive, headers_only)


@dataclass(frozen=True)
class BodyPace:
    """How slowly a request body may come before it is cut (408 ``too_slow``)."""

    idle_s: float = 15.0
    """The longest a body may send nothing."""
    grace_s: float = 10.0
    """How long a body may come at any rate; past it, at `min_rate` on average."""
    min_rate: float = 8_192.0
    """Bytes a second (a 35 MB upload over a 64 kbit/s link would not be taken in any case)."""


class BodyWatch:
    """The request bodies being read: the pace they must keep, and the drain that ends them.

    One per app. `stop` (the drain begins) answers every body still coming 503 at once, so a
    client is told to send it again instead of being cut without an answer when the server's
    graceful shutdown ends (and logging an error line for each).
    """

    def __init__(self, pace: BodyPace | None = None) -> None:
        self.pace = pace or BodyPace()
        self.stopping = False
        self._waits: set[asyncio.Timeout] = set()

    def stop(self) -> None:
        """The gateway drains: every body still coming is answered 503 now."""
        self.stopping = True
        now = asyncio.get_running_loop().time()
        for wait in tuple(self._waits):
            with contextlib.suppress(RuntimeError):  # one that expired just now: cut already
                wait.reschedule(now)

    @contextlib.asynccontextmanager
    async def wait(self) -> AsyncIterator[None]:
        """Bound one wait for a body's next part by `BodyPace.idle_s` (and by `stop`)."""
        async with asyncio.timeout(self.pace.idle_s) as wait:
            self._waits.add(wait)
            try:
                yield
            finally:
                self._waits.discard(wait)


class _BodyCut(GatewayError):
    """A request body refused while the route read it (too large, too slow, or the drain)."""

    def __init__(self, error: ApiError, code: str, headers: Mapping[str, str]) -> None:
        super().__init__(error.message)
        self.error = error
        self.code = code
        self.headers = dict(headers)


class _Body:
    """A request's `receive` as its route reads the body: bounded in size and in time.

    Nothing is read before the route asks for it, so a route refuses a request it will not
    take (an upload with no slot, a caller without a login) before any of its body is held.
    Once the body is complete, `receive` is the server's again (a disconnect, whenever).
    """

    def __init__(self, receive: Receive, limit: int, watch: BodyWatch) -> None:
        self.receive = receive
        self.limit = limit
        self.watch = watch
        self.cut: _BodyCut | None = None
        self.done = False
        self.size = 0
        self.began: float | None = None

    async def __call__(self) -> Message:
        if self.done:
            return await self.receive()
        if self.cut is not None:
            raise self.cut
        pace = self.watch.pace
        loop = asyncio.get_running_loop()
        if self.began is None:
            self.began = loop.time()
        try:
            if self.watch.stopping:
                raise TimeoutError
            async with self.watch.wait():
                message = await self.receive()
        except TimeoutError:
            if self.watch.stopping:
                raise self._cutting(_stopping()) from None
            raise self._cutting(_too_slow(f"nothing came for {pace.idle_s:g} s")) from None
        if message["type"] != "http.request":
            self.done = True  # the client left: the route hears it as usual
            return message
        self.size += len(message.get("body", b""))
        if self.size > self.limit:
            raise self._cutting(_too_large(self.limit))
        if not message.get("more_body", False):
            self.done = True
            return message
        elapsed = loop.time() - self.began
        if elapsed > pace.grace_s and self.size < elapsed * pace.min_rate:
            raise self._cutting(_too_slow(f"{self.size} bytes in {elapsed:.0f} s"))
        return message

    def _cutting(self, cut: _BodyCut) -> _BodyCut:
        self.cut = cut
        return cut


def _too_large(limit: int) -> _BodyCut:
    return _BodyCut(
        ApiError(
            413,
            "payload_too_large",
            f"the request body exceeds {limit} bytes",
            {"limit_bytes": limit},
        ),
        "too_large",
        {"Connection": "close"},
    )


def _too_slow(what: str) -> _BodyCut:
    return _BodyCut(
        ApiError(
            408, "request_timeout", f"the request body came too slowly ({what}); send it again"
        ),
        "too_slow",
        {"Connection": "close"},
    )


def _stopping() -> _BodyCut:
    return _BodyCut(
        ApiError(503, "unavailable", "the gateway is stopping: nothing was taken; send it again"),
        "unavailable",
        {"Connection": "close", "Retry-After": "5"},
    )


_CLOSE = (b"connection", b"close")
_DROP_S = 1.0
"""How long a refused body is read and dropped before the answer (a lingering close)."""
_DROP_BYTES = 64 * 1024 * 1024
"""How much of a refused body is read and dropped, at most, before the answer."""


async def _drop_rest(receive: Receive) -> bool:
    """Read and drop what is left of a request's body, for a moment; True once it all came.

    A client that writes its whole body before it reads (httpx, most libraries) met a reset
    instead of the 413 or the 503 with ``Retry-After``: a connection closed with unread data
    in it is reset by the kernel, the answer with it (an outside probe). Bounded in time and
    bytes, as a server's lingering close is: a client that sends for longer is cut as before.
    Only a body of a declared length: a chunked one is streamed, and answered at once.
    """
    dropped = 0
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(_DROP_S):
            while dropped <= _DROP_BYTES:
                message = await receive()
                if message["type"] != "http.request":
                    return True
                dropped += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return True
    return False


def _closes(start: Message) -> bool:
    return any(name.lower() == b"connection" for name, _ in start.get("headers", []))


class BodyLimit:
    """Bound every request body by its route class, in size and in time.

    `limits` maps path prefixes to bytes (the longest matching prefix wins; `default` for the
    rest). A declared ``Content-Length`` over the bound is refused 413 at once, unread. A body
    of unknown length (``Transfer-Encoding: chunked``) is refused 411 under the operator API (as
    it always was). Any other body is read only as its route reads it, through `_Body`: past
    the bound 413, too slow (`BodyPace`) 408, still coming when the drain begins 503; each
    with ``Connection: close``, the rest unread, and whatever the route then says replaced by it.
    A route that answers before its body was read whole closes the connection with its answer.
    """

    def __init__(
        self,
        app: ASGIApp,
        limits: Mapping[str, int],
        default: int = DEFAULT_BODY_BYTES,
        watch: BodyWatch | None = None,
    ) -> None:
        self.app = app
        self.limits = sorted(limits.items(), key=lambda item: len(item[0]), reverse=True)
        self.default = default
        self.watch = watch or BodyWatch()

    def limit_for(self, path: str) -> int:
        """The bound of a request to `path`."""
        for prefix, limit in self.limits:
            if path.startswith(prefix):
                return limit
        return self.default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer a refused request at once; pass the others on with their body bounded."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope.get("path", ""))
        headers = Headers(scope=scope)
        declared = headers.get("content-length")
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        if declared is not None:
            if not declared.isascii() or not declared.isdigit():
                await _refuse(
                    scope,
                    receive,
                    send,
                    ApiError(400, "invalid_argument", "the Content-Length header is not a number"),
                    "invalid_request",
                )
                return
            if whole_number(declared, limit) is None:  # past it (int() raises past 4,300 digits)
                await self._answer(scope, receive, send, _too_large(limit), drop=True)
                return
        elif chunked and _in_api(scope.get("path", "")):
            await _refuse(
                scope,
                receive,
                send,
                ApiError(411, "length_required", "send the request body with its length"),
            )
            return
        body = _Body(receive, limit, self.watch)
        body.done = declared in (None, "0") and not chunked  # nothing to read
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            if body.cut is not None and not started:
                return  # the route's own answer to a body it could not read: ours goes
            if message["type"] == "http.response.start" and not body.done and not _closes(message):
                # answered before its body was read (a refusal, a route that reads none): the
                # rest is dropped for a moment, then the connection ends with the answer, or
                # the server would read and drop it for as long as the client kept sending it
                if declared is not None and body.cut is None and not self.watch.stopping:
                    body.done = await _drop_rest(body.receive)
                message = {**message, "headers": [*message.get("headers", []), _CLOSE]}
            started = True
            await send(message)

        try:
            await self.app(scope, body, sending)
        except _BodyCut:
            if started:
                raise
        if body.cut is not None and not started:
            await self._answer(scope, receive, send, body.cut)

    async def _answer(
        self, scope: Scope, receive: Receive, send: Send, cut: _BodyCut, *, drop: bool = False
    ) -> None:
        log.debug(event("request body refused", path=scope.get("path", ""), reason=cut.code))
        if drop and not self.watch.stopping:
            await _drop_rest(receive)  # its answer reaches a client that writes all first
        await _refuse(scope, receive, send, cut.error, cut.code, cut.headers)
