"""McpTools against the test server over Streamable HTTP: credentials, refusals, restarts.

The test server (`tests.support.mcp_servers.HttpServer`) runs in a process of its own and
refuses any request without ``Authorization: Bearer <its token>``. The gateway's side takes the
token from the server's settings (``bearer_token``, or an ``Authorization`` header), and a wrong
one is a health error that says what to fix without showing the token.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.mcp import http_bodies, stdio
from gateway.mcp.connection import Backoff
from gateway.mcp.settings import McpServer
from gateway.mcp.source import McpTools
from gateway.redact import Redactor
from harness_core.clock import SystemClock
from harness_core.messages import TextPart
from harness_core.tools import ToolContext, ToolOutput
from tests.support.mcp_servers import NEEDS_SCOPE, HttpServer
from tests.support.redis_server import free_port

TOKEN = "http-bearer-secret-7f3a9c"
WRONG = "http-wrong-secret-1b2c3d"


@pytest.fixture
async def http_server() -> AsyncIterator[HttpServer]:
    server = await HttpServer(free_port(), token=TOKEN).start()
    yield server
    await server.kill()


def settings(url: str, **more: Any) -> McpServer:
    return McpServer.model_validate({"name": "remote", "url": url, **more})


def tools(*servers: McpServer, **more: Any) -> McpTools:
    secrets = [secret for server in servers for secret in server.secrets()]
    return McpTools(servers, clock=SystemClock(), redact=Redactor(secrets).redact, **more)


async def call(source: McpTools, name: str, args: dict[str, Any], key: str = "k1") -> ToolOutput:
    found = {t.name: t for t in source.tools()}[name]
    ctx = ToolContext(
        session_id="s", lane="l", run_id="r", tool_call_id="c", tool_name=name, idempotency_key=key
    )
    output = await found.execute(args, ctx)
    assert isinstance(output, ToolOutput)
    return output


def text(output: ToolOutput) -> str:
    return "".join(part.text for part in output.content if isinstance(part, TextPart))


async def until(check: Any, what: str) -> None:
    for _ in range(800):
        if check():
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"never: {what}")


@pytest.mark.parametrize("how", ["bearer_token", "headers"])
async def test_the_token_from_the_settings_reaches_the_server(
    http_server: HttpServer, how: str
) -> None:
    if how == "bearer_token":
        server = settings(http_server.url, bearer_token=TOKEN)
    else:
        server = settings(http_server.url, headers={"Authorization": f"Bearer {TOKEN}"})
    source = tools(server)
    await source.start()
    try:
        health = source.health()[0]
        assert (health.state, health.transport, health.target) == (
            "ready",
            "http",
            http_server.url,
        )
        assert len(source.tools()) == 12
        assert text(await call(source, "remote.echo", {"text": "over http"})) == "echo: over http"
        assert text(await call(source, "remote.key", {}, key="call_http_1")) == "call_http_1"
        assert text(await call(source, "remote.add", {"a": 1, "b": 2})) == '{"sum":3}'
    finally:
        await source.close()


async def test_a_wrong_token_is_a_clear_health_error_without_the_secret(
    http_server: HttpServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    source = tools(
        settings(http_server.url, bearer_token=WRONG), backoff=Backoff(first_s=0.05, max_s=0.1)
    )
    await source.start()
    try:
        health = source.health()[0]
        assert health.state == "restarting" and source.tools() == ()
        assert health.last_error == (
            "the server answered HTTP 401 Unauthorized: check the server's bearer_token or headers"
        )
        await until(lambda: source.health()[0].restarts >= 2, "tried again with backoff")
    finally:
        await source.close()
    assert WRONG not in caplog.text and WRONG not in repr(source.health())


async def test_a_server_that_goes_away_is_tried_with_backoff_until_it_is_back(
    http_server: HttpServer,
) -> None:
    delays: list[float] = []

    async def sleep(seconds: float) -> None:
        delays.append(seconds)
        await asyncio.sleep(seconds)

    source = tools(
        settings(http_server.url, bearer_token=TOKEN),
        backoff=Backoff(first_s=0.05, max_s=0.2),
        sleep=sleep,
    )
    await source.start()
    try:
        assert text(await call(source, "remote.echo", {"text": "one"})) == "echo: one"
        await http_server.kill()
        gone = await call(source, "remote.echo", {"text": "two"})
        # its request never connected: the call was not made (it read "lost during the
        # call ... may have had its effect", the words of a call cut mid-way)
        assert gone.is_error and "MCP server 'remote' could not be reached" in text(gone)
        assert "the call of 'echo' was not made" in text(gone)
        assert "may have had its effect" not in text(gone)
        await until(lambda: source.health()[0].restarts >= 4, "tried again, and again")
        health = source.health()[0]
        assert health.state in ("restarting", "starting") and health.last_error
        assert delays[:4] == [0.05, 0.1, 0.2, 0.2]  # doubling to the cap
        down = await call(source, "remote.echo", {"text": "three"})
        assert down.is_error and "is down" in text(down)

        await http_server.start()
        await until(lambda: source.health()[0].state == "ready", "connected again")
        assert text(await call(source, "remote.echo", {"text": "four"})) == "echo: four"
    finally:
        await source.close()


async def test_a_server_that_goes_away_during_a_call_may_have_made_it(tmp_path: Path) -> None:
    """The other order: the request reached the server, which then went away."""
    server = await HttpServer(free_port(), token=TOKEN, marks=tmp_path).start()
    source = tools(settings(server.url, bearer_token=TOKEN), backoff=Backoff(first_s=5))
    await source.start()
    try:
        running = asyncio.ensure_future(call(source, "remote.hang", {}))
        await until(lambda: any(tmp_path.glob("call-hang-*")), "the server has the call")
        await server.kill()
        cut = await asyncio.wait_for(running, 30)
    finally:
        await source.close()
        await server.kill()  # once more if the test failed before (idempotent)
    assert cut.is_error and "may have had its effect" in text(cut)
    assert "was not made" not in text(cut)


async def test_an_idle_server_that_went_away_is_noticed_by_a_ping(http_server: HttpServer) -> None:
    source = tools(
        settings(http_server.url, bearer_token=TOKEN),
        backoff=Backoff(first_s=0.05, max_s=0.1),
        ping_every_s=0.1,
    )
    await source.start()
    try:
        await http_server.kill()  # no call is made: only the ping can tell
        await until(lambda: source.health()[0].state == "restarting", "noticed")
        await http_server.start()
        await until(lambda: source.health()[0].state == "ready", "connected again")
        assert text(await call(source, "remote.echo", {"text": "back"})) == "echo: back"
    finally:
        await source.close()


async def test_a_busy_server_is_not_pinged_out_of_its_running_call(
    http_server: HttpServer,
) -> None:
    """The idle ping went out during calls too: a server too busy to answer it in time had its
    session torn down, and the call running there was cut."""
    source = tools(
        settings(http_server.url, bearer_token=TOKEN, start_timeout_seconds=1),
        ping_every_s=0.1,
    )
    await source.start()
    try:
        done = await call(source, "remote.hang", {"block": 2.5})
        assert not done.is_error and text(done) == "done blocking", text(done)
        assert source.health()[0].restarts == 0
    finally:
        await source.close()


async def test_a_server_that_restarted_between_calls_is_connected_again_at_the_refusal(
    http_server: HttpServer,
) -> None:
    """After a redeploy the server no longer knows the session: every call was refused
    "Session not found" while health said ready, until the idle ping, 30 s on."""
    source = tools(
        settings(http_server.url, bearer_token=TOKEN), backoff=Backoff(first_s=0.05, max_s=0.1)
    )
    await source.start()
    try:
        assert text(await call(source, "remote.echo", {"text": "before"})) == "echo: before"
        await http_server.kill()
        await http_server.start()  # the same address, a new process: no session of ours
        refused = await call(source, "remote.echo", {"text": "during"})
        assert refused.is_error and "HTTP 404" in text(refused), text(refused)
        assert "the call was not made" in text(refused)
        await until(lambda: source.health()[0].restarts >= 1, "connected again")
        await until(lambda: source.health()[0].state == "ready", "ready again")
        assert text(await call(source, "remote.echo", {"text": "after"})) == "echo: after"
    finally:
        await source.close()


async def test_one_call_s_403_leaves_the_session_and_the_calls_in_flight_alone(
    http_server: HttpServer,
) -> None:
    """A 403 for one thread's call (a scope that tool needs) made the connection again, and
    another thread's healthy call in flight was cut: "lost during the call (the server exited
    or closed its output) ... may have had its effect" (an outside probe)."""
    source = tools(settings(http_server.url, bearer_token=TOKEN))
    await source.start()
    try:
        busy = asyncio.ensure_future(call(source, "remote.hang", {"block": 1.5}, key="k-busy"))
        await asyncio.sleep(0.3)  # it is in flight
        refused = await call(source, "remote.echo", {"text": NEEDS_SCOPE}, key="k-scoped")
        assert refused.is_error and "HTTP 403" in text(refused), text(refused)
        assert text(refused).endswith("the call was not made")
        done = await busy
        assert not done.is_error and text(done) == "done blocking", text(done)
        assert source.health()[0].restarts == 0
    finally:
        await source.close()


