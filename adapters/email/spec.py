"""The email channel in the registry: on when ``[email] address`` is set."""

from __future__ import annotations

from collections.abc import Sequence

from adapters.channel import ChannelAdapter
from adapters.email.settings import EmailSettings
from adapters.kit import ChannelContext, ChannelSpec

__all__ = ["SPEC"]


def _build(section: EmailSettings, context: ChannelContext) -> ChannelAdapter:
    from adapters.email.channel import EmailChannel

    # the section's relation checks guarantee these when the address is set (`enabled`)
    assert section.address is not None
    assert section.imap_host is not None
    assert section.smtp_host is not None
    assert section.password is not None
    return EmailChannel(
        address=section.address,
        display_name=section.name,
        imap_host=section.imap_host,
        imap_port=section.imap_port,
        imap_tls=section.imap_security == "tls",
        smtp_host=section.smtp_host,
        smtp_port=section.smtp_port,
        smtp_security=section.smtp_security,
        username=section.username,
        password=section.password.get_secret_value(),
        ca_file=section.ca_file,
        folder=section.folder,
        sent_folder=section.sent_folder,
        max_message_bytes=section.max_message_bytes,
        poll_seconds=section.poll_seconds,
        replies_per_hour=section.replies_per_hour,
        replies_per_address=section.replies_per_address_per_hour,
        timeout_s=context.call_timeout_s,
        clock=context.clock,
        approvers=section.approvers,
        link_secret=None if section.link_secret is None else section.link_secret.get_secret_value(),
        public_url=context.public_url,
    )


def _describe(section: EmailSettings, context: ChannelContext) -> Sequence[str]:
    return [f"  Email: answering mail to {section.address} ({section.imap_host})"]


def _serves(section: EmailSettings, space: str) -> bool:
    """The email channel speaks only from its own mailbox (a thread's space is its address)."""
    return section.address is not None and space.lower() == section.address


SPEC = ChannelSpec(
    name="email",
    section=EmailSettings,
    enabled=lambda section: section.enabled,
    build=_build,
    describe=_describe,
    serves=_serves,
)
