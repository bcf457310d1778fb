"""The root of every exception a channel adapter raises on purpose.

Tree::

    AdapterError                      root of everything adapters raise
    ├── AdapterStartError             a channel refuses the adapter's credentials at start
    │   └── SlackStartError
    ├── NotRouted                     no binding routes the thread's space to a session
    ├── Unavailable                   the gateway cannot hold a message now (the channel retries)
    ├── DecisionRefused(code)         a decision that can change nothing; `code` says why
    ├── DeliveryError                 a delivery that did not (certainly) happen; its flags say
    │                                 whether to reconcile first, retry, or give up
    ├── MailboxError                  the web mailbox cannot do what was asked
    │   └── MailboxUnavailable        its backend did not answer
    ├── ImapError                     an IMAP command failed
    │   ├── ImapGone                  the connection is lost
    │   └── ImapRefused               the server refused the login
    ├── RegistryError                 a channel spec cannot be loaded, or two share a name
    └── SignatureRefused              a webhook request's signature or timestamp is refused

Callers branch on the class or its closed `code`, never on the message. An adapter imports no
gateway code, so the gateway's `GatewayError` is a separate root.
"""

from __future__ import annotations

__all__ = ["AdapterError"]


class AdapterError(Exception):
    """Root of every exception a channel adapter raises on purpose; ``str()`` is one line."""
