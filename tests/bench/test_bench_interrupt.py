"""Ctrl-C stops a bench with one line and status 130, and leaves nothing it started running.

Each bench is interrupted where it holds something of its own: the harness bench while it
builds its restore session (its redis-server already started: once left running on this path),
the gateway bench while its gateway serves (a child process and a redis-server). The bench
runs in a process group of its own, so whatever it started and did not stop is still found in
that group after it exits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _group_members(group: int) -> list[str]:
    """Live processes of `group` (a zombie is dead, waiting for a parent to reap it)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == group and fields[0] != "Z":  # fields: state, ppid, pgrp, ...
            found.append(stat.split(")", 1)[0] + ")")
    return found


def _interrupt(command: list[str], started: str) -> tuple[int, str, list[str]]:
    """Run `command`, SIGINT it once stdout shows `started`; status, stderr, what is left."""
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        process_group=0,  # its own group: what it starts stays in it
        # a test run started in the background ignores SIGINT, and its children would too
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert process.stdout is not None
        seen = ""
        for line in process.stdout:
            seen += line
            if started in line:
                break
        else:
            pytest.fail(f"{command[1]} ended before {started!r}: {seen[-2000:]}")
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
        deadline = time.monotonic() + 5
        while (left := _group_members(process.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        return process.returncode, err, left
    finally:  # a failure here leaves no process and no open pipe behind
        if _group_members(process.pid):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("bench", "args", "started"),
    [
        ("harness_bench", [], "# harness_bench on"),
        ("gateway_bench", ["--only", "redis1", "--messages", "20000"], "work directory:"),
    ],
)
def test_ctrl_c_stops_a_bench_in_one_line_and_leaves_nothing_running(
    bench: str, args: list[str], started: str
) -> None:
    status, err, left = _interrupt([sys.executable, f"bench/{bench}.py", *args], started)
    assert status == 130, err[-3000:]
    assert err.strip().splitlines()[-1:] == [f"{bench}: interrupted"], err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert left == [], left
