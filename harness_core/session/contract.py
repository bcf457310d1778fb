"""The storage contract: `SessionStorage` (one session), `SessionRepo` (many); docstrings are spec.

Every backend (memory, JSONL, SQLite, Redis Streams) implements these Protocols and passes the
one conformance suite in `harness_core.testing.conformance`; the memory backend is the
reference. Rules that hold for every method:

* **One seq.** Every write (entry, record, lane move, fact) gets the next number of one
  monotonic per-session sequence, allocated inside the write's atomic commit, starting at 1
  with no gaps. Concurrent writes (from many lanes) are linearized and their awaitables resolve
  in commit order.
* **Durable on return.** A write is durable (to the backend's configured level) when its call
  returns: its caller may acknowledge it, so it is a durability point (see `sync`). A write that
  raises left no trace; a write that raises ``SessionError("storage")`` has an unknown outcome
  (the caller must treat the session as faulted and reopen it). The one exception: inside
  `harness_core.session.durability.deferred_durability()` a backend may return a write once it
  is applied (visible to this storage's reads) and make it durable at the next `sync()`; a crash
  then loses a suffix of those writes, never one in the middle.
* **Checked before written.** Every payload is validated (pydantic models, canonical JSON) before
  any durable change, so all backends accept exactly the same values. A payload the codec cannot
  encode exactly (a NaN or an infinity, however it got past validation; a token count beyond
  ±2**53-1; a usage record that would take a running usage sum out of that range or to an
  infinite cost) is refused with ``SessionError("invalid_payload")`` and leaves no trace.
* **Immutable reads.** Everything returned is frozen; mutating it is impossible.
* **One writer.** Writes need a storage opened with a current `WriterLease`; each write carries
  its fencing token and the backend refuses it with `LeaseLost` once the lease expired, was
  released or was taken over. A write that finds less than half of the ttl left renews the
  lease (a steadily writing writer keeps it; across longer silences it must `renew_lease`).
  A storage opened without a lease is read-only. Lease times are on the backend's lease clock:
  the injected `Clock` (memory, SQLite), Redis's server ``TIME`` unless a clock was injected.
* **Ids.** Entry and record ids share one per-session namespace and are unique in it.
* Errors are `SessionError` with a closed `code` (see `harness_core.errors`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol, runtime_checkable

from harness_core.frozen import JsonValue
from harness_core.messages import TokenUsage
from harness_core.session.entries import Entry
from harness_core.session.records import Record
from harness_core.session.types import (
    BranchQuery,
    EntryQuery,
    FactSet,
    LaneMove,
    LanePointer,
    LaneSlice,
    LeaseHolder,
    LogItem,
    RecordQuery,
    SessionMetadata,
    SessionStats,
    StoredEntry,
    StoredRecord,
    WriterLease,
)

__all__ = ["SessionRepo", "SessionStorage"]


@runtime_checkable
class SessionStorage(Protocol):
    """One session's durable state: tree entries, lanes, lane op-log records and global facts.

    Storage persists and answers queries; it never runs operations, queues or recovery. Record
    payloads are opaque to it except for the lane, the type, the run id and the open-operation
    projection.
    """

    @property
    def session_id(self) -> str:
        """The session's id."""
        ...

    @property
    def lease(self) -> WriterLease | None:
        """The writer lease this storage writes with; None when read-only.

        Its `expires_at_ms` is the newest expiry this storage knows: the one it was opened
        with, moved forward by every `renew_lease` and by every write that renewed the lease
        (past half-life). It is on the backend's lease clock (see the module docstring), which
        for Redis without an injected clock is the server's, not this process's. None for an OS
        file lock (JSONL), which lasts as long as the process holds it.
        """
        ...

    async def renew_lease(self) -> WriterLease:
        """Extend this storage's lease by its ttl; return it with its new expiry (also `lease`).

        A lease keeper calls this while work that writes nothing is in flight (a long model or
        tool call). It delegates to the repository's `SessionRepo.renew_lease`. An OS file lock
        (JSONL) has no expiry: while it is held, the lease comes back unchanged.

        Raises:
            LeaseLost: the lease expired, was released or was superseded (`lease` keeps the
                last known expiry).
            SessionError: ``read_only`` for a storage opened without a lease; ``closed``.
        """
        ...

    async def get_metadata(self) -> SessionMetadata:
        """Return the session's metadata, with `name` set to the newest name fact."""
        ...

    # -- lanes ---------------------------------------------------------------------------

    async def get_lanes(self) -> tuple[LanePointer, ...]:
        """Return every lane with its leaf, sorted by name. Lane ``main`` always exists."""
        ...

    async def get_lane(self, lane: str) -> LanePointer | None:
        """Return one lane with its leaf, or None if no lane has that name."""
        ...

    async def create_lane(self, lane: str, at: str | None) -> LaneMove:
        """Create `lane` with its leaf at entry `at` (None: the root). Creating copies nothing.

        Raises:
            SessionError: ``invalid_lane`` (bad name), ``already_exists`` (lanes are never
                deleted or renamed), ``not_found`` (`at` is not an entry).
        """
        ...

    async def move_lane(self, lane: str, to: str | None) -> LaneMove:
        """Move `lane`'s leaf to entry `to` (None: the root); the move is kept in the log.

        Raises:
            SessionError: ``unknown_lane``, ``not_found`` (`to` is not an entry).
        """
        ...

    # -- writes --------------------------------------------------------------------------

    async def append_entry(self, entry: Entry, lane: str) -> StoredEntry:
        """Append a provisioned entry to `lane` in one atomic commit.

        The storage assigns `parent_id` = the lane's current leaf, `seq` and `timestamp`, and
        makes the entry the lane's new leaf in the same commit. Callers cannot choose a parent.

        Raises:
            SessionError: ``unknown_lane``, ``already_exists`` (the id is used by an entry or a
                record), ``invalid_payload``.
        """
        ...

    async def append_entry_if_missing(self, entry: Entry, lane: str) -> tuple[StoredEntry, bool]:
        """Append `entry` unless an entry with its id exists; return (stored, appended).

        This is how an intent is fulfilled idempotently: if the id exists with byte-identical
        canonical content, the stored entry is returned with ``appended=False`` and nothing is
        written (wherever that entry sits in the tree).

        Raises:
            SessionError: ``unknown_lane`` (checked first, even for a no-op),
                ``content_mismatch`` if the id exists with different content (that is
                corruption, never repaired), ``already_exists`` if the id is a record's, and the
                errors of `append_entry`.
        """
        ...

    async def append_record(self, record: Record) -> StoredRecord:
        """Append a record to its lane's op log; the storage assigns `seq` and `timestamp`.

        The one conditional write: an `OperationStarted` sets the lane's open operation from
        none to its id and is refused if the lane already has an open operation; an
        `OperationFinished` removes its `run_id` from the lane's open operations. No other
        record content is checked (the reducer judges validity).

        Raises:
            SessionError: ``lane_busy`` (open operation exists), ``unknown_lane``,
                ``already_exists`` (id used), ``invalid_payload``.
        """
        ...

    async def set_name(self, name: str) -> FactSet:
        """Set the session name fact (newest wins; history is kept in the log)."""
        ...

    async def set_label(self, target_id: str, label: str | None) -> FactSet:
        """Set (or with None clear) the label fact of an entry.

        Raises:
            SessionError: ``not_found`` if `target_id` is not an entry.
        """
        ...

    # -- reads ---------------------------------------------------------------------------

    async def get_entry(self, entry_id: str) -> StoredEntry | None:
        """Point lookup of a committed entry."""
        ...

    async def get_record(self, record_id: str) -> StoredRecord | None:
        """Point lookup of a committed record by its id; None if no record has it.

        Entry and record ids share one namespace, so an entry's id finds no record. O(1): a
        derived id (an idempotency key's decision, an input's acceptance) is a lookup, however
        much history the session holds.
        """
        ...

    async def find_entries(self, query: EntryQuery | None = None) -> tuple[StoredEntry, ...]:
        """Query entries of every branch in seq order (see `EntryQuery`)."""
        ...

    async def find_entries_on_branch(self, query: BranchQuery) -> tuple[StoredEntry, ...]:
        """Query one path, from `query.start` toward the root (see `BranchQuery`).

        Cost is proportional to the part of the path walked (limits, stops and the seq window
        end the walk early for ``newest_first``), never to other branches.

        Raises:
            SessionError: ``not_found`` if `start` or `stop_at_id` is not an entry.
        """
        ...

    async def find_records(self, query: RecordQuery | None = None) -> tuple[StoredRecord, ...]:
        """Query records (see `RecordQuery`).

        Lane-scoped queries read only that lane's records; with a `type` (and an
        `operation_kind`) only the lane's records of that type (and kind), from an index kept in
        seq order. So "the lane's newest ``operation_finished``" (``limit=1``), "its newest run
        start" and "its queue records after seq N" cost what they return, whatever else the lane
        or the session holds. A `run_id` narrows to that operation's records on memory, JSONL and
        SQLite; elsewhere (Redis) it filters the narrowest of the other indexes.
        """
        ...

    async def find_open_operations(
        self, lane: str | None, *, limit: int | None = None
    ) -> tuple[StoredRecord, ...]:
        """Return the lane's unfinished `OperationStarted` records, newest first.

        Recovery asks with ``limit=2``: none means idle, one means suspended, two means
        corruption. A log written through this contract can never have two (the conditional
        write refuses), but an imported or replayed log can, and then both are returned.
        Answered from a projection; cost does not depend on history.

        With `lane` None: every lane's unfinished operation starts, newest first (by seq) across
        the session, up to `limit` in all. Cost is proportional to the open operations returned,
        never to the session's lanes or history: this is how a harness finds the lanes it must
        restore at open without listing every lane. An unknown `lane` has none (empty).

        Raises:
            SessionError: ``invalid_query`` for a limit below 1.
        """
        ...

    async def read_operation_records(self, lane: str, run_id: str) -> tuple[StoredRecord, ...]:
        """Bounded restore read: the lane's records from operation `run_id`'s start, oldest first.

        Includes every record of the lane since that start (the operation's own, next-run
        queue records, adjustments). Cost is proportional to the records returned, not to the
        session's or the lane's history.

        Raises:
            SessionError: ``unknown_lane``; ``not_found`` if `run_id` is not an operation start
                of this lane.
        """
        ...

    async def read_lane_entries(self, lane: str, *, after: str | None) -> tuple[StoredEntry, ...]:
        """Bounded restore read: the lane's path from its leaf back to `after` (exclusive).

        Returned oldest first.

        With `after` set to an operation's `source_leaf_id` this is exactly the entries the
        operation appended to its lane. Cost is proportional to the entries returned.

        Raises:
            SessionError: ``unknown_lane``; ``not_found`` if `after` is not an entry;
                ``invalid_query`` if `after` is not on the lane's path.
        """
        ...

    async def read_lane_slice(self, lane: str) -> LaneSlice:
        """Bounded restore read: everything reducing `lane` to its state needs, in one call.

        The slice holds the lane's leaf; its newest `operation_finished`; and, in seq order,
        the next-run queue records (those without a run id) since the lane's newest run start
        and before its open operation, then the open operation's records
        (`read_operation_records`) and the entries it appended (`read_lane_entries` from the
        leaf it started from, or from a navigation's target once the lane moved). It equals
        what those separate reads compose; a backend answers it in as few round trips as it
        can (SQLite: one transaction, Redis: one script call, plus the path walk when an
        operation is open). Cost is proportional to the items returned, never to history.

        Raises:
            SessionError: ``unknown_lane``.
            RecordLogCorruption: ``multiple_open_operations`` (two open operations) or
                ``leaf_mismatch`` (the lane was moved off its open operation's path).
        """
        ...

    async def get_log(self, *, after_seq: int = 0, limit: int | None = None) -> tuple[LogItem, ...]:
        """Return committed items with seq > `after_seq`, in seq order, up to `limit`.

        Entries, records, lane moves and facts are merged in one sequence. Exporting a session is
        ``get_metadata()`` + ``get_log()``.
        """
        ...

    async def get_name(self) -> str | None:
        """Return the newest session name, or None."""
        ...

    async def get_label(self, target_id: str) -> str | None:
        """Return the newest label of an entry, or None if unset or cleared."""
        ...

    async def get_stats(self) -> SessionStats:
        """Return the running counters (O(1)): last seq, entries, messages, records, usage sum."""
        ...

    async def get_usage(
        self, *, entry_id: str | None = None, lane: str | None = None
    ) -> TokenUsage:
        """Return the usage sum of one entry or of one lane; exactly one must be given.

        `entry_id`: the effective cost of an entry, the sum of every lane's `Usage` records
        whose `entry_id` is it (base records and adjustments alike), in seq order. The id need
        not be an entry: a failed attempt's provisioned id never materializes, and its usage is
        still its own (an id nothing was billed to sums to zero).
        `lane`: the sum of the lane's `Usage` records, in seq order. The session's sum is
        `get_stats().usage`.

        Both are running projections kept at every write (O(1) to read), so float sums are the
        same on every backend: each adds the records in seq order, starting from zero.

        Raises:
            SessionError: ``invalid_query`` unless exactly one of them is given;
                ``unknown_lane`` for a lane that does not exist.
        """
        ...

    async def sync(self, *, point: bool = True) -> None:
        """Make every write this storage returned durable; return at once when all already are.

        Only writes made inside `deferred_durability()` can be pending (see that module). A
        backend that never defers (it commits every write on return) does nothing here.

        `point` (the default): a durability point, something outside the store is about to
        depend on these writes (an acknowledgement, a tool that must not run twice, a
        decision taking effect, an operation's end): they must survive power loss as far as
        the backend's setting promises (SQLite ``effects`` and ``full``, JSONL ``effects``
        and ``always``: an fsync; Redis: the server's ``appendfsync``). ``point=False``: they
        must survive a process crash, and become power-loss durable with the next point; the
        runtime says so before a model request, a tool declared safe to replay and a wait
        (D233).

        Raises:
            SessionError: ``storage`` if deferred writes were lost before they became durable
                (a failure in their shared transaction): the session must be reopened, exactly
                as after a write that raised it.
        """
        ...

    async def close(self) -> None:
        """Release this storage's resources (not its lease: the repository releases leases).

        Idempotent. Afterwards every call raises ``SessionError("closed")``.
        """
        ...


