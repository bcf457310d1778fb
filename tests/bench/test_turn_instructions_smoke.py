"""`bench/turn_instructions.py` runs end to end: wall, CPU and instructions (valgrind) a turn."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "bench/turn_instructions.py"


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("durability", ["effects", "full"])
def test_the_turn_bench_prints_time_and_instructions_per_turn(durability: str) -> None:
    counting = durability == "effects"  # valgrind's two runs once: they take half a minute
    done = subprocess.run(
        [
            sys.executable,
            SCRIPT,
            "--history",
            "3",
            "--turns",
            "5",
            "--durability",
            durability,
            "--profile",
            "5",
            *(["--instructions"] if counting else []),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=230,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    timed = re.search(
        rf"sqlite {durability}, 5 turns after 3: ([\d.]+) ms of wall, ([\d.]+) ms of CPU "
        r"\(([\d.]+) on the loop's thread\) a turn",
        done.stdout,
    )
    assert timed is not None and all(float(v) > 0 for v in timed.groups()), done.stdout
    counted = re.search(
        r"instructions a turn \(callgrind, 5 turns less none\): ([\d.]+) M", done.stdout
    )
    assert (counted is not None) == counting, done.stdout
    if counted is not None:
        assert 1 < float(counted.group(1)) < 200, done.stdout  # a turn is millions, not zero
    assert "Ordered by: internal time" in done.stdout  # the profile's top 5


def test_no_turns_is_refused_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, SCRIPT, "--turns", "0"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "--turns must be at least 1" in done.stderr and "Traceback" not in done.stderr
