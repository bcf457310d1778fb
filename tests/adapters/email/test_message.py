"""Inbound email: the loop guard, threads, reply text, charsets, attachments, hostile bytes."""

from __future__ import annotations

import time
import warnings
from email import headerregistry
from email.message import EmailMessage
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from inscriptis.model.config import ParserConfig  # type: ignore[import-untyped]
from inscriptis.model.tag import CustomHtmlTagHandlerMapping  # type: ignore[import-untyped]

from adapters.channel import Inbound
from adapters.email import message as message_module
from adapters.email.compose import reply_message_id
from adapters.email.headers import MAX_STRUCTURED_CHARS
from adapters.email.message import (
    MAX_ATTACHMENTS,
    MAX_TEXT_CHARS,
    Parsed,
    attachment_content,
    classify_automatic,
    html_to_text,
    message_ids,
    normalize_subject,
    parse,
    parse_head,
)

BOT = "bot@gw.example"
DOMAIN = "gw.example"
LIMIT = 10_000_000
BOT_REPLY_ID = reply_message_id("reply:run-1", DOMAIN)


def read(raw: bytes | str, *, max_bytes: int = LIMIT) -> Parsed:
    data = raw.encode("utf-8") if isinstance(raw, str) else raw
    return parse(data, mailbox_address=BOT, own_domain_ids=(DOMAIN,), max_bytes=max_bytes, now_ms=7)


def taken(raw: bytes | str) -> Inbound:
    parsed = read(raw)
    assert parsed.action == "take", parsed.reason
    assert parsed.inbound is not None
    return parsed.inbound


# --- realistic messages ----------------------------------------------------------------------

GMAIL_REPLY = f"""\
Return-Path: <alice@gmail.com>
Delivered-To: {BOT}
Received: by mail-lf1-f41.google.com with SMTP id 2adb3069b0e04-5a1;
        Mon, 30 Nov 2026 05:03:11 -0800 (PST)
DKIM-Signature: v=1; a=rsa-sha256; c=relaxed/relaxed; d=gmail.com; s=20230601;
 h=to:subject:message-id:date:from:in-reply-to:references:mime-version; bh=47DEQ=; b=dGVzdA==
X-Gm-Message-State: AOJu0YwQ1
X-Google-Smtp-Source: AGHT+IFq
MIME-Version: 1.0
References: <CAH+root=Q1@mail.gmail.com> {BOT_REPLY_ID}
In-Reply-To: {BOT_REPLY_ID}
From: Alice Example <Alice@Gmail.com>
Date: Mon, 30 Nov 2026 14:03:00 +0100
Message-ID: <CAH+reply=Z9@mail.gmail.com>
Subject: Re: Deploy 42
To: Deploy Bot <{BOT}>
Cc: Carol <carol@example.com>
Content-Type: multipart/alternative; boundary="000000000000a1b2c3"

--000000000000a1b2c3
Content-Type: text/plain; charset="UTF-8"

Yes, approve it please.

Thanks,
Alice

On Mon, Nov 30, 2026 at 2:00 PM Deploy Bot <{BOT}> wrote:

> Should I deploy build 42?
>
> - it passed CI

--000000000000a1b2c3
Content-Type: text/html; charset="UTF-8"

<div dir="ltr">Yes, approve it please.<div><br></div><div>Thanks,</div><div>Alice</div></div>\
<br><div class="gmail_quote"><div dir="ltr" class="gmail_attr">On Mon, Nov 30, 2026 at 2:00 PM \
Deploy Bot &lt;<a href="mailto:{BOT}">{BOT}</a>&gt; wrote:<br></div><blockquote \
class="gmail_quote">Should I deploy build 42?</blockquote></div>

--000000000000a1b2c3--
"""

OUTLOOK_REPLY = f"""\
Received: from AM9PR07MB7.eurprd07.prod.outlook.com (2603:10a6:20b:3a0::9) by
 AS8PR07MB8.eurprd07.prod.outlook.com with HTTPS; Mon, 30 Nov 2026 13:05:12 +0000
From: Bob Smith <bob.smith@contoso.com>
To: Deploy Bot <{BOT}>
Subject: RE: Deploy 42
Thread-Topic: Deploy 42
Thread-Index: AQHbQ2p7xY0v1cdq3kSZ0kz9t6C0zQ==
Date: Mon, 30 Nov 2026 13:05:11 +0000
Message-ID: <AM9PR07MB7A1B2C3D4E5F@AM9PR07MB7.eurprd07.prod.outlook.com>
References: <CAH+root=Q1@mail.gmail.com> {BOT_REPLY_ID}
In-Reply-To: {BOT_REPLY_ID}
Accept-Language: en-US
Content-Language: en-US
X-MS-Has-Attach:
X-MS-TNEF-Correlator:
x-ms-publictraffictype: Email
x-ms-exchange-organization-authas: Internal
X-MS-Exchange-CrossTenant-id: 72f988bf-86f1-41af-91ab-2d7cd011db47
Content-Type: text/plain; charset="us-ascii"
Content-Transfer-Encoding: quoted-printable
MIME-Version: 1.0

Deny - not today.

Bob Smith
Sent from my iPhone

________________________________
From: Deploy Bot <{BOT}>
Sent: Monday, November 30, 2026 2:00 PM
To: Bob Smith <bob.smith@contoso.com>
Subject: Deploy 42

Should I deploy build 42? This is a long line that Outlook would send encoded as quoted-pr=
intable soft breaks.
"""

OUTLOOK_GERMAN_REPLY = """\
From: =?iso-8859-1?Q?J=F6rg_M=FCller?= <joerg.mueller@firma.de>
To: Deploy Bot <bot@gw.example>
Subject: AW: Deploy 42
Thread-Topic: Deploy 42
Thread-Index: AQHbQ2p7xY0v1cdq3kSZ0kz9t6C0zbKf3Q2A
Date: Mon, 30 Nov 2026 13:07:00 +0000
Message-ID: <FR3P281MB1234ABCD@FR3P281MB1234.DEUP281.PROD.OUTLOOK.COM>
References: <CAH+root=Q1@mail.gmail.com>
In-Reply-To: <CAH+root=Q1@mail.gmail.com>
Content-Language: de-DE
X-MS-Has-Attach:
Content-Type: text/plain; charset="iso-8859-1"
Content-Transfer-Encoding: quoted-printable
MIME-Version: 1.0

Bitte nicht heute, erst n=E4chste Woche.

Mit freundlichen Gr=FC=DFen
J=F6rg M=FCller

Von: Deploy Bot <bot@gw.example>
Gesendet: Montag, 30. November 2026 14:00
An: J=F6rg M=FCller <joerg.mueller@firma.de>
Betreff: Deploy 42

Soll ich Build 42 ausrollen?
"""

GMAIL_GERMAN_REPLY = f"""\
From: Jana <jana@gmail.com>
To: {BOT}
Subject: Re: Deploy 42
Date: Mon, 30 Nov 2026 14:09:00 +0100
Message-ID: <CAH+de=1@mail.gmail.com>
References: <CAH+root=Q1@mail.gmail.com>
In-Reply-To: <CAH+root=Q1@mail.gmail.com>
MIME-Version: 1.0
Content-Type: text/plain; charset="UTF-8"
Content-Transfer-Encoding: 8bit

Ja, bitte ausrollen.

Am Mo., 30. Nov. 2026 um 14:00 Uhr schrieb Deploy Bot <{BOT}>:

> Soll ich Build 42 ausrollen?
"""

APPLE_MAIL_REPLY = f"""\
Content-Type: text/plain;
\tcharset=utf-8;
\tformat=flowed;
\tdelsp=yes
Mime-Version: 1.0 (Mac OS X Mail 16.0 \\(3774.600.62\\))
Subject: Re: Deploy 42
From: Dana Lee <dana@icloud.com>
In-Reply-To: {BOT_REPLY_ID}
Date: Mon, 30 Nov 2026 14:11:00 +0100
Content-Transfer-Encoding: 8bit
Message-Id: <5F1C2D3E-AAAA-4BBB-8CCC-0123456789AB@icloud.com>
References: <CAH+root=Q1@mail.gmail.com> {BOT_REPLY_ID}
To: Deploy Bot <{BOT}>
X-Mailer: Apple Mail (2.3774.600.62)

Sounds good, go ahead with the rollout once the smoke tests are \x20
green.

Sent from my iPhone

> On 30. Nov 2026, at 14:00, Deploy Bot <{BOT}> wrote:
>=20
> Should I deploy build 42?
"""

