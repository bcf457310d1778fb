"""The web channel: threads in a browser or over HTTP JSON, with no Slack or mail server.

`WebChannel` is the `ChannelAdapter` (its `router` is what the service mounts); the mailbox
(`open_mailbox(url)`: memory, SQLite, Redis) keeps every thread's messages and replies.
"""

from adapters.web.channel import WebChannel, WebLimits
from adapters.web.mailbox import (
    DEFAULT_MAILBOX_URL,
    MailboxError,
    MailboxUnavailable,
    MemoryMailbox,
    NewWebItem,
    WebAppend,
    WebDecision,
    WebItem,
    WebItemKind,
    WebMailbox,
    WebThread,
    open_mailbox,
)

__all__ = [
    "DEFAULT_MAILBOX_URL",
    "MailboxError",
    "MailboxUnavailable",
    "MemoryMailbox",
    "NewWebItem",
    "WebAppend",
    "WebChannel",
    "WebDecision",
    "WebItem",
    "WebItemKind",
    "WebLimits",
    "WebMailbox",
    "WebThread",
    "open_mailbox",
]
