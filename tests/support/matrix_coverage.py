"""What the crash matrix and race catalog covered in this run (printed by `tests/conftest.py`)."""

from __future__ import annotations

CRASH_POINTS: dict[tuple[str, str], int] = {}
"""(backend, trajectory) -> crash points checked."""

RACE_ORDERS: dict[str, set[str]] = {}
"""Race-catalog row -> the orders (histories) tested."""
