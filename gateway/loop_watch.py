"""A watch on the event loop from a thread of its own: a loop held for seconds is named.

Every thread, the operator API and the deliverer share one event loop. A plugin tool that
calls ``time.sleep(30)`` (or any blocking call: a synchronous HTTP client, a CPU-bound loop)
froze them all, and the log said only that a ticket lapsed and a lease expired (an outside
probe). The watch's heartbeat runs on the loop; a thread looks at it, and when it is older than
`BLOCKED_AFTER_S` logs ``event loop blocked`` once, with where the loop's thread is (its
innermost frames: the tool's own function), then ``event loop unblocked`` with how long.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import time
import traceback
from pathlib import Path

from gateway.logs import event

__all__ = ["BLOCKED_AFTER_S", "LoopWatch"]

log = logging.getLogger("gateway.loop")

BLOCKED_AFTER_S = 5.0
"""How long the loop may go without running its heartbeat before it is said to be blocked."""
_BEAT_S = 0.5
_FRAMES = 3
"""How many of the loop thread's innermost frames the warning names."""


class LoopWatch:
    """Start with `start` on the loop to watch; `stop` ends the heartbeat and the thread."""

    def __init__(self, *, blocked_after_s: float = BLOCKED_AFTER_S, beat_s: float = _BEAT_S):
        self._after = blocked_after_s
        self._beat_s = beat_s
        self._last = time.monotonic()
        self._stopped = threading.Event()
        self._beat: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._loop_thread = 0

    def start(self) -> None:
        """Begin the heartbeat on the running loop, and the thread that watches it."""
        self._loop_thread = threading.get_ident()
        self._last = time.monotonic()
        self._beat = asyncio.get_running_loop().create_task(self._beating(), name="loop-watch")
        self._thread = threading.Thread(target=self._watch, name="loop-watch", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """End the heartbeat and the thread."""
        self._stopped.set()
        if self._beat is not None:
            self._beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beat
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 2 * self._beat_s)

    async def _beating(self) -> None:
        while True:
            self._last = time.monotonic()
            await asyncio.sleep(self._beat_s)

    def _watch(self) -> None:
        blocked_since: float | None = None
        while not self._stopped.wait(self._beat_s):
            last = self._last
            held = time.monotonic() - last
            if blocked_since is None and held > self._after:
                blocked_since = last
                log.warning(
                    event(
                        "event loop blocked",
                        seconds=round(held, 1),
                        where=self._where(),
                        note="every thread, the operator API and replies wait meanwhile: "
                        "a blocking call (time.sleep, a synchronous client) in a tool or "
                        "hook holds them all; make it async or run it in a thread (held "
                        "past GATEWAY_LEASE_SECONDS, its session's lease is lost and its "
                        "work begun again)",
                    )
                )
            elif blocked_since is not None and last > blocked_since:
                log.warning(event("event loop unblocked", seconds=round(last - blocked_since, 1)))
                blocked_since = None

    def _where(self) -> list[str]:
        """The loop thread's innermost frames, ``file:line in function`` (innermost last)."""
        frame = sys._current_frames().get(self._loop_thread)
        if frame is None:
            return []
        stack = traceback.extract_stack(frame)[-_FRAMES:]
        return [f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in stack]
