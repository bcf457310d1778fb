"""`bench/gateway_bench.py --quick` runs end to end and prints its tables (no figure is judged)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# kill rates and deadlines are part of what these measure: scripts/test runs them by themselves
pytestmark = pytest.mark.alone

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(180)  # ~30 s alone; a parallel test run shares the cores with it
def test_the_gateway_bench_prints_its_tables() -> None:
    backends = "sqlite,redis1"
    # few threads for many messages: many arrive while their lane runs (a drift fault found so)
    tiny = ["--threads", "6", "--spaces", "2", "--messages", "100", "--seconds", "0.5"]
    done = subprocess.run(
        [sys.executable, "bench/gateway_bench.py", "--quick", "--only", backends, *tiny],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out = done.stdout
    assert "saturated replies/s" in out and "accept->reply p50 / p99 ms" in out
    [header] = [line for line in out.splitlines() if line.startswith("setup ")]
    columns = [cell.strip() for cell in header.split("|")]
    for setup in backends.split(","):
        [row] = [line for line in out.splitlines() if line.startswith(f"{setup} ") and "|" in line]
        cells = dict(zip(columns, (cell.strip() for cell in row.split("|")), strict=True))
        assert cells["saturated replies/s"] != "-", row  # a throughput was measured
        left = [line for line in out.splitlines() if line.startswith(f"{setup} unanswered:")]
        assert cells["unanswered"] == "0", [row, *left]  # every accepted message was answered
    assert "receipt -> run started" in out and "cost per reply" in out


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_takeover_bench_answers_every_probe() -> None:
    tiny = ["--threads", "20", "--spaces", "4", "--kills", "1", "--takeover-warm", "0.5"]
    done = subprocess.run(
        [sys.executable, "bench/gateway_bench.py", "--quick", "--only", "takeover", *tiny],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    [row] = [line for line in done.stdout.splitlines() if line.startswith("    1 |")]
    assert row.split("|")[-1].strip() == "0", row  # every probe was answered after the kill
    assert "worst takeover" in done.stdout
