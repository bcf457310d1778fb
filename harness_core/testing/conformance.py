"""The storage conformance suite: runner-independent cases every backend must pass.

A backend test module builds a `BackendFixture` factory and runs each `ConformanceCase` with a
fresh fixture (pytest: parametrize over `conformance_cases()`). The memory backend is the
reference; a case that fails on another backend is that backend's bug.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import ValidationError

from harness_core.errors import LeaseHeld, LeaseLost, RecordLogCorruption, SessionError
from harness_core.messages import Cost, TextPart, TokenUsage, UserMessage
from harness_core.session.contract import SessionRepo, SessionStorage
from harness_core.session.entries import (
    CompactionEntry,
    CustomEntry,
    MessageEntry,
    ModelChangeEntry,
)
from harness_core.session.records import (
    AbortRequested,
    NavigationIntent,
    OperationKind,
    QueueCancelled,
    QueueEnqueued,
    Usage,
)
from harness_core.session.types import (
    BranchQuery,
    EntryQuery,
    FactSet,
    LaneMove,
    LanePointer,
    LaneSlice,
    RecordQuery,
    SessionMetadata,
    StoredEntry,
    StoredRecord,
)
from harness_core.storage._slice import compose_lane_slice
from harness_core.testing.builders import (
    assistant_entry,
    custom_entry,
    operation_finished,
    operation_started,
    step_attempt,
    tool_result_entry,
    user_entry,
)
from harness_core.testing.clock import ManualClock

__all__ = ["BackendFixture", "ConformanceCase", "conformance_cases"]

TTL = 30_000
NAN = float("nan")
INF = float("inf")


@dataclass(frozen=True, kw_only=True)
class BackendFixture:
    """What a case needs from a backend under test."""

    name: str
    repo: SessionRepo
    clock: ManualClock
    """The clock the repository uses for timestamps and lease expiry."""
    leases_expire: bool
    """False where the lease is an OS lock held as long as the process lives (JSONL)."""
    reopen: Callable[[], Awaitable[SessionRepo]]
    """Close the repository and open a new one over the same durable data."""


@dataclass(frozen=True)
class ConformanceCase:
    """One backend-neutral check."""

    group: str
    name: str
    run: Callable[[BackendFixture], Awaitable[None]]

    @property
    def id(self) -> str:
        """A stable test id."""
        return f"{self.group}:{self.name}"


_CASES: list[ConformanceCase] = []
_P = TypeVar("_P")


def _case(group: str) -> Callable[[Callable[[BackendFixture], Awaitable[None]]], Any]:
    def register(fn: Callable[[BackendFixture], Awaitable[None]]) -> Any:
        _CASES.append(ConformanceCase(group, fn.__name__, fn))
        return fn

    return register


def _cases(
    group: str, params: Mapping[str, _P]
) -> Callable[[Callable[[BackendFixture, _P], Awaitable[None]]], Any]:
    """One case per rule: ``name/label`` runs ``fn(fixture, params[label])``."""

    def register(fn: Callable[[BackendFixture, _P], Awaitable[None]]) -> Any:
        for label, param in params.items():
            _CASES.append(ConformanceCase(group, f"{fn.__name__}/{label}", _bind(fn, param)))
        return fn

    return register


def _bind(
    fn: Callable[[BackendFixture, _P], Awaitable[None]], param: _P
) -> Callable[[BackendFixture], Awaitable[None]]:
    async def run(fx: BackendFixture) -> None:
        await fn(fx, param)

    return run


def conformance_cases() -> tuple[ConformanceCase, ...]:
    """Every conformance case, in a stable order."""
    return tuple(_CASES)


async def _expect(awaitable: Awaitable[object], code: str) -> SessionError:
    try:
        await awaitable
    except SessionError as exc:
        assert exc.code == code, f"expected SessionError({code!r}), got {exc!r}"
        return exc
    raise AssertionError(f"expected SessionError({code!r}), nothing was raised")


async def _expect_corruption(awaitable: Awaitable[object], reason: str) -> None:
    try:
        await awaitable
    except RecordLogCorruption as exc:
        assert exc.reason == reason, f"expected corruption {reason!r}, got {exc!r}"
        return
    raise AssertionError(f"expected RecordLogCorruption({reason!r}), nothing was raised")


async def _writer(fx: BackendFixture, session_id: str = "s1", owner: str = "w1") -> SessionStorage:
    await fx.repo.create(session_id)
    lease = await fx.repo.acquire_lease(session_id, owner=owner, ttl_ms=TTL)
    return await fx.repo.open(session_id, lease=lease)


def _ids(items: tuple[StoredEntry, ...] | tuple[StoredRecord, ...]) -> list[str]:
    return [item.id for item in items]


def _usage(tokens: int, cost: float) -> TokenUsage:
    return TokenUsage(
        input=tokens, output=2 * tokens, total_tokens=3 * tokens, cost=Cost(input=cost, total=cost)
    )


# -- sequence, parents, lanes ----------------------------------------------------------------


@_case("sequence")
async def one_seq_across_entries_records_lanes_and_facts(fx: BackendFixture) -> None:
    s = await _writer(fx)
    root = await s.append_entry(user_entry("root"), "main")
    lane = await s.create_lane("t1", "root")
    child = await s.append_entry(custom_entry("child", data={"v": 1}), "t1")
    rec = await s.append_record(operation_started("run1", lane="t1", source_leaf_id="child"))
    name = await s.set_name("Example")
    label = await s.set_label("root", "checkpoint")
    moved = await s.move_lane("main", "child")

    assert (root.seq, root.parent_id, root.lane) == (1, None, "main")
    assert (lane.seq, lane.created, lane.leaf_id) == (2, True, "root")
    assert (child.seq, child.parent_id, child.lane) == (3, "root", "t1")
    assert (rec.seq, name.seq, label.seq, moved.seq) == (4, 5, 6, 7)
    assert moved.created is False
    for ts in (root.timestamp, child.timestamp, rec.timestamp, name.timestamp):
        assert ts == fx.clock.now_ms()
    log = await s.get_log()
    assert [(item.kind, item.seq) for item in log] == [
        ("entry", 1),
        ("lane", 2),
        ("entry", 3),
        ("record", 4),
        ("fact", 5),
        ("fact", 6),
        ("lane", 7),
    ]
    assert list(log) == [root, lane, child, rec, name, label, moved]
    assert await s.get_lanes() == (
        LanePointer(lane="main", leaf_id="child"),
        LanePointer(lane="t1", leaf_id="child"),
    )
    assert await s.get_lane("t1") == LanePointer(lane="t1", leaf_id="child")
    assert await s.get_lane("nope") is None
    stats = await s.get_stats()
    assert (stats.last_seq, stats.entries, stats.messages, stats.records) == (7, 2, 1, 1)


@_case("sequence")
async def parent_is_the_appending_lanes_leaf(fx: BackendFixture) -> None:
    s = await _writer(fx)
    await s.append_entry(user_entry("a"), "main")
    await s.create_lane("t1", "a")
    b = await s.append_entry(user_entry("b"), "main")
    u = await s.append_entry(user_entry("u"), "t1")
    c = await s.append_entry(user_entry("c"), "main")
    v = await s.append_entry(user_entry("v"), "t1")
    assert (b.parent_id, c.parent_id) == ("a", "b")
    assert (u.parent_id, v.parent_id) == ("a", "u")
    await s.move_lane("t1", None)
    w = await s.append_entry(user_entry("w"), "t1")
    assert w.parent_id is None
    assert await s.get_lane("t1") == LanePointer(lane="t1", leaf_id="w")


@_case("sequence")
async def path_order_is_seq_order(fx: BackendFixture) -> None:
    s = await _writer(fx)
    await s.append_entry(user_entry("a"), "main")
    await s.create_lane("t1", "a")
    for i in range(5):
        await s.append_entry(user_entry(f"m{i}"), "main")
        await s.append_entry(user_entry(f"t{i}"), "t1")
    for start in ("m4", "t4"):
        path = await s.find_entries_on_branch(BranchQuery(start=start, order="oldest_first"))
        seqs = [e.seq for e in path]
        assert seqs == sorted(seqs) and len(seqs) == 6
        for parent, child in itertools.pairwise(path):
            assert child.parent_id == parent.id
        newest = await s.find_entries_on_branch(BranchQuery(start=start))
        assert list(newest) == list(reversed(path))


@_case("lanes")
async def lane_lifecycle_is_validated(fx: BackendFixture) -> None:
    s = await _writer(fx)
    await _expect(s.create_lane("main", None), "already_exists")
    await _expect(s.create_lane("t1", "missing"), "not_found")
    await _expect(s.create_lane("", None), "invalid_lane")
    await _expect(s.create_lane("bad\nname", None), "invalid_lane")
    await _expect(s.create_lane("trailing\n", None), "invalid_lane")
    await _expect(s.move_lane("missing", None), "unknown_lane")
    await _expect(s.append_entry(user_entry("x"), "missing"), "unknown_lane")
    await _expect(s.append_record(operation_started("r", lane="missing")), "unknown_lane")
    await s.create_lane("slack:C123:1719432.0021", None)
    await s.create_lane("email:<a{b}@example.com>", None)
    assert [p.lane for p in await s.get_lanes()] == [
        "email:<a{b}@example.com>",
        "main",
        "slack:C123:1719432.0021",
    ]
    assert (await s.get_stats()).last_seq == 2


# -- ids and provisioned entries -------------------------------------------------------------


@_case("ids")
async def duplicate_ids_are_refused_without_a_write(fx: BackendFixture) -> None:
    s = await _writer(fx)
    await s.append_entry(user_entry("shared"), "main")
    await _expect(s.append_record(operation_started("shared")), "already_exists")
    await s.append_record(operation_started("run1"))
    await _expect(s.append_entry(custom_entry("run1"), "main"), "already_exists")
    await _expect(s.append_entry(user_entry("shared", "other"), "main"), "already_exists")
    assert [item.seq for item in await s.get_log()] == [1, 2]
    assert (await s.get_lane("main")) == LanePointer(lane="main", leaf_id="shared")


@_case("ids")
async def append_if_missing_is_idempotent_and_detects_corruption(fx: BackendFixture) -> None:
    s = await _writer(fx)
    await s.append_entry(user_entry("a"), "main")
    first, appended = await s.append_entry_if_missing(custom_entry("x", data={"k": [1, 2]}), "main")
    assert appended and first.parent_id == "a"
    await s.append_entry(user_entry("b"), "main")
    again, appended_again = await s.append_entry_if_missing(
        custom_entry("x", data={"k": [1, 2]}), "main"
    )
    assert not appended_again and again == first
    await _expect(
        s.append_entry_if_missing(custom_entry("x", data={"k": [1, 2]}), "nope"), "unknown_lane"
    )
    assert (await s.get_stats()).last_seq == 3
    await _expect(
        s.append_entry_if_missing(custom_entry("x", data={"k": [2, 1]}), "main"), "content_mismatch"
    )
    await _expect(s.append_entry_if_missing(user_entry("x"), "main"), "content_mismatch")
    await s.append_record(operation_started("run1"))
    await _expect(s.append_entry_if_missing(custom_entry("run1"), "main"), "already_exists")
    assert (await s.get_stats()).last_seq == 4
    assert (await s.get_lane("main")) == LanePointer(lane="main", leaf_id="b")


@_case("ids")
async def records_are_found_by_id(fx: BackendFixture) -> None:
    s = await _writer(fx)
    await s.append_entry(user_entry("e"), "main")
    await s.create_lane("t1", None)
    start = await s.append_record(operation_started("run", lane="t1"))
    await s.append_record(step_attempt("att", "run", 1, "x", lane="t1"))
    assert await s.get_record("run") == start
    assert await s.get_record("e") is None, "an entry's id names no record"
    assert await s.get_record("missing") is None
    reader = await fx.repo.open("s1")
    assert await reader.get_record("att") == (await s.find_records(RecordQuery(lane="t1")))[0]


@_case("ids")
async def key_order_does_not_change_content(fx: BackendFixture) -> None:
    s = await _writer(fx)
    stored, _ = await s.append_entry_if_missing(
        custom_entry("x", data={"b": 1, "a": {"d": 2, "c": 3}}), "main"
    )
    again, appended = await s.append_entry_if_missing(
        custom_entry("x", data={"a": {"c": 3, "d": 2}, "b": 1}), "main"
    )
    assert not appended and again == stored


@_case("ids")
async def tool_result_terminate_is_persisted(fx: BackendFixture) -> None:
    s = await _writer(fx)
    stored = await s.append_entry(tool_result_entry("tr", terminate=True), "main")
    read = await s.get_entry("tr")
    assert read == stored
    assert isinstance(read.entry, MessageEntry) and read.entry.terminate is True
    try:
        MessageEntry(id="bad", message=UserMessage(content=(TextPart(text="x"),)), terminate=True)
    except ValidationError:
        pass
    else:
        raise AssertionError("terminate on a user message must not validate")


# -- open-operation projection ---------------------------------------------------------------


@_case("operations")
async def second_start_is_refused_and_finish_clears(fx: BackendFixture) -> None:
    s = await _writer(fx)
    await s.create_lane("t1", None)
    assert await s.find_open_operations("main", limit=2) == ()
    first = await s.append_record(operation_started("run1"))
    assert await s.find_open_operations("main", limit=2) == (first,)
    await _expect(s.append_record(operation_started("run2")), "lane_busy")
    await _expect(s.append_record(operation_started("nav", kind="navigation")), "lane_busy")
    other = await s.append_record(operation_started("run3", lane="t1"))
    assert await s.find_open_operations("t1") == (other,)
    await s.append_record(step_attempt("att1", "run1", 1, "e1"))
    await s.append_record(operation_finished("fin1", "run1"))
    assert await s.find_open_operations("main", limit=2) == ()
    assert await s.find_open_operations("t1", limit=2) == (other,)
    second = await s.append_record(operation_started("run2", kind="compaction"))
    assert await s.find_open_operations("main") == (second,)
    assert (await s.get_stats()).last_seq == 6  # the two refused starts wrote nothing
    await _expect(s.find_open_operations("main", limit=0), "invalid_query")


@_case("operations")
async def imported_corruption_exposes_two_open_operations(fx: BackendFixture) -> None:
    source = await _writer(fx, "source")
    first = await source.append_record(operation_started("run1"))
    await source.append_record(operation_finished("fin1", "run1"))
    log = list(await source.get_log())
    # Forge a second open operation by dropping the finish: a log a single writer cannot produce.
    second = StoredRecord(seq=2, timestamp=first.timestamp, record=operation_started("run2"))
    forged = [log[0], second]
    meta = SessionMetadata(id="forged", created_at=1)
    await fx.repo.import_session(meta, forged)
    reader = await fx.repo.open("forged")
    assert await reader.find_open_operations("main", limit=2) == (second, first)
    assert await reader.find_open_operations("main", limit=1) == (second,)
    lease = await fx.repo.acquire_lease("forged", owner="w", ttl_ms=TTL)
    writer = await fx.repo.open("forged", lease=lease)
    await writer.append_record(operation_finished("fin2", "run2"))
    assert await writer.find_open_operations("main", limit=2) == (first,)


@_case("operations")
async def session_wide_open_operations_span_lanes_newest_first(fx: BackendFixture) -> None:
    s = await _writer(fx)
    assert await s.find_open_operations(None) == ()
    for lane in ("t1", "t2", "t3"):
        await s.create_lane(lane, None)
    on_main = await s.append_record(operation_started("run-main"))
    await s.append_record(operation_started("run-t2", lane="t2"))
    on_t1 = await s.append_record(operation_started("run-t1", lane="t1", kind="compaction"))
    await s.append_record(operation_finished("fin-t2", "run-t2", lane="t2"))
    assert await s.find_open_operations(None) == (on_t1, on_main)
    assert await s.find_open_operations(None, limit=1) == (on_t1,)
    assert await s.find_open_operations("t3") == ()
    assert await s.find_open_operations("nope") == ()  # an unknown lane has none
    await _expect(s.find_open_operations(None, limit=0), "invalid_query")
    await s.append_record(operation_finished("fin-main", "run-main"))
    assert await s.find_open_operations(None, limit=5) == (on_t1,)
    reader = await fx.repo.open("s1")  # the projection is durable, not the writer's memory
    assert await reader.find_open_operations(None) == (on_t1,)


@_case("operations")
async def session_wide_open_operations_of_an_imported_log(fx: BackendFixture) -> None:
    source = await _writer(fx, "source")
    await source.create_lane("t1", None)
    first = await source.append_record(operation_started("run1"))
    await source.append_record(operation_finished("fin1", "run1"))
    log = list(await source.get_log())
    # Replace main's finish by a second start (a log no single writer produces): both stay open.
    second = StoredRecord(seq=3, timestamp=first.timestamp, record=operation_started("run2"))
    other = StoredRecord(
        seq=4, timestamp=first.timestamp, record=operation_started("run3", lane="t1")
    )
    await fx.repo.import_session(
        SessionMetadata(id="forged", created_at=1), [log[0], log[1], second, other]
    )
    reader = await fx.repo.open("forged")
    assert await reader.find_open_operations(None) == (other, second, first)
    assert await reader.find_open_operations(None, limit=2) == (other, second)


# -- bounded restore reads -------------------------------------------------------------------


@_case("restore reads")
async def operation_records_are_the_lanes_records_since_the_start(fx: BackendFixture) -> None:
    s = await _writer(fx)
    await s.create_lane("t1", None)
    await s.append_record(operation_started("old", lane="t1"))
    await s.append_record(operation_finished("old-fin", "old", lane="t1"))
    await s.append_record(
        QueueEnqueued(id="nr", lane="t1", queue="next_run", target=user_entry("queued"))
    )
    start = await s.append_record(operation_started("run", lane="t1"))
    noise = await s.append_record(operation_started("main-run", lane="main"))
    att = await s.append_record(step_attempt("att", "run", 1, "a1", lane="t1"))
    abort = await s.append_record(AbortRequested(id="ab", lane="t1", run_id="run"))
    adj = await s.append_record(
        Usage(id="adj", lane="t1", cause="adjustment", usage=_usage(1, 0.5))
    )
    assert await s.read_operation_records("t1", "run") == (start, att, abort, adj)
    assert await s.read_operation_records("main", "main-run") == (noise,)
    await _expect(s.read_operation_records("t1", "main-run"), "not_found")
    await _expect(s.read_operation_records("t1", "att"), "not_found")
    await _expect(s.read_operation_records("nope", "run"), "unknown_lane")


@_case("restore reads")
async def lane_entries_run_from_the_leaf_back_to_the_anchor(fx: BackendFixture) -> None:
    s = await _writer(fx)
    for i in range(3):
        await s.append_entry(user_entry(f"h{i}"), "main")
    await s.create_lane("t1", "h1")
    await s.append_entry(user_entry("x0"), "t1")
    await s.append_entry(user_entry("m3"), "main")
    await s.append_entry(user_entry("x1"), "t1")
    await s.append_entry(user_entry("x2"), "t1")
    assert _ids(await s.read_lane_entries("t1", after="h1")) == ["x0", "x1", "x2"]
    assert _ids(await s.read_lane_entries("t1", after="x1")) == ["x2"]
    assert _ids(await s.read_lane_entries("t1", after="x2")) == []
    assert _ids(await s.read_lane_entries("t1", after=None)) == ["h0", "h1", "x0", "x1", "x2"]
    assert _ids(await s.read_lane_entries("main", after="h0")) == ["h1", "h2", "m3"]
    await _expect(s.read_lane_entries("t1", after="h2"), "invalid_query")
    await _expect(s.read_lane_entries("t1", after="m3"), "invalid_query")
    await _expect(s.read_lane_entries("t1", after="zz"), "not_found")
    await _expect(s.read_lane_entries("nope", after=None), "unknown_lane")
    await s.create_lane("empty", None)
    assert await s.read_lane_entries("empty", after=None) == ()
    await _expect(s.read_lane_entries("empty", after="h0"), "invalid_query")


async def _slice(s: SessionStorage, lane: str) -> LaneSlice:
    """The lane's slice, checked against the same reads made one by one."""
    found = await s.read_lane_slice(lane)
    assert found == await compose_lane_slice(s, lane)
    return found


