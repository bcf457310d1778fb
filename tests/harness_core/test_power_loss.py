"""Power-loss simulation: every trajectory, cut at every write, keeps only what was fsynced.

Under the default durability (``effects``, D233) a commit is fsynced only at a durability point;
power loss keeps the files as they were at the last fsync and drops everything written after.
The simulation sees every fsync the backends make themselves (`fsync_file` for SQLite's WAL,
`fsync_fd` for a JSONL session file): right after each one it copies the files' bytes, which is
exactly what the disk holds durably at that instant (SQLite's own checkpoints fsync what they
move before and after, so the copy is never behind the disk). A cut at any write between two
fsyncs leaves the same files, the copy made at the first of them; every write of the live run is
such a cut, so every distinct durable image is recovered, each against the most the live run
had done before the next fsync (the hardest cut for that image).

For each image, in a copy of its own: the store opens, every lane is restored and resumed as a
restarted process does, the recovered log satisfies the recovery invariants the process-crash
matrix checks (`check_invariants`: no lost acceptance, no dangling intent, ...), a
``replay="never"`` tool never ran twice across the live run and the recovery, and recovering
the recovered state again changes nothing. Every promise made at a durability point survives:
each outcome the harness returned to its caller is in the image of the last fsync before it
returned (its operation's end was fsynced first), and each ``replay="never"`` tool that ran
finds its intent in the image of the last fsync before it ran.
"""

from __future__ import annotations

import itertools
import shutil
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness_core.backends import sqlite as sqlite_family
from harness_core.harness import AgentHarness
from harness_core.session.contract import SessionRepo
from harness_core.session.types import LogItem
from harness_core.storage import jsonl as jsonl_backend
from harness_core.storage.jsonl import JsonlSessionRepo
from harness_core.storage.sqlite import SqliteSessionRepo
from harness_core.testing import ManualClock
from harness_core.testing.invariants import (
    Counters,
    assert_fixed_point,
    check_invariants,
    parked_deferred,
    resume_all,
    shape,
    tool_of,
)
from harness_core.testing.trajectories import SCENARIOS, Run, Scenario, open_run, prompt

pytestmark = pytest.mark.backends("sqlite", "jsonl")
_copies = itertools.count()


@dataclass
class Image:
    """The files as they were right after one fsync: what survives a power cut until the next."""

    directory: Path
    invocations: Counter[str] = field(default_factory=Counter)
    """Tool runs (by idempotency key) the live run had made before the next fsync began."""


@dataclass
class PowerLoss:
    """Copies the store's files at every fsync its backend makes (the durable images)."""

    backend: str
    live: Path
    root: Path
    counters: Counters
    images: list[Image] = field(default_factory=list)
    recording: bool = False
    """Off once the live run stopped (recoveries fsync copies, not the live files)."""

    def synced(self) -> None:
        """An fsync just returned: the files now on disk are the next durable image."""
        if not self.recording:
            return
        if self.images:  # the previous image's worst cut: everything done up to this fsync
            self.images[-1].invocations = Counter(self.counters.invocations)
        target = self.root / f"image{next(_copies)}"
        target.mkdir()
        for path in self.live.iterdir():
            # SQLite: the database and its WAL (the -shm index is rebuilt from the WAL on
            # open, as after any crash); JSONL: the session files (lock files hold no data)
            if path.suffix in (".db", ".jsonl") or path.name.endswith(".db-wal"):
                shutil.copyfile(path, target / path.name)
        self.images.append(Image(target))

    def repo(self, image: Image) -> SessionRepo:
        """A repository over a copy of `image` (recovery writes into the copy only)."""
        copy = self.root / f"open{next(_copies)}"
        shutil.copytree(image.directory, copy)
        if self.backend == "sqlite":
            return SqliteSessionRepo(copy / "store.db", clock=ManualClock())
        return JsonlSessionRepo(copy, clock=ManualClock())


