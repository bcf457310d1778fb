"""The broker: the inbox, the outbox, per-thread state and the audit trail (see `contract`).

`open_broker(url)` opens one (paths follow SQLAlchemy's convention, like the store's URLs: three
slashes and a relative path, four for an absolute one):

* ``sqlite:///.gateway/broker.db`` or ``sqlite:////var/lib/gw/broker.db`` - one file, one
  process (the embedded default); ``?synchronous=full`` to fsync every commit (default
  ``normal``: survives a process crash).
* ``redis://host:6379/0`` (or ``rediss://`` for TLS) - shared by any number of processes;
  ``?prefix=gwb`` sets the key prefix (default ``gwb``). ``redis+cluster://host:7000`` (or
  ``rediss+cluster://``) - the same on a Redis Cluster (every key hash-tagged by session or
  shard).

Anything else (an unknown scheme, an empty path, a path naming a directory, a bad port or
database number, an unknown option) is refused with ``BrokerError("invalid_url")`` naming these
forms, before anything is created or contacted.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

from gateway.broker.contract import Broker, BrokerError
from harness_core import Clock, IdGenerator

__all__ = ["ACCEPTED_BROKER_URLS", "BrokerError", "open_broker"]

ACCEPTED_BROKER_URLS = (
    "accepted broker URLs: sqlite:///relative.db or sqlite:////absolute.db "
    "[?synchronous=normal|full]; redis://host:port/db or rediss://host:port/db, or "
    "redis+cluster://host:port (rediss+cluster:// for TLS) [?prefix=name]"
)
_PREFIX = re.compile(r"^[^{}\s]+$")


def _refuse(url: str, why: str | None) -> BrokerError:
    what = f"broker URL {url!r}: {why}" if why else f"unsupported broker URL {url!r}"
    return BrokerError("invalid_url", f"{what}; {ACCEPTED_BROKER_URLS}")


def _sqlite_path(url: str) -> str:
    """The database file a ``sqlite`` URL names, refused unless it names one (creates nothing)."""
    location = url[len("sqlite://") :].split("?", 1)[0]
    if not location.startswith("/"):
        raise _refuse(url, "expected sqlite:///relative.db or sqlite:////absolute.db (no host)")
    path = location[1:]
    if not path or path.endswith("/") or not Path(path).name or path == ":memory:":
        raise _refuse(url, "the path does not name a database file")
    target = Path(path)
    if target.is_dir():
        raise _refuse(url, f"{path} is a directory")
    for ancestor in target.parents:
        if ancestor.exists():
            if not ancestor.is_dir():
                raise _refuse(url, f"{ancestor} is not a directory")
            break
    return path


def _options(url: str, allowed: dict[str, tuple[str, ...]]) -> dict[str, str]:
    parts = urlsplit(url)
    if parts.fragment:
        raise _refuse(url, "a fragment (#...) is not allowed")
    options: dict[str, str] = {}
    for key, values in parse_qs(parts.query, keep_blank_values=True).items():
        if key not in allowed:
            raise _refuse(url, f"unknown option {key!r} (known: {sorted(allowed)})")
        value = values[-1]
        if allowed[key] and value not in allowed[key]:
            raise _refuse(url, f"{key} must be one of {allowed[key]}, got {value!r}")
        options[key] = value
    return options


def _redis_server(url: str) -> str:
    """The server part of a ``redis``/``rediss`` URL, refused unless host, port and db are sane."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise _refuse(url, "the port must be a number from 1 to 65535") from None
    if port is not None and not 1 <= port <= 65535:
        raise _refuse(url, "the port must be a number from 1 to 65535")
    if not parts.hostname:
        raise _refuse(url, "a host is required")
    if not re.fullmatch(r"/?|/\d+", parts.path):
        raise _refuse(url, "the path must be empty or a database number, like /0")
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def open_broker(
    url: str,
    *,
    clock: Clock | None = None,
    ids: IdGenerator | None = None,
    visibility_timeout_ms: int | None = None,
    dedupe_ttl_ms: int | None = None,
) -> Broker:
    """Open a broker from a URL (see the module docstring for the forms).

    Nothing is created or contacted here; the backend is opened on first use. `clock` times
    items, tickets, dedupe windows and waits; `ids` mints tickets and lease tokens;
    `visibility_timeout_ms` is how long a session ticket lasts unless renewed (default 30 s) and
    `dedupe_ttl_ms` how long a dedupe key is kept at least (default one day).

    Raises:
        BrokerError: ``invalid_url`` for an unknown scheme, a malformed path, host, port or
            database number, a path of the wrong kind, or an unknown option; the message names
            the accepted forms.
    """
    scheme, separator, _ = url.partition("://")
    if not separator:
        raise _refuse(url, None)
    settings: dict[str, Any] = {
        key: value
        for key, value in (
            ("ids", ids),
            ("visibility_timeout_ms", visibility_timeout_ms),
            ("dedupe_ttl_ms", dedupe_ttl_ms),
        )
        if value is not None
    }
    if scheme == "sqlite":
        path = _sqlite_path(url)
        options = _options(url, {"synchronous": ("normal", "full")})
        from gateway.broker.sqlite import SqliteBroker

        full = options.get("synchronous") == "full"
        return SqliteBroker(path, synchronous="full" if full else "normal", clock=clock, **settings)
    if scheme in ("redis", "rediss", "redis+cluster", "rediss+cluster"):
        server = _redis_server(url)
        if scheme.endswith("+cluster") and urlsplit(url).path not in ("", "/", "/0"):
            raise _refuse(url, "a Redis Cluster has only database 0")
        prefix = _options(url, {"prefix": ()}).get("prefix") or "gwb"
        if not _PREFIX.match(prefix):
            raise _refuse(url, f"invalid key prefix {prefix!r} (no braces or spaces)")
        from gateway.broker.redis import RedisBroker  # imported when used, like SqliteBroker

        return RedisBroker(server, prefix=prefix, clock=clock, **settings)
    raise _refuse(url, None)
