"""The JSONL backend: one append-only file per session, one line per mutation.

Layout: ``<dir>/<session_id>.jsonl`` holds a header line and then one `LogItem` per line in seq
order; ``<dir>/<session_id>.lock`` carries the writer lock (an OS ``flock``, refused to every
other open file, in this process or another) and the last fencing token handed out.

Line format (D240, D242): a line is the item's canonical encoding (the exported log format) with its
CRC32C as a first key, ``{"crc32c":"<8 hex digits>",`` followed by the encoding without its
opening brace, so every line stays one JSON object. Opening verifies each line's checksum and
decodes it with the trusted decoder (no validation of what the writer validated); a mismatch
refuses the open with `StoreCorrupted` naming the file and line. Files of format
``durable-gateway/session-jsonl/1`` (before checksums) open as before, every line without a
checksum validated in full; a writer appends checksummed lines to them too (and a new file's
header says ``/2``, which older versions refuse).

Durability: a write returns after its line was handed to the OS, which survives a process
crash. Power loss: ``fsync="effects"`` (the default) fsyncs at every durability point (a write
durable on return, or `JsonlSessionStorage.sync` at a point: an acknowledgement, a tool that
must not run twice, an operation's end), which makes every line before it durable too (D233);
``"always"`` fsyncs every write; ``"never"`` leaves it to the OS. A line is
written whole, newline included, before its write returns, so only a final line without its
newline (a torn tail) can be a write that was never acknowledged: opening ignores it, and a
writer open truncates it. Any malformed newline-terminated line, the final one included, may
be an acknowledged write: it refuses the open (reader or writer) with `StoreCorrupted` naming
the file and line; nothing is repaired silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import ValidationError

from harness_core.backends.io_thread import IoThread
from harness_core.clock import Clock, SystemClock
from harness_core.errors import LeaseHeld, LeaseLost, SessionError, StoreCorrupted
from harness_core.frozen import JsonValue
from harness_core.ids import IdGenerator, Uuid7Ids
from harness_core.session.codec import (
    checksum,
    corrupted,
    encode_log_item,
    log_item_adapter,
    trusted_log_item,
)
from harness_core.session.collector import collector_paused
from harness_core.session.durability import durability_deferred
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
from harness_core.storage._leases import check_ttl
from harness_core.storage._local import LocalReads
from harness_core.storage._projections import SessionState, new_metadata, replay_log

__all__ = ["FsyncPolicy", "JsonlSessionRepo", "JsonlSessionStorage"]

_Item = TypeVar("_Item", StoredEntry, StoredRecord, LaneMove, FactSet)

FsyncPolicy = Literal["never", "effects", "always"]
_FORMAT = "durable-gateway/session-jsonl/2"
_FORMATS = ("durable-gateway/session-jsonl/1", _FORMAT)
"""The header formats this version opens: /1 (lines without checksums) and /2."""
_SEAL = b'{"crc32c":"'
_SEALED_AT = len(_SEAL) + 10
"""Where a sealed line's item encoding resumes: after the key, 8 hex digits, a quote, a comma."""


def sealed(encoded: str) -> str:
    """The line of an item's canonical encoding: its CRC32C first, as a key of the same object."""
    return f'{{"crc32c":"{checksum(encoded):08x}",{encoded[1:]}'


def unsealed(line: bytes, location: str) -> tuple[bytes, bool]:
    """A line's item encoding, and whether a checksum vouched for it (raises if it fails it).

    A line without the checksum key (format /1) is returned as it is, to be validated in full.
    """
    if not line.startswith(_SEAL):
        return line, False
    digits = line[len(_SEAL) : _SEALED_AT - 2]
    if line[_SEALED_AT - 2 : _SEALED_AT] != b'",' or len(digits) != 8:
        raise StoreCorrupted(f"malformed checksum in {location}", location=location)
    try:
        stored = int(digits, 16)
    except ValueError:
        raise StoreCorrupted(f"malformed checksum in {location}", location=location) from None
    encoded = b"{" + line[_SEALED_AT:]
    computed = checksum(encoded)
    if computed != stored:
        raise corrupted(location, stored, computed)
    return encoded, True


@dataclass
class _Writer:
    """The live writer of one session in this repository: the lock, the file and the state."""

    lease: WriterLease
    lock_fd: int
    state: SessionState | None = None
    data_fd: int | None = None
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    unsynced: bool = False
    """Lines were written and not fsynced yet (``effects`` or ``always``): the next point's."""