@pytest.fixture
def power(backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PowerLoss:
    """Intercepts the backend's own fsyncs: after each, the files are copied (an image)."""
    live = tmp_path / "live"
    live.mkdir()
    sim = PowerLoss(backend, live, tmp_path, Counters())
    real_file, real_fd = sqlite_family.fsync_file, jsonl_backend.fsync_fd

    def fsync_file(path: Path) -> None:
        real_file(path)
        if path.name.endswith("-wal"):  # the directory's own fsync follows the WAL's
            sim.synced()

    def fsync_fd(fd: int) -> None:
        real_fd(fd)
        sim.synced()

    monkeypatch.setattr(sqlite_family, "fsync_file", fsync_file)
    monkeypatch.setattr(jsonl_backend, "fsync_fd", fsync_fd)
    return sim


def live_repo(sim: PowerLoss) -> SessionRepo:
    if sim.backend == "sqlite":
        return SqliteSessionRepo(sim.live / "store.db", clock=ManualClock())
    return JsonlSessionRepo(sim.live, clock=ManualClock())


@dataclass
class Promises:
    """What the live run told the world, each with the number of fsyncs made before it."""

    outcomes: list[tuple[int, int]] = field(default_factory=list)
    """(fsyncs before, the live log's length) at each outcome returned to a caller."""
    never_runs: list[tuple[int, str]] = field(default_factory=list)
    """(fsyncs before, idempotency key) at each run of a ``replay="never"`` tool."""


async def log_of(repo: SessionRepo) -> tuple[LogItem, ...]:
    return await (await repo.open("s")).get_log()


async def recover(scenario: Scenario, repo: SessionRepo, ids: str) -> tuple[Any, Counters, Run]:
    run = await open_run(scenario, repo, ids, create=False)
    await resume_all(run.harness, scenario.decide, unstick=scenario.unstick)
    await assert_fixed_point(run.harness)
    return await run.storage.get_log(), run.counters, run


@pytest.fixture
async def closing() -> AsyncIterator[list[SessionRepo]]:
    repos: list[SessionRepo] = []
    yield repos
    for repo in repos:
        await repo.close()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_every_write_is_a_recoverable_power_cut(
    scenario: Scenario,
    power: PowerLoss,
    closing: list[SessionRepo],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    never = {name for name, replay in scenario.replay.items() if replay == "never"}
    promises = Promises()
    repo = live_repo(power)
    closing.append(repo)
    # the scenario's setup (a dead process's run, for the interrupted ones) is not under test:
    # the cuts start once the live harness holds the session, whose files are durable then
    power.recording = False
    run = await open_run(scenario, repo, "live-", create=True, counters=power.counters)
    power.recording = True
    power.synced()
    real_wait = AgentHarness._wait

    async def wait(harness: AgentHarness, task: Any) -> Any:
        result = await real_wait(harness, task)
        promises.outcomes.append((len(power.images), len(await run.storage.get_log())))
        return result

    monkeypatch.setattr(AgentHarness, "_wait", wait)
    work = scenario.drive(run.harness) if scenario.drive else prompt(run.harness)
    await work
    monkeypatch.setattr(AgentHarness, "_wait", real_wait)
    live_log = await run.storage.get_log()
    await repo.close()  # a clean stop is a durability point too: the last image is everything
    power.recording = False
    power.images[-1].invocations = Counter(power.counters.invocations)  # its cut: the very end
    seen = Counter[str]()
    # every run of a `never` tool, and the fsyncs made before it (from the images' counters)
    for index, image in enumerate(power.images):
        for key, runs in (image.invocations - seen).items():
            if tool_of(live_log, key) in never:
                promises.never_runs.extend([(index + 1, key)] * runs)
        seen |= image.invocations
    assert power.images, "the live run made no fsync"
    writes = len(live_log)
    assert len(power.images) <= writes + 2, "more durability points than writes"

    declarations = scenario.recovery_replay or scenario.replay
    image_logs: list[tuple[LogItem, ...]] = []
    for index, image in enumerate(power.images):
        where = f"power cut after fsync {index} of {len(power.images)}"
        copy = power.repo(image)
        closing.append(copy)
        if not await _has_session(copy):  # cut before the session was created: nothing owed
            image_logs.append(())
            continue
        prefix = await log_of(copy)
        image_logs.append(prefix)
        assert [item.seq for item in prefix] == list(range(1, len(prefix) + 1)), where
        log, counters, first = await recover(scenario, copy, f"r{index}-")
        check_invariants(prefix, log, counters, declarations)
        for key, runs in counters.invocations.items():
            never_tool = tool_of(log, key) in never | {None}
            assert image.invocations[key] + runs <= 1 or not never_tool, where
        await first.harness.close()
        await copy.close()
        again_repo = power.repo(Image(_copy_of(copy, power)))
        closing.append(again_repo)
        again, counters_again, _ = await recover(scenario, again_repo, f"q{index}-")
        if not parked_deferred(log):
            assert shape(again) == shape(log), where
        assert sum(counters_again.executions.values()) == 0, where

    for fsyncs, length in promises.outcomes:  # an outcome's writes were fsynced before it
        assert fsyncs > 0 and len(image_logs[fsyncs - 1]) >= length, (fsyncs, length)
    for fsyncs, key in promises.never_runs:  # a `never` tool's intent was fsynced before it ran
        assert fsyncs > 0 and tool_of(image_logs[fsyncs - 1], key) is not None, (fsyncs, key)


async def _has_session(repo: SessionRepo) -> bool:
    return any(meta.id == "s" for meta in await repo.list())


def _copy_of(repo: SessionRepo, sim: PowerLoss) -> Path:
    """The files of a repository recovery wrote into, as an image directory (for a 2nd pass)."""
    source = repo.path.parent if isinstance(repo, SqliteSessionRepo) else Path(repo.directory)  # type: ignore[attr-defined]
    target = sim.root / f"again{next(_copies)}"
    target.mkdir()
    for path in source.iterdir():
        if path.suffix in (".db", ".jsonl") or path.name.endswith(".db-wal"):
            shutil.copyfile(path, target / path.name)
    return target
