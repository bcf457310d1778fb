"""SQLite commits that are not durability points run on the loop; checkpoints only on the thread
(D251).

Under ``effects`` (the default) a commit that is not a durability point writes the WAL and
never fsyncs, so it runs on the event loop while the I/O thread is idle, as deferred writes do
(D254): no hop to the thread and back. SQLite's automatic checkpoint (which writes the database
and fsyncs it) is off on the store's connection; the store checkpoints on its I/O thread every
`CHECKPOINT_EVERY` commits instead. ``full`` fsyncs at every commit, so its commits all stay on
the thread. Observed on real files: which thread ran each statement (SQLite's own trace hook),
what was handed to the thread, what another connection sees.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

import harness_core as hc
from harness_core.session.durability import deferred_durability
from harness_core.storage import open_repo
from harness_core.storage.sqlite import (
    CHECKPOINT_EVERY,
    SqliteSessionRepo,
    SqliteSessionStorage,
    _Db,
)
from harness_core.testing.builders import custom_entry
from tests.harness_core.test_durability_points import one_turn
from tests.support.sqlite_threads import count_hops, hold_the_thread

pytestmark = pytest.mark.backends("sqlite")


async def opened(
    path: Path, synchronous: str = "effects"
) -> tuple[SqliteSessionRepo, SqliteSessionStorage]:
    repo = open_repo(f"sqlite:///{path}?synchronous={synchronous}")
    assert isinstance(repo, SqliteSessionRepo)
    await repo.create("s")
    lease = await repo.acquire_lease("s", owner="t", ttl_ms=60_000)
    storage = await repo.open("s", lease=lease)
    await storage.append_entry(custom_entry("e0"), "main")  # the connection is open
    return repo, storage


def committed_ids(path: Path) -> set[str]:
    """The entry ids another connection sees (what was committed, not what is pending)."""
    with sqlite3.connect(path) as other:
        return {row[0] for row in other.execute("SELECT id FROM entries")}


async def test_a_commit_that_is_not_a_point_runs_on_the_loop_a_point_on_the_thread(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, storage = await opened(tmp_path / "s.db")
    hops = count_hops(repo._io.thread.pool, monkeypatch)
    with deferred_durability():
        await storage.append_entry(custom_entry("e1"), "main")
    assert "e1" not in committed_ids(tmp_path / "s.db")  # deferred: not committed yet
    await storage.sync(point=False)
    assert "e1" in committed_ids(tmp_path / "s.db")
    assert hops == []  # the write and its commit both ran on the loop
    with deferred_durability():
        await storage.append_entry(custom_entry("e2"), "main")
    await storage.sync()  # a durability point: the WAL's fsync waits on the thread
    assert "e2" in committed_ids(tmp_path / "s.db") and len(hops) == 1
    await repo.close()


async def test_under_full_every_commit_stays_on_the_thread(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, storage = await opened(tmp_path / "s.db", "full")
    hops = count_hops(repo._io.thread.pool, monkeypatch)
    with deferred_durability():
        await storage.append_entry(custom_entry("e1"), "main")
    await storage.sync(point=False)  # SQLite fsyncs this commit itself: not on the loop
    assert "e1" in committed_ids(tmp_path / "s.db") and len(hops) == 1
    await repo.close()


async def test_while_the_thread_works_the_commit_waits_its_turn_there(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, storage = await opened(tmp_path / "s.db")
    with deferred_durability():
        await storage.append_entry(custom_entry("e1"), "main")
    hops = count_hops(repo._io.thread.pool, monkeypatch)
    held, release = await hold_the_thread(lambda hold: repo.call(hold, keep_open=True))
    syncing = asyncio.ensure_future(storage.sync(point=False))
    await asyncio.sleep(0.05)
    assert not syncing.done()  # never on the loop while the thread holds the connection
    release.set()
    await held
    await asyncio.wait_for(syncing, 5)
    assert "e1" in committed_ids(tmp_path / "s.db") and len(hops) == 2
    await repo.close()


async def warmed_turn(path: Path) -> tuple[hc.AgentHarness, SqliteSessionRepo, _Db]:
    """`one_turn`'s harness on the SQLite file `path`, one prompt in: its connection is open."""
    harness, repo = await one_turn(f"sqlite:///{path}")
    assert isinstance(repo, SqliteSessionRepo)
    assert isinstance(await harness.prompt("warm"), hc.Ok)
    db = repo._io.db
    assert db is not None
    return harness, repo, db


async def test_a_turn_hops_to_the_thread_only_for_its_durability_points(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness, repo, _ = await warmed_turn(tmp_path / "s.db")
    hops = count_hops(repo._io.thread.pool, monkeypatch)
    result = await harness.prompt("go")
    assert isinstance(result, hc.Ok) and result.value.kind == "completed", result
    # four commits: before each model request (loop), the `never` tool's intent and the end
    # (points, on the thread); the self-check's read runs on the loop
    assert len(hops) == 2
    await harness.close()
    await repo.close()


async def test_checkpoints_run_on_the_thread_every_so_many_commits_and_never_on_the_loop(
    backend: str, tmp_path: Path
) -> None:
    harness, repo, db = await warmed_turn(tmp_path / "s.db")
    assert db.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    loop_thread = threading.get_ident()
    statements: list[tuple[str, bool]] = []  # (statement, ran on the loop)
    db.conn.set_trace_callback(
        lambda sql: statements.append((sql, threading.get_ident() == loop_thread))
    )
    turns = 3 * CHECKPOINT_EVERY // 4 + 1  # four commits a turn: past three checkpoints
    for n in range(turns):
        assert isinstance(await harness.prompt(f"go {n}"), hc.Ok)
    db.conn.set_trace_callback(None)
    checkpoints = [on_loop for sql, on_loop in statements if "wal_checkpoint" in sql]
    commits = [on_loop for sql, on_loop in statements if sql == "COMMIT"]
    # one at the first thread commit past every `CHECKPOINT_EVERY`: three, or four when the
    # commits before the trace had come close to one
    assert len(checkpoints) in (3, 4) and not any(checkpoints), statements
    assert len(commits) == 4 * turns  # the self-check's reads are not commits of writes
    assert commits.count(True) == 2 * turns  # the two before model requests, on the loop
    await harness.close()
    await repo.close()
