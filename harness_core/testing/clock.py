"""A manual clock for tests: time moves only when the test says so."""

from __future__ import annotations

import asyncio

__all__ = ["ManualClock"]


class ManualClock:
    """A `Clock` whose time only moves on `advance`; sleepers wake when their deadline passes."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms
        self._sleepers: list[tuple[int, asyncio.Future[None]]] = []

    def now_ms(self) -> int:
        """The current manual time."""
        return self._now

    async def sleep(self, seconds: float) -> None:
        """Return once the clock has been advanced to now + `seconds` or beyond."""
        deadline = self._now + round(seconds * 1000)
        if deadline <= self._now:
            await asyncio.sleep(0)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((deadline, waiter))
        await waiter

    def advance(self, ms: int) -> None:
        """Move time forward by `ms` and wake the sleepers whose deadline has come."""
        self._now += ms
        due = [(d, w) for d, w in self._sleepers if d <= self._now]
        self._sleepers = [(d, w) for d, w in self._sleepers if d > self._now]
        for _, waiter in due:
            if not waiter.done():
                waiter.set_result(None)
