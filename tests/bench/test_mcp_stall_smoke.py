"""`bench/mcp_stall.py` calls a real MCP server over every transport and refuses bad sizes."""

from __future__ import annotations

import re

from tests.bench.runner import run_bench


def test_the_stall_bench_measures_every_transport() -> None:
    done = run_bench("mcp_stall.py", "--blocks", "3000", "--runs", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    measured = re.findall(r"^  (\w+) +longest stall [\d.]+ s", done.stdout, re.M)
    assert measured == ["stdio", "events", "json", "gzip"], done.stdout


def test_bad_sizes_and_transports_are_one_line() -> None:
    for args in (("--blocks", "0"), ("--only", "carrier-pigeon")):
        done = run_bench("mcp_stall.py", *args)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.strip().splitlines()[-1].startswith("mcp_stall.py: error: ")