def _next_run(record_id: str, lane: str, run_id: str | None = None) -> QueueEnqueued:
    return QueueEnqueued(
        id=record_id, lane=lane, queue="next_run", run_id=run_id, target=user_entry(record_id)
    )


@_case("restore reads")
async def lane_slice_holds_the_open_operation_and_the_queue_since_the_newest_run(
    fx: BackendFixture,
) -> None:
    s = await _writer(fx)
    await s.create_lane("t1", None)
    await s.append_entry(user_entry("h0"), "t1")
    await s.append_record(_next_run("q0", "t1"))  # captured by r1
    await s.append_record(operation_started("r1", lane="t1", source_leaf_id="h0"))
    f1 = await s.append_record(operation_finished("f1", "r1", lane="t1"))
    slice_idle = await _slice(s, "t1")
    assert (slice_idle.leaf_id, slice_idle.items, slice_idle.last_finished) == ("h0", (), f1)
    q1 = await s.append_record(_next_run("q1", "t1"))
    c1 = await s.append_record(QueueCancelled(id="c1", lane="t1", entry_id="q1"))
    assert (await _slice(s, "t1")).items == (q1, c1)  # waiting for the next run
    r2 = await s.append_record(operation_started("r2", lane="t1", source_leaf_id="h0"))
    await s.append_record(operation_started("noise", lane="main"))
    await s.append_entry(user_entry("m0"), "main")
    x1 = await s.append_entry(user_entry("x1"), "t1")
    q2 = await s.append_record(_next_run("q2", "t1"))  # for the run after r2
    q3 = await s.append_record(_next_run("q3", "t1", run_id="r2"))  # steering r2
    att = await s.append_record(step_attempt("att", "r2", 1, "a1", lane="t1"))
    x2 = await s.append_entry(user_entry("x2"), "t1")
    suspended = await _slice(s, "t1")
    assert suspended.items == (r2, x1, q2, q3, att, x2)
    assert (suspended.leaf_id, suspended.last_finished) == ("x2", f1)
    await s.create_lane("empty", None)
    assert await _slice(s, "empty") == LaneSlice(lane="empty", leaf_id=None, items=())
    await _expect(s.read_lane_slice("nope"), "unknown_lane")
    reader = await fx.repo.open("s1")  # a reader sees the same
    assert await reader.read_lane_slice("t1") == suspended


