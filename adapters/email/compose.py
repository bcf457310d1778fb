"""Outbound email: the reply into a thread, its deterministic Message-ID, and approval links.

Pure functions, no I/O. `compose_reply` turns an `Outbound` into an `EmailMessage` that every
client threads with the conversation it answers:

* ``In-Reply-To`` is the message answered; ``References`` is its ``References`` (or its
  ``In-Reply-To``) followed by its ``Message-ID`` (RFC 5322 §3.6.4), at most
  `MAX_REFERENCES` ids, keeping the first (the root: the lane) and the newest ones.
* ``Subject`` is ``Re: `` and the normalized subject: prefixes never stack (Gmail groups a
  reply only when the subject matches modulo ``Re:``/``Fwd:``).
* Outlook: ``Thread-Topic`` is copied and ``Thread-Index`` gets one 5-byte child block
  (MS-OXOMSG §2.2.1.3: delta code, the time since the conversation's header block, 4
  bits random and 4 bits sequence, both taken from the delivery id so a retry composes the
  same bytes) when the message answered had a valid one.
* ``To`` is the author of the message answered; ``Cc`` is everyone else it was addressed to
  (its ``To`` and ``Cc``) but the bot: reply-all, as a person answering in a thread does, so
  no participant drops out of the conversation. An approval request goes to the author only:
  its links are bearer credentials for whoever reads the mail. ``Reply-To`` is ignored on
  purpose: it would let a message divert the agent's answer (and its tool output) to a
  third party the thread never included.
* ``Message-ID`` is `reply_message_id` of the delivery id and the thread: a retried send
  carries the same id, so the adapter can find an earlier attempt in the Sent folder
  (`reconcile`), the loop guard recognizes the bot's own mail (`is_own_message_id`), and a
  reply that names only it finds its thread (`thread_of_own_id`, D345).
* Every header value taken from the message answered (display names, subject, topic) is
  decoded, then cleaned: no line break, no control character, and no encoded word left that a
  reader would decode into one, so a name can neither inject a header nor make the reply
  impossible to compose (a dead letter for everyone on the thread).
* ``Auto-Submitted: auto-replied`` (RFC 3834) and ``X-Auto-Response-Suppress: All``
  (Exchange): other automatons do not answer the bot.
* The body is ``text/plain`` (UTF-8, the Markdown as written) with an HTML alternative
  (`markdown_to_html`: the tree of `adapters.markdown.parse` as HTML, every text escaped).

An approval request lists each pending call (its tool and its arguments as pretty JSON, format
characters written as escapes, cut at `MAX_ARGS_CHARS`) and links to approve or deny the whole
batch; when an argument was cut, only the deny link (an approval authorizes what was seen).
Replying "approve" decides nothing: anyone can put any sender address on an email. The links
carry an `approval_token`: the batch (session, run, wait, each call's id and argument digest),
the approver's address, the decision and an expiry, signed by itsdangerous (HMAC-SHA256,
salted; the expiry is a claim judged against the caller's clock). The web handler that
receives a link must show a confirmation page and decide only on its POST: mail scanners
(Outlook Safe Links, gateways) open every link of a message they deliver.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import html
import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email import policy
from email.header import decode_header, make_header
from email.message import EmailMessage
from email.utils import format_datetime, formataddr, getaddresses
from typing import Any, Literal

from itsdangerous import BadData, BadPayload, BadSignature, URLSafeSerializer
from itsdangerous.encoding import base64_decode, base64_encode
from markdown_it.tree import SyntaxTreeNode

from adapters.channel import ApprovalView, Outbound
from adapters.email.message import message_ids, normalize_subject
from adapters.markdown import parse
from adapters.reply_files import ReplyFile
from adapters.visible import visible
from harness_core.frozen import thaw_json

__all__ = [
    "approval_token",
    "ApprovalClaims",
    "compose_reply",
    "Decision",
    "delivery_mark",
    "is_own_message_id",
    "markdown_to_html",
    "MAX_ARGS_CHARS",
    "MAX_CALLS_SHOWN",
    "MAX_CC",
    "MAX_REFERENCES",
    "MAX_TOKEN_CHARS",
    "MIN_KEY_BYTES",
    "reply_message_id",
    "thread_of_own_id",
    "verify_approval_token",
]

MAX_REFERENCES = 20
"""The most ids of a reply's ``References`` (the first and the newest are kept)."""
MAX_CC = 20
"""The most ``Cc`` recipients of a reply."""
MAX_ARGS_CHARS = 10_000
"""The most characters of one call's arguments shown in an approval request (past it, the
request offers no approve link)."""
MAX_CALLS_SHOWN = 50
"""The most calls an approval request lists; a larger batch gets no links (decide it with an
operator), so a link never decides a call its reader could not see."""
MAX_TOKEN_CHARS = 8192
"""The longest approval token accepted (and made)."""
MIN_KEY_BYTES = 32
"""The shortest HMAC key `approval_token` and `verify_approval_token` accept."""