OUTLOOK_HTML_ONLY = f"""\
From: Erin <erin@contoso.com>
To: {BOT}
Subject: RE: Deploy 42
Date: Mon, 30 Nov 2026 13:15:00 +0000
Message-ID: <AM0PR01MB9999@AM0PR01MB9999.eurprd01.prod.exchangelabs.com>
References: <CAH+root=Q1@mail.gmail.com>
In-Reply-To: <CAH+root=Q1@mail.gmail.com>
MIME-Version: 1.0
Content-Type: text/html; charset="utf-8"
Content-Transfer-Encoding: 8bit

<html><head><style>p {{ margin: 0 }}</style><script>alert(1)</script></head>
<body><div class="elementToProof">Go ahead &amp; check the
<a href="https://ci.example.com/build/42">build page</a> first.</div>
<ul><li>step one</li><li>step two</li></ul>
<hr style="display:inline-block;width:98%" tabindex="-1">
<div id="divRplyFwdMsg" dir="ltr"><b>From:</b> Deploy Bot &lt;{BOT}&gt;<br>
<b>Sent:</b> Monday, November 30, 2026 2:00 PM<br><b>To:</b> Erin &lt;erin@contoso.com&gt;<br>
<b>Subject:</b> Deploy 42</div><div>Should I deploy build 42?</div></body></html>
"""


def test_gmail_reply_continues_the_lane_of_its_root() -> None:
    inbound = taken(GMAIL_REPLY)
    assert inbound.thread.channel == "email"
    assert inbound.thread.space == BOT
    assert inbound.thread.thread == "<CAH+root=Q1@mail.gmail.com>"
    assert inbound.thread.lane == "email:<CAH+root=Q1@mail.gmail.com>"
    assert inbound.message_id == "<CAH+reply=Z9@mail.gmail.com>"
    assert inbound.author.id == "alice@gmail.com"
    assert inbound.author.name == "Alice Example"
    assert inbound.text == "Yes, approve it please."
    assert inbound.received_at_ms == 7
    context = dict(inbound.reply_context)
    assert context == {
        "message_id": "<CAH+reply=Z9@mail.gmail.com>",
        "references": ("<CAH+root=Q1@mail.gmail.com>", BOT_REPLY_ID),
        "subject": "Re: Deploy 42",
        "from": "Alice Example <alice@gmail.com>",
        "to": ("Deploy Bot <bot@gw.example>",),
        "cc": ("Carol <carol@example.com>",),
    }
    assert read(GMAIL_REPLY).reason == "reply"


REPLY_TEXTS = [
    ("gmail", GMAIL_REPLY, "Yes, approve it please."),
    ("outlook", OUTLOOK_REPLY, "Deny - not today.\n\nBob Smith"),
    ("outlook-german", OUTLOOK_GERMAN_REPLY, "Bitte nicht heute, erst nächste Woche."),
    ("gmail-german", GMAIL_GERMAN_REPLY, "Ja, bitte ausrollen."),
    (
        "apple-mail-flowed",
        APPLE_MAIL_REPLY,
        "Sounds good, go ahead with the rollout once the smoke tests are green.",
    ),
    (
        "outlook-html-only",
        OUTLOOK_HTML_ONLY,
        "Go ahead & check the build page (https://ci.example.com/build/42) first.\n\n"
        "- step one\n- step two",
    ),
]


@pytest.mark.parametrize(
    ("raw", "text"), [c[1:] for c in REPLY_TEXTS], ids=[c[0] for c in REPLY_TEXTS]
)
def test_reply_text_is_the_new_text_only(raw: str, text: str) -> None:
    assert taken(raw).text == text


def test_outlook_reply_keeps_its_conversation_headers() -> None:
    inbound = taken(OUTLOOK_REPLY)
    assert inbound.thread.thread == "<CAH+root=Q1@mail.gmail.com>"
    assert inbound.reply_context["thread_topic"] == "Deploy 42"
    assert inbound.reply_context["thread_index"] == "AQHbQ2p7xY0v1cdq3kSZ0kz9t6C0zQ=="
    german = taken(OUTLOOK_GERMAN_REPLY)
    assert german.author.name == "Jörg Müller"
    assert german.author.id == "joerg.mueller@firma.de"
    assert german.reply_context["from"] == "Jörg Müller <joerg.mueller@firma.de>"
    assert german.reply_context["subject"] == "AW: Deploy 42"
    junk = taken(plain("Hi", Thread_Index="not base64 at all!", From='"Smith, Bob" <b@x.example>'))
    assert "thread_index" not in junk.reply_context
    assert junk.reply_context["from"] == '"Smith, Bob" <b@x.example>'


def gmail_html_only() -> str:
    head, _, rest = GMAIL_REPLY.partition("Content-Type: multipart/alternative")
    html = rest.split('Content-Type: text/html; charset="UTF-8"\n\n')[1].split("--0000")[0]
    return head + 'Content-Type: text/html; charset="UTF-8"\n\n' + html


def test_gmail_html_only_reply() -> None:
    assert taken(gmail_html_only()).text == "Yes, approve it please."


EARLIER = "<m0@example.com>"
"""A mail the test's mail answers (quoted history and signatures are cut from answers only)."""


def plain(body: str, **headers: str) -> str:
    base = {
        "From": "Alice <alice@example.com>",
        "To": BOT,
        "Subject": "Deploy",
        "Date": "Mon, 30 Nov 2026 14:00:00 +0000",
        "Message-ID": "<m1@example.com>",
    }
    base.update({key.replace("_", "-"): value for key, value in headers.items()})
    head = "".join(f"{key}: {value}\n" for key, value in base.items() if value)
    return f"{head}MIME-Version: 1.0\nContent-Type: text/plain; charset=utf-8\n\n{body}"


STRIPPING = [
    ("signature-dashes", "Deploy it.\n\n-- \nAlice\nACME Corp", "Deploy it."),
    ("sent-from", "Deploy it.\n\nSent from my iPhone", "Deploy it."),
    ("gesendet-von", "Bitte ausrollen.\n\nGesendet von meinem iPhone", "Bitte ausrollen."),
    ("best-regards", "Deploy it.\n\nBest regards,\nAlice Example", "Deploy it."),
    (
        "thanks-is-text",
        "Please do:\n- deploy 42\n- restart web\n\nThanks, that worked last time.\nNext: logs",
        "Please do:\n- deploy 42\n- restart web\n\nThanks, that worked last time.\nNext: logs",
    ),
    ("thanks-with-task", "Thanks, now deploy 43 please.", "Thanks, now deploy 43 please."),
    (
        "original-message",
        "Fine by me.\n\n-----Original Message-----\nFrom: Bot\nSent: Monday\n\nShould I?",
        "Fine by me.",
    ),
    ("bottom-posting", "On Mon, Alice wrote:\n> Should I deploy?\n\nYes, do it.", "Yes, do it."),
    ("inline-quotes", "Yes.\n\n> Should I deploy?\n> Really?", "Yes."),
    # quote headers in languages the parser has no words for: its own rules need none
    ("ru-attribution", "Да.\n\n30.11.2026 14:00 пользователь Bot <b@x.io> написал:\n> ?", "Да."),
    ("fi-wrapped", "Joo.\n\nma 30.11.2026 klo 14.00 Bot\n<b@x.io> kirjoitti:\n\n> ?", "Joo."),
    ("pt-wrapped", "Sim.\n\nEm 30 de nov. de 2026 às 14:00, Bot (\nb@x.io) escreveu:\n> ?", "Sim."),
    (
        "ru-outlook-block",
        "Нет.\n\nОт: Bot <b@x.io>\nОтправлено: 30.11.2026\nКому: a@x.io\nТема: ?",  # noqa: RUF001
        "Нет.",
    ),
    (
        "tr-outlook-block",
        "Evet.\n\nKimden: Bot <b@x.io>\nGönderildi: Pzt\nKime: a@x.io\n\n?",
        "Evet.",
    ),
    ("three-dash-original", "Ok.\n\n---Original Message---\nFrom: b@x.io\n\n?", "Ok."),
    ("dashed-original-fr", "Oui.\n\n-------- Message d'origine --------\nDe : b@x.io\n?", "Oui."),
    ("dashed-original-ru", "Да.\n\n-----Исходное сообщение-----\nОт: b@x.io\n?", "Да."),  # noqa: RUF001
    ("zoho-dashed-wrote", "Ok.\n\n---- On Mon, 30 Nov 2026 14:02 b@x.io wrote ----\n?", "Ok."),
    ("rule-before-block", "Ok.\n\n-----\nFrom: Bot <b@x.io>\nSent: Monday\nTo: a@x.io\n?", "Ok."),
    ("sent-from-german-iphone", "Ja.\n\nVon meinem iPhone gesendet", "Ja."),
    ("sent-from-russian-iphone", "Да.\n\nОтправлено с iPhone", "Да."),  # noqa: RUF001
    # ...and what they must leave alone: the sender's own text
    ("polish-one-line-label", "Data: 42 rows affected.\nNothing else changed.", None),
    ("danish-tak-prefix", "Deploy it.\nTake a backup first.\nKhan reviews the migration.", None),
    ("swedish-slash-prefix", "Two things:\n/deploy prod\n/restart web", None),
    (
        "log-intro-before-quote",
        "Here is what I get at 14:05:\n> Traceback\n\nCan you fix it?",
        ("Here is what I get at 14:05:\n\nCan you fix it?"),
    ),
    ("from-line-in-text", "From: the release notes\nthe fix is in.\n\nDeploy it.", None),
    ("labels-without-address", "From: ops\nTeam: web\nNote: urgent\n\nDeploy it.", None),
    ("dash-rule-in-text", "Plan:\n----\n1. deploy\n2. watch\n----\nDone.", None),
    (
        "sent-from-in-a-sentence",
        "Deploy it.\nIt was sent from my iPhone, see the screenshot.",
        None,
    ),
    ("original-in-a-sentence", "Is the original message lost?", None),
]


