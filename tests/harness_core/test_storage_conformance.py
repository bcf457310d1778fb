"""Runs the one storage conformance suite against every backend."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest

from harness_core.storage.memory import MemorySessionRepo
from harness_core.testing import BackendFixture, ManualClock, conformance_cases


@asynccontextmanager
async def memory_backend() -> AsyncIterator[BackendFixture]:
    clock = ManualClock()
    repo = MemorySessionRepo(clock=clock)

    async def reopen() -> MemorySessionRepo:
        return repo

    yield BackendFixture(name="memory", repo=repo, clock=clock, leases_expire=True, reopen=reopen)
    await repo.close()


BACKENDS: dict[str, Callable[[], AbstractAsyncContextManager[BackendFixture]]] = {
    "memory": memory_backend,
}

CASES = conformance_cases()


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_conformance(backend, case):
    async with BACKENDS[backend]() as fixture:
        await case.run(fixture)