Decision = Literal["approve", "deny"]

log = logging.getLogger("adapters.email")
_OWN_ID = re.compile(r"<?dg\.([a-z2-7]{32})(?:\.([a-z2-7]{1,200}))?@([^<>\s@]+)>?")
_MAX_ID_CHARS = 250
"""The longest Message-ID `message_ids` reads (a longer one is dropped as junk)."""
_DOMAIN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")
_FILETIME_EPOCH = 116_444_736_000_000_000  # 1970-01-01 in 100 ns units since 1601-01-01
_MAX_TEXT_CHARS = 200_000
_LINE_BREAKS = re.compile(r"[\r\n\x00-\x08\x0b\x0c\x0e-\x1f\x7f]+")
_ENCODED_WORD_START = re.compile(r"=\?[^?\s]*\?[bq]\?", re.IGNORECASE)


# --- Message-IDs -----------------------------------------------------------------------------


def _domain(domain: str) -> str:
    if not _DOMAIN.fullmatch(domain):
        raise ValueError("not a domain name")
    return domain.lower()


def reply_message_id(delivery_id: str, domain: str, thread: str | None = None) -> str:
    """The ``Message-ID`` of a delivery's email: ``<dg.<32 base32 of sha256>[.<thread>]@domain>``.

    Deterministic (the same delivery id, domain and thread give the same id, so a retried send
    can be looked up), and free of the delivery id's own characters (``:``, spaces...).
    `thread` (the lane's thread id) is carried in base32 where the id stays within 250
    characters: a reply that names only this id (``In-Reply-To`` without ``References``, as
    some clients write) is read back into its thread (`thread_of_own_id`, D345).

    Raises:
        ValueError: `domain` is not a domain name.
    """
    domain = _domain(domain)
    digest = hashlib.sha256(f"{domain}\n{delivery_id}".encode()).digest()
    token = base64.b32encode(digest).decode("ascii").lower()[:32]
    if thread:
        carried = base64.b32encode(thread.encode()).decode("ascii").lower().rstrip("=")
        made = f"<dg.{token}.{carried}@{domain}>"
        if len(made) <= _MAX_ID_CHARS and len(carried) <= 200:
            return made
    return f"<dg.{token}@{domain}>"


def is_own_message_id(message_id: str, domain: str) -> bool:
    """Whether `message_id` has the shape `reply_message_id` gives for `domain` (any case)."""
    match = _OWN_ID.fullmatch(message_id.strip())
    return match is not None and match.group(3).lower() == domain.strip().lower()


def delivery_mark(message_id: str) -> str:
    """`message_id` without the thread it carries: what `reply_message_id` gives without one."""
    match = _OWN_ID.fullmatch(message_id.strip())
    if match is None:
        return message_id
    return f"<dg.{match.group(1)}@{match.group(3)}>"


def thread_of_own_id(message_id: str, domains: Iterable[str]) -> str | None:
    """The thread a Message-ID of ours (for one of `domains`) carries; None for any other."""
    match = _OWN_ID.fullmatch(message_id.strip().lower())
    if match is None or match.group(2) is None:
        return None
    if match.group(3) not in {domain.strip().lower() for domain in domains}:
        return None
    carried = match.group(2).upper()
    try:
        thread = base64.b32decode(carried + "=" * (-len(carried) % 8)).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    return thread if thread.startswith("<") and thread.isprintable() else None


# --- replies ---------------------------------------------------------------------------------


