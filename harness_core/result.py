"""Expected rejections of harness operations, returned as values: `Ok(value)` or `Err(rejection)`.

A rejection means the call did not create or accept the requested work. While the harness is
open and writable every accepted operation resolves `Ok`, including aborted, failed and
suspended ones; defects and a dead harness raise (`HarnessFault`, `HarnessClosed`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Generic, Literal, TypeAlias, TypeVar

from harness_core.messages import AssistantMessage, DeferredHandle
from harness_core.portable import HarnessState
from harness_core.session.entries import Entry
from harness_core.session.records import OperationError, PendingApproval

__all__ = [
    "AbortAccepted",
    "AlreadyAccepted",
    "Closed",
    "DecisionsMismatch",
    "DecisionsRequired",
    "Err",
    "InvalidLane",
    "InvalidMessage",
    "InvalidUsage",
    "LaneBusy",
    "LaneExists",
    "LaneStuck",
    "MissingIdentities",
    "NoActiveOperation",
    "NoActiveRun",
    "NothingToCompact",
    "NothingToResume",
    "Ok",
    "Outcome",
    "Rejection",
    "Result",
    "UnknownQueueItem",
    "UnknownTarget",
    "WaitSuperseded",
]

_T = TypeVar("_T", covariant=True)
_E = TypeVar("_E", covariant=True)


@dataclass(frozen=True, slots=True)
class Ok(Generic[_T]):
    """The call succeeded with `value`."""

    value: _T

    @property
    def ok(self) -> Literal[True]:
        """Always True."""
        return True


@dataclass(frozen=True, slots=True)
class Err(Generic[_E]):
    """The call was rejected; `error` says why and nothing was created or accepted."""

    error: _E

    @property
    def ok(self) -> Literal[False]:
        """Always False."""
        return False


Result: TypeAlias = Ok[_T] | Err[_E]


@dataclass(frozen=True, kw_only=True, slots=True)
class Rejection:
    """Base of the tagged rejections; `tag` names the class in the transport form."""

    tag: ClassVar[str] = "Rejection"
    message: str

    def to_json(self) -> dict[str, Any]:
        """The transport form: ``{"_tag": ..., "message": ..., **payload}``."""
        return {"_tag": self.tag, **asdict(self)}


@dataclass(frozen=True, kw_only=True, slots=True)
class LaneBusy(Rejection):
    """The lane already runs an operation."""

    tag: ClassVar[str] = "LaneBusy"
    lane: str
    operation_id: str
    operation_kind: Literal["run", "compaction", "navigation"]


@dataclass(frozen=True, kw_only=True, slots=True)
class MissingIdentities(Rejection):
    """Resuming needs tools or models this harness does not have."""

    tag: ClassVar[str] = "MissingIdentities"
    lane: str
    tools: tuple[str, ...]
    models: tuple[str, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class NoActiveRun(Rejection):
    """Queued input needs an active run that is not aborting."""

    tag: ClassVar[str] = "NoActiveRun"
    lane: str


@dataclass(frozen=True, kw_only=True, slots=True)
class NoActiveOperation(Rejection):
    """There is nothing to abort."""

    tag: ClassVar[str] = "NoActiveOperation"
    lane: str


@dataclass(frozen=True, kw_only=True, slots=True)
class NothingToResume(Rejection):
    """The lane has no open operation."""

    tag: ClassVar[str] = "NothingToResume"
    lane: str


@dataclass(frozen=True, kw_only=True, slots=True)
class InvalidMessage(Rejection):
    """The input cannot become a user message (or is otherwise malformed)."""

    tag: ClassVar[str] = "InvalidMessage"
    lane: str
    reason: str


@dataclass(frozen=True, kw_only=True, slots=True)
class InvalidUsage(Rejection):
    """A usage adjustment that is not valid durable data (a NaN or infinite number)."""

    tag: ClassVar[str] = "InvalidUsage"
    lane: str


@dataclass(frozen=True, kw_only=True, slots=True)
class UnknownTarget(Rejection):
    """The entry named as a target does not exist."""

    tag: ClassVar[str] = "UnknownTarget"
    target_id: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class UnknownQueueItem(Rejection):
    """No queued item has that id."""

    tag: ClassVar[str] = "UnknownQueueItem"
    lane: str
    entry_id: str


@dataclass(frozen=True, kw_only=True, slots=True)
class LaneExists(Rejection):
    """A lane with that name exists (lanes are never renamed or deleted)."""

    tag: ClassVar[str] = "LaneExists"
    lane: str


@dataclass(frozen=True, kw_only=True, slots=True)
class InvalidLane(Rejection):
    """The lane name breaks the naming rules."""

    tag: ClassVar[str] = "InvalidLane"
    lane: str
    reason: str


@dataclass(frozen=True, kw_only=True, slots=True)
class NothingToCompact(Rejection):
    """The lane's context has nothing a compaction could summarize."""

    tag: ClassVar[str] = "NothingToCompact"
    lane: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Closed(Rejection):
    """The harness was closed."""

    tag: ClassVar[str] = "Closed"
    message: str = "the harness is closed"


