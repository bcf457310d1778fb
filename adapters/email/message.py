"""Inbound email to the channel seam: which messages the bot takes, as which thread and text.

Pure functions, no I/O. `parse` reads one raw RFC 5322 message and says ``skip`` (with a short,
secret-free reason tag) or ``take`` (with an `Inbound`). It never raises: whatever the bytes,
the answer is a `Parsed`.

The rules:

* **Loop guard first** (`classify_automatic`, RFC 3834 and the de-facto headers): the bot's own
  mail, bounces and delivery or read reports, auto-replies (out-of-office included), bulk and
  list mail are skipped, so the bot never answers a machine.
* **Thread**: the lane is ``email:<root Message-ID>``; the root is the first id of
  ``References``, else the first id of ``In-Reply-To``, else the message's own id (a message
  that references nothing starts a new lane). A broken or missing ``References`` with a
  ``Re:`` subject is *not* matched to a thread by its subject: subjects are neither unique
  ("Re: Deploy" names many conversations) nor authenticated (anyone can reuse one to push text
  into a lane holding someone else's context and approvals), and Gmail itself needs a
  reference besides the subject. Such a message starts its own lane.
* **Ids** are kept in their ``<...>`` form exactly as written (a reply's ``References`` copies
  them verbatim, so the same conversation always yields the same root). A message without a
  usable ``Message-ID`` gets ``<sha256(From, Date, Subject, body)@no-message-id.invalid>``:
  stable for the same bytes, and never a real id (``.invalid`` is reserved, RFC 2606).
* **Text** is the new text of the message only: the plain part is preferred, else the HTML part
  without the quotes and signatures its client marked, laid out as text by inscriptis
  (`html_to_text`: tables in columns, lists, links kept as ``text (url)``, ``<blockquote>`` as
  ``>`` lines); quoted history in any language and a trailing signature are stripped
  (`adapters.email.quotes`) from replies. A forward (subject ``Fwd:``/``WG:``...) keeps its
  whole text: the forwarded message is what the sender wants read; so does a message that
  starts a thread, which quotes no history (D336). Text in no declared charset is guessed
  (`_decode_part`, D335). A message without new text that
  starts a thread takes its subject as text; a reply without new text and without attachments
  is skipped as ``empty``.
* **Length**: beyond `MAX_TEXT_CHARS` characters of new text (quoted history removed first:
  it never counts) the text is cut and `Inbound.cut` says so, and so does an HTML body longer
  than is converted (`_MAX_HTML_CHARS` once inline ``data:`` images are left out): the agent
  and the person are told (decision D169).
* **Attachments** are listed with their name, media type, decoded size and part (``ref``:
  ``part-<n>``, whose content `attachment_content` decodes: the channel hands it to the
  gateway's blob area, which applies the per-file limits; D223). At most `MAX_ATTACHMENTS`
  are listed, the rest counted (`Inbound.unlisted_attachments`); the whole message is
  already bounded by ``max_bytes``.
"""

from __future__ import annotations

import base64
import codecs
import hashlib
import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from email.header import decode_header
from email.message import EmailMessage, Message
from email.parser import BytesParser
from email.utils import getaddresses
from itertools import islice
from typing import Any, Literal

import charset_normalizer
from inscriptis.css_profiles import CSS_PROFILES  # type: ignore[import-untyped]
from inscriptis.html_engine import Inscriptis  # type: ignore[import-untyped]
from inscriptis.html_properties import Display, WhiteSpace  # type: ignore[import-untyped]
from inscriptis.model.canvas import Canvas  # type: ignore[import-untyped]
from inscriptis.model.config import ParserConfig  # type: ignore[import-untyped]
from inscriptis.model.html_document_state import (  # type: ignore[import-untyped]
    HtmlDocumentState,
)
from inscriptis.model.html_element import HtmlElement  # type: ignore[import-untyped]
from inscriptis.model.tag import CustomHtmlTagHandlerMapping  # type: ignore[import-untyped]
from lxml.etree import ParserError  # type: ignore[import-untyped]
from lxml.html import document_fromstring  # type: ignore[import-untyped]

from adapters.channel import Attachment, Author, Inbound, TextCut, ThreadRef
from adapters.email.headers import POLICY, eight_bit
from adapters.email.quotes import clean_html, reply_text
from adapters.numbers import whole_number
from adapters.text_cut import keep_within

__all__ = [
    "attachment_content",
    "CHANNEL",
    "classify_automatic",
    "email_thread",
    "html_to_text",
    "MAX_ATTACHMENTS",
    "MAX_TEXT_CHARS",
    "message_ids",
    "normalize_subject",
    "parse",
    "parse_head",
    "Parsed",
]

CHANNEL = "email"
MAX_TEXT_CHARS = 40_000
"""The most characters of an inbound message's new text the agent gets (cut beyond, and said)."""
MAX_ATTACHMENTS = 20
"""The most attachments listed per message (further ones are counted, not listed)."""

_MAX_ID_CHARS = 250
_MAX_REFERENCES = 50
_MAX_RECIPIENTS = 50
_MAX_HEADER_CHARS = 1000
_MAX_NAME_CHARS = 200
_MAX_THREAD_INDEX_CHARS = 2000
_MAX_HTML_CHARS = 500_000
"""An HTML body is converted up to this many characters (without inline images' data)."""
_INLINE_DATA = re.compile(r"(?i)\bdata:[^\s\"'<>]{200,}")
_MAX_DEPTH = 20
_MAX_LEAVES = 500
_SYNTHETIC_ID_DOMAIN = "no-message-id.invalid"

_ID = re.compile(r"<([!-;=?-~]{1,248})>")
_BARE_ID = re.compile(r"[!-;=?-~]+@[!-;=?-~]+")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ue000\ue001]")
_SPACE = re.compile(r"\s+")
_PREFIX = re.compile(
    r"^\s*(?:\[[^\[\]]{0,80}\]\s*)*"
    r"(re|fwd?|aw|wg|sv|vs|antw|antwort|tr|rv|enc|odp|doorst)"
    r"\s*(?:\[\d{1,4}\]|\(\d{1,4}\))?\s*[:\uff1a]\s*",
    re.IGNORECASE,
)
_FORWARD_PREFIXES = frozenset({"fw", "fwd", "wg", "tr", "rv", "enc", "doorst"})
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")
_ENCODED_WORD = re.compile(r"=\?[^?\s]+\?[bBqQ]\?[^?\s]*\?=")


