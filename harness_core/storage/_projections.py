"""An in-memory session: the reference projections and write checks, shared by memory and JSONL.

The memory backend is this state behind a lock; the JSONL backend replays its file into it and
appends a line before applying each mutation; `import_session` on every backend replays the
imported log into one first, so a malformed log is refused before any backend is touched.

Records are indexed the way queries narrow them (by lane, by lane and type, by type, by run), each
index a seq-ordered list, so a query reads only the records of its narrowest index.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping

from harness_core.errors import SessionError
from harness_core.frozen import JsonValue
from harness_core.messages import TokenUsage
from harness_core.session.codec import encode, encode_entry, encode_fact, encode_record
from harness_core.session.entries import CustomEntry, Entry, MessageEntry
from harness_core.session.names import check_lane_name
from harness_core.session.records import OperationFinished, OperationStarted, Record, Usage
from harness_core.session.types import (
    BranchQuery,
    EntryQuery,
    Fact,
    FactSet,
    LabelFact,
    LaneMove,
    LanePointer,
    LogItem,
    NameFact,
    RecordQuery,
    SessionMetadata,
    SessionStats,
    StoredEntry,
    StoredRecord,
)
from harness_core.storage._branch import BranchNode, BranchScan, SinceScan, drive, entry_matches
from harness_core.storage._rules import add_usage

__all__ = ["SessionState", "new_metadata", "record_matches", "record_run_id", "replay_log"]

_Key = tuple[str | None, str, str | None]
"""An index of records: (lane or None for every lane, type, operation kind or None)."""

_UsageSums = tuple[Usage, int, TokenUsage, TokenUsage, TokenUsage | None]
"""A usage record checked at a log length, and the session, lane and entry sums after it."""

_NO_USAGE = TokenUsage()


def record_run_id(record: Record) -> str | None:
    """The run a record belongs to: an operation start's own id, else its `run_id` field."""
    if isinstance(record, OperationStarted):
        return record.id
    run_id: str | None = getattr(record, "run_id", None)
    return run_id


def _index_keys(record: Record) -> list[_Key]:
    keys: list[_Key] = [(record.lane, record.type, None), (None, record.type, None)]
    if isinstance(record, OperationStarted):
        kind = record.intent.kind
        keys += [(record.lane, record.type, kind), (None, record.type, kind)]
    return keys


def record_matches(query: RecordQuery, stored: StoredRecord) -> bool:
    """Whether a stored record passes every filter of `query` (order and limit aside)."""
    record = stored.record
    if query.lane is not None and record.lane != query.lane:
        return False
    if query.type is not None and record.type != query.type:
        return False
    if query.run_id is not None:
        if isinstance(record, OperationStarted):
            if record.id != query.run_id:
                return False
        elif getattr(record, "run_id", None) != query.run_id:
            return False
    if query.operation_kind is not None and not (
        isinstance(record, OperationStarted) and record.intent.kind == query.operation_kind
    ):
        return False
    return query.after_seq is None or stored.seq > query.after_seq


