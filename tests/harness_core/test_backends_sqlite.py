"""The SQLite plumbing every backend stands on: the connection policy, the I/O thread's
close/cancel discipline (both orders of a close racing a call), errors in the owner's words."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from harness_core.backends.sqlite import ConnectionPolicy, Database, SqliteExecutor
from tests.support.sqlite_threads import count_hops


class Refused(Exception):
    """The owner's error (a store's SessionError, a broker's BrokerError...)."""


class _Tables(Database):
    def setup(self) -> None:
        self.conn.execute("CREATE TABLE IF NOT EXISTS t (v INTEGER)")


def _executor(path: Path, policy: ConnectionPolicy | None = None) -> SqliteExecutor[_Tables]:
    return SqliteExecutor(
        path,
        lambda: _Tables(path, policy or ConnectionPolicy()),
        name="test-sqlite",
        failed=lambda exc: Refused(f"failed: {type(exc).__name__}: {exc}"),
        closed_error=lambda: Refused("closed"),
    )


@pytest.fixture
async def io(tmp_path: Path) -> AsyncIterator[SqliteExecutor[_Tables]]:
    executor = _executor(tmp_path / "t.db")
    yield executor
    await executor.close()


class _Gate:
    """Work for the thread that stays there until `release` (as a commit's fsync would)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.released = threading.Event()

    def __call__(self, db: Database) -> str:
        self.entered.set()
        assert self.released.wait(10)
        db.conn.execute("INSERT INTO t VALUES (1)")
        return "done"

    async def running(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, 10)

    def release(self) -> None:
        self.released.set()


async def _idle(io: SqliteExecutor[_Tables]) -> bool:
    """Whether the thread's work ended (and the loop heard of it) within 5 s."""
    for _ in range(500):
        if not io.busy:
            return True
        await asyncio.sleep(0.01)
    return False


def _rows(path: Path) -> list[int]:
    conn = sqlite3.connect(path)
    try:
        return [v for (v,) in conn.execute("SELECT v FROM t")]
    finally:
        conn.close()


# -- close and a call racing it ------------------------------------------------------------------


async def test_a_call_submitted_before_close_finishes_and_close_waits_for_it(
    io: SqliteExecutor[_Tables], tmp_path: Path
) -> None:
    gate = _Gate()
    call = asyncio.ensure_future(io.call(gate))
    await gate.running()
    closing = asyncio.ensure_future(io.close())
    await asyncio.sleep(0.05)
    assert io.closed and not closing.done()  # refusing new calls, waiting for this one
    gate.release()
    assert await call == "done"  # it ran to its end and returned its result
    await closing
    assert io.db is None
    assert _rows(tmp_path / "t.db") == [1]


async def test_a_call_after_close_began_is_refused_at_once_and_never_runs(
    io: SqliteExecutor[_Tables],
) -> None:
    gate = _Gate()
    first = asyncio.ensure_future(io.call(gate))
    await gate.running()
    closing = asyncio.ensure_future(io.close())
    await asyncio.sleep(0)  # close has begun, and cannot finish while the gate holds the thread
    ran: list[str] = []
    with pytest.raises(Refused, match=r"^closed$"):
        await io.call(lambda db: ran.append("late"))
    gate.release()
    await first
    await closing
    with pytest.raises(Refused, match=r"^closed$"):  # and after it finished
        await io.call(lambda db: ran.append("later"))
    assert ran == []


async def test_close_is_idempotent_and_a_second_close_waits_for_the_first(
    io: SqliteExecutor[_Tables],
) -> None:
    gate = _Gate()
    call = asyncio.ensure_future(io.call(gate))
    await gate.running()
    first, second = asyncio.ensure_future(io.close()), asyncio.ensure_future(io.close())
    await asyncio.sleep(0.05)
    assert not first.done() and not second.done()
    gate.release()
    await asyncio.gather(call, first, second)
    await io.close()
    assert io.db is None


async def test_a_close_whose_caller_is_cancelled_still_closes(
    io: SqliteExecutor[_Tables],
) -> None:
    gate = _Gate()
    call = asyncio.ensure_future(io.call(gate))
    await gate.running()
    closing = asyncio.ensure_future(io.close())
    await asyncio.sleep(0)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    gate.release()
    assert await call == "done"
    await io.close()  # waits for the close that was left running
    assert io.db is None
    assert io.thread.pool._shutdown  # the thread was stopped


# -- cancellation --------------------------------------------------------------------------------


async def test_a_caller_cancelled_while_its_work_runs_leaves_the_thread_busy_until_it_ends(
    io: SqliteExecutor[_Tables], tmp_path: Path
) -> None:
    await io.call(lambda db: None)  # opened
    gate = _Gate()
    call = asyncio.ensure_future(io.call(gate))
    await gate.running()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    # the work still runs on the thread: the loop must not touch the connection beside it
    assert io.busy
    assert io.on_loop(lambda db: "on the loop") is None
    gate.release()
    assert await _idle(io)
    assert io.on_loop(lambda db: "on the loop") == "on the loop"
    assert _rows(tmp_path / "t.db") == [1]  # it ran to its end