@_case("restore reads")
async def lane_slice_of_a_navigation_follows_the_move(fx: BackendFixture) -> None:
    s = await _writer(fx)
    await s.create_lane("t1", None)
    await s.append_entry(user_entry("n0"), "t1")
    await s.append_entry(user_entry("n1"), "t1")
    nav = await s.append_record(
        operation_started("nav", lane="t1", kind="navigation", source_leaf_id="n1").model_copy(
            update={"intent": NavigationIntent(target_id="n0")}
        )
    )
    assert (await _slice(s, "t1")).items == (nav,)  # not moved yet: nothing appended
    await s.move_lane("t1", "n0")
    n2 = await s.append_entry(user_entry("n2"), "t1")
    assert (await _slice(s, "t1")).items == (nav, n2)


@_case("restore reads")
async def lane_slice_refuses_a_lane_off_its_operation_or_with_two(fx: BackendFixture) -> None:
    s = await _writer(fx)
    await s.append_entry(user_entry("h0"), "main")
    await s.create_lane("t1", None)
    await s.append_entry(user_entry("y0"), "t1")
    await s.append_record(operation_started("r1", lane="t1", source_leaf_id="h0"))
    await _expect_corruption(s.read_lane_slice("t1"), "leaf_mismatch")
    await _expect_corruption(compose_lane_slice(s, "t1"), "leaf_mismatch")
    source = await _writer(fx, "source")
    first = await source.append_record(operation_started("run1"))
    await source.append_record(operation_finished("fin1", "run1"))
    log = list(await source.get_log())
    second = StoredRecord(seq=2, timestamp=first.timestamp, record=operation_started("run2"))
    await fx.repo.import_session(SessionMetadata(id="forged", created_at=1), [log[0], second])
    reader = await fx.repo.open("forged")
    await _expect_corruption(reader.read_lane_slice("main"), "multiple_open_operations")
    await _expect_corruption(compose_lane_slice(reader, "main"), "multiple_open_operations")


