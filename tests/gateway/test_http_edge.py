"""The app's edge over real HTTP (uvicorn on a free port): the Host names it answers to and the
bounds of request bodies, on every kind of route (pages, web channel, Slack, email approval
links, the operator API, health).

A whole `Service` runs with the web channel, Slack in HTTP mode (against the fake Slack API),
email approval links (the mail servers are not reachable: the links' routes still answer) and
operator tokens. Hostile cases are tables: the next one is one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from adapters.web import WebChannel
from gateway.channels import gateway_settings
from gateway.guards import (
    DEFAULT_BODY_BYTES,
    BodyLimit,
    BodyPace,
    BodyWatch,
    HostGuard,
    HostRule,
    host_name,
)
from gateway.ops.errors import MAX_BODY_BYTES
from gateway.service import Service
from tests.adapters.kit import serve
from tests.support.fake_slack import FakeSlack
from tests.support.redis_server import free_port

OPERATOR = "operator-secret-abcdefghijklmnop"
AS_OPERATOR = {"Authorization": f"Bearer {OPERATOR}"}
PUBLIC = "gateway.example.test"
LISTED = "gw.internal.test"
WEB_LIMIT = 256 * 1024
SLACK_LIMIT = 1_000_000


@dataclass
class Edge:
    service: Service
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
async def edge(tmp_path: Path) -> AsyncIterator[Edge]:
    closed = free_port()  # the mail servers: nothing listens (the links' routes answer anyway)
    async with FakeSlack() as slack:
        settings = gateway_settings(
            store_url=f"sqlite:///{tmp_path}/store.db",
            broker_url=f"sqlite:///{tmp_path}/broker.db",
            web_url=f"sqlite:///{tmp_path}/web.db",
            ops_tokens=(f"alice:operator:{OPERATOR}",),
            public_url=f"https://{PUBLIC}",
            allowed_hosts=(LISTED,),
            slack_bot_token=slack.bot_token,
            slack_signing_secret="slack-signing-secret",
            slack_api_url=slack.api_url,
            email_address="bot@example.test",
            email_imap_host="127.0.0.1",
            email_imap_port=closed,
            email_imap_security="none",
            email_smtp_host="127.0.0.1",
            email_smtp_port=closed,
            email_smtp_security="none",
            email_password="mail-password",
            email_approvers=("ann@example.test",),
            email_link_secret="a-link-secret-of-at-least-32-characters",
        )
        service = Service(settings)
        await service.start()
        assert service.app is not None
        try:
            async with serve(service.app) as server:
                yield Edge(service, server.port)
        finally:
            await service.stop(drain_seconds=1)


JSON = {"content-type": "application/json"}
ROUTES: list[tuple[str, str, dict[str, str], bytes]] = [
    # (method, path, headers, body): one of every kind of route
    ("GET", "/healthz", {}, b""),
    ("GET", "/readyz", {}, b""),
    ("GET", "/", {}, b""),
    ("GET", "/web/", {}, b""),
    ("GET", "/web/threads/t1/page", {}, b""),
    ("GET", "/web/threads/t1", {}, b""),
    ("POST", "/web/threads/t1/messages", JSON, b'{"text": "hello"}'),
    ("POST", "/web/threads/t1/decisions", JSON, b'{"run_id": "r", "wait_id": "w"}'),
    ("GET", "/email/approvals/token?lane=email:x&sig=y", {}, b""),
    ("POST", "/email/approvals/token?lane=email:x&sig=y", {}, b""),
    ("GET", "/ops", {}, b""),
    ("GET", "/api/v1/lanes", AS_OPERATOR, b""),
    ("POST", "/api/v1/lanes/ln_x/abort", {**AS_OPERATOR, **JSON}, b"{}"),
    ("GET", "/metrics", {}, b""),
    ("POST", "/slack/events", JSON, b"{}"),
    ("GET", "/nowhere", {}, b""),
]
ALLOWED_HOSTS = [
    "127.0.0.1:{port}",
    "localhost:{port}",
    "[::1]:{port}",
    "LocalHost:{port}",
    "localhost",
    "127.0.0.1:8788",  # a published container port: the port is not compared
    PUBLIC,
    f"{PUBLIC}:443",
    f"{LISTED}:8080",
    "10.1.2.3:{port}",  # an address literal: no name to rebind
    "[fe80::1]:{port}",
]
REFUSED_HOSTS = [
    "evil.example",
    "evil.example:{port}",
    "localhost.evil.example:{port}",
    "127.0.0.1.nip.io:{port}",
    f"{PUBLIC}.evil.example",
    f"evil.{PUBLIC}",
    "localhost.:{port}",
    "localhost:{port}@evil.example",
    "localhost:port",
    "localhost:{port}:1",
    "[::1",
    "::1",
    "[not-an-address]:{port}",
    "",
    "localhost, evil.example",
]


async def test_only_the_gateways_own_host_names_are_answered(edge: Edge) -> None:
    async with httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        for host in REFUSED_HOSTS:
            for method, path, headers, body in ROUTES:
                named = {**headers, "Host": host.format(port=edge.port)}
                response = await http.request(method, path, headers=named, content=body)
                assert response.status_code == 421, (host, method, path, response.text)
                error = response.json()["error"]
                assert error["code"] == "unknown_host", (host, path)
                if path.startswith("/api/v1"):
                    assert error["request_id"] == response.headers["x-request-id"]
        # before any allowed post: those are accepted, and one may still wait for its worker
        assert await _stored_messages(edge) == 0  # no refused post reached the inbox
        thread = await http.get("/web/threads/t1", headers={"Host": "localhost"})
        assert thread.status_code == 404 or thread.json()["items"] == [], thread.text
        for host in ALLOWED_HOSTS:
            for method, path, headers, body in ROUTES:
                named = {**headers, "Host": host.format(port=edge.port)}
                response = await http.request(method, path, headers=named, content=body)
                assert response.status_code != 421, (host, method, path, response.text)
            healthy = await http.get("/healthz", headers={"Host": host.format(port=edge.port)})
            assert healthy.json() == {"status": "ok"}, host


async def _stored_messages(edge: Edge) -> int:
    broker = edge.service.broker
    assert broker is not None
    backlog = await broker.inbox.backlog()
    return backlog.pending


RAW_HOSTS: list[tuple[bytes, int]] = [
    # (the request's head, its status): what a client library would not send
    (b"GET /healthz HTTP/1.0\r\n\r\n", 421),  # no Host at all
    (b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n\r\n", 421),
    (b"GET /healthz HTTP/1.1\r\nHost: evil.example\r\nHost: localhost\r\n\r\n", 421),
    (b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", 200),
]


async def test_every_page_answers_head_as_probes_send_it(edge: Edge) -> None:
    # only the health routes did: an uptime checker probing / or /ops with HEAD saw 405
    async with httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        for path, status in [
            ("/healthz", 200),
            ("/readyz", 200),
            ("/ops", 200),
            ("/metrics", 200),
            ("/web/", 200),
            ("/", 307),
            ("/api/v1/lanes", 401),
        ]:
            response = await http.head(path, headers={"Host": "localhost"})
            assert response.status_code == status, (path, response.status_code)
            assert response.content == b"", path  # a HEAD answer has no body
            got = await http.get(path, headers={"Host": "localhost"})
            length = response.headers.get("content-length")
            assert length is None or int(length) == len(got.content) or path == "/metrics"


async def test_a_head_of_an_event_stream_ends_with_its_headers(edge: Edge) -> None:
    """A HEAD of an event stream was the endless GET: it never ended, so a kept-alive
    connection got no answer to its next request, and each held a stream's place (a probe)."""
    limits = httpx.Limits(max_connections=1)
    async with httpx.AsyncClient(base_url=edge.url, timeout=3, limits=limits) as http:
        for _ in range(3):
            response = await http.head("/web/threads/t1/events")
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            assert (await http.get("/healthz")).status_code == 200  # the same connection
    web = edge.service.adapters["web"]
    assert isinstance(web, WebChannel)
    await _until(lambda: web.streams == 0)  # no place is held