class SessionState:
    """Every projection of one session, built by applying log items in seq order."""

    def __init__(self, metadata: SessionMetadata) -> None:
        self.metadata = metadata
        self.log: list[LogItem] = []
        self.entries: dict[str, StoredEntry] = {}
        self.entry_list: list[StoredEntry] = []
        self.records: list[StoredRecord] = []
        self.record_ids: dict[str, StoredRecord] = {}
        self.lane_records: dict[str, list[StoredRecord]] = {}
        self.typed_records: dict[_Key, list[StoredRecord]] = {}
        self.run_records: dict[str, list[StoredRecord]] = {}
        self.lane_usage: dict[str, TokenUsage] = {}
        self.entry_usage: dict[str, TokenUsage] = {}
        self.lanes: dict[str, str | None] = {"main": None}
        self.open_ops: dict[str, list[StoredRecord]] = {}
        self.name: str | None = None
        self.labels: dict[str, str] = {}
        self.entry_count = 0
        self.message_count = 0
        self.record_count = 0
        self.usage = _NO_USAGE
        """The session's usage sum (every usage record of every lane)."""
        self._checked_usage: _UsageSums | None = None
        self._stats: SessionStats | None = None

    @property
    def stats(self) -> SessionStats:
        """The running counters (made on read: every write changes them, few read them)."""
        if self._stats is None:
            self._stats = SessionStats(
                last_seq=len(self.log),
                entries=self.entry_count,
                messages=self.message_count,
                records=self.record_count,
                usage=self.usage,
            )
        return self._stats

    @property
    def next_seq(self) -> int:
        """The seq the next write will get."""
        return len(self.log) + 1

    # -- write checks: raise SessionError, never mutate -----------------------------------

    def _require_lane(self, lane: str) -> str | None:
        check_lane_name(lane)
        if lane not in self.lanes:
            raise SessionError("unknown_lane", f"lane {lane!r} does not exist")
        return self.lanes[lane]

    def _require_unused_id(self, item_id: str) -> None:
        if item_id in self.entries or item_id in self.record_ids:
            raise SessionError("already_exists", f"id {item_id!r} is already used in this session")

    def _require_target(self, target: str | None) -> None:
        if target is not None and target not in self.entries:
            raise SessionError("not_found", f"entry {target!r} does not exist")

    def prepare_entry(
        self, entry: Entry, lane: str, now: int, *, encoded: bool = False
    ) -> StoredEntry:
        """Check an append and return the item it would commit.

        `encoded`: `existing_entry` just encoded this entry (it refuses what cannot be stored).
        """
        if not encoded:
            encode_entry(entry)
        parent = self._require_lane(lane)
        self._require_unused_id(entry.id)
        return StoredEntry(
            seq=self.next_seq, timestamp=now, lane=lane, parent_id=parent, entry=entry
        )

    def existing_entry(self, entry: Entry, lane: str) -> StoredEntry | None:
        """For append-if-missing: the stored entry with `entry.id`, if its content is equal.

        Raises ``SessionError("unknown_lane")`` first if `lane` does not exist (even when the
        append would be a no-op), ``SessionError("content_mismatch")`` if the id holds different
        content, and ``SessionError("already_exists")`` if the id is a record's.
        """
        payload = encode_entry(entry)
        self._require_lane(lane)
        existing = self.entries.get(entry.id)
        if existing is None:
            if entry.id in self.record_ids:
                raise SessionError("already_exists", f"id {entry.id!r} is a record's id")
            return None
        if encode_entry(existing.entry) != payload:
            raise SessionError(
                "content_mismatch",
                f"entry {entry.id!r} exists with different content (provisioned-id corruption)",
            )
        return existing

    def _check_usage(self, record: Record) -> None:
        """Refuse a usage record that would take a running sum out of range (see `add_usage`).

        The sums it checked are kept for `apply` (which follows at once), not added again.
        """
        if not isinstance(record, Usage):
            return
        session = add_usage(self.usage, record.usage, "the session")
        lane = add_usage(self.lane_usage.get(record.lane, _NO_USAGE), record.usage, "the lane")
        entry = None
        if record.entry_id is not None:
            entry_sum = self.entry_usage.get(record.entry_id, _NO_USAGE)
            entry = add_usage(entry_sum, record.usage, f"entry {record.entry_id!r}")
        self._checked_usage = (record, len(self.log), session, lane, entry)

    def prepare_record(self, record: Record, now: int) -> StoredRecord:
        """Check a record append (including the open-operation condition) and return its item."""
        encode_record(record)
        self._require_lane(record.lane)
        self._require_unused_id(record.id)
        self._check_usage(record)
        if isinstance(record, OperationStarted):
            open_ops = self.open_ops.get(record.lane)
            if open_ops:
                raise SessionError(
                    "lane_busy",
                    f"lane {record.lane!r} already has open operation {open_ops[-1].id!r}",
                )
        return StoredRecord(seq=self.next_seq, timestamp=now, record=record)

    def prepare_lane(self, lane: str, leaf_id: str | None, now: int, *, create: bool) -> LaneMove:
        """Check a lane creation or move and return its item."""
        check_lane_name(lane)
        if create and lane in self.lanes:
            raise SessionError("already_exists", f"lane {lane!r} already exists")
        if not create:
            self._require_lane(lane)
        self._require_target(leaf_id)
        return LaneMove(
            seq=self.next_seq, timestamp=now, lane=lane, leaf_id=leaf_id, created=create
        )

    def prepare_fact(self, fact: Fact, now: int) -> FactSet:
        """Check a fact write and return its item."""
        encode_fact(fact)
        if isinstance(fact, LabelFact):
            self._require_target(fact.target_id)
        return FactSet(seq=self.next_seq, timestamp=now, fact=fact)

    def check_replay(self, item: LogItem, *, encoded: bool = False) -> None:
        """Check an item of an imported or replayed log: structure only, no open-op condition.

        `encoded`: the item was decoded from its own checksummed encoding, so it encodes (the
        check that re-encodes it is skipped). Raises ``SessionError("invalid_payload")``
        describing the first violation.
        """
        try:
            if item.seq != self.next_seq:
                raise SessionError("invalid_query", f"expected seq {self.next_seq}, got {item.seq}")
            if isinstance(item, StoredEntry):
                if not encoded:
                    encode_entry(item.entry)
                self._require_unused_id(item.id)
                if item.lane is not None:
                    if self._require_lane(item.lane) != item.parent_id:
                        raise SessionError("invalid_query", "parent is not the lane's leaf")
                else:
                    self._require_target(item.parent_id)
            elif isinstance(item, StoredRecord):
                if not encoded:
                    encode_record(item.record)
                self._require_lane(item.record.lane)
                self._require_unused_id(item.id)
                self._check_usage(item.record)
            elif isinstance(item, LaneMove):
                check_lane_name(item.lane)
                if item.created and item.lane in self.lanes:
                    raise SessionError("already_exists", f"lane {item.lane!r} already exists")
                if not item.created:
                    self._require_lane(item.lane)
                self._require_target(item.leaf_id)
            else:
                if not encoded:
                    encode_fact(item.fact)
                if isinstance(item.fact, LabelFact):
                    self._require_target(item.fact.target_id)
        except SessionError as exc:
            raise SessionError("invalid_payload", f"log item seq {item.seq}: {exc}") from exc

    # -- apply -----------------------------------------------------------------------------

    def apply(self, item: LogItem) -> None:
        """Apply a checked item; the caller made it durable first."""
        self.log.append(item)
        self._stats = None
        if isinstance(item, StoredEntry):
            self.entry_count += 1
            self.message_count += isinstance(item.entry, MessageEntry)
            self.entries[item.id] = item
            self.entry_list.append(item)
            if item.lane is not None:
                self.lanes[item.lane] = item.id
        elif isinstance(item, StoredRecord):
            record = item.record
            self.records.append(item)
            self.record_ids[record.id] = item
            self.lane_records.setdefault(record.lane, []).append(item)
            for key in _index_keys(record):
                self.typed_records.setdefault(key, []).append(item)
            run_id = record_run_id(record)
            if run_id is not None:
                self.run_records.setdefault(run_id, []).append(item)
            self.record_count += 1
            if isinstance(record, Usage):
                checked = self._checked_usage
                if checked is None or checked[0] is not record or checked[1] != len(self.log) - 1:
                    self._check_usage(record)  # not checked against this state: sum it now
                    checked = self._checked_usage
                assert checked is not None
                _, _, self.usage, self.lane_usage[record.lane], entry_sum = checked
                if record.entry_id is not None:
                    assert entry_sum is not None
                    self.entry_usage[record.entry_id] = entry_sum
                self._checked_usage = None
            if isinstance(record, OperationStarted):
                self.open_ops.setdefault(record.lane, []).append(item)
            elif isinstance(record, OperationFinished):
                open_ops = self.open_ops.get(record.lane, [])
                still = [op for op in open_ops if op.id != record.run_id]
                if still:
                    self.open_ops[record.lane] = still
                else:  # only lanes with open operations stay keyed: a session-wide read is short
                    self.open_ops.pop(record.lane, None)
        elif isinstance(item, LaneMove):
            self.lanes[item.lane] = item.leaf_id
        else:
            fact = item.fact
            if isinstance(fact, NameFact):
                self.name = fact.name
            elif fact.label is None:
                self.labels.pop(fact.target_id, None)
            else:
                self.labels[fact.target_id] = fact.label

    # -- reads -----------------------------------------------------------------------------

    def get_lanes(self) -> tuple[LanePointer, ...]:
        """Every lane, sorted by name."""
        return tuple(
            LanePointer(lane=name, leaf_id=self.lanes[name]) for name in sorted(self.lanes)
        )

    def walk(self, start: str) -> Iterator[BranchNode]:
        """Yield the path from `start` to the root (raises not_found for an unknown start)."""
        stored = self.entries.get(start)
        if stored is None:
            raise SessionError("not_found", f"entry {start!r} does not exist")
        while stored is not None:
            entry = stored.entry
            custom = entry.custom_type if isinstance(entry, CustomEntry) else None
            yield BranchNode(stored.id, stored.parent_id, stored.seq, entry.type, custom)
            stored = self.entries.get(stored.parent_id) if stored.parent_id is not None else None

    def find_entries(self, query: EntryQuery) -> tuple[StoredEntry, ...]:
        """Session-wide entry query."""
        ordered = self.entry_list if query.order == "oldest_first" else reversed(self.entry_list)
        kept: list[StoredEntry] = []
        for stored in ordered:
            entry = stored.entry
            custom = entry.custom_type if isinstance(entry, CustomEntry) else None
            if entry_matches(query, entry.type, custom, stored.seq):
                kept.append(stored)
                if query.limit is not None and len(kept) >= query.limit:
                    break
        return tuple(kept)

    def find_entries_on_branch(self, query: BranchQuery) -> tuple[StoredEntry, ...]:
        """Path query."""
        if query.stop_at_id is not None:
            self._require_target(query.stop_at_id)
        nodes = drive(BranchScan(query), self.walk(query.start))
        return tuple(self.entries[node.id] for node in nodes)

    def read_lane_entries(self, lane: str, after: str | None) -> tuple[StoredEntry, ...]:
        """The lane's path from its leaf back to `after` (exclusive), oldest first."""
        leaf = self._require_lane(lane)
        after_seq = 0
        if after is not None:
            self._require_target(after)
            after_seq = self.entries[after].seq
        if leaf is None:
            if after is not None:
                raise SessionError("invalid_query", f"entry {after!r} is not on the lane's path")
            return ()
        nodes = drive(SinceScan(after, after_seq), self.walk(leaf))
        return tuple(self.entries[node.id] for node in nodes)

    def find_records(self, query: RecordQuery) -> tuple[StoredRecord, ...]:
        """Record query: the narrowest index holding every match, filtered by the rest."""
        pool: list[StoredRecord]
        if query.run_id is not None:
            pool = self.run_records.get(query.run_id, [])
        elif query.type is not None:
            key = (query.lane, query.type, query.operation_kind)
            pool = self.typed_records.get(key, [])
        elif query.lane is not None:
            pool = self.lane_records.get(query.lane, [])
        else:
            pool = self.records
        if query.after_seq is not None:
            pool = pool[bisect.bisect_right(pool, query.after_seq, key=lambda r: r.seq) :]
        ordered = pool if query.order == "oldest_first" else reversed(pool)
        kept: list[StoredRecord] = []
        for stored in ordered:
            if record_matches(query, stored):
                kept.append(stored)
                if query.limit is not None and len(kept) >= query.limit:
                    break
        return tuple(kept)

    def find_open_operations(self, lane: str | None, limit: int | None) -> tuple[StoredRecord, ...]:
        """Unfinished operation starts of a lane (None: of every lane), newest first."""
        if lane is None:
            ops = sorted(
                (op for lane_ops in self.open_ops.values() for op in lane_ops),
                key=lambda op: op.seq,
                reverse=True,
            )
        else:
            ops = list(reversed(self.open_ops.get(lane, [])))
        return tuple(ops if limit is None else ops[:limit])

    def read_operation_records(self, lane: str, run_id: str) -> tuple[StoredRecord, ...]:
        """The lane's records from operation `run_id`'s start onward, oldest first."""
        self._require_lane(lane)
        start = self.record_ids.get(run_id)
        if start is None or not isinstance(start.record, OperationStarted) or start.lane != lane:
            raise SessionError("not_found", f"lane {lane!r} has no operation {run_id!r}")
        pool = self.lane_records[lane]
        return tuple(pool[bisect.bisect_left(pool, start.seq, key=lambda r: r.seq) :])

    def get_usage(self, entry_id: str | None, lane: str | None) -> TokenUsage:
        """The usage sum of an entry or of a lane (exactly one of them)."""
        if (entry_id is None) == (lane is None):
            raise SessionError("invalid_query", "get_usage takes exactly one of entry_id, lane")
        if lane is not None:
            if lane not in self.lanes:
                raise SessionError("unknown_lane", f"lane {lane!r} does not exist")
            return self.lane_usage.get(lane, TokenUsage())
        assert entry_id is not None
        return self.entry_usage.get(entry_id, TokenUsage())

    def get_log(self, after_seq: int, limit: int | None) -> tuple[LogItem, ...]:
        """Log items with seq > after_seq, oldest first."""
        end = None if limit is None else after_seq + limit
        return tuple(self.log[after_seq:end])


def new_metadata(
    session_id: str,
    now: int,
    metadata: Mapping[str, JsonValue] | None,
    parent_session_id: str | None,
) -> SessionMetadata:
    """Build the metadata of a new session, refusing metadata that is not JSON."""
    try:
        return SessionMetadata(
            id=session_id,
            created_at=now,
            parent_session_id=parent_session_id,
            metadata=dict(metadata or {}),
        )
    except ValueError as exc:
        raise SessionError("invalid_payload", f"invalid session metadata: {exc}") from exc


def replay_log(metadata: SessionMetadata, items: Iterable[LogItem]) -> SessionState:
    """Check and apply an exported log to a fresh state (the common first step of every import)."""
    encode(metadata, "session metadata")  # it may have skipped validation (model_copy)
    state = SessionState(metadata.model_copy(update={"name": None}))
    for item in items:
        state.check_replay(item)
        state.apply(item)
    return state
