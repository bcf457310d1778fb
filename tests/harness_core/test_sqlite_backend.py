"""SQLite-only behaviour: fencing between connections, restore reads on indexes, schema guard."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import pytest

from harness_core import SessionRepo
from harness_core.errors import LeaseHeld, LeaseLost, SessionError
from harness_core.messages import Cost, TokenUsage
from harness_core.session.records import QueueEnqueued, Usage
from harness_core.session.types import BranchQuery, RecordQuery
from harness_core.storage.sqlite import PAGE_SIZE, SCHEMA_VERSION, SqliteSessionRepo
from harness_core.testing import ManualClock
from harness_core.testing.builders import operation_finished, operation_started, user_entry


async def test_two_connections_are_fenced_inside_the_transaction(tmp_path) -> None:
    clock = ManualClock()
    first = SqliteSessionRepo(tmp_path / "s.db", clock=clock)
    second = SqliteSessionRepo(tmp_path / "s.db", clock=clock)
    try:
        await first.create("s1")
        lease = await first.acquire_lease("s1", owner="A", ttl_ms=1000)
        a = await first.open("s1", lease=lease)
        await a.append_entry(user_entry("a"), "main")
        with pytest.raises(LeaseHeld):
            await second.acquire_lease("s1", owner="B", ttl_ms=1000)
        clock.advance(1001)
        taken = await second.acquire_lease("s1", owner="B", ttl_ms=1000)
        b = await second.open("s1", lease=taken)
        with pytest.raises(LeaseLost):
            await a.append_entry(user_entry("late"), "main")
        assert (await b.append_entry(user_entry("b"), "main")).parent_id == "a"
        assert [i.seq for i in await a.get_log()] == [1, 2], (
            "the stale writer's attempt left nothing"
        )
    finally:
        await first.close()
        await second.close()


def _plan(path, sql: str, args: tuple[object, ...]) -> str:
    conn = sqlite3.connect(path)
    try:
        return " ".join(row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, args))
    finally:
        conn.close()


async def test_restore_reads_are_index_seeks(tmp_path) -> None:
    repo = SqliteSessionRepo(tmp_path / "s.db")
    await repo.create("s1")
    lease = await repo.acquire_lease("s1", owner="A", ttl_ms=60_000)
    storage = await repo.open("s1", lease=lease)
    await storage.append_record(operation_started("run"))
    await repo.close()
    path = tmp_path / "s.db"
    lane_range = _plan(
        path,
        "SELECT seq, timestamp, payload FROM records "
        "WHERE session_id=? AND lane=? AND seq>=? ORDER BY seq",
        ("s1", "main", 1),
    )
    assert "USING INDEX records_by_lane" in lane_range and "SCAN" not in lane_range
    open_ops = _plan(
        path,
        "SELECT r.seq FROM open_operations o "
        "JOIN records r ON r.session_id=o.session_id AND r.seq=o.seq "
        "WHERE o.session_id=? AND o.lane=? ORDER BY o.seq DESC LIMIT 2",
        ("s1", "main"),
    )
    assert "SCAN" not in open_ops
    point = _plan(path, "SELECT parent_id FROM entries WHERE session_id=? AND id=?", ("s1", "x"))
    assert "USING INDEX entries_by_id" in point


async def test_record_queries_of_a_type_kind_or_run_are_index_seeks(tmp_path) -> None:
    # Each filter is an equality of the index, right before seq: a seek, not a row-by-row filter
    # of the lane's records (which the plan would show as a shorter index constraint).
    repo = SqliteSessionRepo(tmp_path / "s.db")
    await repo.create("s1")
    lease = await repo.acquire_lease("s1", owner="A", ttl_ms=60_000)
    storage = await repo.open("s1", lease=lease)
    await storage.append_record(operation_started("run"))
    await storage.append_record(operation_finished("fin", "run"))
    expected = {
        RecordQuery(lane="main", type="operation_finished", limit=1): (
            "lane_records_of_type (session_id=? AND lane=? AND type=?)"
        ),
        RecordQuery(lane="main", type="operation_started", operation_kind="run", limit=1): (
            "lane_records_of_kind (session_id=? AND lane=? AND op_kind=?)"
        ),
        RecordQuery(lane="main", type="queue_enqueued", after_seq=7, order="oldest_first"): (
            "lane_records_of_type (session_id=? AND lane=? AND type=? AND seq>?)"
        ),
        RecordQuery(lane="main", type="operation_finished", run_id="run", limit=1): (
            "records_by_run (session_id=? AND run_id=?)"
        ),
        RecordQuery(
            type="usage", after_seq=3
        ): "records_of_type (session_id=? AND type=? AND seq>?)",
        RecordQuery(type="operation_started", operation_kind="compaction"): (
            "records_of_kind (session_id=? AND op_kind=?)"
        ),
    }
    plans: list[str] = []
    for query in expected:
        executed: list[str] = []

        def trace(db: Any, log: list[str] = executed) -> None:
            db.conn.set_trace_callback(log.append)

        await repo.call(trace)
        await storage.find_records(query)
        await repo.call(lambda db: db.conn.set_trace_callback(None))
        (sql,) = [sql for sql in executed if "FROM records" in sql]
        plans.append(_plan(tmp_path / "s.db", sql, ()))
    await repo.close()
    for (query, index), plan in zip(expected.items(), plans, strict=True):
        assert plan == f"SEARCH records USING INDEX {index}", (query, plan)


async def test_a_version_1_database_is_upgraded_in_place(tmp_path) -> None:
    path = tmp_path / "s.db"
    repo = SqliteSessionRepo(path)
    await repo.create("s1")
    lease = await repo.acquire_lease("s1", owner="A", ttl_ms=60_000)
    storage = await repo.open("s1", lease=lease)
    await storage.create_lane("t1", None)
    for n, (lane, entry_id, cost) in enumerate(
        [("main", "a", 0.1), ("t1", "a", 0.2), ("t1", None, 0.7), ("main", "b", 0.3)]
    ):
        amount = TokenUsage(input=n + 1, cost=Cost(total=cost))
        usage = Usage(id=f"u{n}", lane=lane, cause="adjustment", entry_id=entry_id, usage=amount)
        await storage.append_record(usage)
    await storage.append_record(
        QueueEnqueued(id="q", lane="t1", queue="next_run", target=user_entry("x"))
    )
    answers = [
        await storage.get_usage(entry_id="a"),
        await storage.get_usage(entry_id="b"),
        await storage.get_usage(lane="main"),
        await storage.get_usage(lane="t1"),
        await storage.get_stats(),
    ]
    await repo.close()
    conn = sqlite3.connect(path)  # what version 1 left: its indexes, no usage sums
    conn.executescript(
        """
        DROP INDEX lane_records_of_type; DROP INDEX lane_records_of_kind;
        DROP INDEX records_of_type; DROP INDEX records_of_kind; DROP TABLE usage_sums;
        CREATE INDEX records_by_lane_type ON records (session_id, lane, type, op_kind, seq);
        CREATE INDEX records_by_type ON records (session_id, type, op_kind, seq);
        UPDATE schema_version SET version = 1;
        """
    )
    conn.commit()
    conn.close()
    repo = SqliteSessionRepo(path)
    reader = await repo.open("s1")
    assert [
        await reader.get_usage(entry_id="a"),
        await reader.get_usage(entry_id="b"),
        await reader.get_usage(lane="main"),
        await reader.get_usage(lane="t1"),
        await reader.get_stats(),
    ] == answers
    assert answers[0] == TokenUsage(input=1 + 2, cost=Cost(total=0.1 + 0.2))
    queued = await reader.find_records(RecordQuery(lane="t1", type="queue_enqueued"))
    assert [r.id for r in queued] == ["q"]
    await repo.close()
    conn = sqlite3.connect(path)
    indexes = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert conn.execute("SELECT version FROM schema_version").fetchone() == (SCHEMA_VERSION,)
    conn.close()
    assert "records_by_lane_type" not in indexes and "lane_records_of_type" in indexes


async def test_a_database_of_another_schema_version_is_refused(tmp_path) -> None:
    repo = SqliteSessionRepo(tmp_path / "s.db")
    await repo.create("s1")
    await repo.close()
    conn = sqlite3.connect(tmp_path / "s.db")
    conn.execute("UPDATE schema_version SET version = 99")
    conn.commit()
    conn.close()
    repo = SqliteSessionRepo(tmp_path / "s.db")
    with pytest.raises(SessionError) as caught:
        await repo.list()
    assert caught.value.code == "storage" and "schema version 99" in str(caught.value)
    await repo.close()


def _page_size(path) -> int:
    conn = sqlite3.connect(path)
    try:
        size: int = conn.execute("PRAGMA page_size").fetchone()[0]
        return size
    finally:
        conn.close()


async def _write_and_read(repo: SqliteSessionRepo, session: str) -> list[str]:
    await repo.create(session)
    lease = await repo.acquire_lease(session, owner="A", ttl_ms=60_000)
    storage = await repo.open(session, lease=lease)
    await storage.append_entry(user_entry(f"{session}-1"), "main")
    await storage.append_entry(user_entry(f"{session}-2"), "main")
    leaf = await storage.get_lane("main")
    assert leaf is not None and leaf.leaf_id is not None
    path = await storage.find_entries_on_branch(BranchQuery(start=leaf.leaf_id))
    return [stored.entry.id for stored in path]


async def test_a_new_database_gets_small_pages_and_an_old_one_keeps_its_own(tmp_path) -> None:
    repo = SqliteSessionRepo(tmp_path / "new.db")
    assert await _write_and_read(repo, "s1") == ["s1-2", "s1-1"]
    await repo.close()
    assert _page_size(tmp_path / "new.db") == PAGE_SIZE == 1024
    old = sqlite3.connect(tmp_path / "old.db")  # made by SQLite's default, as older code did
    old.execute("PRAGMA journal_mode=WAL")
    old.close()
    assert _page_size(tmp_path / "old.db") == 4096
    repo = SqliteSessionRepo(tmp_path / "old.db")
    assert await _write_and_read(repo, "s1") == ["s1-2", "s1-1"]
    await repo.close()
    assert _page_size(tmp_path / "old.db") == 4096
    repo = SqliteSessionRepo(tmp_path / "chosen.db", page_size=4096)
    assert await _write_and_read(repo, "s1") == ["s1-2", "s1-1"]
    await repo.close()
    assert _page_size(tmp_path / "chosen.db") == 4096


@pytest.mark.parametrize("size", [0, 100, 1000, 131072, -1024])
def test_a_page_size_that_sqlite_cannot_use_is_refused(tmp_path, size: int) -> None:
    with pytest.raises(SessionError, match="power of two") as caught:
        SqliteSessionRepo(tmp_path / "s.db", page_size=size)
    assert caught.value.code == "invalid_query"
    assert not (tmp_path / "s.db").exists()


@pytest.mark.parametrize("lanes", [1, 2, 5])
async def test_long_paths_read_the_same_dense_or_sparse(tmp_path, lanes: int) -> None:
    """A path read goes by the seq index where the path is dense and by parent links where it
    is sparse (D241): either way it gives what the reference backend gives, on lanes that
    interleave, move back over abandoned branches, and fork from each other."""
    from harness_core.storage.memory import MemorySessionRepo

    repos: list[SessionRepo] = [SqliteSessionRepo(tmp_path / "s.db"), MemorySessionRepo()]
    storages = []
    for repo in repos:
        await repo.create("s1")
        lease = await repo.acquire_lease("s1", owner="A", ttl_ms=60_000)
        storages.append(await repo.open("s1", lease=lease))
    names = ["main", *(f"t{k}" for k in range(1, lanes))]
    for storage in storages:
        for name in names[1:]:
            await storage.create_lane(name, None)
        for n in range(700):
            lane = names[n % lanes] if n % 7 else names[(n // 7) % lanes]
            await storage.append_entry(user_entry(f"e{n}"), lane)
            if n in (300, 500):  # back over what the lane appended since: an abandoned branch
                await storage.move_lane(lane, f"e{n - 40 * lanes}")
            if n == 400 and lanes > 1:  # a fork: t1 goes on from main's leaf
                leaf = await storage.get_lane("main")
                assert leaf is not None
                await storage.move_lane("t1", leaf.leaf_id)
    answers = []
    for storage in storages:
        lane_paths = [
            [e.id for e in await storage.read_lane_entries(name, after=None)] for name in names
        ]
        starts = ["e699", "e350", "e33", "e0"]
        branches = [
            [e.id for e in await storage.find_entries_on_branch(BranchQuery(start=start))]
            for start in starts
        ]
        limited = await storage.find_entries_on_branch(BranchQuery(start="e699", limit=100))
        answers.append((lane_paths, branches, [e.id for e in limited]))
    for repo in repos:
        await repo.close()
    assert answers[0] == answers[1]
    assert min(len(path) for path in answers[0][0]) >= 64  # past the first batch


async def test_opening_a_current_database_takes_no_write_lock(tmp_path) -> None:
    repo = SqliteSessionRepo(tmp_path / "s.db")
    await repo.create("s")
    await repo.close()
    writer = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # another process mid-write, holding the lock
    try:
        reopened = SqliteSessionRepo(tmp_path / "s.db", busy_timeout_ms=10_000)
        storage = await reopened.open("s")
        lanes = await asyncio.wait_for(storage.get_lanes(), 5)  # did not wait for the writer
        assert [lane.lane for lane in lanes] == ["main"]
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    await reopened.close()