async def _until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.05)


async def test_a_missing_or_repeated_host_is_refused(edge: Edge) -> None:
    for head, status in RAW_HOSTS:
        answer = await asyncio.to_thread(_exchange, edge.port, head)
        assert answer.status in (status, 400), (head, answer.head)  # 400: the server's own
        if status == 200:
            assert answer.status == 200


async def test_two_host_headers_are_refused_by_the_guard_itself() -> None:
    """The HTTP server refuses them already (400); the guard does not rely on it."""
    from fastapi import FastAPI

    guarded = HostGuard(FastAPI(), HostRule())
    transport = httpx.ASGITransport(app=guarded)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        twice = [("Host", "localhost"), ("Host", "evil.example")]
        assert (await http.get("/", headers=twice)).status_code == 421
        assert (await http.get("/")).status_code == 404  # one Host: passed on


def test_host_names_are_read_as_browsers_send_them() -> None:
    assert host_name("LOCALHOST:8787") == "localhost"
    assert host_name("[::1]:8787") == "::1"
    assert host_name("[::1]") == "::1"
    assert host_name("example.com:") == "example.com"
    for malformed in ("", ":80", "[::1]x", "[::1]:8o", "a:1:2", "[zz]", "a:123456"):
        assert host_name(malformed) is None, malformed