@pytest.mark.parametrize(
    ("body", "text"), [c[1:] for c in STRIPPING], ids=[c[0] for c in STRIPPING]
)
def test_quotes_and_signatures_are_stripped(body: str, text: str | None) -> None:
    assert taken(plain(body, In_Reply_To=EARLIER)).text == (body if text is None else text)


# (case, the body of a mail that starts a thread): it quotes no history, so what looks like a
# quote, a signature or an attribution is the sender's own text, and every line of it reaches
# the agent. Each of these lost the lines after the look-alike (an outside probe).
NEW_MAILS = [
    ("pasted-log", 'What does it mean?\n\n> ERROR: relation "users" does not exist\n> LINE 1'),
    ("dash-separators", "Step 1: stop it\n--\nStep 2: migrate the DB\n--\nStep 3: start it"),
    ("wrote-line", "Context:\nOn Monday the CEO wrote:\nWe close Berlin.\nSummarize the impact."),
    ("from-sent-lines", "Where is it?\nFrom: Berlin\nSent: by DHL\nTo: Munich\nTracking 1Z9"),
]  # fmt: skip


@pytest.mark.parametrize("body", [c[1] for c in NEW_MAILS], ids=[c[0] for c in NEW_MAILS])
def test_a_mail_that_starts_a_thread_is_read_whole(body: str) -> None:
    parsed = read(plain(body))
    assert parsed.reason == "new" and parsed.inbound is not None
    assert parsed.inbound.text == body
    html = plain("", Content_Type="text/html; charset=utf-8").replace(
        "Content-Type: text/plain; charset=utf-8\n", ""
    )
    quoted = '<div>Look:</div><div class="gmail_quote">On Mon, A wrote:<blockquote>kept'
    assert taken(html + quoted).text.endswith("kept")


@pytest.mark.parametrize(
    ("html", "text"),
    [
        ('<div>Yes.</div><div class="gmail_quote">On Mon, A wrote:<blockquote>q', "Yes."),
        ('<div>Yes.</div><div class="gmail_signature">Al</div>', "Yes."),
        ('<div>Yes.</div><div data-smartmail="gmail_signature">Al<br>ACME</div>', "Yes."),
        ('<p>Yes.</p><div class="moz-cite-prefix">On 1.12, A wrote:</div><blockquote>q', "Yes."),
        ('<p>Yes.</p><pre class="moz-signature">-- \nMax</pre>', "Yes."),
        ('<div>Yes.</div><div id="ydp1yahoo_quoted_9">On Mon, A wrote: q</div>', "Yes."),
        ('<div>Yes.</div><div id="AOLMsgPart_0_1">q</div>', "Yes."),
        ('<div>Yes.</div><div id="appendonsend"></div><p>From: A</p><p>q</p>', "Yes."),
        ('<div><p>Yes.</p><div><hr tabindex="-1"><b>From:</b> A</div></div><p>q</p>', "Yes."),
        ('<p>Yes.</p><div style="border:none;border-top:solid #E1E1E1">From: A</div>q', "Yes."),
        ('<p>Yes.</p><hr id="zwchr"><b>From: </b>A<br>q', "Yes."),
        ('<p>Yes.</p><div class="protonmail_quote">q</div>', "Yes."),
        ('<p>Yes.</p><div id="ms-outlook-mobile-signature">Get Outlook for iOS</div>', "Yes."),
        # a class or id that only looks alike stays: the text is the sender's
        ('<p class="quote">Keep this.</p><hr><p>And this.</p>', "Keep this.\n\nAnd this."),
        ('<p id="divRply">Keep this.</p><div style="border-top:solid red">And this.</div>', (
            "Keep this.\n\nAnd this."
        )),
    ],
    ids=[
        "gmail-quote", "gmail-signature", "gmail-signature-attribute", "thunderbird-cite",
        "thunderbird-signature", "yahoo-quoted", "aol-part", "outlook-appendonsend",
        "outlook-divrplyfwdmsg", "outlook-header-rule", "zimbra-rule", "proton-quote",
        "outlook-mobile-signature", "look-alike-class", "look-alike-id",
    ],
)  # fmt: skip
def test_html_quotes_and_signatures_are_cut_before_the_text_is_taken(html: str, text: str) -> None:
    raw = plain("", Content_Type="text/html; charset=utf-8", In_Reply_To=EARLIER).replace(
        "Content-Type: text/plain; charset=utf-8\n", ""
    )
    assert taken(raw + html).text == text


