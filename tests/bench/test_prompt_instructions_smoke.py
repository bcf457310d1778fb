"""`bench/prompt_instructions.py` runs end to end: CPU and instructions (valgrind) per prompt."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "bench/prompt_instructions.py"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_prompt_bench_prints_cpu_and_instructions_per_prompt() -> None:
    done = subprocess.run(
        [
            sys.executable,
            SCRIPT,
            "--prompts",
            "32",
            "--warmup",
            "16",
            "--instructions",
            "--profile",
            "5",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=230,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    cpu = re.search(
        r"16 lanes, 32 prompts after 16, python's collector: ([\d.]+) ms of CPU a prompt",
        done.stdout,
    )
    assert cpu is not None and float(cpu.group(1)) > 0, done.stdout
    counted = re.search(
        r"instructions a prompt \(callgrind, 32 less 16 prompts\): ([\d.]+) M", done.stdout
    )
    assert counted is not None, done.stdout
    assert 0.5 < float(counted.group(1)) < 100, done.stdout  # a prompt is millions, not zero
    assert "Ordered by: internal time" in done.stdout  # the profile's top 5


@pytest.mark.timeout(120)
def test_the_prompt_bench_runs_with_the_collector_tuned_as_the_service_tunes_it() -> None:
    done = subprocess.run(
        [sys.executable, SCRIPT, "--prompts", "32", "--warmup", "16", "--collector", "gateway"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    cpu = re.search(r"after 16, gateway's collector: ([\d.]+) ms of CPU a prompt", done.stdout)
    assert cpu is not None and float(cpu.group(1)) > 0, done.stdout
