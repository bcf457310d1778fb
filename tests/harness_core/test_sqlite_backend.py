"""SQLite-only behaviour: fencing between connections, restore reads on indexes, schema guard."""

from __future__ import annotations

import sqlite3

import pytest

from harness_core.errors import LeaseHeld, LeaseLost, SessionError
from harness_core.storage.sqlite import SqliteSessionRepo
from harness_core.testing import ManualClock
from harness_core.testing.builders import operation_started, user_entry


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
