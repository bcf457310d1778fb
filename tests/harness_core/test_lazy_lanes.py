"""Lanes restored on first use: create reads only the open lanes, idle lanes are dropped (LRU).

A session of many idle lanes and a few open operations is opened on every backend through a
storage wrapper that records each call's lane, so what `AgentHarness.create` read (and did not
read) is observed, not assumed.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import pytest

from harness_core import ScriptedModel, SessionRepo
from harness_core._runtime.restore import restore_lane
from harness_core.errors import HarnessFault
from harness_core.harness import AgentHarness, SuspendedOperation
from harness_core.ids import SequentialIds
from harness_core.models import ModelRef
from harness_core.models.scripted import text
from harness_core.options import AgentHarnessOptions
from harness_core.result import Err, Ok
from harness_core.session.contract import SessionStorage
from harness_core.session.records import QueueCancelled
from harness_core.testing.builders import operation_started
from harness_core.testing.clock import ManualClock
from tests.support.backends import ALL_BACKENDS, new_repo
from tests.support.surface import ok

pytestmark = pytest.mark.backends(*ALL_BACKENDS)

MODEL = ModelRef(provider="scripted", model_id="m")
IDLE = [f"t{i:02d}" for i in range(1, 21)]
OPEN = ["t03", "t17"]


class Reads:
    """A storage that forwards everything and records (method, lane) of each call."""

    def __init__(self, inner: SessionStorage) -> None:
        self._inner = inner
        self.calls: list[tuple[str, str | None]] = []

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        if not callable(target) or name.startswith("_"):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, _lane_of(name, args, kwargs)))
            return target(*args, **kwargs)

        return call

    def lanes_read(self) -> set[str]:
        return {lane for _, lane in self.calls if lane is not None}


def _lane_of(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    if (
        name in ("get_lane", "read_operation_records", "read_lane_entries", "read_lane_slice")
        and args
    ):
        return str(args[0])
    if name == "find_open_operations":
        lane = args[0] if args else kwargs.get("lane")
        return None if lane is None else str(lane)
    if name == "find_records" and args and args[0] is not None:
        lane = args[0].lane
        return None if lane is None else str(lane)
    return None


@pytest.fixture
async def repo(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> AsyncIterator[Any]:
    server = request.getfixturevalue("redis_server") if backend == "redis" else None
    prefix = request.getfixturevalue("redis_prefix") if backend == "redis" else None
    made = new_repo(backend, tmp_path, clock=ManualClock(), redis=server, prefix=prefix)
    yield made
    await made.close()


async def _open(
    repo: SessionRepo, tag: str, **options: Any
) -> tuple[AgentHarness, list[SuspendedOperation], Reads]:
    lease = await repo.acquire_lease("s", owner="w", ttl_ms=10**9)  # one owner: takes over
    reads = Reads(await repo.open("s", lease=lease))
    harness, suspended = await AgentHarness.create(
        AgentHarnessOptions(
            storage=reads,  # a forwarding wrapper
            model_client=ScriptedModel(responder=lambda request: text("ok")),
            model=MODEL,
            ids=SequentialIds(f"{tag}-"),
            clock=ManualClock(),
            **options,
        )
    )
    return harness, suspended, reads


async def _session(repo: SessionRepo) -> None:
    """Lanes t01..t20 with one finished prompt each; t03 and t17 then left with an open run."""
    await repo.create("s")
    first, _, reads = await _open(repo, "build")
    for name in IDLE:
        lane = ok(await first.create_lane(name, None))
        assert isinstance(await lane.prompt(f"hello {name}"), Ok)
    await first.close()
    for name in OPEN:  # a crash right after the run was accepted
        await reads.append_record(operation_started(f"open-{name}", lane=name))


async def test_create_reads_only_the_lanes_with_an_open_operation(repo: SessionRepo) -> None:
    await _session(repo)
    harness, suspended, reads = await _open(repo, "p2")
    assert sorted(op.lane for op in suspended) == OPEN
    assert {op.id for op in suspended} == {f"open-{name}" for name in OPEN}
    # no idle lane was read, not even main (the harness's own lane loads on first use too)
    assert reads.lanes_read() == set(OPEN)
    assert "get_lanes" not in [name for name, _ in reads.calls]  # nor the lane list
    assert sorted(harness._rt.lanes) == OPEN


async def test_an_unloaded_lane_is_found_used_listed_and_refused(repo: SessionRepo) -> None:
    await _session(repo)
    harness, _, reads = await _open(repo, "p2")
    assert "t05" not in harness._rt.lanes
    lane = await harness.lane("t05")
    assert lane is not None and "t05" in harness._rt.lanes
    assert await harness.lane("nope") is None
    before = (await reads.get_stats()).last_seq
    assert "t07" not in harness._rt.lanes
    refused = await harness.create_lane("t07", None)
    assert isinstance(refused, Err) and refused.error.tag == "LaneExists"
    assert (await reads.get_stats()).last_seq == before  # the refusal wrote nothing
    outcome = ok(await lane.prompt("again"))
    assert outcome.kind == "completed"
    pointer = await reads.get_lane("t05")
    assert pointer is not None and pointer.leaf_id == outcome.final_entry_id
    infos = {info.name: info for info in await harness.lanes()}
    assert sorted(infos) == ["main", *IDLE]
    assert {name for name, info in infos.items() if info.status == "suspended"} == set(OPEN)
    assert infos["t11"].status == "idle" and infos["t11"].last_outcome == "completed"
    assert infos["t11"].leaf_id == (await reads.get_lane("t11")).leaf_id
    assert "t11" not in harness._rt.lanes  # listing does not keep lanes loaded
    assert (await (await harness.lane("t09")).info()) == infos["t09"]  # type: ignore[union-attr]
    assert [i.name for i in await harness.lanes(open_only=True)] == OPEN


async def test_idle_lanes_are_dropped_beyond_the_limit_and_reload_equal(
    repo: SessionRepo,
) -> None:
    await _session(repo)
    harness, _, reads = await _open(repo, "p2", max_idle_lanes=3)
    states = {}
    for name in IDLE:
        lane = await harness.lane(name)
        assert lane is not None
        if name not in OPEN:
            assert isinstance(await lane.prompt(f"more for {name}"), Ok)  # self-checked
        states[name] = harness._rt.lanes[name].state
        idle = [n for n, rt in harness._rt.lanes.items() if n != "main" and rt.task is None]
        assert len([n for n in idle if n not in OPEN]) <= 3
    assert set(OPEN) <= set(harness._rt.lanes)  # open lanes are never dropped
    assert "t01" not in harness._rt.lanes  # the least recently used went first
    assert set(harness._rt.lanes) >= {"t18", "t19", "t20"}
    reads.calls.clear()
    reloaded = await harness.lane("t01")
    assert reloaded is not None and ("read_lane_slice", "t01") in reads.calls  # read again
    assert harness._rt.lanes["t01"].state == states["t01"]
    assert await restore_lane(reads, "t01") == states["t01"]
    assert ok(await reloaded.prompt("after reload")).kind == "completed"


async def _window_of(harness: AgentHarness, name: str) -> weakref.ref[Any]:
    """A weak reference to the first message of lane `name`'s context window, as read."""
    lane = await harness.lane(name)
    assert lane is not None
    messages = (await lane.export_state()).messages
    assert messages[0] is (await lane.export_state()).messages[0]  # the same cached window
    return weakref.ref(messages[0])


