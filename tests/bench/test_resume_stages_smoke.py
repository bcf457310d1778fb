"""`bench/resume_stages.py` runs end to end: every stage timed, at every H asked for.

No figure is judged (timed tests are not how speed is measured here); what can fail is the
script itself and the resume it times, which checks that the lane holds its 4H messages.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_resume_stages_bench_times_every_stage() -> None:
    done = subprocess.run(
        [sys.executable, "bench/resume_stages.py", "--hist", "2,6", "--reps", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    header, *rows = [line.split(" | ") for line in done.stdout.splitlines()[1:]]
    assert [cell.strip() for cell in header][-8:] == [
        "open_repo", "acquire", "open", "create", "lane", "entries", "project", "export",
    ]  # fmt: skip
    assert [row[0].strip() for row in rows] == ["2", "6"], done.stdout
    assert all(float(cell) > 0 for row in rows for cell in row[1:3]), done.stdout
    assert [row[3].strip() for row in rows] == ["-", "-"]  # no peer asked for
