"""The gate on its own: nested parks, and what a driver sees while actions come and go."""

from __future__ import annotations

import asyncio

from harness_core._runtime.gate import ActionInfo, Gate


async def test_a_nested_effect_parks_as_its_own_action() -> None:
    """Re-entrancy: an effect that calls another one exposes the inner park before it settles."""
    busy = True
    gate = Gate(lambda: busy)
    order: list[str] = []

    async def inner() -> str:
        order.append("inner ran")
        return "inner"

    async def outer() -> str:
        order.append("outer started")
        got = await gate.through(ActionInfo("run_hook"), inner)
        order.append("outer done")
        return f"outer({got})"

    task = asyncio.ensure_future(gate.through(ActionInfo("stream_assistant"), outer))
    assert (await gate.peek()) == ActionInfo("stream_assistant")
    nested = await gate.execute()  # returns when the outer call parks the inner one
    assert nested == ActionInfo("run_hook") and order == ["outer started"]
    busy_after = asyncio.ensure_future(gate.execute())
    await asyncio.sleep(0)
    assert await task == "outer(inner)"
    busy = False
    gate.wake()
    assert await busy_after is None
    assert order == ["outer started", "inner ran", "outer done"]
