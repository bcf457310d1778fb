r"""What a person wrote in a reply: quoted history, quote headers and signatures cut away.

Two steps, both pure and bounded:

* `clean_html` (an HTML body, before it becomes text): the elements mail clients mark as
  quoted history or signature are removed (Gmail's ``gmail_quote`` and ``gmail_signature``,
  Thunderbird's ``moz-cite-prefix`` and ``moz-signature``, Yahoo's and AOL's quote containers,
  Outlook's ``divRplyFwdMsg``/``appendonsend`` markers and header rule, after which everything
  is the original message). Beautiful Soup parses (html.parser: no native code); one pass
  over its elements finds them.
* `reply_text` (plain text): mail-parser-reply splits the text at the quote headers of every
  language it knows (``On ... wrote:``, ``Am ... schrieb ...:``, ``Le ... a écrit :``, Outlook
  ``From:/Sent:`` blocks in 14 languages...), and three rules of ours that need no language
  come first: an "original message" separator line (``-----Original Message-----``,
  ``---Original Message---``, ``-------- Message d'origine --------``, ``---- On ... wrote
  ----``), an Outlook header block whose first label means "From" in any of 30 languages
  (``От: ... Отправлено: ... Кому: ...``), and an attribution line before a ``>`` quote
  (``30.11.2026 14:00 пользователь Bot <bot@x> написал:``, ``... kirjoitti:``, ``...
  escreveu:``): it ends with a colon and names an address or a time. Then ``>`` lines, a
  signature the parser found (when it is plausibly one) and a trailing "Sent from my
  iPhone" line in any of a dozen languages go.

The parser's regexes backtrack badly on some input (minutes for 90,000 characters of "On "
on one line): it only ever sees a bounded probe (`_PROBE_CHARS`, lines over
`_PROBE_LINE_CHARS` replaced by a placeholder and restored after). Two of its word lists are
left out because they cut ordinary English: Polish ``Od:``/``Do:``/``Data:`` as a one-line
header (``Data: 42 rows`` would end the message; two such lines still count) and the Danish
and Swedish sign-offs (``Tak``, ``Kh``, ``/\w+`` cut "Take a backup", "Khan", "/deploy").
"""

from __future__ import annotations

import re
import warnings
from typing import Any

from bs4 import BeautifulSoup, MarkupResemblesLocatorWarning, Tag, XMLParsedAsHTMLWarning
from mailparser_reply import EmailMessage as ReplyParse  # type: ignore[import-untyped]
from mailparser_reply.constants import MAIL_LANGUAGES  # type: ignore[import-untyped]

__all__ = ["clean_html", "reply_text"]

_PROBE_LINE_CHARS = 200
_PROBE_CHARS = 16_000
_PLACEHOLDER = re.compile("\ue000(\\d+)\ue001")

# -- HTML ---------------------------------------------------------------------------------------

_REMOVE_CLASSES = frozenset(
    {
        "gmail_quote", "gmail_quote_container", "gmail_attr", "gmail_signature",
        "gmail_signature_prefix", "moz-cite-prefix", "moz-signature", "protonmail_quote",
        "protonmail_signature_block", "zmail_extra",
    }
)  # fmt: skip
_REMOVE_IDS = frozenset(
    {"AppleMailSignature", "ms-outlook-mobile-signature", "ms-outlook-ios-signature", "Zm-_Id_-Sgn"}
)
_CUT_IDS = frozenset({"appendonsend", "divRplyFwdMsg", "mail-editor-reference-message-container"})
_OUTLOOK_RULE = re.compile(r"border-top:\s*solid\s+#(?:E1E1E1|B5C4DF)", re.IGNORECASE)
_MAX_TAGS = 10_000
"""An HTML body with more tags is converted as it is (not cleaned): bounded work."""


