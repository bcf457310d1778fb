"""What the SQLite broker does beyond the contract: retention, group commit, errors, polling."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gateway.broker.contract import BrokerError, NewInboxItem
from gateway.broker.sqlite import SqliteBroker
from harness_core.testing import ManualClock
from tests.support.sqlite_threads import LockedOnTheLoop, count_hops, hold_the_thread

DAY = 86_400_000


def _item(key: str, session: str = "s1") -> NewInboxItem:
    return NewInboxItem(
        session=session, lane="web:t", dedupe_key=key, kind="message", payload={"k": key}
    )


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def make(tmp_path: Path, clock: ManualClock) -> AsyncIterator[Callable[..., SqliteBroker]]:
    opened: list[SqliteBroker] = []

    def make(**options: object) -> SqliteBroker:
        opened.append(SqliteBroker(tmp_path / "broker.db", clock=clock, **options))  # type: ignore[arg-type]
        return opened[-1]

    yield make
    for broker in opened:
        await broker.close()


def _rows(path: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute(sql).fetchall()


async def test_an_acked_item_is_forgotten_after_its_dedupe_window(
    make: Callable[..., SqliteBroker], clock: ManualClock
) -> None:
    broker = make(dedupe_ttl_ms=DAY)
    first = (await broker.inbox.append(_item("k"))).item
    await broker.inbox.ack("s1", first.id)
    clock.advance(DAY)
    again = await broker.inbox.append(_item("k"))  # the window passed: a new message
    assert again.duplicate is False
    assert again.item.id > first.id
    assert again.item.status == "pending"


async def test_pending_and_rejected_items_keep_their_keys_past_the_window(
    make: Callable[..., SqliteBroker], clock: ManualClock
) -> None:
    broker = make(dedupe_ttl_ms=DAY)
    pending = (await broker.inbox.append(_item("p"))).item
    rejected = (await broker.inbox.append(_item("r"))).item
    await broker.inbox.reject("s1", rejected.id, "unroutable")
    clock.advance(10 * DAY)
    assert (await broker.inbox.append(_item("p"))).item.id == pending.id
    assert (await broker.inbox.append(_item("r"))).item.reason == "unroutable"
    assert await broker.purge() == 0


async def test_acked_items_are_purged_lazily_once_their_window_passed(
    make: Callable[..., SqliteBroker], clock: ManualClock
) -> None:
    broker = make(dedupe_ttl_ms=DAY, purge_interval_ms=60_000)
    for n in range(5):
        item = (await broker.inbox.append(_item(f"old{n}"))).item
        await broker.inbox.ack("s1", item.id)
    clock.advance(DAY + 60_000)
    await broker.inbox.append(_item("new"))  # an append purges, at most once per interval
    assert _rows(broker.path, "SELECT dedupe_key FROM inbox") == [("new",)]


async def test_settled_deliveries_are_purged_after_their_retention_pending_never(
    make: Callable[..., SqliteBroker], clock: ManualClock
) -> None:
    broker = make(settled_retention_ms=DAY, dead_retention_ms=14 * DAY)
    outbox = broker.outbox
    t = clock.now_ms()
    for delivery_id in ("delivered", "dead", "pending", "later"):
        await outbox.enqueue(delivery_id, "s1", "web:t", {}, now_ms=t)
    claims = {c.delivery.id: c for c in await outbox.claim("d", now_ms=t, limit=9, lease_ms=1)}
    assert await outbox.settle_delivered(claims["delivered"], now_ms=t)
    assert await outbox.settle_dead(claims["dead"], reason="x", now_ms=t)
    await outbox.enqueue("discarded", "s1", "web:t", {}, now_ms=t)  # unclaimed: discarded at once
    discarded = await outbox.discard("discarded", now_ms=t)
    assert discarded is not None
    assert discarded.changed
    assert await outbox.settle_retry(
        claims["later"], due_at_ms=t + 30 * DAY, reason="x", unknown_outcome=False, now_ms=t
    )
    assert await broker.purge(now_ms=t + DAY - 1) == 0
    assert await broker.purge(now_ms=t + DAY) == 2
    assert await outbox.get("delivered") is None
    assert await outbox.get("discarded") is None
    assert await broker.purge(now_ms=t + 14 * DAY) == 1
    assert await outbox.get("dead") is None
    assert await broker.purge(now_ms=t + 100 * DAY) == 0
    assert {d.id for d in await outbox.list("pending")} == {"pending", "later"}


async def test_dead_letters_are_kept_when_their_retention_is_none(
    make: Callable[..., SqliteBroker], clock: ManualClock
) -> None:
    broker = make(dead_retention_ms=None)
    t = clock.now_ms()
    await broker.outbox.enqueue("d1", "s1", "web:t", {}, now_ms=t)
    (claimed,) = await broker.outbox.claim("d", now_ms=t, limit=1, lease_ms=1)
    await broker.outbox.settle_dead(claimed, reason="x", now_ms=t)
    assert await broker.purge(now_ms=t + 1000 * DAY) == 0
    assert [d.id for d in await broker.outbox.list("dead")] == ["d1"]


async def test_concurrent_writes_share_transactions_and_each_commits(
    make: Callable[..., SqliteBroker],
) -> None:
    broker = make()
    results = await asyncio.gather(*(broker.inbox.append(_item(f"k{n}")) for n in range(300)))
    assert [r.item.dedupe_key for r in results] == [f"k{n}" for n in range(300)]
    assert [r.item.id for r in results] == sorted(r.item.id for r in results)
    assert len(await broker.inbox.pending("s1", limit=1000)) == 300


async def test_a_failing_write_in_a_batch_leaves_no_trace_and_the_others_commit(
    make: Callable[..., SqliteBroker],
) -> None:
    broker = make()

    def half_then_fail(conn: sqlite3.Connection, now: int) -> None:
        conn.execute("INSERT INTO threads VALUES ('s1', 'web:x', '{}', '{}', 0)")
        raise sqlite3.IntegrityError("refused")

    appends = [broker.inbox.append(_item(f"k{n}")) for n in range(3)]
    results = await asyncio.gather(
        appends[0], broker.write(half_then_fail), *appends[1:], return_exceptions=True
    )
    assert isinstance(results[1], BrokerError)
    assert results[1].code == "storage"
    assert len(await broker.inbox.pending("s1")) == 3
    assert await broker.threads.get("s1", "web:x") is None


async def test_a_closed_broker_refuses_calls_and_releases_its_waiters(
    make: Callable[..., SqliteBroker],
) -> None:
    broker = make()
    waiting = asyncio.ensure_future(broker.inbox.take_session("w", wait_ms=60_000))
    draining = asyncio.ensure_future(broker.outbox.wait(60_000))
    await asyncio.sleep(0.05)
    await broker.close()
    assert await asyncio.wait_for(waiting, 5) is None
    await asyncio.wait_for(draining, 5)
    with pytest.raises(BrokerError) as caught:
        await broker.inbox.append(_item("k"))
    assert caught.value.code == "closed"


async def test_storage_failures_are_broker_errors(tmp_path: Path) -> None:
    (tmp_path / "broker.db").mkdir()
    broker = SqliteBroker(tmp_path / "broker.db")
    with pytest.raises(BrokerError) as caught:
        await broker.inbox.append(_item("k"))
    assert caught.value.code == "storage"
    await broker.close()


async def test_another_schema_version_is_refused(tmp_path: Path) -> None:
    broker = SqliteBroker(tmp_path / "broker.db")
    await broker.audit.list()
    await broker.close()
    with sqlite3.connect(tmp_path / "broker.db") as conn:
        conn.execute("UPDATE broker_schema SET version = 99")
    again = SqliteBroker(tmp_path / "broker.db")
    with pytest.raises(BrokerError, match="schema 99") as caught:
        await again.audit.list()
    assert caught.value.code == "storage"
    await again.close()


async def test_a_waiter_sees_another_process_s_writes_by_polling(
    make: Callable[..., SqliteBroker], clock: ManualClock
) -> None:
    waiter = make(poll_interval_ms=500)
    writer = make()  # another process on the same file: its writes wake nobody here
    waiting = asyncio.ensure_future(waiter.inbox.take_session("w", wait_ms=60_000))
    draining = asyncio.ensure_future(waiter.outbox.wait(60_000))
    await asyncio.sleep(0.05)
    await writer.inbox.append(_item("k", session="s9"))
    await writer.outbox.enqueue("r1", "s9", "web:t", {}, now_ms=clock.now_ms())
    await asyncio.sleep(0.05)
    assert not waiting.done() and not draining.done()
    clock.advance(500)
    ticket = await asyncio.wait_for(waiting, 5)
    assert ticket is not None
    assert ticket.session == "s9"
    await asyncio.wait_for(draining, 5)


async def test_claims_are_recorded_with_their_owner(
    make: Callable[..., SqliteBroker], clock: ManualClock
) -> None:
    broker = make(visibility_timeout_ms=5_000)
    await broker.inbox.append(_item("k"))
    ticket = await broker.inbox.take_session("worker-7")
    assert ticket is not None
    now = clock.now_ms()
    assert _rows(broker.path, "SELECT session, owner, available_at_ms FROM session_claims") == [
        ("s1", "worker-7", now + 5_000)
    ]


async def test_reads_run_on_the_loop_while_the_thread_is_idle(
    make: Callable[..., SqliteBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = make()
    await broker.inbox.append(_item("a"))
    hops = count_hops(broker._io.thread.pool, monkeypatch)
    assert [item.dedupe_key for item in await broker.inbox.pending("s1")] == ["a"]
    assert await broker.marks.get("m") is None
    assert await broker.threads.get("s1", "web:t") is None
    assert hops == []  # the hop would cost more than these reads
    assert await broker.threads.list("s1") == ()  # every thread of a session: on the thread
    await broker.inbox.append(_item("b"))  # writes commit on the thread
    assert len(hops) == 2


async def test_a_read_while_the_thread_works_runs_on_the_reader_connection(
    make: Callable[..., SqliteBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = make()
    await broker.inbox.append(_item("a"))  # acknowledged: committed
    hops = count_hops(broker._io.thread.pool, monkeypatch)
    held, release = await hold_the_thread(broker._io.call)  # busy with a write
    # every acknowledged write is committed: a snapshot of the committed state has them all
    pending = await asyncio.wait_for(broker.inbox.pending("s1"), 5)
    assert [item.dedupe_key for item in pending] == ["a"]
    assert len(hops) == 1  # only the held call: the read did not queue behind it
    release.set()
    await held


async def test_a_read_that_meets_another_connections_lock_runs_on_the_thread(
    make: Callable[..., SqliteBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = make()
    await broker.inbox.append(_item("a"))
    hops = count_hops(broker._io.thread.pool, monkeypatch)
    db = broker._io.db
    assert db is not None
    locked = LockedOnTheLoop(db.conn)
    monkeypatch.setattr(db, "conn", locked)
    assert len(await broker.inbox.pending("s1")) == 1
    assert len(hops) == 1  # refused on the loop, read on the thread (which may wait)
    locked.locked = False
    assert len(await broker.inbox.pending("s1")) == 1
    assert len(hops) == 1


async def test_acceptances_and_claims_are_fsynced_and_bookkeeping_is_not(
    make: Callable[..., SqliteBroker], clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under `effects` (the default, D233) an fsync of the WAL guards what the world depends on:
    an acceptance (its 202, its Slack ack) and a delivery's claim (before its send); a session
    ticket, a settlement and an outbox enqueue ride on the next such point."""
    from harness_core.backends import sqlite as sqlite_family

    fsynced: list[str] = []
    real = sqlite_family.fsync_file

    def counted(path: Path) -> None:
        fsynced.append(path.name)
        real(path)

    monkeypatch.setattr(sqlite_family, "fsync_file", counted)
    broker = make()
    await broker.inbox.backlog()  # the file and its schema (set up once, a point of its own)
    fsynced.clear()
    item = (await broker.inbox.append(_item("k"))).item
    assert fsynced == ["broker.db-wal"]  # the acceptance, before its caller acknowledges it
    fsynced.clear()
    ticket = await broker.inbox.take_session("w")
    assert ticket is not None
    await broker.inbox.ack("s1", item.id)
    await broker.inbox.done(ticket)
    assert await broker.outbox.enqueue("d1", "s1", "web:t", {"text": "hi"}, now_ms=clock.now_ms())
    assert fsynced == []  # bookkeeping: durable against a process crash, no fsync
    claimed = await broker.outbox.claim("w", now_ms=clock.now_ms(), limit=1, lease_ms=1_000)
    assert [c.delivery.id for c in claimed] == ["d1"]
    assert fsynced == ["broker.db-wal"]  # the claim before its send, and everything before it
    fsynced.clear()
    assert await broker.outbox.settle_delivered(claimed[0], now_ms=clock.now_ms())
    assert fsynced == []


async def test_full_and_normal_brokers_make_no_fsync_of_their_own(
    make: Callable[..., SqliteBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness_core.backends import sqlite as sqlite_family

    fsynced: list[Path] = []
    monkeypatch.setattr(sqlite_family, "fsync_file", fsynced.append)
    for synchronous in ("full", "normal"):
        broker = make(synchronous=synchronous)
        await broker.inbox.append(_item(f"k-{synchronous}"))
        await broker.close()
    assert fsynced == []
