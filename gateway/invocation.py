"""The command a person typed to run the gateway, so every hint names one they can type again.

On a fresh clone ``gateway`` lives in ``.venv/bin`` and is not on the PATH: the README's commands
are ``scripts/run ...``, which exports `COMMAND_VARIABLE` as it was typed (its ``$0``). An
installed package (a container, a venv on the PATH) leaves it unset, and hints say ``gateway``.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Sequence
from typing import NoReturn

__all__ = ["COMMAND_VARIABLE", "OneLineParser", "command"]

COMMAND_VARIABLE = "GATEWAY_COMMAND"
"""Set by ``scripts/run`` to how it was invoked (``scripts/run``, ``./scripts/run``...)."""


def command() -> str:
    """The command that runs the gateway, as the person invoked it (``gateway`` by default)."""
    typed = os.environ.get(COMMAND_VARIABLE, "").strip()
    return typed if typed and "\n" not in typed else "gateway"


_UNDECODED = re.compile("[\udc80-\udcff]")
"""What bytes that are not UTF-8 become in `sys.argv` (surrogateescape)."""


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage error is one line: what is wrong, and where help is.

    argparse's own is the whole usage, then the error, three to six lines where the rule is
    one (an outside probe); the usage is one ``--help`` away, and the line says so.
    """

    def error(self, message: str) -> NoReturn:
        """Exit 2 with `message` on one line."""
        self.exit(2, f"{self.prog}: {message} (`{self.prog} --help` shows how)\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """argparse's, then a usage error for a value that is not Unicode text.

        Bytes that are not UTF-8 reach `sys.argv` as lone surrogates: a lane name or an
        operator's reason made of them failed later as "unexpected UnicodeEncodeError", exit 1
        (an outside probe). The question of `ask` says so in its own words.
        """
        parsed, rest = super().parse_known_args(args, namespace)
        for action in self._actions:
            value = getattr(parsed, action.dest, None)
            values = value if isinstance(value, list) else [value]
            if action.dest != "question" and any(
                isinstance(item, str) and _UNDECODED.search(item) for item in values
            ):
                name = action.option_strings[0] if action.option_strings else action.dest
                self.error(f"{name} is not valid Unicode text (bytes that are not UTF-8)")
        return parsed, rest

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