@pytest.mark.parametrize("body", ["https://example.com/report", "report.html"])
def test_an_html_body_that_looks_like_a_link_is_read_without_a_warning(body: str) -> None:
    raw = plain("", Content_Type="text/html; charset=utf-8").replace(
        "Content-Type: text/plain; charset=utf-8\n", ""
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert taken(raw + body).text == body
    assert not caught


def test_a_forward_keeps_its_html_quotes() -> None:
    html = '<div>See below.</div><div class="gmail_quote">From: A<br>The numbers are in.</div>'
    raw = plain("", Subject="Fwd: numbers", Content_Type="text/html; charset=utf-8").replace(
        "Content-Type: text/plain; charset=utf-8\n", ""
    )
    assert "The numbers are in." in taken(raw + html).text


@pytest.mark.parametrize(
    "html",
    [
        "<div>" * 4000 + "x" + "</div>" * 4000,
        "<div><p><b><i>" * 2400,
        '<div class="gmail_quote">q</div>' * 4900,
        '<div id="appendonsend"></div><p>x</p>' * 3000,
        "<div>" * 60_000,
        "<!--" + "x" * 400_000,
        '<div class="gmail_quote">' + "<" * 300_000,
        "<p " + 'a="1" ' * 60_000 + ">x</p>",
        "<table><tr>" + "<td>c</td>" * 45_000,
        "<table>" + "<tr><td>a</td><td>b</td></tr>" * 16_000,
    ],
    ids=[
        "nested", "unclosed", "many-quotes", "many-cut-markers", "too-many-tags",
        "open-comment", "lone-brackets", "many-attributes", "wide-table", "long-table",
    ],
)  # fmt: skip
def test_html_cleaning_stays_bounded_on_hostile_html(html: str) -> None:
    raw = plain("", Content_Type="text/html; charset=utf-8").replace(
        "Content-Type: text/plain; charset=utf-8\n", ""
    )
    started = time.perf_counter()
    read(raw + html)
    assert time.perf_counter() - started < 3.0


def test_a_forward_keeps_the_forwarded_message() -> None:
    body = (
        "Can you look into this?\n\n---------- Forwarded message ---------\n"
        "From: Monitoring <alerts@example.com>\nDate: Mon, Nov 30, 2026 at 1:00 PM\n"
        "Subject: Disk full on web-3\nTo: <ops@example.com>\n\n/var is at 99%."
    )
    inbound = taken(plain(body, Subject="Fwd: Disk full on web-3"))
    assert "Can you look into this?" in inbound.text
    assert "/var is at 99%." in inbound.text


def test_a_new_subject_starts_a_new_lane_even_with_re() -> None:
    # no References, no In-Reply-To: the subject alone never joins a thread
    inbound = taken(plain("Status?", Subject="Re: Deploy 42"))
    assert inbound.thread.thread == "<m1@example.com>"
    assert read(plain("Status?", Subject="Re: Deploy 42")).reason == "new"


THREAD_ROOTS = [
    ("references-first", {"References": "<a@x> <b@x> <c@x>", "In_Reply_To": "<c@x>"}, "<a@x>"),
    ("in-reply-to-only", {"In_Reply_To": "<p@x>"}, "<p@x>"),
    ("broken-references", {"References": "garbage (none)", "In_Reply_To": "<p@x>"}, "<p@x>"),
    ("bare-references", {"References": "a@x b@x"}, "<a@x>"),
    ("neither", {}, "<m1@example.com>"),
    ("in-reply-to-comment", {"In_Reply_To": "<p@x> (Alice's message of Monday)"}, "<p@x>"),
]


@pytest.mark.parametrize(
    ("headers", "root"), [c[1:] for c in THREAD_ROOTS], ids=[c[0] for c in THREAD_ROOTS]
)
def test_thread_root(headers: dict[str, str], root: str) -> None:
    assert taken(plain("Hi", **headers)).thread.thread == root


def test_message_ids_keep_their_brackets_and_case() -> None:
    assert message_ids("<A@X.example>  <b@x>\r\n <A@X.example>") == ["<A@X.example>", "<b@x>"]
    assert message_ids("no ids here") == []
    assert message_ids("<with space@x>") == []
    assert message_ids(None) == []
    assert taken(plain("Hi", Message_ID="bare@x.example")).message_id == "<bare@x.example>"


def test_a_message_without_message_id_gets_a_stable_digest() -> None:
    first = taken(plain("Hi there", Message_ID=""))
    again = taken(plain("Hi there", Message_ID=""))
    other = taken(plain("Hi again", Message_ID=""))
    assert first.message_id == again.message_id
    assert first.message_id != other.message_id
    assert first.message_id.startswith("<") and first.message_id.endswith("@no-message-id.invalid>")
    assert first.thread.thread == first.message_id
    assert first.reply_context["message_id"] == first.message_id


def test_a_subject_only_message_starting_a_thread_takes_its_subject() -> None:
    assert taken(plain("", Subject="Deploy 42 to staging")).text == "Deploy 42 to staging"
    assert read(plain("> quoted only", In_Reply_To="<p@x>")).reason == "empty"


@pytest.mark.parametrize(
    ("subject", "normalized"),
    [
        ("Re: Deploy", "Deploy"),
        ("RE: Re: re:Deploy", "Deploy"),
        ("AW: WG: Deploy", "Deploy"),
        ("Fwd: FW: Deploy", "Deploy"),
        ("SV: Antw: Antwort: Deploy", "Deploy"),
        ("Re[2]: Re(3): Deploy", "Deploy"),
        ("Re : Deploy", "Deploy"),
        ("Re\uff1a Deploy", "Deploy"),
        ("[EXTERNAL] Re: Deploy", "Deploy"),
        ("RE: [EXTERNAL] Re: Deploy", "Deploy"),
        ("[#1234] Printer broken", "[#1234] Printer broken"),
        ("Re: [#1234] Printer broken", "[#1234] Printer broken"),
        ("Regarding the deploy", "Regarding the deploy"),
        ("Re:", ""),
        ("  Re:   lots   of   space ", "lots of space"),
    ],
)
def test_normalize_subject(subject: str, normalized: str) -> None:
    assert normalize_subject(subject) == normalized


# --- charsets ----------------------------------------------------------------------------------


def test_iso_8859_1_body() -> None:
    raw = (
        "From: =?ISO-8859-1?Q?Andr=E9?= <andre@example.fr>\nTo: bot@gw.example\n"
        "Subject: =?ISO-8859-1?Q?D=E9ploiement?=\nMessage-ID: <fr1@example.fr>\n"
        "MIME-Version: 1.0\nContent-Type: text/plain; charset=ISO-8859-1\n"
        "Content-Transfer-Encoding: 8bit\n\n"
    ).encode("ascii") + "Déploie la version 42, s'il te plaît.\n".encode("latin-1")
    inbound = taken(raw)
    assert inbound.text == "Déploie la version 42, s'il te plaît."
    assert inbound.author.name == "André"
    assert inbound.reply_context["subject"] == "Déploiement"


def test_unknown_charset_falls_back_to_utf8() -> None:
    raw = (
        b"From: a@example.com\nTo: bot@gw.example\nSubject: x\nMessage-ID: <c1@x>\n"
        b"Content-Type: text/plain; charset=x-no-such-charset\n\n"
    ) + "Grüße aus Köln".encode()
    assert taken(raw).text == "Grüße aus Köln"


# (what the mail declares, the bytes' real codec, the text): old clients, scripts and web
# forms send 8-bit text undeclared or declared wrong. Nine umlauts made a German sentence
# "undecodable": the mail was skipped, and its sender never answered (D335).
MISLABELLED = [
    ("charset=utf-8", "latin-1", "Déploie la version 42 maintenant"),
    ("charset=us-ascii", "latin-1", "Bitte die Änderungen für Übermorgen prüfen. Grüße, Jürgen."),
    (None, "cp1252", "Bonjour, pouvez-vous vérifier le délai? Très urgent. Coût: 50€"),
    ("charset=utf-8", "cp1251", "Здравствуйте! Пожалуйста, пришлите счёт за декабрь. Спасибо."),
    (None, "cp1251", "Здравствуйте! Пожалуйста, пришлите счёт за декабрь. Спасибо."),
    ("charset=x-mac-klingon", "latin-1", "Grüße aus Köln, bitte prüfen."),
    # UTF-16 "decodes" any even number of bytes: 8-bit text labelled so was read as CJK
    ("charset=utf-16", "ascii", "plain ascii but says utf16"),
    ("charset=utf-16le", "latin-1", "Grüße aus Köln, bitte prüfen."),
]


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-le", "utf-16-be", "utf-32"])
def test_text_in_utf16_or_utf32_as_declared_is_read(codec: str) -> None:
    head = b"From: a@example.com\nTo: bot@gw.example\nSubject: x\nMessage-ID: <c4@x>\n"
    head += f"Content-Type: text/plain; charset={codec}\n".encode()
    text = "Grüße aus Köln, 中文 und Ελληνικά"
    assert taken(head + b"\n" + text.encode(codec)).text == text


@pytest.mark.parametrize(("declared", "codec", "text"), MISLABELLED)
def test_text_in_a_charset_it_does_not_declare_is_read(
    declared: str | None, codec: str, text: str
) -> None:
    head = b"From: a@example.com\nTo: bot@gw.example\nSubject: x\nMessage-ID: <c2@x>\n"
    if declared is not None:
        head += f"Content-Type: text/plain; {declared}\n".encode()
    assert taken(head + b"\n" + text.encode(codec)).text == text


def test_binary_garbage_is_undecodable() -> None:
    garbage = bytes(range(128, 256)) * 8
    raw = (
        b"From: a@example.com\nTo: bot@gw.example\nSubject: x\nMessage-ID: <c3@x>\n"
        b"Content-Type: text/plain; charset=utf-8\n\n"
    ) + garbage
    assert read(raw) == Parsed("skip", "undecodable")


def test_raw_latin1_headers_are_read_as_windows_1252() -> None:
    """They were U+FFFD: the reply's subject read "Re: Caf\ufffd" (an outside probe)."""
    raw = (
        b"From: J\xfcrgen <jurgen@example.com>\nTo: bot@gw.example\nSubject: Caf\xe9 na\xefve\n"
        b"Message-ID: <l1@x>\nContent-Type: text/plain; charset=utf-8\n\nHallo"
    )
    inbound = taken(raw)
    assert inbound.author.name == "Jürgen"
    assert inbound.reply_context["subject"] == "Café naïve"


def test_raw_utf8_headers_are_read() -> None:
    raw = (
        "From: Zoë Ünal <zoe@example.com>\nTo: bot@gw.example\nSubject: Größe\n"
        "Message-ID: <u1@x>\nContent-Type: text/plain; charset=utf-8\n\nHallo"
    ).encode()
    inbound = taken(raw)
    assert inbound.author.name == "Zoë Ünal"
    assert inbound.reply_context["subject"] == "Größe"


# --- structure, attachments and limits ---------------------------------------------------------


def nested_mixed() -> EmailMessage:
    msg = EmailMessage()
    msg["From"] = "Frank <frank@example.com>"
    msg["To"] = BOT
    msg["Subject"] = "Logs for the failed deploy"
    msg["Message-ID"] = "<nested@example.com>"
    msg.set_content("See the attached logs.\n")
    msg.add_alternative('<p>See the attached logs.<img src="cid:logo"></p>', subtype="html")
    html_part = msg.get_body(preferencelist=("html",))
    assert isinstance(html_part, EmailMessage)
    html_part.add_related(
        b"\x89PNG" + b"\0" * 96, "image", "png", cid="<logo>", filename="logo.png"
    )
    msg.add_attachment(b"%PDF-1.7" + b"\0" * 1992, "application", "pdf", filename="report.pdf")
    inner = EmailMessage()
    inner.add_attachment(b"a,b\n1,2\n", "text", "csv", filename="C:\\temp\\data.csv")
    forwarded = EmailMessage()
    forwarded["Subject"] = "original"
    forwarded.set_content("forwarded body\n")
    inner.add_attachment(forwarded)
    msg.attach(inner)
    return msg


def test_nested_multipart_lists_attachments_as_metadata() -> None:
    inbound = taken(nested_mixed().as_bytes())
    # the attached mail is read as a forward (D344), the files listed
    assert inbound.text == (
        "See the attached logs.\n\n---------- Forwarded message ----------\n"
        "Subject: original\n\nforwarded body"
    )
    named = [(a.name, a.media_type, a.size) for a in inbound.attachments]
    assert named == [
        ("logo.png", "image/png", 100),
        ("report.pdf", "application/pdf", 2000),
        ("data.csv", "text/csv", 8),
    ]
    raw = nested_mixed().as_bytes()
    contents = [attachment_content(raw, a.ref or "") for a in inbound.attachments]
    assert contents == [b"\x89PNG" + b"\0" * 96, b"%PDF-1.7" + b"\0" * 1992, b"a,b\n1,2\n"]
    assert attachment_content(raw, "part-99") is None
    assert attachment_content(raw, "../etc") is None


def test_attachments_beyond_the_limit_are_not_listed() -> None:
    msg = EmailMessage()
    msg["From"] = "a@example.com"
    msg["To"] = BOT
    msg["Message-ID"] = "<many@x>"
    msg.set_content("files")
    for number in range(MAX_ATTACHMENTS + 5):
        msg.add_attachment(b"x" * 10, "application", "octet-stream", filename=f"f{number}.bin")
    inbound = taken(msg.as_bytes())
    assert len(inbound.attachments) == MAX_ATTACHMENTS
    assert inbound.unlisted_attachments == 5  # counted: the agent is told (D169)


def test_attachment_only_message_is_taken_with_subject() -> None:
    msg = EmailMessage()
    msg["From"] = "a@example.com"
    msg["To"] = BOT
    msg["Subject"] = "scan"
    msg["Message-ID"] = "<scan@x>"
    msg.set_content(b"%PDF", maintype="application", subtype="pdf", filename="scan.pdf")
    inbound = taken(msg.as_bytes())
    assert inbound.text == "scan"
    assert [a.name for a in inbound.attachments] == ["scan.pdf"]


def test_a_message_over_the_limit_is_skipped_unparsed() -> None:
    raw = plain("x").encode() + b"y" * 10_000_001
    assert read(raw) == Parsed("skip", "oversized")
    assert read(plain("small"), max_bytes=10).reason == "oversized"


def _html(body: str) -> str:
    return plain(body).replace("text/plain", "text/html")


# (case, raw mail, the text's length, `Inbound.cut` as (kept, total) or None): only the new
# text counts, in characters; an HTML body too long to convert says its count is unknown (D169)
_QUOTED = "new\n\nOn Mon, 30 Nov 2026, A <a@b.example> wrote:\n" + "> q\n" * 30_000
_IMAGE = f'<img src="data:image/png;base64,{"A" * 600_000}"><p>end</p>'
_LIMIT = MAX_TEXT_CHARS
LONG_TEXTS: list[tuple[str, str, int, tuple[int, int | None] | None]] = [
    ("at", plain("a" * MAX_TEXT_CHARS), MAX_TEXT_CHARS, None),
    ("over", plain("word " * 20_000), MAX_TEXT_CHARS, (MAX_TEXT_CHARS, 99_999)),
    ("cjk-at", plain("日" * MAX_TEXT_CHARS), MAX_TEXT_CHARS, None),
    ("quote-over", plain(_QUOTED, In_Reply_To=EARLIER), 3, None),
    ("forward-over", plain("f" * 50_000, Subject="Fwd: log"), _LIMIT, (_LIMIT, 50_000)),
    ("html-over", _html(f"<p>{'h' * 41_000}</p>"), MAX_TEXT_CHARS, (MAX_TEXT_CHARS, 41_000)),
    ("html-too-long", _html("<p>x</p>" * 70_000), MAX_TEXT_CHARS, (MAX_TEXT_CHARS, None)),
    ("html-long-image", _html(_IMAGE), 3, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "length", "cut"), [c[1:] for c in LONG_TEXTS], ids=[c[0] for c in LONG_TEXTS]
)
def test_long_text_is_cut_and_says_so(
    raw: str, length: int, cut: tuple[int, int | None] | None
) -> None:
    inbound = taken(raw)
    assert len(inbound.text) == length
    if cut is None:
        assert inbound.cut is None
    else:
        assert inbound.cut is not None
        assert (inbound.cut.kept, inbound.cut.total) == cut


HOSTILE_TEXT = [
    ("on-line", "On " * 30_000),
    ("blank-lines", "\n" * 100_000 + "x"),
    ("am-line", "Am " * 30_000 + "schrieb"),
    ("many-lines", "x\n\n" * 20_000),
    ("from-lines", "From: a@b.example\n" * 5_000),
    ("label-lines", "From: x\nTo: y\n" * 4_000),
    ("attributions", "On 1.1.2026 10:00 a@b.example wrote:\n> q\n" * 3_000),
    ("dash-lines", ("-" * 150 + "\n") * 3_000),
    ("dashed-words", ("---- " + "a" * 150 + " ----\n") * 2_000),
    ("wrapped-addresses", "x <\na@b.example> y:\n> q\n" * 3_000),
    ("colon-quotes", ":\n>\n" * 20_000),
    ("sent-from", "Sent from my iPhone\n" * 5_000),
]


@pytest.mark.parametrize("body", [c[1] for c in HOSTILE_TEXT], ids=[c[0] for c in HOSTILE_TEXT])
def test_reply_stripping_stays_fast_on_hostile_text(body: str) -> None:
    started = time.perf_counter()
    read(plain(body))
    assert time.perf_counter() - started < 2.0


def test_malformed_mime_is_skipped_only_without_text() -> None:
    no_text = (
        "From: a@example.com\nTo: bot@gw.example\nMessage-ID: <mm@x>\nMIME-Version: 1.0\n"
        'Content-Type: multipart/mixed; boundary="b"\n\n--b\nContent-Type: multipart/alternative'
        "\n\n--b--\n"
    )
    assert read(no_text) == Parsed("skip", "malformed")
    no_boundary = (
        "From: a@example.com\nTo: bot@gw.example\nMessage-ID: <mb@x>\nMIME-Version: 1.0\n"
        "Content-Type: multipart/mixed\n\nplain words without a boundary\n"
    )
    assert read(no_boundary).action in ("take", "skip")  # never raises
    broken_base64 = (
        "From: a@example.com\nTo: bot@gw.example\nMessage-ID: <b64@x>\nMIME-Version: 1.0\n"
        "Content-Type: text/plain; charset=utf-8\nContent-Transfer-Encoding: base64\n\n"
        "SGVsbG8gd29ybGQ*!\n"
    )
    assert taken(broken_base64).text.startswith("Hello")


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "no_sender"),
        (b"To: bot@gw.example\n\nhello", "no_sender"),
        (b"From: not an address\nTo: bot@gw.example\n\nhello", "no_sender"),
        (b"\xff\xfe\x00garbage", "no_sender"),
    ],
)
def test_no_sender(raw: bytes, reason: str) -> None:
    assert read(raw) == Parsed("skip", reason)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=3000))
