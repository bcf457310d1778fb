"""The event loop `gateway serve` runs on: uvloop where it is installed, else asyncio's (D276)."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable
from typing import Literal

from gateway.errors import GatewayError

__all__ = ["EventLoopChoice", "loop_factory", "loop_name"]

EventLoopChoice = Literal["auto", "uvloop", "asyncio"]


def _uvloop_installed() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def loop_name(choice: EventLoopChoice) -> Literal["uvloop", "asyncio"]:
    """The loop `choice` runs on here (`auto`: uvloop when it is installed).

    Raises GatewayError for `uvloop` where it is not installed (the process should not start
    on a loop its operator did not ask for).
    """
    if choice == "asyncio":
        return "asyncio"
    if _uvloop_installed():
        return "uvloop"
    if choice == "uvloop":
        raise GatewayError(
            "GATEWAY_EVENT_LOOP=uvloop, but uvloop is not installed here "
            "(pip install uvloop; or GATEWAY_EVENT_LOOP=auto runs on asyncio's own loop)"
        )
    return "asyncio"


def loop_factory(choice: EventLoopChoice) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What `asyncio.Runner` makes its loop with for `choice` (None: asyncio's default)."""
    if loop_name(choice) == "asyncio":
        return None
    import uvloop

    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory
