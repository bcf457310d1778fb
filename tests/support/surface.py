"""Helpers for the tests of the harness's public surface (tests/harness_core/test_surface_*.py).

Interleavings are made deterministic with tool bodies and `asyncio.Event`s: a tool that signals
when it starts and then waits is a run "in flight" (`Waiter`, `in_flight`); a harness dropped
while such a tool waits is a process that crashed mid-tool (`reopen` opens the session again as a
restarted process would, with its own id sequence so provisioned ids never collide with the
crashed writer's; `bury` closes the crashed harness afterwards).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import pytest
from pydantic import BaseModel

from harness_core.errors import HarnessClosed
from harness_core.harness import AgentHarness
from harness_core.ids import SequentialIds
from harness_core.messages import AgentMessage, message_text
from harness_core.models import ModelRef
from harness_core.result import Err, Ok
from harness_core.session.entries import Entry, MessageEntry
from harness_core.session.types import BranchQuery, RecordQuery, StoredEntry
from harness_core.tools import Tool, ToolContext
from tests.support.harness_kit import Kit

_R = TypeVar("_R", bound=BaseModel)

OTHER_MODEL = ModelRef(provider="scripted", model_id="bigger")
"""A second model, for the model setters."""


# -- results ------------------------------------------------------------------------------------


def ok(result: Any) -> Any:
    """The value of an `Ok` (asserting it is one)."""
    assert isinstance(result, Ok), result
    return result.value


def err(result: Any, tag: str) -> Any:
    """The error of an `Err` tagged `tag` (asserting it is one)."""
    assert isinstance(result, Err), result
    assert result.error.tag == tag, result.error
    return result.error


# -- reading messages and the store -------------------------------------------------------------


def said(message: AgentMessage) -> str:
    return message_text(message)


def texts(messages: Any) -> list[str]:
    return [said(m) for m in messages]


async def log_size(kit: Kit) -> int:
    return len(await kit.storage.get_log())


async def records_of(kit: Kit, kind: type[_R], lane: str | None = None) -> list[_R]:
    """The stored records of one type, oldest first."""
    record_type = kind.model_fields["type"].default
    found = await kit.storage.find_records(
        RecordQuery(type=record_type, lane=lane, order="oldest_first")
    )
    return [r.record for r in found if isinstance(r.record, kind)]


def entry_texts(entries: Iterable[Entry]) -> list[str]:
    """The texts of message entries (every entry must be a message)."""
    result = []
    for entry in entries:
        assert isinstance(entry, MessageEntry), entry
        result.append(said(entry.message))
    return result


async def transcript(kit: Kit, lane: str = "main") -> list[StoredEntry]:
    """The lane's whole path, oldest first (read from storage)."""
    pointer = await kit.storage.get_lane(lane)
    assert pointer is not None
    if pointer.leaf_id is None:
        return []
    path = await kit.storage.find_entries_on_branch(BranchQuery(start=pointer.leaf_id))
    return list(reversed(path))


def messages_of(entries: list[StoredEntry]) -> list[AgentMessage]:
    return [e.entry.message for e in entries if isinstance(e.entry, MessageEntry)]


def collect(kit: Kit, event_type: str | None = None) -> list[Any]:
    """Every event of `event_type` (all events with None) the harness emits from now on."""
    seen: list[Any] = []
    kit.harness.events.on_any(event_type, seen.append)
    return seen


# -- tools, hooks and runs in flight ------------------------------------------------------------


async def noop(event: Any) -> None:
    """A hook handler that does nothing."""
    return None


async def noop_ctx(ctx: ToolContext) -> None:
    """A tool action that does nothing."""
    return None


class Holder:
    """Late binding for tool bodies that act on the kit that runs them."""

    kit: Kit

    @property
    def harness(self) -> AgentHarness:
        return self.kit.harness


def acting_tool(action: Callable[[ToolContext], Awaitable[Any]], name: str = "act") -> Tool:
    """A tool whose body runs `action(ctx)` (which may call the lane surface)."""

    async def execute(args: Any, ctx: ToolContext) -> str:
        await action(ctx)
        return "acted"

    return Tool(name=name, description="acts on the lane while it runs", execute=execute)


class Waiter:
    """A tool that reports when it starts, then waits for `release` (forever unless set)."""

    def __init__(self, name: str = "wait") -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.calls = 0
        self.tool = Tool(name=name, description="waits", execute=self._execute)

    async def _execute(self, args: Any, ctx: ToolContext) -> str:
        self.calls += 1
        self.started.set()
        await self.release.wait()
        return "released"


async def in_flight(kit: Kit, waiter: Waiter, prompt: str = "go") -> asyncio.Task[Any]:
    """Start a prompt and return once its tool is running (the run is in flight)."""
    task = asyncio.create_task(kit.harness.prompt(prompt))
    async with asyncio.timeout(10):
        await waiter.started.wait()
    return task


async def bury(kit: Kit, task: asyncio.Task[Any]) -> None:
    """Close a crashed harness that is still running in this process; its caller sees it."""
    await kit.harness.close()
    with pytest.raises(HarnessClosed):
        await task


async def reopen(kit: Kit, prefix: str, **changes: Any) -> Kit:
    """The session reopened by a restarted process whose ids start with `prefix`."""
    return await kit.reopen(ids=SequentialIds(prefix), **changes)
