"""SQLite reads on the event loop, never waiting (D118, D121).

A storage's read runs on the loop when the repository's thread has nothing to do (the same rule
as deferred writes), so the connection is never used by both at once; while the thread works,
a read of a session holding no deferred write runs on a second, read-only connection, and one
holding a deferred write waits its turn (it must see that write); a read that meets another
connection's lock goes to the thread, which waits for it; a read of a whole session stays on
the thread.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from harness_core.session.durability import deferred_durability
from harness_core.session.types import EntryQuery
from harness_core.storage.sqlite import SqliteSessionRepo, SqliteSessionStorage
from harness_core.testing.builders import custom_entry
from tests.support.sqlite_threads import LockedOnTheLoop, count_hops, hold_the_thread

pytestmark = pytest.mark.backends("sqlite")


async def opened(tmp_path: Path) -> tuple[SqliteSessionRepo, SqliteSessionStorage]:
    repo = SqliteSessionRepo(tmp_path / "store.db")
    await repo.create("s")
    lease = await repo.acquire_lease("s", owner="t", ttl_ms=60_000)
    storage = await repo.open("s", lease=lease)
    for n in range(3):
        await storage.append_entry(custom_entry(f"e{n}"), "main")
    return repo, storage


async def test_bounded_reads_run_on_the_loop_while_the_thread_is_idle(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, storage = await opened(tmp_path)
    hops = count_hops(repo._io.thread.pool, monkeypatch)
    stored = await storage.get_entry("e1")
    assert stored is not None and stored.entry.id == "e1"
    assert (await storage.get_stats()).entries == 3
    assert (await storage.get_lane("main")) is not None
    assert len(await storage.find_entries(EntryQuery(limit=2))) == 2
    assert hops == []
    # a whole session's reads stay on the thread
    assert len(await storage.get_log()) >= 3
    assert len(await storage.find_entries()) == 3
    assert len(await storage.get_lanes()) == 1
    assert len(hops) == 3
    await repo.close()


async def test_a_read_while_the_thread_works_runs_on_the_reader_connection(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, storage = await opened(tmp_path)
    hops = count_hops(repo._io.thread.pool, monkeypatch)
    held, release = await hold_the_thread(lambda hold: repo.call(hold, keep_open=True))
    # the session holds no deferred write: what is committed is all that was acknowledged
    stored = await asyncio.wait_for(storage.get_entry("e2"), 5)
    assert stored is not None and stored.entry.id == "e2"
    assert (await storage.get_stats()).entries == 3
    assert len(hops) == 1  # only the held call: the reads did not queue behind it
    release.set()
    await held
    await repo.close()


async def test_a_read_of_a_session_with_deferred_writes_waits_for_the_thread(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, storage = await opened(tmp_path)
    with deferred_durability():  # acknowledged, in the open transaction, not committed
        await storage.append_entry(custom_entry("e3"), "main")
    hops = count_hops(repo._io.thread.pool, monkeypatch)
    held, release = await hold_the_thread(lambda hold: repo.call(hold, keep_open=True))
    read = asyncio.ensure_future(storage.get_entry("e3"))
    await asyncio.sleep(0.05)
    assert not read.done()  # a committed view would miss its own write: it waits its turn
    assert len(hops) == 2
    release.set()
    await held
    stored = await read
    assert stored is not None and stored.entry.id == "e3"  # a storage sees its own writes
    await repo.close()


async def test_a_read_that_meets_another_connections_lock_runs_on_the_thread(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, storage = await opened(tmp_path)
    hops = count_hops(repo._io.thread.pool, monkeypatch)
    db = repo._io.db
    assert db is not None
    locked = LockedOnTheLoop(db.conn)
    monkeypatch.setattr(db, "conn", locked)
    stored = await storage.get_entry("e0")
    assert stored is not None and stored.entry.id == "e0"
    assert len(hops) == 1  # refused on the loop, read on the thread (which may wait)
    locked.locked = False
    assert (await storage.get_entry("e1")) is not None
    assert len(hops) == 1  # the next read runs on the loop again
    await repo.close()
