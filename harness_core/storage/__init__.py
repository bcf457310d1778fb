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

from typing import TYPE_CHECKING

from harness_core.clock import Clock
from harness_core.errors import SessionError
from harness_core.ids import IdGenerator
from harness_core.storage._batch import WriteQueue
from harness_core.storage.urls import UrlRules, without_password

if TYPE_CHECKING:
    from harness_core.session.contract import SessionRepo

__all__ = ["open_repo", "WriteQueue"]

ACCEPTED_URLS = (
    "accepted store URLs: memory://; jsonl:///relative/dir or jsonl:////absolute/dir "
    "[?fsync=never|always]; sqlite:///relative.db or sqlite:////absolute.db "
    "[?synchronous=normal|full]; redis://host:port/db or rediss://host:port/db [?prefix=name]; "
    "redis+cluster://host:port or rediss+cluster://host:port [?prefix=name]"
)


def _refuse(url: str, why: str | None) -> SessionError:
    shown = without_password(url)  # errors are printed and logged
    what = f"store URL {shown!r}: {why}" if why else f"unsupported store URL {shown!r}"
    return SessionError("invalid_query", f"{what}; {ACCEPTED_URLS}")


_url_rules = UrlRules(_refuse)


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

        _url_rules.options(url, {})
        return MemorySessionRepo(clock=clock, ids=ids)
    if scheme == "jsonl":
        from harness_core.storage.jsonl import JsonlSessionRepo

        path = _url_rules.path(url, scheme, directory=True)
        opts = _url_rules.options(url, {"fsync": ("never", "always")})
        always = opts.get("fsync") == "always"
        return JsonlSessionRepo(path, fsync="always" if always else "never", clock=clock, ids=ids)
    if scheme == "sqlite":
        from harness_core.storage.sqlite import SqliteSessionRepo

        path = _url_rules.path(url, scheme, directory=False, memory_ok=True)
        opts = _url_rules.options(url, {"synchronous": ("normal", "full")})
        full = opts.get("synchronous") == "full"
        return SqliteSessionRepo(
            path, synchronous="full" if full else "normal", clock=clock, ids=ids
        )
    if scheme in ("redis", "rediss", "redis+cluster", "rediss+cluster"):
        from harness_core.storage.redis_streams import RedisSessionRepo

        base, _, variant = scheme.partition("+")
        cluster = variant == "cluster"
        server = _url_rules.redis_server(url, scheme=base, cluster=cluster)
        prefix = _url_rules.prefix(url, "gw")
        return RedisSessionRepo(server, prefix=prefix, cluster=cluster, clock=clock, ids=ids)
    raise _refuse(url, None)
