"""McpTools against real MCP servers (stdio subprocesses of the test server): tools and faults."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.mcp.connection import IDEMPOTENCY_META_KEY, MAX_TOOLS, Backoff
from gateway.mcp.settings import McpServer
from gateway.mcp.source import MANY_TOOLS, McpTools, beside
from gateway.redact import Redactor
from harness_core.clock import SystemClock
from harness_core.messages import TextPart
from harness_core.models.tool_names import ToolNameClash, ToolNames, wire_name
from harness_core.tools import Tool, ToolContext, ToolOutput
from tests.support.mcp_servers import KEY, SCHEMA

SECRET = "stdio-env-secret-value-42"
ROOT = str(Path(__file__).resolve().parents[3])


class Counted:
    """The metrics the connection reports, counted."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.restarts: list[str] = []
        self.states: list[tuple[str, bool]] = []

    def mcp_call(self, server: str, outcome: str) -> None:
        self.calls.append((server, outcome))

    def mcp_restart(self, server: str) -> None:
        self.restarts.append(server)

    def mcp_state(self, server: str, up: bool) -> None:
        self.states.append((server, up))


def stdio(name: str, marks: Path, **more: Any) -> McpServer:
    return McpServer.model_validate(
        {
            "name": name,
            "command": sys.executable,
            "args": ["-m", "tests.support.mcp_servers", "--stdio", "--marks", str(marks)],
            "env": {"MCP_TEST_SECRET": SECRET},
            "cwd": ROOT,
            **more,
        }
    )


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    path = tmp_path / "marks"
    path.mkdir()
    return path


@pytest.fixture
def counted() -> Counted:
    return Counted()


@pytest.fixture
async def source(marks: Path, counted: Counted) -> AsyncIterator[McpTools]:
    servers = [stdio("demo", marks, call_timeout_seconds=5, max_output_chars=5000)]
    tools = McpTools(
        servers,
        clock=SystemClock(),
        redact=Redactor([SECRET]).redact,
        observer=counted,
        backoff=Backoff(first_s=0.05, max_s=0.2),
    )
    await tools.start()
    yield tools
    await tools.close()


def tool(source: McpTools, name: str) -> Tool:
    return {t.name: t for t in source.tools()}[name]


def context(name: str, key: str = "call_key_1") -> ToolContext:
    return ToolContext(
        session_id="s", lane="l", run_id="r", tool_call_id="c", tool_name=name, idempotency_key=key
    )


async def call(
    source: McpTools, name: str, args: dict[str, Any] | None = None, **ctx: Any
) -> ToolOutput:
    found = tool(source, name)
    output = await found.execute(args or {}, context(name, **ctx))
    assert isinstance(output, ToolOutput)
    return output


def text(output: ToolOutput) -> str:
    return "".join(part.text for part in output.content if isinstance(part, TextPart))


async def until(check: Any, what: str) -> None:
    for _ in range(400):
        if check():
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"never: {what}")


async def test_tools_are_namespaced_paged_and_declared(source: McpTools) -> None:
    names = [t.name for t in source.tools()]
    assert len(names) == 12  # four pages of three
    assert names[:3] == ["demo.echo", "demo.add", "demo.delete"]
    echo, add, delete = (tool(source, n) for n in ("demo.echo", "demo.add", "demo.delete"))
    # untrusted: nothing replayed, the destructive one asks
    assert (echo.replay, echo.requires_approval) == ("never", False)
    assert (add.replay, add.requires_approval) == ("never", False)
    assert (delete.replay, delete.requires_approval) == ("never", True)
    schema = tool(source, "demo.schema").definition().parameters
    assert json.loads(json.dumps(schema)) == SCHEMA  # as the server gave it (frozen: tuples)
    assert echo.description == "the echo tool"


