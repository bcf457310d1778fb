"""`bench/lane_restore_bench.py` runs end to end and finds exactly the open operations.

No figure is judged (timed tests are not how speed is measured here); what can fail is the
script itself and the operations `AgentHarness.create` reports for a session of idle lanes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_restore_bench_reports_every_open_operation_and_no_other() -> None:
    done = subprocess.run(
        [sys.executable, "bench/lane_restore_bench.py", "--lanes", "30,120", "--trials", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split(" | ") for line in done.stdout.splitlines() if line.startswith("sqlite |")]
    assert [row[1] for row in rows] == ["30", "120"], done.stdout
    assert all(row[3] == "10" for row in rows), done.stdout  # the 10 open runs, found at create
