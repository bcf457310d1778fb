"""`bench/decode_options.py` runs at small sizes and refuses bad sizes in one line.

No figure is judged: what can fail is the script, its messages (the msgspec column, when msgspec
is installed, checks that it built the same messages as pydantic, field by field).
"""

from __future__ import annotations

import re
import subprocess

from tests.bench.runner import run_bench


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bench("decode_options.py", *args)


def test_the_decode_bench_prints_a_row_per_history_length() -> None:
    done = _run("--turns", "5,2", "--reps", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = re.findall(r"^(\d+) \| (\d+) \| \d+ \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+|-)$",
                      done.stdout, re.M)  # fmt: skip
    assert [(h, n) for h, n, *_ in rows] == [("2", "8"), ("5", "20")], done.stdout
    no_msgspec = "# msgspec: not installed" in done.stdout
    assert no_msgspec == (rows[0][-1] == "-"), done.stdout


def test_bad_sizes_are_refused_in_one_line() -> None:
    for args in (["--turns", "ten"], ["--turns", "0"], ["--reps", "-1"]):
        done = _run(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert "Traceback" not in done.stderr
        assert done.stderr.strip().splitlines()[-1].startswith("decode_options.py: error: "), (
            args,
            done.stderr,
        )
