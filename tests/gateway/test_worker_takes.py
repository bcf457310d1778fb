"""A free slot's next session: a lingering session's message and a take, when both come at once.

A real SQLite broker on a manual clock. The session taken is a dead worker's: its ticket lapsed
with nothing pending (its operation is open in the store), the case where ending the ticket as
if it was served would leave that operation for nobody.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest

from gateway.broker import open_broker
from gateway.broker.contract import Broker, NewInboxItem, SessionTicket
from gateway.worker import Worker, WorkerConfig, _Session
from harness_core.testing import ManualClock

VISIBILITY_MS = 5_000


CLOCK = ManualClock()


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    opened = open_broker(
        f"sqlite:///{tmp_path}/broker.db", clock=CLOCK, visibility_timeout_ms=VISIBILITY_MS
    )
    yield opened
    await opened.close()


async def lapsed(broker: Broker, session: str) -> None:
    """`session` was taken by a worker that died after its message was accepted."""
    appended = await broker.inbox.append(
        NewInboxItem(
            session=session,
            lane="web:t1",
            dedupe_key=session,
            kind="message",
            payload={"text": "hello"},
        )
    )
    assert await broker.inbox.take_session("dead") is not None
    await broker.inbox.ack(session, appended.item.id)
    CLOCK.advance(VISIBILITY_MS + 1)


def worker_over(broker: Broker, warm: _Session, *, at_once: bool) -> Worker:
    """A worker (no slots running) whose lingering session `warm` gets a message as its take
    returns (`at_once`), or never."""
    worker = Worker(
        WorkerConfig(worker_id="w1", slots=1), cast(Any, None), broker, cast(Any, None), CLOCK
    )
    real = broker.inbox.take_session

    async def take(name: str, *, wait_ms: int = 0) -> SessionTicket | None:
        ticket = await real(name, wait_ms=0)
        if at_once:
            worker._resuming.put_nowait(warm)  # the linger hands it over in the same instant
        return ticket

    broker.inbox.take_session = take  # type: ignore[method-assign,assignment]
    return worker


@pytest.mark.parametrize("at_once", [True, False])
async def test_a_dead_workers_session_taken_with_a_warm_one_is_left_for_the_next_take(
    broker: Broker, at_once: bool
) -> None:
    await lapsed(broker, "s-dead")
    warm = cast(_Session, object())
    worker = worker_over(broker, warm, at_once=at_once)
    got = await asyncio.wait_for(worker._next(), 5)
    if not at_once:
        assert isinstance(got, SessionTicket) and got.session == "s-dead"
        return
    assert got is warm  # the warm one is cheaper to carry on with
    again = await broker.inbox.take_session("w2")
    assert again is not None, "the dead worker's session was dropped: its operation waits"
    assert again.session == "s-dead"