@pytest.mark.backends("sqlite", "redis")  # memory and JSONL keep the entries themselves
async def test_a_dropped_lane_and_a_closed_harness_free_their_window_without_a_collection(
    repo: SessionRepo,
) -> None:
    await _session(repo)
    harness, _, _ = await _open(repo, "p2", max_idle_lanes=2)
    evicted = await _window_of(harness, "t01")
    closed = await _window_of(harness, "t02")
    assert evicted() is not None and closed() is not None  # held by the lanes' caches
    gc.disable()  # only reference counting frees anything now
    try:
        assert await harness.lane("t04") is not None  # t01 is the least recently used
        assert "t01" not in harness._rt.lanes and "t02" in harness._rt.lanes
        assert evicted() is None
        await harness.close()
        assert closed() is None
    finally:
        gc.enable()


async def test_a_lane_in_use_is_not_dropped(repo: SessionRepo) -> None:
    await _session(repo)
    harness, _, _ = await _open(repo, "p2", max_idle_lanes=0)
    lane = await harness.lane("t01")
    assert lane is not None
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow_hook(event: Any) -> None:
        entered.set()
        await release.wait()

    harness.hooks.on("before_run", slow_hook, id="slow")
    started = asyncio.create_task(lane.prompt("held"))
    await entered.wait()  # the call holds t01's runtime, idle, across the hook
    held = harness._rt.lanes["t01"]
    for name in ("t02", "t04", "t05"):
        assert await harness.lane(name) is not None
    assert harness._rt.lanes.get("t01") is held  # pinned: not dropped, not reloaded
    release.set()
    assert ok(await started).kind == "completed"


