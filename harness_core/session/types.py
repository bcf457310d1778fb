"""Session-level types: facts, stored envelopes, log items, queries, metadata and leases."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal, TypeAlias

from pydantic import Field, StringConstraints

from harness_core.errors import SessionError
from harness_core.frozen import Frozen, FrozenJsonObject
from harness_core.messages import TokenUsage
from harness_core.session.entries import Entry, EntryType, Id
from harness_core.session.records import LaneName, OperationKind, Record, RecordType

__all__ = [
    "BranchQuery",
    "EntryQuery",
    "Fact",
    "FactSet",
    "LabelFact",
    "LaneMove",
    "LanePointer",
    "LaneSlice",
    "LeaseHolder",
    "LogItem",
    "NameFact",
    "Order",
    "RecordQuery",
    "SessionId",
    "SessionMetadata",
    "SessionStats",
    "StoredEntry",
    "StoredRecord",
    "WriterLease",
]

SessionId: TypeAlias = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,199}$")
]
"""A session id: 1-200 characters of ASCII letters, digits and ``. _ : @ + = -``, not starting with
punctuation (it names files and Redis keys)."""

Order = Literal["newest_first", "oldest_first"]

_Seq = Annotated[int, Field(ge=1)]
_Ms = Annotated[int, Field(ge=0)]


class NameFact(Frozen):
    """The session's name."""

    fact: Literal["name"] = "name"
    name: str


class LabelFact(Frozen):
    """A label on an entry; None clears it."""

    fact: Literal["label"] = "label"
    target_id: Id
    label: str | None


Fact = Annotated[NameFact | LabelFact, Field(discriminator="fact")]


class StoredEntry(Frozen):
    """A committed entry with what the storage assigned when it was appended."""

    kind: Literal["entry"] = "entry"
    seq: _Seq
    timestamp: _Ms
    lane: LaneName | None
    """The lane whose append wrote it (its leaf then moved to it); None for imported entries."""
    parent_id: Id | None
    """The appending lane's leaf at append time."""
    entry: Entry

    @property
    def id(self) -> str:
        """The entry's id."""
        return self.entry.id

    @property
    def type(self) -> EntryType:
        """The entry's type."""
        return self.entry.type


class StoredRecord(Frozen):
    """A committed lane record with what the storage assigned."""

    kind: Literal["record"] = "record"
    seq: _Seq
    timestamp: _Ms
    record: Record

    @property
    def id(self) -> str:
        """The record's id."""
        return self.record.id

    @property
    def type(self) -> RecordType:
        """The record's type."""
        return self.record.type

    @property
    def lane(self) -> str:
        """The lane the record belongs to."""
        return self.record.lane


class LaneMove(Frozen):
    """A lane was created at, or moved to, `leaf_id` (appends move leaves without a LaneMove)."""

    kind: Literal["lane"] = "lane"
    seq: _Seq
    timestamp: _Ms
    lane: LaneName
    leaf_id: Id | None
    created: bool


class FactSet(Frozen):
    """A global fact was set; the newest by `seq` wins and the history is kept."""

    kind: Literal["fact"] = "fact"
    seq: _Seq
    timestamp: _Ms
    fact: Fact


LogItem = Annotated[StoredEntry | StoredRecord | LaneMove | FactSet, Field(discriminator="kind")]
"""One committed mutation; a session's log is its items in `seq` order (1, 2, 3, ...)."""


class LanePointer(Frozen):
    """A lane and its current leaf."""

    lane: LaneName
    leaf_id: Id | None


class SessionMetadata(Frozen):
    """What identifies a session and what its creator attached to it."""

    id: SessionId
    created_at: _Ms
    parent_session_id: str | None = None
    metadata: FrozenJsonObject = Field(default_factory=dict)
    name: str | None = None
    """The newest name fact when this was read (None if never set)."""


class SessionStats(Frozen):
    """Running counters of a session, maintained at every write (reading them is O(1))."""

    last_seq: int = 0
    entries: int = 0
    messages: int = 0
    records: int = 0
    usage: TokenUsage = TokenUsage()
    """The sum of every usage record of every lane (adjustments included)."""