async def test_a_call_cancelled_before_it_started_never_runs(
    io: SqliteExecutor[_Tables],
) -> None:
    gate = _Gate()
    first = asyncio.ensure_future(io.call(gate))
    await gate.running()
    ran: list[str] = []
    queued = asyncio.ensure_future(io.call(lambda db: ran.append("queued")))
    await asyncio.sleep(0)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    gate.release()
    await first
    await io.call(lambda db: None)  # after everything submitted before it
    assert ran == []
    assert not io.busy


# -- the loop and the thread ---------------------------------------------------------------------


async def test_reads_run_on_the_loop_while_idle_on_a_reader_while_busy_else_on_the_thread(
    io: SqliteExecutor[_Tables], monkeypatch: pytest.MonkeyPatch
) -> None:
    def count(c: sqlite3.Connection) -> int:
        return int(c.execute("SELECT count(*) FROM t").fetchone()[0])

    await io.call(lambda db: db.conn.execute("INSERT INTO t VALUES (7)"))
    hops = count_hops(io.thread.pool, monkeypatch)
    assert await io.read(count) == 1 and hops == []  # idle: on the loop
    gate = _Gate()
    held = asyncio.ensure_future(io.call(gate))
    await gate.running()
    assert await io.read(count) == 1 and len(hops) == 1  # busy: the read-only connection
    reading = asyncio.ensure_future(io.read(count, committed=False))
    await asyncio.sleep(0.05)
    assert not reading.done()  # not committed-only: behind the thread's work
    gate.release()
    assert await reading == 2 and len(hops) == 2
    await held
    assert await io.read(count, inline=False) == 2 and len(hops) == 3


# -- errors in the owner's words -----------------------------------------------------------------


async def test_what_the_file_system_refuses_is_the_owners_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    io = _executor(tmp_path / "file" / "t.db")
    try:
        with pytest.raises(Refused, match=r"^failed: (NotADirectoryError|FileExistsError): ") as e:
            await io.call(lambda db: None)
        assert isinstance(e.value.__cause__, OSError)
    finally:
        await io.close()


async def test_what_sqlite_refuses_is_the_owners_error(tmp_path: Path) -> None:
    (tmp_path / "t.db").write_bytes(b"not a database, " * 512)
    io = _executor(tmp_path / "t.db")
    try:
        with pytest.raises(Refused, match=r"^failed: DatabaseError: file is not a database$") as e:
            await io.call(lambda db: None)
        assert isinstance(e.value.__cause__, sqlite3.DatabaseError)
        assert io.db is None  # nothing half-open is kept: the next call tries again
    finally:
        await io.close()


async def test_an_error_of_the_work_itself_is_raised_as_it_is(
    io: SqliteExecutor[_Tables],
) -> None:
    def wrong(db: Database) -> None:
        raise KeyError("mine")

    with pytest.raises(KeyError, match="mine"):
        await io.call(wrong)
    assert await io.call(lambda db: "still usable") == "still usable"


# -- the policy ----------------------------------------------------------------------------------


def _pragmas(db: Database) -> dict[str, Any]:
    return {
        name: db.conn.execute(f"PRAGMA {name}").fetchone()[0]
        for name in ("journal_mode", "synchronous", "busy_timeout", "page_size", "foreign_keys")
    }


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (ConnectionPolicy(), {"synchronous": 1, "busy_timeout": 10_000, "page_size": 4096}),
        (
            ConnectionPolicy(synchronous="full", busy_timeout_ms=5_000, page_size=1024),
            {"synchronous": 2, "busy_timeout": 5_000, "page_size": 1024},
        ),
    ],
)
async def test_every_connection_gets_the_policy(
    tmp_path: Path, policy: ConnectionPolicy, expected: dict[str, Any]
) -> None:
    io = _executor(tmp_path / "deep" / "t.db", policy)
    try:
        got = await io.call(_pragmas)
    finally:
        await io.close()
    assert got == {"journal_mode": "wal", "foreign_keys": 0, **expected}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"synchronous": "off"}, "synchronous must be 'normal', 'effects' or 'full', got 'off'"),
        ({"page_size": 1000}, "page_size must be a power of two from 512 to 65536, got 1000"),
    ],
)
def test_a_policy_out_of_range_is_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        ConnectionPolicy(**options)


async def test_a_group_commit_keeps_the_others_when_one_fails(
    io: SqliteExecutor[_Tables], tmp_path: Path
) -> None:
    def insert(value: int) -> Callable[[sqlite3.Connection], int]:
        def op(conn: sqlite3.Connection) -> int:
            conn.execute("INSERT INTO t VALUES (?)", (value,))
            if value == 2:
                raise Refused("two")
            return value

        return op

    results = await io.call(lambda db: db.group([insert(1), insert(2), insert(3)]))
    assert results[0] == 1 and isinstance(results[1], Refused) and results[2] == 3
    assert _rows(tmp_path / "t.db") == [1, 3]  # the failed one left no trace
    with pytest.raises(Refused, match="two"):  # a lone one's error is raised
        await io.call(lambda db: db.group([insert(2)]))
    assert _rows(tmp_path / "t.db") == [1, 3]