@dataclass(frozen=True, slots=True)
class Parsed:
    """What to do with one raw message: skip it (and why) or take it as an `Inbound`."""

    action: Literal["take", "skip"]
    reason: str
    """A short, secret-free tag for logs and counters: ``new`` or ``reply`` when taken; when
    skipped ``oversized``, ``malformed``, ``undecodable``, ``empty``, ``no_sender``,
    ``own_message``, ``bounce``, ``delivery_report``, ``auto_submitted``, ``auto_reply``,
    ``auto_reply_suppressed``, ``bulk`` or ``list``."""
    inbound: Inbound | None = None


def email_thread(mailbox_address: str, root_message_id: str) -> ThreadRef:
    """The thread of an email conversation: the bot's address and the root ``Message-ID``."""
    return ThreadRef(channel=CHANNEL, space=mailbox_address.strip().lower(), thread=root_message_id)


def message_ids(value: str | None) -> list[str]:
    """The message ids of a ``References``/``In-Reply-To``/``Message-ID`` value, in order.

    Each id keeps its angle brackets (``<local@domain>``) and its case. Bare ``local@domain``
    tokens (written by broken mailers) are taken, bracketed, only when the value holds no
    bracketed id. Ids with spaces, control or non-ASCII characters, or longer than 250
    characters are not ids and are left out.
    """
    if not value:
        return []
    found = [f"<{m}>" for m in _ID.findall(value)]
    if not found:
        for token in re.split(r"[\s,;]+", value.strip()):
            if len(token) <= _MAX_ID_CHARS - 2 and _BARE_ID.fullmatch(token):
                found.append(f"<{token}>")
    return list(dict.fromkeys(found))  # in order, once each (a list's `in` was quadratic)


def normalize_subject(subject: str) -> str:
    """`subject` without its stack of reply and forward prefixes, for comparisons and replies.

    Strips any run of ``Re:``, ``RE:``, ``Fwd:``, ``FW:``, ``AW:``, ``WG:``, ``SV:``, ``VS:``,
    ``Antw:``, ``TR:``, ``RV:``, ``Enc:``... (any case, counted forms like ``Re[2]:``, a
    full-width colon), and bracketed tags such as ``[EXTERNAL]`` only where a prefix follows
    them: ``[EXTERNAL] Re: Deploy`` becomes ``Deploy`` (the tag a gateway adds to each reply
    does not pile up), while ``[#1234] Printer`` keeps its tag (it is part of the subject, and
    Gmail threads only replies whose subject matches). Whitespace runs become one space.
    """
    text = _SPACE.sub(" ", subject).strip()
    for _ in range(100):
        match = _PREFIX.match(text)
        if match is None or match.end() == 0:
            break
        text = text[match.end() :]
    return text.strip()


_NO_REPLY = re.compile(r"(?:^|[-_.])(no[-_.]?reply|do[-_.]?not[-_.]?reply)(?:$|[-_.])")
"""A local part that says the address takes no answers, as a word of it (``noreply``,
``jira-noreply``, ``alerts.no-reply``; a ``+tag`` is cut off first)."""


