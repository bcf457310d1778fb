"""The one effects boundary of a procedure: its writes, model calls, tools, hooks and sleeps.

Every durable write, model call, tool run, hook and sleep of a procedure goes through an
`Effects` object, and nothing else.

The method list is the complete catalog of crash sites: stopping before or after any call is
one of the durable states recovery handles. The lane runtime (`LaneRuntime`) is the
production `Effects`; manual drive wraps it in a gate that parks before each call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from harness_core.hooks import HookName
from harness_core.messages import AssistantMessage, DeferredHandle
from harness_core.models import ModelRequest
from harness_core.session.entries import Entry
from harness_core.session.records import OperationError, OperationOutcome, QueueName, Record
from harness_core.session.types import Fact, StoredEntry, StoredRecord
from harness_core.tools import PreparedToolCall, ToolOutput

__all__ = ["Effects", "FinishResult", "LaterEvent"]

FinishResult = Literal["finished", "continue"]


@dataclass(frozen=True, slots=True)
class LaterEvent:
    """A hook's event, made only if a handler will see it (`Effects.run_hook`).

    For the hooks whose answer without a handler is None (``before_run_end``): an event that
    carries the whole context window costs a copy of it, which no run needs unless someone
    listens.
    """

    make: Callable[[], Awaitable[Any]]


class Effects(Protocol):
    """What a procedure may do. Reads (entries, context) are not effects and never pass here."""

    async def append_entry(self, entry: Entry) -> StoredEntry:
        """Append an entry to the lane (unconditional single write)."""
        ...

    async def append_entry_if_missing(self, entry: Entry) -> StoredEntry:
        """Append unless its provisioned id exists with equal content (recovery re-entry)."""
        ...

    async def append_record(self, record: Record) -> StoredRecord:
        """Append a record to the lane's op log (unconditional single write)."""
        ...

    async def move_lane(self, to: str | None) -> None:
        """Move the lane's leaf (the navigation commit point)."""
        ...

    async def set_fact(self, fact: Fact) -> None:
        """Set a global fact."""
        ...

    async def try_finish_run(
        self,
        run_id: str,
        outcome: Literal["completed", "failed"],
        error: OperationError | None = None,
    ) -> FinishResult:
        """Finish the run unless input, a pending write or an abort won the ordering."""
        ...

    async def finish_operation(
        self, run_id: str, outcome: OperationOutcome, error: OperationError | None = None
    ) -> FinishResult:
        """Close an operation unless an abort (or, for aborts, a pending write) preempts it."""
        ...

    async def commit_run_end_follow_up(
        self, run_id: str, item: Entry
    ) -> Literal["committed", "dropped"]:
        """Queue a `before_run_end` follow-up while the run is active and not aborting."""
        ...

    async def consume_queue_item(
        self, run_id: str, queue: QueueName, entry_id: str
    ) -> Literal["consumed", "skipped"]:
        """Append a queued item's entry if it is still pending (and the run not aborting)."""
        ...

    async def apply_pending_write(
        self, run_id: str, entry_id: str
    ) -> Literal["applied", "skipped"]:
        """Apply an accepted deferred write (also while aborting)."""
        ...

    async def stream_assistant(self, request: ModelRequest) -> AssistantMessage:
        """One provider request; an abort makes it settle as ``stop_reason="aborted"``."""
        ...

    async def execute_tool(self, prepared: PreparedToolCall) -> ToolOutput:
        """Run one tool call (phase 2); never raises, failures are error outputs."""
        ...

    async def fetch_deferred(self, handle: DeferredHandle) -> AssistantMessage:
        """Check a deferred request once; a failure is an error message, never a raise."""
        ...

    async def cancel_deferred(self, handle: DeferredHandle) -> None:
        """Best-effort cancellation of a deferred request."""
        ...

    async def run_hook(self, name: HookName, event: Any) -> Any:
        """Run every handler of a hook and return the aggregated result.

        `event` may be a `LaterEvent`: it is made after the commit before the handlers, and
        with no handler the result is None without it.
        """
        ...

    async def sleep(self, seconds: float) -> Literal["elapsed", "aborted"]:
        """Wait (retry backoff); an abort ends the wait early."""
        ...
