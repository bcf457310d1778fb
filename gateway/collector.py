"""Tuning Python's cyclic garbage collector for a long-running `gateway serve` process.

A service allocates a burst of short-lived objects per message and keeps a large, stable heap
(modules, schemas, lanes' cached state). With Python's defaults the youngest generation is
collected every 700 net allocations and every full collection walks the whole heap: in
`bench/gateway_bench.py` that was about 8 % of the gateway's CPU and pauses of ~125 ms that
land on whatever message is in flight (D122). Freezing what the start built takes it out of
every later collection, and collecting the young generation less often lets most objects die
by reference count before the collector ever sees them. The library (`harness_core`) never
changes this process-wide state; the application that owns the process does, once, here.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

__all__ = ["CollectorTuning", "tune_collector"]


@dataclass(frozen=True, slots=True)
class CollectorTuning:
    """What `tune_collector` did: the thresholds now in force and how many objects it froze."""

    thresholds: tuple[int, int, int]
    frozen: int


def tune_collector(young_threshold: int) -> CollectorTuning | None:
    """Freeze the heap built so far and collect the young generation every `young_threshold`.

    Call once, when the process has started (imports done, service built). 0 changes nothing
    and returns None. The older generations keep their thresholds.
    """
    if young_threshold == 0:
        return None
    gc.collect()  # what the start left as garbage is freed, not frozen
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, old)
    return CollectorTuning(thresholds=gc.get_threshold(), frozen=gc.get_freeze_count())
