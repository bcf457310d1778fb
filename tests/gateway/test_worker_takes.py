"""A free slot's next session: a lingering session's message and a take, when both come at once.

A real SQLite broker on a manual clock. The session taken is a dead worker's: its ticket lapsed
with nothing pending (its operation is open in the store), the case where ending the ticket as
if it was served would leave that operation for nobody.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest

from gateway.broker import open_broker
from gateway.broker.contract import Broker, NewInboxItem, SessionTicket
from gateway.worker import Worker, WorkerConfig, _Session
from harness_core import SessionError
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


async def test_what_is_let_go_after_an_outage_is_said_only_once_it_is(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """ "let go after the outage" was logged 3 times a second while the store still refused,
    each line claiming the lease given up (an outside probe)."""

    class Store:
        def __init__(self) -> None:
            self.answers = False
            self.released: list[str] = []

        async def release_lease(self, lease: str) -> bool:
            if not self.answers:
                raise SessionError("storage", "redis release failed: Connection refused")
            self.released.append(lease)
            return True

    store = Store()
    worker = Worker(
        WorkerConfig(worker_id="w1", slots=1), cast(Any, store), broker, cast(Any, None), CLOCK
    )
    worker._owed_leases.append("lease-1")
    caplog.set_level(logging.INFO, logger="gateway.worker")
    for _ in range(3):
        await worker._settle_owed()  # refused again: owed again, nothing said
    assert worker._owed_leases == ["lease-1"] and not caplog.records
    store.answers = True
    await worker._settle_owed()
    assert store.released == ["lease-1"] and worker._owed_leases == []
    [line] = caplog.records
    assert line.getMessage() == "let go after the outage"
    assert getattr(line.msg, "fields", {}) == {"leases": 1, "tickets": 0}


async def test_messages_that_wait_while_every_slot_is_busy_are_said_once_a_minute(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """A message to a session no slot could take waited without a word (an outside probe)."""
    worker = Worker(
        WorkerConfig(worker_id="w1", slots=2), cast(Any, None), broker, cast(Any, None), CLOCK
    )
    await broker.inbox.append(
        NewInboxItem(session="s-late", lane="web:t1", dedupe_key="m1", kind="message", payload={})
    )
    CLOCK.advance(29_000)
    caplog.set_level(logging.INFO, logger="gateway.worker")
    assert not await worker.slots_busy()  # busy, and waiting, for less than 30 s
    CLOCK.advance(1_000)
    worker._free = 1  # a slot waits for a session: the message is not waiting for one
    assert not await worker.slots_busy()
    worker._free = 0
    worker._last_free_ms = CLOCK.now_ms() - 30_000
    assert await worker.slots_busy()
    [said] = [r for r in caplog.records if r.getMessage() == "messages wait for a free slot"]
    fields = said.msg.fields  # type: ignore[union-attr]
    assert (fields["slots"], fields["busy_s"], fields["pending"], fields["oldest_s"]) == (
        2,
        30,
        1,
        30,
    )
    assert "GATEWAY_WORKER_SLOTS" in fields["hint"]
    CLOCK.advance(59_000)
    assert not await worker.slots_busy()  # once a minute at most
    CLOCK.advance(1_000)
    assert await worker.slots_busy()


async def test_a_session_that_faulted_waits_while_the_store_refuses_writes(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """A Redis full under noeviction faulted each take's first write; each take resumed the
    lane's operation once more, and three in 7 s parked it stuck (an outside probe). A take of
    a session that faulted asks the store first, and resumes nothing while it refuses."""
    answers: list[Exception | None] = [OSError("OOM command not allowed when used memory")]
    asked: list[int] = []

    async def writable() -> Exception | None:
        asked.append(1)
        return answers[-1]

    worker = Worker(
        WorkerConfig(worker_id="w1", slots=1),
        cast(Any, None),
        broker,
        cast(Any, None),
        CLOCK,
        writable=writable,
    )
    assert not await worker._refuses_writes("s1")  # it never faulted: nothing asked
    assert asked == []
    worker._faults["s1"] = 1
    caplog.set_level(logging.INFO, logger="gateway.worker")
    assert await worker._refuses_writes("s1")
    [said] = [
        r for r in caplog.records if r.getMessage() == "session waits for the store to take writes"
    ]
    assert "OOM" in said.msg.fields["reason"]  # type: ignore[union-attr]
    answers.append(None)  # the store takes writes again: the take goes on
    assert not await worker._refuses_writes("s1")
