"""Reply extraction on a corpus of real clients' mails, each with the text a person wrote.

``corpus/*.eml`` are mails in the shapes real clients send them (Gmail in 18 languages, Gmail
for Android, Samsung, Outlook desktop, web and mobile in 9 languages, Apple Mail and iPhone,
Thunderbird, Yahoo, AOL, Zimbra, Zoho, Proton, Yandex, Mail.ru, Foxmail, Windows Mail; HTML-only
mails; KOI8-R, windows-1251, ISO-8859-1, ISO-2022-JP and GB2312 bodies), and machine mail that
carries no RFC 3834 header. Each has ``<name>.expected``: the new text exactly, or
``skip: <reason>`` for mail that must not be answered. The accuracy is printed at the end of
the run (``tests/adapters/email/conftest.py``); ``corpus/README.md`` says how to add a mail.
"""

from __future__ import annotations

from email import message_from_bytes, policy
from pathlib import Path

import pytest

from adapters.email.message import parse
from tests.adapters.email.corpus_score import SCORES

CORPUS = Path(__file__).parent / "corpus"
MAILS = sorted(CORPUS.glob("*.eml"))


def extracted(path: Path) -> str:
    parsed = parse(
        path.read_bytes(),
        mailbox_address="bot@gw.example",
        own_domain_ids=("gw.example",),
        max_bytes=10_000_000,
        now_ms=0,
    )
    return parsed.inbound.text if parsed.inbound is not None else f"skip: {parsed.reason}"


@pytest.mark.parametrize("path", MAILS, ids=[path.stem for path in MAILS])
def test_a_corpus_mail_gives_the_text_its_sender_wrote(path: Path) -> None:
    expected = path.with_suffix(".expected").read_text(encoding="utf-8").rstrip("\n")
    got = extracted(path)
    SCORES[path.stem] = got == expected
    assert got == expected


def test_the_corpus_covers_every_client_and_shape() -> None:
    names = {path.stem for path in MAILS}
    assert len(names) >= 60
    assert all(path.with_suffix(".expected").is_file() for path in MAILS)
    for family in ("gmail", "android", "outlook", "apple-mail", "iphone", "thunderbird", "yahoo"):
        assert any(name.startswith(family) for name in names), family
    assert any(name.startswith("aol") for name in names)
    html_only: list[str] = []
    legacy: set[str] = set()
    for path in MAILS:
        message = message_from_bytes(path.read_bytes(), policy=policy.default)
        types = {part.get_content_type() for part in message.walk()}
        if "text/html" in types and "text/plain" not in types:
            html_only.append(path.stem)
        legacy.update(
            str(charset).lower()
            for charset in message.get_charsets()
            if charset and str(charset).lower() not in ("utf-8", "us-ascii")
        )
    assert len(html_only) >= 8, html_only
    assert {"koi8-r", "windows-1251", "iso-8859-1", "iso-2022-jp", "gb2312"} <= legacy, legacy
    skips = [p for p in MAILS if p.with_suffix(".expected").read_text().startswith("skip: ")]
    assert len(skips) >= 4