class JsonlSessionStorage(LocalReads):
    """One session stored as a JSONL file."""

    def __init__(
        self,
        repo: JsonlSessionRepo,
        session_id: str,
        state: SessionState,
        lease: WriterLease | None,
    ) -> None:
        self._repo = repo
        self._session_id = session_id
        self._state_obj = state
        self._lease = lease
        self._closed = False

    @property
    def session_id(self) -> str:
        """The session's id."""
        return self._session_id

    @property
    def lease(self) -> WriterLease | None:
        """The writer lease (an OS lock: no expiry); None when read-only."""
        return self._lease

    def _state(self) -> SessionState:
        if self._closed or self._repo.closed:
            raise SessionError("closed", f"storage of session {self._session_id!r} is closed")
        return self._state_obj

    def _writer(self) -> _Writer:
        self._state()
        if self._lease is None:
            raise SessionError(
                "read_only", f"session {self._session_id!r} was opened without a lease"
            )
        writer = self._repo.writers.get(self._session_id)
        if writer is None or writer.lease.token != self._lease.token:
            raise LeaseLost(
                f"writer lease {self._lease.token} on {self._session_id!r} "
                "was released or superseded"
            )
        return writer

    async def _commit(self, prepare: Callable[[SessionState, int], _Item]) -> _Item:
        async with self._writer().write_lock:
            return await self._commit_locked(prepare)

    async def _commit_locked(self, prepare: Callable[[SessionState, int], _Item]) -> _Item:
        writer = self._writer()  # the lease may have gone while this waited for the lock
        state = self._state()
        item = prepare(state, self._repo.clock.now_ms())
        line = (sealed(encode_log_item(item)) + "\n").encode()
        assert writer.data_fd is not None
        fsyncs = self._repo.fsync != "never"
        # A write durable on return is a durability point under `effects` and `always`; a
        # deferred one waits for `sync`. One fsync makes every earlier line durable too.
        now = fsyncs and not durability_deferred()
        await self._repo.run(_append_line, writer.data_fd, line, now)
        writer.unsynced = fsyncs and not now
        state.apply(item)
        return item

    async def sync(self, *, point: bool = True) -> None:
        """Fsync the lines written since the last fsync, where the policy asks for it.

        ``always``: at every sync; ``effects``: at a durability point only (`point`), other
        syncs have nothing to do (each line reached the OS when its write returned);
        ``never``: never.
        """
        writer = self._repo.writers.get(self._session_id)
        self._state()
        if writer is None or not writer.unsynced or writer.data_fd is None:
            return
        if not point and self._repo.fsync == "effects":
            return
        async with writer.write_lock:
            if writer.unsynced and writer.data_fd is not None:
                await self._repo.run(fsync_fd, writer.data_fd)
                writer.unsynced = False

    async def create_lane(self, lane: str, at: str | None) -> LaneMove:
        """Create a lane at an entry (or the root)."""
        return await self._commit(lambda st, now: st.prepare_lane(lane, at, now, create=True))

    async def move_lane(self, lane: str, to: str | None) -> LaneMove:
        """Move a lane's leaf."""
        return await self._commit(lambda st, now: st.prepare_lane(lane, to, now, create=False))

    async def append_entry(self, entry: Entry, lane: str) -> StoredEntry:
        """Append an entry at the lane's leaf."""
        return await self._commit(lambda st, now: st.prepare_entry(entry, lane, now))

    async def append_entry_if_missing(self, entry: Entry, lane: str) -> tuple[StoredEntry, bool]:
        """Append unless the id exists with equal content."""
        async with self._writer().write_lock:
            existing = self._state().existing_entry(entry, lane)
            if existing is not None:
                return existing, False
            stored = await self._commit_locked(lambda st, now: st.prepare_entry(entry, lane, now))
            return stored, True

    async def append_record(self, record: Record) -> StoredRecord:
        """Append a record (operation starts are conditional)."""
        return await self._commit(lambda st, now: st.prepare_record(record, now))

    async def set_name(self, name: str) -> FactSet:
        """Set the session name."""
        return await self._commit(lambda st, now: st.prepare_fact(NameFact(name=name), now))

    async def set_label(self, target_id: str, label: str | None) -> FactSet:
        """Set or clear an entry's label."""
        fact = LabelFact(target_id=target_id, label=label)
        return await self._commit(lambda st, now: st.prepare_fact(fact, now))

    async def renew_lease(self) -> WriterLease:
        """An OS lock does not lapse: confirm it is still held and return the lease unchanged."""
        self._state()
        if self._lease is None:
            raise SessionError(
                "read_only", f"session {self._session_id!r} was opened without a lease"
            )
        return await self._repo.renew_lease(self._lease)

    async def close(self) -> None:
        """Close this storage."""
        self._closed = True


