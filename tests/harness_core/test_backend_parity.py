"""Randomized parity: every backend gives exactly the memory reference's answers and state.

Hypothesis generates sequences of writes (valid and invalid) over a small id space so that
collisions, busy lanes, stale targets and content mismatches happen often; each sequence runs
on the memory backend and on one other backend, and every outcome, every query answer and the
final exported state must be equal.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

from harness_core import SessionRepo
from harness_core.errors import SessionError
from harness_core.messages import Cost, TokenUsage
from harness_core.session.contract import SessionStorage
from harness_core.session.entries import CompactionEntry, Entry, ModelChangeEntry
from harness_core.session.records import QueueEnqueued, Usage
from harness_core.session.types import BranchQuery, EntryQuery, RecordQuery
from harness_core.storage.jsonl import JsonlSessionRepo
from harness_core.storage.memory import MemorySessionRepo
from harness_core.storage.redis_streams import RedisSessionRepo
from harness_core.storage.sqlite import SqliteSessionRepo
from harness_core.testing import ManualClock
from harness_core.testing.builders import (
    custom_entry,
    operation_finished,
    operation_started,
    step_attempt,
    user_entry,
)

LANES = ["main", "t1", "t2"]
IDS = [f"x{i}" for i in range(6)]
RUNS = ["r0", "r1", "x0"]  # x0 collides with an entry id on purpose
_counter = itertools.count()


def _entry(entry_id: str, variant: int) -> Entry:
    if variant == 0:
        return user_entry(entry_id, "hello")
    if variant == 1:
        return custom_entry(entry_id, "note", data={"v": [1, {"k": None}]})
    if variant == 2:
        return CompactionEntry(id=entry_id, summary="s", retained_tail=(), tokens_before=3)
    return ModelChangeEntry(id=entry_id, provider="p", model_id="m")


async def _apply(storage: SessionStorage, step: tuple[Any, ...], n: int) -> Any:
    kind = step[0]
    if kind == "append":
        return await storage.append_entry(_entry(step[2], step[3]), step[1])
    if kind == "append_if_missing":
        return await storage.append_entry_if_missing(_entry(step[2], step[3]), step[1])
    if kind == "create_lane":
        return await storage.create_lane(step[1], step[2])
    if kind == "move_lane":
        return await storage.move_lane(step[1], step[2])
    if kind == "start":
        return await storage.append_record(operation_started(step[2], lane=step[1], kind=step[3]))
    if kind == "finish":
        return await storage.append_record(operation_finished(f"fin{n}", step[2], lane=step[1]))
    if kind == "step":
        return await storage.append_record(
            step_attempt(f"att{n}", step[2], 1, f"res{n}", lane=step[1])
        )
    if kind == "usage":
        # tenths are inexact doubles: every sum must add them in the reference's order
        cost = Cost(input=step[2] / 10, total=step[2] / 10 + 0.07)
        usage = TokenUsage(input=step[2], total_tokens=step[2], cost=cost)
        return await storage.append_record(
            Usage(id=f"u{n}", lane=step[1], cause="adjustment", entry_id=step[3], usage=usage)
        )
    if kind == "queue":
        record = QueueEnqueued(
            id=f"q{n}", lane=step[1], queue="next_run", target=user_entry(step[2])
        )
        return await storage.append_record(record)
    if kind == "name":
        return await storage.set_name(step[1])
    return await storage.set_label(step[1], step[2])


async def _outcome(call: Awaitable[Any]) -> Any:
    try:
        return ("ok", await call)
    except SessionError as exc:
        return ("error", exc.code)


async def _observe(storage: SessionStorage) -> list[Any]:
    seen: list[Any] = [
        await storage.get_log(),
        await storage.get_lanes(),
        await storage.get_stats(),
        await storage.get_name(),
        await storage.get_metadata(),
    ]
    for query in (
        EntryQuery(),
        EntryQuery(type="custom", order="oldest_first"),
        EntryQuery(custom_type="note", limit=2),
        EntryQuery(after_seq=3, before_seq=12),
    ):
        seen.append(await _outcome(storage.find_entries(query)))
    for query_r in (
        RecordQuery(),
        RecordQuery(lane="t1", order="oldest_first"),
        RecordQuery(type="operation_started", operation_kind="run", limit=1),
        RecordQuery(after_seq=5, limit=3),
    ):
        seen.append(await _outcome(storage.find_records(query_r)))
    for entry_id in IDS:
        seen.append(await storage.get_entry(entry_id))
        seen.append(await storage.get_label(entry_id))
        for query_b in (
            BranchQuery(start=entry_id),
            BranchQuery(start=entry_id, order="oldest_first", stop_at_type="compaction"),
            BranchQuery(start=entry_id, type="message", limit=1),
            BranchQuery(start=entry_id, stop_at_id="x1", after_seq=2),
        ):
            seen.append(await _outcome(storage.find_entries_on_branch(query_b)))
    for entry_id in (*IDS, "elsewhere"):
        seen.append(await storage.get_usage(entry_id=entry_id))
    for n in range(12):  # record ids are derived from the step number (see _apply)
        for record_id in (f"fin{n}", f"att{n}", f"u{n}", f"q{n}"):
            seen.append(await storage.get_record(record_id))
    for record_id in (*RUNS, *IDS):
        seen.append(await storage.get_record(record_id))
    for name in LANES:
        seen.append(await _outcome(storage.get_usage(lane=name)))
        for query_t in (
            RecordQuery(lane=name, type="operation_finished", limit=1),
            RecordQuery(lane=name, type="operation_started", operation_kind="run", limit=1),
            RecordQuery(lane=name, type="operation_started", after_seq=4),
            RecordQuery(lane=name, type="queue_enqueued", after_seq=3, order="oldest_first"),
            RecordQuery(lane=name, type="usage", run_id="r0"),
            RecordQuery(lane=name, type="step_attempt", run_id="r1", order="oldest_first"),
        ):
            seen.append(await _outcome(storage.find_records(query_t)))
        seen.append(await _outcome(storage.find_open_operations(name, limit=2)))
        for anchor in (None, "x0", "x3"):
            seen.append(await _outcome(storage.read_lane_entries(name, after=anchor)))
        for run_id in RUNS:
            seen.append(await _outcome(storage.read_operation_records(name, run_id)))
    return seen


async def _run(repo: SessionRepo, steps: list[tuple[Any, ...]]) -> tuple[list[Any], list[Any]]:
    await repo.create("s")
    lease = await repo.acquire_lease("s", owner="w", ttl_ms=10**9)
    storage = await repo.open("s", lease=lease)
    outcomes = [await _outcome(_apply(storage, step, n)) for n, step in enumerate(steps)]
    return outcomes, await _observe(storage)


def _factory(
    backend: str, request: pytest.FixtureRequest
) -> Callable[[ManualClock], tuple[SessionRepo, Callable[[], None]]]:
    if backend == "redis":
        server = request.getfixturevalue("redis_server")
        return lambda clock: (
            RedisSessionRepo(server.url, prefix=f"parity{next(_counter)}", clock=clock),
            lambda: None,
        )

    def make(clock: ManualClock) -> tuple[SessionRepo, Callable[[], None]]:
        directory = Path(tempfile.mkdtemp(prefix="parity-"))
        cleanup = lambda: shutil.rmtree(directory, ignore_errors=True)  # noqa: E731
        if backend == "sqlite":
            return SqliteSessionRepo(directory / "s.db", clock=clock), cleanup
        return JsonlSessionRepo(directory, clock=clock), cleanup

    return make


class _Parity(RuleBasedStateMachine):
    """Drives the reference and one backend with the same calls; every answer must be equal."""

    make: Callable[[ManualClock], tuple[SessionRepo, Callable[[], None]]]

    lanes = Bundle("lanes")
    entries = Bundle("entries")
    runs = Bundle("runs")

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.n = 0
        self.reference = MemorySessionRepo(clock=ManualClock())
        self.other, self.cleanup = self.make(ManualClock())
        self.storages = [self._run(self._writer(repo)) for repo in (self.reference, self.other)]

    def _run(self, awaitable: Awaitable[Any]) -> Any:
        return self.loop.run_until_complete(awaitable)

    async def _writer(self, repo: SessionRepo) -> SessionStorage:
        await repo.create("s")
        lease = await repo.acquire_lease("s", owner="w", ttl_ms=10**9)
        return await repo.open("s", lease=lease)

    def _both(self, step: tuple[Any, ...]) -> Any:
        self.n += 1
        expected, actual = (self._run(_outcome(_apply(s, step, self.n))) for s in self.storages)
        assert actual == expected, f"{step}: backend gave {actual}, reference gave {expected}"
        return expected

    @initialize(target=lanes)
    def main_lane(self) -> str:
        return "main"

    @rule(target=lanes, name=st.sampled_from(["t1", "t2", "slack:C1:1.5"]), at=st.none() | entries)
    def create_lane(self, name: str, at: str | None) -> str:
        self._both(("create_lane", name, at))
        return name

    @rule(
        target=entries,
        lane=lanes,
        entry_id=st.sampled_from(IDS) | entries,
        variant=st.integers(0, 3),
    )
    def append(self, lane: str, entry_id: str, variant: int) -> str:
        self._both(("append", lane, entry_id, variant))
        return entry_id

    @rule(lane=lanes, entry_id=entries, variant=st.integers(0, 3))
    def append_if_missing(self, lane: str, entry_id: str, variant: int) -> None:
        self._both(("append_if_missing", lane, entry_id, variant))

    @rule(lane=lanes, to=st.none() | entries)
    def move_lane(self, lane: str, to: str | None) -> None:
        self._both(("move_lane", lane, to))

    @rule(
        target=runs,
        lane=lanes,
        run_id=st.sampled_from(RUNS),
        kind=st.sampled_from(["run", "compaction"]),
    )
    def start(self, lane: str, run_id: str, kind: str) -> str:
        self._both(("start", lane, run_id, kind))
        return run_id

    @rule(lane=lanes, run_id=runs)
    def finish(self, lane: str, run_id: str) -> None:
        self._both(("finish", lane, run_id))

    @rule(lane=lanes, run_id=runs)
    def step(self, lane: str, run_id: str) -> None:
        self._both(("step", lane, run_id))

    @rule(
        lane=lanes,
        amount=st.integers(-3, 9),
        entry_id=st.none() | st.sampled_from([*IDS, "elsewhere"]),
    )
    def usage(self, lane: str, amount: int, entry_id: str | None) -> None:
        self._both(("usage", lane, amount, entry_id))

    @rule(lane=lanes, entry_id=st.sampled_from(IDS) | entries)
    def queue(self, lane: str, entry_id: str) -> None:
        self._both(("queue", lane, entry_id))

    @rule(name=st.sampled_from(["a", "b"]))
    def name(self, name: str) -> None:
        self._both(("name", name))

    @rule(entry_id=st.sampled_from(IDS) | entries, label=st.none() | st.sampled_from(["l1", "l2"]))
    def label(self, entry_id: str, label: str | None) -> None:
        self._both(("label", entry_id, label))

    @precondition(lambda self: self.n % 5 == 4)
    @rule()
    def every_read_agrees(self) -> None:
        expected, actual = (self._run(_observe(s)) for s in self.storages)
        assert actual == expected, "reads differ from the reference"

    def teardown(self) -> None:
        try:
            expected, actual = (self._run(_observe(s)) for s in self.storages)
            assert actual == expected, "reads differ from the reference"
        finally:
            self._run(self.other.close())
            self._run(self.reference.close())
            self.loop.close()
            self.cleanup()


@pytest.mark.backends("jsonl", "sqlite", "redis")
def test_backends_match_the_memory_reference(backend: str, request: pytest.FixtureRequest) -> None:
    machine = type(
        f"Parity_{backend}", (_Parity,), {"make": staticmethod(_factory(backend, request))}
    )
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=40,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
