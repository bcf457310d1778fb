"""The command a person typed to run the gateway, so every hint names one they can type again.

On a fresh clone ``gateway`` lives in ``.venv/bin`` and is not on the PATH: the README's commands
are ``scripts/run ...``, which exports `COMMAND_VARIABLE` as it was typed (its ``$0``). An
installed package (a container, a venv on the PATH) leaves it unset, and hints say ``gateway``.
"""

from __future__ import annotations

import argparse
import os
from typing import NoReturn

__all__ = ["COMMAND_VARIABLE", "OneLineParser", "command"]

COMMAND_VARIABLE = "GATEWAY_COMMAND"
"""Set by ``scripts/run`` to how it was invoked (``scripts/run``, ``./scripts/run``...)."""


def command() -> str:
    """The command that runs the gateway, as the person invoked it (``gateway`` by default)."""
    typed = os.environ.get(COMMAND_VARIABLE, "").strip()
    return typed if typed and "\n" not in typed else "gateway"


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage error is one line: what is wrong, and where help is.

    argparse's own is the whole usage, then the error, three to six lines where the rule is
    one (an outside probe); the usage is one ``--help`` away, and the line says so.
    """

    def error(self, message: str) -> NoReturn:
        """Exit 2 with `message` on one line."""
        self.exit(2, f"{self.prog}: {message} (`{self.prog} --help` shows how)\n")