def classify_automatic(
    headers: Message | Mapping[str, str],
    *,
    mailbox_address: str | None = None,
    own_domain_ids: str | Collection[str] = (),
) -> str | None:
    """Why a message must not be answered (a reason tag), or None for mail from a person.

    In order (the first that applies names the reason):

    * ``own_message``: ``From`` is `mailbox_address`, or the ``Message-ID`` is one the bot made
      (`adapters.email.compose.reply_message_id` for one of `own_domain_ids`).
    * ``bounce``: ``Content-Type: multipart/report; report-type=delivery-status`` (RFC 3464),
      ``X-Failed-Recipients``, an empty ``Return-Path`` (``<>``), or a ``MAILER-DAEMON`` or
      ``postmaster`` sender.
    * ``no_reply``: a sender that takes no answers by its name (``noreply@``, ``no-reply@``,
      ``donotreply@``, ``noreply-alerts@``...): notifications, whose answer goes nowhere.
    * ``delivery_report``: any other ``multipart/report`` (read receipts, RFC 8098 MDNs).
    * ``auto_submitted``: ``Auto-Submitted`` present with a value other than ``no`` (RFC 3834;
      Exchange's out-of-office replies carry ``auto-generated`` or ``auto-replied``), or
      ``Precedence: auto_reply``.
    * ``auto_reply``: ``X-Autoreply`` or ``X-Autorespond`` (vacation responders), Apple's
      ``X-Apple-Action: VACATION`` (iCloud), ``X-Autogenerated: Reply``, an
      ``X-POST-MessageClass`` naming an autoresponder, or a subject that opens the way
      responders write theirs (``Auto reply:``, ``Autoreply:``, ``Automatic reply:``, ``Out
      of Office:``, ``Automatische Antwort:``, ``Réponse automatique :``, ``Автоматический
      ответ:``... in 20 languages): these carry no RFC 3834 header.
    * ``auto_reply_suppressed``: ``X-Auto-Response-Suppress`` naming ``All``, ``OOF`` or
      ``AutoReply``: the sender (Exchange out-of-office replies and rule-generated mail, and
      notification systems) asks not to be auto-answered, and the bot's replies are automatic.
      ``DR``/``NDR``/``RN``/``NRN`` alone only concern delivery and read reports: not flagged.
    * ``bulk``: ``Precedence`` (or ``X-Precedence``) ``bulk`` or ``junk``.
    * ``list``: ``Precedence: list`` or any ``List-*`` header of RFC 2369/2919 (``List-Id``,
      ``List-Unsubscribe``, ``List-Post``...), or ``Mailing-List``/``X-Mailing-List``.

    Headers that ordinary mail from people carries are deliberately not signals:
    ``X-MS-Exchange-Generated-Message-Source`` and ``X-MS-Exchange-Inbox-Rules-Loop`` (Exchange
    also stamps them on a person's message that an inbox rule redirects, e.g. a shared
    mailbox forwarded to the bot), ``Thread-Index``/``Thread-Topic``, ``X-Mailer``,
    ``Precedence: first-class``/``normal``, ``Auto-Submitted: no``, ``X-Loop`` (also stamped
    by forwarding setups).

    Args:
        headers: A parsed message (any policy), or its headers as a mapping.
        mailbox_address: The bot's address.
        own_domain_ids: The domains the bot's ``Message-ID``s use (compose's ``domain``).

    Returns:
        The reason tag, or None.
    """
    msg = headers if isinstance(headers, Message) else _message_of(headers)
    own = _own_reason(msg, mailbox_address, own_domain_ids)
    if own:
        return own
    content_type = _safe_lower(lambda: msg.get_content_type())
    if content_type == "multipart/report":
        report_type = _param(msg, "report-type")
        return "bounce" if report_type == "delivery-status" else "delivery_report"
    if content_type == "message/delivery-status" or _header(msg, "X-Failed-Recipients"):
        return "bounce"
    return_path = _header(msg, "Return-Path")
    if return_path is not None and return_path.strip(" <>") == "":
        return "bounce"
    sender = _first_address(msg, "From")
    local = sender[1].rpartition("@")[0].lower() if sender else ""
    if local in ("mailer-daemon", "postmaster") or local.startswith("microsoftexchange"):
        return "bounce"  # Exchange writes its non-DSN "Undeliverable" notices from the last
    if _BOUNCE_SUBJECT.match(_header(msg, "Subject") or ""):
        return "bounce"
    if _NO_REPLY.search(local.partition("+")[0]):
        return "no_reply"
    auto = (_header(msg, "Auto-Submitted") or "").split(";")[0].strip().lower()
    precedence = (_header(msg, "Precedence") or _header(msg, "X-Precedence") or "").lower()
    precedence = precedence.split(";")[0].strip()
    if (auto and auto != "no") or precedence == "auto_reply":
        return "auto_submitted"
    if _header(msg, "X-Autoreply") is not None or _header(msg, "X-Autorespond") is not None:
        return "auto_reply"
    apple = (_header(msg, "X-Apple-Action") or "").lower()
    generated = (_header(msg, "X-Autogenerated") or "").lower()
    message_class = (_header(msg, "X-POST-MessageClass") or "").lower()
    if "vacation" in apple or generated == "reply" or "autoresponder" in message_class:
        return "auto_reply"
    suppress = set(re.split(r"[\s,;]+", (_header(msg, "X-Auto-Response-Suppress") or "").lower()))
    if suppress & {"all", "oof", "autoreply"}:
        return "auto_reply_suppressed"
    if _AUTO_SUBJECT.match(_header(msg, "Subject") or ""):
        return "auto_reply"
    if precedence in ("bulk", "junk"):
        return "bulk"
    if precedence == "list" or any(_header(msg, name) is not None for name in _LIST_HEADERS):
        return "list"
    return None


_BOUNCE_SUBJECT = re.compile(
    r"\s*(?:(?:undeliverable|unzustellbar|non\s+remis|no\s+entregado|non\s+recapitabile"
    r"|returned\s+mail)\s*[:\uff1a]|delivery\s+status\s+notification\s+\(failure\)"
    r"|undelivered\s+mail\s+returned\s+to\s+sender|mail\s+delivery\s+failed\b)",
    re.IGNORECASE,
)
"""The subject of a delivery failure notice that comes without a DSN part (older Exchange,
some hosted relays): answering it would answer a machine, and start a loop."""
_AUTO_SUBJECT = re.compile(
    r"\s*(?:auto(?:matic|matische|matisk)?[\s_-]*(?:reply|response|responder|antwort|svar)"
    r"|autoreply|autorespon[ds]e?|out\s+of\s+(?:the\s+)?office(?:\s+auto\s*reply)?"
    r"|abwesenheitsnotiz|réponse\s+automatique|respuesta\s+automática|risposta\s+automatica"
    r"|resposta\s+automática|automatisch\s+antwoord|automatyczna\s+odpowiedź"
    r"|automaattinen\s+vastaus|automatická\s+odpověď|otomatik\s+(?:yan\u0131t|cevap)"
    r"|автоматический\s+ответ|автовідповідь|αυτόματη\s+απάντηση"
    r"|自动回复|自動回覆|自動応答|自動返信|자동\s*응답)\s*[:\uff1a]",
    re.IGNORECASE,
)
"""The subject of a vacation or other automatic reply, in the forms responders write."""
_LIST_HEADERS = (
    "List-Id",
    "List-Unsubscribe",
    "List-Unsubscribe-Post",
    "List-Post",
    "List-Help",
    "List-Subscribe",
    "List-Owner",
    "List-Archive",
    "Mailing-List",
    "X-Mailing-List",
)


def parse(
    raw: bytes,
    *,
    mailbox_address: str,
    own_domain_ids: str | Collection[str],
    max_bytes: int,
    now_ms: int,
) -> Parsed:
    """Read one raw message: skip it (a reason tag) or take it as an `Inbound` (never raises).

    Args:
        raw: The message as fetched (``BODY[]``), RFC 5322 bytes.
        mailbox_address: The bot's address (the thread's space, lowercased).
        own_domain_ids: The domains of the ``Message-ID``s the bot makes (the loop guard
            recognizes its own mail by them).
        max_bytes: Larger messages are skipped as ``oversized`` before parsing.
        now_ms: `Inbound.received_at_ms`.

    Returns:
        ``Parsed("take", "new"|"reply", inbound)`` or ``Parsed("skip", reason)``: see the module
        docstring for the rules and `Parsed.reason` for the tags.
    """
    try:
        return _parse(
            bytes(raw),
            mailbox_address=mailbox_address,
            own_domain_ids=own_domain_ids,
            max_bytes=max_bytes,
            now_ms=now_ms,
        )
    except Exception:
        return Parsed("skip", "malformed")


