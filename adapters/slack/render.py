"""What the Slack channel posts: Markdown as mrkdwn, cut at Slack's limits, and approval blocks.

Pure functions, no I/O. The model writes CommonMark-ish Markdown; Slack reads mrkdwn, its own
dialect (``*bold*``, ``_italic_``, ``~strike~``, ``<url|text>``, no headings, no tables) in
which ``&``, ``<`` and ``>`` are control characters that must be written ``&amp;``, ``&lt;``,
``&gt;`` when they are meant literally. `to_mrkdwn` converts, `split_text` cuts the result
into parts a section block (or a message) takes, `fallback_text` gives the notification line.

An approval request is a Block Kit message (`approval_blocks`): the intro, one section per
pending call with its arguments, and Approve / Deny buttons whose value
(`encode_decision_value`) names the wait and every call of the batch with the digest of the
arguments shown, so a click decides exactly what the person saw. The value comes back from
the network: `decode_decision_value` treats it as hostile. Once decided, `decided_blocks`
replaces the message; `deny_reason_modal` asks for a reason; `failure_blocks` is the short
notice of a run that failed.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, Literal, TypeAlias

from markdown_it.tree import SyntaxTreeNode
from pydantic import Field, ValidationError, field_validator

from adapters.channel import ApprovalView, DecisionItem, PendingCall
from adapters.markdown import normalize, parse
from adapters.visible import visible
from harness_core.frozen import Frozen, invalid_reason

__all__ = [
    "APPROVAL_BLOCK_ID",
    "APPROVE_ACTION_ID",
    "BUTTON_VALUE_LIMIT",
    "Block",
    "DENY_ACTION_ID",
    "DENY_REASON_CALLBACK_ID",
    "DecisionTarget",
    "FAILED_BLOCK_ID",
    "MAX_BLOCKS",
    "MIN_SPLIT_LIMIT",
    "PRIVATE_METADATA_LIMIT",
    "REASON_ACTION_ID",
    "REASON_BLOCK_ID",
    "REASON_LIMIT",
    "RESULT_BLOCK_ID",
    "SECTION_TEXT_LIMIT",
    "SUPPLY_ACTION_ID",
    "SUPPLY_RESULT_CALLBACK_ID",
    "SUPPLY_RESULT_LIMIT",
    "approval_blocks",
    "close_note",
    "closed_blocks",
    "decided_blocks",
    "decode_decision_value",
    "deny_reason_modal",
    "encode_decision_value",
    "failure_blocks",
    "fallback_text",
    "mention",
    "split_text",
    "supply_result_modal",
    "to_mrkdwn",
]

Block: TypeAlias = dict[str, Any]
"""A Block Kit block (or a view), as the Web API takes it."""

SECTION_TEXT_LIMIT = 3000
"""Characters of a section's (or a context element's) text object."""
MAX_BLOCKS = 50
"""Blocks of one message."""
BUTTON_VALUE_LIMIT = 2000
"""Characters of a button's ``value``."""
PRIVATE_METADATA_LIMIT = 3000
"""Characters of a view's ``private_metadata``."""
REASON_LIMIT = 500
"""Characters of a deny reason, in the modal and on the decided message."""
MIN_SPLIT_LIMIT = 16
"""The smallest `split_text` limit: room for a reopened and a closed code fence and text."""

APPROVAL_BLOCK_ID = "approval"
APPROVE_ACTION_ID = "approve"
DENY_ACTION_ID = "deny"
DENY_REASON_CALLBACK_ID = "deny_reason"
REASON_BLOCK_ID = "reason"
REASON_ACTION_ID = "reason"
SUPPLY_ACTION_ID = "supply"
SUPPLY_RESULT_CALLBACK_ID = "supply_result"
RESULT_BLOCK_ID = "result"
"""The supply dialog's result input (its block and action id)."""
FAILED_BLOCK_ID = "failed"
"""The supply dialog's "the action failed" checkbox (its block and action id)."""
SUPPLY_RESULT_LIMIT = 3000
"""Characters of a result given in Slack's dialog (Slack's own bound on a text input)."""

_FENCE = "```"
_OPEN_FENCE = _FENCE + "\n"
_CLOSE_FENCE = "\n" + _FENCE
_ELLIPSIS = "…"
_RULE_LINE = "———"
_TOOL_NAME_LIMIT = 200
_ID_LIMIT = 512
_VALUE_VERSION = 1
_VALUE_KEYS = frozenset({"v", "s", "r", "w", "c"})


