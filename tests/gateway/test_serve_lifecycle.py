"""`gateway serve`'s life as a process: the banner, hang-ups, drains, Ctrl-C twice, a kill.

Each test runs real processes. What is asserted is what a person or a script sees: the exit
status, stderr (JSON log lines and the banner, never a traceback) and how soon the next process
answers a session the previous one held, with the lease at its default length (30 s).
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters.web import open_mailbox
from tests.gateway.mcp.test_source import alive, pids
from tests.support.gateway_process import ROOT, GatewayProcess, not_json
from tests.support.redis_server import RedisServer, free_port
from tests.support.webhook_peer import WebhookPeer, new_secret

AGENT = "tests.support.gateway_agent"
NEXT_PROCESS_S = 5.0
"""The next process answers a session the previous one held within this of being ready
(whatever the lease: it is left at its default, 30 s)."""


def _sqlite(tmp_path: Path, **more: str) -> dict[str, str]:
    return {
        "store_url": f"sqlite:///{tmp_path}/store.db",
        "broker_url": f"sqlite:///{tmp_path}/broker.db",
        "web_url": f"sqlite:///{tmp_path}/web.db",
        "plugin": AGENT,
        **more,
    }


def _post(gateway: GatewayProcess, thread: str, text: str) -> None:
    response = httpx.post(
        f"{gateway.url}/web/threads/{thread}/messages", json={"text": text}, timeout=10
    )
    assert response.status_code == 202, response.text


async def _answers(web_url: str, thread: str) -> list[Any]:
    mailbox = open_mailbox(web_url)
    try:
        items = await mailbox.read("default", thread, after=0, limit=100)
    finally:
        await mailbox.close()
    return [item for item in items if item.kind not in ("message", "decision")]


async def _answered_within(
    gateway: GatewayProcess, web_url: str, thread: str, seconds: float
) -> list[Any]:
    """The thread's answers, once there are any; fails after `seconds`."""
    deadline = time.monotonic() + seconds
    while not (answers := await _answers(web_url, thread)):
        assert time.monotonic() < deadline, f"no answer in {seconds} s:\n{gateway.tail(60)}"
        await asyncio.sleep(0.05)
    return answers


async def _running_tool(gateway: GatewayProcess) -> None:
    """Wait until the worker runs a tool (the lane's step is in flight)."""
    deadline = time.monotonic() + 10
    while '"session taken"' not in gateway.log_path.read_text():
        assert time.monotonic() < deadline, gateway.tail()
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.4)  # the model step, then the tool starts


def _until_closed(link: socket.socket, timeout_s: float) -> bytes:
    """What the server sent on `link` until it closed it (each read within `timeout_s`)."""
    link.settimeout(timeout_s)
    received = b""
    while chunk := link.recv(65536):
        received += chunk
    return received


def _log(gateway: GatewayProcess) -> list[dict[str, Any]]:
    lines = gateway.log_path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


# -- item 15: "serving on" means serving -----------------------------------------------------


def test_a_script_that_connects_when_the_banner_appears_is_served(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        **{f"GATEWAY_{k.upper()}": v for k, v in _sqlite(tmp_path).items()},
    }
    env.pop("GATEWAY_CONFIG", None)
    for attempt in range(3):
        port = _free_port()
        with subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--port", str(port)],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        ) as proc:
            assert proc.stderr is not None
            for raw in proc.stderr:
                if raw.startswith(b"gateway: serving on "):
                    break
            else:
                pytest.fail("no banner")
            with socket.create_connection(("127.0.0.1", port), timeout=5) as link:  # at once
                link.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                assert link.recv(100).startswith(b"HTTP/1.1 200 "), attempt
            proc.send_signal(signal.SIGTERM)
            proc.stderr.read()
            assert proc.wait(timeout=20) == 0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


# -- item 8: no traceback from outside ----------------------------------------------------------