def _parse(
    raw: bytes,
    *,
    mailbox_address: str,
    own_domain_ids: str | Collection[str],
    max_bytes: int,
    now_ms: int,
) -> Parsed:
    if len(raw) > max_bytes:
        return Parsed("skip", "oversized")
    msg = BytesParser(policy=POLICY).parsebytes(raw)
    assert isinstance(msg, EmailMessage)
    return _read(
        msg, raw, mailbox_address=mailbox_address, own_domain_ids=own_domain_ids, now_ms=now_ms
    )


def parse_head(
    head: bytes,
    *,
    size: int,
    mailbox_address: str,
    own_domain_ids: str | Collection[str],
    max_bytes: int,
    now_ms: int,
) -> Parsed:
    """A message larger than `max_bytes`, read from its header alone (never raises).

    The same rules as `parse` (the loop guard, the thread), but the body is never fetched:
    the `Inbound` holds the subject at most, and `Inbound.cut` says the message (`size`
    bytes) was too large to read, so the person is told rather than never answered (D169).
    """
    try:
        msg = BytesParser(policy=POLICY).parsebytes(bytes(head), headersonly=True)
        assert isinstance(msg, EmailMessage)
        unread = TextCut(kept=0, total=None, message_bytes=size, limit_bytes=max_bytes)
        return _read(
            msg,
            bytes(head),
            mailbox_address=mailbox_address,
            own_domain_ids=own_domain_ids,
            now_ms=now_ms,
            unread=unread,
        )
    except Exception:
        return Parsed("skip", "malformed")


def _read(
    msg: EmailMessage,
    raw: bytes,
    *,
    mailbox_address: str,
    own_domain_ids: str | Collection[str],
    now_ms: int,
    unread: TextCut | None = None,
) -> Parsed:
    automatic = classify_automatic(
        msg, mailbox_address=mailbox_address, own_domain_ids=own_domain_ids
    )
    if automatic:
        return Parsed("skip", automatic)
    sender = _first_address(msg, "From")
    if sender is None:
        return Parsed("skip", "no_sender")
    name, address = sender
    subject = _clip(_header(msg, "Subject") or "", _MAX_HEADER_CHARS)
    own_ids = message_ids(_header(msg, "Message-ID"))
    message_id = own_ids[0] if own_ids else _synthetic_id(raw)
    references = message_ids(_header(msg, "References"))
    in_reply_to = message_ids(_header(msg, "In-Reply-To"))
    root = references[0] if references else in_reply_to[0] if in_reply_to else message_id
    if root != message_id:  # one of the bot's replies names its thread: a client that wrote
        # only In-Reply-To (no References) named the reply, and started a thread of its own
        root = _thread_named(root, own_domain_ids) or root
    # a mail that starts a thread quotes no history of it: its ">" lines, "-- " and
    # "X wrote:" are the sender's own (a pasted log, a separator) and are kept (D336)
    whole = _is_forward(subject) or root == message_id
    if unread is not None:  # too large to read: the subject says what it is about, at most
        text = normalize_subject(subject)
        attachments: tuple[Attachment, ...] = ()
        unlisted = 0
        cut: TextCut | None = unread.model_copy(update={"kept": len(text)})
    else:
        body = _body(msg, strip_quotes=not whole)
        if body.status == "undecodable":
            return Parsed("skip", "undecodable")
        forwarded, read = _forwarded(msg)
        attachments, unlisted = _attachments(msg, body.part, read)
        text = body.text
        cut = None
        own = (text.strip() if whole else reply_text(text)) if text else ""
        text = "\n\n".join(piece for piece in (own, *forwarded) if piece)
        if text:
            text, cut = keep_within(text, MAX_TEXT_CHARS)
        if body.partial:  # the end of the HTML was never read: how much it held is unknown
            cut = TextCut(kept=len(text), total=None)
        if not text and root == message_id:
            text = normalize_subject(subject)
        if not text and not attachments:
            return Parsed("skip", "empty" if body.status == "found" else "malformed")
    chain = references or in_reply_to[:1]
    if len(chain) > _MAX_REFERENCES:
        chain = chain[:1] + chain[-(_MAX_REFERENCES - 1) :]
    context: dict[str, Any] = {
        "message_id": message_id,
        "from": _format_address(name, address),
    }
    if chain:
        context["references"] = chain
    if subject:
        context["subject"] = subject
    for key, header in (("to", "To"), ("cc", "Cc")):
        found = _addresses(msg, header)
        if found:
            context[key] = [_format_address(*pair) for pair in found[:_MAX_RECIPIENTS]]
    topic = _clip(_header(msg, "Thread-Topic") or "", _MAX_HEADER_CHARS)
    if topic:
        context["thread_topic"] = topic
    index = (_header(msg, "Thread-Index") or "").strip()
    if index and len(index) <= _MAX_THREAD_INDEX_CHARS and _BASE64.fullmatch(index):
        context["thread_index"] = index
    inbound = Inbound(
        thread=email_thread(mailbox_address, root),
        message_id=message_id,
        author=Author(id=address, name=name or None),
        text=text,
        attachments=attachments,
        received_at_ms=now_ms,
        reply_context=context,
        cut=cut,
        unlisted_attachments=unlisted,
        content_digest=_content_digest(raw),
    )
    return Parsed("take", "new" if root == message_id else "reply", inbound)


# --- headers ---------------------------------------------------------------------------------


def _message_of(headers: Mapping[str, str]) -> Message:
    msg = Message()
    for key, value in headers.items():
        msg[key] = value
    return msg


def _clean(text: str) -> str:
    """`text` as valid Unicode without control characters.

    Raw 8-bit header bytes are read as UTF-8, else as Windows-1252, as a body's are guessed
    for Latin text (D335): a Latin-1 ``Subject`` became ``Caf\ufffd`` (an outside probe).
    """
    text = eight_bit(text)
    text = text.encode("utf-8", "replace").decode("utf-8")  # any other lone surrogate
    return _CONTROL.sub("", text)


