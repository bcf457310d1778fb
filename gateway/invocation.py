"""The command a person typed to run the gateway, so every hint names one they can type again.

On a fresh clone ``gateway`` lives in ``.venv/bin`` and is not on the PATH: the README's commands
are ``scripts/run ...``, which exports `COMMAND_VARIABLE` as it was typed (its ``$0``). An
installed package (a container, a venv on the PATH) leaves it unset, and hints say ``gateway``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
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

    def check_given(self, words: Sequence[str], options: Sequence[str]) -> None:
        """A usage error when one of `options` is given twice, or with an empty value.

        argparse takes the last of two ``--config`` in silence (the first file never read),
        and an empty ``--store ''`` or ``--url ''`` meant the default (an outside probe).
        """
        end = words.index("--") if "--" in words else len(words)
        for name in options:
            values: list[str | None] = []
            index = 0
            while index < end:
                word = words[index]
                if word == name:
                    values.append(words[index + 1] if index + 1 < end else None)
                    index += 2
                    continue
                if word.startswith(f"{name}="):
                    values.append(word[len(name) + 1 :])
                index += 1
            if len(values) > 1:
                self.error(f"{name} is given {len(values)} times: give it once")
            if values and values[0] is not None and not values[0].strip():
                self.error(f"{name} is empty: give one, or leave it out for the default")
