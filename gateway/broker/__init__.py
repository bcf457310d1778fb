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

from typing import Any

from gateway.broker.contract import Broker, BrokerError
from harness_core import Clock, IdGenerator
from harness_core.storage.urls import UrlRules, without_password

__all__ = ["ACCEPTED_BROKER_URLS", "BrokerError", "open_broker"]

ACCEPTED_BROKER_URLS = (
    "accepted broker URLs: sqlite:///relative.db or sqlite:////absolute.db "
    "[?synchronous=normal|full]; redis://host:port/db or rediss://host:port/db, or "
    "redis+cluster://host:port (rediss+cluster:// for TLS) [?prefix=name]"
)


def _refuse(url: str, why: str | None) -> BrokerError:
    shown = without_password(url)  # errors are printed and logged
    what = f"broker URL {shown!r}: {why}" if why else f"unsupported broker URL {shown!r}"
    return BrokerError("invalid_url", f"{what}; {ACCEPTED_BROKER_URLS}")


_url_rules = UrlRules(_refuse)


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
        path = _url_rules.path(url, scheme, directory=False)
        options = _url_rules.options(url, {"synchronous": ("normal", "full")})
        from gateway.broker.sqlite import SqliteBroker

        full = options.get("synchronous") == "full"
        return SqliteBroker(path, synchronous="full" if full else "normal", clock=clock, **settings)
    if scheme in ("redis", "rediss", "redis+cluster", "rediss+cluster"):
        server = _url_rules.redis_server(url, scheme=scheme, cluster=scheme.endswith("+cluster"))
        prefix = _url_rules.prefix(url, "gwb")
        from gateway.broker.redis import RedisBroker  # imported when used, like SqliteBroker

        return RedisBroker(server, prefix=prefix, clock=clock, **settings)
    raise _refuse(url, None)
