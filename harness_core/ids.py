"""Id generators: UUIDv7 by default, deterministic sequences for tests; the only id source."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from harness_core.clock import Clock, SystemClock

__all__ = ["IdGenerator", "SequentialIds", "Uuid7Ids"]


@runtime_checkable
class IdGenerator(Protocol):
    """Mints unique ids synchronously (entry, record and operation ids are provisioned with it)."""

    def next(self) -> str:
        """Return a new id, never returned before by this generator."""
        ...


class Uuid7Ids:
    """RFC 9562 UUIDv7 ids, monotonic within a process.

    Within one millisecond the 12-bit `rand_a` field is a counter seeded at random (RFC 9562
    §6.2 method 1), so ids sort in creation order; if the counter overflows, the timestamp is
    advanced by one millisecond rather than breaking the order.
    """

    def __init__(
        self,
        clock: Clock | None = None,
        random_bits: Callable[[int], int] = secrets.randbits,
    ) -> None:
        self._clock = clock or SystemClock()
        self._random_bits = random_bits
        self._last_ms = -1
        self._counter = 0

    def next(self) -> str:
        """Return a new UUIDv7 string."""
        now = self._clock.now_ms()
        if now > self._last_ms:
            self._last_ms = now
            self._counter = self._random_bits(11)  # leave headroom so the counter rarely overflows
        else:
            self._counter += 1
            if self._counter > 0xFFF:
                self._last_ms += 1
                self._counter = self._random_bits(11)
        value = (self._last_ms & 0xFFFF_FFFF_FFFF) << 80
        value |= 0x7 << 76
        value |= self._counter << 64
        value |= 0b10 << 62
        value |= self._random_bits(62)
        text = f"{value:032x}"
        return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


class SequentialIds:
    """Deterministic ids for tests: ``f"{prefix}{n}"`` with n counting from `start`."""

    def __init__(self, prefix: str = "id-", start: int = 1) -> None:
        self._prefix = prefix
        self._next = start

    def next(self) -> str:
        """Return the next id in the sequence."""
        value = f"{self._prefix}{self._next}"
        self._next += 1
        return value
