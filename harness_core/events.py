"""Events: passive, ordered notifications of what happened; they never change execution.

Events announcing durable facts fire after the commit (what an event reports is already
queryable). Payloads are JSON-safe and carry final, post-hook values. A listener that raises is
isolated and reported as `handler_error`. Events are not persisted or replayed: a reconnecting
client takes a new snapshot with `watch()`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, overload

from pydantic import Field

from harness_core.frozen import Frozen, FrozenJson, FrozenJsonObject
from harness_core.messages import (
    AgentMessage,
    AssistantMessage,
    DeferredHandle,
    ModelErrorKind,
    TokenUsage,
    ToolResultMessage,
)
from harness_core.session.entries import Entry
from harness_core.session.records import (
    ApprovalDecided,
    CompactionReason,
    OperationError,
    PendingApproval,
    Usage,
)

__all__ = [
    "ApprovalDecidedEvent",
    "CompactionEnd",
    "CompactionStart",
    "ConfigUpdate",
    "EntryAdded",
    "Event",
    "EventBus",
    "FactUpdate",
    "Fault",
    "HandlerError",
    "LaneCreated",
    "LeaseLostEvent",
    "LeaseRenewalFailed",
    "MessageEnd",
    "MessageStart",
    "MessageUpdate",
    "NavigationEnd",
    "NavigationStart",
    "QueuedItem",
    "QueueUpdate",
    "RetryEnd",
    "RetryScheduled",
    "RetryStart",
    "RunAbort",
    "RunEnd",
    "RunResume",
    "RunStart",
    "RunSuspend",
    "ToolEnd",
    "ToolStart",
    "ToolUpdate",
    "TurnEnd",
    "TurnStart",
    "UsageEvent",
    "WritePending",
]


class _Event(Frozen):
    lane: str | None = None


class RunStart(_Event):
    """A run was accepted."""

    type: Literal["run_start"] = "run_start"
    run_id: str


class RunResume(_Event):
    """`resume()` continues an open operation."""

    type: Literal["run_resume"] = "run_resume"
    run_id: str
    recovery: bool = True


class RunSuspend(_Event):
    """The lane parked (a deferred request or an approval)."""

    type: Literal["run_suspend"] = "run_suspend"
    run_id: str
    deferred: DeferredHandle | None = None
    reason: Literal["deferred", "approval"] = "deferred"
    approvals: tuple[PendingApproval, ...] = ()
    """The calls waiting for a decision (reason ``approval``)."""
    wait_id: str | None = None
    """The wait a decision batch must name (reason ``approval``)."""


class ApprovalDecidedEvent(_Event):
    """A decision batch was recorded; the decided calls run (or are denied) next."""

    type: Literal["approval_decided"] = "approval_decided"
    run_id: str
    record: ApprovalDecided


class RunAbort(_Event):
    """An abort was accepted; the cleared queue payloads are returned."""

    type: Literal["run_abort"] = "run_abort"
    run_id: str
    steer: tuple[AgentMessage, ...] = ()
    follow_up: tuple[AgentMessage, ...] = ()


class RunEnd(_Event):
    """A run finished."""

    type: Literal["run_end"] = "run_end"
    run_id: str
    outcome: Literal["completed", "aborted", "failed"]
    leaf_id: str | None
    final_entry_id: str | None = None
    error: OperationError | None = None


class Fault(_Event):
    """The harness faulted (harness-wide, `lane` None), or one lane cannot be restored."""

    type: Literal["fault"] = "fault"
    message: str


class LeaseRenewalFailed(_Event):
    """A renewal of the session's writer lease failed (the store did not answer); retried."""

    type: Literal["lease_renewal_failed"] = "lease_renewal_failed"
    error: str
    expires_at_ms: int
    """When the lease lapses unless a retry succeeds (this process's clock)."""


