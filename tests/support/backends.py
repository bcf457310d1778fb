"""Storage backends by name: the sets tests run on, and a fresh repository of each.

The `backend` fixture (tests/harness_core/conftest.py) parametrizes tests over these names.
"""

from __future__ import annotations

from pathlib import Path

from harness_core import SessionRepo
from harness_core.clock import Clock
from harness_core.storage.jsonl import JsonlSessionRepo
from harness_core.storage.memory import MemorySessionRepo
from harness_core.storage.redis_streams import RedisSessionRepo
from harness_core.storage.sqlite import SqliteSessionRepo
from tests.support.redis_cluster import LocalRedisCluster
from tests.support.redis_server import RedisServer

ALL_BACKENDS = ("memory", "jsonl", "sqlite", "redis")
"""Every backend."""

CONFORMANCE_BACKENDS = (*ALL_BACKENDS, "redis-cluster")
"""What the storage conformance suite runs on: every backend, and Redis Streams on a cluster."""

HARNESS_BACKENDS = ("memory", "sqlite")
"""The default set: the reference backend and the embedded durable one."""


def new_repo(
    backend: str,
    directory: Path,
    *,
    clock: Clock | None = None,
    redis: RedisServer | None = None,
    cluster: LocalRedisCluster | None = None,
    prefix: str | None = None,
) -> SessionRepo:
    """A repository of `backend` (not yet opened).

    Files live in `directory`: the JSONL backend's session files, SQLite's ``store.db`` (so a
    second call with the same directory reopens the same store). Redis needs the `redis`
    server and a key `prefix` no other test uses; ``redis-cluster`` (the Redis backend on a
    Redis Cluster) the `cluster` and a prefix. Memory ignores `directory`.
    """
    if backend == "memory":
        return MemorySessionRepo(clock=clock)
    if backend == "jsonl":
        return JsonlSessionRepo(directory, clock=clock)
    if backend == "sqlite":
        return SqliteSessionRepo(directory / "store.db", clock=clock)
    if backend == "redis":
        assert redis is not None and prefix is not None, "redis needs a server and a key prefix"
        return RedisSessionRepo(redis.url, prefix=prefix, clock=clock)
    if backend == "redis-cluster":
        assert cluster is not None and prefix is not None, "needs a cluster and a key prefix"
        return RedisSessionRepo(cluster.startup_url, prefix=prefix, cluster=True, clock=clock)
    raise ValueError(f"unknown backend {backend!r}")
