"""Which lanes of a session are in memory: loaded on first use, idle ones dropped (LRU).

A session may hold many thousands of lanes; `AgentHarness.create` restores only those with an
open operation (and ``main``). Every other lane is restored from storage the first time a call
needs it, and an idle lane is dropped again when more than `max_idle_lanes` idle lanes are
loaded. Correctness rests on one rule: a lane has at most one `LaneRuntime` (one mutation line)
at a time. So loading and creating a lane run under a per-name lock, and a lane is dropped only
while no call holds it (`pinned`), nothing executes on it and no operation is open on it; a
dropped lane's state is all in storage, so reloading restores an equal state.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

from harness_core._runtime.lane import HarnessRuntime, LaneRuntime
from harness_core._runtime.reduction import LaneState
from harness_core._runtime.restore import restore_lane
from harness_core.errors import HarnessFault, RecordLogCorruption, SessionError
from harness_core.events import Fault

__all__ = ["LaneTable"]


class LaneTable:
    """The loaded lanes of a harness (`HarnessRuntime.lanes`, oldest use first) and their loads."""

    def __init__(self, runtime: HarnessRuntime, max_idle: int) -> None:
        self._rt = runtime
        self._max_idle = max(0, max_idle)
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._pins: dict[str, int] = {}

    def loaded(self, name: str) -> LaneRuntime | None:
        """The lane if it is in memory (marked as just used), else None; never reads storage."""
        lanes = self._rt.lanes
        lane = lanes.pop(name, None)
        if lane is not None:
            lanes[name] = lane  # dicts keep insertion order: the end is the newest use
        return lane

    async def get(self, name: str) -> LaneRuntime | None:
        """The lane, restored from storage on first use; None if the session has no such lane.

        Two concurrent first uses restore it once (the second waits for the first). A lane
        whose log cannot be restored (`RecordLogCorruption`) is loaded *faulted*, reported by
        a `Fault` event once, and stays loaded.
        """
        lane = self.loaded(name)
        if lane is not None:
            return lane
        async with self.exclusive(name):
            lane = self.loaded(name)
            if lane is not None:
                return lane
            lane = await self._restore(name)
            if lane is not None:
                self.insert(lane)
            return lane

    @contextlib.asynccontextmanager
    async def exclusive(self, name: str) -> AsyncIterator[None]:
        """Hold lane `name`'s load lock: no other load or creation of that name runs meanwhile."""
        lock, users = self._locks.get(name, (asyncio.Lock(), 0))
        self._locks[name] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[name]
            if users == 1:
                del self._locks[name]
            else:
                self._locks[name] = (lock, users - 1)

    @contextlib.contextmanager
    def pinned(self, name: str) -> Iterator[None]:
        """Keep lane `name` loaded while a call uses it.

        A call may hold the lane's runtime across awaits: dropping it then would let a reload
        make a second mutation line.
        """
        self._pins[name] = self._pins.get(name, 0) + 1
        try:
            yield
        finally:
            count = self._pins[name] - 1
            if count:
                self._pins[name] = count
            else:
                del self._pins[name]
                self._trim()  # the call's lane may just have become idle

    def insert(self, lane: LaneRuntime) -> None:
        """Add a lane just loaded or created (under `exclusive`).

        Then drop idle lanes over the limit, least recently used first.
        """
        self._rt.lanes[lane.name] = lane
        self._trim(counted=lane.name)

    def _trim(self, counted: str | None = None) -> None:
        """Drop idle lanes over the limit, oldest use first.

        `counted` (the lane being inserted, still under its load lock) counts as idle but
        stays: it is the newest use.
        """
        lanes = self._rt.lanes
        if len(lanes) <= self._max_idle + 1:
            return  # cheap common case: cannot be over the limit
        idle = [o for o in lanes.values() if o.name == counted or self._droppable(o)]
        for other in idle[: max(0, len(idle) - self._max_idle)]:
            if other.name != counted:
                del lanes[other.name]
                other.context.drop()

    def _droppable(self, lane: LaneRuntime) -> bool:
        return (
            lane.name != "main"  # the harness itself: always loaded
            and lane.fault is None  # reported once, when first found
            and lane.task is None
            and lane.state.operation is None
            and not lane._line.locked()  # a job mid-commit: its state update is yet to land
            and lane.name not in self._pins
            and lane.name not in self._locks
        )

    async def _restore(self, name: str) -> LaneRuntime | None:
        """Read lane `name` from storage (None: no such lane)."""
        storage = self._rt.storage
        try:
            state = await restore_lane(storage, name)
        except SessionError as exc:
            if exc.code == "unknown_lane":
                return None
            raise
        except RecordLogCorruption as exc:
            pointer = await storage.get_lane(name)
            return self.faulted(name, pointer.leaf_id if pointer is not None else None, exc)
        return LaneRuntime(self._rt, name, state)

    def faulted(self, name: str, leaf_id: str | None, cause: RecordLogCorruption) -> LaneRuntime:
        """A lane whose log cannot be restored: every call on it raises its `HarnessFault`.

        One lane's impossible log faults that lane, not the session's other threads.
        """
        lane = LaneRuntime(self._rt, name, LaneState(name, leaf_id))
        lane.fault = HarnessFault(f"lane {name!r} cannot be restored: {cause}")
        lane.fault.__cause__ = cause
        self._rt.events.emit(Fault(message=str(lane.fault), lane=name))
        return lane
