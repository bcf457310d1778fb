"""`bench/vs_langgraph.py --quick --ours-only` runs our side end to end and prints its table.

The peer (LangGraph) needs a venv of its own that CI does not build, so only our column is
smoke-tested here (no figure is judged); without that venv the full comparison says how to make
it and exits 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "bench/vs_langgraph.py"

QUICK_ROWS = (  # --quick: H = 5 and 20, 10 threads x 3 turns
    "wall per turn, H=5 ",
    "wall per turn, H=20 ",
    "bytes through write(2) per turn, H=5 ",
    "turns/s, one after another ",
    "turns/s, 10 threads at once ",
    "resume with the messages loaded, H=5",
    "resume with the messages loaded, H=20",
    "first turn after a restore, H=5",
    "first turn after a restore, H=20",
    "first turn after a restore, H=20 / H=5 (flatness)",
)


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("durability", ["defaults", "full"])
def test_our_side_runs_and_prints_the_table(tmp_path: Path, durability: str) -> None:
    out = tmp_path / "vs.json"
    done = subprocess.run(
        [
            sys.executable,
            SCRIPT,
            "--quick",
            "--ours-only",
            "--json-out",
            str(out),
            "--durability",
            durability,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=55,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("# machine: ") and "ours: Python" in lines[0], lines[0]
    pairing = "defaults against defaults" if durability == "defaults" else "full against full"
    assert pairing in done.stdout, done.stdout[:2000]
    [header] = [line for line in lines if line.startswith("figure ")]
    columns = [cell.strip() for cell in header.split("|")]
    assert columns == ["figure", "unit", "peer", "ours", "peer/ours", "ahead"]
    table = [line for line in lines if "|" in line and not line.startswith(("#", "figure "))]
    assert len(table) == len(QUICK_ROWS), done.stdout
    for prefix, line in zip(QUICK_ROWS, table, strict=True):
        cells = dict(zip(columns, (cell.strip() for cell in line.split("|")), strict=True))
        assert cells["figure"].startswith(prefix.strip()), line
        assert float(cells["ours"].replace(",", "")) > 0, line  # our side measured it
        assert cells["peer"] == cells["peer/ours"] == cells["ahead"] == "-", line
    rows = json.loads(out.read_text())["rows"]
    assert [row["figure"] for row in rows] == [line.split("|")[0].strip() for line in table]
    assert all(row["peer"] is None and row["ours"] > 0 for row in rows), rows


def test_without_the_peer_venv_it_says_how_to_make_it(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, SCRIPT, "--quick", "--peer-python", str(tmp_path / "no" / "python")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    make = "python3 -m venv bench/.peer-venv && bench/.peer-venv/bin/pip install -r "
    assert make + "bench/vs_langgraph.requirements.txt" in line, line