async def test_a_server_without_the_optional_stream_is_not_blamed_for_its_405(
    tmp_path: Path,
) -> None:
    """The GET of the optional event stream may be answered 405 (the spec allows it): later
    faults were then said as "the server answered HTTP 405 Method Not Allowed (...)"."""
    server = await HttpServer(free_port(), token=TOKEN, marks=tmp_path, no_stream=True).start()
    source = tools(
        settings(server.url, bearer_token=TOKEN),
        backoff=Backoff(first_s=30),
        ping_every_s=0.1,
    )
    await source.start()
    try:
        await asyncio.sleep(0.3)  # the stream's GET is answered meanwhile; no call is made
        await server.kill()
        await until(lambda: source.health()[0].state == "restarting", "noticed")
        said = source.health()[0].last_error or ""
    finally:
        await source.close()
        await server.kill()
    assert said and "405" not in said, said


async def test_an_idle_server_that_answers_its_pings_stays_up(http_server: HttpServer) -> None:
    """The ping went through `Client.send_ping`, which warns that the 2026-07-28 protocol
    drops it: a warning in the log, and here (warnings are errors) a ping that always failed,
    so the ping test above passed whether or not the server was there."""
    source = tools(settings(http_server.url, bearer_token=TOKEN), ping_every_s=0.05)
    await source.start()
    try:
        await asyncio.sleep(1.0)  # about twenty pings
        [health] = source.health()
        assert (health.state, health.restarts, health.last_error) == ("ready", 0, None)
    finally:
        await source.close()


