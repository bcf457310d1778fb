"""What the agent and the thread are told when a channel took part of a message only (D169)."""

from __future__ import annotations

from typing import Any

import pytest

from adapters.channel import Author, Inbound, TextCut, ThreadRef
from adapters.slack.events import MAX_ATTACHMENTS, MAX_TEXT_CHARS, classify
from gateway.cuts import agent_notes, cut_notice_text

THREAD = ThreadRef(channel="slack", space="C1", thread="C1:1.1")

# (case, cut, unlisted attachments, the agent's notes)
NOTES: list[tuple[str, TextCut | None, int, list[str]]] = [
    ("nothing", None, 0, []),
    (
        "cut",
        TextCut(kept=40_000, total=52_310),
        0,
        ["[This message was cut: you have its first 40,000 of 52,310 characters. "
         "The sender has been told.]"],
    ),
    (
        "uncounted",
        TextCut(kept=12, total=None),
        0,
        ["[This message was cut: you have its first 12 characters (it was too long to count). "
         "The sender has been told.]"],
    ),
    (
        "unread",
        TextCut(kept=1, total=None, message_bytes=12_400_000, limit_bytes=10_000_000),
        0,
        ["[This message was too large to read (12.4 MB; at most 10.0 MB is read): you have "
         "its subject only. The sender has been told.]"],
    ),
    ("one-unlisted", None, 1, ["[1 more attachment, not listed]"]),
    ("both", TextCut(kept=1, total=2), 1_500, [
        "[This message was cut: you have its first 1 of 2 characters. The sender has been told.]",
        "[1,500 more attachments, not listed]",
    ]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("cut", "unlisted", "notes"), [c[1:] for c in NOTES], ids=[c[0] for c in NOTES]
)
def test_the_agent_is_told_what_it_does_not_have(
    cut: TextCut | None, unlisted: int, notes: list[str]
) -> None:
    inbound = Inbound(
        thread=THREAD,
        message_id="C1:1.1",
        author=Author(id="U1"),
        text="x",
        received_at_ms=1,
        cut=cut,
        unlisted_attachments=unlisted,
    )
    assert agent_notes(inbound) == notes


def test_the_thread_is_told_how_much_was_read() -> None:
    assert cut_notice_text(TextCut(kept=40_000, total=40_001)) == (
        "Your message was longer than I can take: I read only its first 40,000 of 40,001 "
        "characters. If the rest matters, send it in another message."
    )
    assert "too long to count" in cut_notice_text(TextCut(kept=5, total=None))
    unread = TextCut(kept=0, total=None, message_bytes=12_400_000, limit_bytes=10_000_000)
    assert cut_notice_text(unread) == (
        "Your message was too large for me to read (12.4 MB; at most 10.0 MB is read), so I did "
        "not read it. Please send it again without the large attachments."
    )


def _event(**fields: Any) -> dict[str, Any]:
    return {"type": "message", "channel": "D1", "channel_type": "im", "user": "U1",
            "ts": "1.000001", **fields}  # fmt: skip


def _classified(**fields: Any) -> Inbound:
    found = classify("message", _event(**fields), bot_user_id="UBOT", bot_id="BBOT", now_ms=1)
    assert found.inbound is not None
    return found.inbound


# (case, text as Slack sends it, the text the agent gets)
SLACK_TEXTS = [
    ("escapes", "a &lt; b &amp;&amp; c &gt; d", "a < b && c > d"),
    ("escaped-escape", "&amp;lt; is how Slack writes &lt;", "&lt; is how Slack writes <"),
    ("mention-and-link-kept", "<@UBOT> ask <@U2> about <https://x.example|x>",
     "ask <@U2> about <https://x.example|x>"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("sent", "typed"), [c[1:] for c in SLACK_TEXTS], ids=[c[0] for c in SLACK_TEXTS]
)
def test_slack_text_is_what_the_person_typed(sent: str, typed: str) -> None:
    inbound = _classified(text=sent)
    assert inbound.text == typed
    assert inbound.cut is None


def test_slack_files_beyond_the_listed_ones_are_counted() -> None:
    files = [{"id": f"F{n}", "name": f"f{n}.txt", "size": 1} for n in range(MAX_ATTACHMENTS + 3)]
    inbound = _classified(text="files", files=files, subtype="file_share")
    assert len(inbound.attachments) == MAX_ATTACHMENTS
    assert inbound.unlisted_attachments == 3
    assert _classified(text="x" * (MAX_TEXT_CHARS + 1)).cut == TextCut(
        kept=MAX_TEXT_CHARS, total=MAX_TEXT_CHARS + 1
    )