def _escape(text: str) -> str:
    """`text` with Slack's three control characters written as entities."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# --- Markdown to mrkdwn ---------------------------------------------------------------------

_MARKER = {"strong": "*", "em": "_", "s": "~"}
# a line's container markers: quotes, bullets, ordered markers and the indentation between
_CONTAINER = re.compile(r"(?:[ \t]*(?:>|[-*+](?=[ \t]|$)|[0-9]{1,9}[.)](?=[ \t]|$)))*[ \t]*")
_QUOTE_PREFIX = re.compile(r"(?:[ \t]{0,3}>[ \t]?)+")
_BULLET_MARKER = re.compile(r"[-*+](?:[ \t]+|$)")
_TASK = re.compile(r"\[([ xX])\][ \t]+")


def to_mrkdwn(markdown: str) -> str:
    r"""Convert the model's Markdown to Slack mrkdwn; never raises.

    The text is parsed once (`adapters.markdown.parse`: CommonMark, GFM tables and strikes)
    and each source line is written back from the tree: bold, italic, strikethrough, links,
    images (as links), headings (as bold lines), bullets (as ``•``, ``[ ]``/``[x]`` as
    ``☐``/``☑``), rules and tables (as aligned code blocks) are converted; block quotes,
    ordered lists, indentation, blank lines and trailing spaces stay as written; fenced code
    loses its language tag (Slack has none). ``&``, ``<``, ``>`` are escaped everywhere except
    in Slack's own syntax already present (``<@U123>``, ``<#C123>``, ``<!here>``,
    ``<url|text>``), the delimiters of the links this writes and the quote markers that open a
    line; inside code nothing else changes. Links go only to http, https and mailto; any
    other stays text as written. Line endings become ``\n``. Markers that do not pair stay as
    written. Text without Markdown or those three characters comes back unchanged.

    Args:
        markdown: The text as the model wrote it.

    Returns:
        The same text in mrkdwn, of any length (`split_text` cuts it to Slack's limits).
    """
    return _Mrkdwn(normalize(markdown)).render()


def _shown_prefix(raw: str) -> str:
    """A line's container markers as mrkdwn: quote markers that open it kept, bullets as •."""
    quote = _QUOTE_PREFIX.match(raw)
    head = quote.group() if quote else ""
    return head + _BULLET_MARKER.sub("• ", raw[len(head) :]).replace(">", "&gt;")


class _Mrkdwn:
    """One `to_mrkdwn` call: the source's lines and what each block turns them into."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = text.split("\n")
        # out[i]: the lines source line i becomes; None: no block's line (blank, kept)
        self.out: list[list[str] | None] = [None] * len(self.lines)

    def render(self) -> str:
        self.blocks(parse(self.text), quoted=False)
        result: list[str] = []
        for line, done in zip(self.lines, self.out, strict=True):
            if done is not None:
                result += done
            elif not line.strip():
                result.append(line)
            else:  # an empty list item, a reference definition: as written
                prefix = _CONTAINER.match(line)
                cut = prefix.end() if prefix else 0
                result.append(_shown_prefix(line[:cut]) + _escape(line[cut:]))
        return "\n".join(result)

    def blocks(self, node: SyntaxTreeNode, *, quoted: bool) -> None:
        for child in node.children:
            if child.map is None:
                continue
            start, end = child.map
            kind = child.type
            if kind == "paragraph":
                self.paragraph(child, start, end)
            elif kind == "heading":
                title = " ".join(_Inline(strong=True).segments(child.children[0]))
                prefix = _CONTAINER.match(self.lines[start])
                shown = _shown_prefix(prefix.group() if prefix else "")
                self.put(start, end, [shown + (f"*{title.strip()}*" if title.strip() else "")])
            elif kind == "hr":
                quote = _QUOTE_PREFIX.match(self.lines[start])
                self.put(start, end, [(quote.group() if quote else "") + _RULE_LINE])
            elif kind == "fence":
                body = child.content.split("\n")
                if not body[-1]:  # the newline of the last line (absent when left unclosed)
                    body.pop()
                if not any(line.strip() for line in body):
                    self.put(start, end, [])
                    continue
                fenced = [_FENCE, *(_escape(line) for line in body), _FENCE]
                self.put(start, end, [f"> {line}" for line in fenced] if quoted else fenced)
            elif kind == "code_block":
                self.indented(child.content.split("\n"), start, end)
            elif kind == "table":
                self.put(start, end, _table(child))
            else:  # lists, items, quotes
                self.blocks(child, quoted=quoted or kind == "blockquote")

    def put(self, start: int, end: int, lines: list[str]) -> None:
        self.out[start] = lines
        for index in range(start + 1, end):
            self.out[index] = []

    def paragraph(self, node: SyntaxTreeNode, start: int, end: int) -> None:
        """Each line of a paragraph converted, its markers and outer whitespace as written."""
        inline = node.children[0]
        segments = _Inline().segments(inline)
        raws = inline.content.split("\n")
        aligned = len(segments) == len(raws)  # else a code span or a link runs over lines
        if len(segments) > end - start:
            segments[end - start - 1 :] = [" ".join(segments[end - start - 1 :])]
        for index in range(start, end):
            offset = index - start
            if offset >= len(segments):
                self.out[index] = []
                continue
            source = self.lines[index]
            body = source.rstrip()
            core = raws[offset].strip() if aligned else None
            if core is not None and body.endswith(core):
                prefix = body[: len(body) - len(core)]
            else:
                found = _CONTAINER.match(source)
                prefix = found.group() if found else ""
            shown, text = _shown_prefix(prefix), segments[offset].strip()
            task = _TASK.match(text) if shown.endswith("• ") else None
            if task:
                text = ("☐ " if task.group(1) == " " else "☑ ") + text[task.end() :]
            self.out[index] = [shown + text + source[len(body) :]]

    def indented(self, body: list[str], start: int, end: int) -> None:
        """An indented code block: its lines as written, escaped (Slack has no such block)."""
        for index in range(start, end):
            source = self.lines[index]
            content = body[index - start] if index - start < len(body) else ""
            if content and source.endswith(content):
                prefix = source[: len(source) - len(content)]
            elif not content:
                prefix, content = source, ""
            else:
                found = _CONTAINER.match(source)
                prefix = found.group() if found else ""
                content = source[len(prefix) :]
            self.out[index] = [_shown_prefix(prefix) + _escape(content)]


class _Inline:
    """One inline node as mrkdwn (or `plain` text), one string per line of its source."""

    def __init__(self, *, plain: bool = False, strong: bool = False) -> None:
        self.plain = plain
        self.depth = {"strong": 1 if strong else 0, "em": 0, "s": 0}
        self.lines: list[list[str]] = [[]]

    def segments(self, node: SyntaxTreeNode) -> list[str]:
        self.walk(node.children)
        return ["".join(line) for line in self.lines]

    def text(self, nodes: list[SyntaxTreeNode]) -> str:
        self.walk(nodes)
        return " ".join(" ".join("".join(line) for line in self.lines).split())

    def walk(self, nodes: list[SyntaxTreeNode]) -> None:
        out = self.lines
        for node in nodes:
            kind = node.type
            if kind == "text":
                out[-1].append(node.content if self.plain else _escape(node.content))
            elif kind in ("softbreak", "hardbreak"):
                out.append([])
            elif kind == "code_inline":
                out[-1].append(node.content if self.plain else f"`{_escape(node.content)}`")
            elif kind == "slack_token":
                out[-1].append(node.content)
            elif kind in ("link", "image"):
                out[-1].append(self.link(node))
            elif kind in _MARKER and not self.plain:
                # Slack does not nest a mark in itself: **a **b** c** is one bold span
                mark = "" if self.depth[kind] else _MARKER[kind]
                self.depth[kind] += 1
                out[-1].append(mark)
                self.walk(node.children)
                out[-1].append(mark)
                self.depth[kind] -= 1
            else:
                self.walk(node.children)

    def link(self, node: SyntaxTreeNode) -> str:
        """``<url|label>`` (``<url>`` without a label), or ``label (url)`` as plain text."""
        target = str(node.attrs.get("href") or node.attrs.get("src") or "")
        label = _Inline(plain=True).text(node.children)
        if node.markup == "linkify":  # a bare URL: Slack links it as written
            return label if self.plain else _escape(label)
        if not label or label == target:
            return target if self.plain else f"<{_escape(target)}>"
        return f"{label} ({target})" if self.plain else f"<{_escape(target)}|{_escape(label)}>"


def _table(node: SyntaxTreeNode) -> list[str]:
    """A table as a code block with aligned columns (Slack has no tables)."""
    rows: list[list[str]] = []
    aligns: list[str] = []
    for part in node.children:  # thead, tbody
        for row in part.children:
            cells = [
                _Inline(plain=True).text(cell.children[0].children) if cell.children else ""
                for cell in row.children
            ]
            rows.append(cells)
            if not aligns:
                aligns = [str(cell.attrs.get("style", "")) for cell in row.children]
    columns = max(len(row) for row in rows)
    widths = [max(1, *(len(row[column]) for row in rows)) for column in range(columns)]

    def cell(text: str, column: int) -> str:
        align, width = aligns[column], widths[column]
        if align.endswith("right"):
            return text.rjust(width)
        return text.center(width) if align.endswith("center") else text.ljust(width)

    def row_text(row: list[str]) -> str:
        return " | ".join(cell(text, column) for column, text in enumerate(row)).rstrip()

    body = [row_text(rows[0]), "-+-".join("-" * width for width in widths)]
    body += [row_text(row) for row in rows[1:]]
    return [_FENCE, *(_escape(line) for line in body), _FENCE]


# --- Splitting -----------------------------------------------------------------------------

# Never cut inside these: a link or mention, an entity, a run of backticks (a fence marker).
_ANGLE_OR_ENTITY = re.compile(
    r"<[^<>\n]*>|&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{0,31});"
)
_BACKTICKS = re.compile(r"`{3,}")
_FENCE_LINE = re.compile(r"[ \t]*`{3,}[^`]*")


def split_text(text: str, limit: int = SECTION_TEXT_LIMIT) -> list[str]:
    r"""Cut mrkdwn into parts of at most `limit` characters, each of which renders on its own.

    A part ends at the last paragraph break that fits, else the last line break, else the last
    space, each looked for in the part's second half first (a first line is not posted alone),
    else at the limit; never inside a ``<...>`` link or mention, an ``&amp;``-style
    entity or a run of backticks. The whitespace at a cut is dropped (a line's indentation is
    kept). A code block cut in two is closed (``\n```````) at the end of one part and reopened
    (```````\n``) at the start of the next. Text that fits is returned unchanged as one part; a
    fence the text itself leaves open stays open.

    Args:
        text: mrkdwn (as `to_mrkdwn` writes it).
        limit: The most characters a part may have (Slack's section text takes 3,000).

    Returns:
        The parts, none empty; ``[]`` when `text` is empty or only whitespace (nothing to post).

    Raises:
        ValueError: `limit` is below `MIN_SPLIT_LIMIT`.
    """
    if limit < MIN_SPLIT_LIMIT:
        raise ValueError(f"limit must be at least {MIN_SPLIT_LIMIT}, got {limit}")
    if not text.strip():
        return []
    if len(text) <= limit:
        return [text]
    return list(_Splitter(text, limit).parts())


class _Splitter:
    """One `split_text` call: the text's uncuttable spans and its fence runs, then the cuts."""

    def __init__(self, text: str, limit: int) -> None:
        self.text = text
        self.limit = limit
        self.end = len(text.rstrip())
        # blocked[p]: a cut at p (between p-1 and p) would fall inside an atom
        self.blocked = bytearray(len(text) + 1)
        for pattern in (_ANGLE_OR_ENTITY, _BACKTICKS):
            for match in pattern.finditer(text):
                start, end = match.span()
                self.blocked[start + 1 : end] = b"\x01" * (end - start - 1)
        self.runs = [match.span() for match in _BACKTICKS.finditer(text)]
        self.run_starts = [start for start, _ in self.runs]

    def fences(self, start: int, end: int) -> int:
        """How many ``````` text[start:end] holds (counted as str.count does)."""
        count = 0
        index = max(0, bisect_right(self.run_starts, start) - 1)
        while index < len(self.runs) and self.runs[index][0] < end:
            run_start, run_end = self.runs[index]
            count += max(0, min(end, run_end) - max(start, run_start)) // 3
            index += 1
        return count

    def parts(self) -> Iterator[str]:
        text, start, fence_open = self.text, 0, False
        while start < self.end:
            prefix = _OPEN_FENCE if fence_open else ""
            budget = self.limit - len(prefix)
            if self.end - start <= budget:
                yield prefix + text[start : self.end]
                return
            window_end = start + budget - len(_CLOSE_FENCE)
            first = start
            while text[first].isspace():
                first += 1
            found = self.cut(start, first, window_end, fence_open) if first < window_end else None
            if found is None:
                start = first  # the indentation leaves no room: drop it
                continue
            cut, resume = found
            opens = fence_open != (self.fences(start, cut) % 2 == 1)
            if opens and text.startswith(_FENCE, resume) and not self.blocked[resume + 3]:
                # the text closes the block right after the cut: take its fence, add none
                end = resume + len(_FENCE)
                fits = len(prefix) + end - start <= self.limit
                if fits and (end == len(text) or text[end].isspace()):
                    cut, resume, opens = end, self.resume(end), False
            yield prefix + text[start:cut] + (_CLOSE_FENCE if opens else "")
            start, fence_open = resume, opens

    def resume(self, position: int) -> int:
        """Where the next part starts after a cut at `position`.

        Past the whitespace, but keeping the indentation of the line it reaches.
        """
        text, index = self.text, position
        while index < len(text) and text[index].isspace():
            index += 1
        newline = text.rfind("\n", position, index)
        return newline + 1 if newline >= 0 else index

    def content_end(self, start: int, position: int) -> int:
        while position > start and self.text[position - 1].isspace():
            position -= 1
        return position

    def acceptable(self, start: int, first: int, cut: int, fence_open: bool) -> bool:
        """A cut that leaves text in the part and does not end it on an opening fence line."""
        if cut <= first:
            return False
        if fence_open == (self.fences(start, cut) % 2 == 1):
            return True  # no block left open at the cut
        last_line = self.text[self.text.rfind("\n", start, cut) + 1 : cut]
        return not _FENCE_LINE.fullmatch(last_line)

    def cut(
        self, start: int, first: int, window_end: int, fence_open: bool
    ) -> tuple[int, int] | None:
        """Where the part starting at `start` ends and the next one starts.

        None when only dropping the indentation at `start` makes room for text.
        """
        # a break in the window's second half first: the last paragraph break that fit was
        # taken however early it came, and "Hi!" was a post of its own before the rest
        half = start + (window_end - start) // 2
        for least in (half, first):
            for kind in ("paragraph", "line", "space"):
                for position in self.candidates(kind, first, window_end):
                    if position < least:
                        break
                    cut = self.content_end(start, position)
                    if self.acceptable(start, first, cut, fence_open):
                        return cut, self.resume(position)
        cut = window_end
        while self.blocked[cut]:
            cut -= 1
        if cut <= first:
            if first > start:
                return None
            # one atom wider than a part (a huge link): cut inside it, but keep a run of
            # backticks counting as the same number of fences on both sides
            cut = window_end
            index = bisect_right(self.run_starts, cut) - 1
            if index >= 0 and self.runs[index][0] < cut < self.runs[index][1]:
                run_start = self.runs[index][0]
                cut = run_start + (cut - run_start) // 3 * 3
        return cut, self.resume(cut) if self.text[cut].isspace() else cut

    def candidates(self, kind: str, first: int, window_end: int) -> Iterator[int]:
        """Positions of whitespace to cut at, last first (a cut at p drops text[p])."""
        text = self.text
        if kind == "space":
            position = window_end + 1
            while True:
                position = max(
                    text.rfind(" ", first + 1, position), text.rfind("\t", first + 1, position)
                )
                if position < 0:
                    return
                if not self.blocked[position]:
                    yield position
        position = text.rfind("\n", first + 1, window_end + 1)
        while position > first:
            if kind == "line":
                yield position
            else:
                following = text.find("\n", position + 1)
                if following >= 0 and not text[position + 1 : following].strip():
                    yield position
            position = text.rfind("\n", first + 1, position)


def _clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters at a safe place, with an ellipsis if anything was cut."""
    if len(text) <= limit:
        return text
    parts = split_text(text, limit - len(_ELLIPSIS))
    if not parts:
        return ""
    return parts[0] + _ELLIPSIS if len(parts) > 1 else parts[0]


# --- Notification text ---------------------------------------------------------------------

_LINE_MARKERS = re.compile(r"\s*(?:(?:>|&gt;)\s?)*\s*(?:#{1,6}\s+|[-*+•]\s+)?")
_SLACK_LINK = re.compile(r"<([A-Za-z][A-Za-z0-9+.-]{1,31}:[^<>|\s]*)(?:\|([^<>]*))?>")
_MARKDOWN_LINK = re.compile(r"!?\[([^\[\]]*)\]\([^()\s]*\)")
_PAIRED_MARKERS = re.compile(r"(?<![\w*_~`])([*_~`]{1,3})(?=\S)(.+?)(?<=\S)\1(?![\w*_~`])")


def fallback_text(blocks_text: str, limit: int = 300) -> str:
    """The notification text of a message with blocks: its first line, plain, shortened.

    Args:
        blocks_text: The message's mrkdwn (entities stay: the result is mrkdwn too).
        limit: The most characters of the result, ellipsis included.

    Returns:
        The first line with text (not a code fence), without list, heading and quote markers,
        emphasis or code marks, links reduced to their labels (mentions kept), whitespace
        collapsed, cut with ``…`` (never inside a mention or an entity) if longer than
        `limit`; ``""`` if there is no text.

    Raises:
        ValueError: `limit` is below 1.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    line = next(
        (
            candidate
            for candidate in blocks_text.splitlines()
            if candidate.strip() and not _FENCE_LINE.fullmatch(candidate)
        ),
        "",
    )
    # markers only shorten a line: this much is enough for any limit, and bounds the regexes
    line = line[: min(max(4 * limit, 1000), 4000)]
    markers = _LINE_MARKERS.match(line)
    if markers:
        line = line[markers.end() :]
    line = _SLACK_LINK.sub(lambda match: match.group(2) or match.group(1), line)
    line = _MARKDOWN_LINK.sub(lambda match: match.group(1), line)
    for _ in range(3):  # nested marks: *_bold italic_*
        line = _PAIRED_MARKERS.sub(lambda match: match.group(2), line)
    line = " ".join(line.split())
    if len(line) <= limit:
        return line
    cut = limit - len(_ELLIPSIS)
    for match in _ANGLE_OR_ENTITY.finditer(line):
        if match.start() < cut < match.end():
            cut = match.start()
    return line[:cut].rstrip() + _ELLIPSIS


# --- Approval requests ---------------------------------------------------------------------


class DecisionTarget(Frozen):
    """What an Approve or Deny button carries: the wait and the exact batch it decides."""

    session: str = Field(min_length=1, max_length=_ID_LIMIT)
    run_id: str = Field(min_length=1, max_length=_ID_LIMIT)
    wait_id: str = Field(min_length=1, max_length=_ID_LIMIT)
    calls: tuple[tuple[str, str], ...] = Field(min_length=1)
    """``(tool_call_id, args_digest)`` of every call of the batch, in the request's order."""

    @field_validator("session", "run_id", "wait_id")
    @classmethod
    def _printable(cls, value: str) -> str:
        if not value.isprintable():
            raise ValueError("must be printable text")
        return value

    @field_validator("calls")
    @classmethod
    def _distinct_calls(cls, calls: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        for call_id, digest in calls:
            for part in (call_id, digest):
                if not part or len(part) > _ID_LIMIT or not part.isprintable():
                    raise ValueError("call ids and digests must be printable, 1 to 512 characters")
        if len({call_id for call_id, _ in calls}) != len(calls):
            raise ValueError("a call appears twice")
        return calls

    def decisions(self, *, approved: bool, reason: str | None = None) -> tuple[DecisionItem, ...]:
        """The same decision for every call of the batch (what a `DecisionInbound` carries)."""
        return tuple(
            DecisionItem(tool_call_id=call_id, args_digest=digest, approved=approved, reason=reason)
            for call_id, digest in self.calls
        )


def encode_decision_value(view: ApprovalView) -> str:
    """The Approve / Deny buttons' value: compact JSON naming the wait and the whole batch.

    ``{"v":1,"s":session,"r":run_id,"w":wait_id,"c":[[tool_call_id,args_digest],...]}``;
    `decode_decision_value` reads it back.

    Raises:
        ValueError: the view has no calls, an id is empty or not printable, a call appears
            twice, or the value would exceed Slack's 2,000 characters (decide such a batch
            with the operator API).
    """
    if not view.calls:
        raise ValueError("an approval request without calls has nothing to decide")
    pairs = tuple((call.tool_call_id, call.args_digest) for call in view.calls)
    try:
        DecisionTarget(session=view.session, run_id=view.run_id, wait_id=view.wait_id, calls=pairs)
    except ValidationError as exc:
        raise ValueError(f"cannot encode the decision: {invalid_reason(exc)}") from None
    payload = {"v": _VALUE_VERSION, "s": view.session, "r": view.run_id, "w": view.wait_id}
    payload["c"] = [list(pair) for pair in pairs]
    value = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    if len(value) > BUTTON_VALUE_LIMIT:
        raise ValueError(
            f"the decision value would be {len(value)} characters; Slack allows "
            f"{BUTTON_VALUE_LIMIT} ({len(pairs)} calls)"
        )
    return value


def decode_decision_value(value: str) -> DecisionTarget:
    """Read a button's value back (it came from the network: checked, never trusted).

    Raises:
        ValueError: the value is not a string, longer than 2,000 characters, not JSON, or not
            exactly the shape `encode_decision_value` writes. The message does not repeat it.
    """
    candidate: object = value  # typed str, but it comes from a JSON payload anyone can post
    if not isinstance(candidate, str):
        raise ValueError(f"a decision value must be a string, got {type(candidate).__name__}")
    if len(candidate) > BUTTON_VALUE_LIMIT:
        raise ValueError(
            f"a decision value has at most {BUTTON_VALUE_LIMIT} characters, got {len(candidate)}"
        )
    try:
        data = json.loads(candidate)
    except (ValueError, RecursionError):
        raise ValueError("a decision value must be JSON") from None
    if not isinstance(data, dict) or set(data) != _VALUE_KEYS:
        raise ValueError("a decision value must be a JSON object with the keys c, r, s, v, w")
    if type(data["v"]) is not int or data["v"] != _VALUE_VERSION:
        raise ValueError(f"unknown decision value version (expected {_VALUE_VERSION})")
    for key in ("s", "r", "w"):
        if not isinstance(data[key], str):
            raise ValueError(f"decision value key {key!r} must be a string")
    calls = data["c"]
    if not isinstance(calls, list) or not all(
        isinstance(pair, list) and len(pair) == 2 and all(isinstance(part, str) for part in pair)
        for pair in calls
    ):
        raise ValueError("decision value key 'c' must be a list of [tool_call_id, args_digest]")
    try:
        return DecisionTarget(
            session=data["s"],
            run_id=data["r"],
            wait_id=data["w"],
            calls=tuple((call_id, digest) for call_id, digest in calls),
        )
    except ValidationError as exc:
        raise ValueError(f"invalid decision value: {invalid_reason(exc)}") from None


def _section(text: str) -> Block:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


def _context(text: str) -> Block:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": text}]}


def _plain(text: str) -> dict[str, str]:
    return {"type": "plain_text", "text": text}


def _button(action_id: str, label: str, style: str | None, value: str) -> Block:
    button: Block = {"type": "button", "action_id": action_id, "text": _plain(label)}
    if style is not None:  # Slack knows only primary and danger: a plain button has none
        button["style"] = style
    button["value"] = value
    return button


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - len(_ELLIPSIS)] + _ELLIPSIS


# Backticks occur only inside JSON strings, where \u0060 means the same: a run of three would
# close the code block the arguments are shown in.
_JSON_FENCE = re.compile(r"`{3,}")
_TRUNCATION_NOTE = "\n…(truncated, {} more characters)"
_NOTE_ROOM = len(_TRUNCATION_NOTE.format(10**12))


def _call_text(call: PendingCall, max_arg_chars: int) -> tuple[str, bool]:
    r"""``*tool*`` and the arguments as pretty JSON in a code block, within a section's limit.

    Format characters are shown as ``\uXXXX`` (`adapters.visible`); the flag says whether
    the arguments were cut (then the call cannot be approved from Slack: nobody saw them all).
    """
    name = visible(_shorten(call.tool_name, _TOOL_NAME_LIMIT))
    header = f"*{_escape(name) or '(unnamed tool)'}*"
    raw = visible(json.dumps(call.args, indent=2, ensure_ascii=False))
    raw = _JSON_FENCE.sub(lambda match: "\\u0060" * len(match.group()), raw)
    frame = len(header) + len(_OPEN_FENCE) + 1 + len(_CLOSE_FENCE)
    room = max(1, min(max_arg_chars, SECTION_TEXT_LIMIT - frame - _NOTE_ROOM))
    body = _escape(raw)
    if len(body) > room:
        kept = size = 0
        for char in raw:  # the longest prefix whose escaped form fits
            size += 5 if char == "&" else 4 if char in "<>" else 1
            if size > room:
                break
            kept += 1
        line_end = raw.rfind("\n", 0, kept)
        if line_end > kept * 3 // 4:  # end on a whole line unless that loses much
            kept = line_end
        body = _escape(raw[:kept]) + _TRUNCATION_NOTE.format(len(raw) - kept)
        return f"{header}\n{_OPEN_FENCE}{body}{_CLOSE_FENCE}", True
    return f"{header}\n{_OPEN_FENCE}{body}{_CLOSE_FENCE}", False


def approval_blocks(
    view: ApprovalView, *, intro: str, max_arg_chars: int = SECTION_TEXT_LIMIT
) -> list[Block]:
    """An approval request: the intro, each call with its arguments, Approve and Deny.

    Each call is a section (``*tool_name*`` and its arguments as pretty JSON in a code block,
    cut at `max_arg_chars` with ``…(truncated, N more characters)``), so every text stays within
    3,000 characters and the message within 50 blocks; calls beyond that are counted in a
    context line ("…and N more calls"). The buttons (``block_id="approval"``, ``action_id``
    ``approve`` / ``deny``) carry `encode_decision_value` of the view. When the person cannot
    see every call, or the value would exceed Slack's 2,000 characters, there are no buttons:
    a context line says to decide the batch with the operator API instead. When a call's
    arguments were cut, only Deny: an approval authorizes the arguments a person saw (D52), and
    a context line says how an operator reads them whole and decides. Arguments are shown as
    the model produced them (no secret detection), format characters written as escapes.

    Args:
        view: The wait and its pending calls.
        intro: mrkdwn above the calls, e.g. ``I want to run *deploy* — approve?`` (left out
            when blank; shortened to 3,000 characters).
        max_arg_chars: The most characters of one call's escaped arguments (by default what
            a section holds beside its tool's name).

    Returns:
        The blocks, for ``chat.postMessage(blocks=...)``.

    Raises:
        ValueError: `max_arg_chars` is below 1.
    """
    if max_arg_chars < 1:
        raise ValueError(f"max_arg_chars must be at least 1, got {max_arg_chars}")
    blocks: list[Block] = []
    if intro.strip():
        blocks.append(_section(_clip(intro, SECTION_TEXT_LIMIT)))
    room = MAX_BLOCKS - len(blocks) - 2  # the buttons, and the note beside or instead of them
    calls = view.calls if len(view.calls) <= room else view.calls[: room - 1]
    shown = [_call_text(call, max_arg_chars) for call in calls]
    blocks += [_section(text) for text, _ in shown]
    cut = any(was_cut for _, was_cut in shown)
    hidden = len(view.calls) - len(calls)
    if hidden:
        blocks.append(_context(f"…and {hidden} more call{'' if hidden == 1 else 's'}."))
    value: str | None = None
    if view.calls and not hidden:
        try:
            value = encode_decision_value(view)
        except ValueError:
            value = None
    run = _escape(_shorten(view.run_id, 200))
    wait = _escape(_shorten(view.wait_id, 200))
    if value is not None:
        deny = _button(DENY_ACTION_ID, "Deny", "danger", value)
        buttons = [
            _button(APPROVE_ACTION_ID, "Approve", "primary", value),
            deny,
            _button(SUPPLY_ACTION_ID, "Done it myself", None, value),
        ]
        # an approval authorizes the arguments a person saw (D52): what was cut was not seen
        blocks.append(
            {
                "type": "actions",
                "block_id": APPROVAL_BLOCK_ID,
                "elements": [deny] if cut else buttons,
            }
        )
        if cut:
            blocks.append(
                _context(
                    "Some arguments are too long to show here in full, so this request cannot "
                    "be approved from Slack: an operator can read them whole and decide with "
                    f"`gateway ops approve` (session `{_escape(_shorten(view.session, 200))}`, "
                    f"run `{run}`, wait `{wait}`). Deny still works here."
                )
            )
    elif not view.calls:
        blocks.append(_context("There is nothing to decide in this request."))
    else:
        blocks.append(
            _context(
                "This batch is too large to decide from Slack: decide it with the operator API "
                f"(run `{run}`, wait `{wait}`)."
            )
        )
    return blocks


def mention(decided_by: str) -> str:
    """A Slack user id as a mention; anything else (an operator's name) as escaped text."""
    if re.fullmatch(r"[UW][A-Z0-9]{2,}", decided_by):
        return f"<@{decided_by}>"
    if re.fullmatch(r"<@[UW][A-Z0-9]{2,}(?:\|[^<>]*)?>", decided_by):
        return decided_by
    return _escape(_shorten(" ".join(decided_by.split()), 200)) or "someone"


def _when(decided_at_ms: int) -> str:
    try:
        moment = datetime.fromtimestamp(decided_at_ms // 1000, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return f"{decided_at_ms} ms after the epoch"
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def decided_blocks(
    view_text: str,
    *,
    approved: bool,
    decided_by: str,
    decided_at_ms: int,
    reason: str | None,
) -> list[Block]:
    """What replaces an approval request once decided: its text, no buttons, the decision.

    Args:
        view_text: The request's mrkdwn as posted (split over sections at 3,000 characters).
        approved: Whether the batch was approved.
        decided_by: A Slack user id (``U123``, shown as a mention) or another name.
        decided_at_ms: When, in milliseconds since the epoch (shown in UTC, to the minute).
        reason: Why, if given (escaped, whitespace collapsed, at most 500 characters).

    Returns:
        The blocks, for ``chat.update(blocks=...)``; at most 50.
    """
    outcome: Literal["approved", "denied"] = "approved" if approved else "denied"
    return closed_blocks(
        view_text, close_note(outcome, by=decided_by, at_ms=decided_at_ms, reason=reason)
    )


def close_note(
    outcome: Literal["approved", "denied", "supplied", "decided", "stopped", "ended"],
    *,
    by: str | None,
    at_ms: int,
    reason: str | None = None,
    result: str | None = None,
    failed: bool = False,
) -> str:
    """One mrkdwn line saying how an approval request closed, who closed it and when.

    `result` is a supplied result's first line (`failed`: it says the action failed).
    """
    who = f" by {mention(by)}" if by else ""
    when = f" at {_when(at_ms)}"
    supplied = _escape(_shorten(" ".join((result or "").split()), REASON_LIMIT))
    failure = " (the action failed)" if failed else ""
    if outcome == "approved":
        note = f"✅ Approved{who}{when}"
    elif outcome == "denied":
        note = f"❌ Denied{who}{when}"
    elif outcome == "supplied":
        note = (
            f"📝 {mention(by) if by else 'Someone'} supplied the result{failure}{when}: {supplied}"
        )
    elif outcome == "decided" and result is not None:
        note = f"☑️ Decided{who}{when}: for some calls the result was supplied{failure}: {supplied}"
    elif outcome == "decided":
        note = f"☑️ Decided{who}{when}: some calls approved, some denied"
    elif outcome == "stopped":
        note = f"⏹️ Closed: stopped{who}{when}"
    else:
        note = f"⏹️ Closed{when}: the run ended"
    if reason is not None and reason.strip():
        note += f" — reason: {_escape(_shorten(' '.join(reason.split()), REASON_LIMIT))}"
    return note


def closed_blocks(view_text: str, note: str) -> list[Block]:
    """An approval request that no longer waits: its text, no buttons, then `note`.

    Args:
        view_text: The request's mrkdwn as posted (split over sections at 3,000 characters).
        note: How it closed (`close_note`).

    Returns:
        The blocks, for ``chat.update(blocks=...)``; at most 50.
    """
    parts = split_text(view_text)
    if len(parts) > MAX_BLOCKS - 1:
        omitted = len(parts) - (MAX_BLOCKS - 2)
        parts = parts[: MAX_BLOCKS - 2]
        blocks = [_section(part) for part in parts] + [_context(f"…({omitted} more parts)")]
    else:
        blocks = [_section(part) for part in parts]
    blocks.append(_context(note))
    return blocks


def deny_reason_modal(private_metadata: str) -> Block:
    """The ``views.open`` modal asking why (optional) before denying.

    Args:
        private_metadata: What the submission needs to find the request again (the decision
            value, the message); Slack hands it back with the ``view_submission``.

    Returns:
        The view: ``callback_id="deny_reason"``, one optional multiline input (``block_id`` and
        ``action_id`` ``reason``, at most 500 characters).

    Raises:
        ValueError: `private_metadata` is longer than Slack's 3,000 characters.
    """
    if len(private_metadata) > PRIVATE_METADATA_LIMIT:
        raise ValueError(
            f"private_metadata has at most {PRIVATE_METADATA_LIMIT} characters, "
            f"got {len(private_metadata)}"
        )
    return {
        "type": "modal",
        "callback_id": DENY_REASON_CALLBACK_ID,
        "title": _plain("Deny"),
        "submit": _plain("Deny"),
        "close": _plain("Cancel"),
        "private_metadata": private_metadata,
        "blocks": [
            {
                "type": "input",
                "block_id": REASON_BLOCK_ID,
                "optional": True,
                "label": _plain("Reason"),
                "element": {
                    "type": "plain_text_input",
                    "action_id": REASON_ACTION_ID,
                    "multiline": True,
                    "max_length": REASON_LIMIT,
                    "placeholder": _plain("Why not? (optional)"),
                },
            }
        ],
    }


def supply_result_modal(private_metadata: str) -> Block:
    """The ``views.open`` modal of "Done it myself": the result the agent reads instead.

    Args:
        private_metadata: What the submission needs to find the request again (as for
            `deny_reason_modal`).

    Returns:
        The view: ``callback_id="supply_result"``, a required multiline input (``block_id``
        and ``action_id`` ``result``, at most 3,000 characters) and an optional checkbox
        (``failed``: the action failed).

    Raises:
        ValueError: `private_metadata` is longer than Slack's 3,000 characters.
    """
    if len(private_metadata) > PRIVATE_METADATA_LIMIT:
        raise ValueError(
            f"private_metadata has at most {PRIVATE_METADATA_LIMIT} characters, "
            f"got {len(private_metadata)}"
        )
    return {
        "type": "modal",
        "callback_id": SUPPLY_RESULT_CALLBACK_ID,
        "title": _plain("Done it myself"),
        "submit": _plain("Send result"),
        "close": _plain("Cancel"),
        "private_metadata": private_metadata,
        "blocks": [
            _context(
                "You did the action yourself: the tool will not run, and the agent reads what "
                "you write here as its result."
            ),
            {
                "type": "input",
                "block_id": RESULT_BLOCK_ID,
                "label": _plain("Result"),
                "element": {
                    "type": "plain_text_input",
                    "action_id": RESULT_BLOCK_ID,
                    "multiline": True,
                    "max_length": SUPPLY_RESULT_LIMIT,
                    "placeholder": _plain("What happened? (e.g. deployed build 42 by hand)"),
                },
            },
            {
                "type": "input",
                "block_id": FAILED_BLOCK_ID,
                "optional": True,
                "label": _plain("Outcome"),
                "element": {
                    "type": "checkboxes",
                    "action_id": FAILED_BLOCK_ID,
                    "options": [{"text": _plain("The action failed"), "value": FAILED_BLOCK_ID}],
                },
            },
        ],
    }


def failure_blocks(text: str) -> list[Block]:
    """A short failure notice: one context line, ``⚠️`` and `text` (Markdown) as mrkdwn."""
    body = to_mrkdwn(text).strip()
    return [_context(_clip(f"⚠️ {body}" if body else "⚠️", SECTION_TEXT_LIMIT))]
