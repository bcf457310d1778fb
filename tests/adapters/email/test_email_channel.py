"""The email channel's own rules, without servers: the watermark and approval links."""

from __future__ import annotations

from datetime import UTC, datetime

from adapters.channel import ApprovalView, Outbound, PendingCall, ThreadRef
from adapters.email import EmailChannel
from tests.adapters.kit import TestSink


def _channel() -> EmailChannel:
    return EmailChannel(
        address="bot@example.test",
        imap_host="127.0.0.1",
        smtp_host="127.0.0.1",
        password="x",
        approvers=("ann@example.test",),
        link_secret="a-link-secret-of-at-least-32-characters!",
        public_url="https://gateway.example.test",
    )


async def test_a_lower_uidvalidity_is_stored_and_a_stale_uid_is_not() -> None:
    channel = _channel()
    sink = TestSink()
    await sink.put_mark(channel.mark_name, "10:5", expect=None)
    assert await channel._advance(sink, "10:5", "3:1") == "3:1"  # renumbered lower: stored
    assert await channel._advance(sink, "3:1", "3:7") == "3:7"
    assert await channel._advance(sink, "3:1", "3:4") == "3:7"  # another process got further
    assert sink.marks[channel.mark_name] == "3:7"


def test_a_batch_too_large_for_a_link_gets_no_links_not_an_error() -> None:
    calls = tuple(
        PendingCall(
            tool_call_id=f"call_{n:040d}", tool_name="deploy", args={}, args_digest="d" * 64
        )
        for n in range(120)
    )
    outbound = Outbound(
        delivery_id="approval_request:s:r1",
        thread=ThreadRef(channel="email", space="bot@example.test", thread="<root@example.test>"),
        kind="approval_request",
        text="Approve?",
        approval=ApprovalView(session="s", run_id="r1", wait_id="w1", calls=calls),
        reply_context={"from": "Ann <ann@example.test>"},
    )
    now = datetime(2026, 12, 1, tzinfo=UTC)
    assert _channel()._approval_links(outbound, now) is None
    small = outbound.model_copy(
        update={"approval": ApprovalView(session="s", run_id="r1", wait_id="w1", calls=calls[:2])}
    )
    links = _channel()._approval_links(small, now)
    assert links is not None and set(links) == {"approve", "deny"}
