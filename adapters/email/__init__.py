"""The email channel: IMAP in, SMTP out."""

from adapters.email.channel import EmailChannel

__all__ = ["EmailChannel"]
