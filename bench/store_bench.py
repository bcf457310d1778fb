"""Session store benchmark: append throughput, bytes per entry, restore reads vs history size.

    python bench/store_bench.py                  # every backend, starts its own redis-server
    python bench/store_bench.py --quick          # smaller sizes, for a smoke run
    python bench/store_bench.py --shapes-only    # only the lane-shape table (--no-shapes: none)
    python bench/store_bench.py --backends sqlite,redis --redis-url redis://127.0.0.1:6379/0

Appends are 1 KB user messages; "1 lane" awaits each append before the next (a lane's writes
are sequential), "16 lanes" runs 16 such writers at once. Restore reads are what restoring a
lane with an open operation costs: find_open_operations + read_operation_records +
read_lane_entries back to the operation's anchor, on a session whose total history is 1,000 or
100,000 entries (90% in other lanes, 10% earlier in the same lane). Figures are medians of
several trials; the ratio 100k/1k is what shows whether restore depends on history.

Lane shapes: the same restore read as `AgentHarness.create()` does per lane (`read_lane_slice`:
open operations, the newest run start, next-run queue records, the open operation's records and
entries, the newest `operation_finished`: one storage call), on a lane holding few or
many records of one shape: an open run (20 steps), only compactions and navigations, usage
adjustments and no run, many records after its last (finished) run. Other lanes hold as much
traffic again. The ratio many/few must stay near 1 for every shape.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import redis

from harness_core import SessionRepo
from harness_core.messages import Cost, TokenUsage, user_message
from harness_core.session.entries import MessageEntry
from harness_core.session.records import (
    OperationStarted,
    Record,
    RunIntent,
    StepAttempt,
    Usage,
)
from harness_core.session.types import (
    LaneMove,
    LogItem,
    SessionMetadata,
    StoredEntry,
    StoredRecord,
)
from harness_core.storage.jsonl import JsonlSessionRepo
from harness_core.storage.memory import MemorySessionRepo
from harness_core.storage.redis_streams import RedisSessionRepo
from harness_core.storage.sqlite import SqliteSessionRepo
from harness_core.testing.builders import (
    TEST_CONFIGURATION,
    operation_finished,
    operation_started,
    step_attempt,
    user_entry,
)

TEXT = "x" * 1000
OWN_ENTRIES = 20
OTHER_LANES = 8


class Backend:
    def __init__(
        self,
        name: str,
        make: Callable[[str], SessionRepo],
        size: Callable[[str, int], float | None],
    ) -> None:
        self.name, self.make, self.size = name, make, size


async def _writer(repo: SessionRepo, session_id: str, lanes: int):
    await repo.create(session_id)
    lease = await repo.acquire_lease(session_id, owner="bench", ttl_ms=3_600_000)
    storage = await repo.open(session_id, lease=lease)
    for lane in range(lanes):
        await storage.create_lane(f"l{lane}", None)
    return storage


async def appends_per_second(
    backend: Backend, workdir: str, n: int, lanes: int, trial: int
) -> tuple[float, float | None]:
    repo = backend.make(workdir)
    session_id = f"append-{lanes}-{trial}"
    storage = await _writer(repo, session_id, lanes)
    entries = [
        MessageEntry(id=f"{session_id}-e{i:07d}", message=user_message(TEXT)) for i in range(n)
    ]

    async def lane(index: int) -> None:
        for entry in entries[index::lanes]:
            await storage.append_entry(entry, f"l{index}")

    start = time.perf_counter()
    await asyncio.gather(*(lane(i) for i in range(lanes)))
    elapsed = time.perf_counter() - start
    await repo.close()
    size = backend.size(session_id, n) if lanes == 1 and trial == 0 else None
    return n / elapsed, size


def history(session_id: str, total: int) -> tuple[list[LogItem], str, str]:
    """A valid log: `total` entries, 90% on other lanes, then the target lane's open run."""
    items: list[LogItem] = []
    leaves: dict[str, str | None] = {}

    def add(item: LogItem) -> None:
        items.append(item)

    def entry(lane: str, entry_id: str) -> None:
        add(
            StoredEntry(
                seq=len(items) + 1,
                timestamp=1,
                lane=lane,
                parent_id=leaves[lane],
                entry=MessageEntry(id=entry_id, message=user_message(TEXT)),
            )
        )
        leaves[lane] = entry_id

    for lane in ["target", *(f"o{i}" for i in range(OTHER_LANES))]:
        add(LaneMove(seq=len(items) + 1, timestamp=1, lane=lane, leaf_id=None, created=True))
        leaves[lane] = None
    before = total // 10
    for i in range(total - before - OWN_ENTRIES):
        lane = f"o{i % OTHER_LANES}"
        entry(lane, f"{session_id}-{lane}-{i}")
        if i % 10 == 0:
            add(
                StoredRecord(
                    seq=len(items) + 1,
                    timestamp=1,
                    record=Usage(
                        id=f"{session_id}-u{i}",
                        lane=lane,
                        cause="adjustment",
                        usage=TokenUsage(input=1),
                    ),
                )
            )
    for i in range(before):
        entry("target", f"{session_id}-old{i}")
    anchor = leaves["target"]
    assert anchor is not None
    run_id = f"{session_id}-run"
    add(
        StoredRecord(
            seq=len(items) + 1,
            timestamp=1,
            record=OperationStarted(
                id=run_id,
                lane="target",
                source_leaf_id=anchor,
                intent=RunIntent(original_prompt=(), initial_messages=()),
                configuration=TEST_CONFIGURATION,
            ),
        )
    )
    for i in range(OWN_ENTRIES):
        add(
            StoredRecord(
                seq=len(items) + 1,
                timestamp=1,
                record=StepAttempt(
                    id=f"{session_id}-a{i}",
                    lane="target",
                    run_id=run_id,
                    step="assistant",
                    attempt=1,
                    result_entry_id=f"{session_id}-own{i}",
                ),
            )
        )
        entry("target", f"{session_id}-own{i}")
    return items, run_id, anchor


