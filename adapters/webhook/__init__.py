"""The webhook channel: anything that can POST JSON, signed per Standard Webhooks, both ways.

Messages and decisions come in at ``POST /webhook/events``; replies, approval requests and
notices go out as signed POSTs to the configured URL (``docs/webhook.md``). The channel's
modules are imported when first used, so reading the settings (`adapters.webhook.spec`) costs
nothing where the channel is off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adapters.webhook.channel import WebhookChannel, WebhookLimits
    from adapters.webhook.delivery import WebhookDelivery

__all__ = ["WebhookChannel", "WebhookDelivery", "WebhookLimits"]


def __getattr__(name: str) -> Any:
    if name == "WebhookDelivery":
        from adapters.webhook import delivery

        return delivery.WebhookDelivery
    if name in __all__:
        from adapters.webhook import channel

        return getattr(channel, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
