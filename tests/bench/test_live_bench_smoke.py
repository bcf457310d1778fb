"""`bench/live_bench.py --quick` runs through `gateway serve` and prints its figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_live_bench_prints_its_figures() -> None:
    done = subprocess.run(
        [sys.executable, "bench/live_bench.py", "--quick", "--parallel", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = {line[:28].strip(): line[28:].split() for line in done.stdout.splitlines()[2:]}
    for label in ("message -> first progress", "model chunk -> first token", "message -> reply"):
        p50, p99, worst = (float(cell) for cell in rows[label])
        assert 0 <= p50 <= p99 <= worst  # measured (not NaN): every message showed it
