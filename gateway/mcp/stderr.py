"""The end of what a stdio MCP server wrote to its stderr: read as it comes, its tail kept.

A server that cannot start says why on its stderr (``ModuleNotFoundError: No module named
'tickets'``, ``Error: Cannot find module``, a missing setting); the connection only sees its
output close. The stream is read continuously (a server writing more than a pipe holds would
otherwise block on it) and only the last `KEEP_BYTES` are kept; at most `READ_BYTES_PER_S` a
second, then the pipe is left to fill until the second is over (a server that floods its
stderr, `yes >&2`, took two thirds of the gateway's core to read and drop; now it waits on
its own pipe). What it said is for the
operator (health, logs, ``gateway ask``), passed through the redactor; never for the model: a
server's stderr may quote one session's data while another's call reads the fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import unicodedata
from collections.abc import Callable
from typing import TextIO, cast

__all__ = ["KEEP_BYTES", "READ_BYTES_PER_S", "SAID_CHARS", "StderrTail"]

KEEP_BYTES = 4096
"""The most bytes of the stream kept (its end)."""
SAID_CHARS = 300
"""The most characters of the tail `said` gives (whole lines from the end, one clipped)."""
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
"""A terminal's escape sequences (colours, cursor moves): what a CLI's error line is wrapped in."""
_ERROR = re.compile(r"(?:[\w.]*(?:Error|Exception)|error|fatal|panic|FATAL|ERROR)\b[^ ]*:? ")
"""A line that names what went wrong (Python's, Node's, Go's and most CLIs' last word)."""
READ_BYTES_PER_S = 4 * 1024 * 1024
"""The most bytes read from one server's stderr a second (a log far chattier than any server's)."""
_EOF_WAIT_S = 0.5
"""How long `finish` waits for the stream to end (a child of the server may keep it open)."""


class _Collect(asyncio.Protocol):
    def __init__(self, tail: StderrTail) -> None:
        self._tail = tail
        self._transport: asyncio.ReadTransport | None = None
        self._window_ends = 0.0
        self._window_bytes = 0
        self.resuming: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a read pipe's transport, though not always an `asyncio.ReadTransport` by class:
        # uvloop's is not, and an isinstance assert here killed the reader under `serve`
        self._transport = cast(asyncio.ReadTransport, transport)

    def data_received(self, data: bytes) -> None:
        self._tail._take(data)
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now >= self._window_ends:
            self._window_ends, self._window_bytes = now + 1.0, 0
        self._window_bytes += len(data)
        if self._window_bytes >= READ_BYTES_PER_S and self._transport is not None:
            self._transport.pause_reading()
            self.resuming = loop.call_at(self._window_ends, self.resume)

    def resume(self) -> None:
        """Read again (the second is over, or the tail is finishing)."""
        if self.resuming is not None:
            self.resuming.cancel()
            self.resuming = None
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()

    def eof_received(self) -> bool | None:
        self._tail._ended.set()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._tail._ended.set()


class StderrTail:
    """One spawn's stderr: `open` gives the file the server writes to, `said` its last lines."""

    def __init__(self, redact: Callable[[str], str] = str) -> None:
        self._redact = redact
        """Applied to the whole kept text before any line is clipped: a secret clipped first
        was no longer the secret, and its end was shown (an outside probe)."""
        self._kept = bytearray()
        self._cut = False
        """Whether the buffer's start was dropped (its first line may be a line's end)."""
        self._ended = asyncio.Event()
        self._transport: asyncio.ReadTransport | None = None
        self._collect: _Collect | None = None

    async def open(self) -> TextIO:
        """The write end of a pipe this tail reads (hand it to the spawn, close it after)."""
        read_fd, write_fd = os.pipe()
        try:
            reader = os.fdopen(read_fd, "rb", buffering=0)
        except BaseException:
            os.close(read_fd)
            os.close(write_fd)
            raise
        try:
            loop = asyncio.get_running_loop()
            self._transport, self._collect = await loop.connect_read_pipe(
                lambda: _Collect(self), reader
            )
        except BaseException:
            reader.close()
            os.close(write_fd)
            raise
        return os.fdopen(write_fd, "w")

    async def finish(self) -> str | None:
        """Stop reading, after the stream ended (or a short wait); returns `said`."""
        if self._transport is not None:
            if self._collect is not None:
                self._collect.resume()  # its last words, past a paused flood
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ended.wait(), _EOF_WAIT_S)
            self._transport.close()
            self._transport = None
        if self._collect is not None and self._collect.resuming is not None:
            self._collect.resuming.cancel()
        return self.said()

    def close(self) -> None:
        """Stop reading at once (a stop: what it said no longer matters)."""
        if self._collect is not None and self._collect.resuming is not None:
            self._collect.resuming.cancel()
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    def said(self) -> str | None:
        """Its last non-blank lines, oldest first, joined by `` | `` (None when it said nothing).

        At most `SAID_CHARS`. When the last line that names an error (``Error: Cannot find
        module``, ``ModuleNotFoundError: ...``, ``panic: ...``) is further back than that (a
        stack trace after it), it comes first, then `` | ... | `` and the last lines. Control
        and invisible characters are dropped (a terminal's colours, a line redrawn).
        """
        text = self._kept.decode("utf-8", errors="replace")
        if self._cut and "\n" in text.rstrip("\n"):  # a line's end: a secret cut in two
            text = text.partition("\n")[2]
        text = self._redact(text)
        lines = [kept for kept in (_printable(line) for line in text.splitlines()) if kept]
        if not lines:
            return None
        last = _last_lines(lines, SAID_CHARS)
        errors = [i for i, line in enumerate(lines) if _ERROR.match(line)]
        if not errors or errors[-1] >= len(lines) - len(last):
            return " | ".join(last)
        error = _clip(lines[errors[-1]], SAID_CHARS // 2)
        after = lines[errors[-1] + 1 :]
        return " | ".join([error, "...", *_last_lines(after, SAID_CHARS - len(error) - 9)])

    def _take(self, data: bytes) -> None:
        self._kept += data
        if len(self._kept) > KEEP_BYTES:
            del self._kept[: len(self._kept) - KEEP_BYTES]
            self._cut = True


def _last_lines(lines: list[str], room: int) -> list[str]:
    """The most lines from the end that fit `room` joined by `` | `` (the oldest clipped)."""
    taken: list[str] = []
    for line in reversed(lines):
        left = room - sum(len(t) + 3 for t in taken)
        if left <= 3:
            break
        taken.append(_clip(line, left))
    return taken[::-1]


def _clip(line: str, room: int) -> str:
    return line if len(line) <= room else "..." + line[-(room - 3) :]


def _printable(line: str) -> str:
    line = _ANSI.sub("", line)
    kept = "".join(c for c in line if unicodedata.category(c)[0] != "C" or c == "\t")
    return kept.replace("\t", " ").strip()
