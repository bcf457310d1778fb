"""What the reply corpus scored in this run (printed by `tests/adapters/email/conftest.py`)."""

from __future__ import annotations

SCORES: dict[str, bool] = {}
"""Corpus mail (file stem) -> whether it gave its expected text."""