async def _flood(answers: str, args: dict[str, Any]) -> tuple[ToolOutput, ToolOutput, str]:
    """`flood` with `args` from a server answering as `answers` says, then `echo`, and the
    server's state after: each answer's form (an event stream, JSON, gzipped JSON)."""
    server = await HttpServer(
        free_port(), json_response=answers != "events", gzip=answers == "gzip"
    ).start()
    source = tools(settings(server.url, call_timeout_seconds=60))
    await source.start()
    try:
        flooded = await call(source, "remote.flood", args)
        after = await call(source, "remote.echo", {"text": "still here"}, key="k2")
        return flooded, after, source.health()[0].state
    finally:
        await source.close()
        await server.kill()


@pytest.mark.parametrize("answers", ["events", "json", "gzip"])
async def test_a_long_answer_is_parsed_aside_and_its_blocks_joined(
    answers: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK parsed an HTTP answer whole on the event loop: 450,000 one-letter blocks held
    every thread about 2 s. A body past a MiB is now parsed in a thread and handed on
    bounded, whether it comes as an event stream, a JSON body or a gzipped one."""
    readers: list[threading.Thread] = []
    read = stdio.read_message

    def spied(text: str) -> Any:
        readers.append(threading.current_thread())
        return read(text)

    monkeypatch.setattr(http_bodies, "read_message", spied)
    many, after, _ = await _flood(answers, {"blocks": 100_000})
    parts = [part.text for part in many.content if isinstance(part, TextPart)]
    assert parts[0] == "c\n" * 10_000  # one block (a line each), cut to what the model reads
    assert readers and threading.main_thread() not in readers
    assert text(after) == "echo: still here"


@pytest.mark.parametrize("answers", ["events", "json", "gzip"])
async def test_an_answer_past_the_bound_is_said_at_once_and_the_next_call_works(
    answers: str,
) -> None:
    """A stdio line past `MAX_MESSAGE_BYTES` was refused as it came; an HTTP answer was read
    whole however large (a gzipped one inflated whole). Now it is read to the same bound."""
    huge, after, state = await _flood(answers, {"mib": 17})
    said = text(huge)
    assert huge.is_error and "ran 'flood'" in said, said
    size = "" if answers == "gzip" else " (17.0 MiB)"  # a gzipped body is read to the bound
    assert f"its answer{size} is larger than the 16 MiB the gateway reads" in said
    assert text(after) == "echo: still here"
    assert state == "ready"  # the framing held: the connection was not dropped


@pytest.mark.parametrize("answers", ["events", "json", "gzip"])
async def test_an_answer_of_a_few_mib_comes_whole_however_it_is_sent(answers: str) -> None:
    """The SDK reads an event of at most 1 MiB: a 3 MiB answer sent as an event failed its
    call ("SSE stream failed ... the call may have had its effect") where stdio and JSON took
    it. Every transport now reads to the same bound (`MAX_MESSAGE_BYTES`)."""
    large, _, _ = await _flood(answers, {"mib": 3})
    assert not large.is_error, text(large)
    assert text(large).startswith("x" * 20_000)
