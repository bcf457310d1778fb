"""``python -m gateway.examples [DIR]``: write ``.env.example`` and ``gateway.example.toml``.

The files name every setting, each registered channel's section included, so they are
written from here (config knows no channel; `config.examples` takes the sections).
"""

from __future__ import annotations

import sys

from config.examples import main as write_examples
from gateway.channels import gateway_sections

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Write both example files into the directory named by the first argument (or ``.``)."""
    return write_examples(sys.argv[1:] if argv is None else argv, gateway_sections())


if __name__ == "__main__":
    raise SystemExit(main())