async def restore_read_ms(backend: Backend, workdir: str, total: int, reads: int) -> float:
    repo = backend.make(workdir)
    session_id = f"restore-{total}"
    items, run_id, anchor = history(session_id, total)
    await repo.import_session(SessionMetadata(id=session_id, created_at=1), items)
    storage = await repo.open(session_id)
    samples = []
    for _ in range(reads):
        start = time.perf_counter()
        (operation,) = await storage.find_open_operations("target", limit=2)
        records = await storage.read_operation_records("target", operation.id)
        own = await storage.read_lane_entries("target", after=anchor)
        samples.append(time.perf_counter() - start)
        assert (
            operation.id == run_id and len(records) == OWN_ENTRIES + 1 and len(own) == OWN_ENTRIES
        )
    await repo.close()
    return statistics.median(samples) * 1000


SHAPES = ("open run", "compactions only", "usage, no run", "after last run")


def lane_shape(shape: str, count: int) -> list[LogItem]:
    """A log whose lane ``target`` holds `count` records of `shape`; lane ``other`` as many."""
    items: list[LogItem] = []
    leaves: dict[str, str | None] = {}

    def record(record: Record) -> None:
        items.append(StoredRecord(seq=len(items) + 1, timestamp=1, record=record))

    def entry(lane: str, entry_id: str) -> None:
        items.append(
            StoredEntry(
                seq=len(items) + 1,
                timestamp=1,
                lane=lane,
                parent_id=leaves[lane],
                entry=user_entry(entry_id),
            )
        )
        leaves[lane] = entry_id

    def usage(lane: str, n: int) -> None:
        cost = Cost(total=0.001)
        amount = TokenUsage(input=1, total_tokens=1, cost=cost)
        record(Usage(id=f"{lane}-u{n}", lane=lane, cause="adjustment", usage=amount))

    def operation(n: int, kind: Literal["compaction", "navigation"]) -> None:
        record(operation_started(f"op{n}", lane="target", kind=kind))
        record(operation_finished(f"op{n}-fin", f"op{n}", lane="target"))

    for lane in ("target", "other"):
        items.append(
            LaneMove(seq=len(items) + 1, timestamp=1, lane=lane, leaf_id=None, created=True)
        )
        leaves[lane] = None
    if shape == "after last run":
        record(operation_started("run", lane="target"))
        record(operation_finished("fin", "run", lane="target"))
    for n in range(count):
        entry("other", f"other-e{n}")  # another lane's traffic, interleaved
        usage("other", n)
        if shape in ("open run", "usage, no run"):
            usage("target", n)
        elif shape == "compactions only" and n % 2 == 0:
            operation(n, "compaction" if n % 4 else "navigation")
        elif shape == "after last run":
            if n % 4 == 0:
                operation(n, "compaction")
            elif n % 2:
                usage("target", n)
    if shape == "open run":
        entry("target", "anchor")
        record(operation_started("run", lane="target", source_leaf_id="anchor"))
        for n in range(20):
            record(step_attempt(f"a{n}", "run", 1, f"own{n}", lane="target"))
            entry("target", f"own{n}")
    return items


