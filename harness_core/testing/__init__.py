"""Test kit: the storage conformance suite, a manual clock and builders (for any backend).

Submodules: `builders` (durable entries and records), `conformance` (the suite every backend
passes), `invariants` (what must hold after any crash and recovery) and `trajectories` (the
canonical scenarios the recovery tests, the crash matrix and the reducer tests drive).
"""

from harness_core.testing.clock import ManualClock
from harness_core.testing.conformance import BackendFixture, ConformanceCase, conformance_cases

__all__ = [
    "BackendFixture",
    "conformance_cases",
    "ConformanceCase",
    "ManualClock",
]
