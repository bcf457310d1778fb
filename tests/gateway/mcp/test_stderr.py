"""What a stdio MCP server said on stderr as it stopped: the tail an operator reads."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable

import uvloop

from gateway.mcp.stderr import KEEP_BYTES, READ_BYTES_PER_S, SAID_CHARS, StderrTail
from gateway.redact import Redactor


async def spoken(*lines: str, raw: bytes = b"", redact: Callable[[str], str] = str) -> str | None:
    """What a real child process writing `lines` (then `raw`) to its stderr is heard to say."""
    tail = StderrTail(redact)
    errlog = await tail.open()
    try:
        code = "import sys; sys.stderr.buffer.write(sys.stdin.buffer.read())"
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, stdin=asyncio.subprocess.PIPE, stderr=errlog
        )
    finally:
        errlog.close()  # the child holds its own copy: its exit ends the stream
    await child.communicate("".join(f"{line}\n" for line in lines).encode() + raw)
    return await tail.finish()


async def test_a_python_traceback_ends_with_its_error() -> None:
    said = await spoken(
        "Traceback (most recent call last):",
        '  File "/srv/crm/server.py", line 1, in <module>',
        "    import crm_mcp",
        "ModuleNotFoundError: No module named 'crm_mcp'",
    )
    assert said == (
        'Traceback (most recent call last): | File "/srv/crm/server.py", line 1, in <module>'
        " | import crm_mcp | ModuleNotFoundError: No module named 'crm_mcp'"
    )


async def test_an_error_before_a_long_stack_trace_comes_first() -> None:
    # Node prints the error, then its stack, then its version: the last lines alone said
    # "at evalScript (...) | Node.js v20.20.2"
    frames = [f"    at frame{n} (node:internal/modules/cjs/loader:{n}:15)" for n in range(30)]
    said = await spoken(
        "node:internal/modules/cjs/loader:1228",
        "Error: Cannot find module 'x'",
        *frames,
        "",
        "Node.js v20.20.2",
    )
    assert said is not None and len(said) <= SAID_CHARS
    assert said.startswith("Error: Cannot find module 'x' | ... | ")
    assert said.endswith(" | Node.js v20.20.2")


async def test_colours_control_characters_and_blank_lines_are_dropped() -> None:
    said = await spoken("\x1b[31mError: bad config\x1b[0m", "", "\tsee --help\x07", "   ")
    assert said == "Error: bad config | see --help"


async def test_only_the_end_of_a_long_stream_is_kept() -> None:
    said = await spoken("first line, long gone", *["." * 99] * (KEEP_BYTES // 50), "last words")
    assert said is not None and said.endswith(" | last words")
    assert "first line" not in said and len(said) <= SAID_CHARS
    one = await spoken("x" * 1000)  # one line past the bound: its end, clipped
    assert one == "..." + "x" * (SAID_CHARS - 3)


async def test_silence_and_bytes_that_are_no_utf8() -> None:
    assert await spoken() is None
    assert await spoken(raw=b"caf\xe9 \xff\n") == "caf\ufffd \ufffd"


SECRET = "sk-live-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c"


async def test_a_secret_is_redacted_before_any_line_is_clipped() -> None:
    """The last line was clipped to its end first, and the secret's last 16 characters, no
    longer the whole secret, went to health, the ops API and the logs (an outside probe)."""
    redact = Redactor([SECRET]).redact
    said = await spoken(f"fatal: upstream refused key {SECRET} " + "x" * 280, redact=redact)
    assert said is not None and said.endswith("x" * 20)
    assert SECRET[-8:] not in said  # no piece of it
    # the buffer's own cut: a secret the kept end begins inside of is not shown either
    cut = await spoken(f"key {SECRET}" + "y" * (KEEP_BYTES - 20), "the end", redact=redact)
    assert cut == "the end"


async def test_a_flood_is_read_at_a_bounded_rate_and_its_last_words_still_heard() -> None:
    """`yes >&2` in a server took two thirds of the gateway's core to read and drop. A flood
    is read at `READ_BYTES_PER_S` now: the writer waits on its own full pipe."""
    tail = StderrTail()
    errlog = await tail.open()
    code = (
        "import sys, time\n"
        "chunk, end, wrote = b'x' * 65535 + b'\\n', time.monotonic() + 1.5, 0\n"
        "while time.monotonic() < end:\n"
        "    wrote += sys.stderr.buffer.write(chunk); sys.stderr.flush()\n"
        "sys.stderr.write('last words\\n'); print(wrote)\n"
    )
    try:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE, stderr=errlog
        )
    finally:
        errlog.close()
    out, _ = await child.communicate()
    wrote = int(out)
    # two windows' worth and what the pipe holds, where unbounded it wrote gigabytes (5.8)
    assert wrote < 3 * READ_BYTES_PER_S, wrote
    said = await tail.finish()
    assert said is not None and said.endswith("last words")


def test_a_server_s_stderr_is_read_on_uvloop_too() -> None:
    """`gateway serve` runs on uvloop, whose pipe transport is no `asyncio.ReadTransport`: the
    reader's protocol died at its first callback, so nothing read the pipe. A server that had
    written 64 KiB there blocked, every later call that logged timed out while its health said
    ready, and a server that died at start showed no last words (an outside probe)."""

    async def chatty() -> tuple[bytes, str | None]:
        tail = StderrTail()
        errlog = await tail.open()
        code = "import sys; sys.stderr.write('E' * 200_000 + '\\nlast words\\n'); print('alive')"
        try:
            child = await asyncio.create_subprocess_exec(
                sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE, stderr=errlog
            )
        finally:
            errlog.close()
        try:
            out, _ = await asyncio.wait_for(child.communicate(), 10)  # blocked for ever before
        except TimeoutError:
            child.kill()
            await child.wait()
            out = b"blocked on its stderr"
        return out, await tail.finish()

    out, said = uvloop.run(chatty())
    assert out == b"alive\n"
    assert said is not None and said.endswith("last words")
    assert uvloop.run(spoken("Error: boom happened")) == "Error: boom happened"