_BODY = b'{"text": "he'
HANG_UPS: dict[str, tuple[bytes, bytes]] = {
    # (head, what is sent of the rest) then the client closes (or resets) the connection
    "a web message, mid-body": (
        b"POST /web/threads/x/messages HTTP/1.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n",
        _BODY,
    ),
    "a web decision, mid-body": (
        b"POST /web/threads/x/decisions HTTP/1.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n",
        _BODY,
    ),
    "a web message, mid-chunk": (
        b"POST /web/threads/x/messages HTTP/1.1\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n",
        b"400\r\n" + _BODY,
    ),
    "an operator action, mid-body": (
        b"POST /api/v1/lanes/web-default/web%3Ax/abort HTTP/1.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1000\r\n",
        _BODY,
    ),
    "mid-headers": (b"POST /web/threads/x/messages HTTP/1.1\r\nContent-Le", b""),
    "an event stream": (b"GET /web/threads/x/events HTTP/1.1\r\n", b""),
    "TLS to the plain port": (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", b""),
    "not HTTP": (b"HELLO gateway\r\n", b""),
}


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
async def test_a_client_that_hangs_up_leaves_json_lines_only(tmp_path: Path, reset: bool) -> None:
    gateway = GatewayProcess("gw", tmp_path, _sqlite(tmp_path)).start()
    try:
        for head, rest in HANG_UPS.values():
            with socket.create_connection(("127.0.0.1", gateway.port)) as link:
                complete = head.endswith(b"\r\n")
                host = f"Host: 127.0.0.1:{gateway.port}\r\n\r\n".encode() if complete else b""
                link.sendall(head + host + rest)
                await asyncio.sleep(0.3)  # the app reads what came, and waits for more
                if reset:
                    link.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
        await asyncio.sleep(0.3)
        assert gateway.terminate() == 0
    finally:
        gateway.stop()
    log = gateway.log_path.read_text()
    assert not_json(log) == [], log
    hung_up = [line for line in _log(gateway) if line["event"] == "client disconnected"]
    assert len(hung_up) >= 2  # the two bodies the web channel was reading
    assert {line["level"] for line in hung_up} == {"info"}
    assert not [line for line in _log(gateway) if line["level"] == "error"], log


async def test_a_body_still_coming_when_the_drain_begins_is_answered_and_logs_no_error(
    tmp_path: Path,
) -> None:
    """Such a request held the stop for the whole drain, was then cut unanswered, and each
    left an error line ("Exception in ASGI application") and "Cancel %s running task(s)"."""
    gateway = GatewayProcess("gw", tmp_path, _sqlite(tmp_path, drain_seconds="5")).start()
    links = []
    try:
        for name in ("a web message, mid-body", "a web message, mid-chunk"):
            head, rest = HANG_UPS[name]
            link = socket.create_connection(("127.0.0.1", gateway.port))
            link.sendall(head + f"Host: 127.0.0.1:{gateway.port}\r\n\r\n".encode() + rest)
            links.append(link)
        await asyncio.sleep(0.3)  # the web channel reads what came, and waits for more
        began = time.monotonic()
        status = gateway.terminate()
        took = time.monotonic() - began
        for link in links:
            received = _until_closed(link, 2)
            assert received.startswith(b"HTTP/1.1 503"), received
            assert b'"unavailable"' in received and b"send it again" in received
    finally:
        for link in links:
            link.close()
        gateway.stop()
    assert status == 0
    assert took < 3, gateway.tail()  # not held for the drain's 5 s
    log = gateway.log_path.read_text()
    assert not_json(log) == [], log
    assert not [line for line in _log(gateway) if line["level"] == "error"], log


# -- item 13: the shutdown setting bounds the whole stop ---------------------------------------


async def test_an_open_event_stream_ends_when_the_drain_begins(tmp_path: Path) -> None:
    settings = _sqlite(tmp_path, drain_seconds="2", shutdown_seconds="3")
    gateway = GatewayProcess("gw", tmp_path, settings).start()
    try:
        _post(gateway, "slow", "/slow 10000")  # outlasts the drain: it is cut
        streams = [socket.create_connection(("127.0.0.1", gateway.port)) for _ in range(3)]
        get = f"GET /web/threads/slow/events HTTP/1.1\r\nHost: 127.0.0.1:{gateway.port}\r\n\r\n"
        for link in streams:  # a thread page left open (three tabs)
            link.sendall(get.encode())
        await _running_tool(gateway)
        began = time.monotonic()
        status = gateway.terminate()
        took = time.monotonic() - began
        for link in streams:
            received = _until_closed(link, 1)
            assert received.endswith(b"0\r\n\r\n")  # the stream ended (last chunk), not cut
            link.close()
    finally:
        gateway.stop()
    assert status == 0
    assert 1.8 < took < 3.0, gateway.tail()  # the step had its drain, the stop its bound
    assert not_json(gateway.log_path.read_text()) == []


async def test_mcp_servers_deaf_to_their_input_and_to_sigterm_stop_within_the_budget(
    tmp_path: Path,
) -> None:
    """Two stdio servers that run on after their input closes, one ignoring SIGTERM too, were
    stopped after the deliverer's drain with the protocol's full waits (about 4.5 s): the
    stop overran its 3 s, exit 1 "before everything was released". Each wait is now a share
    of the time left, and the servers stop beside the deliverer's drain."""
    marks = tmp_path / "marks"
    marks.mkdir()
    server = [sys.executable, "-m", "tests.support.mcp_servers", "--stdio", "--deaf"]
    deaf = [*server, "--marks", str(marks)]
    stubborn = ["sh", "-c", "trap '' TERM; exec " + " ".join([*server, "--marks", str(marks)])]
    servers = [
        {"name": name, "command": command[0], "args": command[1:], "cwd": str(ROOT)}
        for name, command in (("deaf", deaf), ("stubborn", stubborn))
    ]
    settings = _sqlite(
        tmp_path, drain_seconds="2", shutdown_seconds="3", mcp_servers=json.dumps(servers)
    )
    gateway = GatewayProcess("gw", tmp_path, settings).start()
    try:
        assert len(pids(marks)) == 2, gateway.tail()
        _post(gateway, "slow", "/slow 10000")  # outlasts the drain: the stop uses its budget
        await _running_tool(gateway)
        began = time.monotonic()
        status = gateway.terminate()
        took = time.monotonic() - began
    finally:
        gateway.stop()
        for pid in pids(marks):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert status == 0, gateway.tail()
    assert took < 3.5, gateway.tail()
    log = gateway.log_path.read_text()
    assert "stopped without draining" not in log, log
    assert not_json(log) == [], log
    assert not [pid for pid in pids(marks) if alive(pid)]


async def test_a_tool_that_blocks_the_loop_is_named_in_the_log(tmp_path: Path) -> None:
    """A tool's time.sleep froze every thread and the operator API, and the log said only
    that a ticket lapsed (an outside probe): the loop's watch names where it is held."""
    gateway = GatewayProcess("gw", tmp_path, _sqlite(tmp_path)).start()
    try:
        _post(gateway, "careless", "/block 6000")
        deadline = time.monotonic() + 30
        while '"event loop unblocked"' not in gateway.log_path.read_text():
            assert time.monotonic() < deadline, gateway.tail()
            await asyncio.sleep(0.1)
    finally:
        gateway.stop()
    [blocked] = [line for line in _log(gateway) if line["event"] == "event loop blocked"]
    assert blocked["level"] == "warning"
    assert blocked["where"][-1].startswith("gateway_agent.py:")
    assert blocked["where"][-1].endswith(" in slow")  # the tool's own function
    [unblocked] = [line for line in _log(gateway) if line["event"] == "event loop unblocked"]
    assert unblocked["seconds"] >= 5.5


# -- item 12: a drain hands its work over at once ---------------------------------------------


@pytest.mark.parametrize(
    ("backend", "lease"), [("sqlite", "30"), ("sqlite", "300"), ("redis", "30"), ("redis", "300")]
)
async def test_the_next_process_resumes_what_a_drain_cut_at_once(
    tmp_path: Path, request: pytest.FixtureRequest, backend: str, lease: str
) -> None:
    """Within `NEXT_PROCESS_S` of the next start, whatever the lease (the drain released it)."""
    settings = _sqlite(tmp_path, drain_seconds="0.5", shutdown_seconds="5", lease_seconds=lease)
    if backend == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        prefix: str = request.getfixturevalue("redis_prefix")
        for part in ("store", "broker", "web"):
            settings[f"{part}_url"] = f"{server.url}?prefix={prefix}{part[0]}"
    gateway = GatewayProcess("gw", tmp_path, settings).start()
    try:
        _post(gateway, "long", "/slow 1500")
        await _running_tool(gateway)
        assert gateway.terminate() == 0  # the drain cut the step
        assert await _answers(settings["web_url"], "long") == []
        gateway.restart()
        answers = await _answered_within(gateway, settings["web_url"], "long", NEXT_PROCESS_S)
    finally:
        gateway.stop()
    assert [a.text for a in answers] == ["Done: slept 1500 ms"]


# -- item 14: Ctrl-C twice, and a holder that died ---------------------------------------------


def _signalled_twice(gateway: GatewayProcess, signals: tuple[int, int]) -> tuple[int, str]:
    """Start `gateway` on a terminal, let it run a step, signal it twice: (status, output)."""
    terminal, tty = pty.openpty()
    with subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--port", str(gateway.port)],
        cwd=gateway.directory,
        env={**gateway.env, "PYTHONPATH": str(ROOT)},
        stdin=tty,
        stdout=tty,
        stderr=tty,
    ) as proc:
        os.close(tty)
        shown = b""

        def read(seconds: float) -> None:
            nonlocal shown
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                if select.select([terminal], [], [], 0.05)[0]:
                    try:
                        shown += os.read(terminal, 65536)
                    except OSError:  # the other side is closed: all was read
                        return

        gateway.wait_ready()
        _post(gateway, "long", "/slow 1500")
        deadline = time.monotonic() + 10
        while b'"session taken"' not in shown:
            assert time.monotonic() < deadline, shown
            read(0.05)
        read(0.4)  # the model step, then the tool starts
        proc.send_signal(signals[0])  # drains: the step would get 10 s
        read(0.3)
        proc.send_signal(signals[1])  # cuts it
        status = proc.wait(timeout=5)
        read(0.5)
    os.close(terminal)
    return status, shown.decode(errors="replace").replace("\r\n", "\n")


