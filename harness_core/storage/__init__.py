"""Session storage backends (memory, JSONL, SQLite, Redis Streams) and `open_repo(url)`.

URLs (paths follow SQLAlchemy's convention: three slashes and a relative path, four for an
absolute one):

* ``memory://`` - in this process only (the reference backend; tests and demos).
* ``jsonl:///sessions`` or ``jsonl:////var/lib/gw/sessions`` - one file per session in a
  directory; ``?fsync=always`` to fsync every write (default ``never``: survives a process crash).
* ``sqlite:///gateway.db`` or ``sqlite:////var/lib/gw/gateway.db`` - the embedded default;
  ``?synchronous=full`` to fsync every commit (default ``normal``: survives a process crash).
* ``redis://host:6379/0`` (or ``rediss://`` for TLS) - the distributed default;
  ``?prefix=gw`` sets the key prefix (default ``gw``).
* ``redis+cluster://host:6379`` (or ``rediss+cluster://``) - the same on a Redis Cluster, through
  one startup node (the path is empty or ``/0``: a cluster has database 0 only); ``?prefix=``
  as for ``redis://``.

Anything else (an empty path, a path naming the wrong kind of thing, a bad port or database
number, an unknown option) is refused with ``SessionError("invalid_query")`` naming these forms,
before anything is created.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit, urlunsplit

from harness_core.clock import Clock
from harness_core.errors import SessionError
from harness_core.ids import IdGenerator
from harness_core.storage._batch import WriteQueue

if TYPE_CHECKING:
    from harness_core.session.contract import SessionRepo

__all__ = ["open_repo", "WriteQueue"]

ACCEPTED_URLS = (
    "accepted store URLs: memory://; jsonl:///relative/dir or jsonl:////absolute/dir "
    "[?fsync=never|always]; sqlite:///relative.db or sqlite:////absolute.db "
    "[?synchronous=normal|full]; redis://host:port/db or rediss://host:port/db [?prefix=name]; "
    "redis+cluster://host:port or rediss+cluster://host:port [?prefix=name]"
)
_PREFIX = re.compile(r"^[^{}\s]+$")


def _refuse(url: str, why: str | None) -> SessionError:
    what = f"store URL {url!r}: {why}" if why else f"unsupported store URL {url!r}"
    return SessionError("invalid_query", f"{what}; {ACCEPTED_URLS}")


def _path(url: str, scheme: str, *, directory: bool) -> str:
    """The file-system path of a ``jsonl``/``sqlite`` URL, refused unless it names one.

    Nothing is created here: a URL that would put a store in the current directory by accident
    (an empty path), at the file-system root, or on top of something of the wrong kind (a file
    where a directory belongs, or the reverse) is refused before any backend exists.
    """
    location = url[len(scheme) + 3 :].split("?", 1)[0]  # after "scheme://"
    if not location.startswith("/"):
        raise _refuse(url, f"expected {scheme}:///relative or {scheme}:////absolute (no host)")
    path = location[1:]
    if scheme == "sqlite" and path == ":memory:":
        return path
    if directory:
        path = path.rstrip("/") or path
    if not path or path.endswith("/") or not Path(path).name:
        kind = "directory" if directory else "database file"
        raise _refuse(url, f"the path does not name a {kind}")
    target = Path(path)
    if target.exists() and target.is_dir() != directory:
        raise _refuse(url, f"{path} is {'not ' if directory else ''}a directory")
    for ancestor in target.parents:
        if ancestor.exists():
            if not ancestor.is_dir():
                raise _refuse(url, f"{ancestor} is not a directory")
            break
    return path


def _options(url: str, allowed: dict[str, tuple[str, ...]]) -> dict[str, str]:
    query = parse_qs(urlsplit(url).query, keep_blank_values=True, strict_parsing=False)
    options: dict[str, str] = {}
    for key, values in query.items():
        if key not in allowed:
            raise _refuse(url, f"unknown option {key!r} (known: {sorted(allowed)})")
        value = values[-1]
        if allowed[key] and value not in allowed[key]:
            raise _refuse(url, f"{key} must be one of {allowed[key]}, got {value!r}")
        options[key] = value
    return options


def _redis_server(url: str, base: str, *, cluster: bool) -> str:
    """The server part of a redis URL, as a `base` URL, refused unless host, port and db are sane.

    `base` is ``redis`` or ``rediss``; a cluster's database is 0 (an empty path or ``/0``).
    """
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise _refuse(url, "the port must be a number from 1 to 65535") from None
    if port is not None and not 1 <= port <= 65535:
        raise _refuse(url, "the port must be a number from 1 to 65535")
    if not parts.hostname:
        raise _refuse(url, "a host is required")
    if cluster and (parts.fragment or not re.fullmatch(r"/?|/0", parts.path)):
        raise _refuse(url, "a Redis Cluster has database 0 only: the path must be empty or /0")
    if parts.fragment or not re.fullmatch(r"/?|/\d+", parts.path):
        raise _refuse(url, "the path must be empty or a database number, like /0")
    return urlunsplit((base, parts.netloc, parts.path, "", ""))


def open_repo(
    url: str, *, clock: Clock | None = None, ids: IdGenerator | None = None
) -> SessionRepo:
    """Open a session repository from a URL (see the module docstring for the forms).

    Nothing is created or contacted here; a store appears on first use.

    Raises:
        SessionError: ``invalid_query`` for an unknown scheme, a malformed path, host, port or
            database number, a path of the wrong kind, or an unknown option; the message names
            the accepted forms.
    """
    scheme, separator, rest = url.partition("://")
    if not separator:
        raise _refuse(url, None)
    if scheme == "memory":
        if rest.split("?", 1)[0]:
            raise _refuse(url, "memory:// takes no host or path")
        from harness_core.storage.memory import MemorySessionRepo

        _options(url, {})
        return MemorySessionRepo(clock=clock, ids=ids)
    if scheme == "jsonl":
        from harness_core.storage.jsonl import JsonlSessionRepo

        path = _path(url, scheme, directory=True)
        opts = _options(url, {"fsync": ("never", "always")})
        always = opts.get("fsync") == "always"
        return JsonlSessionRepo(path, fsync="always" if always else "never", clock=clock, ids=ids)
    if scheme == "sqlite":
        from harness_core.storage.sqlite import SqliteSessionRepo

        path = _path(url, scheme, directory=False)
        opts = _options(url, {"synchronous": ("normal", "full")})
        full = opts.get("synchronous") == "full"
        return SqliteSessionRepo(
            path, synchronous="full" if full else "normal", clock=clock, ids=ids
        )
    if scheme in ("redis", "rediss", "redis+cluster", "rediss+cluster"):
        from harness_core.storage.redis_streams import RedisSessionRepo

        base, _, variant = scheme.partition("+")
        cluster = variant == "cluster"
        server = _redis_server(url, base, cluster=cluster)
        prefix = _options(url, {"prefix": ()}).get("prefix") or "gw"
        if not _PREFIX.match(prefix):
            raise _refuse(url, f"invalid redis key prefix {prefix!r} (no braces or spaces)")
        return RedisSessionRepo(server, prefix=prefix, cluster=cluster, clock=clock, ids=ids)
    raise _refuse(url, None)