class LeaseLostEvent(_Event):
    """The session's writer lease is gone (expired or taken over): the harness stops and faults.

    Another process may own the session now; reopen it (acquire the lease, `create()`) to go on.
    """

    type: Literal["lease_lost"] = "lease_lost"
    message: str


class HandlerError(_Event):
    """Code outside the harness misbehaved and was isolated.

    A hook handler or event listener raised (``hook``, ``event``), or a provider (``model``)
    or a tool (``tool``) returned a value that is not valid durable data, such as a NaN cost.
    """

    type: Literal["handler_error"] = "handler_error"
    kind: Literal["hook", "event", "model", "tool"]
    name: str
    error: str


class TurnStart(_Event):
    """An assistant turn began."""

    type: Literal["turn_start"] = "turn_start"
    run_id: str
    turn_id: str


class TurnEnd(_Event):
    """An assistant turn and its tool batch ended."""

    type: Literal["turn_end"] = "turn_end"
    run_id: str
    turn_id: str
    message: AssistantMessage
    tool_results: tuple[ToolResultMessage, ...] = ()


class RetryScheduled(_Event):
    """A failed attempt will be retried after a delay."""

    type: Literal["retry_scheduled"] = "retry_scheduled"
    run_id: str
    step: str
    attempt: int
    max_attempts: int
    delay_ms: int
    error_message: str
    error_kind: ModelErrorKind | None = None
    """What failed (``invalid_request``: the request goes again with the images withheld)."""


class RetryStart(_Event):
    """A retry attempt starts."""

    type: Literal["retry_start"] = "retry_start"
    run_id: str
    step: str
    attempt: int


class RetryEnd(_Event):
    """Retrying resolved, either way."""

    type: Literal["retry_end"] = "retry_end"
    run_id: str
    step: str
    attempt: int
    success: bool
    final_error: str | None = None


class MessageStart(_Event):
    """A message is about to enter the tree."""

    type: Literal["message_start"] = "message_start"
    run_id: str | None = None
    message: AgentMessage


class MessageUpdate(_Event):
    """A streaming assistant message progressed."""

    type: Literal["message_update"] = "message_update"
    run_id: str
    message: AssistantMessage


class MessageEnd(_Event):
    """A message was committed."""

    type: Literal["message_end"] = "message_end"
    run_id: str | None = None
    message: AgentMessage
    entry_id: str


class ToolStart(_Event):
    """A tool call started (effective arguments)."""

    type: Literal["tool_start"] = "tool_start"
    run_id: str
    turn_id: str | None = None
    tool_call_id: str
    tool_name: str
    args: FrozenJsonObject


class ToolUpdate(_Event):
    """A running tool reported progress."""

    type: Literal["tool_update"] = "tool_update"
    run_id: str
    tool_call_id: str
    tool_name: str
    partial: FrozenJson = None


class ToolEnd(_Event):
    """A tool call's result was committed."""

    type: Literal["tool_end"] = "tool_end"
    run_id: str
    turn_id: str | None = None
    tool_call_id: str
    tool_name: str
    result: ToolResultMessage
    terminate: bool = False


class EntryAdded(_Event):
    """A non-message entry was committed."""

    type: Literal["entry_added"] = "entry_added"
    entry: Entry


class WritePending(_Event):
    """A write was accepted and will apply at the next checkpoint."""

    type: Literal["write_pending"] = "write_pending"
    run_id: str
    entry_id: str
    entry: Entry


class QueuedItem(Frozen):
    """One queued input."""

    entry_id: str
    message: AgentMessage


class QueueUpdate(_Event):
    """The lane's queues changed."""

    type: Literal["queue_update"] = "queue_update"
    steer: tuple[QueuedItem, ...] = ()
    follow_up: tuple[QueuedItem, ...] = ()
    next_run: tuple[QueuedItem, ...] = ()