def _header(msg: Message, name: str) -> str | None:
    """The first `name` header as one clean line, or None when absent (never raises).

    Decoded, then cleaned: a header the parser refuses (an encoded word in a display name that
    decodes to a line break) is read again with each such word decoded, cleaned and encoded
    anew, so its structure stays what the sender wrote (D143).
    """
    try:
        value: Any = msg.get(name)
    except Exception:
        value = None
        try:
            for key, raw in msg.raw_items():
                if key.lower() == name.lower():
                    value = _reparsed(name, str(raw))
                    break
        except Exception:
            return None
    if value is None:
        return None
    try:
        text = str(value)
    except Exception:
        return ""
    return _SPACE.sub(" ", _clean(text)).strip()


def _reparsed(name: str, raw: str) -> Any:
    """`raw` parsed as header `name` after `_defuse_word` (the defused text if it still fails)."""
    defused = _ENCODED_WORD.sub(_defuse_word, raw)
    try:
        return POLICY.header_factory(name, defused)
    except Exception:
        return defused


def _defuse_word(match: re.Match[str]) -> str:
    """An encoded word as it was, or, if it decodes to control characters, one without them."""
    word = match.group(0)
    try:
        text = "".join(
            part.decode(_codec(charset), "replace") if isinstance(part, bytes) else part
            for part, charset in decode_header(word)
        )
    except Exception:  # not decodable: what is left of it can be no structure either
        return re.sub(r"[^\w.\- ]", "", word)
    cleaned = _SPACE.sub(" ", _clean(text)).strip()
    if cleaned == text:
        return word
    return f"=?utf-8?b?{base64.b64encode(cleaned.encode()).decode('ascii')}?="


def _codec(charset: str | None) -> str:
    try:
        return codecs.lookup(charset or "ascii").name
    except LookupError:
        return "latin-1"  # an unknown charset: every byte still becomes a character


def _safe_lower(read: Any) -> str:
    try:
        return str(read()).strip().lower()
    except Exception:
        return ""


def _addresses(msg: Message, name: str) -> list[tuple[str, str]]:
    """The valid ``(display name, address)`` pairs of an address header, addresses lowercased."""
    value = _header(msg, name)
    if not value:
        return []
    try:
        pairs = getaddresses([value])
    except Exception:
        return []
    found: list[tuple[str, str]] = []
    seen: set[str] = set()
    for display, address in pairs:
        address = address.strip().lower()
        if _valid_address(address) and address not in seen:
            seen.add(address)
            if "=?" in display:  # a long header is read as written (`adapters.email.headers`)
                display = _words_decoded(display)
            found.append((_clip(display, _MAX_NAME_CHARS), address))
    return found


def _words_decoded(text: str) -> str:
    """`text` with its RFC 2047 encoded words decoded (as it was, if they cannot be)."""
    try:
        return "".join(
            part.decode(_codec(charset), "replace") if isinstance(part, bytes) else part
            for part, charset in decode_header(text)
        )
    except Exception:
        return text


def _format_address(name: str, address: str) -> str:
    """``Name <address>`` as readable text (non-ASCII names unencoded, specials quoted)."""
    if not name:
        return address
    if re.search(r'[()<>\[\]:;@\\,."]', name):
        name = '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"{name} <{address}>"


def _first_address(msg: Message, name: str) -> tuple[str, str] | None:
    found = _addresses(msg, name)
    return found[0] if found else None


def _valid_address(address: str) -> bool:
    local, at, domain = address.rpartition("@")
    return (
        bool(at and local and domain)
        and len(address) <= 320
        and re.fullmatch(r"[^\s<>()\[\],;:\"\\]+", domain) is not None
        and not any(char.isspace() or char in "<>" for char in local)
    )


def _thread_named(message_id: str, own_domain_ids: str | Collection[str]) -> str | None:
    """The thread a Message-ID of the bot's own carries (None: another's, or none)."""
    from adapters.email.compose import thread_of_own_id  # compose imports this module

    domains = _domains(own_domain_ids)
    return thread_of_own_id(message_id, domains) if domains else None


def _domains(own_domain_ids: str | Collection[str]) -> list[str]:
    """The domains of the bot's own Message-IDs, one given alone or several."""
    return [own_domain_ids] if isinstance(own_domain_ids, str) else list(own_domain_ids)


def _own_reason(
    msg: Message, mailbox_address: str | None, own_domain_ids: str | Collection[str]
) -> str | None:
    sender = _first_address(msg, "From")
    if mailbox_address and sender and sender[1] == mailbox_address.strip().lower():
        return "own_message"
    domains = _domains(own_domain_ids)
    if domains:
        # compose imports this module (subjects, ids): importing it here avoids a cycle
        from adapters.email.compose import is_own_message_id

        for message_id in message_ids(_header(msg, "Message-ID")):
            if any(is_own_message_id(message_id, domain) for domain in domains):
                return "own_message"
    return None


def _is_forward(subject: str) -> bool:
    match = _PREFIX.match(_SPACE.sub(" ", subject))
    return match is not None and match.group(1).lower() in _FORWARD_PREFIXES


def _synthetic_id(raw: bytes) -> str:
    """A stable id for a message without one: a digest of From, Date, Subject and the body."""
    head, body = _split_head(raw)
    digest = _head_digest(head)
    digest.update(body.replace(b"\r\n", b"\n"))
    return f"<{digest.hexdigest()[:40]}@{_SYNTHETIC_ID_DOMAIN}>"


def _content_digest(raw: bytes) -> str:
    """What tells two mails with one Message-ID apart (D382): a digest of From, Date, Subject.

    The header alone, as the sender wrote it: the same for a message read whole or, too large,
    by its header only, and for each copy of one mail delivered twice (a relay adds its own
    ``Received`` lines, never another ``Date``).
    """
    return "h1:" + _head_digest(_split_head(raw)[0]).hexdigest()[:32]


def _head_digest(head: bytes) -> hashlib._Hash:
    fields: dict[str, bytes] = {}
    for line in re.split(rb"\r?\n(?![ \t])", head):
        key, sep, value = line.partition(b":")
        name = key.strip().lower()
        if sep and name in (b"from", b"date", b"subject") and name not in fields:
            fields[name.decode("ascii", "replace")] = b" ".join(value.split())
    digest = hashlib.sha256()
    for name in ("from", "date", "subject"):
        digest.update(fields.get(name, b"") + b"\n")
    return digest