def compose_reply(
    outbound: Outbound,
    *,
    from_address: str,
    from_name: str | None,
    domain: str,
    now: datetime,
    approval_links: Mapping[str, str] | None = None,
    files: Sequence[ReplyFile] = (),
    ascii_copies: bool = False,
) -> EmailMessage:
    """The email of `outbound`: a reply in its thread (see the module docstring).

    Args:
        outbound: What to send; its `reply_context` is the newest inbound message's (from
            `adapters.email.message.parse`).
        from_address: The bot's address.
        from_name: The bot's display name, if any.
        domain: The domain of the ``Message-ID`` (`reply_message_id`).
        now: The ``Date`` (a naive datetime is taken as UTC).
        approval_links: For an ``approval_request``: ``{"approve": url, "deny": url}`` (http or
            https); without them the request says to decide it with an operator.
        files: The content of `outbound.files` (`adapters.reply_files`), attached in order.
        ascii_copies: Copy only the people whose address is ASCII (for a submission server
            without SMTPUTF8: the others are left out, and the log says so).

    Returns:
        The message, with the SMTP policy (CRLF line ends; SMTPUTF8's when an address's local
        part is not ASCII).

    Raises:
        ValueError: no recipient (the reply context names no valid sender, or only the bot),
            an invalid `from_address` or `domain`, or malformed `approval_links`.
    """
    bot = _one_address(from_address)
    if bot is None:
        raise ValueError("from_address is not an email address")
    context = outbound.reply_context
    author = _pairs(context.get("from"))
    if not author or author[0][1] == bot:
        raise ValueError("no recipient: the reply context names no sender")
    to = author[0]
    cc: list[tuple[str, str]] = []
    if outbound.kind not in ("approval_request", "approval_closed"):  # those go to the asker
        seen = {bot, to[1]}
        left_out = 0
        for pair in _pairs(context.get("to")) + _pairs(context.get("cc")):
            if pair[1] not in seen:
                seen.add(pair[1])
                if len(cc) < MAX_CC:
                    cc.append(pair)
                else:
                    left_out += 1
        if left_out:  # a bound against a blast, said: those people will miss the answer
            log.warning(
                "email reply copies fewer people",
                extra={"copied": len(cc), "left_out": left_out, "bound": MAX_CC},
            )
        if ascii_copies:
            unaddressable = [pair for pair in cc if not pair[1].isascii()]
            if unaddressable:  # the sender's answer goes; these miss it, and the log says so
                cc = [pair for pair in cc if pair[1].isascii()]
                log.warning(
                    "email reply copies fewer people",
                    extra={
                        "copied": len(cc),
                        "left_out": len(unaddressable),
                        "reason": "no_smtputf8",
                    },
                )
    when = now if now.tzinfo is not None else now.replace(tzinfo=UTC)
    # an address with a non-ASCII local part (jürgen@) has no ASCII form: the message is
    # written as UTF-8 and sent with SMTPUTF8 (RFC 6531); a domain (bücher.example) has one
    wide = not all(address.isascii() for address in (bot, to[1], *(a for _, a in cc)))
    message = EmailMessage(policy=policy.SMTPUTF8 if wide else policy.SMTP)
    name = _header_text(from_name or "")
    message["From"] = formataddr((name, bot)) if name else bot
    message["To"] = _formatted(to)
    if cc:
        message["Cc"] = ", ".join(_formatted(pair) for pair in cc)
    subject = normalize_subject(_header_text(_text(context.get("subject"))))
    message["Subject"] = f"Re: {subject}" if subject else "Re:"
    message["Date"] = format_datetime(when.astimezone(UTC), usegmt=True)
    message["Message-ID"] = reply_message_id(outbound.delivery_id, domain, outbound.thread.thread)
    parent = message_ids(_text(context.get("message_id")))[:1]
    if parent:
        message["In-Reply-To"] = parent[0]
    references = _references(context.get("references"), parent)
    if references:
        message["References"] = " ".join(references)
    topic = _header_text(_text(context.get("thread_topic")))
    index = _child_thread_index(_text(context.get("thread_index")), when, outbound.delivery_id)
    if topic or (index and subject):
        message["Thread-Topic"] = topic or subject
    if index:
        message["Thread-Index"] = index
    message["Auto-Submitted"] = "auto-replied"
    message["X-Auto-Response-Suppress"] = "All"
    plain, body_html = _render(outbound, approval_links)
    page = _document(body_html)
    # quoted-printable, not 8bit: the message never depends on the server's 8BITMIME
    message.set_content(plain, subtype="plain", charset="utf-8", cte=_cte(plain))
    message.add_alternative(page, subtype="html", charset="utf-8", cte=_cte(page))
    for file in files:
        maintype, _, subtype = file.attachment.media_type.partition("/")
        if not (maintype and subtype) or maintype == "multipart":
            maintype, subtype = "application", "octet-stream"
        # add_attachment makes the message multipart/mixed: the text, then the files
        message.add_attachment(
            file.content, maintype=maintype, subtype=subtype, filename=file.attachment.name
        )
    return message


