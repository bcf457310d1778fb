"""Session storage backends (memory, JSONL, SQLite, Redis Streams) and `open_repo(url)`.

URLs (paths follow SQLAlchemy's convention: three slashes and a relative path, four for an
absolute one):

* ``memory://`` - in this process only (the reference backend; tests and demos).
* ``jsonl:///sessions`` or ``jsonl:////var/lib/gw/sessions`` - one file per session in a
  directory; ``?fsync=effects`` (the default: every write survives a process crash, and power
  loss at each durability point, D233), ``always`` (fsync every write) or ``never``.
* ``sqlite:///gateway.db`` or ``sqlite:////var/lib/gw/gateway.db`` - the embedded default;
  ``?synchronous=effects`` (the default: every commit survives a process crash, and power loss
  at each durability point, D233), ``full`` (fsync every commit) or ``normal`` (never fsync).
* ``redis://host:6379/0`` (or ``rediss://`` for TLS) - the distributed default;
  ``?prefix=gw`` sets the key prefix (default ``gw``).
* ``redis+cluster://host:6379`` (or ``rediss+cluster://``) - the same on a Redis Cluster, through
  one startup node (the path is empty or ``/0``: a cluster has database 0 only); ``?prefix=``
  as for ``redis://``.

Anything else (an empty path, a path naming the wrong kind of thing, a bad port or database
number, an unknown option) is refused with ``SessionError("invalid_query")`` naming these forms,
before anything is created. Each family's URLs are parsed by `harness_core.backends.urls`, the
same parser the broker and the web mailbox use; a backend here is one `Openers.add` line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, cast

from harness_core.backends.urls import (
    JsonlUrls,
    MemoryUrl,
    MemoryUrls,
    Openers,
    PathUrl,
    RedisUrl,
    RedisUrls,
    SqliteUrls,
    shown,
)
from harness_core.clock import Clock
from harness_core.errors import SessionError
from harness_core.ids import IdGenerator

if TYPE_CHECKING:
    from harness_core.backends.sqlite import Synchronous
    from harness_core.session.contract import SessionRepo
    from harness_core.storage.jsonl import FsyncPolicy

__all__ = ["check_repo_url", "open_repo"]

ACCEPTED_URLS = (
    "accepted store URLs: memory://; jsonl:///relative/dir or jsonl:////absolute/dir "
    "[?fsync=effects|always|never]; sqlite:///relative.db or sqlite:////absolute.db "
    "[?synchronous=effects|full|normal]; redis://host:port/db or rediss://host:port/db "
    "[?prefix=name]; "
    "redis+cluster://host:port or rediss+cluster://host:port [?prefix=name]"
)


_FSYNC: Final = ("effects", "always", "never")
_SYNCHRONOUS: Final = ("effects", "full", "normal")


def _refuse(url: str, why: str | None) -> SessionError:
    what = f"store URL {shown(url)}: {why}" if why else f"unsupported store URL {shown(url)}"
    return SessionError("invalid_query", f"{what}; {ACCEPTED_URLS}")


@dataclass(frozen=True)
class _Given:
    """What `open_repo`'s caller gives every backend."""

    clock: Clock | None
    ids: IdGenerator | None
    reads_only: bool = False


def _memory(_: MemoryUrl, given: _Given) -> SessionRepo:
    from harness_core.storage.memory import MemorySessionRepo

    return MemorySessionRepo(clock=given.clock, ids=given.ids)


def _jsonl(url: PathUrl, given: _Given) -> SessionRepo:
    from harness_core.storage.jsonl import JsonlSessionRepo

    fsync = cast("FsyncPolicy", url.options.get("fsync", "effects"))
    return JsonlSessionRepo(url.path, fsync=fsync, clock=given.clock, ids=given.ids)


def _sqlite(url: PathUrl, given: _Given) -> SessionRepo:
    from harness_core.storage.sqlite import SqliteSessionRepo

    synchronous = cast("Synchronous", url.options.get("synchronous", "effects"))
    return SqliteSessionRepo(
        url.path,
        synchronous=synchronous,
        clock=given.clock,
        ids=given.ids,
        reads_only=given.reads_only,
    )


def _redis(url: RedisUrl, given: _Given) -> SessionRepo:
    from harness_core.storage.redis_streams import RedisSessionRepo

    return RedisSessionRepo(
        url.server, prefix=url.prefix, cluster=url.cluster, clock=given.clock, ids=given.ids
    )


_OPENERS: Openers[SessionRepo, _Given] = Openers(_refuse)
_OPENERS.add(MemoryUrls(), _memory)
_OPENERS.add(JsonlUrls(options={"fsync": _FSYNC}), _jsonl)
_OPENERS.add(SqliteUrls(options={"synchronous": _SYNCHRONOUS}, memory_ok=True), _sqlite)
_OPENERS.add(RedisUrls(default_prefix="gw"), _redis)


def open_repo(
    url: str,
    *,
    clock: Clock | None = None,
    ids: IdGenerator | None = None,
    reads_only: bool = False,
) -> SessionRepo:
    """Open a session repository from a URL (see the module docstring for the forms).

    Nothing is created or contacted here; a store appears on first use. `reads_only`: the
    caller only reads (``gateway store``): a SQLite file this process cannot write (a
    read-only file system, another user's directory) is read-only instead of refused (D394);
    the other backends read without writing anyway.

    Raises:
        SessionError: ``invalid_query`` for an unknown scheme, a malformed path, host, port or
            database number, a path of the wrong kind, or an unknown option; the message names
            the accepted forms.
    """
    return _OPENERS.open(url, _Given(clock, ids, reads_only))


def check_repo_url(url: str) -> None:
    """Refuse a URL `open_repo` would refuse, building nothing (a setting checked at start).

    Raises:
        SessionError: ``invalid_query``, as `open_repo` raises it.
    """
    _OPENERS.check(url)