# the two signals -> exit status, the one line's start
TWICE = {
    "ctrl-c twice": ((signal.SIGINT, signal.SIGINT), 130, "(second Ctrl-C)"),
    "sigterm twice": ((signal.SIGTERM, signal.SIGTERM), 143, "(second SIGTERM)"),
    "sigterm, then ctrl-c": ((signal.SIGTERM, signal.SIGINT), 130, "(second Ctrl-C)"),
}


@pytest.mark.parametrize("case", TWICE, ids=list(TWICE))
async def test_a_second_signal_exits_at_once_with_one_line_and_the_next_start_resumes_at_once(
    tmp_path: Path, case: str
) -> None:
    signals, expected, said = TWICE[case]
    settings = _sqlite(tmp_path)  # drain 10 s, lease 30 s: the defaults
    gateway = GatewayProcess("gw", tmp_path, settings)
    status, text = await asyncio.to_thread(_signalled_twice, gateway, signals)
    assert status == expected, text
    assert "Traceback" not in text
    [line] = not_json(text)
    assert line.startswith(f"gateway: stopped at once {said}: running work was cut"), text
    if case != "ctrl-c twice":
        return  # the next start is the same as after Ctrl-C twice
    gateway.restart()
    try:
        answers = await _answered_within(gateway, settings["web_url"], "long", NEXT_PROCESS_S)
    finally:
        gateway.stop()
    assert [a.text for a in answers] == ["Done: slept 1500 ms"]