@runtime_checkable
class SessionRepo(Protocol):
    """Creates, opens, lists and deletes sessions, and grants their writer leases."""

    async def create(
        self,
        session_id: str | None = None,
        *,
        metadata: Mapping[str, JsonValue] | None = None,
        parent_session_id: str | None = None,
    ) -> SessionMetadata:
        """Create an empty session (lane ``main`` at the root); a new UUIDv7 id if none is given.

        Raises:
            SessionError: ``already_exists``, ``invalid_session_id``, ``invalid_payload``.
        """
        ...

    async def open(self, session_id: str, *, lease: WriterLease | None = None) -> SessionStorage:
        """Open a session: for writing with a current `lease` of it, read-only without one.

        Raises:
            SessionError: ``not_found``; `LeaseLost` if `lease` is not current;
                `StoreCorrupted` if the stored data is not a valid prefix.
        """
        ...

    async def list(self) -> tuple[SessionMetadata, ...]:
        """Return every session's metadata, sorted by (created_at, id). Acquires no lease."""
        ...

    async def delete(self, session_id: str, *, lease: WriterLease | None = None) -> bool:
        """Delete a session and everything in it; False if it did not exist.

        Raises:
            LeaseHeld: another writer holds a live lease (pass your own lease to delete anyway).
        """
        ...

    async def acquire_lease(self, session_id: str, *, owner: str, ttl_ms: int) -> WriterLease:
        """Become the session's single writer with a new, larger fencing token.

        Granted when no live lease exists (none, expired or released). Acquiring again while
        holding a live lease as the same owner also succeeds and supersedes the old token, so a
        restarted process never shares authority with its previous incarnation.

        Raises:
            LeaseHeld: another owner holds a live lease.
            SessionError: ``not_found`` if the session does not exist.
        """
        ...

    async def renew_lease(self, lease: WriterLease) -> WriterLease:
        """Extend a current lease by its ttl (writes extend it too) and return the new expiry.

        Raises:
            LeaseLost: the lease expired, was released or was superseded.
        """
        ...

    async def release_lease(self, lease: WriterLease) -> bool:
        """Give the lease up if it is still current; False (and no change) if it was not."""
        ...

    async def lease_holder(self, session_id: str) -> LeaseHolder | None:
        """Who holds the session's live writer lease, or None (none, lapsed or released).

        A read: it takes nothing and changes nothing (an operator's view of which sessions a
        worker is executing). The answer may be stale the moment it returns.
        """
        ...

    async def import_session(
        self, metadata: SessionMetadata, items: Iterable[LogItem]
    ) -> SessionMetadata:
        """Create a session holding exactly `items` (an exported log), seq and timestamps kept.

        The log is checked as a whole before anything is stored: contiguous seq from 1, unique
        ids, entry parents equal to their lane's leaf, existing lanes and targets. The
        open-operation condition is not applied, so a log with two open operations on a lane
        imports as it was (and `find_open_operations` reports both). Use it to move a session
        between backends or to restore a snapshot.

        Raises:
            SessionError: ``already_exists``; ``invalid_payload`` naming the first bad item.
        """
        ...

    async def close(self) -> None:
        """Close the repository and every storage it opened. Idempotent."""
        ...
