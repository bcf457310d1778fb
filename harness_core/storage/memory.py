"""The memory backend: the reference implementation every other backend must match.

State lives in one process; a repository is the unit of sharing (open the same session twice
from one `MemorySessionRepo` and both storages see one state). Leases use the injected clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from harness_core.clock import Clock, SystemClock
from harness_core.errors import SessionError
from harness_core.frozen import JsonValue
from harness_core.ids import IdGenerator, Uuid7Ids
from harness_core.session.entries import Entry
from harness_core.session.names import check_session_id
from harness_core.session.records import Record
from harness_core.session.types import (
    FactSet,
    LabelFact,
    LaneMove,
    LeaseHolder,
    LogItem,
    NameFact,
    SessionMetadata,
    StoredEntry,
    StoredRecord,
    WriterLease,
)
from harness_core.storage._leases import LeaseRow, check_acquire, check_current, check_ttl
from harness_core.storage._local import LocalReads
from harness_core.storage._projections import SessionState, new_metadata, replay_log

__all__ = ["MemorySessionRepo", "MemorySessionStorage"]


class _Session:
    def __init__(self, state: SessionState) -> None:
        self.state = state
        self.lease: LeaseRow | None = None
        self.fence = 0


class MemorySessionStorage(LocalReads):
    """One session of a `MemorySessionRepo`."""

    def __init__(
        self, repo: MemorySessionRepo, session: _Session, lease: WriterLease | None
    ) -> None:
        self._repo = repo
        self._session = session
        self._lease = lease
        self._closed = False

    @property
    def session_id(self) -> str:
        """The session's id."""
        return self._session.state.metadata.id

    @property
    def lease(self) -> WriterLease | None:
        """The writer lease, with the newest expiry this storage set; None when read-only."""
        return self._lease

    def _state(self) -> SessionState:
        if self._closed or self._repo.closed:
            raise SessionError("closed", f"storage of session {self.session_id!r} is closed")
        if self._repo.sessions.get(self.session_id) is not self._session:
            raise SessionError("not_found", f"session {self.session_id!r} was deleted")
        return self._session.state

    def _writable(self) -> tuple[SessionState, int]:
        state = self._state()
        if self._lease is None:
            raise SessionError(
                "read_only", f"session {self.session_id!r} was opened without a lease"
            )
        now = self._repo.clock.now_ms()
        check_current(self._session.lease, self._lease, now)
        return state, now

    def _commit(self, item: LogItem, now: int) -> None:
        self._session.state.apply(item)
        current = self._session.lease
        assert current is not None
        expires = current.renewed_by_write(now)
        if expires is not None:
            self._session.lease = LeaseRow(current.owner, current.token, current.ttl_ms, expires)
            assert self._lease is not None
            self._lease = self._lease.model_copy(update={"expires_at_ms": expires})

    async def renew_lease(self) -> WriterLease:
        """Extend this storage's lease by its ttl."""
        self._state()
        if self._lease is None:
            raise SessionError(
                "read_only", f"session {self.session_id!r} was opened without a lease"
            )
        self._lease = await self._repo.renew_lease(self._lease)
        return self._lease

    async def create_lane(self, lane: str, at: str | None) -> LaneMove:
        """Create a lane at an entry (or the root)."""
        state, now = self._writable()
        item = state.prepare_lane(lane, at, now, create=True)
        self._commit(item, now)
        return item

    async def move_lane(self, lane: str, to: str | None) -> LaneMove:
        """Move a lane's leaf."""
        state, now = self._writable()
        item = state.prepare_lane(lane, to, now, create=False)
        self._commit(item, now)
        return item

    async def append_entry(self, entry: Entry, lane: str) -> StoredEntry:
        """Append an entry at the lane's leaf."""
        state, now = self._writable()
        item = state.prepare_entry(entry, lane, now)
        self._commit(item, now)
        return item

    async def append_entry_if_missing(self, entry: Entry, lane: str) -> tuple[StoredEntry, bool]:
        """Append unless the id exists with equal content."""
        state, now = self._writable()
        existing = state.existing_entry(entry, lane)
        if existing is not None:
            return existing, False
        item = state.prepare_entry(entry, lane, now, encoded=True)
        self._commit(item, now)
        return item, True

    async def append_record(self, record: Record) -> StoredRecord:
        """Append a record (operation starts are conditional)."""
        state, now = self._writable()
        item = state.prepare_record(record, now)
        self._commit(item, now)
        return item

    async def set_name(self, name: str) -> FactSet:
        """Set the session name."""
        state, now = self._writable()
        item = state.prepare_fact(NameFact(name=name), now)
        self._commit(item, now)
        return item

    async def set_label(self, target_id: str, label: str | None) -> FactSet:
        """Set or clear an entry's label."""
        state, now = self._writable()
        item = state.prepare_fact(LabelFact(target_id=target_id, label=label), now)
        self._commit(item, now)
        return item

    async def sync(self, *, point: bool = True) -> None:
        """Nothing to do: a memory write is as durable as it gets when it returns."""
        self._state()

    async def close(self) -> None:
        """Close this storage."""
        self._closed = True


