"""The SQLite family, written once: the connection policy, the I/O thread, the reads on the loop.

The session store, the broker and the web mailbox each keep their own tables in their own file;
how such a file is opened and used is the same for all three (D13, D117, D118, D121, D191):

* `ConnectionPolicy`: WAL, ``synchronous`` (``normal`` survives a process crash; ``effects``, the
  default, also survives power loss at each durability point, `Database.durable`; ``full``
  fsyncs every commit), a busy timeout, and the page size of a database it creates. No schema
  declares a foreign key, so the policy leaves SQLite's default (off).
* `Database`: one connection opened under the policy on the owner's I/O thread (its directory
  created first), its schema set up by the owner (`setup`), snapshot reads, write transactions
  and group commits in savepoints. It is shared with the event loop for work that never waits
  (`BusyTimeout` switches the wait for another connection's lock off there), never by both at
  once.
* `SqliteExecutor`: the owner's thread (`IoThread`: FIFO, the one close/cancel discipline), the
  connection opened there on first use, every SQLite or file-system failure turned into the
  owner's error, and `read`: on the loop when the thread is idle (D118), on a second, read-only
  connection (`CommittedReader`) when it works and what is committed is all that was
  acknowledged (D121), else on the thread.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Generic, Literal, TypeVar, cast

from harness_core.backends.io_thread import IoThread

__all__ = [
    "BusyTimeout",
    "CommittedReader",
    "ConnectionPolicy",
    "Database",
    "is_busy",
    "open_read_only",
    "SqliteExecutor",
    "fsync_file",
    "Synchronous",
    "SYNCHRONOUS",
    "unless_busy",
]

_T = TypeVar("_T")
_D = TypeVar("_D", bound="Database")

Synchronous = Literal["normal", "effects", "full"]
SYNCHRONOUS: Final[tuple[Synchronous, ...]] = ("normal", "effects", "full")
"""Every ``synchronous`` setting, weakest first (``effects`` is the default, D233)."""

_SQLITE_BUSY: Final = 5
_SQLITE_READONLY: Final = 8
_SQLITE_CANTOPEN: Final = 14
_SQLITE_LOCKED: Final = 6
_PAGE_SIZES = frozenset(2**n for n in range(9, 17))


@dataclass(frozen=True, kw_only=True)
class ConnectionPolicy:
    """How a backend's connections to its SQLite file are opened.

    Raises:
        ValueError: `synchronous` is not ``normal``, ``effects`` or ``full``, or `page_size` is
            not a power of two from 512 to 65536.
    """

    synchronous: Synchronous = "effects"
    """``normal``: a process crash loses nothing acknowledged (power loss may lose the last
    transactions); ``effects``: as ``normal``, and every durability point (`Database.durable`:
    an acknowledgement, an effect that must not repeat) fsyncs the WAL, so power loss loses
    only what no durability point covered yet; ``full``: every commit fsyncs (SQLite's
    ``synchronous=FULL``)."""
    busy_timeout_ms: int = 10_000
    """How long a statement on the I/O thread waits for another connection's lock."""
    page_size: int | None = None
    """The page size of a database this connection creates (None: SQLite's default, 4 KiB);
    an existing database keeps its own."""
    reads_only: bool = False
    """The owner only reads (``gateway store``): a file it cannot write is opened read-only
    (`open_read_only`) instead of refused, and no directory or file is created (D394)."""

    def __post_init__(self) -> None:
        if self.synchronous not in SYNCHRONOUS:
            raise ValueError(
                f"synchronous must be 'normal', 'effects' or 'full', got {self.synchronous!r}"
            )
        if self.page_size is not None and self.page_size not in _PAGE_SIZES:
            raise ValueError(
                f"page_size must be a power of two from 512 to 65536, got {self.page_size!r}"
            )


def is_busy(exc: sqlite3.Error) -> bool:
    """Whether SQLite refused for a lock another connection holds (busy or locked)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)


def unless_busy(read: Callable[[], _T]) -> tuple[bool, _T | None]:
    """Run `read`, never waiting: (True, its result) or (False, None).

    (False, None) when another connection's lock stood in the way: the caller then reads on its
    I/O thread, which waits.
    """
    try:
        return True, read()
    except sqlite3.OperationalError as exc:
        if is_busy(exc):
            return False, None
        raise


class BusyTimeout:
    """The connection's busy timeout: the configured one on the I/O thread, zero on the loop.

    The pragma runs only when the setting changes: a lane whose writes and reads run on the
    loop and whose commits run on the thread pays two per batch.
    """

    def __init__(self, conn: sqlite3.Connection, ms: int) -> None:
        self._conn = conn
        self.ms = int(ms)
        self._now = -1

    def waits(self, wait: bool) -> None:
        """Let the next statements wait for another connection's lock (I/O thread), or not."""
        ms = self.ms if wait else 0
        if self._now != ms:
            self._conn.execute(f"PRAGMA busy_timeout={ms}")
            self._now = ms


