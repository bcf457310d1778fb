"""The writer lease lives as long as the work: renewed at half-life while a lane works, paid
calls withheld when authority runs low, and a lost lease surfaced as an event and a fault."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from harness_core import ScriptedModel
from harness_core.errors import HarnessFault, LeaseLost, SessionError
from harness_core.events import LeaseLostEvent, LeaseRenewalFailed
from harness_core.harness import AgentHarness
from harness_core.ids import SequentialIds
from harness_core.models.scripted import text, tool_call
from harness_core.options import AgentHarnessOptions
from harness_core.result import Ok
from harness_core.session.types import WriterLease
from harness_core.storage.memory import MemorySessionRepo
from harness_core.testing import ManualClock
from harness_core.tools import Tool, ToolContext
from tests.support.harness_kit import MODEL

TTL = 30_000


class FlakyStorage:
    """Forwards to a storage; `renew_lease` fails while `failing` is set (the store is away)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.failing = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def renew_lease(self) -> WriterLease:
        if self.failing:
            raise SessionError("storage", "connection refused")
        lease: WriterLease = await self._inner.renew_lease()
        return lease


class Setup:
    def __init__(self) -> None:
        self.clock = ManualClock()
        self.repo = MemorySessionRepo(clock=self.clock)
        self.release = asyncio.Event()
        self.tool_started = asyncio.Event()
        self.events: list[Any] = []

    async def harness(self, script: list[Any]) -> AgentHarness:
        await self.repo.create("s")
        self.lease = await self.repo.acquire_lease("s", owner="w", ttl_ms=TTL)
        self.storage = FlakyStorage(await self.repo.open("s", lease=self.lease))

        async def slow(args: Any, ctx: ToolContext) -> str:
            self.tool_started.set()
            released = asyncio.ensure_future(self.release.wait())
            aborted = asyncio.ensure_future(ctx.abort.wait())  # a good tool stops on abort
            await asyncio.wait({released, aborted}, return_when=asyncio.FIRST_COMPLETED)
            released.cancel()
            aborted.cancel()
            return "slow result"

        self.model = ScriptedModel(script)
        harness, _ = await AgentHarness.create(
            AgentHarnessOptions(
                storage=self.storage,
                model_client=self.model,
                model=MODEL,
                tools=[Tool(name="slow", description="slow", execute=slow)],
                clock=self.clock,
                ids=SequentialIds("id-"),
            )
        )
        harness.events.on(None, self.events.append)
        return harness

    async def advance(self, ms: int, step: int = 1_000) -> None:
        """Let time pass in steps, letting the event loop run in between."""
        for _ in range(ms // step):
            self.clock.advance(step)
            for _ in range(5):
                await asyncio.sleep(0)


async def test_a_tool_longer_than_the_lease_keeps_its_lease_and_its_result() -> None:
    setup = Setup()
    harness = await setup.harness([tool_call("slow", {}), text("done")])
    running = asyncio.ensure_future(harness.prompt("go"))
    await setup.tool_started.wait()
    await setup.advance(5 * TTL)  # far beyond the ttl: only renewals keep the lease
    assert harness._rt.keeper is not None and harness._rt.keeper.renewals >= 9
    setup.release.set()
    result = await running
    assert isinstance(result, Ok) and result.value.kind == "completed"
    renewals = harness._rt.keeper.renewals
    await setup.advance(3 * TTL)  # idle: nothing to keep alive
    assert harness._rt.keeper.renewals == renewals
    assert not [e for e in setup.events if isinstance(e, (LeaseLostEvent, LeaseRenewalFailed))]


@pytest.mark.parametrize("held", [True, False])
async def test_a_caller_holding_an_idle_harness_keeps_its_lease(held: bool) -> None:
    """A gateway reads a message's files before the message enters its lane: the harness is
    idle meanwhile and renewed nothing, so a read past the lease lost it, and the prompt that
    followed faulted (D351). Within `hold` the lease is renewed as while a lane works."""
    setup = Setup()
    harness = await setup.harness([text("done")])
    if held:
        async with harness.hold():
            await setup.advance(3 * TTL)  # reading a slow file
        renewals = harness._rt.keeper.renewals if harness._rt.keeper is not None else 0
        assert renewals >= 5
        result = await harness.prompt("go")
        assert isinstance(result, Ok) and result.value.kind == "completed"
        await setup.advance(3 * TTL)  # idle again: nothing renewed
        assert harness._rt.keeper is not None and harness._rt.keeper.renewals == renewals
    else:
        await setup.advance(3 * TTL)
        with pytest.raises((HarnessFault, LeaseLost)):
            await harness.prompt("go")


async def test_no_paid_call_starts_while_an_unconfirmed_lease_has_under_a_third_left() -> None:
    setup = Setup()
    harness = await setup.harness([tool_call("slow", {}), text("done")])
    running = asyncio.ensure_future(harness.prompt("go"))
    await setup.tool_started.wait()
    setup.storage.failing = True
    await setup.advance(TTL * 7 // 10)  # renewals failed since half-life: < 1/3 left
    failures = [e for e in setup.events if isinstance(e, LeaseRenewalFailed)]
    assert failures and "connection refused" in failures[0].error
    setup.release.set()  # the tool returns: its result is written, the next request waits
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(setup.model.requests) == 1 and not running.done()
    setup.storage.failing = False
    await setup.advance(TTL // 10)  # the next retry confirms a renewal
    result = await running
    assert isinstance(result, Ok) and result.value.kind == "completed"
    assert len(setup.model.requests) == 2


async def test_a_lost_lease_is_an_event_and_a_fault_and_nothing_more_starts() -> None:
    setup = Setup()
    harness = await setup.harness([tool_call("slow", {}), text("never asked")])
    running = asyncio.ensure_future(harness.prompt("go"))
    await setup.tool_started.wait()
    assert await setup.repo.release_lease(setup.lease)  # an operator (or a takeover) took it
    await setup.advance(TTL // 2 + 1_000)  # the renewal at half-life finds it gone
    lost = [e for e in setup.events if isinstance(e, LeaseLostEvent)]
    assert len(lost) == 1
    with pytest.raises(HarnessFault) as caught:
        await running
    assert isinstance(caught.value.__cause__, LeaseLost)
    assert len(setup.model.requests) == 1  # the next step never went out
    with pytest.raises(HarnessFault):
        await harness.lanes()
