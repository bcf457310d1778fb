"""What the webhook channel sends: signed POSTs of replies, and the question whether one arrived.

Every POST carries the Standard Webhooks headers; its ``webhook-id`` derives from the delivery
id alone (`webhook_id`), so every attempt of one delivery, from any process, has the same id
and a receiver that drops ids it has seen (as the spec asks) takes each reply once. How an
attempt ended decides the `DeliveryError` flags:

* 2xx: delivered.
* A connection that could not be made (refused, DNS, connect timeout): not sent, retried.
* A timeout or a dropped connection after the request went out: the outcome is unknown; the
  next attempt reconciles first.
* 408, 429 and 503: not taken, retried (after ``Retry-After`` when given). Other 5xx: the
  receiver (or a proxy in front of it) may have acted, so the outcome is unknown.
* 3xx and any other 4xx (410 Gone included): permanent, a dead letter at once (a retry cannot
  fix a wrong URL, a refused signature or a receiver that wants no more).

`reconcile` asks ``GET <status_url>/<webhook-id>`` (signed the same way, empty body) when a
status URL is configured: 2xx delivered, 404 or 410 absent, anything else unknown. Without one
nothing can be known about an attempt whose answer was lost; it answers ``absent``, and the
retry carries the same ``webhook-id`` for the receiver to drop (decision D195).
"""

from __future__ import annotations

import hashlib
import logging
from urllib.parse import quote, urlsplit

import httpx

from adapters.channel import DeliveryError, DeliveryReceipt, Outbound, Reconciled
from adapters.failures import connection_failure
from adapters.numbers import whole_number
from adapters.webhook.payloads import outbound_body
from adapters.webhook.signing import signed_headers
from harness_core import Clock

__all__ = ["WebhookDelivery", "webhook_id"]

log = logging.getLogger("adapters.webhook")

_NOT_TAKEN = frozenset({408, 429, 503})
"""Statuses that say the request was not acted on and may be sent again later."""
_MAX_RETRY_AFTER_S = 3600.0


def webhook_id(delivery_id: str) -> str:
    """The ``webhook-id`` of every attempt of `delivery_id` (no dots, as the spec asks)."""
    return "msg_" + hashlib.sha256(delivery_id.encode()).hexdigest()[:32]


def _retry_after(response: httpx.Response) -> float | None:
    """``Retry-After`` in seconds (a number of seconds; an HTTP date is not honoured)."""
    raw = response.headers.get("retry-after", "").strip()
    if not raw.isascii() or not raw.isdigit():
        return None
    seconds = whole_number(raw, int(_MAX_RETRY_AFTER_S))
    return _MAX_RETRY_AFTER_S if seconds is None else float(seconds)


class WebhookDelivery:
    """Signs and POSTs replies to one URL; asks a status URL, if any, what arrived."""

    def __init__(
        self,
        *,
        url: str,
        key: bytes,
        clock: Clock,
        timeout_s: float,
        status_url: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url
        self.status_url = status_url
        self._key = key
        self._clock = clock
        self._timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 5.0))
        self._transport = transport
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None or self._client.is_closed:
            self._client = httpx.AsyncClient(
                timeout=self._timeout,
                follow_redirects=False,
                transport=self._transport,
                headers={"user-agent": "durable-gateway-webhook"},
            )
        return self._client

    async def aclose(self) -> None:
        """Close the connection pool (a later call opens a new one)."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def deliver(self, outbound: Outbound) -> DeliveryReceipt:
        """POST `outbound` as signed JSON to the configured URL.

        Raises:
            DeliveryError: flagged as the module docstring says.
        """
        body = outbound_body(outbound)
        msg_id = webhook_id(outbound.delivery_id)
        headers = {
            "content-type": "application/json",
            **signed_headers(self._key, msg_id, self._clock.now_ms() // 1000, body),
        }
        try:
            # the answer's status and headers only: a body is never read (a receiver streaming
            # 200 MiB of it held them in memory, for every delivery)
            async with self._http().stream(
                "POST", self.url, content=body, headers=headers
            ) as response:
                status, retry_after = response.status_code, _retry_after(response)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise DeliveryError(f"webhook receiver unreachable: {self._why(exc)}") from None
        except httpx.PoolTimeout as exc:
            raise DeliveryError(f"webhook receiver unreachable ({type(exc).__name__})") from None
        except (httpx.TimeoutException, httpx.TransportError) as exc:
            raise DeliveryError(
                f"webhook receiver did not answer ({type(exc).__name__})", unknown_outcome=True
            ) from None
        if 200 <= status < 300:
            log.info(
                "webhook delivered",
                extra={"delivery_id": outbound.delivery_id, "webhook_id": msg_id, "status": status},
            )
            return DeliveryReceipt(
                delivery_id=outbound.delivery_id,
                channel_message_ids=(msg_id,),
                delivered_at_ms=self._clock.now_ms(),
            )
        reason = f"webhook receiver answered {status}"
        if status in _NOT_TAKEN:
            raise DeliveryError(reason, retry_after_s=retry_after)
        if status >= 500:
            raise DeliveryError(reason, unknown_outcome=True, retry_after_s=retry_after)
        if 300 <= status < 400:
            reason += " (a redirect: configure the final URL)"
        raise DeliveryError(reason, permanent=True)

    def _why(self, exc: httpx.TransportError) -> str:
        """Why the connection failed, in words (a bad certificate read as a network fault)."""
        parts = urlsplit(self.url)
        return connection_failure(
            exc,
            protocol=parts.scheme.upper(),
            host=parts.hostname or "",
            port=parts.port or (443 if parts.scheme == "https" else 80),
            timeout_s=self._timeout.connect or 0.0,
            phase="connecting",
        )

    async def reconcile(self, outbound: Outbound) -> Reconciled:
        """Whether an attempt of `outbound` arrived, as the status URL says (see the module)."""
        if self.status_url is None:
            return "absent"  # sent again under the same webhook-id: the receiver drops it
        msg_id = webhook_id(outbound.delivery_id)
        headers = signed_headers(self._key, msg_id, self._clock.now_ms() // 1000, b"")
        try:
            async with self._http().stream(  # its status only, as a delivery's
                "GET", f"{self.status_url}/{quote(msg_id, safe='')}", headers=headers
            ) as response:
                status = response.status_code
        except httpx.HTTPError as exc:
            log.info("webhook reconcile failed", extra={"error": type(exc).__name__})
            return "unknown"
        if 200 <= status < 300:
            return "delivered"
        if status in (404, 410):
            return "absent"
        log.info("webhook reconcile failed", extra={"status": status})
        return "unknown"