class WriterLease(Frozen):
    """The right to write one session, proven by a fencing token.

    Every write made through a storage opened with this lease carries `token`; the backend
    refuses it once the lease expired, was released, or another writer acquired a newer token.
    """

    session_id: SessionId
    owner: str
    token: Annotated[int, Field(ge=1)]
    """Monotonic per session: a takeover always gets a larger token."""
    ttl_ms: Annotated[int, Field(ge=1)] | None
    expires_at_ms: _Ms | None
    """When the lease lapses unless renewed (a write past half-life renews it too), on the
    backend's lease clock: the injected `Clock` for memory and SQLite, the Redis server's
    ``TIME`` unless a clock was injected. None for an OS file lock (JSONL), which lasts as long
    as the holding process."""


class LeaseHolder(Frozen):
    """Who holds a session's live writer lease (read without taking it)."""

    owner: str
    expires_at_ms: _Ms | None
    """On the backend's lease clock (see `WriterLease`); None for an OS file lock."""


def _invalid(message: str) -> SessionError:
    return SessionError("invalid_query", message)


def _check_window(limit: int | None, after_seq: int | None, before_seq: int | None) -> None:
    if limit is not None and limit < 1:
        raise _invalid(f"limit must be positive, got {limit}")
    if after_seq is not None and after_seq < 0:
        raise _invalid(f"after_seq must not be negative, got {after_seq}")
    if before_seq is not None and before_seq < 1:
        raise _invalid(f"before_seq must be positive, got {before_seq}")


@dataclass(frozen=True, slots=True)
class LaneSlice:
    """What restore reads of one lane: its leaf and a bounded, seq-ordered list of items.

    `items` holds the next-run queue records since the lane's newest run start (older ones were
    captured by that run), then the open operation's records and the entries it appended.
    """

    lane: str
    leaf_id: str | None
    items: tuple[StoredEntry | StoredRecord, ...]
    last_finished: StoredRecord | None = None
    """The lane's newest `OperationFinished` (how its last operation ended), if any."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EntryQuery:
    """A session-wide entry query over every branch.

    Matching entries are taken in `order`, kept if `after_seq < seq < before_seq`, then cut to
    `limit`. `custom_type` implies ``type="custom"``. Invalid values raise
    ``SessionError("invalid_query")`` when the query is built.
    """

    type: EntryType | None = None
    custom_type: str | None = None
    order: Order = "newest_first"
    limit: int | None = None
    after_seq: int | None = None
    """Exclusive lower bound on seq, whatever the order."""
    before_seq: int | None = None
    """Exclusive upper bound on seq, whatever the order."""

    def __post_init__(self) -> None:
        _check_window(self.limit, self.after_seq, self.before_seq)
        if self.custom_type is not None and self.type not in (None, "custom"):
            raise _invalid("custom_type only applies to entries of type 'custom'")
        if self.order not in ("newest_first", "oldest_first"):
            raise _invalid(f"unknown order {self.order!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class BranchQuery(EntryQuery):
    """A query over one path: from `start` to the root.

    Semantics, in this order: (1) take the path from `start` (inclusive) to the root; (2) walk
    it in `order`; (3) end the walk after the first entry that is of `stop_at_type` or has id
    `stop_at_id` (inclusive); (4) keep entries passing the `type`/`custom_type` filter (a stop
    entry too, only if it passes); (5) keep `after_seq < seq < before_seq`; (6) cut to `limit`.
    ``newest_first`` with ``stop_at_type="compaction"`` is a lane's context window.
    """

    start: str
    stop_at_type: EntryType | None = None
    stop_at_id: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class RecordQuery:
    """A record query; every field narrows it.

    `run_id` matches an `OperationStarted` by its id and every other record by its `run_id`.
    `operation_kind` is valid only with ``type="operation_started"``. Records are taken in
    `order`, kept if ``seq > after_seq``, then cut to `limit`.
    """

    lane: str | None = None
    type: RecordType | None = None
    run_id: str | None = None
    operation_kind: OperationKind | None = None
    after_seq: int | None = None
    order: Order = "newest_first"
    limit: int | None = None

    def __post_init__(self) -> None:
        _check_window(self.limit, self.after_seq, None)
        if self.operation_kind is not None and self.type != "operation_started":
            raise _invalid("operation_kind is only valid with type='operation_started'")
        if self.order not in ("newest_first", "oldest_first"):
            raise _invalid(f"unknown order {self.order!r}")