class JsonlSessionRepo:
    """Sessions as JSONL files in one directory."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        fsync: FsyncPolicy = "effects",
        clock: Clock | None = None,
        ids: IdGenerator | None = None,
    ) -> None:
        if fsync not in ("never", "effects", "always"):
            raise SessionError(
                "invalid_query", f"fsync must be 'never', 'effects' or 'always', got {fsync!r}"
            )
        self.directory = Path(directory)
        self.fsync: FsyncPolicy = fsync
        self.clock = clock or SystemClock()
        self._ids = ids or Uuid7Ids(self.clock)
        self.writers: dict[str, _Writer] = {}
        self._io = IoThread("jsonl-store", lambda: SessionError("closed", "repository is closed"))

    @property
    def closed(self) -> bool:
        """Whether `close` was called (every call since raises ``SessionError("closed")``)."""
        return self._io.closed

    async def run(self, fn: Any, *args: Any) -> Any:
        """Run blocking file work on the repository's I/O thread (in submission order)."""
        return await self._io.call(partial(fn, *args))

    def _paths(self, session_id: str) -> tuple[Path, Path]:
        check_session_id(session_id)
        return self.directory / f"{session_id}.jsonl", self.directory / f"{session_id}.lock"

    async def create(
        self,
        session_id: str | None = None,
        *,
        metadata: Mapping[str, JsonValue] | None = None,
        parent_session_id: str | None = None,
    ) -> SessionMetadata:
        """Create an empty session file."""
        session_id = session_id if session_id is not None else self._ids.next()
        data, _ = self._paths(session_id)
        meta = new_metadata(session_id, self.clock.now_ms(), metadata, parent_session_id)
        await self.run(_publish, self.directory, data, [_header(meta)], self.fsync != "never")
        return meta

    async def open(
        self, session_id: str, *, lease: WriterLease | None = None
    ) -> JsonlSessionStorage:
        """Open a session (for writing with a current lease)."""
        data, _ = self._paths(session_id)
        if lease is None:
            writer = self.writers.get(session_id)
            if writer is not None and writer.state is not None:
                return JsonlSessionStorage(self, session_id, writer.state, None)
            state = await self.run(_load, data, False)
            return JsonlSessionStorage(self, session_id, state, None)
        if lease.session_id != session_id:
            raise SessionError("invalid_query", "the lease is for another session")
        writer = self.writers.get(session_id)
        if writer is None or writer.lease.token != lease.token:
            raise LeaseLost(f"writer lease {lease.token} on {session_id!r} is not current")
        if writer.state is None:
            writer.state = await self.run(_load, data, True)
            writer.data_fd = await self.run(_open_append, data)
        return JsonlSessionStorage(self, session_id, writer.state, lease)

    async def list(self) -> tuple[SessionMetadata, ...]:
        """Every session's metadata (reads each file's header and name facts)."""
        metas: list[SessionMetadata] = await self.run(_list, self.directory)
        return tuple(sorted(metas, key=lambda m: (m.created_at, m.id)))

    async def delete(self, session_id: str, *, lease: WriterLease | None = None) -> bool:
        """Delete a session unless another writer holds it."""
        data, lock = self._paths(session_id)
        writer = self.writers.get(session_id)
        if writer is not None:
            if lease is None or lease.token != writer.lease.token:
                raise LeaseHeld(
                    f"session {session_id!r} is held by {writer.lease.owner!r}",
                    owner=writer.lease.owner,
                    expires_at_ms=None,
                )
            await self._drop_writer(session_id)
        deleted: bool = await self.run(_delete, data, lock)
        return deleted

    async def acquire_lease(self, session_id: str, *, owner: str, ttl_ms: int) -> WriterLease:
        """Take the session's file lock and a new fencing token."""
        check_ttl(ttl_ms, owner)
        data, lock = self._paths(session_id)
        current = self.writers.get(session_id)
        if current is not None:
            if current.lease.owner != owner:
                raise LeaseHeld(
                    f"session {session_id!r} is held by {current.lease.owner!r}",
                    owner=current.lease.owner,
                    expires_at_ms=None,
                )
            token = await self.run(_bump_fence, current.lock_fd, owner)
            lease = current.lease.model_copy(update={"token": token})
            # Superseding keeps the file and state: the same process is the only writer.
            current.lease = lease
            return lease
        fd, token = await self.run(_lock, data, lock, owner, session_id)
        lease = WriterLease(
            session_id=session_id, owner=owner, token=token, ttl_ms=None, expires_at_ms=None
        )
        self.writers[session_id] = _Writer(lease=lease, lock_fd=fd)
        return lease

    async def lease_holder(self, session_id: str) -> LeaseHolder | None:
        """Who holds the session's file lock (this process, or another one)."""
        writer = self.writers.get(session_id)
        if writer is not None:
            return LeaseHolder(owner=writer.lease.owner, expires_at_ms=None)
        _, lock = self._paths(session_id)
        owner: str | None = await self.run(_lock_holder, lock)
        return None if owner is None else LeaseHolder(owner=owner, expires_at_ms=None)

    async def renew_lease(self, lease: WriterLease) -> WriterLease:
        """An OS lock does not lapse: renewing only confirms the lease is current."""
        writer = self.writers.get(lease.session_id)
        if writer is None or writer.lease.token != lease.token:
            raise LeaseLost(f"writer lease {lease.token} on {lease.session_id!r} is not current")
        return lease

    async def release_lease(self, lease: WriterLease) -> bool:
        """Unlock the session if `lease` is current."""
        writer = self.writers.get(lease.session_id)
        if writer is None or writer.lease.token != lease.token:
            return False
        await self._drop_writer(lease.session_id)
        return True

    async def _drop_writer(self, session_id: str) -> None:
        writer = self.writers.pop(session_id)
        async with writer.write_lock:
            await self.run(_close_fds, writer.data_fd, writer.lock_fd)

    async def import_session(
        self, metadata: SessionMetadata, items: Iterable[LogItem]
    ) -> SessionMetadata:
        """Create a session file holding an exported log."""
        data, _ = self._paths(metadata.id)
        state = replay_log(metadata, items)
        lines = [_header(state.metadata)] + [sealed(encode_log_item(item)) for item in state.log]
        await self.run(_publish, self.directory, data, lines, self.fsync != "never")
        return state.metadata

    async def close(self) -> None:
        """Release every lock this repository holds and stop its I/O thread."""
        if self.closed:
            return
        for session_id in list(self.writers):
            await self._drop_writer(session_id)
        await self._io.close()


