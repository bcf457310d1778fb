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
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit, urlunsplit

from harness_core.clock import Clock
from harness_core.errors import SessionError
from harness_core.ids import IdGenerator

if TYPE_CHECKING:
    from harness_core.session.contract import SessionRepo

__all__ = ["open_repo"]


def _path(url: str, scheme: str) -> str:
    rest = url[len(scheme) + 3 :]  # after "scheme://"
    if not rest.startswith("/") or rest == "/":
        raise SessionError(
            "invalid_query", f"{url!r}: expected {scheme}:///relative or {scheme}:////absolute"
        )
    return rest[1:].split("?", 1)[0]


def _options(url: str, allowed: dict[str, tuple[str, ...]]) -> dict[str, str]:
    query = parse_qs(urlsplit(url).query, keep_blank_values=True, strict_parsing=False)
    options: dict[str, str] = {}
    for key, values in query.items():
        if key not in allowed:
            raise SessionError(
                "invalid_query", f"{url!r}: unknown option {key!r} (known: {sorted(allowed)})"
            )
        value = values[-1]
        if allowed[key] and value not in allowed[key]:
            raise SessionError(
                "invalid_query", f"{url!r}: {key} must be one of {allowed[key]}, got {value!r}"
            )
        options[key] = value
    return options


def open_repo(
    url: str, *, clock: Clock | None = None, ids: IdGenerator | None = None
) -> SessionRepo:
    """Open a session repository from a URL (see the module docstring for the forms).

    Raises:
        SessionError: ``invalid_query`` for an unknown scheme, a malformed path or an unknown
            option; the message names what is accepted.
    """
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        from harness_core.storage.memory import MemorySessionRepo

        _options(url, {})
        return MemorySessionRepo(clock=clock, ids=ids)
    if scheme == "jsonl":
        from harness_core.storage.jsonl import JsonlSessionRepo

        opts = _options(url, {"fsync": ("never", "always")})
        always = opts.get("fsync") == "always"
        return JsonlSessionRepo(
            _path(url, scheme), fsync="always" if always else "never", clock=clock, ids=ids
        )
    if scheme == "sqlite":
        from harness_core.storage.sqlite import SqliteSessionRepo

        opts = _options(url, {"synchronous": ("normal", "full")})
        full = opts.get("synchronous") == "full"
        return SqliteSessionRepo(
            _path(url, scheme), synchronous="full" if full else "normal", clock=clock, ids=ids
        )
    if scheme in ("redis", "rediss"):
        from harness_core.storage.redis_streams import RedisSessionRepo

        opts = _options(url, {"prefix": ()})
        parts = urlsplit(url)
        server = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
        return RedisSessionRepo(server, prefix=opts.get("prefix") or "gw", clock=clock, ids=ids)
    raise SessionError(
        "invalid_query",
        f"unsupported store URL {url!r}: use memory://, jsonl:///dir, sqlite:///file.db or redis://host:port/db",
    )
