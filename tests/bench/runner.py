"""Running a bench script the way its README command does, from the repository's root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

__all__ = [
    "ROOT",
    "run_bench",
]

ROOT = Path(__file__).resolve().parents[2]


def run_bench(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``bench/<script>`` with this interpreter and `args`; its status and output."""
    return subprocess.run(
        [sys.executable, f"bench/{script}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
