"""Tier C crash matrix: every trajectory driven manually, cut after every released action.

Each canonical trajectory runs under `drive="manual"`; after **every** `execute_action()` the
backend itself is snapshotted (memory: its log; SQLite: an online backup of the database file;
Redis: an atomic copy of the session's keys under a new prefix). Every snapshot is a crash
point: it is reopened, restored and resumed, and the result is snapshotted and recovered
again. After each recovery the invariants hold (see `check_invariants`), a `replay="never"`
tool never ran twice across the live run and its recoveries, and the live state equals a fresh
reduction (the fixed point). The crash points come from the released actions alone, so an
effect added to a procedure adds its crash points here without touching this file.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from harness_core import SessionRepo
from harness_core._runtime.gate import ActionInfo
from harness_core.session.types import LogItem, SessionMetadata
from harness_core.storage.memory import MemorySessionRepo
from harness_core.storage.redis_streams import RedisSessionRepo
from harness_core.storage.sqlite import SqliteSessionRepo
from harness_core.testing import ManualClock
from harness_core.testing.invariants import (
    Counters,
    assert_fixed_point,
    check_invariants,
    parked_deferred,
    resume_all,
    shape,
    tool_of,
)
from harness_core.testing.trajectories import SCENARIOS, Run, Scenario, open_run, prompt
from tests.support.backends import new_repo
from tests.support.manual import drive
from tests.support.matrix_coverage import CRASH_POINTS
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.backends("memory", "sqlite", "redis")
_copies = itertools.count()


@dataclass
class Backend:
    """Makes repositories of one backend and snapshots them."""

    name: str
    directory: Path
    server: RedisServer | None = None
    repos: list[SessionRepo] = field(default_factory=list)

    def fresh(self) -> SessionRepo:
        n = next(_copies)
        repo = new_repo(
            self.name,
            self.directory / f"db{n}",
            clock=ManualClock(),
            redis=self.server,
            prefix=f"cm{n}",
        )
        self.repos.append(repo)
        return repo

    async def snapshot(self, repo: SessionRepo, run: Run) -> Callable[[], Awaitable[SessionRepo]]:
        """Freeze the durable state now; the returned function opens a copy of it."""
        if isinstance(repo, SqliteSessionRepo):
            target = self.directory / f"snap{next(_copies)}.sqlite"
            source = sqlite3.connect(repo.path)
            copy = sqlite3.connect(target)
            source.backup(copy)  # an online, consistent copy of the file (WAL included)
            source.close()
            copy.close()

            async def open_sqlite() -> SessionRepo:
                reopened = SqliteSessionRepo(target, clock=ManualClock())
                self.repos.append(reopened)
                return reopened

            return open_sqlite
        if isinstance(repo, RedisSessionRepo):
            assert self.server is not None
            old = repo.prefix
            new = f"cm{next(_copies)}"
            client = redis.Redis(port=self.server.port)
            keys = list(client.scan_iter(f"{old}:*", count=1000))
            with client.pipeline(transaction=True) as pipe:  # MULTI: one instant of the store
                for key in keys:
                    pipe.copy(key, new.encode() + key[len(old) :])
                pipe.execute()
            client.close()

            async def open_redis() -> SessionRepo:
                reopened = RedisSessionRepo(self.server.url, prefix=new, clock=ManualClock())  # type: ignore[union-attr]
                self.repos.append(reopened)
                return reopened

            return open_redis
        log = await run.storage.get_log()

        async def open_memory() -> SessionRepo:
            reopened = MemorySessionRepo(clock=ManualClock())
            await reopened.import_session(SessionMetadata(id="s", created_at=1), log)
            self.repos.append(reopened)
            return reopened

        return open_memory

    async def dispose(self, repo: SessionRepo) -> None:
        """Close a copy and drop its data (keeps the Redis keyspace small for SCAN)."""
        await repo.close()
        self.repos.remove(repo)
        if isinstance(repo, RedisSessionRepo) and self.server is not None:
            client = redis.Redis(port=self.server.port)
            keys = list(client.scan_iter(f"{repo.prefix}:*", count=1000))
            if keys:
                client.unlink(*keys)
            client.close()
        elif isinstance(repo, SqliteSessionRepo):
            _remove_database(repo.path)

    async def close(self) -> None:
        for repo in list(self.repos):
            await self.dispose(repo)


def _remove_database(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


@pytest.fixture
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    """Repositories of the backend the test runs on (see conftest.py), and their snapshots."""
    server = request.getfixturevalue("redis_server") if request.param == "redis" else None
    made = Backend(request.param, tmp_path, server)
    yield made
    await made.close()


@dataclass
class CrashPoint:
    index: int
    after: ActionInfo
    open_copy: Callable[[], Awaitable[SessionRepo]]
    live: Counter[str]
    """Tool invocations (by idempotency key) the live run had made by then."""


async def recover(
    scenario: Scenario, repo: SessionRepo, ids: str
) -> tuple[tuple[LogItem, ...], Counters, Run]:
    run = await open_run(scenario, repo, ids, create=False)
    await resume_all(run.harness, scenario.decide, unstick=scenario.unstick)
    await assert_fixed_point(run.harness)
    return await run.storage.get_log(), run.counters, run


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_every_released_action_is_a_recoverable_crash_point(
    scenario: Scenario, backend: Backend
) -> None:
    repo = backend.fresh()
    live = Counters()
    run = await open_run(scenario, repo, "live-", create=True, drive="manual", counters=live)
    points: list[CrashPoint] = []

    async def cut(lane: str, action: ActionInfo) -> None:
        copy = await backend.snapshot(repo, run)
        points.append(CrashPoint(len(points), action, copy, Counter(live.invocations)))

    work = scenario.drive(run.harness) if scenario.drive else prompt(run.harness)
    await drive(run.harness, work, cut)
    assert points, "the trajectory released no action"
    declarations = scenario.recovery_replay or scenario.replay
    never = {name for name, replay in scenario.replay.items() if replay == "never"}
    for point in points:
        where = f"crash after action {point.index} ({point.after})"
        copy = await point.open_copy()
        prefix = await (await copy.open("s")).get_log()
        log, counters, first = await recover(scenario, copy, f"r{point.index}-")
        check_invariants(prefix, log, counters, declarations)
        for key, runs in counters.invocations.items():
            never_tool = tool_of(log, key) in never | {None}  # no start record: count as never
            assert point.live[key] + runs <= 1 or not never_tool, where
        # recovery twice: the recovered state recovers to itself
        again_copy = await (await backend.snapshot(copy, first))()
        again, counters_again, _ = await recover(scenario, again_copy, f"q{point.index}-")
        if not parked_deferred(log):
            assert shape(again) == shape(log), where
        assert sum(counters_again.executions.values()) == 0, where
        await backend.dispose(again_copy)
        await backend.dispose(copy)
    CRASH_POINTS[(backend.name, scenario.name)] = len(points)
