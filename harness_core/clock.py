"""The injected clock: the only place in harness_core allowed to read wall time or sleep."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """Wall time in Unix milliseconds and a way to wait; injected so tests control both."""

    def now_ms(self) -> int:
        """Return the current Unix time in whole milliseconds."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` (a manual clock returns when time is advanced past the deadline)."""
        ...


class SystemClock:
    """The real clock."""

    def now_ms(self) -> int:
        """Return the current Unix time in whole milliseconds."""
        return time.time_ns() // 1_000_000

    async def sleep(self, seconds: float) -> None:
        """Sleep on the event loop."""
        await asyncio.sleep(seconds)