async def lane_restore_ms(
    backend: Backend, workdir: str, shape: str, count: int, reads: int
) -> float:
    repo = backend.make(workdir)
    session_id = f"shape-{SHAPES.index(shape)}-{count}"
    await repo.import_session(
        SessionMetadata(id=session_id, created_at=1), lane_shape(shape, count)
    )
    storage = await repo.open(session_id)
    samples = []
    for _ in range(reads):
        start = time.perf_counter()
        lane_slice = await storage.read_lane_slice("target")
        samples.append(time.perf_counter() - start)
    assert len(lane_slice.items) == (41 if shape == "open run" else 0), (shape, lane_slice)
    await repo.close()
    return statistics.median(samples) * 1000


def redis_url(args: argparse.Namespace, workdir: str) -> tuple[str, Callable[[], None]]:
    if args.redis_url:
        return args.redis_url, lambda: None
    port = _free_port()
    directory = Path(workdir) / "redis"
    directory.mkdir()
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory), "--save", "",
         "--appendonly", "yes", "--appendfsync", args.appendfsync, "--logfile", str(directory / "log")],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(port=port)
    for _ in range(200):
        try:
            client.ping()
            break
        except redis.exceptions.ConnectionError:
            time.sleep(0.02)
    client.close()

    def stop() -> None:
        process.terminate()
        process.wait()

    return f"redis://127.0.0.1:{port}/0", stop


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def backends(args: argparse.Namespace, workdir: str) -> tuple[list[Backend], Callable[[], None]]:
    url, stop = redis_url(args, workdir)
    prefix = f"bench{os.getpid()}"

    def redis_size(session_id: str, n: int) -> float:
        client = redis.Redis.from_url(url)
        total = sum(
            client.memory_usage(key) or 0
            for key in client.scan_iter(f"{prefix}:{{{session_id}}}:*")
        )
        client.close()
        return total / n

    def sqlite_size(session_id: str, n: int) -> float:
        path = Path(workdir) / "bench.db"
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        used = conn.execute(
            "SELECT SUM(pgsize) FROM dbstat WHERE name IN (SELECT name FROM sqlite_master)"
        ).fetchone()
        conn.close()
        return float(used[0]) / n if used and used[0] else path.stat().st_size / n

    made = {
        "memory": Backend("memory", lambda d: _memory, lambda s, n: None),
        "jsonl": Backend(
            "jsonl",
            lambda d: JsonlSessionRepo(Path(d) / "jsonl"),
            lambda s, n: (Path(workdir) / "jsonl" / f"{s}.jsonl").stat().st_size / n,
        ),
        "sqlite": Backend("sqlite", lambda d: SqliteSessionRepo(Path(d) / "bench.db"), sqlite_size),
        "redis": Backend("redis", lambda d: RedisSessionRepo(url, prefix=prefix), redis_size),
    }
    return [made[name] for name in args.backends.split(",")], stop


