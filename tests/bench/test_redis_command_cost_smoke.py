"""`bench/redis_command_cost.py` runs against its own redis-server and refuses a bad size."""

from __future__ import annotations

import re
import subprocess

from tests.bench.runner import run_bench


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bench("redis_command_cost.py", *args)


def test_the_command_cost_bench_prints_each_way() -> None:
    done = _run("--commands", "100")
    assert done.returncode == 0, done.stdout + done.stderr
    ways = re.findall(r"^(.+) \| [\d.]+$", done.stdout, re.M)
    assert ways == ["one after another", "50 callers at a time", "50 to a pipeline"], done.stdout


def test_a_size_below_one_batch_is_refused_in_one_line() -> None:
    done = _run("--commands", "49")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "redis_command_cost.py: error: --commands must be at least 50 (got 49)"
    )
