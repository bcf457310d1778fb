"""The read half of storages whose data is a `SessionState` in this process (memory, JSONL)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import cast

from harness_core.errors import SessionError
from harness_core.messages import TokenUsage
from harness_core.session.contract import SessionStorage
from harness_core.session.types import (
    BranchQuery,
    EntryQuery,
    LanePointer,
    LaneSlice,
    LogItem,
    RecordQuery,
    SessionMetadata,
    SessionStats,
    StoredEntry,
    StoredRecord,
)
from harness_core.storage._projections import SessionState
from harness_core.storage._slice import compose_lane_slice

__all__ = ["LocalReads"]


class LocalReads(ABC):
    """Answers every `SessionStorage` read from an in-process `SessionState`."""

    @abstractmethod
    def _state(self) -> SessionState:
        """The live state; raises ``SessionError("closed")`` once the storage is closed."""

    async def get_metadata(self) -> SessionMetadata:
        """Return the session's metadata with its newest name."""
        state = self._state()
        return state.metadata.model_copy(update={"name": state.name})

    async def get_lanes(self) -> tuple[LanePointer, ...]:
        """Every lane, sorted by name."""
        return self._state().get_lanes()

    async def get_lane(self, lane: str) -> LanePointer | None:
        """One lane, or None."""
        state = self._state()
        return LanePointer(lane=lane, leaf_id=state.lanes[lane]) if lane in state.lanes else None

    async def get_entry(self, entry_id: str) -> StoredEntry | None:
        """Point lookup."""
        return self._state().entries.get(entry_id)

    async def get_record(self, record_id: str) -> StoredRecord | None:
        """Point lookup."""
        return self._state().record_ids.get(record_id)

    async def find_entries(self, query: EntryQuery | None = None) -> tuple[StoredEntry, ...]:
        """Session-wide entry query."""
        return self._state().find_entries(query or EntryQuery())

    async def find_entries_on_branch(self, query: BranchQuery) -> tuple[StoredEntry, ...]:
        """Path query."""
        return self._state().find_entries_on_branch(query)

    async def find_records(self, query: RecordQuery | None = None) -> tuple[StoredRecord, ...]:
        """Record query."""
        return self._state().find_records(query or RecordQuery())

    async def find_open_operations(
        self, lane: str | None, *, limit: int | None = None
    ) -> tuple[StoredRecord, ...]:
        """Open operations of a lane (None: of the session), newest first."""
        if limit is not None and limit < 1:
            raise SessionError("invalid_query", f"limit must be positive, got {limit}")
        return self._state().find_open_operations(lane, limit)

    async def read_operation_records(self, lane: str, run_id: str) -> tuple[StoredRecord, ...]:
        """Records of the lane since an operation's start."""
        return self._state().read_operation_records(lane, run_id)

    async def read_lane_entries(self, lane: str, *, after: str | None) -> tuple[StoredEntry, ...]:
        """The lane's path back to an anchor."""
        return self._state().read_lane_entries(lane, after)

    async def read_lane_slice(self, lane: str) -> LaneSlice:
        """The restore read, composed of the reads above."""
        return await compose_lane_slice(cast(SessionStorage, self), lane)

    async def get_log(self, *, after_seq: int = 0, limit: int | None = None) -> tuple[LogItem, ...]:
        """Log items after a seq."""
        EntryQuery(after_seq=after_seq, limit=limit)  # the shared argument checks
        return self._state().get_log(after_seq, limit)

    async def get_name(self) -> str | None:
        """Newest session name."""
        return self._state().name

    async def get_label(self, target_id: str) -> str | None:
        """Newest label of an entry."""
        return self._state().labels.get(target_id)

    async def get_stats(self) -> SessionStats:
        """Running counters."""
        return self._state().stats

    async def get_usage(
        self, *, entry_id: str | None = None, lane: str | None = None
    ) -> TokenUsage:
        """The usage sum of an entry or of a lane (a running projection)."""
        return self._state().get_usage(entry_id, lane)