def _formatted(pair: tuple[str, str]) -> str:
    """``Name <address>``, for a header.

    An address that is not ASCII (``jürgen@``) is written as it is: `formataddr` refuses it,
    and the message's SMTPUTF8 policy carries it.
    """
    if pair[1].isascii() or not pair[0]:
        return formataddr(pair) if pair[1].isascii() else pair[1]
    shown = formataddr((pair[0], "x@x"))  # the name quoted or encoded as formataddr does
    return shown.removesuffix("<x@x>") + f"<{pair[1]}>"


def _cte(text: str) -> str:
    """``7bit`` for short ASCII lines, else ``quoted-printable`` (never 8bit or long lines)."""
    short = all(len(line) <= 998 for line in text.split("\n"))
    return "7bit" if text.isascii() and short else "quoted-printable"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _line(text: str) -> str:
    """One header-safe line: no line breaks or control characters, single spaces."""
    return " ".join(_LINE_BREAKS.sub(" ", text).split())[:998]


def _header_text(text: str) -> str:
    """`text` for a header: decoded, then cleaned, so no reader decodes it into anything else.

    The message's policy decodes the encoded words (RFC 2047) of a value it is given, and a
    word that decodes to a line break would become a line of its own (an injected header) or
    make the address header refuse the value (the reply a dead letter). So encoded words are
    decoded here first and the result cleaned (`_line`), again until nothing changes (a word
    can decode to another word); an encoded-word opening still left is broken ("= ?"): what
    a reader decodes is exactly what was cleaned. (D143)
    """
    for _ in range(5):
        cleaned = _line(_decoded_words(text))
        if cleaned == text:
            break
        text = cleaned
    else:
        text = _line(text)
    return _ENCODED_WORD_START.sub(lambda match: "= " + match.group(0)[1:], text)


def _decoded_words(text: str) -> str:
    if "=?" not in text:
        return text
    try:
        return str(make_header(decode_header(text)))
    except Exception:  # an unknown charset, a broken word: left as written (and broken above)
        return text


def _one_address(value: str) -> str | None:
    pairs = _pairs(value)
    return pairs[0][1] if pairs else None


def _pairs(value: Any) -> list[tuple[str, str]]:
    """Valid ``(name, address)`` pairs of a header-like string or a list of them."""
    items = (
        [value]
        if isinstance(value, str)
        else list(value)
        if isinstance(value, (list, tuple))
        else []
    )
    texts = [_line(item) for item in items if isinstance(item, str)]
    found: list[tuple[str, str]] = []
    try:
        pairs = getaddresses(texts)
    except Exception:
        return []
    for name, address in pairs:
        address = address.strip().lower()
        local, at, host = address.rpartition("@")
        host = _ascii_domain(host)
        if at and local and _DOMAIN.fullmatch(host) and not re.search(r"[\s<>,;]", local):
            found.append((_header_text(name)[:200], f"{local}@{host}"))
    return found


def _ascii_domain(host: str) -> str:
    """`host` as the DNS names it: an internationalized domain in its ``xn--`` form (IDNA).

    ``alice@bücher.example`` is a real address; a reply names it ``alice@xn--bcher-kva.example``,
    which every mail server takes, where the Unicode form needs SMTPUTF8 end to end.
    """
    if host.isascii():
        return host
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError:
        return host  # not a domain IDNA can write: refused as before


def _references(value: Any, parent: list[str]) -> list[str]:
    items = (
        [value]
        if isinstance(value, str)
        else list(value)
        if isinstance(value, (list, tuple))
        else []
    )
    chain: list[str] = []
    for item in items:
        if isinstance(item, str):
            for found in message_ids(item):
                if found not in chain:
                    chain.append(found)
    for found in parent:
        if found in chain:
            chain.remove(found)
        chain.append(found)
    if len(chain) > MAX_REFERENCES:
        chain = chain[:1] + chain[-(MAX_REFERENCES - 1) :]
    return chain