def test_parse_never_raises_on_arbitrary_bytes(raw: bytes) -> None:
    assert read(raw).action in ("take", "skip")


HEADER_LINES = [
    "From: a@example.com",
    "From: =?utf-8?b?////?= <@>",
    "To: bot@gw.example",
    "Message-ID: <x@y>",
    "References: <<<>>> <a@b",
    "In-Reply-To: (comment",
    "Subject: =?x-bad?q?=ZZ?=",
    "Content-Type: multipart/mixed; boundary=b",
    "Content-Type: text/plain; charset=utf-7",
    "Content-Type: text/html; charset=\u00ff",
    "Content-Transfer-Encoding: base64",
    "Content-Transfer-Encoding: quoted-printable",
    "Content-Disposition: attachment; filename*=utf-8''%FF%FE",
    "Thread-Index: ####",
    "--b",
    "--b--",
    "",
]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from(HEADER_LINES), max_size=14),
    st.text(max_size=300),
)
def test_parse_never_raises_on_mime_shaped_input(lines: list[str], body: str) -> None:
    raw = (
        "\n".join(lines).encode("utf-8", "surrogatepass")
        + b"\n\n"
        + body.encode("utf-8", "replace")
    )
    assert read(raw).action in ("take", "skip")


def test_html_to_text() -> None:
    html = (
        "<p>Hello <b>world</b>&nbsp;&amp; <a href='https://x.example/a?b=1&amp;c=2'>docs</a>"
        " <a href='javascript:alert(1)'>bad</a> <a href='https://same.example'>https://same.example</a>"
        "</p><blockquote><p>quoted</p></blockquote><ol><li>one</li><li>two</li></ol>"
        "<style>.x{}</style><pre>a  b\n c</pre>"
    )
    assert html_to_text(html) == (
        "Hello world & docs (https://x.example/a?b=1&c=2) bad https://same.example\n\n"
        "> quoted\n\n1. one\n2. two\n\na  b\n c"
    )


