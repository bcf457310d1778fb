"""A stdio MCP server's pipes as message streams, each line bounded in bytes and in time to read.

The SDK's own stdio transport joins what it has read of a line with each new chunk and splits
the whole again: a server that writes one huge line (a file dumped as one result, a runaway
loop) costs the gateway's event loop time quadratic in the line's length, and memory without
bound, while every other thread waits. Here each chunk is searched once for its newlines and a
line is kept only up to `MAX_MESSAGE_BYTES`. The rest of a longer line is counted and dropped
(the framing holds: the next line is read as usual); when the line's first bytes name the
request it answers, that request gets an error answer saying so (`TOO_LARGE_CODE`) instead of
waiting out its timeout; otherwise it is one unreadable message. Spawning and shutdown are the
SDK's order (close the input, wait, then SIGTERM and SIGKILL the server's process group); the
server's own exit ends its stream too (a helper it started may hold its output open), and what
is left of its process group is ended at every stop. A stop with a deadline (`StopBy`: the
gateway stopping within `GATEWAY_SHUTDOWN_SECONDS`) shortens each of those waits to its share
of the time left, so a server deaf to its input closing and to SIGTERM cannot hold the stop
past its budget (it took the whole budget and exit 1 with two such servers).

A line of more than `THREAD_BYTES` is parsed in a thread, and a result of more than
`MAX_BLOCKS` content blocks is handed on with its runs of plain text blocks joined (and cut to
that many, the rest named): the SDK validates each block on the event loop, and 450,000
one-letter blocks held every other thread 4.6 s (an outside probe).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from collections.abc import AsyncIterator, Mapping
from typing import TextIO

import anyio
import mcp_types as types
from anyio.abc import Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from gateway.errors import GatewayError

__all__ = [
    "MAX_BLOCKS",
    "MAX_MESSAGE_BYTES",
    "THREAD_BYTES",
    "TOO_LARGE_CODE",
    "TOO_LARGE_DATA",
    "StopBy",
    "TooLarge",
    "answered_id",
    "bound_blocks",
    "bounded_stdio",
    "fewer_blocks",
    "read_message",
    "too_large_answer",
]

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The longest line read as a message (a result is cut to far less before the model reads it)."""
TOO_LARGE_CODE = -32099
"""The error code of the answer given in place of one too large to read (JSON-RPC's range
for an implementation's own server errors)."""
TOO_LARGE_DATA = {"gateway": "too_large"}
"""The error's data that says the gateway wrote it (a server may use the code for its own)."""
MAX_BLOCKS = 1_000
"""The most content blocks of one result handed to the SDK (runs of text joined first)."""
THREAD_BYTES = 1024 * 1024
"""A line longer than this is parsed in a thread, not on the event loop."""
_HEAD_BYTES = 4096
"""How much of a too-long line is kept to find the request it answers."""
_INPUT_CLOSED_WAIT_S = 2.0
"""How long a server has to exit on its own once its input closes (the MCP shutdown order)."""
_KILL_WAIT_S = 2.0
"""After SIGTERM before SIGKILL, and after SIGKILL for the exit to be seen."""
_FLUSH_WAIT_S = 0.5
_EXIT_POLL_S = 0.1
"""How often the server's own exit is looked for."""
_EXIT_GRACE_S = 0.5
"""After the server exited: how long its last output has to be read before the stream ends."""
"""How long messages already handed to the writer have to reach the server at shutdown."""
_KEY = re.compile(r'\s*[{,]\s*"((?:[^"\\]|\\.)*)"\s*:\s*')
"""An object's key, after its ``{`` or a ``,``, up to where its value starts."""


_Read = MemoryObjectReceiveStream[SessionMessage | Exception]
_Write = MemoryObjectSendStream[SessionMessage]


class StopBy:
    """When a server's stop must be over (the event loop's clock), once a close sets it."""

    def __init__(self) -> None:
        self.at: float | None = None

    def wait(self, most: float, share: float) -> float:
        """`most` seconds, or less: `share` of the time left when a deadline is set."""
        if self.at is None:
            return most
        return max(min(most, share * (self.at - anyio.current_time())), 0.0)


class TooLarge(GatewayError, ValueError):
    """A line longer than `MAX_MESSAGE_BYTES` that names no request (an unreadable message)."""