# -- queries ---------------------------------------------------------------------------------


async def _query_fixture(fx: BackendFixture) -> SessionStorage:
    s = await _writer(fx)
    await s.append_entry(user_entry("root"), "main")  # 1
    await s.append_entry(custom_entry("old-note", data=1), "main")  # 2
    await s.append_entry(
        CompactionEntry(id="compact", summary="sum", retained_tail=(), tokens_before=10), "main"
    )  # 3
    await s.append_entry(custom_entry("new-note", data=2), "main")  # 4
    await s.append_entry(assistant_entry("tail"), "main")  # 5
    await s.create_lane("t1", "old-note")  # 6
    await s.append_entry(custom_entry("side", "other"), "t1")  # 7
    return s


@_case("queries")
async def find_entries_filters_orders_and_bounds(fx: BackendFixture) -> None:
    s = await _query_fixture(fx)
    assert _ids(await s.find_entries()) == [
        "side",
        "tail",
        "new-note",
        "compact",
        "old-note",
        "root",
    ]
    assert _ids(await s.find_entries(EntryQuery(order="oldest_first", after_seq=2, limit=2))) == [
        "compact",
        "new-note",
    ]
    assert _ids(await s.find_entries(EntryQuery(custom_type="note"))) == ["new-note", "old-note"]
    assert _ids(await s.find_entries(EntryQuery(type="custom", limit=1))) == ["side"]
    assert _ids(await s.find_entries(EntryQuery(type="message", before_seq=5))) == ["root"]
    assert _ids(await s.find_entries(EntryQuery(after_seq=3, before_seq=5))) == ["new-note"]
    assert await s.find_entries(EntryQuery(type="branch_summary")) == ()


@_case("queries")
async def branch_queries_follow_the_reference_semantics(fx: BackendFixture) -> None:
    s = await _query_fixture(fx)
    on = s.find_entries_on_branch
    assert _ids(await on(BranchQuery(start="tail"))) == [
        "tail",
        "new-note",
        "compact",
        "old-note",
        "root",
    ]
    assert _ids(await on(BranchQuery(start="tail", custom_type="note", limit=1))) == ["new-note"]
    assert _ids(await on(BranchQuery(start="tail", stop_at_type="compaction"))) == [
        "tail",
        "new-note",
        "compact",
    ]
    assert _ids(await on(BranchQuery(start="tail", stop_at_type="compaction", type="message"))) == [
        "tail"
    ]
    assert _ids(await on(BranchQuery(start="tail", stop_at_id="tail", type="custom"))) == []
    assert _ids(
        await on(BranchQuery(start="tail", stop_at_type="custom", order="oldest_first"))
    ) == ["root", "old-note"]
    assert _ids(
        await on(BranchQuery(start="tail", stop_at_id="compact", order="oldest_first"))
    ) == ["root", "old-note", "compact"]
    assert _ids(await on(BranchQuery(start="tail", after_seq=2))) == ["tail", "new-note", "compact"]
    assert _ids(
        await on(BranchQuery(start="tail", before_seq=4, order="oldest_first", limit=2))
    ) == ["root", "old-note"]
    assert _ids(await on(BranchQuery(start="side"))) == ["side", "old-note", "root"]
    assert _ids(await on(BranchQuery(start="side", stop_at_id="tail"))) == [
        "side",
        "old-note",
        "root",
    ]
    assert _ids(await on(BranchQuery(start="compact", type="custom"))) == ["old-note"]
    await _expect(on(BranchQuery(start="missing")), "not_found")
    await _expect(on(BranchQuery(start="tail", stop_at_id="missing")), "not_found")


@_case("queries")
async def find_records_filters_by_lane_type_run_kind_and_seq(fx: BackendFixture) -> None:
    s = await _writer(fx)
    await s.create_lane("t1", None)  # 1
    await s.append_record(operation_started("run1"))  # 2
    await s.append_record(step_attempt("att1", "run1", 1, "e1"))  # 3
    await s.append_record(operation_started("run2", lane="t1"))  # 4
    await s.append_record(step_attempt("att2", "run2", 1, "e2", lane="t1"))  # 5
    await s.append_record(operation_finished("fin1", "run1"))  # 6
    await s.append_record(operation_started("cmp", kind="compaction"))  # 7
    await s.append_record(
        QueueEnqueued(id="nr", lane="main", queue="next_run", target=user_entry("q"))
    )  # 8
    await s.append_record(QueueCancelled(id="qc", lane="main", entry_id="q"))  # 9
    find = s.find_records
    assert _ids(await find(RecordQuery(lane="t1"))) == ["att2", "run2"]
    assert _ids(await find(RecordQuery(type="step_attempt", order="oldest_first"))) == [
        "att1",
        "att2",
    ]
    assert _ids(await find(RecordQuery(run_id="run1"))) == ["fin1", "att1", "run1"]
    assert _ids(await find(RecordQuery(run_id="run1", after_seq=2))) == ["fin1", "att1"]
    assert _ids(await find(RecordQuery(limit=1))) == ["qc"]
    assert _ids(
        await find(RecordQuery(lane="main", type="operation_started", operation_kind="run"))
    ) == ["run1"]
    assert _ids(
        await find(
            RecordQuery(type="operation_started", operation_kind="compaction", order="oldest_first")
        )
    ) == ["cmp"]
    assert _ids(await find(RecordQuery(lane="main", after_seq=6, order="oldest_first"))) == [
        "cmp",
        "nr",
        "qc",
    ]
    cancelled = (await find(RecordQuery(type="queue_cancelled")))[0].record
    assert isinstance(cancelled, QueueCancelled) and cancelled.run_id is None
    assert await find(RecordQuery(lane="nobody")) == ()


async def _indexed_fixture(fx: BackendFixture) -> SessionStorage:
    """Lane ``t1`` holding records of every indexed kind (seqs in the comments); ``main`` a run."""
    s = await _writer(fx)
    await s.create_lane("t1", None)  # 1
    assert await s.find_records(RecordQuery(lane="t1", type="operation_finished", limit=1)) == ()
    for n in range(3):  # 2-7: finished compactions and navigations
        kind: OperationKind = "compaction" if n % 2 else "navigation"
        await s.append_record(operation_started(f"op{n}", lane="t1", kind=kind))
        await s.append_record(operation_finished(f"op{n}-fin", f"op{n}", lane="t1"))
    await s.append_record(operation_started("run", lane="t1"))  # 8
    await s.append_record(operation_finished("run-fin", "run", lane="t1", outcome="failed"))  # 9
    for n in range(3):  # 10-15
        await s.append_record(
            Usage(id=f"adj{n}", lane="t1", cause="adjustment", usage=_usage(1, 0))
        )
        await s.append_record(
            QueueEnqueued(id=f"nr{n}", lane="t1", queue="next_run", target=user_entry(f"q{n}"))
        )
    await s.append_record(QueueCancelled(id="qc", lane="t1", entry_id="q1"))  # 16
    await s.append_record(operation_started("main-run"))  # 17
    await s.append_record(operation_finished("main-fin", "main-run"))  # 18
    return s