def _split_head(raw: bytes) -> tuple[bytes, bytes]:
    match = re.search(rb"\r?\n\r?\n", raw)
    if match is None:
        return raw, b""
    return raw[: match.start()], raw[match.end() :]


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- body ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Body:
    status: Literal["found", "none", "undecodable"]
    text: str = ""
    part: Message | None = None
    partial: bool = False
    """An HTML body longer than is converted: `text` is the start of it only."""


def _leaves(part: Message, depth: int = 0) -> Iterator[Message]:
    """The non-multipart parts, depth-first, not descending into attached messages."""
    if depth > _MAX_DEPTH:
        return
    if part.get_content_maintype() == "multipart":
        payload = part.get_payload()
        if isinstance(payload, list):
            for sub in payload:
                if isinstance(sub, Message):
                    yield from _leaves(sub, depth + 1)
        return
    yield part


def _is_attachment(part: Message) -> bool:
    try:
        disposition = (part.get_content_disposition() or "").lower()
        return disposition == "attachment" or bool(part.get_filename())
    except Exception:
        return True


def _body(msg: EmailMessage, *, strip_quotes: bool) -> _Body:
    """The message's text: its plain part, else its HTML part as text.

    With `strip_quotes`, the HTML part loses the quoted history and signature its client
    marked before it becomes text (`clean_html`).
    """
    candidates: list[tuple[str, Message]] = []
    for kind in ("plain", "html"):
        part: Message | None
        try:
            part = msg.get_body(preferencelist=(kind,))
        except Exception:
            part = None
        if part is not None:
            candidates.append((kind, part))
    if not candidates:
        leaves = []
        for count, leaf in enumerate(_leaves(msg)):
            if count >= _MAX_LEAVES:
                break
            leaves.append(leaf)
        for kind in ("plain", "html"):
            for leaf in leaves:
                if leaf.get_content_type() == f"text/{kind}" and not _is_attachment(leaf):
                    candidates.append((kind, leaf))
                    break
    if not candidates:
        return _Body("none")
    undecodable = False
    for kind, candidate in candidates:
        decoded = _decode_part(candidate)
        if decoded is None:
            undecodable = True
            continue
        partial = False
        if kind == "html":
            # inline images' data is no text, and made long mails lose their end
            html = _INLINE_DATA.sub("data:", decoded) if len(decoded) > _MAX_HTML_CHARS else decoded
            partial = len(html) > _MAX_HTML_CHARS
            html = html[:_MAX_HTML_CHARS]
            decoded = html_to_text(clean_html(html) if strip_quotes else html)
        else:
            pieces = [
                _plain_text(piece, decoded if piece is candidate else _decode_part(piece) or "")
                for piece in [candidate, *_continuations(msg, candidate)]
            ]
            decoded = "\n\n".join(piece.strip("\r\n") for piece in pieces if piece.strip())
        text = _normalize_text(decoded)
        if text.strip():
            return _Body("found", text, candidate, partial)
    if undecodable:
        return _Body("undecodable")
    return _Body("found", "", candidates[0][1])


def _plain_text(part: Message, decoded: str) -> str:
    """A plain part's decoded text, its flowed lines joined (RFC 3676)."""
    if _param(part, "format") == "flowed":
        return _unflow(decoded, delsp=_param(part, "delsp") == "yes")
    return decoded


def _continuations(msg: Message, body: Message) -> list[Message]:
    """The plain parts that continue `body` after a picture.

    They are its later inline siblings in a ``multipart/mixed``: Apple Mail writes text, image,
    text when a picture is put mid-text.
    """
    for count, part in enumerate(msg.walk()):
        if count >= _MAX_LEAVES:
            break
        if part.get_content_type() != "multipart/mixed":
            continue
        payload = part.get_payload()
        if not isinstance(payload, list) or not any(sub is body for sub in payload):
            continue
        after = payload[[id(sub) for sub in payload].index(id(body)) + 1 :]
        return [
            sub
            for sub in after
            if isinstance(sub, Message)
            and sub.get_content_type() == "text/plain"
            and not _is_attachment(sub)
        ]
    return []


def _param(part: Message, name: str) -> str:
    """A Content-Type parameter, lowercased ("" when absent or unreadable)."""
    try:
        value = part.get_param(name)
    except Exception:
        return ""
    if isinstance(value, tuple):
        value = value[2]
    return str(value or "").strip().lower()


def _decode_part(part: Message) -> str | None:
    """The part's text; None: no text at all (binary bytes labelled text).

    The declared charset first, then UTF-8, both strictly; then the bytes are guessed (old
    clients and scripts send 8-bit text undeclared or declared wrong, and such a mail was
    skipped unanswered, D335): Windows-1252 for Latin text (what HTML5 reads ISO-8859-1 and
    ASCII labels as), else the codec charset-normalizer finds (Cyrillic, CJK).
    """
    payload = part.get_payload(decode=True)
    if not isinstance(payload, bytes):
        return ""
    charset = part.get_content_charset()
    for name in (charset, "utf-8"):
        if name:
            try:
                codec = codecs.lookup(name).name
                if codec.startswith(("utf-16", "utf-32")) and not _wide(payload):
                    continue  # 8-bit text labelled UTF-16 read as CJK (an outside probe)
                return payload.decode(codec)
            except (LookupError, UnicodeError, ValueError, TypeError):
                pass
    return _guessed(payload)


def _wide(payload: bytes) -> bool:
    """Whether `payload` can be UTF-16 or UTF-32 text: a byte-order mark, or NUL bytes.

    NULs are the high bytes of such text's spaces, line ends and ASCII letters; 8-bit text has
    none.
    """
    return payload.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) or b"\x00" in payload


def _guessed(payload: bytes) -> str | None:
    """8-bit text of no known charset as text, or None when the bytes read as no text."""
    found = [
        match
        for match in charset_normalizer.from_bytes(payload)
        if not match.encoding.startswith(("utf_16", "utf_32"))  # no BOM: a guess too far
    ]
    if not found:
        return None  # chaos in every codec: binary, not text
    try:
        western = payload.decode("cp1252")
    except UnicodeError:
        western = None
    if western is not None:
        letters = [char for char in western if char.isalpha()]
        if sum(1 for char in letters if not char.isascii()) * 2 <= len(letters):
            return western  # mostly ASCII letters: a Latin script, whose accents cp1252 has
    return str(found[0])


