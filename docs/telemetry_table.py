"""Rewrite the span and attribute tables in docs/telemetry.md from harness_core.telemetry_schema."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness_core.telemetry_schema import BEGIN, END, markdown  # noqa: E402


def main() -> None:
    """Rewrite the tables between the markers."""
    path = ROOT / "docs" / "telemetry.md"
    head, _, rest = path.read_text().partition(BEGIN)
    _, _, tail = rest.partition(END)
    path.write_text(f"{head}{BEGIN}\n\n{markdown()}\n{END}{tail}")
    print(f"{path}: tables rewritten")


if __name__ == "__main__":
    main()
