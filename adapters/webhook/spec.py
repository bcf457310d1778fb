"""The webhook channel in the registry: on when ``[webhook] url`` and ``secret`` are set."""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

from adapters.channel import ChannelAdapter
from adapters.kit import ChannelContext, ChannelSpec
from adapters.webhook.settings import WebhookSettings

__all__ = ["SPEC"]


def _build(section: WebhookSettings, context: ChannelContext) -> ChannelAdapter:
    from adapters.webhook.channel import WebhookChannel, WebhookLimits
    from adapters.webhook.delivery import WebhookDelivery

    assert section.url is not None  # `enabled`
    delivery = WebhookDelivery(
        url=section.url,
        key=section.outbound_key(),
        clock=context.clock,
        timeout_s=min(section.timeout_seconds, context.call_timeout_s),
        status_url=section.status_url,
    )
    return WebhookChannel(
        delivery=delivery,
        inbound_keys=(section.inbound_key(),),
        approvers=section.approvers,
        clock=context.clock,
        limits=WebhookLimits(
            max_body_bytes=section.max_body_bytes,
            max_text_chars=section.max_text_chars,
            tolerance_s=section.tolerance_seconds,
        ),
    )


def _shown(url: str) -> str:
    """`url` without what may be secret in it (a password, a query)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _describe(section: WebhookSettings, context: ChannelContext) -> Sequence[str]:
    assert section.url is not None  # `enabled`
    return [
        f"  Webhook: signed JSON in at {context.base_url}/webhook/events, replies POSTed to "
        f"{_shown(section.url)} (docs/webhook.md)"
    ]


SPEC = ChannelSpec(
    name="webhook",
    section=WebhookSettings,
    enabled=lambda section: section.enabled,
    build=_build,
    describe=_describe,
)
