"""Runs the one storage conformance suite against every backend, and Redis on a cluster."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import get_args

import pytest

from harness_core import SessionRepo
from harness_core.session.codec import ENTRY_TYPES, RECORD_TYPES
from harness_core.session.entries import Entry
from harness_core.session.records import Record
from harness_core.storage.memory import MemorySessionRepo
from harness_core.testing import BackendFixture, ManualClock, conformance_cases
from tests.support.backends import CONFORMANCE_BACKENDS, new_repo

pytestmark = pytest.mark.backends(*CONFORMANCE_BACKENDS)


@pytest.fixture
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BackendFixture]:
    """The conformance fixture of the backend the test runs on (see conftest.py)."""
    name = request.param
    clock = ManualClock()
    redis = request.getfixturevalue("redis_server") if name == "redis" else None
    cluster = request.getfixturevalue("redis_cluster") if name == "redis-cluster" else None
    uses_redis = name in ("redis", "redis-cluster")
    prefix = request.getfixturevalue("redis_prefix") if uses_redis else None
    memory = MemorySessionRepo(clock=clock) if name == "memory" else None

    def make() -> SessionRepo:
        if memory is not None:
            return memory  # memory lives as long as its repository: reopening keeps it
        return new_repo(
            name, tmp_path / "store", clock=clock, redis=redis, cluster=cluster, prefix=prefix
        )

    repos: list[SessionRepo] = [make()]

    async def reopen() -> SessionRepo:
        if memory is None:
            await repos[-1].close()
        repos.append(make())
        return repos[-1]

    yield BackendFixture(
        name=name,
        repo=repos[0],
        clock=clock,
        leases_expire=name != "jsonl",
        reopen=reopen,
    )
    for repo in repos:
        await repo.close()


CASES = conformance_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_conformance(backend: BackendFixture, case) -> None:
    await case.run(backend)


def test_the_codec_knows_every_entry_and_record_type() -> None:
    # encode_entry/encode_record refuse anything else: a type missing here could not be written
    assert set(ENTRY_TYPES) == set(get_args(get_args(Entry)[0]))
    assert set(RECORD_TYPES) == set(get_args(get_args(Record)[0]))