def test_html_tables_keep_their_columns_and_lists_their_nesting() -> None:
    html = (
        "<div>Numbers:</div><table><tr><th>Build</th><th>Status</th></tr>"
        "<tr><td>42</td><td>failed</td></tr><tr><td>41</td><td>passed</td></tr></table>"
        "<ul><li>check<ol><li>logs</li><li>metrics</li></ol></li><li>deploy</li></ul><div>Thanks</div>"
    )
    assert html_to_text(html) == (
        "Numbers:\nBuild  Status\n42     failed\n41     passed\n\n"
        "- check\n  1. logs\n  2. metrics\n- deploy\n\nThanks"
    )


def test_a_table_of_many_cells_is_read_a_row_a_line() -> None:
    html = "<p>Report:</p><table>" + "<tr><td>build</td><td>ok</td></tr>" * 1_001 + "</table>"
    assert html_to_text(html) == "Report:\n\n" + "\n".join(["build ok"] * 1_001)


def test_a_layout_that_fails_still_gives_the_words(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(state: object, attrs: object) -> None:
        raise IndexError("a layout bug")

    handlers = CustomHtmlTagHandlerMapping(start_tag_mapping={"p": broken}, end_tag_mapping={})
    config = ParserConfig(custom_html_tag_handler_mapping=handlers)
    monkeypatch.setattr(message_module, "_HTML_CONFIG", config)
    assert html_to_text("<div>Deploy <b>42</b></div><p>now</p>") == "Deploy 42now"


def test_a_wide_cell_beside_a_tall_one_does_not_pad_every_line() -> None:
    html = "<table><tr><td>" + "x" * 4_000 + "</td><td>" + "z<br>" * 4_000 + "</td></tr></table>"
    text = html_to_text(html)
    assert len(text) < 20_000  # in columns: 16 MB
    assert text.startswith("x" * 4_000 + " z\nz\n")


@pytest.mark.parametrize(
    ("html", "text"),
    [
        ("", ""),
        ("no markup", "no markup"),
        ("<p>a\x00b</p>", "a\ufffdb"),
        ('<?xml version="1.0"?><p>x</p>', "x"),
        ("<!-- never closed", ""),
        ("<blockquote>a<blockquote>b</blockquote></blockquote>c", "> a\n>\n> > b\n\nc"),
    ],
)
def test_html_to_text_takes_any_markup(html: str, text: str) -> None:
    assert html_to_text(html) == text


# --- the loop guard ----------------------------------------------------------------------------

GMAIL_HEADERS = {
    "Return-Path": "<alice@gmail.com>",
    "From": "Alice <alice@gmail.com>",
    "To": BOT,
    "Subject": "Deploy",
    "Message-ID": "<CAH+x@mail.gmail.com>",
    "DKIM-Signature": "v=1; a=rsa-sha256; d=gmail.com; s=20230601; b=abc",
    "X-Gm-Message-State": "AOJu0Yw",
    "X-Google-Smtp-Source": "AGHT+IF",
    "Content-Type": 'multipart/alternative; boundary="0000"',
}
OUTLOOK_HEADERS = {
    "From": "Bob <bob@contoso.com>",
    "To": BOT,
    "Subject": "RE: Deploy",
    "Thread-Topic": "Deploy",
    "Thread-Index": "AQHbQ2p7xY0v1cdq3kSZ0kz9t6C0zQ==",
    "Message-ID": "<AM9PR07MB7@AM9PR07MB7.eurprd07.prod.outlook.com>",
    "X-MS-Has-Attach": "",
    "X-MS-TNEF-Correlator": "",
    "X-MS-Exchange-Organization-AuthAs": "Internal",
    "X-MS-Exchange-CrossTenant-id": "72f988bf-86f1-41af-91ab-2d7cd011db47",
    "Content-Type": 'text/plain; charset="us-ascii"',
}
APPLE_HEADERS = {
    "From": "Dana <dana@icloud.com>",
    "To": BOT,
    "Subject": "Re: Deploy",
    "Message-Id": "<5F1C2D3E-AAAA@icloud.com>",
    "Mime-Version": "1.0 (Mac OS X Mail 16.0 \\(3774.600.62\\))",
    "X-Mailer": "Apple Mail (2.3774.600.62)",
    "Content-Type": "text/plain; charset=utf-8; format=flowed",
}
REDIRECTED_BY_RULE = {
    **OUTLOOK_HEADERS,
    "X-MS-Exchange-Inbox-Rules-Loop": "shared@contoso.com",
    "X-MS-Exchange-Generated-Message-Source": "Mailbox Rules Agent",
}

AUTOMATIC = [
    ("gmail", GMAIL_HEADERS, None),
    ("outlook", OUTLOOK_HEADERS, None),
    ("apple-mail", APPLE_HEADERS, None),
    ("redirected-by-inbox-rule", REDIRECTED_BY_RULE, None),
    ("auto-submitted-no", {**GMAIL_HEADERS, "Auto-Submitted": "no"}, None),
    ("precedence-first-class", {**GMAIL_HEADERS, "Precedence": "first-class"}, None),
    ("suppress-reports-only", {**OUTLOOK_HEADERS, "X-Auto-Response-Suppress": "DR, RN"}, None),
    ("own-address", {**GMAIL_HEADERS, "From": f"Deploy Bot <{BOT.upper()}>"}, "own_message"),
    ("own-message-id", {**GMAIL_HEADERS, "Message-ID": BOT_REPLY_ID}, "own_message"),
    (
        "dsn-bounce",
        {
            "Return-Path": "<>",
            "From": "Mail Delivery Subsystem <MAILER-DAEMON@mx.example.com>",
            "To": BOT,
            "Subject": "Undelivered Mail Returned to Sender",
            "Auto-Submitted": "auto-replied",
            "Content-Type": 'multipart/report; report-type=delivery-status; boundary="B1"',
        },
        "bounce",
    ),
    ("null-return-path", {**GMAIL_HEADERS, "Return-Path": "<>"}, "bounce"),
    ("postmaster", {**GMAIL_HEADERS, "From": "postmaster@contoso.com"}, "bounce"),
    ("noreply", {**GMAIL_HEADERS, "From": "GitHub <noreply@github.com>"}, "no_reply"),
    ("no-reply-tag", {**GMAIL_HEADERS, "From": "no-reply+abc@desk.example"}, "no_reply"),
    ("donotreply", {**GMAIL_HEADERS, "From": "DoNotReply@bank.example"}, "no_reply"),
    ("noreply-alerts", {**GMAIL_HEADERS, "From": "noreply-alerts@ops.example"}, "no_reply"),
    # a word of the local part, not only its start (jira-noreply@ was answered: a probe)
    ("jira-noreply", {**GMAIL_HEADERS, "From": "jira-noreply@tickets.example"}, "no_reply"),
    ("alerts.no-reply", {**GMAIL_HEADERS, "From": "alerts.no-reply@ops.example"}, "no_reply"),
    ("snoreply-person", {**GMAIL_HEADERS, "From": "snoreply@example.com"}, None),
    ("norelly-person", {**GMAIL_HEADERS, "From": "noreen@example.com"}, None),
    ("replyable", {**GMAIL_HEADERS, "From": "reply@example.com"}, None),
    ("failed-recipients", {**GMAIL_HEADERS, "X-Failed-Recipients": "x@y"}, "bounce"),
    (
        "read-receipt",
        {
            **OUTLOOK_HEADERS,
            "Subject": "Read: Deploy",
            "Content-Type": "multipart/report; report-type=disposition-notification; boundary=b",
        },
        "delivery_report",
    ),
    (
        "exchange-out-of-office",
        {
            "From": "Carol Jones <carol@contoso.com>",
            "To": BOT,
            "Subject": "Automatic reply: Deploy 42",
            "Thread-Topic": "Deploy 42",
            "X-MS-Has-Attach": "",
            "X-Auto-Response-Suppress": "All",
            "X-MS-Exchange-Inbox-Rules-Loop": "carol@contoso.com",
            "auto-submitted": "auto-generated",
            "x-ms-exchange-generated-message-source": "Mailbox Rules Agent",
            "Content-Type": 'text/plain; charset="us-ascii"',
        },
        "auto_submitted",
    ),
    (
        "legacy-exchange-out-of-office",
        {
            "From": "Carol Jones <carol@contoso.com>",
            "Subject": "Out of Office: Deploy 42",
            "X-Auto-Response-Suppress": "All",
            "X-MS-Exchange-Inbox-Rules-Loop": "carol@contoso.com",
        },
        "auto_reply_suppressed",
    ),
    (
        "gmail-vacation",
        {**GMAIL_HEADERS, "Subject": "Re: Deploy", "Auto-Submitted": "auto-replied"},
        "auto_submitted",
    ),
    (
        "notification",
        {**GMAIL_HEADERS, "Auto-Submitted": "auto-generated; owner=x"},
        "auto_submitted",
    ),
    ("precedence-auto-reply", {**GMAIL_HEADERS, "Precedence": "auto_reply"}, "auto_submitted"),
    ("x-autoreply", {**GMAIL_HEADERS, "X-Autoreply": "yes"}, "auto_reply"),
    ("x-autorespond", {**GMAIL_HEADERS, "X-Autorespond": "Vacation"}, "auto_reply"),
    ("icloud-vacation", {**APPLE_HEADERS, "X-Apple-Action": "VACATION"}, "auto_reply"),
    ("x-autogenerated", {**GMAIL_HEADERS, "X-Autogenerated": "Reply"}, "auto_reply"),
    (
        "x-post-message-class",
        {**GMAIL_HEADERS, "X-POST-MessageClass": "9; Autoresponder"},
        "auto_reply",
    ),
    ("subject-auto-reply", {**GMAIL_HEADERS, "Subject": "Auto reply: Deploy"}, "auto_reply"),
    ("subject-autoreply", {**GMAIL_HEADERS, "Subject": "AutoReply: Deploy"}, "auto_reply"),
    ("subject-auto-hyphen-reply", {**GMAIL_HEADERS, "Subject": "Auto-Reply: away"}, "auto_reply"),
    (
        "subject-automatic-reply",
        {**GMAIL_HEADERS, "Subject": "Automatic reply: Deploy"},
        "auto_reply",
    ),
    ("subject-out-of-office", {**GMAIL_HEADERS, "Subject": "Out of Office: Deploy"}, "auto_reply"),
    ("subject-german", {**GMAIL_HEADERS, "Subject": "Automatische Antwort: Deploy"}, "auto_reply"),
    ("subject-french", {**GMAIL_HEADERS, "Subject": "Réponse automatique : Deploy"}, "auto_reply"),
    ("subject-russian", {**GMAIL_HEADERS, "Subject": "Автоматический ответ: Deploy"}, "auto_reply"),
    ("subject-swedish", {**GMAIL_HEADERS, "Subject": "Autosvar: Deploy"}, "auto_reply"),
    ("subject-chinese", {**GMAIL_HEADERS, "Subject": "自动回复: Deploy"}, "auto_reply"),
    ("subject-answering-an-auto-reply", {**GMAIL_HEADERS, "Subject": "Re: Auto reply: x"}, None),
    ("subject-about-auto-replies", {**GMAIL_HEADERS, "Subject": "Auto reply settings"}, None),
    ("subject-out-of-office-plans", {**GMAIL_HEADERS, "Subject": "Out of office next week"}, None),
    ("apple-other-action", {**APPLE_HEADERS, "X-Apple-Action": "ACCEPT"}, None),
    ("precedence-bulk", {**GMAIL_HEADERS, "Precedence": "bulk"}, "bulk"),
    ("precedence-junk", {**GMAIL_HEADERS, "Precedence": "junk"}, "bulk"),
    (
        "google-group",
        {
            **GMAIL_HEADERS,
            "List-Id": "<ops.example.com>",
            "List-Post": "<mailto:ops@example.com>",
            "Mailing-list": "list ops@example.com; contact ops+owners@example.com",
        },
        "list",
    ),
    (
        "newsletter",
        {**GMAIL_HEADERS, "List-Unsubscribe": "<https://news.example.com/u?id=1>"},
        "list",
    ),
    ("precedence-list", {**GMAIL_HEADERS, "Precedence": "list"}, "list"),
]


@pytest.mark.parametrize(
    ("headers", "reason"), [c[1:] for c in AUTOMATIC], ids=[c[0] for c in AUTOMATIC]
)
def test_loop_guard(headers: dict[str, str], reason: str | None) -> None:
    assert classify_automatic(headers, mailbox_address=BOT, own_domain_ids=DOMAIN) == reason


def test_parse_skips_a_multipart_report_bounce() -> None:
    raw = f"""\
Return-Path: <>
Received: by mx.example.com (Postfix) id 4F1; Mon, 30 Nov 2026 13:00:02 +0000 (UTC)
Date: Mon, 30 Nov 2026 13:00:02 +0000 (UTC)
From: MAILER-DAEMON@mx.example.com (Mail Delivery System)
Subject: Undelivered Mail Returned to Sender
To: {BOT}
Auto-Submitted: auto-replied
MIME-Version: 1.0
Content-Type: multipart/report; report-type=delivery-status; boundary="4F1.1764507602/mx"
Message-Id: <20261130130002.4F1@mx.example.com>

--4F1.1764507602/mx
Content-Description: Notification
Content-Type: text/plain; charset=us-ascii

I'm sorry to have to inform you that your message could not be delivered.

--4F1.1764507602/mx
Content-Description: Delivery report
Content-Type: message/delivery-status

Reporting-MTA: dns; mx.example.com
Final-Recipient: rfc822; nobody@example.com
Action: failed
Status: 5.1.1

--4F1.1764507602/mx--
"""
    assert read(raw) == Parsed("skip", "bounce")


def test_parse_skips_the_bots_own_mail() -> None:
    assert read(plain("hi", From=f"Bot <{BOT}>")) == Parsed("skip", "own_message")
    assert read(plain("hi", Message_ID=BOT_REPLY_ID)) == Parsed("skip", "own_message")
    # another domain's id of the same shape is someone else's
    other = reply_message_id("reply:run-1", "elsewhere.example")
    assert read(plain("hi", Message_ID=other)).action == "take"


# (case, header, the reason, the agent's text): a message too large to read is taken from its
# header, by the same rules, so its sender can be told (D169)
HEADS = [
    ("new", plain(""), "new", "Deploy"),
    ("reply", plain("", In_Reply_To="<root@x>", Subject="Re: Deploy"), "reply", "Deploy"),
    ("bulk", plain("", Precedence="bulk"), "bulk", None),
    ("auto-reply", plain("", Auto_Submitted="auto-replied"), "auto_submitted", None),
    ("no-sender", plain("", From=""), "no_sender", None),
    ("garbage", "\x00\xff", "no_sender", None),
]


@pytest.mark.parametrize(
    ("head", "reason", "text"), [c[1:] for c in HEADS], ids=[c[0] for c in HEADS]
)
def test_a_message_too_large_to_read_is_taken_from_its_header(
    head: str, reason: str, text: str | None
) -> None:
    parsed = parse_head(
        head.encode("utf-8", "surrogateescape"),
        size=12_000_000,
        mailbox_address=BOT,
        own_domain_ids=(DOMAIN,),
        max_bytes=LIMIT,
        now_ms=7,
    )
    assert parsed.reason == reason
    if text is None:
        assert parsed.inbound is None
        return
    assert parsed.inbound is not None
    assert parsed.inbound.text == text
    assert parsed.inbound.cut is not None
    assert parsed.inbound.cut.model_dump() == {
        "kept": len(text),
        "total": None,
        "message_bytes": 12_000_000,
        "limit_bytes": LIMIT,
    }


def test_text_after_a_picture_put_mid_text_is_read() -> None:
    # Apple Mail writes text, image, text: the text after the picture was dropped unsaid
    raw = (
        b"From: a@example.com\nTo: bot@gw.example\nSubject: damage\nMessage-ID: <ios1@x>\n"
        b"MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=B\n\n"
        b"--B\nContent-Type: text/plain; charset=us-ascii\n\nHere is the damaged part:\n\n"
        b"--B\nContent-Type: image/jpeg; name=IMG_0001.jpeg\nContent-Disposition: inline; "
        b"filename=IMG_0001.jpeg\nContent-Transfer-Encoding: base64\n\n/9j/4AAQ\n"
        b"--B\nContent-Type: text/plain; charset=utf-8; format=flowed\n\n"
        b"And the serial number is \nSN-998877.\n--B--\n"
    )
    inbound = taken(raw)
    assert inbound.text == "Here is the damaged part:\n\nAnd the serial number is SN-998877."
    assert [a.name for a in inbound.attachments] == ["IMG_0001.jpeg"]


def test_a_mail_forwarded_as_an_attachment_is_read() -> None:
    # Outlook's "Forward as attachment": refused as a file, its text never reached the agent
    raw = (
        b"From: a@example.com\nTo: bot@gw.example\nSubject: FW: Invoice\nMessage-ID: <f1@x>\n"
        b"MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=B\n\n"
        b"--B\nContent-Type: text/plain; charset=utf-8\n\nCan you draft an answer?\n"
        b'--B\nContent-Type: message/rfc822; name="Invoice overdue.eml"\n'
        b'Content-Disposition: attachment; filename="Invoice overdue.eml"\n\n'
        b"From: Customer <cust@example.org>\nSubject: Invoice overdue\n"
        b"Date: Fri, 04 Dec 2026 09:00:00 +0000\nContent-Type: text/plain; charset=utf-8\n\n"
        b"Invoice 4711 is 30 days overdue.\n--B--\n"
    )
    inbound = taken(raw)
    assert inbound.text == (
        "Can you draft an answer?\n\n---------- Forwarded message ----------\n"
        "From: Customer <cust@example.org>\nDate: Fri, 04 Dec 2026 09:00:00 +0000\n"
        "Subject: Invoice overdue\n\nInvoice 4711 is 30 days overdue."
    )
    assert inbound.attachments == ()  # read, not refused as a file


@pytest.mark.parametrize(
    ("sender", "subject", "reason"),
    [
        # an older Exchange's notice: no DSN part, no empty Return-Path; it was answered
        ("MicrosoftExchange329e71ec@example.com", "Undeliverable: Re: Report", "bounce"),
        ("relay@example.com", "Undeliverable: Re: Report", "bounce"),
        ("relay@example.com", "Mail delivery failed: returning message to sender", "bounce"),
        ("a@example.com", "Undeliverable items in the warehouse", None),  # a person's words
    ],
)
def test_a_delivery_failure_notice_without_a_dsn_is_not_answered(
    sender: str, subject: str, reason: str | None
) -> None:
    parsed = read(plain("Delivery has failed to these recipients.", From=sender, Subject=subject))
    assert (parsed.reason if parsed.action == "skip" else None) == reason


@pytest.mark.parametrize(
    ("protocol", "signature"),
    [
        ("application/pkcs7-signature", "smime.p7s"),
        ("application/x-pkcs7-signature", "smime.p7s"),
        ("application/pgp-signature", "signature.asc"),
    ],
)
def test_a_signed_mail_s_signature_is_no_attachment(protocol: str, signature: str) -> None:
    """Each S/MIME-signed mail got a second reply, "I could not read the file smime.p7s",
    which also spent the thread's reply limit twice as fast (an outside probe)."""
    raw = (
        "From: alice@example.test\nTo: bot@gw.example\nSubject: signed\n"
        "Message-ID: <signed-1@example.test>\nMIME-Version: 1.0\n"
        f'Content-Type: multipart/signed; protocol="{protocol}"; micalg=sha-256; boundary=S\n\n'
        "--S\nContent-Type: multipart/mixed; boundary=M\n\n"
        "--M\nContent-Type: text/plain\n\nthe numbers are attached\n"
        "--M\nContent-Type: text/csv; name=q3.csv\nContent-Disposition: attachment; "
        "filename=q3.csv\n\na,b\n1,2\n--M--\n"
        f"--S\nContent-Type: {protocol}; name={signature}\n"
        f"Content-Disposition: attachment; filename={signature}\n"
        "Content-Transfer-Encoding: base64\n\nMIAGCSqGSIb3DQEHAqCAMIACAQEx\n--S--\n"
    )
    inbound = read(raw).inbound
    assert inbound is not None
    assert inbound.text == "the numbers are attached"
    assert [a.name for a in inbound.attachments] == ["q3.csv"]  # the file; not the signature


def test_an_encrypted_mail_s_only_file_is_refused_as_encrypted() -> None:
    """An S/MIME-encrypted mail reached the agent as its subject and an unread ``smime.p7m``,
    and its sender read "I do not read application/pkcs7-mime files" (an outside probe): now
    they read that it is encrypted, and what to do."""
    raw = (
        "From: alice@example.test\nTo: bot@gw.example\nSubject: the contract\n"
        "Message-ID: <sealed-1@example.test>\nMIME-Version: 1.0\n"
        'Content-Type: application/pkcs7-mime; smime-type=enveloped-data; name="smime.p7m"\n'
        'Content-Disposition: attachment; filename="smime.p7m"\n'
        "Content-Transfer-Encoding: base64\n\nMIAGCSqGSIb3DQEHA6CAMIACAQAxggE\n"
    )
    inbound = read(raw).inbound
    assert inbound is not None
    [sealed] = inbound.attachments  # refused as encrypted when taken in (test_file_policy)
    assert (sealed.name, sealed.media_type) == ("smime.p7m", "application/pkcs7-mime")


def test_a_mail_s_content_digest_is_its_from_date_and_subject_however_it_is_read() -> None:
    """What tells two mails under one Message-ID apart (D382): the same for the mail read
    whole, read by its header alone (too large) and for a copy a relay stamped; another for
    another mail of the same sender."""

    def digest(raw: str, *, head_only: bool = False) -> str | None:
        data = raw.encode()
        if head_only:
            parsed = parse_head(
                data.split(b"\n\n")[0],
                size=12_000_000,
                mailbox_address=BOT,
                own_domain_ids=(DOMAIN,),
                max_bytes=LIMIT,
                now_ms=7,
            )
        else:
            parsed = parse(
                data, mailbox_address=BOT, own_domain_ids=(DOMAIN,), max_bytes=LIMIT, now_ms=7
            )
        assert parsed.inbound is not None
        return parsed.inbound.content_digest

    mail = plain("Deploy it.")
    first = digest(mail)
    assert first is not None and first.startswith("h1:")
    assert digest(mail, head_only=True) == first
    assert digest("Received: from relay.example\n" + mail.replace("\n", "\r\n")) == first
    assert digest(plain("Deploy it.", Subject="Deploy   ")) == first  # folding, not content
    for other in (
        plain("Deploy it.", Date="Mon, 30 Nov 2026 14:05:00 +0000"),
        plain("Deploy it.", Subject="Roll back"),
        plain("Deploy it.", From="Bob <bob@example.com>"),
    ):
        assert digest(other) not in (first, None)


def test_a_header_full_of_defects_is_read_as_written_not_by_the_quadratic_parser(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Python's structured header parser is quadratic in a header's defects: 100 KB of ';' in a
    Content-Type took 8 minutes, 100 KB of commas in From 99 s, and one such mail held up
    every mail after it (an outside probe). Past 512 characters a structured header is read as
    written, by the linear string methods, with the same result for well-formed values."""
    given: list[int] = []

    def recorded(parse: Any) -> Any:
        def value_parser(value: str) -> Any:
            given.append(len(value))
            return parse(value)

        return staticmethod(value_parser)

    for header in (
        headerregistry.AddressHeader,
        headerregistry.ContentTypeHeader,
        headerregistry.ContentDispositionHeader,
    ):
        monkeypatch.setattr(header, "value_parser", recorded(header.value_parser))
    people = ", ".join(f"user{i}@example.test" for i in range(2000))
    raw = (
        "From: " + "," * 100_000 + "Ann <ann@example.test>\r\n"
        "To: bot@gw.example, only-in-the-defects-test@example.test\r\n"
        f"Cc: =?utf-8?q?Doe=2C_J=C3=B6rg?= <jd@example.test>, {people}\r\n"
        "Subject: the figures\r\nMessage-ID: <m1@example.test>\r\n"
        'Content-Type: multipart/mixed; boundary="Z"' + ";" * 100_000 + "\r\n\r\n"
        "--Z\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nsee the file\r\n"
        "--Z\r\nContent-Type: text/csv\r\nContent-Disposition: attachment; filename="
        + "x" * 600
        + ".csv\r\n\r\na,b\r\n--Z--\r\n"
    )
    inbound = taken(raw)
    assert (inbound.author.id, inbound.author.name, inbound.text) == (
        "ann@example.test",
        "Ann",
        "see the file",
    )
    [file] = inbound.attachments
    assert file.name.startswith("x" * 199)  # clipped to 200 characters, as before
    copies = inbound.reply_context["cc"]
    assert isinstance(copies, tuple)
    assert copies[0] == '"Doe, Jörg" <jd@example.test>'
    assert len(copies) == 50  # the most copies kept, as before
    assert attachment_content(raw.encode(), file.ref or "") == b"a,b"
    assert 20 < max(given) <= MAX_STRUCTURED_CHARS  # it saw the short To, and no long header
