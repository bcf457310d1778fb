"""``python -m gateway`` and the ``gateway`` console script."""

from __future__ import annotations

import signal
import sys
from typing import Any


def main() -> int:
    """`gateway.cli.main`, imported here so a Ctrl-C while it loads is one line too.

    The imports take a few hundred milliseconds (pydantic, FastAPI, the SDKs). A Ctrl-C in
    them printed Python's traceback, or, raised inside pydantic's compiled code, was reported
    as "Exception ignored" and the command went on. While they load, Ctrl-C is only noted;
    once they are loaded, a noted one stops here and later ones are the command's own.
    """
    noted: list[int] = []

    def note(signum: int, frame: Any) -> None:
        noted.append(signum)

    previous = signal.signal(signal.SIGINT, note)
    if previous == signal.SIG_IGN:
        # started with Ctrl-C ignored (a background job of a script): `serve` takes SIGINT
        # once it listens, and one that came while it started was lost in between
        previous = signal.default_int_handler
    try:
        from gateway.cli import main as run
    finally:
        signal.signal(signal.SIGINT, previous)
    if noted:
        print("gateway: interrupted", file=sys.stderr)
        return 130
    return run()


if __name__ == "__main__":
    sys.exit(main())