_INDEXED_QUERIES: dict[str, tuple[RecordQuery, list[str]]] = {
    "a lane's newest finish": (
        RecordQuery(lane="t1", type="operation_finished", limit=1),
        ["run-fin"],
    ),
    "a lane's newest run start": (
        RecordQuery(lane="t1", type="operation_started", operation_kind="run", limit=1),
        ["run"],
    ),
    "a lane's compaction starts, oldest first": (
        RecordQuery(
            lane="t1", type="operation_started", operation_kind="compaction", order="oldest_first"
        ),
        ["op1"],
    ),
    "a lane's starts after a seq": (
        RecordQuery(lane="t1", type="operation_started", after_seq=3),
        ["run", "op2", "op1"],
    ),
    "a lane's queue items after a seq, oldest first": (
        RecordQuery(lane="t1", type="queue_enqueued", after_seq=9, order="oldest_first"),
        ["nr0", "nr1", "nr2"],
    ),
    "a lane's queue items after a later seq": (
        RecordQuery(lane="t1", type="queue_enqueued", after_seq=13),
        ["nr2"],
    ),
    "a lane's cancellations after a seq": (
        RecordQuery(lane="t1", type="queue_cancelled", after_seq=9),
        ["qc"],
    ),
    "a run's finish": (
        RecordQuery(lane="t1", type="operation_finished", run_id="op1", limit=1),
        ["op1-fin"],
    ),
    "another lane's finishes": (
        RecordQuery(lane="main", type="operation_finished"),
        ["main-fin"],
    ),
    "the session's newest finishes": (
        RecordQuery(type="operation_finished", limit=2),
        ["main-fin", "run-fin"],
    ),
    "a type the lane never wrote": (RecordQuery(lane="t1", type="write_deferred"), []),
    "a lane that does not exist": (RecordQuery(lane="nobody", type="usage"), []),
}


@_cases("queries", _INDEXED_QUERIES)
async def lane_and_type_queries_answer_from_their_own_index(
    fx: BackendFixture, query_and_ids: tuple[RecordQuery, list[str]]
) -> None:
    query, expected = query_and_ids
    s = await _indexed_fixture(fx)
    found = await s.find_records(query)
    assert _ids(found) == expected
    seqs = {item.id: item.seq for item in await s.get_log() if isinstance(item, StoredRecord)}
    assert [item.seq for item in found] == [seqs[record_id] for record_id in expected]


@_case("queries")
async def invalid_queries_are_refused(fx: BackendFixture) -> None:
    s = await _writer(fx)
    for build in (
        lambda: EntryQuery(limit=0),
        lambda: EntryQuery(after_seq=-1),
        lambda: EntryQuery(type="message", custom_type="note"),
        lambda: BranchQuery(start="x", limit=0),
        lambda: RecordQuery(limit=-1),
        lambda: RecordQuery(operation_kind="run"),
        lambda: RecordQuery(type="step_attempt", operation_kind="run"),
    ):
        try:
            build()
        except SessionError as exc:
            assert exc.code == "invalid_query"
        else:
            raise AssertionError("an invalid query was built")
    await _expect(s.get_log(after_seq=-1), "invalid_query")
    await _expect(s.get_log(limit=0), "invalid_query")


# -- facts and stats -------------------------------------------------------------------------


@_case("facts")
async def facts_newest_wins_and_history_is_kept(fx: BackendFixture) -> None:
    s = await _writer(fx)
    await s.append_entry(user_entry("a"), "main")
    assert await s.get_name() is None
    await s.set_name("First")
    await s.set_name("Second")
    await s.set_label("a", "keep")
    await s.set_label("a", "again")
    assert await s.get_name() == "Second"
    assert await s.get_label("a") == "again"
    await s.set_label("a", None)
    assert await s.get_label("a") is None
    assert await s.get_label("zz") is None
    await _expect(s.set_label("missing", "x"), "not_found")
    facts = [item for item in await s.get_log() if isinstance(item, FactSet)]
    assert [f.fact.model_dump() for f in facts] == [
        {"fact": "name", "name": "First"},
        {"fact": "name", "name": "Second"},
        {"fact": "label", "target_id": "a", "label": "keep"},
        {"fact": "label", "target_id": "a", "label": "again"},
        {"fact": "label", "target_id": "a", "label": None},
    ]
    assert (await s.get_metadata()).name == "Second"
    assert [m.name for m in await fx.repo.list()] == ["Second"]


@_case("facts")
async def stats_are_running_sums_across_lanes(fx: BackendFixture) -> None:
    s = await _writer(fx)
    await s.append_entry(user_entry("u"), "main")
    await s.append_entry(assistant_entry("a", usage=_usage(10, 0.25)), "main")
    await s.append_entry(custom_entry("c"), "main")
    await s.create_lane("t1", "a")
    await s.append_record(
        Usage(
            id="u1",
            lane="main",
            cause="assistant",
            run_id="r",
            entry_id="a",
            attempt=1,
            stop_reason="stop",
            usage=_usage(10, 0.25),
        )
    )
    await s.append_record(
        Usage(
            id="u2",
            lane="t1",
            cause="tool",
            run_id="r",
            entry_id="x",
            tool_call_id="c",
            usage=_usage(5, 0.1),
        )
    )
    await s.append_record(
        Usage(
            id="u3",
            lane="t1",
            cause="adjustment",
            details={"why": "refund"},
            usage=_usage(-2, -0.05),
        )
    )
    stats = await s.get_stats()
    assert (stats.last_seq, stats.entries, stats.messages, stats.records) == (7, 3, 2, 3)
    assert stats.usage.input == 13 and stats.usage.output == 26 and stats.usage.total_tokens == 39
    assert stats.usage.cost.total == 0.25 + 0.1 + -0.05
    assert stats.usage.cost.input == 0.25 + 0.1 + -0.05


@_case("usage")
async def usage_of_an_entry_and_of_a_lane_are_sums_of_their_records(fx: BackendFixture) -> None:
    s = await _writer(fx)
    await s.append_entry(user_entry("u"), "main")
    await s.create_lane("t1", "u")
    await s.create_lane("t2", "u")
    amounts = [(0.1, 3), (0.2, 4), (0.7, -2), (1e-17, 5), (0.3, 1)]
    written: list[Usage] = []
    for n, (cost, tokens) in enumerate(amounts):
        lane = ("main", "t1", "t2")[n % 3]
        entry = "a" if n != 3 else None
        cause = "assistant" if n == 0 else "adjustment"
        record = Usage(
            id=f"u{n}",
            lane=lane,
            cause=cause,
            run_id="r" if cause == "assistant" else None,
            entry_id=entry,
            attempt=1 if cause == "assistant" else None,
            stop_reason="stop" if cause == "assistant" else None,
            usage=_usage(tokens, cost),
        )
        await s.append_record(record)
        written.append(record)
    await s.append_record(
        Usage(id="other", lane="t1", cause="adjustment", entry_id="b", usage=_usage(7, 0.5))
    )

    def total(records: list[Usage]) -> TokenUsage:
        out = TokenUsage()
        for record in records:  # seq order: float sums depend on it
            out = out + record.usage
        return out

    expected_a = total([r for r in written if r.entry_id == "a"])
    assert await s.get_usage(entry_id="a") == expected_a
    assert expected_a.cost.total == ((0.1 + 0.2) + 0.7) + 0.3  # every lane's records, in order
    assert await s.get_usage(entry_id="b") == _usage(7, 0.5)
    assert await s.get_usage(entry_id="never-written") == TokenUsage()
    for lane in ("main", "t1", "t2"):
        expected = total([r for r in written if r.lane == lane])
        if lane == "t1":
            expected = expected + _usage(7, 0.5)
        assert await s.get_usage(lane=lane) == expected, lane
    await s.create_lane("t3", None)
    assert await s.get_usage(lane="t3") == TokenUsage()
    await _expect(s.get_usage(lane="nope"), "unknown_lane")
    await _expect(s.get_usage(), "invalid_query")
    await _expect(s.get_usage(entry_id="a", lane="main"), "invalid_query")
    answers = [await s.get_usage(entry_id="a"), await s.get_usage(lane="t1")]
    imported = await fx.repo.import_session(
        (await s.get_metadata()).model_copy(update={"id": "copy"}), await s.get_log()
    )
    copy = await fx.repo.open(imported.id)
    assert [await copy.get_usage(entry_id="a"), await copy.get_usage(lane="t1")] == answers
    assert s.lease is not None and await fx.repo.release_lease(s.lease)
    reader = await (await fx.reopen()).open("s1")
    assert [await reader.get_usage(entry_id="a"), await reader.get_usage(lane="t1")] == answers


