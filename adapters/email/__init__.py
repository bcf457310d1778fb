"""The email channel: IMAP in, SMTP out.

The channel's modules (aioimaplib, aiosmtplib, the parsers) are imported when first used, so
reading the settings (`adapters.email.spec`) costs nothing where email is off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adapters.email.channel import EmailChannel

__all__ = ["EmailChannel"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from adapters.email import channel

        return getattr(channel, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