def _child_thread_index(parent: str, now: datetime, delivery_id: str) -> str | None:
    """The parent's Outlook conversation index with one child block appended, or None."""
    if not parent or len(parent) > 2000:
        return None
    try:
        raw = base64.b64decode(parent, validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(raw) < 22 or (len(raw) - 22) % 5 or raw[0] != 1:
        return None
    header_time = int.from_bytes(raw[1:6], "big") << 24
    now_time = int(now.timestamp() * 10_000_000) + _FILETIME_EPOCH
    delta = max(0, now_time - header_time)
    if delta < 1 << 49:
        code, bits = 0, (delta >> 18) & 0x7FFFFFFF
    else:
        code, bits = 1, (delta >> 23) & 0x7FFFFFFF
    seed = hashlib.sha256(delivery_id.encode()).digest()[0]
    block = (code << 39) | (bits << 8) | seed
    return base64.b64encode(raw + block.to_bytes(5, "big")).decode("ascii")


def _render(outbound: Outbound, links: Mapping[str, str] | None) -> tuple[str, str]:
    """The plain text and the HTML fragment of `outbound`'s body."""
    text = outbound.text.replace("\r\n", "\n").strip()
    if len(text) > _MAX_TEXT_CHARS:
        text = text[:_MAX_TEXT_CHARS] + "…"
    if outbound.kind == "failure_notice":
        text = text[:2000] or "Something went wrong: I could not finish this request."
        return text + "\n", markdown_to_html(text)
    if outbound.kind != "approval_request":
        return text + "\n", markdown_to_html(text)
    return _approval(text, outbound.approval, links)


def _approval(
    intro: str, view: ApprovalView | None, links: Mapping[str, str] | None
) -> tuple[str, str]:
    approve, deny = _links(links)
    plain = [intro] if intro else []
    rich = [markdown_to_html(intro)] if intro else []
    calls = view.calls if view is not None else ()
    shown = calls[:MAX_CALLS_SHOWN]
    if calls:
        count = f"{len(calls)} call{'' if len(calls) == 1 else 's'}"
        plain.append(f"Waiting for a decision: {count}.")
        rich.append(f"<p>Waiting for a decision: {count}.</p>")
    cut = False
    for number, call in enumerate(shown, start=1):
        args, was_cut = _pretty_args(call.args)
        cut = cut or was_cut
        name = visible(_line(call.tool_name)[:200])
        call_id = _line(call.tool_call_id)[:200]
        plain.append(f"{number}. {name} (call {call_id})\n" + _indent(args))
        rich.append(
            f"<p>{number}. <strong>{html.escape(name)}</strong> "
            f"(call <code>{html.escape(call_id)}</code>)</p>"
            f"<pre><code>{html.escape(args)}</code></pre>"
        )
    hidden = len(calls) - len(shown)
    if hidden:
        more = f"…and {hidden} more call{'' if hidden == 1 else 's'}."
        plain.append(more)
        rich.append(f"<p>{html.escape(more)}</p>")
    where = f" (run {_line(view.run_id)[:200]}, wait {_line(view.wait_id)[:200]})" if view else ""
    if approve and deny and calls and not hidden and cut:
        # an approval authorizes the arguments a person saw (D52): what was cut was not seen
        note = (
            "Some arguments are too long to show here in full, so this request cannot be "
            "approved from email: an operator can read them whole and decide with "
            f"`gateway ops approve`{where}. You can still deny it:"
        )
        plain.append(f"{note}\n{deny}")
        rich.append(
            f"<p>{html.escape(note)}</p>"
            f'<p><a href="{html.escape(deny)}"><strong>Deny all</strong></a></p>'
        )
    elif approve and deny and calls and not hidden:
        plain.append(f"Approve all of them:\n{approve}\n\nDeny all of them:\n{deny}")
        plain.append(
            "Each link is signed, bound to this request and to your address, and decides "
            "once. Do not forward this email."
        )
        rich.append(
            f'<p><a href="{html.escape(approve)}"><strong>Approve all</strong></a>'
            f' &nbsp; <a href="{html.escape(deny)}"><strong>Deny all</strong></a></p>'
            "<p>Each link is signed, bound to this request and to your address, and decides "
            "once. Do not forward this email.</p>"
        )
    elif calls:
        note = f"This request cannot be decided from email: ask an operator to decide it{where}."
        plain.append(note)
        rich.append(f"<p>{html.escape(note)}</p>")
    warning = (
        'Replying "approve" (or anything else) to this email does not approve: anyone can put '
        "any sender address on an email, so a reply proves nothing about who wrote it. Only "
        "the links decide."
    )
    plain.append(warning)
    rich.append(f"<p>{html.escape(warning)}</p>")
    return "\n\n".join(plain) + "\n", "\n".join(rich)


def _links(links: Mapping[str, str] | None) -> tuple[str | None, str | None]:
    if links is None:
        return None, None
    urls: list[str] = []
    for key in ("approve", "deny"):
        url = links.get(key)
        if (
            not isinstance(url, str)
            or len(url) > MAX_TOKEN_CHARS + 1000
            or not url.lower().startswith(("https://", "http://"))
            or re.search(r"[\s\x00-\x1f\x7f<>\"]", url)
        ):
            raise ValueError(f"approval_links[{key!r}] is not an http(s) URL")
        urls.append(url)
    return urls[0], urls[1]


def _pretty_args(args: Any) -> tuple[str, bool]:
    """The arguments as pretty JSON, format characters shown (`adapters.visible`); cut or not."""
    try:
        text = json.dumps(thaw_json(args), indent=2, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(args)
    text = visible(text)
    if len(text) > MAX_ARGS_CHARS:
        more = len(text) - MAX_ARGS_CHARS
        return text[:MAX_ARGS_CHARS] + f"\n…(truncated, {more} more characters)", True
    return text, False


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.split("\n"))


def _document(fragment: str) -> str:
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"></head>\n'
        f"<body>\n{fragment}\n</body></html>\n"
    )