def test_a_second_ctrl_c_exits_at_once_while_the_store_does_not_answer(tmp_path: Path) -> None:
    """With Redis stalled, the second Ctrl-C waited out GATEWAY_SHUTDOWN_SECONDS (15 s) to
    release what a stalled store would never take, and exited 1, not "at once" with 130."""
    server = RedisServer(tmp_path / "redis").start()
    url = f"{server.url}?prefix=stall"
    settings = {"store_url": url, "broker_url": url, "web_url": url, "plugin": AGENT}
    gateway = GatewayProcess("gw", tmp_path, settings).start()
    assert server.process is not None and gateway.process is not None
    try:
        _post(gateway, "t", "hello")  # a session taken, its lease held
        time.sleep(0.5)
        os.kill(server.process.pid, signal.SIGSTOP)
        gateway.process.send_signal(signal.SIGINT)
        time.sleep(0.5)
        began = time.monotonic()
        gateway.process.send_signal(signal.SIGINT)
        status = gateway.process.wait(timeout=12)
        took = time.monotonic() - began
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
        gateway.stop()
        server.stop()
    assert status == 130, gateway.tail()
    assert took < 6, took  # the grace of a cut, not the 15 s budget
    assert "stopped at once (second Ctrl-C) before everything was released" in gateway.tail()


