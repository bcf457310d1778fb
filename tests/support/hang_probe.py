"""A test that outlives its timeout as a service would (run only by `tests/test_hang_guard.py`)."""

from __future__ import annotations

import contextlib
import time

import pytest


@pytest.mark.timeout(1)
def test_runs_through_its_timeout() -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        # a service that survives faults takes pytest-timeout's exception as one more
        with contextlib.suppress(BaseException):
            time.sleep(0.05)
