"""Manual drive: a gate in front of `Effects` that parks every effect until a driver releases it.

The procedures are the production ones; only their `Effects` object changes. Each call parks
as an action with a JSON-safe description (`ActionInfo`); `peek()` shows the next one without a
side effect, `execute()` releases exactly that one and waits until it settles, parks a nested
action, or the operation settles. While an action is parked nothing is written and no model or
tool is called, so stopping (closing the harness) before any action leaves exactly the durable
prefix of the released ones: the crash sites of the matrix.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from harness_core._runtime.effects import Effects, FinishResult
from harness_core.errors import HarnessClosed, HarnessError
from harness_core.frozen import FrozenDict, JsonValue, freeze_json
from harness_core.hooks import HookName
from harness_core.messages import AssistantMessage, DeferredHandle
from harness_core.models import ModelRequest
from harness_core.session.entries import Entry
from harness_core.session.records import OperationError, OperationOutcome, QueueName, Record
from harness_core.session.types import Fact, StoredEntry, StoredRecord
from harness_core.tools import PreparedToolCall, ToolOutput

__all__ = ["ActionInfo", "ActionKind", "Gate", "GatedEffects"]

_T = TypeVar("_T")

ActionKind = Literal[
    "append_entry",
    "append_entry_if_missing",
    "append_record",
    "move_lane",
    "set_fact",
    "try_finish_run",
    "finish_operation",
    "commit_run_end_follow_up",
    "consume_queue_item",
    "apply_pending_write",
    "stream_assistant",
    "execute_tool",
    "fetch_deferred",
    "cancel_deferred",
    "run_hook",
    "sleep",
]
"""One per `Effects` method, named as the method is (the one name of each effect)."""


@dataclass(frozen=True, slots=True)
class ActionInfo:
    """A parked effect: its kind and what it names (JSON values only)."""

    kind: ActionKind
    detail: FrozenDict = field(default_factory=lambda: FrozenDict({}))

    def to_json(self) -> dict[str, JsonValue]:
        """The description as one plain JSON object (``kind`` plus the details)."""
        return {"kind": self.kind, **{k: v for k, v in self.detail.items()}}

    def __str__(self) -> str:
        details = " ".join(f"{key}={value}" for key, value in self.detail.items())
        return f"{self.kind} {details}".strip()


def _info(kind: ActionKind, **detail: JsonValue) -> ActionInfo:
    frozen = freeze_json(detail)
    assert isinstance(frozen, FrozenDict)
    return ActionInfo(kind, frozen)


@dataclass(eq=False)
class _Parked:
    info: ActionInfo
    release: asyncio.Future[None]
    settled: bool = False


class Gate:
    """One lane's parked actions and the driver's controls over them.

    Args:
        busy: whether the lane has a procedure executing (an operation that can still act).
    """

    def __init__(self, busy: Callable[[], bool]) -> None:
        self._busy = busy
        self._queue: list[_Parked] = []
        self._parks = 0
        self._changed = asyncio.Event()
        self._driving = False
        self._closed = False

    def wake(self) -> None:
        """Something a waiting driver may care about happened (a park, a settle, a slot change)."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def through(self, info: ActionInfo, call: Callable[[], Awaitable[_T]]) -> _T:
        """Park `info` until the driver releases it, then run `call`."""
        if self._closed:
            raise HarnessClosed()
        parked = _Parked(info, asyncio.get_running_loop().create_future())
        self._queue.append(parked)
        self._parks += 1
        self.wake()
        try:
            await parked.release
            return await call()
        finally:
            parked.settled = True
            if parked in self._queue:  # cancelled while parked (close)
                self._queue.remove(parked)
            self.wake()

    async def peek(self) -> ActionInfo | None:
        """The next parked action, waiting for the procedure to reach one; None once settled."""
        while True:
            if self._queue:
                return self._queue[0].info
            if not self._busy():
                return None
            await self._changed.wait()

    async def execute(self) -> ActionInfo | None:
        """Release exactly the action `peek()` shows; return the next one (None: settled)."""
        if self._driving:
            raise HarnessError("two drivers on one lane: execute_action() is already running")
        self._driving = True
        try:
            if await self.peek() is None:
                return None
            parked = self._queue.pop(0)
            parks_before = self._parks
            parked.release.set_result(None)
            while not parked.settled and self._parks == parks_before and self._busy():
                await self._changed.wait()
            return await self.peek()
        finally:
            self._driving = False

    async def run_to_completion(self) -> None:
        """Release actions until the operation settles."""
        while await self.execute() is not None:
            pass

    def close(self) -> None:
        """Reject every parked call with `HarnessClosed`; nothing parked will run."""
        self._closed = True
        for parked in self._queue:
            if not parked.release.done():
                parked.release.set_exception(HarnessClosed())
        self._queue.clear()
        self.wake()


