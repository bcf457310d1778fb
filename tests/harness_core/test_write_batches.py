"""Batched commits: the writes no effect separates commit together, and no effect runs early.

A procedure's writes are deferred (`deferred_durability`); `HarnessRuntime.durable` commits them
before every model request, tool run, hook handler and sleep, and before an outcome returns.
Proven here on SQLite against a second connection, which sees only what was committed: at every
effect it sees everything the harness had written. A process killed inside a batch loses the
batch's writes and nothing an effect depended on; a batch lost in a shared transaction faults
its session instead of letting it act on writes that are gone.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import harness_core as hc
from harness_core.errors import SessionError
from harness_core.session.contract import SessionStorage
from harness_core.session.durability import deferred_durability, durability_deferred
from harness_core.storage.jsonl import JsonlSessionRepo
from harness_core.storage.sqlite import SqliteSessionRepo
from harness_core.testing.builders import custom_entry
from tests.support.batch_kill import open_harness
from tests.support.sqlite_threads import count_hops

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.backends("sqlite")


class SeqTracker:
    """A storage that remembers the newest seq any write returned (what the harness wrote)."""

    def __init__(self, inner: SessionStorage) -> None:
        self._inner = inner
        self.newest = 0
        self.writes = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not name.startswith(("append_", "move_lane", "create_lane", "set_")):
            return attr

        async def tracked(*args: Any, **kwargs: Any) -> Any:
            result = await attr(*args, **kwargs)
            stored = result[0] if isinstance(result, tuple) else result
            self.newest = max(self.newest, stored.seq)
            self.writes += 1
            return result

        return tracked


def committed_seq(path: Path) -> int:
    """The newest seq another connection can see: what is committed."""
    conn = sqlite3.connect(path)
    try:
        row = conn.execute("SELECT last_seq FROM sessions WHERE session_id='s'").fetchone()
        return int(row[0])
    finally:
        conn.close()


def write_commits(statements: list[str]) -> int:
    """How many write transactions the traced statements committed (a read's COMMIT ends no
    write: it fsyncs nothing)."""
    count, writing = 0, False
    for statement in statements:
        if statement.startswith("BEGIN IMMEDIATE"):
            writing = True
        elif statement == "COMMIT":
            count += writing
            writing = False
    return count


class LookupArgs(BaseModel):
    item: str


@pytest.mark.parametrize("synchronous", ["normal", "full"])
async def test_every_effect_sees_everything_written_before_it_committed(
    backend: str, tmp_path: Path, synchronous: str
) -> None:
    path = tmp_path / "store.db"
    repo = SqliteSessionRepo(path, synchronous=synchronous)  # type: ignore[arg-type]
    await repo.create("s")
    lease = await repo.acquire_lease("s", owner="t", ttl_ms=60_000)
    tracker = SeqTracker(await repo.open("s", lease=lease))
    seen: list[tuple[str, int, int]] = []

    def look(effect: str) -> None:
        seen.append((effect, tracker.newest, committed_seq(path)))

    def respond(request: hc.ModelRequest) -> hc.AssistantMessage:
        look("model")
        if isinstance(request.messages[-1], hc.ToolResultMessage):
            return hc.scripted.text("done")
        return hc.scripted.tool_call("lookup", {"item": "a"}, call_id=f"c{len(seen)}")

    async def lookup(args: LookupArgs, ctx: hc.ToolContext) -> str:
        look("tool")
        return "found " + args.item

    options = hc.AgentHarnessOptions(
        storage=tracker,
        model_client=hc.ScriptedModel(responder=respond),
        model=hc.ModelRef(provider="scripted", model_id="m"),
        tools=[hc.Tool(name="lookup", description="d", execute=lookup, args_model=LookupArgs)],
    )
    harness, _ = await hc.AgentHarness.create(options)

    async def after_tool(event: Any) -> None:
        look("hook")

    harness.hooks.on("after_tool", after_tool)
    statements: list[str] = []
    await repo.call(lambda db: db.conn.set_trace_callback(statements.append))
    for turn in range(3):
        writes_before = tracker.writes
        result = await harness.prompt(f"turn {turn}")
        assert isinstance(result, hc.Ok) and result.value.kind == "completed", result
        look("outcome")
        commits = write_commits(statements)
        statements.clear()
        # 11 writes per turn, committed at the barriers before the model calls and the tool,
        # and at the operation's end; the acceptance commits with the first batch (D112)
        assert tracker.writes - writes_before == 11
        assert commits <= 4, commits
    await repo.call(lambda db: db.conn.set_trace_callback(None))
    assert {effect for effect, _, _ in seen} == {"model", "tool", "hook", "outcome"}
    for effect, written, committed in seen:
        assert committed == written, f"{effect} ran with writes {committed + 1}..{written} open"
    await harness.close()
    await repo.close()


class HeldSync:
    """A storage whose procedure barriers wait for `release` (a surface call's sync does not)."""

    def __init__(self, inner: SessionStorage) -> None:
        self._inner = inner
        self.release = asyncio.Event()
        self.holding = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def sync(self, *, point: bool = True) -> None:
        if durability_deferred():
            self.holding.set()
            await self.release.wait()
        await self._inner.sync(point=point)


async def test_a_prompts_acceptance_commits_with_its_first_batch_and_a_repeat_makes_it_durable(
    backend: str, tmp_path: Path
) -> None:
    path = tmp_path / "store.db"
    repo = SqliteSessionRepo(path)
    await repo.create("s")
    lease = await repo.acquire_lease("s", owner="t", ttl_ms=60_000)
    held = HeldSync(await repo.open("s", lease=lease))
    options = hc.AgentHarnessOptions(
        storage=held,
        model_client=hc.ScriptedModel([hc.scripted.text("hi")]),
        model=hc.ModelRef(provider="scripted", model_id="m"),
    )
    harness, _ = await hc.AgentHarness.create(options)
    prompted = asyncio.ensure_future(harness.prompt("hello", entry_id="in-1"))
    try:
        # the run reached its first barrier (before the model call): nothing committed yet
        await asyncio.wait_for(held.holding.wait(), 10)
        assert committed_seq(path) == 0
        # a service repeating the input hears "accepted" only once that is durable
        started = await harness.start("hello", entry_id="in-1")
        assert isinstance(started, hc.Ok)
        assert committed_seq(path) >= 3  # the operation's start, the message, the step attempt
    finally:
        held.release.set()
    result = await asyncio.wait_for(prompted, 10)
    assert isinstance(result, hc.Ok) and result.value.kind == "completed"
    assert (await started.value.outcome()).run_id == result.value.run_id
    await harness.close()
    await repo.close()


async def two_sessions(
    path: Path, first: str, second: str
) -> tuple[SqliteSessionRepo, hc.WriterLease, hc.WriterLease]:
    """A SQLite store with two sessions, each with a writer lease (one shared transaction)."""
    repo = SqliteSessionRepo(path)
    leases = []
    for session in (first, second):
        await repo.create(session)
        leases.append(await repo.acquire_lease(session, owner="t", ttl_ms=60_000))
    return repo, leases[0], leases[1]


def boom(tx: Any) -> None:
    """A write that fails the way a full disk does (not a refusal: the transaction rolls back)."""
    raise sqlite3.OperationalError("disk I/O error")


async def test_a_batch_lost_in_a_shared_transaction_faults_its_session(
    backend: str, tmp_path: Path
) -> None:
    path = tmp_path / "store.db"
    repo, lease_a, lease_b = await two_sessions(path, "a", "b")
    a = await repo.open("a", lease=lease_a)
    with deferred_durability():
        stored = await a.append_entry(custom_entry("kept-in-memory-only"), "main")
    assert (await a.get_entry(stored.id)) is not None  # visible to its own reads

    # another session's write fails in the transaction that holds a's deferred write
    with pytest.raises(SessionError) as failed:
        await repo.writes.submit(("b", lease_b, boom, False))
    assert failed.value.code == "storage"
    with pytest.raises(SessionError) as lost:
        await a.sync()
    assert lost.value.code == "storage"
    await repo.close()
    reopened = SqliteSessionRepo(path)
    storage = await reopened.open("a")
    assert await storage.get_entry(stored.id) is None
    assert (await storage.get_stats()).entries == 0
    await reopened.close()


async def test_a_harness_whose_batch_was_lost_faults_before_the_tool_runs(
    backend: str, tmp_path: Path
) -> None:
    repo, lease, other = await two_sessions(tmp_path / "store.db", "s", "other")
    ran: list[str] = []
    storage = await repo.open("s", lease=lease)
    append_entry = storage.append_entry

    async def append_then_fail_the_shared_transaction(entry: Any, lane: str) -> Any:
        stored = await append_entry(entry, lane)
        if getattr(getattr(entry, "message", None), "role", None) == "assistant":
            # right after the assistant's tool call was written (deferred), before the tool's
            # barrier: another session's failing write rolls the shared transaction back
            with pytest.raises(SessionError):
                await repo.writes.submit(("other", other, boom, False))
        return stored

    storage.append_entry = append_then_fail_the_shared_transaction  # type: ignore[method-assign]

    async def lookup(args: LookupArgs, ctx: hc.ToolContext) -> str:
        ran.append(args.item)
        return "found"

    options = hc.AgentHarnessOptions(
        storage=storage,
        model_client=hc.ScriptedModel(
            [hc.scripted.tool_call("lookup", {"item": "a"}, call_id="c1"), hc.scripted.text("ok")]
        ),
        model=hc.ModelRef(provider="scripted", model_id="m"),
        tools=[hc.Tool(name="lookup", description="d", execute=lookup, args_model=LookupArgs)],
    )
    harness, _ = await hc.AgentHarness.create(options)
    with pytest.raises(hc.HarnessFault):
        await harness.prompt("go")
    assert ran == []  # the tool's intent was lost: the tool never started
    await repo.close()


async def test_a_kill_inside_a_batch_loses_only_what_nothing_acted_on(
    backend: str, tmp_path: Path
) -> None:
    path = tmp_path / "store.db"
    marks = tmp_path / "tool-runs"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.support.batch_kill", str(path), str(marks),
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == -signal.SIGKILL, err.decode()[-2000:]
    assert b"KILLING" in out
    assert not marks.exists()  # it died after the model answered, before the tool's barrier

    repo = SqliteSessionRepo(path, synchronous="full")
    reader = await repo.open("s")
    kinds = [
        getattr(item, "record", getattr(item, "entry", None)) for item in await reader.get_log()
    ]
    types = [getattr(k, "type", None) for k in kinds]
    # the batch after the model call (usage, the assistant's tool call, the tool intent) is gone;
    # the step attempt before the call (its intent) is there
    assert types[-1] == "step_attempt", types
    assert "tool_started" not in types

    async with asyncio.timeout(30):  # the dead process's lease lapses
        while True:
            try:
                lease = await repo.acquire_lease("s", owner="recovery", ttl_ms=60_000)
                break
            except hc.LeaseHeld:
                await asyncio.sleep(0.2)
    harness, suspended = await open_harness(await repo.open("s", lease=lease), marks)
    assert len(suspended) == 1
    lane = await harness.lane("main")
    assert lane is not None
    result = await lane.resume()
    assert isinstance(result, hc.Ok) and result.value.kind == "completed", result
    assert marks.read_text().splitlines() == ["ran"]  # once, after the recovery
    await harness.close()
    await repo.close()


async def tool_turns(repo: hc.SessionRepo) -> tuple[hc.AgentHarness, SeqTracker]:
    """A harness on session "s" whose every prompt is one tool call and an answer (11 writes)."""
    await repo.create("s")
    lease = await repo.acquire_lease("s", owner="t", ttl_ms=60_000)
    tracker = SeqTracker(await repo.open("s", lease=lease))
    calls = iter(range(100))

    def respond(request: hc.ModelRequest) -> hc.AssistantMessage:
        if isinstance(request.messages[-1], hc.ToolResultMessage):
            return hc.scripted.text("done")
        return hc.scripted.tool_call("lookup", {"item": "a"}, call_id=f"c{next(calls)}")

    async def lookup(args: LookupArgs, ctx: hc.ToolContext) -> str:
        return "found"

    harness, _ = await hc.AgentHarness.create(
        hc.AgentHarnessOptions(
            storage=tracker,
            model_client=hc.ScriptedModel(responder=respond),
            model=hc.ModelRef(provider="scripted", model_id="m"),
            tools=[hc.Tool(name="lookup", description="d", execute=lookup, args_model=LookupArgs)],
        )
    )
    return harness, tracker


async def test_deferred_writes_into_an_open_transaction_skip_the_io_thread(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = SqliteSessionRepo(tmp_path / "store.db", synchronous="full")
    harness, tracker = await tool_turns(repo)
    assert isinstance(await harness.prompt("warm"), hc.Ok)
    hops = count_hops(repo._io.thread.pool, monkeypatch)
    flushes: list[object] = []
    flush = repo.writes._flush

    def flush_counted() -> Any:
        flushes.append(None)
        return flush()

    monkeypatch.setattr(repo.writes, "_flush", flush_counted)
    writes_before = tracker.writes
    result = await harness.prompt("go")
    assert isinstance(result, hc.Ok) and result.value.kind == "completed"
    assert tracker.writes - writes_before == 11
    # every write runs on the loop, the first of each of the 4 batches opening its
    # transaction there (the write lock is free: nothing else writes this database), and so
    # does the self-check's one read (D118); the I/O thread only commits the 4 batches
    assert len(hops) == 4, len(hops)
    # and each write is run by its writer's task: no write queue task
    assert flushes == [], len(flushes)
    await harness.close()
    await repo.close()


async def test_a_write_lock_another_connection_holds_is_waited_for_off_the_loop(
    backend: str, tmp_path: Path
) -> None:
    repo = SqliteSessionRepo(tmp_path / "store.db", synchronous="full")
    harness, tracker = await tool_turns(repo)
    assert isinstance(await harness.prompt("warm"), hc.Ok)
    other = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process's writer, mid-transaction
    before = tracker.writes
    prompt = asyncio.ensure_future(harness.prompt("go"))
    loop = asyncio.get_running_loop()
    started = loop.time()
    for _ in range(10):  # the loop keeps turning: nothing waits for the lock on it
        await asyncio.sleep(0.02)
    # waiting on the loop would stall it for the busy timeout (10 s by default); the bound is
    # half of that, so a slow machine cannot trip it
    assert loop.time() - started < 5
    assert not prompt.done()
    assert tracker.writes == before  # the first write waits for the lock on the I/O thread
    other.execute("ROLLBACK")
    other.close()
    result = await asyncio.wait_for(prompt, 10)
    assert isinstance(result, hc.Ok) and result.value.kind == "completed", result
    assert tracker.writes - before == 11
    await harness.close()
    await repo.close()


async def test_a_refused_deferred_write_leaves_no_transaction_holding_the_lock(
    backend: str, tmp_path: Path
) -> None:
    repo = SqliteSessionRepo(tmp_path / "store.db")
    await repo.create("s")
    lease = await repo.acquire_lease("s", owner="t", ttl_ms=60_000)
    storage = await repo.open("s", lease=lease)
    with deferred_durability(), pytest.raises(SessionError) as refused:
        await storage.append_entry(custom_entry("x"), "no-such-lane")
    assert refused.value.code == "unknown_lane"
    other = sqlite3.connect(tmp_path / "store.db", isolation_level=None, timeout=0)
    other.execute("BEGIN IMMEDIATE")  # another process can write: the lock was let go
    other.execute("ROLLBACK")
    other.close()
    await repo.close()


@pytest.mark.backends("jsonl")
async def test_jsonl_fsyncs_once_per_batch(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsynced: list[int] = []
    real_fsync = os.fsync

    def counted(fd: int) -> None:
        fsynced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counted)
    repo = JsonlSessionRepo(tmp_path, fsync="always")
    harness, tracker = await tool_turns(repo)
    fsynced.clear()
    result = await harness.prompt("go")
    assert isinstance(result, hc.Ok) and result.value.kind == "completed", result
    assert tracker.writes == 11
    assert len(fsynced) <= 4, fsynced  # one per batch, not one per line
    await harness.close()
    await repo.close()
