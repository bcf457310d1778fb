"""Outbound email: reply headers and threading, the body, approval requests and their tokens."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from datetime import UTC, datetime, timedelta
from email import message_from_bytes, policy
from email.message import EmailMessage
from typing import Any

import pytest
from itsdangerous.encoding import base64_encode

from adapters.channel import ApprovalView, Inbound, Outbound, OutboundKind, PendingCall, ThreadRef
from adapters.email import compose as compose_module
from adapters.email import message as message_module
from adapters.email.compose import (
    MAX_ARGS_CHARS,
    MAX_CALLS_SHOWN,
    MAX_CC,
    MAX_REFERENCES,
    MAX_TOKEN_CHARS,
    _serializer,
    approval_token,
    compose_reply,
    is_own_message_id,
    markdown_to_html,
    reply_message_id,
    thread_of_own_id,
    verify_approval_token,
)
from adapters.email.message import parse

BOT = "bot@gw.example"
DOMAIN = "gw.example"
NOW = datetime(2026, 11, 30, 13, 30, tzinfo=UTC)
KEY = b"k" * 32

HUMAN = """\
From: Alice Example <alice@example.com>
To: Deploy Bot <bot@gw.example>, Bob <bob@example.com>
Cc: carol@example.com, BOT@gw.example
Subject: Deploy 42
Date: Mon, 30 Nov 2026 13:00:00 +0000
Message-ID: <root-1@example.com>
MIME-Version: 1.0
Content-Type: text/plain; charset=utf-8

