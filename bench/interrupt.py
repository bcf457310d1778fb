"""Ctrl-C ends a bench with one line and exit status 130, not a traceback.

Each bench stops what it started (gateways, redis-servers, child processes) in its own
``finally`` blocks on the way out; this only turns the `KeyboardInterrupt` that arrives after
them into what a user expects of a command line.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TypeVar

__all__ = [
    "INTERRUPTED",
    "run_main",
]

_T = TypeVar("_T")

INTERRUPTED = 130
"""The exit status of a command stopped by SIGINT (128 + 2), as shells report it."""


def run_main(main: Callable[[], _T]) -> _T:
    """Return `main()`; on Ctrl-C print ``<bench>: interrupted`` and exit with status 130."""
    try:
        return main()
    except KeyboardInterrupt:
        name = os.path.splitext(os.path.basename(sys.argv[0]))[0] or "bench"
        print(f"{name}: interrupted", file=sys.stderr, flush=True)
        raise SystemExit(INTERRUPTED) from None
