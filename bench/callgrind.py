"""Counting a child run's instructions with valgrind's callgrind (the benches' steady figure)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence


def require_valgrind(bench: str) -> None:
    """Exit with one line when valgrind is not installed."""
    if shutil.which("valgrind") is None:
        raise SystemExit(f"{bench}: --instructions needs valgrind (apt-get install valgrind)")


def instructions(script: str, args: Sequence[str], bench: str) -> int:
    """Instructions callgrind counted for ``python script *args`` (every thread of it)."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out",
            sys.executable, script, *args,
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"{bench}: no count in valgrind's output:\n{done.stderr}")
    return int(found.group(1))
