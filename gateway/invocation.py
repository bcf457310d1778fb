"""The command a person typed to run the gateway, so every hint names one they can type again.

On a fresh clone ``gateway`` lives in ``.venv/bin`` and is not on the PATH: the README's commands
are ``scripts/run ...``, which exports `COMMAND_VARIABLE` as it was typed (its ``$0``). An
installed package (a container, a venv on the PATH) leaves it unset, and hints say ``gateway``.
"""

from __future__ import annotations

import os

__all__ = ["COMMAND_VARIABLE", "command"]

COMMAND_VARIABLE = "GATEWAY_COMMAND"
"""Set by ``scripts/run`` to how it was invoked (``scripts/run``, ``./scripts/run``...)."""


def command() -> str:
    """The command that runs the gateway, as the person invoked it (``gateway`` by default)."""
    typed = os.environ.get(COMMAND_VARIABLE, "").strip()
    return typed if typed and "\n" not in typed else "gateway"
