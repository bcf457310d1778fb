"""The broker: inbox, outbox, per-thread state, audit trail and blob area (see `contract`).

`open_broker(url)` opens one (paths follow SQLAlchemy's convention, like the store's URLs: three
slashes and a relative path, four for an absolute one):

* ``sqlite:///.gateway/broker.db`` or ``sqlite:////var/lib/gw/broker.db`` - one file, one
  process (the embedded default); ``?synchronous=effects`` (the default: every commit survives a
  process crash, and an acceptance, a delivery's claim or a mark survives power loss too, D233),
  ``full`` (fsync every commit) or ``normal`` (never fsync).
* ``redis://host:6379/0`` (or ``rediss://`` for TLS) - shared by any number of processes;
  ``?prefix=gwb`` sets the key prefix (default ``gwb``). ``redis+cluster://host:7000`` (or
  ``rediss+cluster://``) - the same on a Redis Cluster (every key hash-tagged by session or
  shard).

Anything else (an unknown scheme, an empty path, a path naming a directory, a bad port or
database number, an unknown option) is refused with ``BrokerError("invalid_url")`` naming these
forms, before anything is created or contacted. The URLs are parsed by
`harness_core.backends.urls` (the store's and the web mailbox's parsers too); a backend here is
one `Openers.add` line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from gateway.broker.contract import Broker, BrokerError
from gateway.broker.limits import BlobLimits
from harness_core import Clock, IdGenerator
from harness_core.backends.urls import Openers, PathUrl, RedisUrl, RedisUrls, SqliteUrls, shown

if TYPE_CHECKING:
    from harness_core.backends.sqlite import Synchronous

__all__ = ["ACCEPTED_BROKER_URLS", "BlobLimits", "BrokerError", "check_broker_url", "open_broker"]

ACCEPTED_BROKER_URLS = (
    "accepted broker URLs: sqlite:///relative.db or sqlite:////absolute.db "
    "[?synchronous=effects|full|normal]; redis://host:port/db or rediss://host:port/db, or "
    "redis+cluster://host:port (rediss+cluster:// for TLS) [?prefix=name]"
)


def _refuse(url: str, why: str | None) -> BrokerError:
    what = f"broker URL {shown(url)}: {why}" if why else f"unsupported broker URL {shown(url)}"
    return BrokerError("invalid_url", f"{what}; {ACCEPTED_BROKER_URLS}")


@dataclass(frozen=True)
class _Given:
    """What `open_broker`'s caller gives every backend (None: the backend's default)."""

    clock: Clock | None
    ids: IdGenerator | None
    visibility_timeout_ms: int | None
    dedupe_ttl_ms: int | None
    blob_limits: BlobLimits | None

    def settings(self) -> dict[str, Any]:
        """The keyword arguments given, for a backend's constructor."""
        return {
            key: value
            for key, value in (
                ("ids", self.ids),
                ("visibility_timeout_ms", self.visibility_timeout_ms),
                ("dedupe_ttl_ms", self.dedupe_ttl_ms),
                ("blob_limits", self.blob_limits),
            )
            if value is not None
        }


def _sqlite(url: PathUrl, given: _Given) -> Broker:
    from gateway.broker.sqlite import SqliteBroker

    synchronous = cast("Synchronous", url.options.get("synchronous", "effects"))
    return SqliteBroker(url.path, synchronous=synchronous, clock=given.clock, **given.settings())


def _redis(url: RedisUrl, given: _Given) -> Broker:
    from gateway.broker.redis import RedisBroker  # imported when used, like SqliteBroker

    return RedisBroker(
        url.server,
        prefix=url.prefix,
        cluster=url.cluster,
        clock=given.clock,
        **given.settings(),
    )


_OPENERS: Openers[Broker, _Given] = Openers(_refuse)
_OPENERS.add(SqliteUrls(options={"synchronous": ("effects", "full", "normal")}), _sqlite)
_OPENERS.add(RedisUrls(default_prefix="gwb"), _redis)


def open_broker(
    url: str,
    *,
    clock: Clock | None = None,
    ids: IdGenerator | None = None,
    visibility_timeout_ms: int | None = None,
    dedupe_ttl_ms: int | None = None,
    blob_limits: BlobLimits | None = None,
) -> Broker:
    """Open a broker from a URL (see the module docstring for the forms).

    Nothing is created or contacted here; the backend is opened on first use. `clock` times
    items, tickets, dedupe windows and waits; `ids` mints tickets and lease tokens;
    `visibility_timeout_ms` is how long a session ticket lasts unless renewed (default 30 s) and
    `dedupe_ttl_ms` how long a dedupe key is kept at least (default one day); `blob_limits` bound
    the blob area (default `BlobLimits()`).

    Raises:
        BrokerError: ``invalid_url`` for an unknown scheme, a malformed path, host, port or
            database number, a path of the wrong kind, or an unknown option; the message names
            the accepted forms.
    """
    return _OPENERS.open(url, _Given(clock, ids, visibility_timeout_ms, dedupe_ttl_ms, blob_limits))


def check_broker_url(url: str) -> None:
    """Refuse a URL `open_broker` would refuse, building nothing (a setting checked at start).

    Raises:
        BrokerError: ``invalid_url``, as `open_broker` raises it.
    """
    _OPENERS.check(url)