async def test_a_trusted_server_is_taken_at_its_word_and_overrides_win(marks: Path) -> None:
    server = stdio(
        "t",
        marks,
        trusted=True,
        tools=["echo", "add", "del*"],
        overrides={"add": {"approval": True, "approvers": ["alice"]}, "delete": {"disabled": True}},
    )
    source = McpTools([server], clock=SystemClock())
    await source.start()
    try:
        assert [t.name for t in source.tools()] == ["t.echo", "t.add"]
        assert tool(source, "t.echo").replay == "safe"
        add = tool(source, "t.add")
        assert (add.replay, add.requires_approval) == ("safe", True)
        assert source.approvers_for("t.add") == frozenset({"alice"})
        assert source.approvers_for("t.echo") is None
    finally:
        await source.close()


async def test_results_map_and_the_key_arrives_in_meta(source: McpTools) -> None:
    assert text(await call(source, "demo.echo", {"text": "hi"})) == "echo: hi"
    assert text(await call(source, "demo.add", {"a": 2, "b": 3})) == '{"sum":5}'
    failed = await call(source, "demo.fail")
    assert failed.is_error and text(failed) == "no such ticket"
    assert text(await call(source, "demo.key", key="call_abc123")) == "call_abc123"
    assert KEY == IDEMPOTENCY_META_KEY


async def test_a_crash_mid_call_is_an_error_then_a_restart_then_calls_work(
    source: McpTools, counted: Counted
) -> None:
    crashed = await call(source, "demo.crash")
    assert crashed.is_error and "may have had its effect" in text(crashed)
    await until(lambda: source.connection("demo").state == "ready" and counted.restarts, "restart")
    assert text(await call(source, "demo.echo", {"text": "again"})) == "echo: again"
    health = source.health()[0]
    assert health.restarts >= 1 and health.state == "ready"
    assert ("demo", "crashed") in counted.calls


async def test_a_server_s_generic_error_is_that_call_s_not_a_crash(
    source: McpTools, counted: Counted
) -> None:
    """-32000 is the SDK's code for a closed connection and a server's generic error code: a
    busy ticket store's error restarted the server and cut every call running on it."""
    hanging = asyncio.ensure_future(call(source, "demo.hang"))
    await asyncio.sleep(0.3)
    refused = await call(source, "demo.fail", {"rpc": True})
    assert refused.is_error and "the ticket store is busy" in text(refused)
    assert "may have had its effect" in text(refused)
    assert not hanging.done()  # the other call still runs on the same connection
    assert source.health()[0].restarts == 0 and not counted.restarts
    assert ("demo", "error") in counted.calls
    hanging.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await hanging


@pytest.mark.parametrize(
    ("code", "unknown"),
    [(-32603, True), (-32001, True), (42, True), (-32602, False), (-32601, False)],
)
async def test_only_an_error_before_anything_ran_reads_refused(
    source: McpTools, code: int, unknown: bool
) -> None:
    """A -32603 came after the card was charged, and the model read "refused": it may call a
    never-repeat tool again (an outside probe). Invalid arguments, no such method: refused."""
    said = text(await call(source, "demo.fail", {"rpc": True, "code": code}))
    assert "the ticket store is busy" in said
    assert ("may have had its effect" in said) is unknown, said
    assert ("did not complete" in said) is unknown and ("refused" in said) is not unknown, said


async def test_an_answer_its_own_output_schema_refuses_is_malformed_not_a_crash(
    source: McpTools, counted: Counted
) -> None:
    """The SDK's check of a result against the tool's output schema raised, and the gateway
    took it for a lost connection: the server restarted and its other calls were cut."""
    wrong = await call(source, "demo.add", {"a": "wrong"})
    assert wrong.is_error and "returned a malformed result for 'add'" in text(wrong)
    assert "Invalid structured content" in text(wrong)
    assert source.health()[0].restarts == 0 and not counted.restarts
    assert ("demo", "malformed") in counted.calls
    assert text(await call(source, "demo.add", {"a": 2, "b": 3})) == '{"sum":5}'


