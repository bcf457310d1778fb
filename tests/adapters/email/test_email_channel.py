"""The email channel's own rules, without servers: the watermark, approval links, files."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from email.utils import format_datetime

import pytest

from adapters.channel import ApprovalView, Outbound, PendingCall, ThreadRef
from adapters.email import EmailChannel
from adapters.email import channel as channel_module
from adapters.email import message as message_module
from adapters.email.message import parse
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


def _mail(text: str, files: dict[str, bytes], minutes: int) -> bytes:
    mail = EmailMessage()
    mail["From"] = "Ann <ann@example.test>"
    mail["To"] = "bot@example.test"
    mail["Subject"] = "Reports"
    mail["Message-ID"] = "<one-id-for-every-mail@script.example.test>"
    mail["Date"] = format_datetime(
        datetime(2026, 12, 7, 9, tzinfo=UTC) + timedelta(minutes=minutes)
    )
    mail.set_content(text)
    for name, data in files.items():
        mail.add_attachment(data, maintype="text", subtype="plain", filename=name)
    return bytes(mail)


async def test_a_mail_reusing_a_message_id_holds_its_own_files_and_no_stray_ones() -> None:
    """Files were held under the Message-ID before the inbox said another mail had it: a part
    the first mail lacks was left held under the first's key, never read (D382)."""
    channel, sink = _channel(), TestSink({"bot@example.test": "s1"})
    raws = [
        _mail("the first report", {"a.txt": b"first a"}, minutes=0),
        _mail("two more", {"a.txt": b"second a", "b.txt": b"second b"}, minutes=5),
    ]
    for uid, raw in enumerate(raws + raws, start=1):  # each mail, then a copy of each
        parsed = parse(
            raw, mailbox_address=channel.address, own_domain_ids=(), max_bytes=1 << 20, now_ms=0
        )
        assert parsed.inbound is not None
        await channel._hand_over(sink, parsed.inbound, raw, uid)
    assert len(sink.accepted) == 2  # two mails, each once
    held = [next(m for m in sink.inbound if m.dedupe_key == key) for key in sink.accepted]
    files = [{a.name: sink.files[(a.blob or "")[4:]] for a in m.attachments} for m in held]
    assert files == [{"a.txt": b"first a"}, {"a.txt": b"second a", "b.txt": b"second b"}]
    named = {(a.blob or "")[4:] for m in held for a in m.attachments}
    assert set(sink.files) == named  # every file held is one a taken message names


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


async def test_a_mail_s_files_are_decoded_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each file was decoded on the event loop, parsing the whole mail again: a hostile one
    froze the process for 10-15 s a file (an outside probe)."""
    decoded_on: list[bool] = []
    decode = message_module.attachment_content

    def recording(raw: bytes, ref: str) -> bytes | None:
        decoded_on.append(threading.current_thread() is threading.main_thread())
        return decode(raw, ref)

    monkeypatch.setattr(channel_module, "attachment_content", recording)
    channel, sink = _channel(), TestSink({"bot@example.test": "s1"})
    raw = _mail("two files", {"a.txt": b"one", "b.txt": b"two"}, minutes=0)
    parsed = parse(
        raw, mailbox_address=channel.address, own_domain_ids=(), max_bytes=1 << 20, now_ms=0
    )
    assert parsed.inbound is not None
    await channel._hand_over(sink, parsed.inbound, raw, 1)
    assert sorted(sink.files.values()) == [b"one", b"two"]
    assert decoded_on == [False, False]