# -- blocking file work, run on the repository's I/O thread ---------------------------------


def _header(meta: SessionMetadata) -> str:
    payload = meta.model_dump(mode="json", exclude={"name"})
    return json.dumps(
        {"kind": "header", "format": _FORMAT, "metadata": payload}, ensure_ascii=False
    )


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _publish(directory: Path, path: Path, lines: list[str], fsync_dir: bool) -> None:
    """Write a complete file under a temporary name and link it into place (exclusive create)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # the owner's alone, as the SQLite files (D343): a session holds every conversation
    descriptor = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(("\n".join(lines) + "\n").encode())
        handle.flush()
        os.fsync(handle.fileno())
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise SessionError("already_exists", f"session {path.stem!r} already exists") from None
    finally:
        tmp.unlink(missing_ok=True)
    if fsync_dir:
        _fsync_dir(directory)


def _append_line(fd: int, line: bytes, fsync: bool) -> None:
    written = os.write(fd, line)
    if written != len(line):  # a short write is a torn line: refuse to go on
        raise SessionError("storage", f"short write ({written} of {len(line)} bytes)")
    if fsync:
        fsync_fd(fd)


def fsync_fd(fd: int) -> None:
    """fsync(2) a session file's lines (every such fsync goes through here).

    The power-loss simulation (tests/harness_core/test_power_loss.py) sees each instant.
    """
    os.fsync(fd)


def _open_append(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND)


def _load(path: Path, writer: bool) -> SessionState:
    """Replay a session file; a writer truncates a torn tail (a final line without newline)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SessionError("not_found", f"session {path.stem!r} does not exist") from None
    lines = raw.split(b"\n")
    torn = lines.pop()  # b"" when the file ends with a newline
    if not lines:
        raise StoreCorrupted(f"{path} has no complete header line", location=f"{path}:1")
    meta = _parse_header(lines[0], path)
    state = SessionState(meta)
    good_end = len(lines[0]) + 1
    with collector_paused(len(lines)):
        good_end = _replay(path, lines, state, good_end)
    if torn and writer:
        with open(path, "r+b") as handle:
            handle.truncate(good_end)
            handle.flush()
            os.fsync(handle.fileno())
    return state