def clean_html(html: str) -> str:
    """`html` without the quoted history and signatures its client marked (see the module)."""
    if html.count("<") > _MAX_TAGS:
        return html
    try:
        with warnings.catch_warnings():  # a body that looks like a URL is still a body
            warnings.simplefilter("ignore", MarkupResemblesLocatorWarning)
            warnings.simplefilter("ignore", XMLParsedAsHTMLWarning)
            soup = BeautifulSoup(html, "html.parser")
        marked = [(tag, _mark(tag)) for tag in soup.find_all(True)]
        for tag, mark in marked:
            if mark == "remove" and not tag.decomposed:
                tag.decompose()
        for tag, mark in marked:
            if mark == "cut" and not tag.decomposed and tag.parent is not None:
                _cut_from(tag)
        return str(soup)
    except Exception:  # whatever the bytes: the body as it came
        return html


def _mark(tag: Tag) -> str | None:
    """``remove`` (quoted history, a signature), ``cut`` (the original message starts here)."""
    found = tag.get("class")
    classes: list[str] = [found] if isinstance(found, str) else list(found or [])
    ident = str(tag.get("id") or "")
    if (
        _REMOVE_CLASSES.intersection(classes)
        or ident in _REMOVE_IDS
        or ident.startswith("AOLMsgPart")
        or "yahoo_quoted" in ident
        or any("yahoo_quoted" in name for name in classes)
        or tag.get("data-smartmail") == "gmail_signature"
    ):
        return "remove"
    if ident in _CUT_IDS:
        return "cut"
    if tag.name == "hr" and (
        str(tag.get("tabindex")) == "-1" or ident in ("stopSpelling", "zwchr")
    ):
        return "cut"
    if tag.name == "div" and _OUTLOOK_RULE.search(str(tag.get("style") or "")):
        return "cut"
    return None


def _cut_from(marker: Tag) -> None:
    """Remove `marker` and everything after it in document order."""
    node: Any = marker
    while node is not None and node.name != "[document]":
        for sibling in list(node.next_siblings):
            sibling.extract()
        node = node.parent
    marker.decompose()


# -- plain text ---------------------------------------------------------------------------------

_HEADER_LANGUAGES = [name for name in MAIL_LANGUAGES if name != "pl"]
_SIGNATURE_LANGUAGES = [name for name in MAIL_LANGUAGES if name not in ("da", "sv", "pl")]


def _polish_header() -> str:
    """Polish's quote headers, its Outlook block needing two lines like every other language."""
    polish = MAIL_LANGUAGES.get("pl", {})
    found = [polish.get("wrote_header", ""), polish.get("from_header", "").replace("{1,}", "{2,}")]
    return "|".join(pattern for pattern in found if pattern)


_HEADER_REGEX = re.compile(
    "|".join(
        pattern
        for pattern in (
            ReplyParse(text="", languages=list(_HEADER_LANGUAGES)).HEADER_REGEX.pattern,
            _polish_header(),
        )
        if pattern
    ),
    re.MULTILINE | re.IGNORECASE,
)
_SIGNATURE_REGEX = ReplyParse(
    text="", languages=list(_SIGNATURE_LANGUAGES), keep_hyphen_lists=True
).SIGNATURE_REGEX