class _NoCloseMemory(MemorySessionRepo):
    async def close(self) -> None:  # one shared in-process repository for the whole run
        return None


_memory = _NoCloseMemory()


async def history_table(
    args: argparse.Namespace, chosen: list[Backend], workdir: str, histories: list[int]
) -> None:
    """Appends per second, bytes per entry and restore reads against history size."""
    print(
        f"# {args.appends} appends x {args.trials} trials (median); restore reads: median of {args.reads}"
    )
    header = ["backend", "appends/s 1 lane", "appends/s 16 lanes", "bytes/entry"]
    header += [f"restore ms @{h:,}" for h in histories]
    header += [f"ratio {histories[-1]:,}/{histories[0]:,}"]
    print(" | ".join(header))
    for backend in chosen:
        one = [
            await appends_per_second(backend, workdir, args.appends, 1, t)
            for t in range(args.trials)
        ]
        many = [
            await appends_per_second(backend, workdir, args.appends, 16, t)
            for t in range(args.trials)
        ]
        size = one[0][1]
        reads = [await restore_read_ms(backend, workdir, h, args.reads) for h in histories]
        row = [
            backend.name,
            f"{statistics.median(r for r, _ in one):,.0f}",
            f"{statistics.median(r for r, _ in many):,.0f}",
            "n/a" if size is None else f"{size:,.0f}",
            *(f"{ms:.3f}" for ms in reads),
            f"{reads[-1] / reads[0]:.2f}",
        ]
        print(" | ".join(row), flush=True)


async def shapes_table(
    args: argparse.Namespace, chosen: list[Backend], workdir: str, few: int, many: int
) -> None:
    """A lane's restore read, per shape, with few and with many records."""
    print(f"# lane restore read by shape: median of {args.reads}, ms")
    print(f"backend | shape | @{few:,} records | @{many:,} | ratio")
    for backend in chosen:
        for shape in SHAPES:
            small = await lane_restore_ms(backend, workdir, shape, few, args.reads)
            large = await lane_restore_ms(backend, workdir, shape, many, args.reads)
            cells = [backend.name, shape, f"{small:.3f}", f"{large:.3f}", f"{large / small:.2f}"]
            print(" | ".join(cells), flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", default="memory,jsonl,sqlite,redis")
    parser.add_argument("--appends", type=int, default=4000)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--histories", default="1000,100000")
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--redis-url", default="")
    parser.add_argument("--appendfsync", default="everysec", choices=["everysec", "always"])
    parser.add_argument("--lane-records", default="100,10000", help="few,many records per shape")
    parser.add_argument("--shapes-only", action="store_true", help="only the lane-shape table")
    parser.add_argument("--no-shapes", action="store_true", help="no lane-shape table")
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.appends, args.trials, args.histories, args.reads = 400, 1, "1000,10000", 30
        args.lane_records = "100,2000"
    histories = [int(h) for h in args.histories.split(",")]
    few, many_records = (int(n) for n in args.lane_records.split(","))
    workdir = tempfile.mkdtemp(prefix="store-bench-")
    chosen, stop = backends(args, workdir)
    print(f"# store_bench on {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"SQLite {sqlite3.sqlite_version}, redis-server AOF appendfsync={args.appendfsync}")  # fmt: skip
    try:
        if not args.shapes_only:
            await history_table(args, chosen, workdir, histories)
        if not args.no_shapes:
            await shapes_table(args, chosen, workdir, few, many_records)
    finally:
        stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file too
    from bench.interrupt import run_main

    run_main(lambda: asyncio.run(main()))
