"""Writer-lease decisions shared by the backends that keep lease rows (memory, SQLite)."""

from __future__ import annotations

from dataclasses import dataclass

from harness_core.errors import LeaseHeld, LeaseLost, SessionError
from harness_core.session.types import WriterLease

__all__ = ["LeaseRow", "check_acquire", "check_current", "check_ttl"]


@dataclass(frozen=True, slots=True)
class LeaseRow:
    """A stored lease: who holds it, with which token, until when."""

    owner: str
    token: int
    ttl_ms: int
    expires_at_ms: int

    def live(self, now_ms: int) -> bool:
        """Whether the lease has not lapsed at `now_ms`."""
        return now_ms < self.expires_at_ms

    def renewed_by_write(self, now_ms: int) -> int | None:
        """The new expiry a write at `now_ms` sets, or None if more than half the ttl is left.

        Renewing only past half-life keeps a steadily writing writer alive without rewriting
        the lease on every write (one less page per SQLite commit, one less command per script).
        """
        if 2 * (self.expires_at_ms - now_ms) < self.ttl_ms:
            return now_ms + self.ttl_ms
        return None


def check_ttl(ttl_ms: int, owner: str) -> None:
    """Refuse a non-positive ttl or an empty owner."""
    if not isinstance(ttl_ms, int) or ttl_ms < 1:
        raise SessionError(
            "invalid_query", f"lease ttl_ms must be a positive integer, got {ttl_ms!r}"
        )
    if not owner:
        raise SessionError("invalid_query", "lease owner must not be empty")


def check_acquire(session_id: str, current: LeaseRow | None, owner: str, now_ms: int) -> None:
    """Raise `LeaseHeld` if another owner holds a live lease."""
    if current is not None and current.live(now_ms) and current.owner != owner:
        raise LeaseHeld(
            f"session {session_id!r} is held by {current.owner!r} until {current.expires_at_ms}",
            owner=current.owner,
            expires_at_ms=current.expires_at_ms,
        )


def check_current(current: LeaseRow | None, lease: WriterLease, now_ms: int) -> None:
    """Raise `LeaseLost` unless `lease` is the stored, live lease."""
    if current is None or current.token != lease.token:
        raise LeaseLost(
            f"writer lease {lease.token} of {lease.owner!r} on {lease.session_id!r} was superseded "
            "or released"
        )
    if not current.live(now_ms):
        raise LeaseLost(
            f"writer lease {lease.token} of {lease.owner!r} on {lease.session_id!r} expired at "
            f"{current.expires_at_ms}"
        )
