"""A Standard Webhooks peer for tests: a real receiver of the gateway's POSTs, and a sender.

`WebhookPeer` is one aiohttp server on 127.0.0.1 (a free port) that receives like a careful
receiver would:

* ``POST /hooks`` (`url`): checks the three ``webhook-*`` headers, the timestamp against its own
  clock and the ``v1`` signature over the raw body (its own few lines, written from the spec,
  not the gateway's code, so the two implementations check each other), refuses with 401 what
  does not verify, drops a ``webhook-id`` it has taken already (answering 200 again), and
  keeps every request in `posts` and the first of each id in `taken`;
* ``GET /status/{webhook_id}`` (`status_url`): 200 when it took that id, 404 when not (the
  request itself signed like a POST with an empty body).

Faults are scripted and taken in order, one per POST: `fail` (a status, with ``Retry-After``),
`lose_ack` (the POST is taken, then the connection is dropped, or held open until `stop`:
the sender cannot know), `delay`; `fail_status` does the same for the status endpoint.

As a sender it signs what a test posts to the gateway (`signed`, `send`): a message, a
decision, or anything hostile, with the secret, id and timestamp a test chooses.

What a conformance rig needs is here: say (`send` a message), seen (`taken` for a thread),
decide (`send` a decision), hostile (`send_raw`), lose_next_ack (`lose_ack`).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import itertools
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import httpx
from aiohttp import web

__all__ = ["EVENTS", "Post", "WebhookPeer", "new_secret"]

EVENTS = "/webhook/events"
"""Where the gateway takes signed requests."""

_ids = itertools.count(1)


def new_secret(seed: str = "peer") -> str:
    """A ``whsec_`` secret of 32 bytes derived from `seed` (tests want them repeatable)."""
    return "whsec_" + base64.b64encode(hashlib.sha256(seed.encode()).digest()).decode()


def _key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix("whsec_"))


def _signature(key: bytes, msg_id: str, timestamp: str, body: bytes) -> str:
    mac = hmac.new(key, msg_id.encode() + b"." + timestamp.encode() + b"." + body, hashlib.sha256)
    return base64.b64encode(mac.digest()).decode()


@dataclass
class Post:
    """One request the peer received."""

    webhook_id: str
    timestamp: str
    body: bytes
    verified: bool
    status: int = 0
    """What the peer answered (0: nothing, the connection was dropped or held)."""
    duplicate: bool = False
    """A webhook-id taken before: answered 200, not taken again."""

    @property
    def payload(self) -> dict[str, Any]:
        value = json.loads(self.body)
        assert isinstance(value, dict)
        return value


@dataclass
class _Fault:
    kind: str
    status: int = 500
    retry_after: str | None = None
    hang: bool = False
    seconds: float = 0.0


@dataclass
class WebhookPeer:
    """A receiver of the gateway's POSTs and a sender of signed requests (see the module)."""

    secret: str = field(default_factory=new_secret)
    """What the gateway signs its POSTs with (``webhook_secret``)."""
    now: Callable[[], float] = time.time
    """The peer's clock (a test's manual clock, when the gateway runs on one)."""
    tolerance_s: int = 300
    host: str = "127.0.0.1"
    posts: list[Post] = field(default_factory=list)
    taken: dict[str, Post] = field(default_factory=dict)
    """The first post of each webhook-id, in the order taken."""
    status_asked: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.port: int | None = None
        self._runner: web.AppRunner | None = None
        self._faults: list[_Fault] = []
        self._status_faults: list[int] = []
        self._release = asyncio.Event()
        self._changed = asyncio.Condition()
        self.app = web.Application()
        self.app.router.add_post("/hooks", self._hook)
        self.app.router.add_get("/status/{webhook_id}", self._status)

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> Self:
        runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        await web.TCPSite(runner, self.host, 0).start()
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        """Release held requests and stop serving (idempotent)."""
        self._release.set()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def base_url(self) -> str:
        assert self.port is not None, "the peer is not started"
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """Where the gateway POSTs (``webhook_url``)."""
        return f"{self.base_url}/hooks"

    @property
    def status_url(self) -> str:
        """``webhook_status_url``."""
        return f"{self.base_url}/status"

    # -- faults --------------------------------------------------------------------------------

    def fail(self, status: int = 500, times: int = 1, *, retry_after: str | None = None) -> None:
        """The next `times` POSTs are answered `status` (and not taken)."""
        self._faults += [_Fault("fail", status=status, retry_after=retry_after)] * times

    def lose_ack(self, times: int = 1, *, hang: bool = False) -> None:
        """The next `times` POSTs are taken, then get no answer (dropped, or held open)."""
        self._faults += [_Fault("lose", hang=hang)] * times

    def delay(self, seconds: float, times: int = 1) -> None:
        """The next `times` POSTs wait `seconds` before they are handled."""
        self._faults += [_Fault("delay", seconds=seconds)] * times

    def fail_status(self, status: int = 500, times: int = 1) -> None:
        """The next `times` status requests are answered `status`."""
        self._status_faults += [status] * times

    # -- what arrived --------------------------------------------------------------------------

    def thread(self, thread: str) -> list[dict[str, Any]]:
        """The payloads taken for `thread`, in order."""
        return [p.payload for p in self.taken.values() if p.payload.get("thread") == thread]

    async def wait_taken(self, count: int, timeout_s: float = 10.0) -> list[Post]:
        """Wait until `count` distinct POSTs were taken; return them."""
        async with asyncio.timeout(timeout_s), self._changed:
            await self._changed.wait_for(lambda: len(self.taken) >= count)
        return list(self.taken.values())

    async def wait_posts(self, count: int, timeout_s: float = 10.0) -> list[Post]:
        """Wait until `count` requests arrived (taken or not); return them."""
        async with asyncio.timeout(timeout_s), self._changed:
            await self._changed.wait_for(lambda: len(self.posts) >= count)
        return list(self.posts)

    # -- receiving -----------------------------------------------------------------------------

    def _verified(self, headers: Mapping[str, str], body: bytes) -> tuple[str, str, bool]:
        msg_id = headers.get("webhook-id", "")
        timestamp = headers.get("webhook-timestamp", "")
        given = [s.partition(",")[2] for s in headers.get("webhook-signature", "").split()]
        if not msg_id or not timestamp.isdigit():
            return msg_id, timestamp, False
        if abs(self.now() - int(timestamp)) > self.tolerance_s:
            return msg_id, timestamp, False
        expected = _signature(_key(self.secret), msg_id, timestamp, body)
        return msg_id, timestamp, any(hmac.compare_digest(expected, s) for s in given)

    async def _record(self, post: Post) -> None:
        self.posts.append(post)
        async with self._changed:
            self._changed.notify_all()

    async def _hook(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        msg_id, timestamp, verified = self._verified(request.headers, body)
        post = Post(webhook_id=msg_id, timestamp=timestamp, body=body, verified=verified)
        fault = self._faults.pop(0) if self._faults else None
        if fault is not None and fault.kind == "delay":
            await asyncio.sleep(fault.seconds)
            fault = None
        if not verified:
            post.status = 401
            await self._record(post)
            return web.json_response({"error": "bad signature"}, status=401)
        if fault is not None and fault.kind == "fail":
            post.status = fault.status
            await self._record(post)
            headers = {"Retry-After": fault.retry_after} if fault.retry_after else None
            return web.json_response({"error": "scripted"}, status=fault.status, headers=headers)
        post.duplicate = msg_id in self.taken
        if not post.duplicate:
            self.taken[msg_id] = post
        if fault is not None and fault.kind == "lose":
            await self._record(post)
            if fault.hang:
                await self._release.wait()
            if request.transport is not None:
                request.transport.close()  # the sender reads EOF: taken, but it cannot know
            return web.Response(status=204)
        post.status = 200
        await self._record(post)
        return web.json_response({"ok": True, "duplicate": post.duplicate})

    async def _status(self, request: web.Request) -> web.StreamResponse:
        asked = request.match_info["webhook_id"]
        self.status_asked.append(asked)
        _, _, verified = self._verified(request.headers, b"")
        if not verified or request.headers.get("webhook-id") != asked:
            return web.json_response({"error": "bad signature"}, status=401)
        if self._status_faults:
            return web.json_response({"error": "scripted"}, status=self._status_faults.pop(0))
        if asked in self.taken:
            return web.json_response({"webhook_id": asked, "delivered": True})
        return web.json_response({"webhook_id": asked, "delivered": False}, status=404)

    # -- sending -------------------------------------------------------------------------------

    def signed(
        self,
        payload: Any,
        *,
        secret: str | None = None,
        msg_id: str | None = None,
        timestamp: int | None = None,
    ) -> tuple[bytes, dict[str, str]]:
        """`payload` (JSON-encoded unless bytes) and the headers that sign it."""
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        msg_id = msg_id or f"msg_peer{next(_ids)}"
        stamp = str(int(self.now()) if timestamp is None else timestamp)
        signature = _signature(_key(secret or self.secret), msg_id, stamp, body)
        headers = {
            "content-type": "application/json",
            "webhook-id": msg_id,
            "webhook-timestamp": stamp,
            "webhook-signature": f"v1,{signature}",
        }
        return body, headers

    async def send(
        self,
        http: httpx.AsyncClient,
        payload: Any,
        *,
        secret: str | None = None,
        msg_id: str | None = None,
        timestamp: int | None = None,
    ) -> httpx.Response:
        """POST `payload`, signed, to the gateway `http` points at."""
        body, headers = self.signed(payload, secret=secret, msg_id=msg_id, timestamp=timestamp)
        return await http.post(EVENTS, content=body, headers=headers)

    @staticmethod
    async def send_raw(
        http: httpx.AsyncClient, body: bytes, headers: Mapping[str, str]
    ) -> httpx.Response:
        """POST exactly `body` with exactly `headers` (a hostile or replayed request)."""
        return await http.post(EVENTS, content=body, headers=dict(headers))