_ORIGINAL = (
    r"original(?:\s+message|nachricht|meddelande)?|message\s+d'origine|ursprüngliche\s+nachricht"
    r"|oprindelig\s+(?:besked|meddelelse)|opprinnelig\s+melding|mensaje\s+original"
    r"|mensagem\s+original|messaggio\s+originale|oorspronkelijk\s+bericht"
    r"|исходное\s+сообщение|оригинальное\s+сообщение|вихідне\s+повідомлення"
    r"|alkuperäinen\s+viesti|wiadomość\s+oryginalna|oryginalna\s+wiadomość|původní\s+zpráva"
    r"|eredeti\s+üzenet|orijinal\s+(?:ileti|mesaj)|αρχικό\s+μήνυμα|原始邮件|原始郵件|元のメッセージ"
    r"|원본\s*메시지|reply\s+message"
)
_SEPARATOR = re.compile(
    rf"^\s*(?:[-_=*]{{2,}}\s*(?:{_ORIGINAL})\s*(?:[-_=*]{{2,}})?\s*:?|(?:{_ORIGINAL})\s*-{{2,}})\s*$"
    r"|^\s*-{3,}\s*\S.{0,200}?(?:@|\d{1,2}[:.]\d{2}).{0,200}?-{3,}\s*$",
    re.IGNORECASE,
)
"""A line that opens the original message: a dashed "original message" in any language, or
dashes around an address or a time (Zoho's ``---- On Mon, ... <a@b> wrote ----``)."""
_FROM_LABEL = (
    r"from|von|de|da|van|od|fra|från|frá|от|від|kimden|gönderen|lähettäjä|feladó|από"
    r"|expéditeur|remetente|mittente|afzender|avsändare|nadawca|odesílatel|od\s+koga"
    r"|发件人|寄件者|寄件人|差出人|보낸\s*사람|送信者"
)
_FROM_LINE = re.compile(rf"^\s*[*>\s]*(?:{_FROM_LABEL})\s*[*]?\s*[:\uff1a]\s*\S", re.IGNORECASE)
_LABEL_LINE = re.compile(r"^\s*[*>\s]*[^\W\d_][\w .'-]{0,30}?\s*[*]?\s*[:\uff1a]\s*(?:\S|$)")
_RULE = re.compile(r"^\s*[-_=*]{3,}\s*$")
_ATTRIBUTION_END = re.compile(r"[:\uff1a]\s*$")
_WRAPPED = re.compile(r"^(?:[<>(\[]|[^\s@]+@[^\s@]+[>)\]])")
"""The second line of an attribution wrapped inside its address: ``<a@b> wrote:``, ``>:``..."""
_ADDRESS_OR_TIME = re.compile(r"\S@\S|\b\d{1,2}[:.]\d{2}\b")
_TIME = re.compile(r"\b\d{1,2}[:.]\d{2}\b")
_DATE = re.compile(r"\b\d{4}\b|\b\d{1,2}[./-]\d{1,2}(?:[./-]\d{2,4})?\b|\d{1,2}\s*[年月]")
_SENT_FROM = re.compile(
    r"^\s*(?:sent|envoyé|enviado|inviato|gesendet|von\s+meinem|verzonden|verstuurd|skickat"
    r"|sendt|lähetetty|wysłane|odesláno|отправлено|надіслано|gönderildi|get\s+outlook"
    r"|télécharger\s+outlook|descargar\s+outlook)\b.{0,60}"
    r"(?:iphone|ipad|android|galaxy|samsung|huawei|xiaomi|pixel|blackberry|outlook|mobile"
    r"|handy|smartphone|yahoo\s+mail|aol|proton\s*mail|windows)\b\S*(?:\s+\S+){0,2}\s*$",
    re.IGNORECASE,
)
"""A "Sent from my iPhone" line, in a dozen languages (``Von meinem iPhone gesendet``...)."""


def reply_text(text: str) -> str:
    """The new text of a message: no quoted history, ``>`` lines or signature (the module).

    Not cut to any length: the caller counts what is left against its limit (the quoted
    history a person did not write never counts as text cut from their message).
    """
    lines = [line.strip() for line in text.split("\n")]
    probe: list[str] = []
    long_lines: dict[int, str] = {}
    size = 0
    blank = 0
    complete = True
    for line in lines:
        if not line:
            blank += 1
            if blank > 1:
                continue
        else:
            blank = 0
        if len(line) > _PROBE_LINE_CHARS:
            long_lines[len(long_lines)] = line
            line = f"\ue000{len(long_lines) - 1}\ue001"
        size += len(line) + 1
        if size > _PROBE_CHARS:
            complete = False
            break
        probe.append(line)
    cut = _quote_start(probe)
    if cut is not None:
        probe, complete = probe[:cut], True
    probe = _without_attributions(probe)
    parsed = ReplyParse(
        text="\n".join(probe),
        keep_hyphen_lists=True,
        _header_regex=_HEADER_REGEX,
        _signature_regex=_SIGNATURE_REGEX,
    )
    replies = parsed.read().replies
    if not replies:
        return ""
    first = replies[0]
    found_header = bool(first.headers) or len(replies) > 1
    if not complete and not found_header:
        # new text longer than the probe: keep it all, less the quoted lines
        return _finish("\n".join(_without_attributions(lines)))
    content: str = first.content
    if first.headers:
        content = content.replace(first.headers, "", 1)
    signature: str = first.signatures or ""
    if signature and _plausible_signature(signature) and content.endswith(signature):
        content = content[: -len(signature)]
    restored = _PLACEHOLDER.sub(lambda m: long_lines.get(int(m.group(1)), ""), content)
    return _finish(restored)


