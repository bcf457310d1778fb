"""The writes that join an open SQLite transaction carry its session state (D253).

While this connection holds the write lock nobody else can write, so the batches of deferred
writes that join an open transaction continue from the session's counters, lease and lane
leaves instead of reading them again, and a refused write (which refuses before it changes
anything) needs no savepoint. Observed on real files: SQLite's own trace of the statements,
another connection's view of what was committed, and the stored log.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

import harness_core as hc
from harness_core.errors import SessionError
from harness_core.session.durability import deferred_durability
from harness_core.storage.sqlite import SqliteSessionRepo, SqliteSessionStorage
from harness_core.testing.builders import custom_entry
from harness_core.testing.clock import ManualClock
from tests.harness_core.test_sqlite_loop_commits import warmed_turn

pytestmark = pytest.mark.backends("sqlite")


def committed(path: Path) -> list[tuple[str, str | None]]:
    """(id, parent id) of every entry another connection sees, in seq order."""
    with sqlite3.connect(path) as other:
        return list(other.execute("SELECT id, parent_id FROM entries ORDER BY seq"))


async def leased(
    path: Path, *, ttl_ms: int = 60_000, clock: ManualClock | None = None
) -> tuple[SqliteSessionRepo, hc.WriterLease, SqliteSessionStorage]:
    """A store at `path` with session "s", its writer's lease, and the storage it writes with."""
    repo = SqliteSessionRepo(path, clock=clock)
    await repo.create("s")
    lease = await repo.acquire_lease("s", owner="t", ttl_ms=ttl_ms)
    return repo, lease, await repo.open("s", lease=lease)


async def test_a_refused_write_between_deferred_ones_leaves_no_trace_and_the_rest_commit(
    backend: str, tmp_path: Path
) -> None:
    repo, _, storage = await leased(tmp_path / "s.db")
    with deferred_durability():
        await storage.append_entry(custom_entry("e1"), "main")
        with pytest.raises(SessionError) as refused:
            await storage.append_entry(custom_entry("e1"), "main")  # the id is used
        assert refused.value.code == "already_exists"
        with pytest.raises(SessionError) as unknown:
            await storage.append_entry(custom_entry("e2"), "nowhere")
        assert unknown.value.code == "unknown_lane"
        await storage.append_entry(custom_entry("e3"), "main")
    await storage.sync()
    assert committed(tmp_path / "s.db") == [("e1", None), ("e3", "e1")]
    stats = await storage.get_stats()
    assert stats.entries == 2
    await repo.close()
    reopened = SqliteSessionRepo(tmp_path / "s.db")  # what a restart reads: the same
    log = await (await reopened.open("s")).get_log()
    assert [item.seq for item in log] == list(range(1, len(log) + 1))
    await reopened.close()


async def test_a_write_that_changed_the_store_before_refusing_rolls_everything_back(
    backend: str, tmp_path: Path
) -> None:
    repo, lease, storage = await leased(tmp_path / "s.db")
    with deferred_durability():
        await storage.append_entry(custom_entry("e1"), "main")

    def wrote_then_refused(tx: Any) -> None:  # what no write of this store does (the guard)
        tx.conn.execute("UPDATE lanes SET leaf_id='bogus' WHERE session_id='s'")
        raise SessionError("invalid_payload", "refused after a change")

    with pytest.raises(SessionError) as failed:
        await repo.writes.submit(("s", lease, wrote_then_refused, True))
    assert failed.value.code == "storage"
    with pytest.raises(SessionError) as lost:
        await storage.sync()  # e1 went with the transaction: its session is told
    assert lost.value.code == "storage"
    assert committed(tmp_path / "s.db") == []
    lane = await storage.get_lane("main")
    assert lane is not None and lane.leaf_id is None
    await repo.close()


async def test_a_lease_renewed_by_one_batch_holds_for_the_next_in_the_same_transaction(
    backend: str, tmp_path: Path
) -> None:
    clock = ManualClock()
    repo, _, storage = await leased(tmp_path / "s.db", ttl_ms=1_000, clock=clock)
    clock.advance(600)  # past half-life: this write renews the lease to now + 1,000
    with deferred_durability():
        await storage.append_entry(custom_entry("e1"), "main")
        clock.advance(600)  # past the first expiry, within the renewed one
        await storage.append_entry(custom_entry("e2"), "main")
    await storage.sync()
    assert committed(tmp_path / "s.db") == [("e1", None), ("e2", "e1")]
    await repo.close()


async def test_a_turn_reads_its_session_once_per_transaction_and_takes_no_savepoint(
    backend: str, tmp_path: Path
) -> None:
    harness, repo, db = await warmed_turn(tmp_path / "s.db")
    statements: list[str] = []
    db.conn.set_trace_callback(statements.append)
    assert isinstance(await harness.prompt("go"), hc.Ok)
    db.conn.set_trace_callback(None)
    begins = sum(s == "BEGIN IMMEDIATE" for s in statements)
    session_reads = sum(s.startswith("SELECT s.last_seq") for s in statements)
    leaf_reads = sum(s.startswith("SELECT leaf_id FROM lanes") for s in statements)
    writes = sum(s.startswith(("INSERT INTO entries", "INSERT INTO records")) for s in statements)
    assert begins == 4 and writes == 11
    assert session_reads == begins  # one per transaction, not one per write
    assert leaf_reads <= begins + 1  # once per transaction (and the self-check's read)
    assert not any(s.startswith(("SAVEPOINT", "RELEASE", "ROLLBACK")) for s in statements)
    await harness.close()
    await repo.close()