# --- Markdown to HTML ------------------------------------------------------------------------

_TAGS = {"strong": "strong", "em": "em", "s": "s"}


def markdown_to_html(text: str) -> str:
    """An HTML fragment of the model's Markdown (`adapters.markdown.parse`); all text escaped.

    Paragraphs (a line break inside one is a ``<br>``), headings (bold paragraphs), bullet
    and numbered lists, quotes, code blocks and spans, tables, rules, ``**bold**``,
    ``*italic*``, ``~~struck~~``, ``[text](url)``, bare ``https://`` links and images (as
    links: a reply loads nothing). Raw HTML is text; links go only to http, https and mailto
    (any other stays text as written).
    """
    return "\n".join(_html_blocks(parse(text).children))


def _escape(text: str, *, quote: bool = True) -> str:
    return html.escape(text, quote=quote).replace("\x00", "\ufffd")


def _html_blocks(nodes: list[SyntaxTreeNode], *, bare: bool = False) -> list[str]:
    """Block nodes as HTML; `bare`: a paragraph without ``<p>`` (a quote's only one)."""
    out: list[str] = []
    for node in nodes:
        kind = node.type
        if kind == "paragraph":
            body = _html_inline(node.children[0].children)
            out.append(body if bare or node.hidden else f"<p>{body}</p>")  # hidden: tight item
        elif kind == "heading":
            out.append(f"<p><strong>{_html_inline(node.children[0].children)}</strong></p>")
        elif kind in ("bullet_list", "ordered_list"):
            start = node.attrs.get("start")
            tag = "ul" if kind == "bullet_list" else "ol"
            opening = f'<ol start="{int(start)}">' if isinstance(start, int) else f"<{tag}>"
            items = "".join(
                f"<li>{''.join(_html_blocks(item.children))}</li>" for item in node.children
            )
            out.append(f"{opening}{items}</{tag}>")
        elif kind == "blockquote":
            only = len(node.children) == 1 and node.children[0].type == "paragraph"
            out.append(
                f"<blockquote>{chr(10).join(_html_blocks(node.children, bare=only))}</blockquote>"
            )
        elif kind in ("fence", "code_block"):
            code = _escape(node.content.removesuffix("\n"), quote=False)
            out.append(f"<pre><code>{code}</code></pre>")
        elif kind == "hr":
            out.append("<hr>")
        elif kind == "table":
            out.append(_html_table(node))
    return out


def _html_table(node: SyntaxTreeNode) -> str:
    rows: list[str] = []
    for part in node.children:  # thead, tbody
        for row in part.children:
            cells = []
            for cell in row.children:
                align = cell.attrs.get("style")
                style = f' style="{_escape(str(align))}"' if align else ""
                body = _html_inline(cell.children[0].children) if cell.children else ""
                cells.append(f"<{cell.type}{style}>{body}</{cell.type}>")
            rows.append(f"<tr>{''.join(cells)}</tr>")
    return f'<table border="1" cellpadding="4" cellspacing="0">{"".join(rows)}</table>'


def _html_inline(nodes: list[SyntaxTreeNode]) -> str:
    out: list[str] = []
    for node in nodes:
        kind = node.type
        if kind in ("text", "slack_token"):
            out.append(_escape(node.content))
        elif kind in ("softbreak", "hardbreak"):
            out.append("<br>\n")
        elif kind == "code_inline":
            out.append(f"<code>{_escape(node.content)}</code>")
        elif kind in _TAGS:
            out.append(f"<{_TAGS[kind]}>{_html_inline(node.children)}</{_TAGS[kind]}>")
        elif kind in ("link", "image"):  # only http(s) and mailto parse as links (D175)
            href = _escape(str(node.attrs.get("href") or node.attrs.get("src") or ""))
            out.append(f'<a href="{href}">{_html_inline(node.children) or href}</a>')
        else:
            out.append(_html_inline(node.children))
    return "".join(out)


