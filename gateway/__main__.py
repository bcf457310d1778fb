"""``python -m gateway`` and the ``gateway`` console script."""

from __future__ import annotations

import sys

from gateway.cli import main

if __name__ == "__main__":
    sys.exit(main())