async def test_bytes_that_are_no_utf8_on_a_server_s_output_do_not_wedge_it(
    source: McpTools,
) -> None:
    """A stray byte ended the SDK's strict reader: the server stayed ready, every later call
    timed out, and nothing restarted it."""
    after = await call(source, "demo.malformed", {"bytes": True})
    assert text(after) == "after the garbage"
    assert text(await call(source, "demo.echo", {"text": "still here"})) == "echo: still here"


async def test_a_broken_answer_is_said_as_one_not_as_silence(
    marks: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Unterminated JSON in place of the answer waited out the call's timeout and read "did
    not answer": the server did, and the model was told it stayed silent. The parse error's log
    line named no server."""
    source = McpTools(
        [stdio("demo", marks, call_timeout_seconds=1)],
        clock=SystemClock(),
        redact=Redactor([SECRET]).redact,
    )
    await source.start()
    try:
        with caplog.at_level(logging.WARNING, logger="gateway.mcp"):
            broken = await call(source, "demo.malformed", {"unterminated": True})
    finally:
        await source.close()
    said = text(broken)
    assert broken.is_error and "returned a malformed result for 'malformed'" in said
    assert "no JSON-RPC message" in said and "did not answer" not in said
    [line] = [r for r in caplog.records if r.getMessage() == "mcp.unreadable_message"]
    assert getattr(line.msg, "fields", {})["server"] == "demo"


async def test_an_answer_too_large_to_read_is_said_at_once_and_the_next_call_works(
    marks: Path, counted: Counted
) -> None:
    """A 40 MiB answer line was read by the SDK's stdio reader in time quadratic in its
    length, on the gateway's loop, with no bound on the memory it took: every thread waited.
    Past `MAX_MESSAGE_BYTES` the line is now dropped as it comes, and the call it answers is
    told so at once (`tests/gateway/mcp/test_stdio.py` has the lines that name no request)."""
    source = McpTools(
        [stdio("demo", marks, call_timeout_seconds=60)],
        clock=SystemClock(),
        observer=counted,
    )
    await source.start()
    try:
        huge = await call(source, "demo.malformed", {"huge": 40})
        after = await call(source, "demo.echo", {"text": "still here"})
    finally:
        await source.close()
    said = text(huge)
    assert huge.is_error and "ran 'malformed'" in said, said
    assert "(40.0 MiB) is larger than the 16 MiB the gateway reads" in said
    assert "ask it for less" in said and "the call was made" in said
    assert ("demo", "too_large") in counted.calls
    assert ("demo", "timeout") not in counted.calls  # answered, not waited out
    assert text(after) == "echo: still here"
    assert counted.restarts == []  # the framing held: the server was not restarted


async def test_a_call_in_the_instant_after_the_connection_ended_says_the_server_is_down(
    marks: Path,
) -> None:
    """Calls that came before a crash was marked were told "is ready (the connection ended):
    its tools cannot be called" (an outside probe)."""
    source = McpTools([stdio("demo", marks)], clock=SystemClock())
    await source.start()
    try:
        connection = source.connection("demo")
        connection._lost.set()  # the connection ended; its state is still the one it had
        assert connection.state == "ready"
        said = text(await call(source, "demo.echo", {"text": "x"}))
    finally:
        await source.close()
    assert said == "MCP server 'demo' is down: its tools cannot be called", said


async def test_calls_while_down_are_refused_at_once(marks: Path) -> None:
    gate = asyncio.Event()

    async def held(_seconds: float) -> None:
        await gate.wait()  # the backoff lasts until the test says

    source = McpTools([stdio("demo", marks)], clock=SystemClock(), sleep=held)
    await source.start()
    try:
        await call(source, "demo.crash")
        await until(lambda: source.connection("demo").state == "restarting", "down")
        down = await call(source, "demo.echo", {"text": "x"})
        assert down.is_error and "is down" in text(down)
        assert source.health()[0].retry_at_ms is not None
        gate.set()
        await until(lambda: source.connection("demo").state == "ready", "back")
        assert text(await call(source, "demo.echo", {"text": "y"})) == "echo: y"
    finally:
        gate.set()
        await source.close()


async def test_a_hang_times_out_and_the_server_sees_the_cancel(
    marks: Path, counted: Counted
) -> None:
    source = McpTools(
        [stdio("demo", marks, call_timeout_seconds=0.5)], clock=SystemClock(), observer=counted
    )
    await source.start()
    try:
        hung = await call(source, "demo.hang")
        assert hung.is_error and "did not answer" in text(hung)
        await until(lambda: (marks / "cancelled-hang").exists(), "the server saw the cancel")
        assert text(await call(source, "demo.echo", {"text": "ok"})) == "echo: ok"
        assert ("demo", "timeout") in counted.calls
    finally:
        await source.close()


async def test_an_abort_cancels_the_call_at_the_server(source: McpTools, marks: Path) -> None:
    ctx = context("demo.hang")
    running = asyncio.ensure_future(tool(source, "demo.hang").execute({}, ctx))
    await until(lambda: any(p.name.startswith("call-hang") for p in marks.iterdir()), "started")
    ctx.abort.set()
    aborted = await running
    assert isinstance(aborted, ToolOutput)
    assert aborted.is_error and "aborted" in text(aborted)
    await until(lambda: (marks / "cancelled-hang").exists(), "the server saw the cancel")


async def test_close_cancels_a_call_in_flight(marks: Path) -> None:
    source = McpTools([stdio("demo", marks)], clock=SystemClock())
    await source.start()
    running = asyncio.ensure_future(call(source, "demo.hang"))
    await until(lambda: any(p.name.startswith("call-hang") for p in marks.iterdir()), "started")
    await source.close()
    stopped = await running
    assert stopped.is_error and "cancelled" in text(stopped)
    await until(lambda: (marks / "cancelled-hang").exists(), "the server saw the cancel")
    assert source.health()[0].state == "stopped" and source.tools() == ()


async def test_malformed_and_flood_are_contained(source: McpTools) -> None:
    bad = await call(source, "demo.malformed")
    assert bad.is_error and "malformed" in text(bad)
    flood = await call(source, "demo.flood")
    assert not flood.is_error
    assert len(text(flood)) < 5200 and "characters not shown" in text(flood)
    assert text(await call(source, "demo.echo", {"text": "still"})) == "echo: still"
    assert source.health()[0].failures >= 1


async def test_a_list_change_is_followed_and_a_vanished_tool_is_a_clear_error(
    source: McpTools,
) -> None:
    delete = tool(source, "demo.delete")
    assert text(await call(source, "demo.change")) == "changed"
    await until(lambda: "demo.extra" in [t.name for t in source.tools()], "re-listed")
    assert "demo.delete" not in [t.name for t in source.tools()]
    gone = await delete.execute({}, context("demo.delete"))
    assert isinstance(gone, ToolOutput)
    assert gone.is_error and "does not offer 'delete'" in text(gone)
    assert text(await call(source, "demo.extra")) == "extra"


async def test_a_server_that_fails_to_start_is_contained(marks: Path, counted: Counted) -> None:
    broken = McpServer.model_validate(
        {
            "name": "broken",
            "command": sys.executable,
            "args": ["-m", "tests.support.mcp_servers", "--fail-start"],
            "env": {"MCP_TEST_SECRET": SECRET},
            "cwd": ROOT,
        }
    )
    missing = McpServer(name="missing", command="/nonexistent/mcp-server-program")
    # the program is there; its working directory is not (it was "cannot start python")
    nowhere = McpServer(name="nowhere", command=sys.executable, cwd="/nonexistent/dir")
    # a relative path is read from where the gateway runs, not from its config file's place
    relative = McpServer(name="relative", command="bin/no-such-mcp")
    # its arguments written into the command: the error named no cause
    joined = McpServer(name="joined", command="python3 /srv/mcp/server.py")
    source = McpTools(
        [broken, missing, nowhere, relative, joined, stdio("demo", marks)],
        clock=SystemClock(),
        redact=Redactor([SECRET]).redact,
        observer=counted,
        backoff=Backoff(first_s=0.05, max_s=0.1),
    )
    await source.start()
    try:
        by_name = {h.name: h for h in source.health()}
        # why it stopped was only on its stderr ("MCPError: Connection closed" said nothing)
        assert by_name["broken"].last_error == (
            "the connection closed (the server exited or closed its output)"
        )
        assert by_name["broken"].stderr == "refusing to start (secret [redacted])"
        assert by_name["missing"].stderr is None and by_name["demo"].stderr is None
        assert by_name["missing"].state == "failed" and by_name["missing"].last_error
        assert by_name["missing"].last_error.startswith(  # which program could not start
            "cannot start '/nonexistent/mcp-server-program': FileNotFoundError"
        )
        assert by_name["nowhere"].last_error == (
            "cannot start in '/nonexistent/dir': no such directory (its cwd)"
        )
        assert (by_name["relative"].last_error or "").startswith(
            f"cannot start 'bin/no-such-mcp' (read from {os.getcwd()}): FileNotFoundError"
        )
        assert (by_name["joined"].last_error or "").endswith(
            "(a command with its arguments? the program goes in `command`, each argument in `args`)"
        )
        assert "`args`" not in (by_name["missing"].last_error or "")
        assert by_name["broken"].state in ("restarting", "starting")
        assert by_name["demo"].state == "ready"
        assert all(t.name.startswith("demo.") for t in source.tools())
        await until(lambda: source.health()[0].restarts >= 2, "retried with backoff")
    finally:
        await source.close()


async def test_a_server_that_writes_more_to_stderr_than_a_pipe_holds_still_serves(
    marks: Path,
) -> None:
    # its stderr is read as it comes: a pipe nobody drains would block the server at 64 KiB
    chatty = stdio("demo", marks)
    chatty = chatty.model_copy(update={"args": (*chatty.args, "--stderr-bytes", "1000000")})
    source = McpTools([chatty], clock=SystemClock(), redact=Redactor([SECRET]).redact)
    await source.start()
    try:
        assert source.health()[0].state == "ready"
        assert text(await call(source, "demo.echo", {"text": "hi"})) == "echo: hi"
    finally:
        await source.close()


def _raw(*flags: str, **more: Any) -> McpServer:
    """The hand-written server (`tests.support.mcp_raw`) with `flags`, and `more` settings."""
    return McpServer.model_validate(
        {
            "name": "raw",
            "command": sys.executable,
            "args": ["-m", "tests.support.mcp_raw", *flags],
            "cwd": ROOT,
            **more,
        }
    )


@pytest.mark.parametrize(
    ("deep", "said"),
    [
        (False, "tool 'noschema' (tools.1): inputSchema: Field required"),
        # deeper than the tool's own fields: its name came from the list as it was sent
        (
            True,
            "tool 'unsure' (tools.1): annotations.readOnlyHint: Input should be a valid "
            "boolean, unable to interpret input",
        ),
    ],
)
async def test_a_tool_list_that_breaks_the_protocol_names_the_tool(deep: bool, said: str) -> None:
    """It said "ValidationError: 1 validation error for ListToolsResult", restart after
    restart: which tool, and what was wrong with it, was for the operator to find out (and a
    fault deeper in a tool named only its index, ``a tool (tools.16)``)."""
    raw = _raw(*(["--deep"] if deep else []))
    source = McpTools([raw], clock=SystemClock(), backoff=Backoff(first_s=0.05, max_s=0.1))
    await source.start()
    try:
        [health] = source.health()
        assert health.state == "restarting" and not source.tools()
        assert health.last_error == f"its tool list breaks the protocol: {said}"
    finally:
        await source.close()


async def test_a_list_that_never_ends_is_read_to_a_bound_and_the_health_says_so() -> None:
    """A cursor that never ended was read for 100 pages: 200,000 tools offered, 18 s, 794 MB,
    and every run's start record named them all (an outside probe)."""
    raw = _raw("--pages")
    source = McpTools([raw], clock=SystemClock(), backoff=Backoff(first_s=60))
    await source.start()
    try:
        [health] = source.health()
        assert health.state == "ready"
        assert len(source.tools()) == MAX_TOOLS
        assert health.tools[:2] == ("raw.t0", "raw.t1")
        assert health.last_error == (
            f"it lists more than {MAX_TOOLS:,} tools: only the first {MAX_TOOLS:,} it exposes "
            "are offered (its own tool filter, or `tools`, chooses which)"
        )
    finally:
        await source.close()


async def test_an_answer_no_parser_reads_is_said_at_once_not_timed_out() -> None:
    """A tool list nested past the parser's depth was dropped as no message: the server
    "did not come up: timed out" after the whole start timeout, the cause unsaid."""
    # the start timeout is left well inside the test's own: before, the health said "timed out"
    raw = _raw("--nested", start_timeout_seconds=20)
    source = McpTools([raw], clock=SystemClock(), backoff=Backoff(first_s=60))
    await source.start()
    try:
        [health] = source.health()
        assert "the gateway could not read its answer (Invalid JSON: recursion limit" in (
            health.last_error or ""
        ), health.last_error
    finally:
        await source.close()


async def test_a_tool_listed_twice_is_offered_once_as_first_listed_and_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The later one replaced the first, its declarations with it, without a word."""
    raw = _raw("--twice")
    source = McpTools([raw], clock=SystemClock(), backoff=Backoff(first_s=60))
    await source.start()
    try:
        [good] = source.tools()
        assert good.name == "raw.good" and not good.requires_approval  # the first, as listed
        [said] = [r for r in caplog.records if "mcp.tool_listed_twice" in r.getMessage()]
        assert said.msg.fields["tools"] == ["good"]  # type: ignore[union-attr]
    finally:
        await source.close()


async def test_secrets_stay_out_of_logs_and_health(
    source: McpTools, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    # the server got it; what it says of it is never stored, shown to the model or sent (D349)
    assert text(await call(source, "demo.env")) == "[redacted]"
    await call(source, "demo.crash")
    await until(lambda: source.health()[0].restarts and source.health()[0].state == "ready", "back")
    assert SECRET not in caplog.text
    assert SECRET not in repr(source.health())


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie, killed but not yet reaped, is not alive)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def pids(marks: Path) -> list[int]:
    """The processes the test server started as (from its ``pid-<pid>`` marks)."""
    return [int(p.name[4:]) for p in marks.iterdir() if p.name.startswith("pid-")]


async def test_close_during_the_teardown_of_a_lost_server_still_stops_it(marks: Path) -> None:
    # The server closes its wire mid-call but lingers, deaf to its stdin closing: the SDK's
    # teardown waits, then kills it. `close` landing in that teardown must not cut it short
    # (a native cancel did: the process was left running, its transport collected unclosed).
    server = stdio("demo", marks)
    lingering = server.model_copy(update={"args": (*server.args, "--linger")})
    source = McpTools([lingering], clock=SystemClock(), backoff=Backoff(first_s=60))
    await source.start()
    (pid,) = pids(marks)
    try:
        lost = await call(source, "demo.crash")
        assert lost.is_error and "lost during the call" in text(lost)
        assert alive(pid)
        await source.close()
        assert not alive(pid)
        assert source.health()[0].state == "stopped"
    finally:
        if alive(pid):
            os.kill(pid, 9)


async def test_a_server_that_dies_while_its_helper_holds_its_output_is_restarted(
    source: McpTools, marks: Path, counted: Counted
) -> None:
    """Its output never ended: the server stayed "ready", every later call waited out its
    timeout to read "may have had its effect", and the helper outlived even a clean stop (an
    outside probe). Its exit is the crash; the helper goes with its process group."""
    crashed = await call(source, "demo.crash", {"orphan": True})
    assert crashed.is_error and "lost during the call" in text(crashed), text(crashed)
    [helper] = [int(p[7:]) for p in os.listdir(marks) if p.startswith("helper-")]
    await until(lambda: source.health()[0].restarts >= 1, "restarted")
    await until(lambda: source.health()[0].state == "ready", "ready again")
    assert text(await call(source, "demo.echo", {"text": "after"})) == "echo: after"
    await until(lambda: not alive(helper), "the helper ended")
    assert ("demo", "crashed") in counted.calls


async def test_an_override_keyed_by_the_shown_name_applies_and_one_naming_nothing_is_said(
    marks: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`overrides = { "demo.echo" = ... }` (the name `ops mcp`, the thread and the approval
    prompt show) and a typo were both ignored without a word: the approval was skipped."""
    server = stdio(
        "demo",
        marks,
        tools=["echo", "delete", "no_such_*"],
        overrides={"demo.echo": {"approval": True}, "delte": {"approval": False}},
    )
    assert set(server.overrides) == {"echo", "delte"}
    tools = McpTools([server], clock=SystemClock())
    with caplog.at_level(logging.WARNING, logger="gateway.mcp"):
        await tools.start()
    try:
        assert tool(tools, "demo.echo").requires_approval  # read-only, yet asked: overridden
        assert tool(tools, "demo.delete").requires_approval
    finally:
        await tools.close()
    said = [
        (r.getMessage(), getattr(r.msg, "fields", {}))
        for r in caplog.records
        if r.levelno == logging.WARNING
    ]
    assert [(name, fields.get("tool") or fields.get("pattern")) for name, fields in said] == [
        ("mcp.override_names_no_tool", "delte"),
        ("mcp.tools_pattern_matches_nothing", "no_such_*"),
    ]


def test_an_override_may_not_name_one_tool_both_ways(marks: Path) -> None:
    with pytest.raises(ValueError, match="overrides name the tool 'echo' twice"):
        stdio("demo", marks, overrides={"echo": {}, "demo.echo": {"approval": True}})


async def test_a_plugin_tool_keeps_its_name_against_an_mcp_tool_of_the_same(
    source: McpTools, caplog: pytest.LogCaptureFixture
) -> None:
    """The server's `demo.delete` replaced a plugin's `demo.delete` (its approval lost), and
    the model was sent the name twice, which providers refuse."""

    async def mine(args: Any, ctx: ToolContext) -> ToolOutput:
        return ToolOutput(content=(TextPart(text="the plugin's"),))

    own = (Tool(name="demo.delete", description="mine", execute=mine, requires_approval=True),)
    warned: set[str] = set()
    with caplog.at_level(logging.WARNING, logger="gateway.mcp"):
        offered = beside(own, source.tools(), warned)
        again = beside(own, source.tools(), warned)
    names = [t.name for t in offered]
    assert len(names) == len(set(names)) and names[0] == "demo.delete"
    assert {t.name: t for t in offered}["demo.delete"] is own[0]
    assert "demo.echo" in names  # the server's other tools stay
    assert again == offered
    clashes = [r for r in caplog.records if r.getMessage() == "mcp.tool_name_taken"]
    assert len(clashes) == 1  # said once


def test_two_names_the_model_would_read_as_one_leave_the_later_unoffered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A name providers refuse goes hashed (ten hex digits); a server listing two long names
    whose hashes match made every thread's request fail before it was sent ("would both be
    called"), while the server read as ready. The later is not offered now (D350)."""
    stem = "demo." + "t" * 60
    first, second = f"{stem}536993", f"{stem}545983"  # found in a second: 40 bits
    assert wire_name(first) == wire_name(second)

    async def nothing(args: Any, ctx: ToolContext) -> ToolOutput:
        return ToolOutput()

    listed = tuple(
        Tool(name=name, description=name, execute=nothing) for name in (first, "demo.echo", second)
    )
    with pytest.raises(ToolNameClash):
        ToolNames(t.name for t in listed)
    with caplog.at_level(logging.WARNING, logger="gateway.mcp"):
        offered = beside((), listed, set())
    assert [t.name for t in offered] == [first, "demo.echo"]
    ToolNames(t.name for t in offered)  # a request the provider is sent
    [said] = [r for r in caplog.records if r.getMessage() == "mcp.tool_name_taken"]
    assert getattr(said.msg, "fields", {})["tool"] == second
    assert first in getattr(said.msg, "fields", {})["note"]


def test_more_tools_than_a_provider_takes_are_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """A server of 5,000 tools went to every model request, unsaid; OpenAI takes 128."""

    async def nothing(args: Any, ctx: ToolContext) -> ToolOutput:
        return ToolOutput()

    listed = tuple(
        Tool(name=f"many.t{n}", description="t", execute=nothing) for n in range(MANY_TOOLS)
    )
    own = (Tool(name="mine", description="mine", execute=nothing),)
    warned: set[str] = set()
    with caplog.at_level(logging.WARNING, logger="gateway.mcp"):
        assert len(beside((), listed, warned)) == MANY_TOOLS  # as many as it takes: unsaid
        assert not caplog.records
        for _ in range(2):
            assert len(beside(own, listed, warned)) == MANY_TOOLS + 1
    [said] = [r for r in caplog.records if r.getMessage() == "mcp.too_many_tools"]
    fields = getattr(said.msg, "fields", {})
    assert (fields["tools"], fields["servers"]) == (MANY_TOOLS + 1, ["many"])


async def test_the_reason_a_server_went_down_is_kept_through_its_crashes(
    source: McpTools, counted: Counted
) -> None:
    """Each crash put the class name before the last reason: "_Lost: _Lost: _Lost: the
    connection ended", which reached the model and the user, the real cause gone."""
    for crashes in range(1, 4):
        await call(source, "demo.crash")
        await until(
            lambda n=crashes: (
                source.connection("demo").state == "ready" and len(counted.restarts) >= n
            ),
            "restart",
        )
    said = source.health()[0].last_error or ""
    assert "_Lost" not in said and said, said


async def test_a_server_s_secret_in_a_description_or_schema_never_reaches_the_model(
    marks: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Descriptions and schemas went to the model as the server wrote them: a DSN's password
    in one was read by the provider, and stored with the answer that quoted it (an outside
    probe). Names that are no names are left out, said once: one with a newline wrote a line
    of its own into the approval request."""
    server = stdio("odd", marks)
    server = server.model_copy(update={"args": (*server.args, "--odd-tools")})
    tools = McpTools([server], clock=SystemClock(), redact=Redactor([SECRET]).redact)
    await tools.start()
    try:
        offered = {t.name: t for t in tools.tools()}
        query = offered["odd.query"]
        assert query.description == "Query the warehouse at postgres://app:[redacted]@db/main"
        assert SECRET not in json.dumps(query.parameters)
        assert "[redacted]" in json.dumps(query.parameters)
        assert [n for n in offered if "evil" in n or n == "odd." or SECRET in n] == []
        left_out = [r for r in caplog.records if "mcp.tool_left_out" in r.getMessage()]
        assert len(left_out) == 3
        said = [r.msg.fields for r in left_out]  # type: ignore[union-attr]
        assert "its name holds a configured secret" in [f["why"] for f in said]
        assert SECRET not in repr(said)
        tools._rebuild()  # a rebuild (a list change) says it no more
        assert len([r for r in caplog.records if "mcp.tool_left_out" in r.getMessage()]) == 3
    finally:
        await tools.close()