class GatedEffects:
    """`Effects` that park each call at a `Gate` before passing it to the inner effects."""

    def __init__(self, inner: Effects, gate: Gate) -> None:
        self._inner = inner
        self._gate = gate

    async def append_entry(self, entry: Entry) -> StoredEntry:
        """See `Effects.append_entry`."""
        info = _info("append_entry", entry_type=entry.type, entry_id=entry.id)
        return await self._gate.through(info, lambda: self._inner.append_entry(entry))

    async def append_entry_if_missing(self, entry: Entry) -> StoredEntry:
        """See `Effects.append_entry_if_missing`."""
        info = _info("append_entry_if_missing", entry_type=entry.type, entry_id=entry.id)
        return await self._gate.through(info, lambda: self._inner.append_entry_if_missing(entry))

    async def append_record(self, record: Record) -> StoredRecord:
        """See `Effects.append_record`."""
        info = _info("append_record", record_type=record.type)
        return await self._gate.through(info, lambda: self._inner.append_record(record))

    async def move_lane(self, to: str | None) -> None:
        """See `Effects.move_lane`."""
        await self._gate.through(_info("move_lane", to=to), lambda: self._inner.move_lane(to))

    async def set_fact(self, fact: Fact) -> None:
        """See `Effects.set_fact`."""
        info = _info("set_fact", fact=fact.fact)
        await self._gate.through(info, lambda: self._inner.set_fact(fact))

    async def try_finish_run(
        self,
        run_id: str,
        outcome: Literal["completed", "failed"],
        error: OperationError | None = None,
    ) -> FinishResult:
        """See `Effects.try_finish_run`."""
        info = _info("try_finish_run", outcome=outcome)
        return await self._gate.through(
            info, lambda: self._inner.try_finish_run(run_id, outcome, error)
        )

    async def finish_operation(
        self, run_id: str, outcome: OperationOutcome, error: OperationError | None = None
    ) -> FinishResult:
        """See `Effects.finish_operation`."""
        info = _info("finish_operation", outcome=outcome)
        return await self._gate.through(
            info, lambda: self._inner.finish_operation(run_id, outcome, error)
        )

    async def commit_run_end_follow_up(
        self, run_id: str, item: Entry
    ) -> Literal["committed", "dropped"]:
        """See `Effects.commit_run_end_follow_up`."""
        return await self._gate.through(
            _info("commit_run_end_follow_up", entry_id=item.id),
            lambda: self._inner.commit_run_end_follow_up(run_id, item),
        )

    async def consume_queue_item(
        self, run_id: str, queue: QueueName, entry_id: str
    ) -> Literal["consumed", "skipped"]:
        """See `Effects.consume_queue_item`."""
        return await self._gate.through(
            _info("consume_queue_item", queue=queue, entry_id=entry_id),
            lambda: self._inner.consume_queue_item(run_id, queue, entry_id),
        )

    async def apply_pending_write(
        self, run_id: str, entry_id: str
    ) -> Literal["applied", "skipped"]:
        """See `Effects.apply_pending_write`."""
        return await self._gate.through(
            _info("apply_pending_write", entry_id=entry_id),
            lambda: self._inner.apply_pending_write(run_id, entry_id),
        )

    async def stream_assistant(self, request: ModelRequest) -> AssistantMessage:
        """See `Effects.stream_assistant`."""
        info = _info("stream_assistant", step=request.step, attempt=request.attempt)
        return await self._gate.through(info, lambda: self._inner.stream_assistant(request))

    async def execute_tool(self, prepared: PreparedToolCall) -> ToolOutput:
        """See `Effects.execute_tool`."""
        info = _info("execute_tool", tool_call_id=prepared.call.id, tool_name=prepared.call.name)
        return await self._gate.through(info, lambda: self._inner.execute_tool(prepared))

    async def fetch_deferred(self, handle: DeferredHandle) -> AssistantMessage:
        """See `Effects.fetch_deferred`."""
        info = _info("fetch_deferred", provider=handle.provider, id=handle.id)
        return await self._gate.through(info, lambda: self._inner.fetch_deferred(handle))

    async def cancel_deferred(self, handle: DeferredHandle) -> None:
        """See `Effects.cancel_deferred`."""
        info = _info("cancel_deferred", provider=handle.provider, id=handle.id)
        await self._gate.through(info, lambda: self._inner.cancel_deferred(handle))

    async def run_hook(self, name: HookName, event: Any) -> Any:
        """See `Effects.run_hook`."""
        return await self._gate.through(
            _info("run_hook", name=name), lambda: self._inner.run_hook(name, event)
        )

    async def sleep(self, seconds: float) -> Literal["elapsed", "aborted"]:
        """See `Effects.sleep`."""
        info = _info("sleep", delay_ms=round(seconds * 1000))
        return await self._gate.through(info, lambda: self._inner.sleep(seconds))