# -- payloads and immutability ---------------------------------------------------------------


@_case("payloads")
async def non_json_payloads_are_refused_before_any_write(fx: BackendFixture) -> None:
    s = await _writer(fx)
    cyclic: dict[str, object] = {}
    cyclic["self"] = cyclic
    for bad in (
        {"v": float("nan")},
        {"v": float("inf")},
        {1: "x"},
        {"v": {1, 2}},
        {"v": b"x"},
        cyclic,
    ):
        try:
            custom_entry("bad", data=bad)  # type: ignore[arg-type]
        except ValidationError:
            pass
        else:
            raise AssertionError(f"{bad!r} was accepted as JSON")
    await _expect(
        s.append_entry(custom_entry("bad", data={"s": "\ud800"}), "main"), "invalid_payload"
    )
    await _expect(
        s.append_entry_if_missing(user_entry("bad2", "\udfff"), "main"), "invalid_payload"
    )
    await _expect(
        s.append_record(
            QueueEnqueued(id="q", lane="main", queue="next_run", target=user_entry("t", "\ud800"))
        ),
        "invalid_payload",
    )
    await _expect(s.set_name("\ud800"), "invalid_payload")
    await _expect(s.append_entry({"id": "dict", "type": "custom"}, "main"), "invalid_payload")  # type: ignore[arg-type]
    assert await s.get_log() == ()
    assert await s.get_lane("main") == LanePointer(lane="main", leaf_id=None)
    ok = await s.append_entry(custom_entry("ok", data={"v": [1, 2.5, None, True, "é"]}), "main")
    assert ok.seq == 1


def _unchecked_usage(record_id: str, **cost: float) -> Usage:
    """A usage record whose cost was set with `model_copy`, which skips validation.

    A provider's cost can reach the store this way; the store's codec is then the last gate.
    """
    bad = Cost().model_copy(update=cost)
    usage = TokenUsage(input=1, total_tokens=1).model_copy(update={"cost": bad})
    return Usage(id=record_id, lane="main", cause="adjustment", usage=usage)


_NAN_USAGE = TokenUsage().model_copy(update={"cost": Cost().model_copy(update={"total": NAN})})

_Refusal = Callable[[BackendFixture, SessionStorage], Awaitable[object]]


async def _import_nan_metadata(fx: BackendFixture, s: SessionStorage) -> object:
    copy = (await s.get_metadata()).model_copy(update={"id": "copy", "metadata": {"v": NAN}})
    return await fx.repo.import_session(copy, await s.get_log())


async def _import_an_infinite_item(fx: BackendFixture, s: SessionStorage) -> object:
    log = await s.get_log()
    copy = (await s.get_metadata()).model_copy(update={"id": "copy"})
    bad_item = StoredRecord(seq=3, timestamp=1, record=_unchecked_usage("u-log", total=INF))
    return await fx.repo.import_session(copy, [*log, bad_item])


_NON_FINITE: dict[str, _Refusal] = {
    "NaN cost": lambda fx, s: s.append_record(_unchecked_usage("u-nan", total=NAN)),
    "infinite tokens and cost": lambda fx, s: s.append_record(
        _unchecked_usage("u-inf", input=INF, total=INF)
    ),
    "negative infinite cost": lambda fx, s: s.append_record(
        _unchecked_usage("u-ninf", cache_read=-INF)
    ),
    "an entry's NaN usage": lambda fx, s: s.append_entry(
        assistant_entry("e-nan", usage=_NAN_USAGE), "main"
    ),
    "an entry's NaN usage, if missing": lambda fx, s: s.append_entry_if_missing(
        assistant_entry("e-nan2", usage=_NAN_USAGE), "main"
    ),
    "infinite custom data": lambda fx, s: s.append_entry(
        custom_entry("c-inf").model_copy(update={"data": {"v": INF}}), "main"
    ),
    "tokens beyond 64 bits": lambda fx, s: s.append_record(
        Usage(
            id="u-tokens",
            lane="main",
            cause="adjustment",
            usage=TokenUsage(input=2**63, total_tokens=1),
        )
    ),
    "imported NaN metadata": _import_nan_metadata,
    "an imported infinite log item": _import_an_infinite_item,
}


@_cases("payloads", _NON_FINITE)
async def non_finite_numbers_are_refused_before_any_write(
    fx: BackendFixture, refused: _Refusal
) -> None:
    s = await _writer(fx)
    await s.append_entry(user_entry("a"), "main")
    await s.append_record(Usage(id="ok1", lane="main", cause="adjustment", usage=_usage(1, 0.5)))
    before = (await s.get_log(), await s.get_stats(), await s.get_usage(lane="main"))
    await _expect(refused(fx, s), "invalid_payload")
    await _expect(fx.repo.open("copy"), "not_found")
    after = (await s.get_log(), await s.get_stats(), await s.get_usage(lane="main"))
    assert after == before, "a refused payload left a trace"
    assert await s.get_usage(entry_id="e-nan") == TokenUsage()
    nxt = await s.append_record(
        Usage(id="ok2", lane="main", cause="adjustment", usage=_usage(1, 0.25))
    )
    assert nxt.seq == 3, "a refused write consumed a seq"
    assert s.lease is not None and await fx.repo.release_lease(s.lease)
    repo = await fx.reopen()
    reader = await repo.open("s1")
    assert [item.seq for item in await reader.get_log()] == [1, 2, 3]
    assert (await reader.get_stats()).usage == _usage(1, 0.5) + _usage(1, 0.25)
    # what restore reads of the lane still answers
    assert await reader.find_open_operations("main", limit=2) == ()
    usage = await reader.find_records(RecordQuery(lane="main", type="usage"))
    assert _ids(usage) == ["ok2", "ok1"]
    assert _ids(await reader.read_lane_entries("main", after=None)) == ["a"]
    lease = await repo.acquire_lease("s1", owner="w2", ttl_ms=TTL)
    writer = await repo.open("s1", lease=lease)
    assert (await writer.append_entry(user_entry("b"), "main")).seq == 4


@_case("payloads")
async def usage_sums_stay_in_range(fx: BackendFixture) -> None:
    s = await _writer(fx)
    await s.create_lane("t1", None)
    top = 2**53 - 1  # the largest token count every backend sums exactly (a Lua double)

    def usage(
        record_id: str, lane: str, tokens: int, cost: float, entry: str | None = None
    ) -> Usage:
        amount = TokenUsage(input=tokens, cost=Cost(total=cost))
        return Usage(id=record_id, lane=lane, cause="adjustment", entry_id=entry, usage=amount)

    async def refused(record: Usage) -> None:
        stats = await s.get_stats()
        await _expect(s.append_record(record), "invalid_payload")
        assert await s.get_stats() == stats

    await s.append_record(usage("u1", "main", top, 1.5e308))
    await refused(usage("session-cost", "t1", 0, 1.5e308))
    await refused(usage("session-tokens", "t1", 1, 0.0))
    await s.append_record(usage("u2", "t1", -top, -1.5e308, entry="x"))
    assert (await s.get_stats()).usage == TokenUsage()
    await refused(usage("lane-cost", "main", 0, 1.5e308))
    await refused(usage("lane-tokens", "main", 1, 0.0))
    await refused(usage("entry-cost", "main", 0, -1.5e308, entry="x"))
    await refused(usage("entry-tokens", "main", -1, 0.0, entry="x"))
    assert await s.get_usage(lane="main") == TokenUsage(input=top, cost=Cost(total=1.5e308))
    assert await s.get_usage(entry_id="x") == TokenUsage(input=-top, cost=Cost(total=-1.5e308))
    assert (await s.get_stats()).last_seq == 3