@dataclass(frozen=True, kw_only=True, slots=True)
class DecisionsRequired(Rejection):
    """The operation waits for approval decisions: resume it with `decisions` for these calls."""

    tag: ClassVar[str] = "DecisionsRequired"
    lane: str
    operation_id: str
    pending: tuple[Any, ...]
    """The `PendingApproval`s (call id, tool, arguments, digest)."""
    wait_id: str
    """The wait the decisions must name."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DecisionsMismatch(Rejection):
    """A decision batch that does not decide exactly the pending calls, or came too late."""

    tag: ClassVar[str] = "DecisionsMismatch"
    lane: str
    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    reason: Literal[
        "coverage",
        "duplicate",
        "invalid_arguments",
        "already_decided",
        "not_waiting",
        "unbound",
        "stale_arguments",
        "key_reused",
    ] = "coverage"
    """``coverage``/``duplicate``: not exactly the pending calls; ``invalid_arguments``: override
    arguments the tool refuses; ``already_decided``: another batch decided this wait;
    ``not_waiting``: the operation waits for no decision; ``unbound``: the batch names no wait;
    ``stale_arguments``: a decision's digest is not the pending call's (the decider saw other
    arguments); ``key_reused``: the idempotency key was used for a different batch."""


@dataclass(frozen=True, kw_only=True, slots=True)
class WaitSuperseded(Rejection):
    """The decisions answer an approval wait that is not the lane's open one any more.

    The lane moved on (the run was decided, resumed, finished or aborted, or waits again for a
    later batch): an answer to an old wait never decides a newer one. Nothing was written.
    """

    tag: ClassVar[str] = "WaitSuperseded"
    lane: str
    wait_id: str
    """The wait the decisions named."""
    current_wait_id: str | None = None
    """The lane's open wait, if it has one."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LaneStuck(Rejection):
    """The operation was interrupted `attempts` times: it is parked until an operator acts.

    Fix the cause, then `resume(unstick=True)` (a fresh attempt budget) or `abort()`.
    """

    tag: ClassVar[str] = "LaneStuck"
    lane: str
    operation_id: str
    attempts: int
    max_attempts: int
    last_activity: str
    """What the operation was doing when it was last interrupted (a tool, a model request)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AlreadyAccepted(Rejection):
    """This input (its caller-chosen entry id) was accepted before, as queued input.

    `prompt()` of an input that an earlier `prompt()` accepted returns that run's outcome
    instead; this says the earlier acceptance was a queue item (`queue`, in run `run_id`).
    """

    tag: ClassVar[str] = "AlreadyAccepted"
    lane: str
    entry_id: str
    queue: str
    run_id: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """How an accepted operation ended (or that it suspended).

    `kind` is ``completed``, ``aborted``, ``failed``, ``declined`` (structural operations a hook
    vetoed) or ``suspended`` (the operation stays open: a deferred request). `final_entry_id` and
    `final_message` name a run's newest assistant message; `entry_id` a structural operation's
    result entry (compaction or branch summary).
    """

    operation: Literal["run", "compaction", "navigation"]
    run_id: str
    kind: Literal["completed", "aborted", "failed", "declined", "suspended"]
    leaf_id: str | None
    final_entry_id: str | None = None
    final_message: AssistantMessage | None = None
    error: OperationError | None = None
    deferred: DeferredHandle | None = None
    entry_id: str | None = None
    pending_approvals: tuple[PendingApproval, ...] = ()
    """Suspended for approval: the calls waiting for a decision."""
    wait_id: str | None = None
    """Suspended for approval: the wait a decision batch must name (`resume(wait_id=...)`)."""
    state: HarnessState | None = None
    """A run that failed, as it ended: the state it reached (the lane's context messages, the
    results of the tools that ran included, and its capability data) for a host to inspect,
    or to continue elsewhere (`state.fork(...)`, `AgentHarness.import_state`). None for every
    other kind, and for an outcome read back later (a repeated input's `prompt`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AbortAccepted:
    """An accepted abort: the run it stops and the queued input it cleared."""

    run_id: str
    steer: tuple[Entry, ...] = ()
    follow_up: tuple[Entry, ...] = ()