def _quote_start(lines: list[str]) -> int | None:
    """The first line of the original message by a separator or a header block, if any."""
    for index, line in enumerate(lines):
        if _SEPARATOR.match(line):
            return index
        if _FROM_LINE.match(line) and _header_block(lines, index):
            before = index - 1
            while before >= 0 and not lines[before]:
                before -= 1
            return before if before >= 0 and _RULE.match(lines[before]) else index
    return None


def _header_block(lines: list[str], start: int) -> bool:
    """Whether a "From:" line opens a header block: two more labelled lines right after.

    A label may wrap onto a second line (``From: Human Resources`` / ``<hr@example.com>``),
    and one line of the block must name an address or a time: "From: the team" followed by
    two lines of notes is text.
    """
    labelled = 0
    evidence = bool(_ADDRESS_OR_TIME.search(lines[start]))
    for line in lines[start + 1 : start + 7]:
        if not line:
            break
        if _LABEL_LINE.match(line):
            labelled += 1
            evidence = evidence or bool(_ADDRESS_OR_TIME.search(line))
        elif labelled == 0 and line.startswith("<") and "@" in line:
            evidence = True  # the sender's address wrapped onto its own line
        else:
            break
    return labelled >= 2 and evidence


def _without_attributions(lines: list[str]) -> list[str]:
    """`lines` without attribution lines (in any language).

    An attribution is up to three lines right before a ``>`` quote that end with a colon and
    name an address, or a date and a time (``On ... wrote:``, ``... пользователь ...
    написал:``); "The error I get at 14:05:" before a pasted quote is the sender's text.
    """
    drop: set[int] = set()
    for index, line in enumerate(lines):
        if not line.startswith(">"):
            continue
        end = index - 1
        while end >= 0 and not lines[end]:
            end -= 1
        if end < 0 or lines[end].startswith(">") or not _ATTRIBUTION_END.search(lines[end]):
            continue
        start = end
        while (
            start > 0
            and end - start < 2
            and lines[start - 1][:1] not in ("", ">")
            and (lines[start - 1].endswith(("<", "(", "[")) or _WRAPPED.match(lines[start]))
        ):
            start -= 1  # a client wrapped the attribution in the middle of the address
        block = " ".join(lines[start : end + 1])
        dated = bool(_TIME.search(block) and _DATE.search(block.replace(":", " ")))
        if len(block) <= 400 and ("@" in block or dated):
            drop.update(range(start, end + 1))
    return [line for index, line in enumerate(lines) if index not in drop]


def _finish(text: str) -> str:
    """`text` without ``>`` lines and a trailing "Sent from my ..." line, blank runs closed."""
    kept = [line for line in text.split("\n") if not line.lstrip().startswith(">")]
    while kept and not kept[-1].strip():
        kept.pop()
    if kept and _SENT_FROM.match(kept[-1]) and len(kept[-1].split()) <= 7 and "," not in kept[-1]:
        kept.pop()
    return re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip()


def _plausible_signature(signature: str) -> bool:
    """Whether a signature mail-parser-reply found is one, not a sentence starting "Thanks,".

    Its first line must be a delimiter (``--``, ``__``), a "Sent from my ..." line, or a short
    sign-off (at most six words, no digits) whose words after a comma are capitalized names:
    "Thanks, Bob" is a signature; "Thanks, that worked. Now deploy 43" is text.
    """
    first = signature.split("\n", 1)[0].lstrip("> ").strip()
    lowered = first.lower()
    if first in ("--", "__") or lowered.startswith(
        ("sent from my", "get outlook for", "gesendet von")
    ):
        return True
    if len(first) > 60 or len(first.split()) > 6 or any(char.isdigit() for char in first):
        return False
    if first.rstrip(",.!").count(",") > 1 or first.endswith(("?", ":")):
        return False
    _, comma, rest = first.partition(",")
    return not comma or all(word[:1].isupper() for word in rest.split())