# --- approval tokens -------------------------------------------------------------------------

_SALT = b"durable-gateway email approval link"
_TOKEN = re.compile(r"\.?[A-Za-z0-9_-]{1,8100}\.[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]")
"""A link token's shape: base64url claims (``.`` first when zlib-compressed), ``.``, and the
canonical base64url of a SHA-256 MAC (its last character carries no spare bits)."""
_LEGACY_CONTEXT = b"durable-gateway email approval token v1\n"
_MAX_ID = 512
_MAX_CALLS = 100
_CLAIM_KEYS = {2: frozenset("vsrwcade"), 1: frozenset("vsrwcadet")}


@dataclass(frozen=True, slots=True)
class ApprovalClaims:
    """What a valid approval token says: who decides what, for which batch, until when."""

    session: str
    run_id: str
    wait_id: str
    calls: tuple[tuple[str, str], ...]
    """``(tool_call_id, args_digest)`` of every call of the batch, sorted."""
    approver: str
    """The address the link was sent to (lowercased)."""
    decision: Decision
    expires_at: int
    """Unix seconds; the token is refused from then on."""
    token_id: str
    """Stable for the batch and the approver (the same for the approve and the deny link and
    for a re-sent link): the caller's idempotency key, so one approver decides a batch once."""


class _StrictJson:
    """JSON for the claims: compact ASCII out; in, one value per key and no NaN or Infinity."""

    def dumps(self, value: Any) -> str:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=True)

    def loads(self, text: str | bytes) -> Any:
        def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
            found = dict(pairs)
            if len(found) != len(pairs):
                raise ValueError("a key given twice")
            return found

        def no_constant(name: str) -> Any:
            raise ValueError(name)

        return json.loads(text, object_pairs_hook=unique, parse_constant=no_constant)


_JSON = _StrictJson()


def _serializer(key: bytes) -> URLSafeSerializer:
    return URLSafeSerializer(
        key, salt=_SALT, serializer=_JSON, signer_kwargs={"digest_method": hashlib.sha256}
    )


def approval_token(
    *,
    key: bytes,
    session: str,
    run_id: str,
    wait_id: str,
    calls: Iterable[tuple[str, str]],
    approver: str,
    decision: Decision,
    expires_at: datetime,
) -> str:
    """A signed, URL-safe token for an approve or deny link (see `verify_approval_token`).

    Args:
        key: The HMAC key (at least 32 bytes; keep it secret).
        session: The session of the batch.
        run_id: The run waiting for the decision.
        wait_id: The wait (the batch) the decision is for.
        calls: ``(tool_call_id, args_digest)`` of every pending call of the batch.
        approver: The address the link is sent to.
        decision: ``approve`` or ``deny``.
        expires_at: When the link stops working (a naive datetime is taken as UTC).

    Returns:
        itsdangerous's ``URLSafeSerializer`` token of the claims (HMAC-SHA256, salted), at most
        `MAX_TOKEN_CHARS` characters.

    Raises:
        ValueError: a short key, an empty or oversized field, no calls, or a token too long.
    """
    _check_key(key)
    when = expires_at if expires_at.tzinfo is not None else expires_at.replace(tzinfo=UTC)
    claims = _claims(
        session=session,
        run_id=run_id,
        wait_id=wait_id,
        calls=tuple(calls),
        approver=approver,
        decision=decision,
        expires_at=int(when.timestamp()),
        token_id=None,
    )
    token = _serializer(key).dumps(
        {
            "v": 2,
            "s": claims.session,
            "r": claims.run_id,
            "w": claims.wait_id,
            "c": [list(pair) for pair in claims.calls],
            "a": claims.approver,
            "d": claims.decision,
            "e": claims.expires_at,
        }
    )
    if len(token) > MAX_TOKEN_CHARS:
        raise ValueError("approval token too long (too many or too long calls)")
    return token