@_case("payloads")
async def reads_are_immutable(fx: BackendFixture) -> None:
    s = await _writer(fx)
    data: dict[str, Any] = {"nested": {"value": 1}, "list": [1, 2]}
    await s.append_entry(custom_entry("c", data=data), "main")
    data["nested"]["value"] = 50
    read = await s.get_entry("c")
    assert read is not None and isinstance(read.entry, CustomEntry)
    entry = read.entry
    assert entry.data == {"nested": {"value": 1}, "list": (1, 2)}
    nested: Any = entry.data["nested"]
    for mutate in (
        lambda: nested.__setitem__("value", 99),
        lambda: setattr(read, "seq", 5),
        lambda: setattr(entry, "custom_type", "x"),
    ):
        try:
            mutate()
        except (TypeError, ValidationError):
            pass
        else:
            raise AssertionError("a read was mutable")
    meta = await s.get_metadata()
    try:
        meta.metadata["x"] = 1  # type: ignore[index]
    except TypeError:
        pass
    else:
        raise AssertionError("metadata was mutable")
    assert await s.get_entry("c") == read
    assert entry.data == {"nested": {"value": 1}, "list": (1, 2)}


# -- persistence and repositories ------------------------------------------------------------


@_case("persistence")
async def reopen_restores_everything(fx: BackendFixture) -> None:
    s = await _writer(fx)
    await s.append_entry(user_entry("a"), "main")
    await s.create_lane("t1", "a")
    await s.append_entry(assistant_entry("b"), "t1")
    await s.append_entry(ModelChangeEntry(id="mc", provider="openai", model_id="gpt"), "t1")
    await s.append_record(operation_started("run", lane="t1", source_leaf_id="a"))
    await s.append_record(Usage(id="adj", lane="main", cause="adjustment", usage=_usage(3, 0.3)))
    await s.set_name("persisted")
    await s.set_label("a", "L")
    await s.move_lane("main", "b")
    before = (
        await s.get_log(),
        await s.get_lanes(),
        await s.get_stats(),
        await s.get_metadata(),
        await s.find_open_operations("t1"),
    )
    assert s.lease is not None and await fx.repo.release_lease(s.lease)
    repo = await fx.reopen()
    reader = await repo.open("s1")
    after = (
        await reader.get_log(),
        await reader.get_lanes(),
        await reader.get_stats(),
        await reader.get_metadata(),
        await reader.find_open_operations("t1"),
    )
    assert after == before
    assert await reader.get_label("a") == "L"
    assert _ids(await reader.read_lane_entries("t1", after="a")) == ["b", "mc"]
    await _expect(reader.append_entry(user_entry("c"), "main"), "read_only")
    lease = await repo.acquire_lease("s1", owner="w2", ttl_ms=TTL)
    writer = await repo.open("s1", lease=lease)
    c = await writer.append_entry(user_entry("c"), "main")
    assert (c.seq, c.parent_id) == (10, "b")


@_case("repository")
async def create_list_open_and_delete(fx: BackendFixture) -> None:
    repo = fx.repo
    meta = await repo.create("one", metadata={"channel": "C1", "n": [1]})
    assert meta == SessionMetadata(
        id="one", created_at=fx.clock.now_ms(), metadata={"channel": "C1", "n": [1]}
    )
    fx.clock.advance(5)
    generated = await repo.create(parent_session_id="one")
    assert generated.id != "one" and generated.parent_session_id == "one"
    assert [m.id for m in await repo.list()] == ["one", generated.id]
    await _expect(repo.create("one"), "already_exists")
    await _expect(repo.create("bad id"), "invalid_session_id")
    await _expect(repo.create("-dash"), "invalid_session_id")
    await _expect(repo.open("missing"), "not_found")
    await _expect(repo.acquire_lease("missing", owner="w", ttl_ms=TTL), "not_found")
    reader = await repo.open("one")
    assert await reader.get_metadata() == meta
    assert await repo.delete("one") is True
    assert await repo.delete("one") is False
    await _expect(repo.open("one"), "not_found")
    assert [m.id for m in await repo.list()] == [generated.id]
    await repo.create("one")
    assert (await (await repo.open("one")).get_stats()).last_seq == 0


@_case("repository")
async def delete_respects_a_live_lease(fx: BackendFixture) -> None:
    await fx.repo.create("s1")
    lease = await fx.repo.acquire_lease("s1", owner="w1", ttl_ms=TTL)
    try:
        await fx.repo.delete("s1")
    except LeaseHeld as exc:
        assert exc.owner == "w1"
    else:
        raise AssertionError("deleted a session another writer holds")
    assert await fx.repo.delete("s1", lease=lease) is True


@_case("repository")
async def import_round_trips_an_exported_log(fx: BackendFixture) -> None:
    s = await _writer(fx)
    await s.append_entry(user_entry("a"), "main")
    await s.create_lane("t1", "a")
    await s.append_entry(custom_entry("b", data={"x": [1, {"y": None}]}), "t1")
    await s.append_record(operation_started("run", lane="t1", source_leaf_id="a"))
    await s.append_record(Usage(id="adj", lane="t1", cause="adjustment", usage=_usage(1, 0.5)))
    await s.set_label("b", "L")
    await s.set_name("N")
    meta = await s.get_metadata()
    log = await s.get_log()
    copy_meta = meta.model_copy(update={"id": "copy"})
    imported = await fx.repo.import_session(copy_meta, log)
    assert imported.id == "copy"
    copy = await fx.repo.open("copy")
    assert await copy.get_log() == log
    assert await copy.get_stats() == await s.get_stats()
    assert await copy.get_lanes() == await s.get_lanes()
    assert (await copy.get_metadata()).name == "N"
    assert await copy.find_open_operations("t1") == await s.find_open_operations("t1")
    await _expect(fx.repo.import_session(copy_meta, log), "already_exists")
    bad_logs = {
        "gap": [log[0], log[2]],
        "wrong parent": [
            log[0],
            log[2].model_copy(update={"seq": 2, "lane": "main", "parent_id": None}),
        ],
        "duplicate id": [log[0], log[0].model_copy(update={"seq": 2})],
        "unknown lane": [log[0], log[2].model_copy(update={"seq": 2})],
    }
    for index, (why, bad) in enumerate(bad_logs.items()):
        bad_meta = meta.model_copy(update={"id": f"bad{index}"})
        exc = await _expect(fx.repo.import_session(bad_meta, bad), "invalid_payload")
        assert "seq 2" in str(exc), why
        await _expect(fx.repo.open(f"bad{index}"), "not_found")


# -- single writer ---------------------------------------------------------------------------


async def _refused_everywhere(s: SessionStorage, code: str) -> None:
    await _expect(s.append_entry(user_entry("late"), "main"), code)
    await _expect(s.append_entry_if_missing(user_entry("late2"), "main"), code)
    await _expect(s.append_record(operation_started("late-run")), code)
    await _expect(s.create_lane("late-lane", None), code)
    await _expect(s.move_lane("main", None), code)
    await _expect(s.set_name("late"), code)


