"""A lane's restore reads and a run's records cost the same whatever the history, on every backend.

Each read (`read_lane_slice`, which holds the lane's newest `operation_finished`; a run's
finish found by its run id) runs on a session holding few or many records, and its work is
metered where each backend does it: Python function calls (every backend decodes and filters
in Python), SQLite virtual-machine steps, and bytes Redis sent. Work must not grow with the
history.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any, Literal

import pytest
import redis

from harness_core import SessionRepo
from harness_core.messages import Cost, TokenUsage
from harness_core.session.contract import SessionStorage
from harness_core.session.records import Record, Usage
from harness_core.session.types import (
    LaneMove,
    LogItem,
    RecordQuery,
    SessionMetadata,
    StoredEntry,
    StoredRecord,
)
from harness_core.storage.sqlite import SqliteSessionRepo
from harness_core.testing.builders import (
    operation_finished,
    operation_started,
    step_attempt,
    user_entry,
)
from tests.support.backends import ALL_BACKENDS, new_repo

pytestmark = pytest.mark.backends(*ALL_BACKENDS)

FEW, MANY = 40, 1200
Shape = Literal["open run", "compactions only", "usage, no run", "after last run"]
SHAPES: tuple[Shape, ...] = ("open run", "compactions only", "usage, no run", "after last run")


def shape_log(shape: Shape, count: int) -> list[LogItem]:
    """A log whose lane ``target`` holds `count` records of `shape` (lane ``other`` as many)."""
    items: list[LogItem] = []
    leaves: dict[str, str | None] = {"target": None, "other": None}

    def record(record: Record) -> None:
        items.append(StoredRecord(seq=len(items) + 1, timestamp=1, record=record))

    def entry(lane: str, entry_id: str) -> None:
        parent = leaves[lane]
        stored = StoredEntry(
            seq=len(items) + 1, timestamp=1, lane=lane, parent_id=parent, entry=user_entry(entry_id)
        )
        items.append(stored)
        leaves[lane] = entry_id

    def usage(lane: str, n: int) -> None:
        amount = TokenUsage(input=1, cost=Cost(total=0.001))
        record(Usage(id=f"{lane}-u{n}", lane=lane, cause="adjustment", usage=amount))

    def operation(n: int, kind: Literal["compaction", "navigation"]) -> None:
        record(operation_started(f"op{n}", lane="target", kind=kind))
        record(operation_finished(f"op{n}-fin", f"op{n}", lane="target"))

    for lane in ("target", "other"):
        items.append(
            LaneMove(seq=len(items) + 1, timestamp=1, lane=lane, leaf_id=None, created=True)
        )
    if shape == "after last run":
        record(operation_started("run", lane="target"))
        record(operation_finished("fin", "run", lane="target"))
    for n in range(count):
        usage("other", n)
        if shape in ("open run", "usage, no run") or (shape == "after last run" and n % 2):
            usage("target", n)
        elif n % 2 == 0:
            operation(n, "compaction" if n % 4 else "navigation")
    if shape == "open run":
        entry("target", "anchor")
        record(operation_started("run", lane="target", source_leaf_id="anchor"))
        for n in range(3):
            record(step_attempt(f"a{n}", "run", 1, f"own{n}", lane="target"))
            entry("target", f"own{n}")
    return items


class Meter:
    """Counts the work a read does: Python calls, plus what the backend reports."""

    def __init__(self, backend_work: Callable[[], Awaitable[int]]) -> None:
        self._backend_work = backend_work

    async def measure(self, read: Callable[[], Awaitable[object]]) -> tuple[int, int]:
        calls = 0

        def profile(frame: FrameType, event: str, arg: Any) -> None:
            nonlocal calls
            if event in ("call", "c_call"):
                calls += 1

        before = await self._backend_work()
        sys.setprofile(profile)
        try:
            await read()
        finally:
            sys.setprofile(None)
        return calls, await self._backend_work() - before


@pytest.fixture
async def backend(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[SessionRepo, Meter]]:
    """A repository of the backend the test runs on (see conftest.py) and its work meter."""
    name = request.param
    server = request.getfixturevalue("redis_server") if name == "redis" else None
    prefix = request.getfixturevalue("redis_prefix") if name == "redis" else None
    repo = new_repo(name, tmp_path, redis=server, prefix=prefix)
    work: Callable[[], Awaitable[int]]
    if isinstance(repo, SqliteSessionRepo):
        await repo.list()  # opens the connection
        steps = [0]

        def count_steps() -> int:
            steps[0] += 1
            return 0

        await repo.call(lambda db: db.conn.set_progress_handler(count_steps, 1))

        async def work() -> int:
            return steps[0]

    elif server is not None:
        stats = redis.Redis(port=server.port)

        async def work() -> int:
            return int(stats.info("stats")["total_net_output_bytes"])

    else:

        async def work() -> int:
            return 0

    yield repo, Meter(work)
    await repo.close()


async def _restore_read(storage: SessionStorage) -> None:
    await storage.read_lane_slice("target")


@pytest.mark.parametrize("shape", SHAPES)
async def test_a_lanes_restore_read_does_not_grow_with_its_history(
    backend: tuple[SessionRepo, Meter], shape: Shape
) -> None:
    repo, meter = backend
    work: list[tuple[int, int]] = []
    for count in (FEW, MANY):
        session_id = f"s{count}"
        await repo.import_session(
            SessionMetadata(id=session_id, created_at=1), shape_log(shape, count)
        )
        storage = await repo.open(session_id)
        await _restore_read(storage)  # warm caches (scripts, statements) before measuring
        work.append(await meter.measure(partial(_restore_read, storage)))
    (few_calls, few_backend), (many_calls, many_backend) = work
    assert many_calls <= few_calls * 1.2, f"Python calls grew: {few_calls} -> {many_calls}"
    assert many_backend <= few_backend * 1.2 + 64, (
        f"backend work grew: {few_backend} -> {many_backend}"
    )


def runs_log(count: int) -> list[LogItem]:
    """`count` finished runs on lane ``main``, each with a step, a usage record and its finish."""
    items: list[LogItem] = []

    def record(record: Record) -> None:
        items.append(StoredRecord(seq=len(items) + 1, timestamp=1, record=record))

    for n in range(count):
        record(operation_started(f"run{n}"))
        record(step_attempt(f"a{n}", f"run{n}", 1, f"e{n}"))
        amount = TokenUsage(input=1, cost=Cost(total=0.001))
        record(Usage(id=f"u{n}", lane="main", cause="adjustment", run_id=f"run{n}", usage=amount))
        record(operation_finished(f"fin{n}", f"run{n}"))
    return items


async def test_a_runs_records_cost_the_same_however_many_runs_came_after(
    backend: tuple[SessionRepo, Meter],
) -> None:
    # What an idempotent replay asks long after the fact: how did run 0 finish?
    repo, meter = backend
    work: list[tuple[int, int]] = []
    for count in (FEW, MANY):
        session_id = f"s{count}"
        await repo.import_session(SessionMetadata(id=session_id, created_at=1), runs_log(count))
        storage = await repo.open(session_id)
        query = RecordQuery(lane="main", type="operation_finished", run_id="run0")
        assert [r.id for r in await storage.find_records(query)] == ["fin0"]
        work.append(await meter.measure(partial(storage.find_records, query)))
    (few_calls, few_backend), (many_calls, many_backend) = work
    assert many_calls <= few_calls * 1.2, f"Python calls grew: {few_calls} -> {many_calls}"
    assert many_backend <= few_backend * 1.2 + 64, (
        f"backend work grew: {few_backend} -> {many_backend}"
    )