# -- bodies --------------------------------------------------------------------------------------

BOUNDS: list[tuple[str, str, dict[str, str], int]] = [
    # (method, path, headers, bound): every route class
    ("POST", "/slack/events", JSON, SLACK_LIMIT),
    ("POST", "/web/threads/t1/messages", JSON, WEB_LIMIT),
    ("POST", "/web/threads/t1/decisions", JSON, WEB_LIMIT),
    ("POST", "/email/approvals/token?lane=email:x&sig=y", {}, DEFAULT_BODY_BYTES),
    ("POST", "/api/v1/lanes/ln_x/abort", {**AS_OPERATOR, **JSON}, MAX_BODY_BYTES),
    ("GET", "/healthz", {}, DEFAULT_BODY_BYTES),
    ("GET", "/web/threads/t1/page", {}, WEB_LIMIT),
    ("GET", "/ops", {}, DEFAULT_BODY_BYTES),
    ("POST", "/somewhere/else", JSON, DEFAULT_BODY_BYTES),
]


def _head(method: str, path: str, headers: dict[str, str], framing: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", framing]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@dataclass
class Answer:
    status: int
    head: str
    body: bytes
    closed: bool = False
    took_s: float = 0.0
    sent: int = 0


def _read_answer(sock: socket.socket) -> Answer:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    text = head.decode("latin-1")
    length = next(
        (
            int(line.split(":", 1)[1])
            for line in text.split("\r\n")
            if line.lower().startswith("content-length:")
        ),
        None,
    )
    while length is not None and len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    status = int(text.split(" ", 2)[1]) if text.startswith("HTTP/") else 0
    return Answer(status, text, body)


def _exchange(port: int, head: bytes) -> Answer:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head)
        return _read_answer(sock)


