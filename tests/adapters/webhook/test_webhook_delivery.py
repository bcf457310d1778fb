"""Outbound: signed POSTs to a real receiver, every failure flagged right, and reconcile.

The receiver is `tests.support.webhook_peer.WebhookPeer` on a real port: it checks each
signature with its own code (not the channel's), drops webhook-ids it took, and fails, hangs
or loses acknowledgements on cue.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adapters.channel import (
    ApprovalClosed,
    ApprovalView,
    DeliveryError,
    Outbound,
    PendingCall,
    ThreadRef,
)
from adapters.webhook.delivery import WebhookDelivery, webhook_id
from adapters.webhook.signing import secret_key
from harness_core import SystemClock
from tests.support.mail_servers import make_self_signed_cert
from tests.support.redis_server import free_port
from tests.support.webhook_peer import WebhookPeer, new_secret

SECRET = new_secret("delivery")


@pytest.fixture
async def peer() -> AsyncIterator[WebhookPeer]:
    async with WebhookPeer(secret=SECRET) as running:
        yield running


def _delivery(
    url: str, *, status_url: str | None = None, timeout_s: float = 2.0
) -> WebhookDelivery:
    return WebhookDelivery(
        url=url,
        key=secret_key(SECRET),
        clock=SystemClock(),
        timeout_s=timeout_s,
        status_url=status_url,
    )


@pytest.fixture
async def sender(peer: WebhookPeer) -> AsyncIterator[WebhookDelivery]:
    delivery = _delivery(peer.url, status_url=peer.status_url)
    yield delivery
    await delivery.aclose()


def _reply(
    delivery_id: str = "reply:webhook-default:run-1", kind: str = "reply", **extra: object
) -> Outbound:
    return Outbound.model_validate(
        {
            "delivery_id": delivery_id,
            "thread": ThreadRef(channel="webhook", space="default", thread="t1"),
            "kind": kind,
            "text": "**done**",
            "reply_context": {"chat": 7},
            **extra,
        }
    )


async def test_a_reply_is_one_signed_post_the_receiver_verifies(
    peer: WebhookPeer, sender: WebhookDelivery
) -> None:
    out = _reply()
    receipt = await sender.deliver(out)
    [post] = peer.posts
    assert post.verified and post.status == 200
    assert post.webhook_id == webhook_id(out.delivery_id) == receipt.channel_message_ids[0]
    assert "." not in post.webhook_id
    assert post.payload == {
        "kind": "reply",
        "delivery_id": "reply:webhook-default:run-1",
        "space": "default",
        "thread": "t1",
        "text": "**done**",
        "answers": True,
        "reply_context": {"chat": 7},
    }


async def test_an_approval_request_carries_its_wait_calls_and_digests(
    peer: WebhookPeer, sender: WebhookDelivery
) -> None:
    view = ApprovalView(
        session="webhook-default",
        run_id="run-1",
        wait_id="wait-1",
        calls=(
            PendingCall(
                tool_call_id="call-1",
                tool_name="deploy",
                args={"target": "prod"},
                args_digest="d1",
            ),
        ),
    )
    await sender.deliver(
        _reply("approval_request:webhook-default:wait-1", kind="approval_request", approval=view)
    )
    closed = ApprovalClosed(
        session="webhook-default",
        run_id="run-1",
        wait_id="wait-1",
        request_delivery_id="approval_request:webhook-default:wait-1",
        requested_at_ms=1,
        outcome="approved",
        by="alice",
        at_ms=2,
    )
    await sender.deliver(
        _reply("approval_closed:webhook-default:wait-1", kind="approval_closed", closed=closed)
    )
    asked, done = (p.payload for p in peer.posts)
    assert asked["kind"] == "approval_request"
    assert asked["approval"]["calls"] == [
        {
            "tool_call_id": "call-1",
            "tool_name": "deploy",
            "args": {"target": "prod"},
            "args_digest": "d1",
        }
    ]
    assert (asked["approval"]["run_id"], asked["approval"]["wait_id"]) == ("run-1", "wait-1")
    assert done["kind"] == "approval_closed" and done["closed"]["outcome"] == "approved"
    assert done["closed"]["by"] == "alice"


@pytest.mark.parametrize(
    ("status", "retry_after", "unknown", "hint"),
    [
        (503, "7", False, 7.0),
        (429, "30", False, 30.0),
        (408, None, False, None),
        (500, None, True, None),
        (502, "3", True, 3.0),
        (504, None, True, None),
    ],
)
async def test_a_refusal_worth_retrying_is_flagged_for_the_outbox(
    peer: WebhookPeer,
    sender: WebhookDelivery,
    status: int,
    retry_after: str | None,
    unknown: bool,
    hint: float | None,
) -> None:
    peer.fail(status, retry_after=retry_after)
    with pytest.raises(DeliveryError) as failed:
        await sender.deliver(_reply())
    error = failed.value
    assert (error.permanent, error.unknown_outcome, error.retry_after_s) == (False, unknown, hint)
    assert error.reason == f"webhook receiver answered {status}"
    await sender.deliver(_reply())
    assert [p.status for p in peer.posts] == [status, 200]
    assert len(peer.taken) == 1


@pytest.mark.parametrize("status", [400, 401, 403, 404, 410, 422, 301, 307])
async def test_a_refusal_no_retry_can_fix_is_permanent(
    peer: WebhookPeer, sender: WebhookDelivery, status: int
) -> None:
    peer.fail(status)
    with pytest.raises(DeliveryError) as failed:
        await sender.deliver(_reply())
    assert failed.value.permanent and not failed.value.unknown_outcome
    assert len(peer.posts) == 1  # a redirect is not followed


async def test_a_wrong_secret_is_refused_by_the_receiver_and_is_permanent(
    peer: WebhookPeer,
) -> None:
    wrong = WebhookDelivery(
        url=peer.url, key=secret_key(new_secret("wrong")), clock=SystemClock(), timeout_s=2.0
    )
    with pytest.raises(DeliveryError) as failed:
        await wrong.deliver(_reply())
    await wrong.aclose()
    assert failed.value.permanent and failed.value.reason == "webhook receiver answered 401"
    assert [p.verified for p in peer.posts] == [False] and peer.taken == {}


async def test_nothing_listening_is_not_sent_and_retried() -> None:
    port = free_port()
    delivery = _delivery(f"http://127.0.0.1:{port}/hooks")
    with pytest.raises(DeliveryError) as failed:
        await delivery.deliver(_reply())
    await delivery.aclose()
    assert not failed.value.permanent and not failed.value.unknown_outcome
    assert failed.value.reason == (
        f"webhook receiver unreachable: connection refused by 127.0.0.1:{port}: nothing "
        "listens there (check the HTTP host and port)"
    )


async def test_a_certificate_nobody_trusts_is_said_not_taken_for_a_network_fault(
    tmp_path: Path,
) -> None:
    # it read "webhook receiver unreachable (ConnectError)": an operator looked at the network
    cert = make_self_signed_cert(tmp_path)
    server = await asyncio.start_server(
        lambda _r, w: w.close(), "127.0.0.1", 0, ssl=cert.server_context()
    )
    port = server.sockets[0].getsockname()[1]
    delivery = _delivery(f"https://127.0.0.1:{port}/hooks")
    try:
        with pytest.raises(DeliveryError) as failed:
            await delivery.deliver(_reply())
    finally:
        await delivery.aclose()
        server.close()
        await server.wait_closed()
    assert not failed.value.permanent and not failed.value.unknown_outcome  # never sent
    assert failed.value.reason.startswith(
        f"webhook receiver unreachable: TLS handshake with HTTPS server 127.0.0.1:{port} "
        "failed: its certificate is not trusted (self-signed certificate"
    )


async def test_a_lost_ack_is_an_unknown_outcome_that_reconcile_finds_delivered(
    peer: WebhookPeer, sender: WebhookDelivery
) -> None:
    out = _reply()
    assert await sender.reconcile(out) == "absent"
    peer.lose_ack()
    with pytest.raises(DeliveryError) as failed:
        await sender.deliver(out)
    assert failed.value.unknown_outcome and not failed.value.permanent
    assert await sender.reconcile(out) == "delivered"
    assert peer.status_asked == [webhook_id(out.delivery_id)] * 2
    assert len(peer.taken) == 1


async def test_a_receiver_that_hangs_is_an_unknown_outcome(peer: WebhookPeer) -> None:
    delivery = _delivery(peer.url, timeout_s=0.5)
    peer.lose_ack(hang=True)
    with pytest.raises(DeliveryError) as failed:
        await asyncio.wait_for(delivery.deliver(_reply()), timeout=5)
    await delivery.aclose()
    assert failed.value.unknown_outcome and "ReadTimeout" in failed.value.reason


async def test_a_status_url_that_cannot_answer_is_unknown(peer: WebhookPeer) -> None:
    delivery = _delivery(peer.url, status_url=peer.status_url)
    peer.fail_status(500)
    assert await delivery.reconcile(_reply()) == "unknown"
    gone = _delivery(peer.url, status_url=f"http://127.0.0.1:{free_port()}/status")
    assert await gone.reconcile(_reply()) == "unknown"
    await delivery.aclose()
    await gone.aclose()


async def test_without_a_status_url_the_retry_is_the_same_webhook_id_the_receiver_drops(
    peer: WebhookPeer,
) -> None:
    delivery = _delivery(peer.url)
    out = _reply()
    peer.lose_ack()
    with pytest.raises(DeliveryError):
        await delivery.deliver(out)
    assert await delivery.reconcile(out) == "absent"
    await delivery.deliver(out)
    await delivery.aclose()
    first, second = peer.posts
    assert first.webhook_id == second.webhook_id and second.duplicate
    assert int(second.timestamp) >= int(first.timestamp)  # each attempt signed anew
    assert len(peer.taken) == 1 and peer.status_asked == []


async def test_a_receiver_that_answers_with_an_endless_body_is_delivered_unread() -> None:
    """A 2xx whose body never ends: the body was read whole (200 MiB held in memory)."""
    sent = 0

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n\r\n")
        chunk = b"x" * 65_536
        try:
            while sent < 1 << 30:  # a GiB at most, should the body be read
                writer.write(chunk)
                await writer.drain()
                sent += len(chunk)
        except (ConnectionError, OSError):
            pass  # the gateway closed the connection: what this test wants
        finally:
            writer.close()

    server = await asyncio.start_server(endless, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    delivery = _delivery(f"http://127.0.0.1:{port}/hook")
    try:
        receipt = await asyncio.wait_for(delivery.deliver(_reply()), timeout=10)
        assert receipt.channel_message_ids == (webhook_id("reply:webhook-default:run-1"),)
    finally:
        await delivery.aclose()
        server.close()
    assert sent < 64 << 20  # far less than the body: the socket buffers' worth
