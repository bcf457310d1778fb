"""Runs the one broker conformance suite on SQLite and on Redis (a real redis-server)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.broker import open_broker
from gateway.broker.conformance import BrokerFixture, broker_cases
from gateway.broker.contract import Broker
from harness_core.testing import ManualClock

VISIBILITY_TIMEOUT_MS = 5_000
DEDUPE_TTL_MS = 60_000


@pytest.fixture(params=["sqlite", "redis"])
async def broker(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BrokerFixture]:
    """A fresh broker of each kind on a manual clock (Redis: a key prefix no other test uses)."""
    name = request.param
    if name == "sqlite":
        url = f"sqlite:///{tmp_path / 'broker.db'}"  # tmp_path is absolute: four slashes
    else:
        server = request.getfixturevalue("redis_server")
        url = f"{server.url}?prefix={request.getfixturevalue('redis_prefix')}"
    clock = ManualClock()
    opened: list[Broker] = []

    async def open_another() -> Broker:
        opened.append(
            open_broker(
                url,
                clock=clock,
                visibility_timeout_ms=VISIBILITY_TIMEOUT_MS,
                dedupe_ttl_ms=DEDUPE_TTL_MS,
            )
        )
        return opened[-1]

    first = await open_another()
    yield BrokerFixture(
        name=name,
        broker=first,
        clock=clock,
        visibility_timeout_ms=VISIBILITY_TIMEOUT_MS,
        dedupe_ttl_ms=DEDUPE_TTL_MS,
        open_another=open_another,
    )
    for each in opened:
        await each.close()


CASES = broker_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_broker_conformance(broker: BrokerFixture, case) -> None:
    await case.run(broker)


def test_every_case_has_a_unique_id() -> None:
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids))
