"""A test that outlives its timeout ends the run at once, named, instead of hanging CI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_test_that_survives_its_timeout_ends_the_run_with_its_name() -> None:
    """Last time such a test served on until CI's 90 minutes were up (the probe, unguarded,
    absorbs pytest-timeout's exception and passes after 60 s, with status 0)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
         "tests/support/hang_probe.py"],
        cwd=ROOT,
        env={**os.environ, "TESTS_HANG_GRACE_S": "2"},
        capture_output=True,
        text=True,
        timeout=50,
    )  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    assert "hang_probe.py::test_runs_through_its_timeout still runs 4 s" in done.stderr
    assert "test_runs_through_its_timeout" in done.stderr.split("still runs")[1]  # its stack
