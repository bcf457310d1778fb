"""`--phase` splits the run in two: the `alone` tests (scripts/test's second phase) and the rest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = ["tests/gateway/test_kill_run.py", "tests/gateway/test_stop.py"]


def _collected(phase: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "--phase", phase, *FILES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return {line.split("::")[0] for line in done.stdout.splitlines() if "::" in line}


# three collections of the suite's conftest (~9 s each alone, far more on a loaded CI machine)
@pytest.mark.timeout(480)
def test_each_phase_collects_its_own_tests_and_all_collects_both() -> None:
    assert _collected("alone") == {FILES[0]}
    assert _collected("shared") == {FILES[1]}
    assert _collected("all") == set(FILES)


def test_the_files_started_first_are_there() -> None:
    """A renamed file would silently go back to its place by name (the slow tail comes back)."""
    from tests.conftest import _LONGEST_FIRST

    root = Path(__file__).resolve().parent.parent
    assert [path for path in _LONGEST_FIRST if not (root / path).is_file()] == []
    assert len(set(_LONGEST_FIRST)) == len(_LONGEST_FIRST)
