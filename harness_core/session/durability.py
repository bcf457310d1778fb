"""Deferred durability: writes that no effect separates become durable together, at `sync()`.

A write is durable when its call returns (the contract's rule), except inside
`deferred_durability()`: there a backend may return once the write is applied and visible to
this storage's own reads, and make it durable later, at the storage's next `sync()` or next
durable write, whichever comes first. Order is kept: a crash loses a *suffix* of the deferred
writes, never one from the middle, so what survives is a prefix of the write sequence, which
recovery already handles. Nothing may act on a deferred write (call a model, run a tool, run a
hook, answer a caller) before `sync()` returned.

The scope is a context variable, so it follows the task that entered it (and tasks it starts)
and nothing else: another lane's surface call in the same process stays durable on return.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["deferred_durability", "durability_deferred"]

_DEFERRED: ContextVar[bool] = ContextVar("harness_durability_deferred", default=False)


@contextlib.contextmanager
def deferred_durability() -> Iterator[None]:
    """Let writes made in this context return before they are durable (until `sync()`)."""
    token = _DEFERRED.set(True)
    try:
        yield
    finally:
        _DEFERRED.reset(token)


def durability_deferred() -> bool:
    """Whether a write made now may be deferred (see the module docstring)."""
    return _DEFERRED.get()