@pytest.mark.parametrize("calls", ["lookups", "lookup and prompt", "prompt and lookup"])
async def test_concurrent_first_uses_restore_a_lane_once(repo: SessionRepo, calls: str) -> None:
    await _session(repo)
    # without the self-check (a restore of its own after the run), every lane read is a load
    harness, _, reads = await _open(repo, "p2", self_check=False)
    reads.calls.clear()

    async def prompt() -> object:
        lane = await harness.lane("t08")
        assert lane is not None
        return ok(await lane.prompt("hi")).kind

    def lookup() -> Awaitable[object]:
        return harness.lane("t08")

    order = {
        "lookups": (lookup, lookup),
        "lookup and prompt": (lookup, prompt),
        "prompt and lookup": (prompt, lookup),
    }[calls]
    results = await asyncio.gather(*(call() for call in order))
    assert all(result is not None for result in results)
    assert reads.calls.count(("read_lane_slice", "t08")) == 1  # one restore


@pytest.mark.parametrize("first", ["create", "lookup"])
async def test_creating_and_looking_up_a_new_lane_at_once(repo: SessionRepo, first: str) -> None:
    await _session(repo)
    harness, _, _ = await _open(repo, "p2")
    create, lookup = harness.create_lane("fresh", None), harness.lane("fresh")
    if first == "create":
        created, found = await asyncio.gather(create, lookup)
        assert found is not None  # the lookup waited for the creation
    else:
        found, created = await asyncio.gather(lookup, create)
        assert found is None  # looked up before the lane existed
    assert isinstance(created, Ok)
    runtime = harness._rt.lanes["fresh"]
    assert ok(await created.value.prompt("hi")).kind == "completed"
    assert harness._rt.lanes["fresh"] is runtime  # one mutation line throughout
    again = await asyncio.gather(
        harness.create_lane("twice", None), harness.create_lane("twice", None)
    )
    assert sorted(type(r).__name__ for r in again) == ["Err", "Ok"]


async def test_a_corrupt_idle_lane_faults_at_its_first_use_not_at_create(
    repo: SessionRepo,
) -> None:
    await _session(repo)
    lease = await repo.acquire_lease("s", owner="w", ttl_ms=10**9)
    storage = await repo.open("s", lease=lease)
    # cancels a next-run item that was never queued: no single writer produces it
    await storage.append_record(QueueCancelled(id="ghost-cancel", lane="t12", entry_id="ghost"))
    harness, suspended, _ = await _open(repo, "p2")
    faults: list[Any] = []
    harness.events.on("fault", faults.append)
    assert sorted(op.lane for op in suspended) == OPEN  # create did not look at t12
    lane = await harness.lane("t12")
    assert lane is not None
    with pytest.raises(HarnessFault, match="cannot be restored"):
        await lane.prompt("hi")
    info = await lane.info()
    assert info.status == "faulted" and info.fault is not None and "cancel" in info.fault
    assert [f.lane for f in faults] == ["t12"]  # reported once
    assert {i.name: i.status for i in await harness.lanes()}["t12"] == "faulted"
    assert [f.lane for f in faults] == ["t12"]
    other = await harness.lane("t13")  # the session's other lanes work normally
    assert other is not None
    assert ok(await other.prompt("fine")).kind == "completed"
