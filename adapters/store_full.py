"""Whether a store's failure is a full Redis (``maxmemory`` under ``noeviction``).

Such a Redis refuses every write until an operator frees memory or raises the limit: a sender
told "unavailable, retry" retried into the same wall, and nothing said "full" (an outside
probe). The words are Redis's own (``OOM command not allowed when used memory > 'maxmemory'``).
"""

from __future__ import annotations

__all__ = ["STORE_FULL", "store_full"]

STORE_FULL = (
    "store is full (Redis reached its maxmemory): nothing can be taken until an operator frees "
    "memory or raises maxmemory"
)
"""What a sender and an operator are told instead of "unavailable" (after "the inbox's")."""

_SAID = ("OOM command not allowed", "used memory > 'maxmemory'")


def store_full(exc: BaseException | None) -> bool:
    """Whether `exc`, or an exception it was raised from, is Redis refusing a write as full."""
    seen = 0
    while exc is not None and seen < 10:
        if any(words in str(exc) for words in _SAID):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False