def _normalize_text(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _clean(text.replace("\t", "    "))
    return text


def _unflow(text: str, *, delsp: bool) -> str:
    """Join the soft line breaks of ``format=flowed`` text (RFC 3676)."""
    lines: list[str] = []
    buffer: str | None = None
    buffer_depth = 0
    for line in text.replace("\r\n", "\n").split("\n"):
        depth = len(line) - len(line.lstrip(">"))
        content = line[depth:]
        if content.startswith(" "):
            content = content[1:]  # space-stuffing
        if buffer is not None and depth != buffer_depth:
            lines.append(_quoted(buffer, buffer_depth))
            buffer = None
        flowed = content.endswith(" ") and content.rstrip() != "--"
        if flowed:
            piece = content[:-1] if delsp else content
            buffer = piece if buffer is None else buffer + piece
            buffer_depth = depth
            continue
        lines.append(_quoted(content if buffer is None else buffer + content, depth))
        buffer = None
    if buffer is not None:
        lines.append(_quoted(buffer, buffer_depth))
    return "\n".join(lines)


def _quoted(text: str, depth: int) -> str:
    return (">" * depth + " " + text) if depth else text


# --- HTML to text ----------------------------------------------------------------------------


def _quote_start(state: HtmlDocumentState, _: dict[str, str]) -> None:
    state.tags[-1].set_canvas(Canvas())  # the quote is laid out alone, then prefixed


def _quote_end(state: HtmlDocumentState) -> None:
    text = state.tags[-1].canvas.get_text().strip("\n")
    if not text.strip():
        return
    outer = state.tags[-2]
    outer.write_verbatim_text("\n".join(f"> {line}".rstrip() for line in text.split("\n")))
    outer.canvas.flush_inline()
    if outer.display == Display.block:  # as inscriptis's table end does
        outer.canvas.current_block.prefix.remove_last_prefix()
    outer.canvas.close_block(state.tags[-1])  # the quote's margin, on the canvas it went to


def _list_start(state: HtmlDocumentState, _: dict[str, str]) -> None:
    if state.li_counter:
        state.tags[-1].margin_before = 0  # a nested list goes on in its item's paragraph
    state.li_counter.append(1 if state.tags[-1].tag == "ol" else "- ")


def _list_end(state: HtmlDocumentState) -> None:
    state.li_counter.pop()
    # after the items: inscriptis gives a list's bottom margin to each of its items
    state.tags[-1].margin_after = 0 if state.li_counter else 1


def _css() -> dict[str, HtmlElement]:
    css: dict[str, HtmlElement] = CSS_PROFILES["strict"].copy()
    css["body"] = HtmlElement(display=Display.block, whitespace=WhiteSpace.normal)
    for name in ("template", "noscript", "svg", "object", "iframe"):
        css[name] = HtmlElement(display=Display.none)
    for name in ("blockquote", "pre", "table"):  # a paragraph each, as in a browser
        css[name] = HtmlElement(display=Display.block, margin_before=1, margin_after=1)
    css["pre"].whitespace = WhiteSpace.pre
    css["ul"] = HtmlElement(display=Display.block, margin_before=1, padding_inline=2)
    css["ol"] = HtmlElement(display=Display.block, margin_before=1, padding_inline=3)
    return css


def _config(*, tables: bool) -> ParserConfig:
    css = _css()
    start: dict[str, Any] = {"blockquote": _quote_start, "ul": _list_start, "ol": _list_start}
    end: dict[str, Any] = {"blockquote": _quote_end, "ul": _list_end, "ol": _list_end}
    if not tables:  # a row a line, its cells side by side
        css["table"] = css["tr"] = HtmlElement(display=Display.block)
        for name in ("td", "th"):
            css[name] = HtmlElement(suffix=" ")
        for name in ("table", "tr", "td", "th"):
            start[name] = end[name] = _nothing
    return ParserConfig(
        css=css,
        custom_html_tag_handler_mapping=CustomHtmlTagHandlerMapping(
            start_tag_mapping=start, end_tag_mapping=end
        ),
    )


def _nothing(*_: Any) -> None:
    pass


_HTML_CONFIG = _config(tables=True)
"""inscriptis as a browser lays a mail out, with ``>`` quotes (they mark quoted history for
`reply_text`) and ``-`` bullets."""
_FLAT_CONFIG = _config(tables=False)
_MAX_TABLE_CELLS = 2_000
"""Beyond this many cells, tables are not laid out in columns (five times slower: about 4 s
for 500,000 characters of cells), each row is a line."""
_MAX_TABLE_AREA = 4_000_000
"""The most characters the columns of a body's tables may take (lines times width): a wide
cell beside a tall one pads every line (24 KB of HTML made 16 MB of text)."""
_LINE_TAGS = ("br", "tr", "p", "div", "li", "pre", "h1", "h2", "h3", "h4", "h5", "h6")


def _columns_fit(tree: Any) -> bool:
    """Whether the tables of `tree` are laid out in columns (see the two limits above)."""
    if sum(1 for _ in islice(tree.iter("td", "th"), _MAX_TABLE_CELLS + 1)) > _MAX_TABLE_CELLS:
        return False
    area = 0
    for table in tree.iter("table"):
        if next(table.iterancestors("table"), None) is not None:
            continue  # counted with the outermost table
        text = table.text_content()
        lines = sum(1 for _ in table.iter(*_LINE_TAGS)) + text.count("\n") + 1
        area += (len(text) + 2 * sum(1 for _ in table.iter("td", "th"))) * lines
        if area > _MAX_TABLE_AREA:
            return False
    return True


_BLANK_LINES = re.compile(r"\n{3,}")


def _link_url(href: str | None) -> str | None:
    if not href:
        return None
    url = "".join(href.split())
    if len(url) > 2000 or not url.lower().startswith(("http://", "https://", "mailto:")):
        return None
    return url


def html_to_text(html: str) -> str:
    """Plain text of an HTML body, laid out by inscriptis (tables as columns, lists, ``pre``).

    Links read ``text (url)`` (web and mail links only; a link showing its own address is
    shown once); block quotes become ``>`` lines. Elements nested deeper than the HTML parser
    goes (255 levels) are left out: a person's new text sits at the top, quoted history below.
    """
    try:
        tree = document_fromstring(html.strip() or "<p></p>")
    except (ParserError, ValueError):  # nothing but a comment, a doctype...
        return ""
    for anchor in tree.iter("a"):
        url = _link_url(anchor.get("href"))
        shown = anchor.text_content().strip()
        if url and url != shown and url.removeprefix("mailto:") != shown:
            suffix = f" ({url})" if shown else url
            if len(anchor):
                anchor[-1].tail = (anchor[-1].tail or "") + suffix
            else:
                anchor.text = (anchor.text or "") + suffix
    try:
        config = _HTML_CONFIG if _columns_fit(tree) else _FLAT_CONFIG
        text: str = Inscriptis(tree, config).get_text()
    except Exception:  # a layout the library cannot make: the words, without the layout
        text = tree.text_content()
    lines = "\n".join(line.rstrip() for line in text.split("\n"))
    return _BLANK_LINES.sub("\n\n", lines).strip()  # margins meeting: one blank line


def _forwarded(msg: Message) -> tuple[list[str], set[int]]:
    """The text of each mail attached whole, and which leaves those were.

    ``message/rfc822`` is Outlook's "Forward as attachment": its text comes under the lines a
    forward shows. Refused as a file before, the forwarded mail never reached the agent. Its own
    attachments are not read (a note says how many); one that holds no text stays a file.
    """
    texts: list[str] = []
    read: set[int] = set()
    for count, part in enumerate(_leaves(msg)):
        if count >= _MAX_LEAVES or len(texts) >= MAX_ATTACHMENTS:
            break
        if part.get_content_type() != "message/rfc822":
            continue
        payload = part.get_payload()
        inner = payload[0] if isinstance(payload, list) and payload else None
        if not isinstance(inner, EmailMessage):
            continue
        body = _body(inner, strip_quotes=False)
        if not body.text.strip():
            continue
        lines = ["---------- Forwarded message ----------"]
        for header in ("From", "Date", "Subject", "To"):
            value = _header(inner, header)
            if value:
                lines.append(f"{header}: {_clip(value, _MAX_HEADER_CHARS)}")
        files = sum(1 for leaf in _leaves(inner) if leaf is not body.part)
        lines += ["", body.text.strip()]
        if files:
            lines.append(f"[the forwarded mail's {files} attachment(s) were not read]")
        texts.append("\n".join(lines))
        read.add(count)
    return texts, read


_SIGNATURES = frozenset(
    {"application/pkcs7-signature", "application/x-pkcs7-signature", "application/pgp-signature"}
)
"""The parts of a ``multipart/signed`` mail that sign it (S/MIME, OpenPGP)."""


def _attachments(
    msg: Message,
    body: Message | None,
    read: Collection[int] = (),
) -> tuple[tuple[Attachment, ...], int]:
    """The attachments listed (at most `MAX_ATTACHMENTS`), and how many more there are.

    `read`: leaves already read as text (forwarded mails), not listed.
    """
    found: list[Attachment] = []
    more = 0
    for count, part in enumerate(_leaves(msg)):
        if count >= _MAX_LEAVES:
            break
        if part is body or count in read:
            continue
        try:
            media_type = part.get_content_type()
        except Exception:
            media_type = "application/octet-stream"
        inline_text = media_type in ("text/plain", "text/html") and not _is_attachment(part)
        if inline_text:
            continue  # an alternative or a continuation of the body, not a file
        if media_type in _SIGNATURES:
            # the mail's own signature, not a file the person sent: each signed mail got a
            # second reply, "I could not read the file smime.p7s"
            continue
        if len(found) >= MAX_ATTACHMENTS:
            more += 1
            continue
        found.append(
            Attachment(
                name=_attachment_name(part, media_type, len(found)),
                media_type=_clip(media_type, 200),
                size=_part_size(part),
                ref=f"part-{count}",
            )
        )
    return tuple(found), more


def attachment_content(raw: bytes, ref: str) -> bytes | None:
    """The decoded content of the attachment `ref` (``part-<n>``, as `parse` lists it) of `raw`.

    None when there is no such part (the message changed, or `ref` is not one of ours).
    """
    number = whole_number(ref.removeprefix("part-"), _MAX_LEAVES)
    if number is None:
        return None
    msg = BytesParser(policy=POLICY).parsebytes(raw)
    for count, part in enumerate(_leaves(msg)):
        if count >= _MAX_LEAVES:
            return None
        if count == number:
            try:
                payload = part.get_payload(decode=True)
            except Exception:
                return None
            if isinstance(payload, bytes):
                return payload
            if part.get_content_type() != "message/rfc822":
                return None
            try:
                # the generator refolds the forwarded mail's headers, and refuses some (an
                # address whose encoded word decodes to CR LF): that attachment is unreadable
                return part.as_bytes()
            except Exception:
                return None
    return None


def _attachment_name(part: Message, media_type: str, index: int) -> str:
    try:
        name = part.get_filename() or ""
    except Exception:
        name = ""
    name = _clean(str(name)).replace("\\", "/").rsplit("/", 1)[-1].strip()
    if not name:
        name = "message.eml" if media_type == "message/rfc822" else f"attachment-{index + 1}"
    return _clip(_SPACE.sub(" ", name), _MAX_NAME_CHARS)


def _part_size(part: Message) -> int:
    """The decoded size of a leaf part in bytes (computed from its encoded payload)."""
    try:
        payload = part.get_payload()
        if isinstance(payload, list):
            return sum(len(sub.as_bytes()) for sub in payload if isinstance(sub, Message))
        encoded = str(payload)
        if (part.get("Content-Transfer-Encoding") or "").strip().lower() == "base64":
            letters = len(re.sub(r"[^A-Za-z0-9+/]", "", encoded))
            return letters * 3 // 4
        decoded = part.get_payload(decode=True)
        return len(decoded) if isinstance(decoded, bytes) else len(encoded)
    except Exception:
        return 0
