"""The event loop's watch: a loop held by a blocking call is named, once, and its end said."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import pytest

from gateway.loop_watch import LoopWatch


def _fields(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, object]]:
    return [
        getattr(record.msg, "fields", {})
        for record in caplog.records
        if record.getMessage() == name
    ]


@contextlib.asynccontextmanager
async def _watched(caplog: pytest.LogCaptureFixture, blocked_after_s: float) -> AsyncIterator[None]:
    caplog.set_level(logging.WARNING, logger="gateway.loop")
    watch = LoopWatch(blocked_after_s=blocked_after_s, beat_s=0.05)
    watch.start()
    try:
        yield
    finally:
        await watch.stop()


def blocker() -> None:
    time.sleep(2.0)  # a tool's synchronous call


async def test_a_blocked_loop_is_named_once_with_where_it_is_then_its_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with _watched(caplog, 0.5):
        await asyncio.sleep(0.2)
        blocker()
        await asyncio.sleep(0.3)
    [blocked] = _fields(caplog, "event loop blocked")
    where = blocked["where"]
    assert isinstance(where, list) and where[-1].startswith("test_loop_watch.py:")
    assert where[-1].endswith(" in blocker")
    # what a block past the lease costs, said where it happens (an outside probe: a 36 s one
    # faulted its session at every try)
    assert "past GATEWAY_LEASE_SECONDS" in str(blocked["note"])
    [unblocked] = _fields(caplog, "event loop unblocked")
    assert isinstance(unblocked["seconds"], float) and unblocked["seconds"] >= 1.5


async def test_a_loop_that_keeps_running_is_never_said_blocked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with _watched(caplog, 1.5):
        for _ in range(10):
            time.sleep(0.05)  # noqa: ASYNC251 (short holds: the loop turns between them)
            await asyncio.sleep(0.01)
    assert _fields(caplog, "event loop blocked") == []