@contextlib.asynccontextmanager
async def bounded_stdio(
    command: str,
    args: list[str],
    *,
    env: Mapping[str, str],
    cwd: str | None,
    errlog: TextIO,
    max_bytes: int = MAX_MESSAGE_BYTES,
    stop_by: StopBy | None = None,
) -> AsyncIterator[tuple[_Read, _Write]]:
    """Start `command` in its own process group; yield (read, write) streams of its messages.

    The read stream gives `SessionMessage` or, for a line that is no message, the exception
    that says why (the SDK's session passes those on), and ends when the server's output does.

    Raises:
        OSError: the program cannot be started.
    """
    by = stop_by or StopBy()
    process = await anyio.open_process(
        [command, *args], env=dict(env), stderr=errlog, cwd=cwd, start_new_session=True
    )
    # no await between the spawn and the task group: a cancel there would leave it running
    to_session, read = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write, from_session = anyio.create_memory_object_stream[SessionMessage](0)
    flushed = anyio.Event()

    async def reader() -> None:
        assert process.stdout is not None
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            async with to_session:
                lines = _Lines(max_bytes)
                try:
                    async for chunk in process.stdout:
                        for item in lines.feed(chunk):
                            if isinstance(item, _Long):
                                item = await anyio.to_thread.run_sync(read_message, item.text)
                            await to_session.send(item)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                    pass
        await _drain(process)

    async def writer() -> None:
        assert process.stdin is not None
        try:
            async with from_session:
                async for message in from_session:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(data.encode() + b"\n")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await to_session.aclose()  # its input is gone: the session sees the end, not a hang
        finally:
            flushed.set()

    async def watcher() -> None:
        # a server that exits while a child of its holds its output never ends that output:
        # its exit must end the stream (it stayed "ready", every call waiting out its timeout)
        while process.returncode is None:  # noqa: ASYNC110 (a process's exit sets no event)
            await anyio.sleep(_EXIT_POLL_S)
        await anyio.sleep(_EXIT_GRACE_S)  # what it wrote before it exited is read first
        await to_session.aclose()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(reader)
        tasks.start_soon(writer)
        tasks.start_soon(watcher)
        try:
            yield read, write
        finally:
            # bounded, and shielded: a cancelled caller must not leave the server running
            with anyio.CancelScope(shield=True):
                read.close()
                write.close()
                with anyio.move_on_after(by.wait(_FLUSH_WAIT_S, 0.1)):
                    await flushed.wait()
                await _stop(process, by)
                for stream in (read, write, to_session, from_session):
                    await stream.aclose()
            tasks.cancel_scope.cancel()


class _Long:
    """A line to parse in a thread (`read_message`): its text."""

    def __init__(self, text: str) -> None:
        self.text = text


class _Lines:
    """Bytes in, messages out: each chunk searched once, a line kept to `max_bytes`."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._kept = bytearray()
        self._long = 0  # the length of the current line once it is too long (0: it is not)

    def feed(self, chunk: bytes) -> list[SessionMessage | Exception | _Long]:
        found: list[SessionMessage | Exception | _Long] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            self._take(piece)
            if end < 0:
                return found
            item = self._line()
            if item is not None:
                found.append(item)
            start = end + 1

    def _take(self, piece: bytes) -> None:
        if self._long:
            self._long += len(piece)
        elif len(self._kept) + len(piece) > self._max:
            # too long: only its head is kept (it may name the request), the rest counted
            self._long = len(self._kept) + len(piece)
            del self._kept[_HEAD_BYTES:]
            self._kept.extend(piece[: _HEAD_BYTES - len(self._kept)])
        else:
            self._kept.extend(piece)

    def _line(self) -> SessionMessage | Exception | _Long | None:
        text, length = self._kept.decode("utf-8", "replace"), self._long
        self._kept.clear()
        self._long = 0
        if length:
            return too_large_answer(text, length, self._max)
        if not text.strip():
            return None  # a blank line between messages says nothing
        return _Long(text) if len(text) > THREAD_BYTES else read_message(text)


def read_message(text: str) -> SessionMessage | Exception:
    """One line as a message (any thread): a result's content blocks bounded (`MAX_BLOCKS`)."""
    try:
        # bytes that are no UTF-8 are replaced, not fatal: one such byte ended the SDK's
        # reader for good once (the server stayed "ready" and every call timed out)
        message = types.jsonrpc_message_adapter.validate_json(text, by_name=False)
    except ValueError as exc:
        request = answered_id(text[:_HEAD_BYTES])
        if request is None:
            return exc
        # an answer, to a request it names: that request is told now, not after its timeout
        # (a tool list nested past the parser's depth read as a server that "timed out")
        said = f"the gateway could not read its answer ({_unreadable(exc)})"
        error = types.ErrorData(code=types.INTERNAL_ERROR, message=said)
        return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request, error=error))
    bound_blocks(message)
    return SessionMessage(message)


def bound_blocks(message: object) -> None:
    """A response's result with more than `MAX_BLOCKS` content blocks: made `fewer_blocks`.

    Every transport's answers pass here (stdio's in its reader's thread, HTTP's as they are
    heard) before the SDK validates each block on the event loop.
    """
    if isinstance(message, types.JSONRPCResponse):
        content = message.result.get("content")
        if isinstance(content, list) and len(content) > MAX_BLOCKS:
            message.result["content"] = fewer_blocks(content)


def fewer_blocks(blocks: list[object]) -> list[object]:
    """At most `MAX_BLOCKS` blocks: each run of plain text blocks joined, then the rest named.

    Joined one per line: ``["w1", "w11"]`` had become ``w1w11``, another text than the
    server's, past 1,000 blocks only (an outside probe).
    """
    joined: list[object] = []
    run: list[str] = []
    for block in blocks:
        text = _plain_text(block)
        if text is not None:
            run.append(text)
            continue
        if run:
            joined.append({"type": "text", "text": "\n".join(run)})
            run = []
        joined.append(block)
    if run:
        joined.append({"type": "text", "text": "\n".join(run)})
    if len(joined) <= MAX_BLOCKS:
        return joined
    left_out = len(joined) - (MAX_BLOCKS - 1)
    note = f"[{left_out:,} more content blocks of this result were left out]"
    return [*joined[: MAX_BLOCKS - 1], {"type": "text", "text": note}]


