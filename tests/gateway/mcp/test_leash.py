"""A stdio MCP server dies with the gateway that spawned it, even one deaf to its input closing.

A real process holds the servers (`McpTools`, as `serve` does) and is SIGKILLed; the server,
which runs on after its input closes, must be gone at once rather than left an orphan.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from gateway.mcp.leash import LEASHED, leashed
from tests.gateway.mcp.test_source import ROOT, alive, pids

HOLDER = textwrap.dedent(
    """
    import asyncio, shlex, sys
    from gateway.mcp.settings import McpServer
    from gateway.mcp.source import McpTools
    from harness_core.clock import SystemClock

    async def main() -> None:
        command = [sys.executable, "-m", "tests.support.mcp_servers", "--stdio", "--deaf",
                   "--marks", sys.argv[1]]
        if sys.argv[3] == "wrapped":  # a wrapper script runs the server as its child
            command = ["sh", "-c", shlex.join(command) + "; echo exited >&2"]
        server = McpServer.model_validate({
            "name": "deaf", "command": command[0], "cwd": sys.argv[2], "args": command[1:],
        })
        tools = McpTools([server], clock=SystemClock())
        await tools.start()
        print(tools.health()[0].state, flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


@pytest.mark.skipif(not LEASHED, reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("how", ["direct", "wrapped"])
async def test_a_server_deaf_to_its_input_dies_with_a_killed_gateway(
    tmp_path: Path, how: str
) -> None:
    """A server run by a wrapper script (``sh -c``, ``npx``, ``uvx``) was left running: the
    kernel's signal reached the wrapper alone (an outside probe). The whole group goes now."""
    marks = tmp_path / "marks"
    marks.mkdir()
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-c", HOLDER, str(marks), ROOT, how),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    assert holder.stdout is not None
    try:
        assert (await asyncio.wait_for(holder.stdout.readline(), 30)).strip() == b"ready"
        (server,) = pids(marks)
        holder.send_signal(signal.SIGKILL)
        await holder.wait()
        for _ in range(100):
            if not alive(server):
                break
            await asyncio.sleep(0.05)
        assert not alive(server), "the server outlived the gateway that spawned it"
    finally:
        if holder.returncode is None:
            holder.kill()
        for pid in pids(marks):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_program_that_is_not_there_fails_the_start_as_before(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path)}
    with pytest.raises(FileNotFoundError):
        leashed("no-such-mcp-server", [], env, None)
    with pytest.raises(FileNotFoundError):
        leashed("bin/no-such-mcp-server", [], env, str(tmp_path))
    script = tmp_path / "server.sh"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(PermissionError):  # there, not executable
        leashed("./server.sh", [], env, str(tmp_path))
    script.chmod(0o755)
    command, args = leashed("server.sh", ["--port", "1"], env, None)
    if LEASHED:
        assert (command, args[-3:]) == (sys.executable, ["server.sh", "--port", "1"])
    else:
        assert (command, args) == ("server.sh", ["--port", "1"])
