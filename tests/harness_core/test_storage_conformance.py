"""Runs the one storage conformance suite against every backend."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, get_args

import pytest

from harness_core.session.codec import ENTRY_TYPES, RECORD_TYPES
from harness_core.session.contract import SessionRepo
from harness_core.session.entries import Entry
from harness_core.session.records import Record
from harness_core.storage.jsonl import JsonlSessionRepo
from harness_core.storage.memory import MemorySessionRepo
from harness_core.storage.redis_streams import RedisSessionRepo
from harness_core.storage.sqlite import SqliteSessionRepo
from harness_core.testing import BackendFixture, ManualClock, conformance_cases

BACKENDS = ["memory", "jsonl", "sqlite", "redis"]


def _make_repo(name: str, request: pytest.FixtureRequest, clock: ManualClock) -> Callable[[], Any]:
    if name == "memory":
        shared = MemorySessionRepo(clock=clock)
        return lambda: shared
    tmp_path = request.getfixturevalue("tmp_path")
    if name == "jsonl":
        return lambda: JsonlSessionRepo(tmp_path / "sessions", clock=clock)
    if name == "sqlite":
        return lambda: SqliteSessionRepo(tmp_path / "store.db", clock=clock)
    server = request.getfixturevalue("redis_server")
    prefix = request.getfixturevalue("redis_prefix")
    return lambda: RedisSessionRepo(server.url, prefix=prefix, clock=clock)


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[BackendFixture]:
    clock = ManualClock()
    make = _make_repo(request.param, request, clock)
    repos: list[SessionRepo] = [make()]

    async def reopen() -> SessionRepo:
        if request.param != "memory":  # memory lives as long as its repository
            await repos[-1].close()
        repos.append(make())
        return repos[-1]

    yield BackendFixture(
        name=request.param,
        repo=repos[0],
        clock=clock,
        leases_expire=request.param != "jsonl",
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