async def test_a_holder_killed_on_this_machine_is_taken_over_at_once(tmp_path: Path) -> None:
    settings = _sqlite(tmp_path)  # lease 30 s
    gateway = GatewayProcess("gw", tmp_path, settings).start()
    try:
        _post(gateway, "long", "/slow 1500")
        await _running_tool(gateway)
        gateway.kill()  # releases nothing
        gateway.restart()
        answers = await _answered_within(gateway, settings["web_url"], "long", NEXT_PROCESS_S)
    finally:
        gateway.stop()
    assert [a.text for a in answers] == ["Done: slept 1500 ms"]
    said = {line["event"]: line for line in _log(gateway)}
    assert said["sessions of a stopped process taken over"]["sessions"] == 1
    assert said["lease taken over"]["why"] == "its process no longer runs on this machine"


async def test_a_reply_in_flight_when_its_process_was_killed_is_sent_again_at_once(
    tmp_path: Path,
) -> None:
    """The session was taken over at once, but the reply its process was POSTing waited out
    the outbox lease (a minute) before it was sent again (an outside probe): a thread's next
    reply could come before it. The next process releases a gone one's deliveries (D397)."""
    secret = new_secret("lifecycle")
    async with WebhookPeer(secret=secret) as peer:
        peer.lose_ack(1, hang=True)  # the first POST is taken, and never answered
        settings = _sqlite(tmp_path, webhook_url=peer.url, webhook_secret=secret)
        gateway = GatewayProcess("gw", tmp_path, settings).start()
        try:
            body, headers = peer.signed({"thread": "t1", "text": "hello", "author": {"id": "u1"}})
            async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:
                sent = await http.post("/webhook/events", content=body, headers=headers)
            assert sent.status_code == 202, sent.text
            [first] = await peer.wait_posts(1)
            gateway.kill()  # mid-POST: its claim on the delivery is never settled
            gateway.restart()
            posts = await peer.wait_posts(2, timeout_s=NEXT_PROCESS_S)
        finally:
            gateway.stop()
    assert posts[1].webhook_id == first.webhook_id  # the same reply, under its webhook-id
    said = {line["event"]: line for line in _log(gateway)}
    assert said["deliveries of a stopped process taken over"]["deliveries"] == 1


@pytest.mark.timeout(180)  # three process starts, about 6 s each on a slow machine
def test_a_port_taken_between_its_pick_and_the_bind_is_picked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rig's free port may be bound by another test's server first (seen in CI): the
    process says so in one line, and the rig's first start picks another port."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    picks = iter([busy])
    monkeypatch.setattr(
        "tests.support.gateway_process.free_port", lambda: next(picks, None) or free_port()
    )
    gateway = GatewayProcess("gw", tmp_path, _sqlite(tmp_path))
    given = GatewayProcess("given", tmp_path / "given", _sqlite(tmp_path / "given"), port=busy)
    (tmp_path / "given").mkdir()
    try:
        assert gateway.port == busy
        gateway.start()
        assert gateway.port != busy
        with pytest.raises(RuntimeError, match="Address already in use"):
            given.start()  # a port the caller chose is not changed behind its back
    finally:
        gateway.stop()
        given.stop()
        taken.close()


@pytest.mark.parametrize("host", ["::1", "127.0.0.1"])
def test_an_ipv6_host_can_be_listened_on(host: str) -> None:
    """``GATEWAY_HOST=::1`` was refused: the check before uvicorn binds tried it as IPv4."""
    from gateway.serve import _cannot_listen

    assert _cannot_listen(host, free_port()) is None
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert _cannot_listen("127.0.0.1", port) is not None  # a busy port is still said