class FactUpdate(_Event):
    """A global fact was set."""

    type: Literal["fact_update"] = "fact_update"
    fact: Literal["name", "label"]
    name: str | None = None
    target_id: str | None = None
    label: str | None = None


class ConfigUpdate(_Event):
    """A lane's configuration changed; re-read it through the getters."""

    type: Literal["config_update"] = "config_update"
    property: str
    value: FrozenJson = None


class CompactionStart(_Event):
    """A compaction began."""

    type: Literal["compaction_start"] = "compaction_start"
    run_id: str
    reason: CompactionReason
    recovery: bool = False


class CompactionEnd(_Event):
    """A compaction ended."""

    type: Literal["compaction_end"] = "compaction_end"
    run_id: str
    reason: CompactionReason
    outcome: Literal["completed", "declined", "aborted", "failed"]
    entry_id: str | None = None
    from_hook: bool = False
    error: OperationError | None = None


class NavigationStart(_Event):
    """A navigation began."""

    type: Literal["navigation_start"] = "navigation_start"
    run_id: str
    target_id: str | None
    recovery: bool = False


class NavigationEnd(_Event):
    """A navigation ended."""

    type: Literal["navigation_end"] = "navigation_end"
    run_id: str
    outcome: Literal["completed", "declined", "aborted", "failed"]
    old_leaf_id: str | None
    new_leaf_id: str | None
    summary_entry_id: str | None = None
    error: OperationError | None = None


class LaneCreated(_Event):
    """A lane was created."""

    type: Literal["lane_created"] = "lane_created"
    at: str | None


class UsageEvent(_Event):
    """A usage record was committed; `totals` is the session's ledger sum."""

    type: Literal["usage"] = "usage"
    record: Usage
    totals: TokenUsage


Event = Annotated[
    RunStart
    | RunResume
    | RunSuspend
    | RunAbort
    | RunEnd
    | Fault
    | HandlerError
    | LeaseRenewalFailed
    | LeaseLostEvent
    | TurnStart
    | TurnEnd
    | RetryScheduled
    | RetryStart
    | RetryEnd
    | MessageStart
    | MessageUpdate
    | MessageEnd
    | ToolStart
    | ToolUpdate
    | ToolEnd
    | EntryAdded
    | WritePending
    | QueueUpdate
    | FactUpdate
    | ConfigUpdate
    | CompactionStart
    | CompactionEnd
    | NavigationStart
    | NavigationEnd
    | LaneCreated
    | UsageEvent
    | ApprovalDecidedEvent,
    Field(discriminator="type"),
]
"""Every event the harness emits."""

Listener = Callable[[Any], object]
_GLOBAL = ("fault", "usage", "handler_error")


@dataclass(eq=False, slots=True)
class _Watcher:
    lane: str | None
    buffer: list[Any] = field(default_factory=list)
    listener: Listener | None = None


