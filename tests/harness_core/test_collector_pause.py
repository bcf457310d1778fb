"""The cyclic collector is paused while a large batch of stored data decodes, and only then.

The pause is process-wide, so it nests by count across threads, leaves an application's own
`gc.disable()` alone, and ends on an exception. Each durable backend decodes a long lane's
window (and JSONL its log) with the collector paused.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness_core import AgentHarness, AgentHarnessOptions, ModelRef, Ok
from harness_core.models.scripted import ScriptedModel, text
from harness_core.session import codec
from harness_core.session.collector import PAUSE_AT, collector_paused
from harness_core.session.contract import SessionRepo
from harness_core.storage import jsonl, redis_streams, sqlite
from harness_core.testing import ManualClock
from tests.support.backends import new_repo


@pytest.fixture(autouse=True)
def collector_enabled() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_a_large_batch_pauses_the_collector_and_a_small_one_does_not() -> None:
    with collector_paused(PAUSE_AT):
        assert not gc.isenabled()
    assert gc.isenabled()
    with collector_paused(PAUSE_AT - 1):
        assert gc.isenabled()


def test_the_collector_comes_back_when_the_decode_fails() -> None:
    with pytest.raises(ValueError, match="corrupt"), collector_paused(PAUSE_AT):
        raise ValueError("corrupt")
    assert gc.isenabled()


def test_an_application_that_disabled_the_collector_keeps_it_disabled() -> None:
    gc.disable()
    with collector_paused(PAUSE_AT):
        assert not gc.isenabled()
    assert not gc.isenabled()


@pytest.mark.parametrize("last", ["first", "second"])
def test_overlapping_batches_on_two_threads_resume_it_when_the_last_one_ends(last: str) -> None:
    entered, release = threading.Event(), threading.Event()
    seen: list[bool] = []

    def other() -> None:
        with collector_paused(PAUSE_AT):
            entered.set()
            release.wait(5)
        seen.append(gc.isenabled())

    thread = threading.Thread(target=other)
    with collector_paused(PAUSE_AT):
        thread.start()
        assert entered.wait(5)
        if last == "first":  # the other thread's batch ends inside this one
            release.set()
            thread.join(5)
            assert seen == [False]
    assert gc.isenabled() is (last == "first")
    release.set()
    thread.join(5)
    assert gc.isenabled()


def _spy(calls: list[bool], decode: Any) -> Any:
    def spied(*args: Any) -> Any:
        calls.append(gc.isenabled())
        return decode(*args)

    return spied


async def _long_lane(repo: SessionRepo) -> AgentHarness:
    lease = await repo.acquire_lease("s", owner="w", ttl_ms=10**9)  # one owner: takes over
    harness, _ = await AgentHarness.create(
        AgentHarnessOptions(
            storage=await repo.open("s", lease=lease),
            model_client=ScriptedModel(responder=lambda request: text("ok")),
            model=ModelRef(provider="scripted", model_id="m"),
            clock=ManualClock(),
        )
    )
    return harness


@pytest.mark.backends("jsonl", "sqlite", "redis")
async def test_a_long_lanes_window_decodes_with_the_collector_paused(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = request.getfixturevalue("redis_server") if backend == "redis" else None
    prefix = request.getfixturevalue("redis_prefix") if backend == "redis" else None
    turns = PAUSE_AT // 2 + 1  # a user message and an answer each
    repo = new_repo(backend, tmp_path, redis=server, prefix=prefix)
    await repo.create("s")
    harness = await _long_lane(repo)
    for k in range(turns):
        assert isinstance(await harness.prompt(f"q{k}"), Ok)
    await harness.close()
    await repo.close()
    calls: list[bool] = []
    # what the store wrote carries its checksum: it decodes with the trusted decoders (D240)
    if backend == "jsonl":
        monkeypatch.setattr(jsonl, "trusted_log_item", _spy(calls, codec.trusted_log_item))
    else:
        module: Any = sqlite if backend == "sqlite" else redis_streams
        monkeypatch.setattr(module, "trusted_entry", _spy(calls, codec.trusted_entry))
    repo = new_repo(backend, tmp_path, redis=server, prefix=prefix)  # as a restarted process
    try:
        harness = await _long_lane(repo)
        assert len((await harness.export_state()).messages) == 2 * turns
        await harness.close()
    finally:
        await repo.close()
    assert len(calls) >= 2 * turns
    assert not any(calls), f"{calls.count(True)} of {len(calls)} decoded with the collector on"
    assert gc.isenabled()


def test_a_batch_decoded_while_paused_is_never_traversed_by_a_young_collection() -> None:
    """Its objects leave the pause in the oldest generation (`gc.freeze` + `gc.unfreeze`)."""
    gc.collect()
    with collector_paused(PAUSE_AT):
        batch = [[n] for n in range(10_000)]  # lists: tracked by the collector
        assert gc.get_count()[0] >= 10_000
    assert gc.get_count()[0] < 100  # the next allocation triggers no collection of them
    ours = {id(item) for item in batch}
    young = gc.get_objects(generation=0) + gc.get_objects(generation=1)
    assert not ours & {id(item) for item in young}
    assert len(ours & {id(item) for item in gc.get_objects(generation=2)}) == 10_000