def verify_approval_token(token: str, *, key: bytes, now: datetime) -> ApprovalClaims:
    """The claims of a token `approval_token` made with `key`, if it is intact and current.

    The token is hostile input: its size and alphabet are checked first, then its signature
    (constant-time), and only then is its content decoded, strictly (exact keys and types).
    The expiry is a signed claim compared with `now` (the caller's clock). A token of the
    format before itsdangerous (decision D179) is still taken until its own expiry. Single use
    is the caller's: use `ApprovalClaims.token_id` as the decision's idempotency key.

    Raises:
        ValueError: ``malformed``, ``bad signature`` or ``expired`` (or a short key).
    """
    _check_key(key)
    if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS or not _TOKEN.fullmatch(token):
        raise ValueError("malformed")
    try:
        claims = _decode_claims(_serializer(key).loads(token), version=2)
    except BadPayload:
        raise ValueError("malformed") from None
    except BadSignature:
        claims = _decode_claims(_legacy_claims(token, key), version=1)
    when = now if now.tzinfo is not None else now.replace(tzinfo=UTC)
    if when.timestamp() >= claims.expires_at:
        raise ValueError("expired")
    return claims


def _legacy_claims(token: str, key: bytes) -> Any:
    """The claims of a link sent before D179 (raw HMAC over base64url JSON), if signed by `key`."""
    payload, _, signature = token.partition(".")
    mac = hmac.new(key, _LEGACY_CONTEXT + payload.encode("ascii"), hashlib.sha256).digest()
    if not hmac.compare_digest(base64_encode(mac), signature.encode("ascii")):
        raise ValueError("bad signature")
    try:
        return _JSON.loads(base64_decode(payload).decode("ascii"))
    except (BadData, UnicodeDecodeError, ValueError, RecursionError):
        raise ValueError("malformed") from None


def _check_key(key: bytes) -> None:
    if not isinstance(key, bytes) or len(key) < MIN_KEY_BYTES:
        raise ValueError(f"the approval key must be at least {MIN_KEY_BYTES} bytes")


def _token_id(
    session: str, run_id: str, wait_id: str, calls: tuple[tuple[str, str], ...], approver: str
) -> str:
    canonical = json.dumps(
        [session, run_id, wait_id, [list(pair) for pair in calls], approver],
        separators=(",", ":"),
        ensure_ascii=True,
    )
    digest = hashlib.sha256(canonical.encode("ascii")).digest()
    return "at_" + base64.b32encode(digest).decode("ascii").lower()[:32]


def _claims(
    *,
    session: Any,
    run_id: Any,
    wait_id: Any,
    calls: Any,
    approver: Any,
    decision: Any,
    expires_at: Any,
    token_id: Any,
) -> ApprovalClaims:
    for value in (session, run_id, wait_id):
        if not isinstance(value, str) or not 0 < len(value) <= _MAX_ID:
            raise ValueError("malformed")
    if not isinstance(calls, (tuple, list)) or not 0 < len(calls) <= _MAX_CALLS:
        raise ValueError("malformed")
    pairs: list[tuple[str, str]] = []
    for pair in calls:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError("malformed")
        call_id, digest = pair
        for value in (call_id, digest):
            if not isinstance(value, str) or not 0 < len(value) <= _MAX_ID:
                raise ValueError("malformed")
        pairs.append((call_id, digest))
    ordered = tuple(sorted(set(pairs)))
    if len(ordered) != len(pairs):
        raise ValueError("malformed")
    if not isinstance(approver, str) or not 0 < len(approver) <= 320 or "@" not in approver:
        raise ValueError("malformed")
    approver = approver.strip().lower()
    if decision not in ("approve", "deny"):
        raise ValueError("malformed")
    if isinstance(expires_at, bool) or not isinstance(expires_at, int) or expires_at < 0:
        raise ValueError("malformed")
    expected = _token_id(session, run_id, wait_id, ordered, approver)
    if token_id is not None and token_id != expected:
        raise ValueError("malformed")
    return ApprovalClaims(
        session=session,
        run_id=run_id,
        wait_id=wait_id,
        calls=ordered,
        approver=approver,
        decision=decision,
        expires_at=expires_at,
        token_id=expected,
    )


def _decode_claims(claims: Any, *, version: int) -> ApprovalClaims:
    """Claims decoded from a token of `version` (2: itsdangerous; 1: before D179), checked."""
    if not isinstance(claims, dict) or set(claims) != _CLAIM_KEYS[version]:
        raise ValueError("malformed")
    if type(claims["v"]) is not int or claims["v"] != version:
        raise ValueError("malformed")
    if version == 1 and not isinstance(claims["t"], str):
        raise ValueError("malformed")
    return _claims(
        session=claims["s"],
        run_id=claims["r"],
        wait_id=claims["w"],
        calls=claims["c"],
        approver=claims["a"],
        decision=claims["d"],
        expires_at=claims["e"],
        token_id=claims.get("t"),
    )