class CommittedReader:
    """A second, read-only connection for the loop: snapshots of what is committed (D121).

    Opened on first use; it never waits for a lock and cannot write. An in-memory database has
    none (a second connection would open another database): every read is refused.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._conn: sqlite3.Connection | None = None

    def read(self, fn: Callable[[sqlite3.Connection], _T]) -> tuple[bool, _T | None]:
        """`fn` in one snapshot, never waiting: as `unless_busy`."""
        if str(self._path) == ":memory:":
            return False, None
        if self._conn is None:
            self._conn = sqlite3.connect(self._path, isolation_level=None)
            self._conn.execute("PRAGMA busy_timeout=0")
            self._conn.execute("PRAGMA query_only=1")
        conn = self._conn

        def snapshot() -> _T:
            conn.execute("BEGIN")
            try:
                return fn(conn)
            finally:
                conn.execute("COMMIT")

        return unless_busy(snapshot)

    def close(self) -> None:
        """Close the connection (a later read opens it again)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def fsync_file(path: Path) -> None:
    """fsync(2) a file or directory by path (a WAL's frames, a new file's directory entry).

    One function for every fsync the SQLite family makes itself, so the power-loss simulation
    (tests/harness_core/test_power_loss.py) can see each instant a file became durable.
    A missing file has nothing to make durable.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Database:
    """One connection to a SQLite file, opened under a `ConnectionPolicy` (on the I/O thread).

    The file's directory is created first (not for ``:memory:``); then the busy timeout, the
    page size of a new database, WAL and ``synchronous``; then `setup`, the owner's schema. If
    any of it fails the connection is closed and the error raised. Autocommit mode
    (``isolation_level=None``): every transaction is explicit.

    The connection is used on the owner's I/O thread and, for work that never waits, on the
    event loop while that thread is idle: never by both at once (`SqliteExecutor` keeps that
    rule), hence ``check_same_thread=False``.
    """

    def __init__(self, path: Path, policy: ConnectionPolicy) -> None:
        self.path = path
        self._points = policy.synchronous == "effects" and str(path) != ":memory:"
        """Durability points fsync the WAL themselves (``effects``)."""
        self._unsynced = False
        """A commit since the last durability point (``effects``): the WAL needs an fsync."""
        self._changes = 0
        """The connection's count of changed rows at the last commit (`committed`)."""
        self._dir_synced = False
        """The WAL's directory entry was fsynced (once per connection: the WAL is created)."""
        self.read_only = False
        """Opened read-only: a reader cannot write the file (`ConnectionPolicy.reads_only`)."""
        self.reads_only = policy.reads_only
        """The caller only reads: nothing may be created or upgraded, even where it could be."""
        if str(path) != ":memory:" and not policy.reads_only:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            _private(path)
        try:
            self.conn, self.busy = _read_write(path, policy)
        except (sqlite3.OperationalError, OSError) as exc:
            if not policy.reads_only or not _cannot_write(exc):
                raise
            self.conn = open_read_only(path)
            self.busy = BusyTimeout(self.conn, policy.busy_timeout_ms)
            self.read_only = True
        try:
            self.setup()
        except BaseException:
            self.conn.close()
            raise

    def setup(self) -> None:
        """Create or check the owner's schema (once, right after the pragmas; a no-op here)."""

    def read(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run reads in one transaction (a consistent snapshot)."""
        self.conn.execute("BEGIN")
        try:
            return fn(self.conn)
        finally:
            self.conn.execute("COMMIT")

    def read_unless_busy(self, fn: Callable[[sqlite3.Connection], _T]) -> tuple[bool, _T | None]:
        """`read` without waiting: (False, None) if another connection's lock stood in the way.

        A WAL reader waits only in rare moments (another connection recovering the WAL, or
        restarting it); then the caller goes to the I/O thread, which waits the configured time.
        """
        self.busy.waits(False)
        return unless_busy(lambda: self.read(fn))

    @contextlib.contextmanager
    def transaction(self, *, point: bool = True) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction: committed on success, rolled back on any error.

        `point`: the commit is a durability point (`durable`), the default: whoever called
        may acknowledge it.
        """
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")
        self.committed(point=point)

    def committed(self, *, point: bool) -> None:
        """Note a commit; at a durability point make every commit so far survive power loss.

        A commit that changed no row (a schema check at open, a read in a write transaction)
        leaves nothing new to make durable: no fsync for it.
        """
        changes = self.conn.total_changes
        if changes != self._changes:
            self._changes = changes
            self._unsynced = True
        if point:
            self.durable()

    def durable(self) -> None:
        """A durability point: every commit so far survives power loss from here on.

        Only ``effects`` has work to do (``full`` fsynced each commit, ``normal`` promises
        no more than a process crash): the WAL, where every commit since the last checkpoint
        lives, is fsynced once for all the commits since the last point, which is what
        ``synchronous=FULL`` would have done at each of them. SQLite's own checkpoints fsync
        the WAL before copying it into the database and the database after, so what they
        move stays durable.
        """
        if not self._points or not self._unsynced:
            return
        fsync_file(Path(f"{self.path}-wal"))
        if not self._dir_synced:  # the WAL was created by this connection's first write
            fsync_file(self.path.parent)
            self._dir_synced = True
        self._unsynced = False

    @property
    def points(self) -> bool:
        """Whether durability points fsync the WAL themselves (``effects`` on a file)."""
        return self._points

    def owes_point(self, point: bool) -> bool:
        """Whether a durability point now has an fsync to make (read on the loop, a hint)."""
        return point and self._points and self._unsynced

    def group(
        self, ops: Sequence[Callable[[sqlite3.Connection], Any]], *, point: bool = True
    ) -> list[Any]:
        """Run queued mutations in one transaction (group commit); one result or error each.

        With more than one, each runs in its own savepoint: one that raises is rolled back and
        its exception is its result, while the others commit. A lone one's error is raised. If
        the commit fails, none of them happened and the error is raised for all. `point`: the
        commit is a durability point (`durable`), the default.
        """
        conn = self.conn
        results: list[Any] = []
        conn.execute("BEGIN IMMEDIATE")
        try:
            if len(ops) == 1:
                results.append(ops[0](conn))
            else:
                for op in ops:
                    conn.execute("SAVEPOINT op")
                    try:
                        results.append(op(conn))
                    except Exception as exc:
                        conn.execute("ROLLBACK TO op")
                        results.append(exc)
                    conn.execute("RELEASE op")
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        self.committed(point=point)
        return results

    def close(self) -> None:
        """Close the connection (on the I/O thread, after every call on it)."""
        self.conn.close()


class SqliteExecutor(Generic[_D]):
    """A SQLite file's I/O thread and its `Database`, opened there on first use.

    `open_db` builds the database on the thread (nothing exists before the first call);
    `failed(exc)` is the owner's error for what SQLite or the file system refused, raised from
    `exc`; `closed_error()` the one every call after `close` raises. `name` names the thread.
    """

    def __init__(
        self,
        path: Path,
        open_db: Callable[[], _D],
        *,
        name: str,
        failed: Callable[[Exception], Exception],
        closed_error: Callable[[], Exception],
    ) -> None:
        self.path = path
        self.thread = IoThread(name, closed_error)
        self.db: _D | None = None
        """The database once the thread opened it (the loop may use it only while not `busy`)."""
        self._open = open_db
        self._failed = failed
        self._reader = CommittedReader(path)
        """Used only on the loop (`read`)."""

    @property
    def closed(self) -> bool:
        """Whether `close` was called: every call since raised the owner's closed error."""
        return self.thread.closed

    @property
    def busy(self) -> bool:
        """Whether the thread has work (the loop must not use the connection meanwhile)."""
        return self.thread.busy

    async def call(self, fn: Callable[[_D], _T]) -> _T:
        """Run `fn` with the database on the thread (FIFO), where it may wait for locks.

        Raises:
            Exception: the owner's closed error after `close`; `failed(exc)` for a
                `sqlite3.Error` or `OSError` (opening included); else what `fn` raised.
        """

        def run() -> _T:
            try:
                if self.db is None:
                    self.db = self._open()
                self.db.busy.waits(True)
                return fn(self.db)
            except (sqlite3.Error, OSError) as exc:
                raise self._failed(exc) from exc

        return await self.thread.call(run)

    def on_loop(self, fn: Callable[[_D], _T]) -> _T | None:
        """Run `fn` with the database on the loop, now; None if it must go to the thread.

        None while the database is not open yet, the thread works, or after `close`: the
        connection is never used by both at once. `fn` must not wait (see `Database`).

        Raises:
            Exception: `failed(exc)` for a `sqlite3.Error`; else what `fn` raised.
        """
        db = self.db
        if db is None or self.busy or self.closed:
            return None
        try:
            return fn(db)
        except sqlite3.Error as exc:
            raise self._failed(exc) from exc

    async def read(
        self,
        fn: Callable[[sqlite3.Connection], _T],
        *,
        inline: bool = True,
        committed: bool = True,
    ) -> _T:
        """Run reads in one snapshot: on the loop when it can, else on the thread.

        A read of a few rows costs less than the hop to the thread and back (D118), and more
        still when it would queue behind a commit's fsync there. While the thread is idle the
        read runs on the loop on the connection itself; while the thread works, on a second,
        read-only connection if `committed` (the owner says what is committed is all that was
        acknowledged to this reader, D121). Neither waits for a lock: one met sends the read to
        the thread, which waits. `inline=False` keeps an unbounded read on the thread.

        Raises:
            Exception: as `call`.
        """
        db = self.db
        if inline and db is not None and not self.closed:
            try:
                if not self.busy:
                    done, result = db.read_unless_busy(fn)
                elif committed and not db.read_only:  # a read-only one has no writes to wait for
                    done, result = self._reader.read(fn)
                else:
                    done, result = False, None
            except sqlite3.Error as exc:
                raise self._failed(exc) from exc
            if done:
                return cast(_T, result)
        return await self.call(lambda db: db.read(fn))

    async def close(self) -> None:
        """Refuse new calls; close the database after the calls already submitted; stop the thread.

        Idempotent; completes even if its caller is cancelled (`IoThread.close`).
        """
        self._reader.close()

        def last() -> None:
            if self.db is not None:
                with contextlib.suppress(sqlite3.Error):  # closed all the same; nothing to say
                    self.db.close()
                self.db = None

        await self.thread.close(last)


def _read_write(path: Path, policy: ConnectionPolicy) -> tuple[sqlite3.Connection, BusyTimeout]:
    """The read-write connection and its busy timeout, its pragmas set (closed if any fails)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        busy = BusyTimeout(conn, policy.busy_timeout_ms)
        busy.waits(True)
        if policy.page_size is not None:
            # before anything writes the header (WAL mode does); a no-op on an existing file
            conn.execute(f"PRAGMA page_size={int(policy.page_size)}")
        conn.execute("PRAGMA journal_mode=WAL")
        pragma = "FULL" if policy.synchronous == "full" else "NORMAL"
        conn.execute(f"PRAGMA synchronous={pragma}")
    except BaseException:
        conn.close()
        raise
    return conn, busy


def _cannot_write(exc: sqlite3.Error | OSError) -> bool:
    """Whether SQLite or the file system refused for want of write access (EROFS, EACCES)."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (_SQLITE_READONLY, _SQLITE_CANTOPEN)


def open_read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection to a WAL database in a place this process cannot write (D394).

    SQLite reads a WAL database read-only (``mode=ro``) only where it can open or create the
    ``-shm`` file. Where it cannot (a read-only file system, another user's directory), the
    file alone is read (``immutable=1``) if no ``-wal`` file holds commits not yet in it;
    nothing can write there meanwhile. A ``-wal`` that does is refused: read without it, its
    commits would silently be missing.

    Raises:
        sqlite3.OperationalError: the file cannot be opened, or its ``-wal`` holds commits.
    """
    uri = "file:" + urllib.parse.quote(str(path.absolute()))
    try:
        return _reading(uri + "?mode=ro")
    except sqlite3.OperationalError as exc:
        if not _cannot_write(exc):
            raise
    wal = Path(f"{path}-wal")
    if wal.exists() and wal.stat().st_size > 0:
        raise sqlite3.OperationalError(
            f"{wal} holds commits not yet in the file, and SQLite reads them only where it "
            "can write (read it as the gateway's user, or copy the directory somewhere writable)"
        )
    return _reading(uri + "?immutable=1")


def _reading(uri: str) -> sqlite3.Connection:
    """A connection to `uri`, proven by a first read (SQLite opens the file lazily)."""
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA query_only=1")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except BaseException:
        conn.close()
        raise
    return conn


def _private(path: Path) -> None:
    """Create `path` readable by its owner only, unless it exists.

    SQLite gives its WAL and shared-memory files the database's permissions. A database holds
    every conversation, tool argument and supplied result: with the umask's 0644 any local
    user could read them, while the operator token beside it is 0600.
    """
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        pass
    except OSError:
        return  # not creatable here: sqlite3 says why, in its own words
