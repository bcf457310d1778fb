"""Drives a manual-drive harness: releases parked actions one at a time while work runs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from harness_core._runtime.gate import ActionInfo
from harness_core.harness import AgentHarness

_T = TypeVar("_T")

AfterAction = Callable[[str, ActionInfo], Awaitable[None]]
"""Called after each released action settles: (lane, the action that was released)."""

MAX_ACTIONS = 20_000


async def drive(
    harness: AgentHarness, work: Awaitable[_T], after: AfterAction | None = None
) -> tuple[_T, list[tuple[str, ActionInfo]]]:
    """Run `work` (which prompts, resumes, aborts...) releasing every action it parks.

    Lanes are visited in name order and one action is released per visit, so the interleaving
    is deterministic. Returns the work's result and the released actions in order.
    """
    task: asyncio.Future[_T] = asyncio.ensure_future(work)
    released: list[tuple[str, ActionInfo]] = []
    while True:
        moved = False
        for info in await harness.lanes():
            lane = await harness.lane(info.name)
            assert lane is not None
            action = await lane.peek_action()
            if action is None:
                continue
            await lane.execute_action()
            released.append((info.name, action))
            moved = True
            if after is not None:
                await after(info.name, action)
            assert len(released) < MAX_ACTIONS, "the scenario does not settle"
        if not moved:
            if task.done():
                return task.result(), released
            await asyncio.sleep(0)  # let the work reach its next call


async def started(
    harness: AgentHarness, work: Awaitable[_T], event: str = "run_start"
) -> asyncio.Future[_T]:
    """Start `work` and return once `event` fired (a prompt's run was accepted) or it ended."""
    accepted = asyncio.Event()
    off = harness.events.on_any(event, lambda _: accepted.set())
    task = asyncio.ensure_future(work)
    try:
        waiting = asyncio.ensure_future(accepted.wait())
        await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
    finally:
        off()
    return task


def kinds(actions: list[tuple[str, ActionInfo]]) -> list[str]:
    """Compact labels of released actions, e.g. ``append_record:tool_started``."""
    labels = []
    for _, action in actions:
        detail: Any = action.detail
        extra = (
            detail.get("record_type")
            or detail.get("entry_type")
            or detail.get("name")
            or detail.get("outcome")
            or detail.get("tool_name")
        )
        labels.append(f"{action.kind}:{extra}" if extra else action.kind)
    return labels
