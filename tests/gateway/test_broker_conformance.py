"""Runs the one broker conformance suite on SQLite and on Redis (a real redis-server).

The blob area's cases run on a Redis Cluster too (its keys are hash-tagged by session; the
rest of the broker meets the cluster in test_broker_redis).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gateway.broker import open_broker
from gateway.broker.conformance import BrokerFixture, broker_cases
from gateway.broker.contract import Broker
from gateway.broker.limits import BlobLimits
from gateway.broker.redis import RedisBroker
from harness_core.testing import ManualClock

VISIBILITY_TIMEOUT_MS = 5_000
DEDUPE_TTL_MS = 60_000
BLOB_LIMITS = BlobLimits(max_blob_bytes=4_000, max_session_bytes=12_000, retention_ms=60_000)


Open = Callable[..., Broker]
"""Opens another broker on the fixture's data, timed by ``clock=`` (a keyword)."""


def _by_url(url: str) -> Open:
    def open_one(clock: ManualClock) -> Broker:
        return open_broker(
            url,
            clock=clock,
            visibility_timeout_ms=VISIBILITY_TIMEOUT_MS,
            dedupe_ttl_ms=DEDUPE_TTL_MS,
            blob_limits=BLOB_LIMITS,
        )

    return open_one


@contextlib.asynccontextmanager
async def _opened(name: str, open_one: Open) -> AsyncIterator[BrokerFixture]:
    """A fresh broker on a manual clock; every broker it opened closed after."""
    clock = ManualClock()
    opened: list[Broker] = []

    async def open_another() -> Broker:
        opened.append(open_one(clock=clock))
        return opened[-1]

    first = await open_another()
    try:
        yield BrokerFixture(
            name=name,
            broker=first,
            clock=clock,
            visibility_timeout_ms=VISIBILITY_TIMEOUT_MS,
            dedupe_ttl_ms=DEDUPE_TTL_MS,
            open_another=open_another,
            blob_limits=BLOB_LIMITS,
        )
    finally:
        for each in opened:
            await each.close()


@pytest.fixture(params=["sqlite", "redis", "redis-one-shard"])
async def broker(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BrokerFixture]:
    """A fresh broker of each kind on a manual clock (Redis: a key prefix no other test uses).

    ``redis-one-shard``: every claim takes its one shard in one script call (`outbox_take`),
    which 16 shards do only once the outbox bell narrowed a claim to one.
    """
    name = request.param
    if name == "sqlite":
        open_one = _by_url(f"sqlite:///{tmp_path / 'broker.db'}")  # absolute: four slashes
    else:
        server = request.getfixturevalue("redis_server")
        prefix = request.getfixturevalue("redis_prefix")
        open_one = _by_url(f"{server.url}?prefix={prefix}")
        if name == "redis-one-shard":
            open_one = functools.partial(
                RedisBroker,
                server.url,
                prefix=prefix,
                shards=1,
                visibility_timeout_ms=VISIBILITY_TIMEOUT_MS,
                dedupe_ttl_ms=DEDUPE_TTL_MS,
                blob_limits=BLOB_LIMITS,
            )
    async with _opened(name, open_one) as fixture:
        yield fixture


@pytest.fixture
async def cluster_broker(request: pytest.FixtureRequest) -> AsyncIterator[BrokerFixture]:
    """A fresh broker on the local Redis Cluster, under a key prefix no other test uses."""
    cluster = request.getfixturevalue("redis_cluster")
    url = f"{cluster.url}?prefix={request.getfixturevalue('redis_prefix')}"
    async with _opened("redis-cluster", _by_url(url)) as fixture:
        yield fixture


CASES = broker_cases()
BLOB_CASES = [case for case in CASES if case.group == "blobs"]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_broker_conformance(broker: BrokerFixture, case) -> None:
    await case.run(broker)


@pytest.mark.parametrize("case", BLOB_CASES, ids=[c.id for c in BLOB_CASES])
async def test_blob_conformance_on_a_redis_cluster(cluster_broker: BrokerFixture, case) -> None:
    await case.run(cluster_broker)


def test_every_case_has_a_unique_id() -> None:
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids))
