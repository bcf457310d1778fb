r"""Characters that make a value read as another where a person judges it, shown as ``\uXXXX``.

Bidi overrides and isolates and zero-width characters (``deploy \u202e...``) let a value read
differently from the one that runs: an approval's arguments are shown with them made visible
in every channel, as the web page shows them (`adapters.web.page`'s ``FORMAT``, the same set).
Joiners stay: emoji and scripts need them.
"""

from __future__ import annotations

import re

__all__ = ["visible"]

_FORMAT = re.compile(
    "[\u00ad\u061c\u180e\u200b\u200e\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff"
    "\ufff9-\ufffb]"
)


def visible(text: str) -> str:
    r"""`text` with every format character written as ``\uXXXX``."""
    return _FORMAT.sub(lambda match: f"\\u{ord(match.group()):04x}", text)