@_case("single writer")
async def a_taken_over_writer_can_never_write_again(fx: BackendFixture) -> None:
    repo = fx.repo
    await repo.create("s1")
    lease_a = await repo.acquire_lease("s1", owner="A", ttl_ms=TTL)
    a = await repo.open("s1", lease=lease_a)
    await a.append_entry(user_entry("a1"), "main")
    try:
        await repo.acquire_lease("s1", owner="B", ttl_ms=TTL)
    except LeaseHeld as exc:
        assert exc.owner == "A"
    else:
        raise AssertionError("a second writer got a live session")
    if fx.leases_expire:
        fx.clock.advance(TTL + 1)
    else:
        assert await repo.release_lease(lease_a) is True
    lease_b = await repo.acquire_lease("s1", owner="B", ttl_ms=TTL)
    assert lease_b.token > lease_a.token
    b = await repo.open("s1", lease=lease_b)
    await b.append_entry(user_entry("b1"), "main")
    await _refused_everywhere(a, "lease_lost")
    try:
        await repo.renew_lease(lease_a)
    except LeaseLost:
        pass
    else:
        raise AssertionError("a superseded lease was renewed")
    assert await repo.release_lease(lease_a) is False
    await _expect(repo.open("s1", lease=lease_a), "lease_lost")
    await b.append_entry(user_entry("b2"), "main")
    assert _ids(await b.find_entries(EntryQuery(order="oldest_first"))) == ["a1", "b1", "b2"]
    assert await repo.release_lease(lease_b) is True
    await _refused_everywhere(b, "lease_lost")
    lease_c = await repo.acquire_lease("s1", owner="A", ttl_ms=TTL)
    assert lease_c.token > lease_b.token


@_case("single writer")
async def the_lease_holder_is_read_without_taking_it(fx: BackendFixture) -> None:
    repo = fx.repo
    await repo.create("s1")
    assert await repo.lease_holder("s1") is None
    assert await repo.lease_holder("missing") is None
    lease = await repo.acquire_lease("s1", owner="A", ttl_ms=TTL)
    holder = await repo.lease_holder("s1")
    assert holder is not None and holder.owner == "A"
    assert holder.expires_at_ms == lease.expires_at_ms
    reader = await repo.open("s1")
    assert await reader.get_lanes() is not None  # a reader opens beside the holder
    again = await repo.lease_holder("s1")
    assert again is not None and again.owner == "A"  # reading took nothing
    if fx.leases_expire:
        fx.clock.advance(TTL + 1)
        assert await repo.lease_holder("s1") is None  # lapsed
        lease = await repo.acquire_lease("s1", owner="B", ttl_ms=TTL)
    assert await repo.release_lease(lease) is True
    assert await repo.lease_holder("s1") is None


@_case("single writer")
async def same_owner_reacquiring_supersedes_its_old_token(fx: BackendFixture) -> None:
    await fx.repo.create("s1")
    old = await fx.repo.acquire_lease("s1", owner="A", ttl_ms=TTL)
    old_storage = await fx.repo.open("s1", lease=old)
    new = await fx.repo.acquire_lease("s1", owner="A", ttl_ms=TTL)
    assert new.token > old.token
    await _refused_everywhere(old_storage, "lease_lost")
    writer = await fx.repo.open("s1", lease=new)
    await writer.append_entry(user_entry("x"), "main")


@_case("single writer")
async def writes_and_renewals_keep_a_lease_alive(fx: BackendFixture) -> None:
    await fx.repo.create("s1")
    lease = await fx.repo.acquire_lease("s1", owner="A", ttl_ms=TTL)
    s = await fx.repo.open("s1", lease=lease)
    if not fx.leases_expire:
        assert lease.expires_at_ms is None
        renewed = await fx.repo.renew_lease(lease)
        assert renewed.token == lease.token
        return
    assert lease.expires_at_ms == fx.clock.now_ms() + TTL
    for i in range(4):  # each write renews: 4 x 0.6 TTL is well past the first expiry
        fx.clock.advance(TTL * 6 // 10)
        await s.append_entry(user_entry(f"e{i}"), "main")
    fx.clock.advance(TTL * 6 // 10)
    renewed = await fx.repo.renew_lease(lease)
    assert renewed.expires_at_ms == fx.clock.now_ms() + TTL
    fx.clock.advance(TTL * 6 // 10)
    await s.append_entry(user_entry("after-renew"), "main")
    fx.clock.advance(TTL + 1)
    await _expect(s.append_entry(user_entry("expired"), "main"), "lease_lost")
    await _expect(fx.repo.renew_lease(lease), "lease_lost")
    # A write renews only once less than half the ttl is left: one early in a fresh lease
    # leaves its expiry alone (so a writer must heartbeat across long silences).
    fresh = await fx.repo.acquire_lease("s1", owner="A", ttl_ms=TTL)
    s = await fx.repo.open("s1", lease=fresh)
    fx.clock.advance(TTL * 3 // 10)
    await s.append_entry(user_entry("early"), "main")
    fx.clock.advance(TTL * 7 // 10 + 1)
    await _expect(s.append_entry(user_entry("past-expiry"), "main"), "lease_lost")


@_case("single writer")
async def a_storage_renews_its_own_lease(fx: BackendFixture) -> None:
    await fx.repo.create("s1")
    lease = await fx.repo.acquire_lease("s1", owner="A", ttl_ms=TTL)
    s = await fx.repo.open("s1", lease=lease)
    reader = await fx.repo.open("s1")
    await _expect(reader.renew_lease(), "read_only")
    if not fx.leases_expire:  # an OS lock: confirmed while held, unchanged
        assert await s.renew_lease() == lease and s.lease == lease
        assert await fx.repo.release_lease(lease)
        await _expect(s.renew_lease(), "lease_lost")
        return
    fx.clock.advance(TTL // 10)
    renewed = await s.renew_lease()
    assert renewed == lease.model_copy(update={"expires_at_ms": fx.clock.now_ms() + TTL})
    assert s.lease == renewed
    fx.clock.advance(TTL * 9 // 10)  # past the first expiry: the renewal held
    await s.append_entry(user_entry("a"), "main")
    # that write found less than half of the ttl left: it renewed, and the storage knows
    assert s.lease == lease.model_copy(update={"expires_at_ms": fx.clock.now_ms() + TTL})
    fx.clock.advance(TTL // 10)
    known = s.lease
    await s.append_entry(user_entry("b"), "main")  # more than half left: no renewal
    assert s.lease == known
    await fx.repo.acquire_lease("s1", owner="A", ttl_ms=TTL)  # superseded
    await _expect(s.renew_lease(), "lease_lost")
    assert s.lease == known
    await s.close()
    await _expect(s.renew_lease(), "closed")


@_case("single writer")
async def read_only_and_closed_storages_refuse_writes(fx: BackendFixture) -> None:
    await fx.repo.create("s1")
    reader = await fx.repo.open("s1")
    assert reader.lease is None
    await _refused_everywhere(reader, "read_only")
    lease = await fx.repo.acquire_lease("s1", owner="A", ttl_ms=TTL)
    other = await fx.repo.create("s2")
    await _expect(fx.repo.open(other.id, lease=lease), "invalid_query")
    writer = await fx.repo.open("s1", lease=lease)
    await writer.close()
    await writer.close()
    await _expect(writer.append_entry(user_entry("x"), "main"), "closed")
    await _expect(writer.get_log(), "closed")


# -- concurrency -----------------------------------------------------------------------------


@_case("concurrency")
async def concurrent_lanes_commit_in_resolve_order(fx: BackendFixture) -> None:
    s = await _writer(fx)
    await s.append_entry(user_entry("root"), "main")
    lanes = [f"lane-{i}" for i in range(8)]
    for lane in lanes:
        await s.create_lane(lane, "root")
    resolved: list[int] = []

    async def write(lane: str, i: int) -> StoredEntry | StoredRecord | LaneMove:
        result: StoredEntry | StoredRecord | LaneMove
        if i % 3 == 0:
            result = await s.append_record(
                step_attempt(f"{lane}-r{i}", "run", i + 1, f"x{i}", lane=lane)
            )
        else:
            result = await s.append_entry(user_entry(f"{lane}-e{i}"), lane)
        resolved.append(result.seq)
        return result

    results = await asyncio.gather(*(write(lane, i) for i in range(6) for lane in lanes))
    seqs = [r.seq for r in results]
    assert sorted(seqs) == list(range(10, 10 + len(results)))
    assert resolved == sorted(resolved), "writes must resolve in commit order"
    for lane in lanes:
        entries = await s.read_lane_entries(lane, after="root")
        assert _ids(entries) == [f"{lane}-e{i}" for i in range(6) if i % 3]
    log = await s.get_log()
    assert [item.seq for item in log] == list(range(1, len(log) + 1))