def _unreadable(exc: ValueError) -> str:
    """Why a line is no message, in a few words (never the line's own values)."""
    if isinstance(exc, ValidationError) and exc.errors():
        first = exc.errors(include_input=False, include_url=False)[0]
        return str(first["msg"])[:200]
    return type(exc).__name__


def _plain_text(block: object) -> str | None:
    """The text of a text block that is nothing more (no annotations, no ``_meta``); else None."""
    if isinstance(block, dict) and block.keys() == {"type", "text"} and block["type"] == "text":
        text = block["text"]
        return text if isinstance(text, str) else None
    return None


def too_large_answer(head: str, length: int | None, limit: int) -> SessionMessage | Exception:
    """The error answer to the request a too-long line answers, or `TooLarge` (none named).

    `length`: the message's bytes, when known (a body read only to the bound is not).
    """
    size = "" if length is None else f" ({length / (1024 * 1024):,.1f} MiB)"
    request = answered_id(head)
    if request is None:
        return TooLarge(f"a message{size} of more than {limit:,} bytes was not read")
    said = (
        f"its answer{size} is larger than the {limit / (1024 * 1024):g} MiB the gateway "
        "reads, and was not read"
    )
    error = types.ErrorData(code=TOO_LARGE_CODE, message=said, data=TOO_LARGE_DATA)
    answer = types.JSONRPCError(jsonrpc="2.0", id=request, error=error)
    return SessionMessage(answer)


def answered_id(head: str) -> int | str | None:
    """The ``id`` of the response whose first characters are `head`, when its top level says.

    Only the object's own keys before its ``result`` or ``error`` are read: an ``id`` inside
    a result is never taken for the request's.
    """
    decoder = json.JSONDecoder()
    at, ident = 0, None
    while (key := _KEY.match(head, at)) is not None:
        name, at = key.group(1), key.end()
        if name in ("result", "error"):
            return ident
        try:
            value, at = decoder.raw_decode(head, at)
        except ValueError:
            return None
        if name == "id" and isinstance(value, int | str) and not isinstance(value, bool):
            ident = value
        elif name == "method":
            return None  # a request or notification of the server's, not an answer
    return None


async def _drain(process: Process) -> None:
    """Read and drop what the server still writes: a server blocked on a full pipe cannot exit."""
    assert process.stdout is not None
    with (
        anyio.CancelScope(shield=True),
        contextlib.suppress(
            anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError
        ),
    ):
        while True:
            await process.stdout.receive()


async def _stop(process: Process, by: StopBy) -> None:
    """Close its input, give it time to exit, then end its process group (every wait bounded).

    Against a deadline the waits are shares of the time left: the input's 40 %, SIGTERM's
    half of the rest, and SIGKILL, which needs no grace, what remains.
    """
    assert process.stdin is not None
    assert process.stdout is not None
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    if not await _exited(process, by.wait(_INPUT_CLOSED_WAIT_S, 0.4)):
        await terminate_posix_process_tree(process, by.wait(_KILL_WAIT_S, 0.5))
        await _exited(process, by.wait(_KILL_WAIT_S, 0.5))
    await _end_group(process.pid, by)
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdout.aclose()


async def _end_group(group: int, by: StopBy) -> None:
    """End what is left of the server's process group once the server itself is gone.

    A child it started (a browser, a language server) outlived it, holding its pipes: found
    after even a clean stop (an outside probe). The group is the server's own (a new session
    at the spawn); SIGTERM, then SIGKILL to what is still there.
    """
    for number in (signal.SIGTERM, signal.SIGKILL):
        if not _members(group):
            return
        with contextlib.suppress(OSError):  # gone meanwhile
            os.killpg(group, number)
        with anyio.move_on_after(by.wait(_KILL_WAIT_S, 0.5)):
            while _members(group):  # noqa: ASYNC110 (a process's exit sets no event)
                await anyio.sleep(0.05)


def _members(group: int) -> bool:
    """Whether a live process (no zombie: an init that does not reap keeps those) is in `group`."""
    try:
        os.killpg(group, 0)
    except OSError:
        return False
    try:
        entries = list(os.scandir("/proc"))
    except OSError:
        return True  # no /proc to tell a zombie by: the group's word is taken
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        if fields[2] == str(group).encode() and fields[0] not in (b"Z", b"X"):
            return True
    return False


async def _exited(process: Process, within_s: float) -> bool:
    # returncode, not wait(): a child of the server holding the pipes makes wait() hang
    with anyio.move_on_after(within_s):
        while process.returncode is None:  # noqa: ASYNC110 (a process's exit sets no event)
            await anyio.sleep(0.01)
    return process.returncode is not None