class MemorySessionRepo:
    """Sessions held in this process (the reference backend)."""

    def __init__(self, *, clock: Clock | None = None, ids: IdGenerator | None = None) -> None:
        self.clock = clock or SystemClock()
        self._ids = ids or Uuid7Ids(self.clock)
        self.sessions: dict[str, _Session] = {}
        self.closed = False

    def _require_open(self) -> None:
        if self.closed:
            raise SessionError("closed", "repository is closed")

    def _require(self, session_id: str) -> _Session:
        self._require_open()
        session = self.sessions.get(session_id)
        if session is None:
            raise SessionError("not_found", f"session {session_id!r} does not exist")
        return session

    async def create(
        self,
        session_id: str | None = None,
        *,
        metadata: Mapping[str, JsonValue] | None = None,
        parent_session_id: str | None = None,
    ) -> SessionMetadata:
        """Create an empty session."""
        self._require_open()
        session_id = session_id if session_id is not None else self._ids.next()
        check_session_id(session_id)
        meta = new_metadata(session_id, self.clock.now_ms(), metadata, parent_session_id)
        if session_id in self.sessions:
            raise SessionError("already_exists", f"session {session_id!r} already exists")
        self.sessions[session_id] = _Session(SessionState(meta))
        return meta

    async def open(
        self, session_id: str, *, lease: WriterLease | None = None
    ) -> MemorySessionStorage:
        """Open a session (for writing with a current lease)."""
        session = self._require(session_id)
        if lease is not None:
            if lease.session_id != session_id:
                raise SessionError("invalid_query", "the lease is for another session")
            check_current(session.lease, lease, self.clock.now_ms())
        return MemorySessionStorage(self, session, lease)

    async def list(self) -> tuple[SessionMetadata, ...]:
        """Every session's metadata."""
        self._require_open()
        metas = [
            s.state.metadata.model_copy(update={"name": s.state.name})
            for s in self.sessions.values()
        ]
        return tuple(sorted(metas, key=lambda m: (m.created_at, m.id)))

    async def delete(self, session_id: str, *, lease: WriterLease | None = None) -> bool:
        """Delete a session unless another writer holds it."""
        self._require_open()
        session = self.sessions.get(session_id)
        if session is None:
            return False
        now = self.clock.now_ms()
        held = session.lease is not None and session.lease.live(now)
        if held and (lease is None or lease.token != session.lease.token):  # type: ignore[union-attr]
            check_acquire(session_id, session.lease, "\x00delete", now)
        del self.sessions[session_id]
        return True

    async def acquire_lease(self, session_id: str, *, owner: str, ttl_ms: int) -> WriterLease:
        """Acquire the session's writer lease."""
        check_ttl(ttl_ms, owner)
        session = self._require(session_id)
        now = self.clock.now_ms()
        check_acquire(session_id, session.lease, owner, now)
        session.fence += 1
        session.lease = LeaseRow(owner, session.fence, ttl_ms, now + ttl_ms)
        return WriterLease(
            session_id=session_id,
            owner=owner,
            token=session.fence,
            ttl_ms=ttl_ms,
            expires_at_ms=now + ttl_ms,
        )

    async def lease_holder(self, session_id: str) -> LeaseHolder | None:
        """Who holds the live lease (None: nobody)."""
        session = self.sessions.get(session_id)
        lease = session.lease if session is not None else None
        if lease is None or not lease.live(self.clock.now_ms()):
            return None
        return LeaseHolder(owner=lease.owner, expires_at_ms=lease.expires_at_ms)

    async def renew_lease(self, lease: WriterLease) -> WriterLease:
        """Extend a current lease."""
        session = self._require(lease.session_id)
        now = self.clock.now_ms()
        check_current(session.lease, lease, now)
        assert session.lease is not None
        ttl = session.lease.ttl_ms
        session.lease = LeaseRow(lease.owner, lease.token, ttl, now + ttl)
        return lease.model_copy(update={"expires_at_ms": now + ttl})

    async def release_lease(self, lease: WriterLease) -> bool:
        """Release a lease if it is current."""
        session = self.sessions.get(lease.session_id)
        if (
            session is None
            or self.closed
            or session.lease is None
            or session.lease.token != lease.token
        ):
            return False
        session.lease = None
        return True

    async def import_session(
        self, metadata: SessionMetadata, items: Iterable[LogItem]
    ) -> SessionMetadata:
        """Create a session from an exported log."""
        self._require_open()
        check_session_id(metadata.id)
        if metadata.id in self.sessions:
            raise SessionError("already_exists", f"session {metadata.id!r} already exists")
        state = replay_log(metadata, items)
        self.sessions[metadata.id] = _Session(state)
        return state.metadata

    async def close(self) -> None:
        """Close the repository."""
        self.closed = True