def _replay(path: Path, lines: list[bytes], state: SessionState, good_end: int) -> int:
    """Apply the log lines after the header to `state`; return the end of the last good one."""
    for number, line in enumerate(lines[1:], start=2):
        location = f"{path}:{number}"
        encoded, trusted = unsealed(line, location)
        if trusted:  # the checksum vouches for what the writer validated and checked
            item = trusted_log_item(encoded, location)
        else:
            try:
                item = log_item_adapter.validate_json(encoded)
            except ValidationError as exc:
                raise StoreCorrupted(
                    f"malformed line {location}: {exc.errors()[:1]}", location=location
                ) from exc
        try:
            state.check_replay(item, encoded=trusted)
        except SessionError as exc:
            raise StoreCorrupted(f"inconsistent line {location}: {exc}", location=location) from exc
        state.apply(item)
        good_end += len(line) + 1
    return good_end


def _parse_header(line: bytes, path: Path) -> SessionMetadata:
    location = f"{path}:1"
    try:
        header = json.loads(line)
        if header.get("kind") != "header" or header.get("format") not in _FORMATS:
            raise ValueError(f"not a {' or '.join(_FORMATS)} header")
        return SessionMetadata.model_validate(header["metadata"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StoreCorrupted(f"bad header in {location}: {exc}", location=location) from exc


@dataclass(frozen=True)
class _LeftOut:
    """A ``.jsonl`` file of the store's directory that no session is read from, and why."""

    location: str
    why: str


def _session_header(first: bytes, path: Path) -> SessionMetadata | _LeftOut | None:
    """A session file's metadata from its first line (None: being published).

    A file whose header does not parse, or that names another session than its file name
    (a copy, a renamed file), is left out: the store opens ``<id>.jsonl`` only. One bad file
    failed the whole listing, and a copy was listed as a second session (an outside probe).
    """
    if not first.endswith(b"\n"):
        return None
    try:
        meta = _parse_header(first.rstrip(b"\n"), path)
    except StoreCorrupted as exc:
        why = f": {exc.__cause__}" if exc.__cause__ is not None else ""
        return _LeftOut(f"{path}:1", f"bad header{why} (left out of the store)")
    if meta.id != path.stem:
        return _LeftOut(
            str(path),
            f"holds session {meta.id!r} but only {meta.id}.jsonl is read as it "
            "(a copy or a renamed file: left out of the store)",
        )
    return meta


def _list(directory: Path) -> list[SessionMetadata]:
    metas: list[SessionMetadata] = []
    if not directory.exists():
        return metas
    for path in sorted(directory.glob("*.jsonl")):
        name: str | None = None
        with open(path, "rb") as handle:
            first = handle.readline()
            meta = _session_header(first, path)
            if not isinstance(meta, SessionMetadata):
                continue  # being published, or left out (`gateway store check` names it)
            for line in handle:
                if not line.endswith(b"\n"):
                    break  # a torn tail was never acknowledged
                if line.startswith(_SEAL):
                    line = b"{" + line[_SEALED_AT:]
                if line.startswith(b'{"kind":"fact"') and b'"fact":"name"' in line:
                    with contextlib.suppress(ValueError):
                        name = json.loads(line)["fact"]["name"]
        metas.append(meta.model_copy(update={"name": name}))
    return metas


def _lock(data: Path, lock: Path, owner: str, session_id: str) -> tuple[int, int]:
    if not data.exists():
        raise SessionError("not_found", f"session {session_id!r} does not exist")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_lock(fd).get("owner", "another process")
        os.close(fd)
        raise LeaseHeld(
            f"session {session_id!r} is locked by {holder!r}", owner=str(holder), expires_at_ms=None
        ) from None
    try:
        return fd, _bump_fence(fd, owner)
    except BaseException:
        os.close(fd)
        raise


def _lock_holder(lock: Path) -> str | None:
    """The owner named in a lock file another process holds locked (None: not locked)."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return str(_read_lock(fd).get("owner", "another process"))
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _read_lock(fd: int) -> dict[str, Any]:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 4096)
    try:
        value = json.loads(raw) if raw.strip() else {}
    except ValueError:
        value = {}
    return value if isinstance(value, dict) else {}


def _bump_fence(fd: int, owner: str) -> int:
    token = int(_read_lock(fd).get("fence", 0)) + 1
    payload = json.dumps({"fence": token, "owner": owner, "pid": os.getpid()}).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, payload, 0)
    os.fsync(fd)
    return token


def _close_fds(*fds: int | None) -> None:
    for fd in fds:
        if fd is not None:
            os.close(fd)  # closing the lock file's descriptor releases the flock


def _delete(data: Path, lock: Path) -> bool:
    if not data.exists():
        return False
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_lock(fd).get("owner", "another process")
            raise LeaseHeld(
                f"session {data.stem!r} is locked by {holder!r}",
                owner=str(holder),
                expires_at_ms=None,
            ) from None
        data.unlink()
        lock.unlink(missing_ok=True)
        return True
    finally:
        os.close(fd)
