from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator

import pytest

pytest.register_assert_rewrite("harness_core.testing")

from tests.support.redis_server import RedisServer  # noqa: E402

_prefixes = itertools.count()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the whole run; tests isolate themselves with key prefixes."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
async def _close_kit_repos() -> AsyncIterator[None]:
    yield
    from tests.support.harness_kit import OPEN_REPOS

    while OPEN_REPOS:
        await OPEN_REPOS.pop().close()


@pytest.fixture
def redis_prefix(worker_id: str = "w") -> str:
    """A key prefix no other test uses."""
    return f"t{next(_prefixes)}"
