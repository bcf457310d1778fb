"""Test kit: the storage conformance suite, a manual clock and builders (for any backend)."""

from harness_core.testing.clock import ManualClock
from harness_core.testing.conformance import BackendFixture, ConformanceCase, conformance_cases

__all__ = [
    "BackendFixture",
    "conformance_cases",
    "ConformanceCase",
    "ManualClock",
]
