"""Waiting for tasks to end, with a deadline and a way out (a stop's second signal)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

__all__ = ["until_done"]


async def until_done(
    tasks: Iterable[asyncio.Future[Any]], seconds: float, cut: asyncio.Event | None = None
) -> bool:
    """Wait until every task ended, `seconds` passed or `cut` is set; whether all ended.

    Never cancels a task, and retrieves the outcome of every task that ended (an exception
    nobody looked at would be logged by asyncio when the task is collected).
    """
    every = list(tasks)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(seconds, 0.0)
    pending = {task for task in every if not task.done()}
    cutting = asyncio.ensure_future(cut.wait()) if cut is not None else None
    try:
        while pending and not (cut is not None and cut.is_set()):
            left = deadline - loop.time()
            if left <= 0:
                break
            watched = pending | ({cutting} if cutting is not None else set())
            ended, _ = await asyncio.wait(
                watched, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
            pending -= ended
    finally:
        if cutting is not None:
            cutting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await cutting
    for task in every:
        if task.done() and not task.cancelled():
            task.exception()
    return not pending