@dataclass(slots=True)
class EventBus:
    """Delivers events in emission order to listeners and watchers, isolating their failures."""

    _listeners: list[tuple[str | None, Listener]] = field(default_factory=list)
    _watchers: list[_Watcher] = field(default_factory=list)
    report: Callable[[str, BaseException], None] | None = None

    @overload
    def on(
        self, event_type: Literal["run_start"], listener: Callable[[RunStart], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["run_resume"], listener: Callable[[RunResume], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["run_suspend"], listener: Callable[[RunSuspend], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["run_abort"], listener: Callable[[RunAbort], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["run_end"], listener: Callable[[RunEnd], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["fault"], listener: Callable[[Fault], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["handler_error"], listener: Callable[[HandlerError], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self,
        event_type: Literal["lease_renewal_failed"],
        listener: Callable[[LeaseRenewalFailed], object],
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["lease_lost"], listener: Callable[[LeaseLostEvent], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["turn_start"], listener: Callable[[TurnStart], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["turn_end"], listener: Callable[[TurnEnd], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["retry_scheduled"], listener: Callable[[RetryScheduled], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["retry_start"], listener: Callable[[RetryStart], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["retry_end"], listener: Callable[[RetryEnd], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["message_start"], listener: Callable[[MessageStart], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["message_update"], listener: Callable[[MessageUpdate], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["message_end"], listener: Callable[[MessageEnd], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["tool_start"], listener: Callable[[ToolStart], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["tool_update"], listener: Callable[[ToolUpdate], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["tool_end"], listener: Callable[[ToolEnd], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["entry_added"], listener: Callable[[EntryAdded], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["write_pending"], listener: Callable[[WritePending], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["queue_update"], listener: Callable[[QueueUpdate], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["fact_update"], listener: Callable[[FactUpdate], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["config_update"], listener: Callable[[ConfigUpdate], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["compaction_start"], listener: Callable[[CompactionStart], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["compaction_end"], listener: Callable[[CompactionEnd], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["navigation_start"], listener: Callable[[NavigationStart], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["navigation_end"], listener: Callable[[NavigationEnd], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["lane_created"], listener: Callable[[LaneCreated], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self, event_type: Literal["usage"], listener: Callable[[UsageEvent], object]
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self,
        event_type: Literal["approval_decided"],
        listener: Callable[[ApprovalDecidedEvent], object],
    ) -> Callable[[], None]: ...
    @overload
    def on(self, event_type: None, listener: Callable[[Event], object]) -> Callable[[], None]: ...
    def on(self, event_type: str | None, listener: Callable[[Any], object]) -> Callable[[], None]:
        """Listen to one event type (or every event with None), live only; returns `off`.

        Typed per event type: a listener for ``"tool_end"`` takes a `ToolEnd`. A type name
        computed at run time goes through `on_any`.
        """
        return self.on_any(event_type, listener)

    def on_any(
        self, event_type: str | None, listener: Callable[[Any], object]
    ) -> Callable[[], None]:
        """`on` for a type name computed at run time (no per-type check); returns `off`."""
        item = (event_type, listener)
        self._listeners.append(item)
        return lambda: self._listeners.remove(item) if item in self._listeners else None

    def watch(self, lane: str | None) -> _Watcher:
        """Start buffering a lane's events (None: every event) from this instant."""
        watcher = _Watcher(lane=lane)
        self._watchers.append(watcher)
        return watcher

    def start(self, watcher: _Watcher, listener: Listener) -> None:
        """Flush the watcher's buffer in order into `listener`, then deliver live."""
        while watcher.buffer:
            self._deliver(listener, watcher.buffer.pop(0), "watch")
        watcher.listener = listener

    def unwatch(self, watcher: _Watcher) -> None:
        """Drop a watcher and its buffer."""
        if watcher in self._watchers:
            self._watchers.remove(watcher)

    def wants(self, event_type: str) -> bool:
        """Whether an event of `event_type` emitted now would reach anyone.

        A hot path asks first and skips building an event nobody receives (a prompt emits
        about twenty, each a validated model).
        """
        if self._watchers:
            return True
        return any(listened is None or listened == event_type for listened, _ in self._listeners)

    def emit(self, event: Any) -> None:
        """Deliver an event to every matching listener and watcher, in order."""
        for event_type, listener in list(self._listeners):
            if event_type is None or event_type == event.type:
                self._deliver(listener, event, event.type)
        for watcher in list(self._watchers):
            if (
                watcher.lane is not None
                and event.lane != watcher.lane
                and event.type not in _GLOBAL
            ):
                continue
            if watcher.listener is None:
                watcher.buffer.append(event)
            else:
                self._deliver(watcher.listener, event, event.type)

    def _deliver(self, listener: Listener, event: Any, name: str) -> None:
        try:
            listener(event)
        except Exception as exc:
            if event.type == "handler_error":
                return  # a listener failing on handler_error goes nowhere (no recursion)
            if self.report is not None:
                self.report(name, exc)