def _closed(sock: socket.socket, within_s: float = 5.0) -> bool:
    """Whether the server closed the connection (after its answer)."""
    sock.settimeout(within_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _declared_too_large(port: int, method: str, path: str, headers: dict[str, str]) -> Answer:
    """Only the head, declaring 20 MB; the answer, whether the server closed, how long it took."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        began = time.monotonic()
        sock.sendall(_head(method, path, headers, "Content-Length: 20000000"))
        answer = _read_answer(sock)  # not one byte of the body was sent
        answer.closed = _closed(sock)
        answer.took_s = time.monotonic() - began
        return answer


def _declared(port: int, method: str, path: str, headers: dict[str, str], size: int) -> Answer:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(_head(method, path, headers, f"Content-Length: {size}"))
        sock.sendall(b" " * size)
        return _read_answer(sock)


def _chunked(port: int, method: str, path: str, headers: dict[str, str], bound: int) -> Answer:
    """A chunked body sent 16 KiB at a time until an answer comes (or 20 x the bound)."""
    piece = 16 * 1024
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(_head(method, path, headers, "Transfer-Encoding: chunked"))
        sent = 0
        while sent < 20 * bound:
            try:
                sock.sendall(f"{piece:x}\r\n".encode() + b" " * piece + b"\r\n")
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += piece
            sock.settimeout(0.005)
            with contextlib.suppress(TimeoutError, BlockingIOError):
                if sock.recv(1, socket.MSG_PEEK):
                    break
            sock.settimeout(5)
        sock.settimeout(5)
        answer = _read_answer(sock)
        answer.sent = sent
        answer.closed = _closed(sock, within_s=1.0)  # not by the keep-alive timeout (5 s)
        return answer


async def test_a_declared_body_over_the_bound_is_refused_before_it_is_sent(edge: Edge) -> None:
    for method, path, headers, bound in BOUNDS:
        answer = await asyncio.to_thread(_declared_too_large, edge.port, method, path, headers)
        assert answer.status == 413, (path, answer.head)
        error = json.loads(answer.body)["error"]
        assert error["code"] in ("too_large", "payload_too_large"), path
        assert str(bound) in error["message"], path
        assert answer.closed and answer.took_s < 3, path
        # exactly the bound is read, and answered by the route
        exact = await asyncio.to_thread(_declared, edge.port, method, path, headers, bound)
        assert exact.status != 413, path


async def test_a_client_that_writes_its_whole_body_first_hears_the_refusal(edge: Edge) -> None:
    """httpx writes a body whole before it reads: a refusal sent before the body was read met
    a reset (the kernel resets a connection closed with unread data), not the 413 (a probe).
    The rest is read and dropped for a moment first, as a lingering close does."""
    big = b"x" * (40 * 1024 * 1024)

    async with httpx.AsyncClient(timeout=10) as client:
        for path in ("/web/uploads/t1", "/web/threads/t1/messages", "/api/v1/lanes/ln_x/abort"):
            answer = await client.post(f"{edge.url}{path}", content=big, headers=JSON)
            assert answer.status_code in (401, 413), (path, answer.text)  # the API: who first
            assert "error" in answer.json(), path


READ_BY_THE_ROUTE = {"/slack/events", "/web/threads/t1/messages", "/web/threads/t1/decisions"}
"""The routes of `BOUNDS` that read a body; the others answer without reading one."""


async def test_a_chunked_body_is_read_only_up_to_the_bound(edge: Edge) -> None:
    """Sent slowly in chunks: the 413 comes once the bound is passed, the rest never read. A
    route that reads no body (or refuses before reading it) answers at once and closes: the
    server read and dropped the rest for as long as a client sent it."""
    for method, path, headers, bound in BOUNDS:
        answer = await asyncio.to_thread(_chunked, edge.port, method, path, headers, bound)
        if path.startswith("/api/v1"):
            assert answer.status == 411, answer.head  # the operator API wants a length
            continue
        if path in READ_BY_THE_ROUTE:
            assert answer.status == 413, (path, answer.head)
            assert json.loads(answer.body)["error"]["code"] == "too_large", path
        else:
            assert answer.status in (200, 400, 404), (path, answer.head)
            assert answer.sent < 1024 * 1024, path  # answered at once
        assert answer.closed, path
        assert answer.sent < bound + 4 * 1024 * 1024, path  # socket buffers bound what was sent


STALLS: list[tuple[str, dict[str, str], str]] = [
    # (path, headers, framing): every route that reads a body, with each framing it takes
    *(
        (path, JSON, framing)
        for path in sorted(READ_BY_THE_ROUTE)
        for framing in ("Content-Length: 1000", "Transfer-Encoding: chunked")
    ),
    ("/api/v1/lanes/ln_x/abort", {**AS_OPERATOR, **JSON}, "Content-Length: 1000"),
]


def _stalled(port: int, path: str, headers: dict[str, str], framing: str) -> Answer:
    """A head and the first bytes of its body, then nothing; the answer, and when it came."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        began = time.monotonic()
        sock.sendall(_head("POST", path, headers, framing))
        sock.sendall(b'5\r\n{"tex\r\n' if "chunked" in framing else b'{"tex')
        answer = _read_answer(sock)
        answer.took_s = time.monotonic() - began
        answer.closed = _closed(sock, within_s=1.0)
        return answer


def _trickled(port: int, path: str, headers: dict[str, str]) -> Answer:
    """A chunked body sent 10 bytes every tenth of a second (100 bytes a second)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        began = time.monotonic()
        sock.sendall(_head("POST", path, headers, "Transfer-Encoding: chunked"))
        while time.monotonic() - began < 8:
            try:
                sock.sendall(b"a\r\n" + b" " * 10 + b"\r\n")
            except (BrokenPipeError, ConnectionResetError):
                break
            sock.settimeout(0.1)
            with contextlib.suppress(TimeoutError, BlockingIOError):
                if sock.recv(1, socket.MSG_PEEK):
                    break
        sock.settimeout(5)
        answer = _read_answer(sock)
        answer.took_s = time.monotonic() - began
        return answer


async def test_a_body_that_stalls_or_trickles_is_cut_on_every_route(edge: Edge) -> None:
    """A chunked body was read whole before any route ran, with no time bound: one that never
    ended held its connection for good, on every route and before any login, and ten
    thousand of them took every file descriptor (an outside probe). The webhook's and the
    sign-in's bodies had no time bound with a length either."""
    edge.service.bodies.pace = BodyPace(idle_s=0.5, grace_s=1.0, min_rate=1_000)
    for path, headers, framing in STALLS:
        answer = await asyncio.to_thread(_stalled, edge.port, path, headers, framing)
        assert answer.status == 408, (path, framing, answer.head)
        code = json.loads(answer.body)["error"]["code"]
        assert code == ("request_timeout" if path.startswith("/api/") else "too_slow"), path
        assert answer.took_s < 3 and answer.closed, (path, framing, answer)
    answer = await asyncio.to_thread(_trickled, edge.port, "/web/threads/t1/messages", JSON)
    assert answer.status == 408, answer.head
    assert "bytes in" in json.loads(answer.body)["error"]["message"]
    assert 1.0 < answer.took_s < 4, answer.took_s
    async with httpx.AsyncClient(base_url=edge.url, timeout=10) as http:  # the others go on
        response = await http.post("/web/threads/t1/messages", json={"text": "still here"})
        assert response.status_code == 202, response.text


async def test_a_route_refuses_a_chunked_upload_before_reading_it(edge: Edge) -> None:
    """A chunked upload was read whole (36 MiB) before its route could refuse it: thirty at
    once took 1.2 GB, each then refused for want of a slot or a login (an outside probe)."""
    for headers in (
        {"content-type": "text/plain"},
        {"content-type": "application/json", "Sec-Fetch-Site": "cross-site"},
    ):
        answer = await asyncio.to_thread(
            _chunked, edge.port, "POST", "/web/uploads/t1", headers, 36 * 1024 * 1024
        )
        assert answer.status in (403, 415), answer.head
        assert answer.sent < 1024 * 1024 and answer.closed, answer  # not its 36 MiB


async def test_a_body_still_coming_when_the_drain_begins_is_told_to_come_again(
    edge: Edge,
) -> None:
    """It was held to the end of the drain, then cut unanswered, and each logged an error."""
    stalled = asyncio.create_task(
        asyncio.to_thread(
            _stalled, edge.port, "/web/threads/t1/messages", JSON, "Transfer-Encoding: chunked"
        )
    )
    await asyncio.sleep(0.5)
    edge.service.bodies.stop()
    answer = await stalled
    assert answer.status == 503, answer.head
    assert json.loads(answer.body)["error"]["code"] == "unavailable"
    assert "retry-after: 5" in answer.head.lower()
    assert answer.took_s < 2 and answer.closed, answer


async def test_a_chunked_body_within_the_bound_reaches_the_route(edge: Edge) -> None:
    async def pieces() -> AsyncIterator[bytes]:
        yield b'{"text": '
        yield b'"in pieces"}'

    async with httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        response = await http.post("/web/threads/t1/messages", content=pieces(), headers=JSON)
        assert response.status_code == 202, response.text


async def test_a_route_that_fails_answers_json_500_and_the_log_says_where(
    edge: Edge, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A channel's 500 was uvicorn's plain text, and the log held only the exception's type."""
    web = edge.service.adapters["web"]
    assert isinstance(web, WebChannel)

    async def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("what the person wrote: a secret plan")

    monkeypatch.setattr(web.mailbox, "read", broken)
    with caplog.at_level(logging.ERROR, logger="gateway.ops"):
        async with httpx.AsyncClient() as http:
            response = await http.get(f"{edge.url}/web/threads/t1")
    assert response.status_code == 500
    rid = response.headers["x-request-id"]
    assert response.json() == {
        "error": {"code": "internal", "message": f"internal error (request id {rid} in the log)"}
    }
    [failed] = [r.msg for r in caplog.records if r.getMessage() == "request failed"]
    fields = getattr(failed, "fields", {})
    assert (fields["request_id"], fields["route"], fields["method"]) == (
        rid,
        "/web/threads/{thread}",
        "GET",
    )
    assert fields["error"] == "RuntimeError" and "broken" in fields["at"][-1]
    assert "secret plan" not in repr(fields)


@pytest.mark.parametrize("first", ["the drain", "the timeout"])
async def test_a_drain_and_a_body_s_timeout_at_one_moment_answer_it_once(first: str) -> None:
    """Both orders answer the body once, 503 (the drain is what the route hears about first);
    when the body's timer had fired just before, the drain's call raised (an expiring
    timeout cannot be rescheduled) and the stop of the whole service with it."""
    watch = BodyWatch(BodyPace(idle_s=0.2))
    never = asyncio.Event()
    waiting = asyncio.Event()

    async def receive() -> dict[str, object]:
        waiting.set()
        await never.wait()
        return {"type": "http.disconnect"}

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "path": "/x", "method": "POST", "headers": [(b"content-length", b"9")]}
    reading = asyncio.create_task(BodyLimit(route, {}, watch=watch)(scope, receive, send))
    await waiting.wait()
    [wait] = watch._waits
    deadline = wait.when()
    assert deadline is not None
    stopped: list[BaseException | None] = []

    def stop() -> None:
        try:
            watch.stop()
        except BaseException as exc:  # what the service's stop would have raised
            stopped.append(exc)
        else:
            stopped.append(None)

    if first == "the drain":
        stop()
    else:  # the timer fires first (scheduled first for that instant), then the drain's call
        asyncio.get_running_loop().call_at(deadline, stop)
    await reading
    assert stopped == [None]
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [503]