Please deploy build 42.
"""


def parsed(raw: bytes | str) -> Inbound:
    data = raw.encode() if isinstance(raw, str) else raw
    result = parse(data, mailbox_address=BOT, own_domain_ids=(DOMAIN,), max_bytes=10**7, now_ms=1)
    assert result.inbound is not None, result.reason
    return result.inbound


def outbound(
    context: Any,
    *,
    kind: OutboundKind = "reply",
    text: str = "Deployed **42**.",
    approval: ApprovalView | None = None,
    delivery_id: str = "reply:session-1:run-1",
) -> Outbound:
    return Outbound(
        delivery_id=delivery_id,
        thread=ThreadRef(channel="email", space=BOT, thread="<root-1@example.com>"),
        kind=kind,
        text=text,
        approval=approval,
        reply_context=context,
    )


def compose(out: Outbound, **kwargs: Any) -> EmailMessage:
    return compose_reply(
        out, from_address=BOT, from_name="Deploy Bot", domain=DOMAIN, now=NOW, **kwargs
    )


def human_reply_to(message: EmailMessage, body: str, *, message_id: str) -> bytes:
    """What a mail client sends when a person answers `message` (RFC 5322 §3.6.4)."""
    reply = EmailMessage()
    reply["From"] = "Alice Example <alice@example.com>"
    reply["To"] = str(message["From"])
    reply["Subject"] = "Re: " + str(message["Subject"])
    reply["Message-ID"] = message_id
    reply["In-Reply-To"] = str(message["Message-ID"])
    reply["References"] = f"{message['References']} {message['Message-ID']}"
    reply.set_content(f"{body}\n\nOn Mon, Nov 30, 2026, Deploy Bot <{BOT}> wrote:\n> earlier\n")
    return reply.as_bytes()


def test_public_names_are_sorted_and_resolve() -> None:
    for module in (compose_module, message_module):
        names = list(module.__all__)
        assert names == sorted(names, key=str.casefold)
        assert all(hasattr(module, name) for name in names)


# --- Message-IDs -----------------------------------------------------------------------------


def test_reply_message_id_is_deterministic_and_recognized() -> None:
    first = reply_message_id("reply:session-1:run-1", DOMAIN)
    assert first == reply_message_id("reply:session-1:run-1", "GW.example")
    assert first != reply_message_id("reply:session-1:run-2", DOMAIN)
    assert first.startswith("<dg.") and first.endswith("@gw.example>")
    assert ":" not in first
    assert is_own_message_id(first, DOMAIN)
    assert is_own_message_id(first.strip("<>"), "GW.EXAMPLE")
    assert not is_own_message_id(first, "other.example")
    assert not is_own_message_id("<CAH+x@mail.gmail.com>", DOMAIN)
    assert not is_own_message_id("<dg.short@gw.example>", DOMAIN)
    with pytest.raises(ValueError, match="domain"):
        reply_message_id("x", "bad domain")


# --- replies ---------------------------------------------------------------------------------


def test_reply_headers() -> None:
    inbound = parsed(HUMAN)
    message = compose(outbound(inbound.reply_context))
    assert message["From"] == f"Deploy Bot <{BOT}>"
    assert message["To"] == "Alice Example <alice@example.com>"
    assert message["Cc"] == "Bob <bob@example.com>, carol@example.com"  # reply-all, not the bot
    assert message["Subject"] == "Re: Deploy 42"
    assert message["In-Reply-To"] == "<root-1@example.com>"
    assert message["References"] == "<root-1@example.com>"
    assert message["Message-ID"] == reply_message_id(
        "reply:session-1:run-1", DOMAIN, "<root-1@example.com>"
    )
    assert message["Date"] == "Mon, 30 Nov 2026 13:30:00 +0000"
    assert message["Auto-Submitted"] == "auto-replied"
    assert message["X-Auto-Response-Suppress"] == "All"
    assert message["Thread-Topic"] is None and message["Thread-Index"] is None
    assert message["Reply-To"] is None


def test_reply_all_beyond_its_bound_says_who_was_left_out(caplog: pytest.LogCaptureFixture) -> None:
    # a mail to 30 people got an answer 10 of them never saw, and nothing said so
    people = ", ".join(f"p{n}@example.com" for n in range(30))
    inbound = parsed(HUMAN.replace("Cc: carol@example.com, BOT@gw.example", f"Cc: {people}"))
    with caplog.at_level("WARNING", logger="adapters.email"):
        message = compose(outbound(inbound.reply_context))
    assert len(str(message["Cc"]).split(",")) == MAX_CC
    [record] = [r for r in caplog.records if r.getMessage() == "email reply copies fewer people"]
    assert (record.__dict__["copied"], record.__dict__["left_out"]) == (20, 11)  # Bob, 30 - 20 + 1


def test_the_body_is_plain_text_with_an_html_alternative() -> None:
    text = "Deployed **42**: see [the log](https://ci.example/42) <script>x</script>\n\n- ok"
    message = compose(outbound(parsed(HUMAN).reply_context, text=text))
    assert message.get_content_type() == "multipart/alternative"
    plain_part = message.get_body(preferencelist=("plain",))
    html_part = message.get_body(preferencelist=("html",))
    assert plain_part is not None and html_part is not None
    assert plain_part.get_content_charset() == "utf-8"
    assert plain_part.get_content() == text + "\n"
    body = html_part.get_content()
    assert "<strong>42</strong>" in body
    assert '<a href="https://ci.example/42">the log</a>' in body
    assert "&lt;script&gt;x&lt;/script&gt;" in body and "<script>" not in body
    assert "<ul><li>ok</li></ul>" in body


@pytest.mark.parametrize(
    ("subject", "expected"),
    [
        ("Deploy 42", "Re: Deploy 42"),
        ("Re: Deploy 42", "Re: Deploy 42"),
        ("RE: Re: Deploy 42", "Re: Deploy 42"),
        ("AW: Deploy 42", "Re: Deploy 42"),
        ("Fwd: Deploy 42", "Re: Deploy 42"),
        ("[EXTERNAL] Re: Deploy 42", "Re: Deploy 42"),
        ("", "Re:"),
        ("Grüße\r\nBcc: evil@example.com", "Re: Grüße Bcc: evil@example.com"),
    ],
)
def test_re_never_stacks(subject: str, expected: str) -> None:
    context = {"from": "alice@example.com", "subject": subject}
    message = compose(outbound(context))
    assert message["Subject"] == expected
    assert message["Bcc"] is None


def test_references_follow_rfc_5322_and_are_trimmed() -> None:
    chain = [f"<r{number}@example.com>" for number in range(40)]
    context = {
        "from": "alice@example.com",
        "message_id": "<m@example.com>",
        "references": chain,
    }
    references = str(compose(outbound(context))["References"]).split()
    assert len(references) == MAX_REFERENCES
    assert references[0] == "<r0@example.com>"  # the root: the lane
    assert references[-1] == "<m@example.com>"
    assert references[-2] == "<r39@example.com>"
    # a parent with only In-Reply-To (parse stores it as the chain)
    context = {"from": "a@example.com", "message_id": "<m@x>", "references": ["<p@x>"]}
    assert compose(outbound(context))["References"] == "<p@x> <m@x>"


def test_outlook_thread_index_gets_a_child_block() -> None:
    header = bytes([1]) + (134_000_000_000_000_000 >> 24).to_bytes(5, "big") + bytes(range(16))
    parent = base64.b64encode(header).decode()
    context = {
        "from": "bob@contoso.com",
        "subject": "RE: Deploy 42",
        "thread_topic": "Deploy 42",
        "thread_index": parent,
    }
    message = compose(outbound(context))
    assert message["Thread-Topic"] == "Deploy 42"
    child = base64.b64decode(str(message["Thread-Index"]))
    assert len(child) == 27 and child[:22] == header
    assert compose(outbound(context))["Thread-Index"] == message["Thread-Index"]  # a retry
    block = int.from_bytes(child[22:], "big")
    assert block >> 39 == 0  # less than ~1.8 years after the conversation began
    filetime_now = int(NOW.timestamp() * 10**7) + 116_444_736_000_000_000
    delta = filetime_now - (int.from_bytes(header[1:6], "big") << 24)
    assert (block >> 8) & 0x7FFFFFFF == (delta >> 18) & 0x7FFFFFFF
    # a broken or absent parent index: no Thread-Index
    broken = {**context, "thread_index": "not base64!"}
    assert compose(outbound(broken))["Thread-Index"] is None
    assert compose(outbound(broken))["Thread-Topic"] == "Deploy 42"


def test_the_reply_serializes_with_the_smtp_policy() -> None:
    context = {
        "from": "Jörg Müller <joerg@example.de>",
        "cc": ["Zoë <zoe@example.de>"],
        "subject": "Größe " + "sehr lang " * 30,
        "message_id": "<m@example.de>",
        "references": [f"<ref-{n}-{'x' * 60}@example.de>" for n in range(30)],
        "thread_topic": "Größe",
    }
    message = compose(outbound(context, text="Schöne Grüße — **fertig**.\n" * 50))
    data = message.as_bytes(policy=policy.SMTP)
    assert data.isascii()
    lines = data.split(b"\r\n")
    assert all(len(line) <= 998 for line in lines)
    assert b"\n" not in data.replace(b"\r\n", b"")
    again = message_from_bytes(data, policy=policy.default)
    assert str(again["To"]) == "Jörg Müller <joerg@example.de>"
    assert str(again["Subject"]).startswith("Re: Größe sehr lang")
    body = again.get_body(preferencelist=("plain",))
    assert body is not None and "Schöne Grüße — **fertig**." in body.get_content()
    one_long_line = compose(outbound(context, text="a" * 5000)).as_bytes(policy=policy.SMTP)
    assert max(len(line) for line in one_long_line.split(b"\r\n")) <= 998


def test_round_trip_the_lane_continues() -> None:
    first = parsed(HUMAN)
    reply = compose(outbound(first.reply_context))
    # the bot's own reply, seen in the mailbox (a Bcc or the Sent copy), is not taken
    own = parse(
        reply.as_bytes(), mailbox_address=BOT, own_domain_ids=(DOMAIN,), max_bytes=10**7, now_ms=1
    )
    assert (own.action, own.reason) == ("skip", "own_message")
    second = parsed(human_reply_to(reply, "Thanks, and restart web too.", message_id="<h2@x>"))
    assert second.thread == first.thread
    assert second.thread.lane == "email:<root-1@example.com>"
    assert second.text == "Thanks, and restart web too."
    again = compose(outbound(second.reply_context, delivery_id="reply:session-1:run-2"))
    assert str(again["Subject"]) == "Re: Deploy 42"
    assert str(again["References"]).split() == [
        "<root-1@example.com>",
        str(reply["Message-ID"]),
        "<h2@x>",
    ]
    third = parsed(human_reply_to(again, "Done?", message_id="<h3@x>"))
    assert third.thread == first.thread


def test_a_reply_naming_only_the_bot_s_message_stays_in_its_thread() -> None:
    """Some clients write In-Reply-To without References: the reply named the bot's message,
    whose id became a thread of its own, and the agent lost the conversation (D345)."""
    first = parsed(HUMAN)
    reply = compose(outbound(first.reply_context))
    assert thread_of_own_id(str(reply["Message-ID"]), [DOMAIN]) == "<root-1@example.com>"
    answer = EmailMessage()
    answer["From"] = "Alice Example <alice@example.com>"
    answer["To"] = BOT
    answer["Subject"] = "Re: Deploy 42"
    answer["Message-ID"] = "<irt-only@x>"
    answer["In-Reply-To"] = str(reply["Message-ID"])  # and no References
    answer.set_content("and the database too")
    second = parsed(answer.as_bytes())
    assert second.thread == first.thread
    # another domain's id of the same shape, or a carried part that is no thread: as before
    forged = str(reply["Message-ID"]).replace("gw.example", "evil.example")
    assert thread_of_own_id(forged, [DOMAIN]) is None
    assert thread_of_own_id("<dg." + "a" * 32 + ".mfrgg@gw.example>", [DOMAIN]) is None
    long_root = "<" + "r" * 200 + "@example.com>"  # no room: the id carries no thread
    plain = reply_message_id("reply:x", DOMAIN, long_root)
    assert plain == reply_message_id("reply:x", DOMAIN) and len(plain) < 250


def test_an_internationalized_domain_is_answered_in_its_ascii_form() -> None:
    """`alice@bücher.example` was taken in and its reply failed: "no recipient"."""
    message = compose(
        outbound({"from": "Alice <alice@bücher.example>", "cc": ["Bob <bob@müller.example>"]})
    )
    assert str(message["To"]) == "Alice <alice@xn--bcher-kva.example>"
    assert str(message["Cc"]) == "Bob <bob@xn--mller-kva.example>"


def test_no_recipient_is_an_error() -> None:
    with pytest.raises(ValueError, match="no recipient"):
        compose(outbound({}))
    with pytest.raises(ValueError, match="no recipient"):
        compose(outbound({"from": f"Bot <{BOT}>"}))
    with pytest.raises(ValueError, match="from_address"):
        compose_reply(
            outbound({"from": "a@example.com"}),
            from_address="nobody",
            from_name=None,
            domain=DOMAIN,
            now=NOW,
        )


def test_failure_notice_is_short() -> None:
    message = compose(outbound({"from": "a@example.com"}, kind="failure_notice", text=""))
    body = message.get_body(preferencelist=("plain",))
    assert body is not None
    assert body.get_content() == "Something went wrong: I could not finish this request.\n"
    long = compose(outbound({"from": "a@example.com"}, kind="failure_notice", text="x" * 5000))
    long_body = long.get_body(preferencelist=("plain",))
    assert long_body is not None and len(long_body.get_content()) <= 2001


# --- approval requests -----------------------------------------------------------------------


def view(calls: int = 2, args: dict[str, Any] | None = None) -> ApprovalView:
    return ApprovalView(
        session="session-1",
        run_id="run-1",
        wait_id="wait-1",
        calls=tuple(
            PendingCall(
                tool_call_id=f"call_{n}",
                tool_name="deploy" if n == 0 else "restart",
                args=args if args is not None else {"build": 42 + n, "env": "prod <eu>"},
                args_digest=f"sha256:{n}",
            )
            for n in range(calls)
        ),
    )


LINKS = {
    "approve": "https://gw.example/email/decide?t=abc&d=approve",
    "deny": "https://gw.example/email/decide?t=abc&d=deny",
}


def test_approval_request_lists_calls_links_and_the_warning() -> None:
    context = parsed(HUMAN).reply_context
    request = outbound(
        context,
        kind="approval_request",
        text="Approval needed before I run deploy.",
        approval=view(),
    )
    message = compose(request, approval_links=LINKS)
    assert message["Cc"] is None  # the links go to the author only
    plain_part = message.get_body(preferencelist=("plain",))
    html_part = message.get_body(preferencelist=("html",))
    assert plain_part is not None and html_part is not None
    text = plain_part.get_content()
    assert text.startswith("Approval needed before I run deploy.")
    assert "1. deploy (call call_0)" in text and "2. restart (call call_1)" in text
    assert '\n      "build": 42,\n' in text  # pretty JSON, indented
    assert LINKS["approve"] in text and LINKS["deny"] in text
    assert 'Replying "approve"' in text and "does not approve" in text
    assert "anyone can put any sender address on an email" in text
    page = html_part.get_content()
    assert 'href="https://gw.example/email/decide?t=abc&amp;d=approve"' in page
    assert "prod &lt;eu&gt;" in page and "prod <eu>" not in page


def test_approval_request_without_links_points_to_an_operator() -> None:
    request = outbound(
        {"from": "a@example.com"}, kind="approval_request", text="Approve?", approval=view(1)
    )
    body = compose(request).get_body(preferencelist=("plain",))
    assert body is not None
    text = body.get_content()
    assert "ask an operator to decide it (run run-1, wait wait-1)" in text
    assert "https://" not in text


def test_a_batch_too_large_to_show_gets_no_links() -> None:
    request = outbound(
        {"from": "a@example.com"},
        kind="approval_request",
        text="Approve?",
        approval=view(MAX_CALLS_SHOWN + 1),
    )
    body = compose(request, approval_links=LINKS).get_body(preferencelist=("plain",))
    assert body is not None
    text = body.get_content()
    assert "…and 1 more call." in text
    assert LINKS["approve"] not in text
    assert "ask an operator to decide it" in text


def test_long_arguments_are_truncated() -> None:
    request = outbound(
        {"from": "a@example.com"},
        kind="approval_request",
        text="Approve?",
        approval=view(1, {"script": "x" * 20_000, "target": "ALL-PROD-DATABASES"}),
    )
    message = compose(request, approval_links=LINKS)
    body = message.get_body(preferencelist=("plain",))
    page = message.get_body(preferencelist=("html",))
    assert body is not None and page is not None
    text = body.get_content()
    assert "…(truncated, " in text
    assert len(text) < MAX_ARGS_CHARS + 2000
    # what was cut was not seen, so no link approves it (D52); denying still may
    assert "ALL-PROD-DATABASES" not in text
    assert LINKS["approve"] not in text and LINKS["deny"] in text
    assert "cannot be approved from email" in text and "`gateway ops approve`" in text
    assert "d=approve" not in page.get_content() and "d=deny" in page.get_content()


def test_format_characters_in_a_call_are_shown_not_obeyed() -> None:
    args = {"command": "echo done \u202e\u2066// keep it safe\u2069 ;rm -rf /srv/data #"}
    request = outbound(
        {"from": "a@example.com"}, kind="approval_request", text="Approve?", approval=view(1, args)
    )
    message = compose(request, approval_links=LINKS)
    for part in ("plain", "html"):
        body = message.get_body(preferencelist=(part,))
        assert body is not None
        text = body.get_content()
        assert not any(c in text for c in "\u202e\u2066\u2069")
        assert "echo done \\u202e\\u2066// keep it safe\\u2069 ;rm -rf /srv/data #" in text
    plain = message.get_body(preferencelist=("plain",))
    assert plain is not None and LINKS["approve"] in plain.get_content()  # all of it was seen


@pytest.mark.parametrize(
    "links",
    [
        {"approve": "javascript:alert(1)", "deny": "https://x.example"},
        {"approve": "https://x.example"},
        {"approve": "https://x.example/a b", "deny": "https://x.example"},
    ],
)
def test_malformed_links_are_refused(links: dict[str, str]) -> None:
    request = outbound({"from": "a@example.com"}, kind="approval_request", approval=view(1))
    with pytest.raises(ValueError, match="approval_links"):
        compose(request, approval_links=links)


# --- Markdown --------------------------------------------------------------------------------

MARKDOWN = [
    ("paragraphs", "one\ntwo\n\nthree", "<p>one<br>\ntwo</p>\n<p>three</p>"),
    (
        "bold-italic",
        "**b** and *i* and _u_",
        "<p><strong>b</strong> and <em>i</em> and <em>u</em></p>",
    ),
    ("snake-case", "call my_tool_name now", "<p>call my_tool_name now</p>"),
    ("code-span", "run `a < b && *c*`", "<p>run <code>a &lt; b &amp;&amp; *c*</code></p>"),
    ("fence", '```json\n{"a": "<b>"}\n```', '<pre><code>{"a": "&lt;b&gt;"}</code></pre>'),
    ("bullets", "- a\n- **b**", "<ul><li>a</li><li><strong>b</strong></li></ul>"),
    ("numbers", "1. a\n2. b", "<ol><li>a</li><li>b</li></ol>"),
    (
        "link",
        "[docs](https://x.example/?a=1&b=2)",
        '<p><a href="https://x.example/?a=1&amp;b=2">docs</a></p>',
    ),
    (
        "bare-link",
        "see https://x.example/a_b_c.",
        '<p>see <a href="https://x.example/a_b_c">https://x.example/a_b_c</a>.</p>',
    ),
    ("js-link", "[x](javascript:alert(1))", "<p>[x](javascript:alert(1))</p>"),
    ("html", "<img src=x onerror=alert(1)>", "<p>&lt;img src=x onerror=alert(1)&gt;</p>"),
    ("quote-marks", "say \"hi\" & 'bye'", "<p>say &quot;hi&quot; &amp; &#x27;bye&#x27;</p>"),
    ("heading", "# Title", "<p><strong>Title</strong></p>"),
    ("quote", "> quoted", "<blockquote>quoted</blockquote>"),
    ("rule", "a\n\n---\n\nb", "<p>a</p>\n<hr>\n<p>b</p>"),
    ("arithmetic", "2 * 3 * 4", "<p>2 * 3 * 4</p>"),
]


@pytest.mark.parametrize(("text", "html"), [c[1:] for c in MARKDOWN], ids=[c[0] for c in MARKDOWN])
def test_markdown_to_html(text: str, html: str) -> None:
    assert markdown_to_html(text) == html


# --- approval tokens -------------------------------------------------------------------------

CALLS = (("call_0", "sha256:0"), ("call_1", "sha256:1"))
EXPIRES = NOW + timedelta(days=2)


def token(**changes: Any) -> str:
    fields: dict[str, Any] = {
        "key": KEY,
        "session": "session-1",
        "run_id": "run-1",
        "wait_id": "wait-1",
        "calls": CALLS,
        "approver": "Alice@Example.com",
        "decision": "approve",
        "expires_at": EXPIRES,
    }
    fields.update(changes)
    return approval_token(**fields)


def test_a_token_verifies_to_its_claims() -> None:
    made = token()
    assert len(made) < 400
    assert all(char.isalnum() or char in "-_." for char in made)
    claims = verify_approval_token(made, key=KEY, now=NOW)
    assert claims.session == "session-1"
    assert claims.run_id == "run-1"
    assert claims.wait_id == "wait-1"
    assert claims.calls == CALLS
    assert claims.approver == "alice@example.com"
    assert claims.decision == "approve"
    assert claims.expires_at == int(EXPIRES.timestamp())
    assert claims.token_id.startswith("at_")


def test_token_id_names_the_batch_and_the_approver() -> None:
    approve = verify_approval_token(token(), key=KEY, now=NOW)
    deny = verify_approval_token(token(decision="deny"), key=KEY, now=NOW)
    later = verify_approval_token(token(expires_at=EXPIRES + timedelta(days=1)), key=KEY, now=NOW)
    reordered = verify_approval_token(token(calls=CALLS[::-1]), key=KEY, now=NOW)
    other = verify_approval_token(token(approver="bob@example.com"), key=KEY, now=NOW)
    batch = verify_approval_token(token(wait_id="wait-2"), key=KEY, now=NOW)
    assert approve.token_id == deny.token_id == later.token_id == reordered.token_id
    assert approve.token_id != other.token_id
    assert approve.token_id != batch.token_id


def _claims_of(made: str) -> dict[str, Any]:
    valid, claims = _serializer(KEY).loads_unsafe(made)
    assert valid
    assert isinstance(claims, dict)
    return claims


def _resigned_payload(made: str, change: dict[str, Any]) -> str:
    """`made` with claims changed but its original signature kept (a forgery)."""
    claims = _claims_of(made)
    claims.update(change)
    forged = _serializer(KEY).dump_payload(claims).decode()
    return f"{forged}.{made.rsplit('.', 1)[1]}"


@pytest.mark.parametrize(
    "change",
    [
        {"s": "session-2"},
        {"r": "run-2"},
        {"w": "wait-2"},
        {"c": [["call_0", "sha256:0"]]},
        {"c": [["call_0", "sha256:X"], ["call_1", "sha256:1"]]},
        {"a": "mallory@example.com"},
        {"d": "deny"},
        {"e": 4_000_000_000},
        {"t": "at_other"},
        {"v": 3},
    ],
    ids=lambda change: next(iter(change)),
)
def test_tampering_with_any_claim_fails(change: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="bad signature"):
        verify_approval_token(_resigned_payload(token(), change), key=KEY, now=NOW)


@pytest.mark.parametrize("made", ["new", "old"])
def test_every_flipped_character_fails(made: str) -> None:
    made = token() if made == "new" else OLD_LINK
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    for position in range(len(made)):
        if made[position] == ".":
            continue
        replacement = alphabet[(alphabet.index(made[position]) + 1) % len(alphabet)]
        changed = made[:position] + replacement + made[position + 1 :]
        with pytest.raises(ValueError, match=r"bad signature|malformed"):
            verify_approval_token(changed, key=KEY, now=NOW)


def test_wrong_key_expiry_and_malformed_tokens() -> None:
    made = token()
    with pytest.raises(ValueError, match="bad signature"):
        verify_approval_token(made, key=b"x" * 32, now=NOW)
    with pytest.raises(ValueError, match="expired"):
        verify_approval_token(made, key=KEY, now=EXPIRES)
    verify_approval_token(made, key=KEY, now=EXPIRES - timedelta(seconds=1))
    for bad in ["", ".", made + ".x", made.replace(".", ""), "a" * (MAX_TOKEN_CHARS + 1), "é.x"]:
        with pytest.raises(ValueError, match="malformed"):
            verify_approval_token(bad, key=KEY, now=NOW)
    with pytest.raises(ValueError, match="at least 32 bytes"):
        verify_approval_token(made, key=b"short", now=NOW)


def test_the_expiry_is_judged_by_the_clock_given() -> None:
    past = datetime(2001, 1, 1, tzinfo=UTC)
    old = token(expires_at=past + timedelta(hours=1))
    assert verify_approval_token(old, key=KEY, now=past).expires_at == int(past.timestamp()) + 3600
    future = datetime(2100, 1, 1, tzinfo=UTC)
    with pytest.raises(ValueError, match="expired"):
        verify_approval_token(token(), key=KEY, now=future)


def _signed(claims: Any) -> str:
    raw = claims if isinstance(claims, bytes) else json.dumps(claims).encode()
    return _serializer(KEY).make_signer().sign(base64_encode(raw)).decode()


def _malformed(good: dict[str, Any]) -> list[Any]:
    return [
        [1, 2],
        {**good, "extra": 1},
        {key: value for key, value in good.items() if key != "e"},
        {**good, "v": True},
        {**good, "e": "soon"},
        {**good, "e": True},
        {**good, "d": "maybe"},
        {**good, "c": []},
        {**good, "c": [["a"]]},
        {**good, "c": [["call_0", "sha256:0"], ["call_0", "sha256:0"]]},
        {**good, "a": "no-at-sign"},
        {**good, "s": ""},
        b'{"v":1,"v":1}',
        b"\xff\xfe",
        b'{"v": NaN}',
    ]


def test_validly_signed_but_malformed_content_is_refused() -> None:
    good = _claims_of(token())
    for bad in [*_malformed(good), {**good, "t": "at_wrong"}, {**good, "v": 1}]:
        with pytest.raises(ValueError, match="malformed"):
            verify_approval_token(_signed(bad), key=KEY, now=NOW)


# A link as the gateway made them before itsdangerous (D179), for `token()`'s batch.
OLD_LINK = (
    "eyJ2IjoxLCJzIjoic2Vzc2lvbi0xIiwiciI6InJ1bi0xIiwidyI6IndhaXQtMSIsImMiOltbImNhbGxfMCIsInNo"
    "YTI1NjowIl0sWyJjYWxsXzEiLCJzaGEyNTY6MSJdXSwiYSI6ImFsaWNlQGV4YW1wbGUuY29tIiwiZCI6ImFwcHJv"
    "dmUiLCJlIjoxNzk2MjE4MjAwLCJ0IjoiYXRfZm15N3c2czY1ZW5odHRkMmliNHFoMnA0dnRuY3RmanMifQ"
    ".HhmrpapAXSD5nQyVdq44_bzGSaqeEUnDMye-Ma8BtfY"
)
OLD_CONTEXT = b"durable-gateway email approval token v1\n"


def _old_signed(claims: Any) -> str:
    raw = claims if isinstance(claims, bytes) else json.dumps(claims).encode()
    payload = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    mac = hmac.new(KEY, OLD_CONTEXT + payload.encode(), hashlib.sha256).digest()
    return f"{payload}.{base64.urlsafe_b64encode(mac).decode().rstrip('=')}"


def test_a_link_sent_before_the_upgrade_works_until_its_own_expiry() -> None:
    claims = verify_approval_token(OLD_LINK, key=KEY, now=NOW)
    assert claims == verify_approval_token(token(), key=KEY, now=NOW)
    verify_approval_token(OLD_LINK, key=KEY, now=EXPIRES - timedelta(seconds=1))
    with pytest.raises(ValueError, match="expired"):
        verify_approval_token(OLD_LINK, key=KEY, now=EXPIRES)
    with pytest.raises(ValueError, match="bad signature"):
        verify_approval_token(OLD_LINK, key=b"x" * 32, now=NOW)


def test_an_old_link_changed_or_malformed_is_refused() -> None:
    payload, signature = OLD_LINK.split(".")
    good = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert _old_signed(good) != OLD_LINK  # json.dumps spaces: the same claims, other bytes
    assert verify_approval_token(_old_signed(good), key=KEY, now=NOW).token_id == good["t"]
    for change in ({"a": "mallory@example.com"}, {"d": "deny"}, {"e": 4_000_000_000}):
        forged = base64.urlsafe_b64encode(json.dumps({**good, **change}).encode()).decode()
        with pytest.raises(ValueError, match="bad signature"):
            verify_approval_token(f"{forged.rstrip('=')}.{signature}", key=KEY, now=NOW)
    for bad in [*_malformed(good), {**good, "t": "at_wrong"}, {**good, "t": 1}, {**good, "v": 2}]:
        with pytest.raises(ValueError, match="malformed"):
            verify_approval_token(_old_signed(bad), key=KEY, now=NOW)


def test_token_inputs_are_checked() -> None:
    with pytest.raises(ValueError, match="at least 32 bytes"):
        token(key=b"short")
    with pytest.raises(ValueError, match="malformed"):
        token(calls=())
    with pytest.raises(ValueError, match="malformed"):
        token(decision="maybe")
    with pytest.raises(ValueError, match="too long"):
        token(calls=[(f"call_{_hex(n)[:90]}", _hex(-n)) for n in range(1, 101)])


def _hex(n: int) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()


# --- hostile display names and headers: decoded, then cleaned, never injected -----------------


def _word(text: str) -> str:
    """`text` as one RFC 2047 encoded word (base64)."""
    return f"=?utf-8?b?{base64.b64encode(text.encode()).decode()}?="


INJECT = "\r\nBcc: mallory@evil.example"
# (id, header of the inbound mail, its hostile part): From and Cc get it as the display name of
# eve@example.test and ann@example.test, Subject and Thread-Topic as their value
HOSTILE_HEADERS = [
    ("q-word-crlf", "From", "=?utf-8?q?Eve=0D=0ABcc=3A_mallory=40evil=2Eexample?="),
    ("q-word-crlf-raw-specials", "From", "=?utf-8?q?Eve=0D=0ABcc:_mallory@evil.example?="),
    ("b-word-crlf", "Cc", _word("Ann" + INJECT)),
    ("b-word-lf", "Cc", _word("Ann\nX-Injected: yes")),
    ("b-word-cr", "From", _word("Eve\rX-Injected: yes")),
    ("word-in-quotes", "From", '"' + _word("Eve" + INJECT) + '"'),
    ("word-beside-text", "Cc", "Ann " + _word(INJECT) + " Smith"),
    ("double-encoded", "Cc", _word(_word("Ann" + INJECT))),
    ("triple-encoded", "From", _word(_word(_word("Eve" + INJECT)))),
    ("nul-and-vertical-tab", "From", _word("Eve\x00\x0b")),
    ("unicode-line-separator", "Cc", _word("Ann\u2028Bcc: mallory@evil.example")),
    ("next-line-control", "Cc", _word("Ann\x85Bcc: mallory@evil.example")),
    ("comma-and-address", "Cc", _word("Ann, mallory@evil.example")),
    ("angle-address", "From", _word("Eve <mallory@evil.example>")),
    ("unknown-charset", "From", "=?x-unknown?q?Eve=0D=0ABcc:_m@evil.example?="),
    ("long-name", "From", _word("E" * 300 + INJECT)),
    ("subject-crlf", "Subject", _word("Deploy" + INJECT)),
    ("subject-double-encoded", "Subject", _word(_word("Deploy" + INJECT))),
    ("topic-double-encoded", "Thread-Topic", _word(_word("Deploy" + INJECT))),
]
REPLY_HEADERS = {
    "From", "To", "Cc", "Subject", "Date", "Message-ID", "In-Reply-To", "References",
    "Thread-Topic", "Thread-Index", "Auto-Submitted", "X-Auto-Response-Suppress",
    "MIME-Version", "Content-Type",
}  # fmt: skip


def _hostile(header: str, value: str) -> bytes:
    fields = {
        "From": f"{value} <eve@example.test>" if header == "From" else "Eve <eve@example.test>",
        "To": BOT,
        "Cc": f"{value} <ann@example.test>" if header == "Cc" else "Ann <ann@example.test>",
        "Subject": value if header == "Subject" else "Deploy",
        "Thread-Topic": value if header == "Thread-Topic" else "Deploy",
        "Thread-Index": "AQHbQ2p7xY0v1cdq3kSZ0kz9t6C0zQ==",
        "Message-ID": "<hostile-1@example.test>",
    }
    head = "".join(f"{key}: {text}\r\n" for key, text in fields.items())
    return f"{head}MIME-Version: 1.0\r\nContent-Type: text/plain\r\n\r\nPlease deploy.\r\n".encode()


@pytest.mark.parametrize(
    ("header", "value"), [c[1:] for c in HOSTILE_HEADERS], ids=[c[0] for c in HOSTILE_HEADERS]
)
def test_a_hostile_header_is_decoded_then_cleaned_and_the_reply_goes_to_everyone(
    header: str, value: str
) -> None:
    inbound = parsed(_hostile(header, value))
    assert inbound.author.id == "eve@example.test"
    assert not any(c in (inbound.author.name or "") for c in "\r\n\x00\x85\u2028")
    message = compose(outbound(inbound.reply_context))  # no ValueError: no dead letter
    wire = bytes(message)
    back = message_from_bytes(wire, policy=policy.default)
    names = [key for key, _ in back.items()]
    assert set(names) <= REPLY_HEADERS and len(names) == len(set(names)), names
    assert [a.addr_spec for a in back["To"].addresses] == ["eve@example.test"]
    assert [a.addr_spec for a in back["Cc"].addresses] == ["ann@example.test"]
    for key in ("From", "To", "Cc", "Subject", "Thread-Topic"):
        shown = str(back[key])
        assert not any(c in shown for c in "\r\n\x00\x0b\x85\u2028"), (key, shown)
        assert "=?" not in shown.replace("= ?", ""), (key, shown)  # decoded once: nothing left
    head = wire.split(b"\r\n\r\n", 1)[0]
    assert not re.search(rb"^(?:Bcc|X-Injected):", head, re.MULTILINE | re.IGNORECASE)


# --- Markdown: what the one parse changed, hostile markup (D175) -----------------------------

PARSED = [
    ("strike", "~~gone~~", "<p><s>gone</s></p>"),
    (
        "table",
        "| a | b |\n|--:|---|\n| **1** | x<y |",
        '<table border="1" cellpadding="4" cellspacing="0"><tr><th style="text-align:right">a'
        '</th><th>b</th></tr><tr><td style="text-align:right"><strong>1</strong></td>'
        "<td>x&lt;y</td></tr></table>",
    ),
    (
        "image-as-link",
        "![a cat](https://x.example/c.png)",
        '<p><a href="https://x.example/c.png">a cat</a></p>',
    ),
    (
        "autolink",
        "<https://x.example/a>",
        '<p><a href="https://x.example/a">https://x.example/a</a></p>',
    ),
    ("nested-list", "- a\n  - b", "<ul><li>a<ul><li>b</li></ul></li></ul>"),
    ("ordered-start", "3. c\n4. d", '<ol start="3"><li>c</li><li>d</li></ol>'),
    ("indented-code", "    x < y", "<pre><code>x &lt; y</code></pre>"),
    ("entities", "&copy; &amp;", "<p>© &amp;</p>"),
    ("nul", "a\x00b", "<p>a\ufffdb</p>"),
]


@pytest.mark.parametrize(("text", "html"), [c[1:] for c in PARSED], ids=[c[0] for c in PARSED])
def test_markdown_to_html_follows_commonmark(text: str, html: str) -> None:
    assert markdown_to_html(text) == html


HOSTILE = [
    "<script>alert(1)</script>",
    '<a href="javascript:alert(1)">x</a>',
    "<img src=x onerror=alert(1)>",
    "[x](javascript:alert(1))",
    "[x](JaVaScRiPt:alert(1))",
    "[x](  javascript:alert(1)  )",
    "[x](<javascript:alert(1)>)",
    "[x](vbscript:msgbox(1))",
    "[x](data:text/html;base64,PHNjcmlwdD4=)",
    "![x](data:image/png;base64,AAAA)",
    "<javascript:alert(1)>",
    "[x][r]\n\n[r]: javascript:alert(1)",
    '[x](https://a.example/"onmouseover="alert(1))',
    '[x](https://a.example/ "t" onmouseover=alert(1))',
    "`<script>` and ```\n<script>\n```",
    "| <b>x</b> |\n|---|\n| <i>y</i> |",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_markdown_gives_no_markup_of_its_own(text: str) -> None:
    page = markdown_to_html(text)
    assert {tag.strip("/") for tag in re.findall(r"<(/?[a-z]+)", page)} <= _OWN_TAGS
    assert all(
        href.startswith(("https://", "http://", "mailto:"))
        for href in re.findall(r'href="([^"]*)"', page)
    )
    assert "javascript:" not in "".join(re.findall(r'href="([^"]*)"', page)).lower()
    assert " on" not in "".join(re.findall(r"<[a-z][^>]*>", page))


_OWN_TAGS = {"p", "a", "br", "code", "pre", "strong", "em", "s", "table", "tr", "th", "td"}
