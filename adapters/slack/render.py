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
import unicodedata
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, TypeAlias

from pydantic import Field, ValidationError, field_validator

from adapters.channel import ApprovalView, DecisionItem, PendingCall
from harness_core.frozen import Frozen, invalid_reason

__all__ = [
    "APPROVAL_BLOCK_ID",
    "APPROVE_ACTION_ID",
    "BUTTON_VALUE_LIMIT",
    "Block",
    "DENY_ACTION_ID",
    "DENY_REASON_CALLBACK_ID",
    "DecisionTarget",
    "MAX_BLOCKS",
    "MIN_SPLIT_LIMIT",
    "PRIVATE_METADATA_LIMIT",
    "REASON_ACTION_ID",
    "REASON_BLOCK_ID",
    "REASON_LIMIT",
    "SECTION_TEXT_LIMIT",
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


# --- Markdown to mrkdwn: inline ------------------------------------------------------------

_ASCII_PUNCT = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
# Slack's own syntax, kept as written: mentions <@U1>, channels <#C1|general>, special mentions
# and commands <!here>, <!subteam^S1|@team>, <!date^...|fallback>, and labelled links.
_SLACK_TOKEN = re.compile(
    r"<(?:[@#][A-Za-z0-9][^\s<>|]*|![A-Za-z][^<>|\n]*)(?:\|[^<>\n]*)?>"
    r"|<[A-Za-z][A-Za-z0-9+.-]{1,31}:[^\s<>|]+\|[^<>\n]+>"
)
_AUTOLINK = re.compile(r"<([A-Za-z][A-Za-z0-9+.-]{1,31}:[^\s<>]*)>")
_EMAIL_AUTOLINK = re.compile(
    r"<([A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*)>"
)
# After a link's "]": (destination "title"); one level of parentheses inside the destination
# (Wikipedia URLs). Each alternative starts with a different character: no backtracking blowup.
_LINK_TAIL = re.compile(
    r"""\([ \t]*(?:<([^<>\n]*)>|((?:[^\s()\\]|\\.|\((?:[^\s()\\]|\\.)*\))*))"""
    r"""(?:[ \t]+(?:"[^"]*"|'[^']*'|\([^()]*\)))?[ \t]*\)"""
)
_BACKSLASH_ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")

_Tag = Literal["strong", "em", "strike"]
_MARKER: dict[_Tag, str] = {"strong": "*", "em": "_", "strike": "~"}


@dataclass(slots=True)
class _Piece:
    """An inline span already rendered: `mrkdwn` is escaped, `plain` is not."""

    mrkdwn: str
    plain: str


@dataclass(slots=True)
class _Delim:
    """A run of ``*``, ``_`` or ``~`` that may open or close emphasis (CommonMark's rules)."""

    char: str
    count: int
    can_open: bool
    can_close: bool
    order: int
    remaining: int = 0
    opens: list[_Tag] = field(default_factory=list)
    closes: list[_Tag] = field(default_factory=list)


_Token: TypeAlias = _Piece | _Delim


def _is_punct(char: str) -> bool:
    return char in _ASCII_PUNCT or unicodedata.category(char)[0] in "PS"


def _delim(char: str, count: int, before: str, after: str, order: int) -> _Delim:
    """The delimiter run `char` * `count` between `before` and `after` (space at line ends)."""
    left = not after.isspace() and (not _is_punct(after) or before.isspace() or _is_punct(before))
    right = not before.isspace() and (not _is_punct(before) or after.isspace() or _is_punct(after))
    if char == "_":
        # intraword underscores (snake_case_names) neither open nor close
        can_open = left and (not right or _is_punct(before))
        can_close = right and (not left or _is_punct(after))
    else:
        can_open, can_close = left, right
    if char == "~" and count > 2:
        can_open = can_close = False  # GFM strikes with one or two tildes only
    return _Delim(char, count, can_open, can_close, order, remaining=count)


def _pairs(opener: _Delim, closer: _Delim) -> bool:
    if opener.char != closer.char:
        return False
    if opener.char == "~":
        return opener.count == closer.count
    both_ways = opener.can_close or closer.can_open
    total = opener.count + closer.count
    return not (both_ways and total % 3 == 0 and (opener.count % 3 or closer.count % 3))


def _match_emphasis(delims: list[_Delim]) -> None:
    """Pair openers with closers (CommonMark's process-emphasis, with its bottoms kept linear)."""
    stack: list[_Delim] = []
    bottoms: dict[tuple[str, bool, int], int] = {}
    for closer in delims:
        key = (closer.char, closer.can_open, closer.count % 3)
        while closer.can_close and closer.remaining:
            bottom = bottoms.get(key, -1)
            found = -1
            for index in range(len(stack) - 1, -1, -1):
                if stack[index].order <= bottom:
                    break
                if _pairs(stack[index], closer):
                    found = index
                    break
            if found < 0:
                # nothing at or below the current top can match a closer like this one
                bottoms[key] = stack[-1].order if stack else closer.order
                break
            opener = stack[found]
            if opener.char == "~":
                tag: _Tag = "strike"
                used = opener.remaining
            elif opener.remaining >= 2 and closer.remaining >= 2:
                tag, used = "strong", 2
            else:
                tag, used = "em", 1
            opener.opens.append(tag)
            closer.closes.append(tag)
            opener.remaining -= used
            closer.remaining -= used
            del stack[found + 1 :]  # delimiters between the pair stay literal
            if not opener.remaining:
                stack.pop()
        if closer.can_open and closer.remaining:
            stack.append(closer)


def _backtick_runs(line: str) -> dict[int, list[int]]:
    """Start positions of the maximal backtick runs of `line`, by run length."""
    runs: dict[int, list[int]] = {}
    for match in re.finditer(r"`+", line):
        runs.setdefault(len(match.group()), []).append(match.start())
    return runs


def _bracket_pairs(line: str) -> dict[int, int]:
    """Each ``[`` of `line` and the ``]`` that closes it (backslash escapes skipped)."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    index = 0
    while index < len(line):
        char = line[index]
        if char == "\\":
            index += 2
            continue
        if char == "[":
            stack.append(index)
        elif char == "]" and stack:
            pairs[stack.pop()] = index
        index += 1
    return pairs


def _link_piece(url: str, label: str) -> _Piece:
    """``<url|label>`` (or ``<url>``), both escaped; Slack decodes the entities."""
    label = " ".join(label.split())
    # a raw "|" would end the URL and spaces are not allowed in it: percent-encode both
    target = url.strip().replace("|", "%7C").replace(" ", "%20")
    if not target:
        return _Piece(_escape(label), label)
    if not label or label == target:
        return _Piece(f"<{_escape(target)}>", target)
    return _Piece(f"<{_escape(target)}|{_escape(label)}>", f"{label} ({target})")


def _code_piece(code: str) -> _Piece:
    if len(code) >= 2 and code[0] == code[-1] == " " and code.strip(" "):
        code = code[1:-1]  # CommonMark drops one padding space on each side
    return _Piece(f"`{_escape(code)}`", code)


def _tokenize(line: str, *, links: bool = True) -> list[_Token]:
    """The inline tokens of one line; `links` is off inside a link's label (no nesting)."""
    tokens: list[_Token] = []
    literal: list[str] = []
    runs = _backtick_runs(line)
    brackets = _bracket_pairs(line) if links else {}
    order = 0

    def flush() -> None:
        if literal:
            text = "".join(literal)
            tokens.append(_Piece(_escape(text), text))
            literal.clear()

    index, size = 0, len(line)
    while index < size:
        char = line[index]
        if char == "\\" and index + 1 < size and line[index + 1] in _ASCII_PUNCT:
            literal.append(line[index + 1])
            index += 2
            continue
        if char == "`":
            end = index
            while end < size and line[end] == "`":
                end += 1
            length = end - index
            starts = runs.get(length, [])
            position = bisect_right(starts, end - 1)
            if position < len(starts):
                closing = starts[position]
                flush()
                tokens.append(_code_piece(line[end:closing]))
                index = closing + length
            else:
                literal.append(line[index:end])
                index = end
            continue
        if char == "<":
            piece = _angle(line, index)
            if piece is not None:
                flush()
                tokens.append(piece[0])
                index = piece[1]
                continue
        if links and char in "![":
            opening = index + 1 if char == "!" else index
            parsed = _parse_link(line, opening, brackets)
            if parsed is not None:
                label, url, end = parsed
                flush()
                tokens.append(_link_piece(url, _render(_tokenize(label, links=False), plain=True)))
                index = end
                continue
        if char in "*_~":
            end = index
            while end < size and line[end] == char:
                end += 1
            before = line[index - 1] if index else " "
            after = line[end] if end < size else " "
            delim = _delim(char, end - index, before, after, order)
            if delim.can_open or delim.can_close:
                flush()
                tokens.append(delim)
                order += 1
            else:
                literal.append(line[index:end])
            index = end
            continue
        literal.append(char)
        index += 1
    flush()
    _match_emphasis([token for token in tokens if isinstance(token, _Delim)])
    return tokens


def _angle(line: str, index: int) -> tuple[_Piece, int] | None:
    """Slack's own syntax, an autolink or an e-mail autolink starting at `index`, if any."""
    match = _SLACK_TOKEN.match(line, index)
    if match:
        return _Piece(match.group(), match.group()), match.end()
    match = _AUTOLINK.match(line, index)
    if match:
        return _link_piece(match.group(1), ""), match.end()
    match = _EMAIL_AUTOLINK.match(line, index)
    if match:
        address = match.group(1)
        return _link_piece(f"mailto:{address}", address), match.end()
    return None


def _parse_link(line: str, opening: int, brackets: dict[int, int]) -> tuple[str, str, int] | None:
    """``[label](url "title")`` at `opening`: its raw label, its URL and where it ends."""
    closing = brackets.get(opening)
    if closing is None:
        return None
    match = _LINK_TAIL.match(line, closing + 1)
    if match is None:
        return None
    url = match.group(1) if match.group(1) is not None else match.group(2)
    return line[opening + 1 : closing], _BACKSLASH_ESCAPE.sub(r"\1", url), match.end()


def _render(tokens: list[_Token], *, plain: bool, strong: bool = False) -> str:
    """Tokens as mrkdwn (or as plain unescaped text); nested same emphasis is not repeated."""
    depth: dict[_Tag, int] = {"strong": 1 if strong else 0, "em": 0, "strike": 0}
    out: list[str] = []
    for token in tokens:
        if isinstance(token, _Piece):
            out.append(token.plain if plain else token.mrkdwn)
            continue
        for tag in token.closes:  # innermost first
            depth[tag] -= 1
            if not plain and not depth[tag]:
                out.append(_MARKER[tag])
        out.append(token.char * token.remaining)
        for tag in reversed(token.opens):  # outermost first
            if not plain and not depth[tag]:
                out.append(_MARKER[tag])
            depth[tag] += 1
    return "".join(out)


def _inline(text: str, *, strong: bool = False) -> str:
    return _render(_tokenize(text), plain=False, strong=strong)


# --- Markdown to mrkdwn: lines and blocks --------------------------------------------------

_FENCE_OPEN = re.compile(r"([ \t]*)(`{3,}|~{3,})(.*)")
_HEADING = re.compile(r" {0,3}(#{1,6})(?:[ \t]+(.*))?")
_CLOSING_HASHES = re.compile(r"(?:^|[ \t]+)#+[ \t]*$")
_RULE = re.compile(r" {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*")
_SETEXT = re.compile(r" {0,3}(?:=+|-+)[ \t]*")
_BULLET = re.compile(r"([ \t]*)[-*+][ \t]+(.*)")
_TASK = re.compile(r"\[([ xX])\][ \t]+")
_QUOTE = re.compile(r"(?:[ \t]{0,3}>[ \t]?)+")
_DELIMITER_CELL = re.compile(r":?-+:?")

_LineKind = Literal["blank", "paragraph", "other"]


def to_mrkdwn(markdown: str) -> str:
    r"""Convert the model's CommonMark-ish Markdown to Slack mrkdwn; never raises.

    Bold, italic, strikethrough, links, images (as links), headings (as bold lines), bullets
    (as ``•``), rules and tables (as aligned code blocks) are converted; block quotes and
    ordered lists stay as they are; fenced code loses its language tag (Slack has none).
    ``&``, ``<``, ``>`` are escaped everywhere except in Slack's own syntax already present
    (``<@U123>``, ``<#C123>``, ``<!here>``, ``<url|text>``) and the delimiters of the links this
    writes; inside code nothing else changes. Line endings become ``\n``. Markers that do not
    pair stay as written. Text without Markdown or those three characters comes back unchanged.

    Args:
        markdown: The text as the model wrote it.

    Returns:
        The same text in mrkdwn, of any length (`split_text` cuts it to Slack's limits).
    """
    lines = markdown.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    out: list[str] = []
    previous: _LineKind = "blank"
    paragraph_lines = 0
    index = 0
    while index < len(lines):
        line = lines[index]
        if not line.strip():
            out.append(line)
            previous, index = "blank", index + 1
            continue
        fence = _FENCE_OPEN.fullmatch(line)
        if fence and not (fence.group(2)[0] == "`" and "`" in fence.group(3)):
            code, index = _fenced_code(lines, index, fence)
            out.extend(code)
            previous = "other"
            continue
        if index + 1 < len(lines) and _is_table_start(line, lines[index + 1]):
            table, index = _table(lines, index)
            out.extend(table)
            previous = "other"
            continue
        if previous == "paragraph" and paragraph_lines == 1 and _SETEXT.fullmatch(line):
            # "Title" underlined with === or --- is a heading
            title = lines[index - 1].strip()
            out[-1] = f"*{_inline(title, strong=True)}*"
            previous, index = "other", index + 1
            continue
        quote = _QUOTE.match(line)
        prefix = quote.group() if quote else ""
        text, kind = _line_body(line[len(prefix) :])
        out.append(prefix + text)
        paragraph_lines = paragraph_lines + 1 if previous == kind == "paragraph" else 1
        previous = "other" if prefix else kind
        index += 1
    return "\n".join(out)


def _line_body(line: str) -> tuple[str, _LineKind]:
    """One line outside code and tables (after any quote marker), converted."""
    if _RULE.fullmatch(line):
        return _RULE_LINE, "other"
    heading = _HEADING.fullmatch(line)
    if heading:
        title = _CLOSING_HASHES.sub("", (heading.group(2) or "").strip()).strip()
        return (f"*{_inline(title, strong=True)}*" if title else ""), "other"
    bullet = _BULLET.fullmatch(line)
    if bullet:
        indent, item = bullet.groups()
        task = _TASK.match(item)
        if task:
            box = "☐" if task.group(1) == " " else "☑"
            item = f"{box} {item[task.end() :]}"
        return f"{indent}• {_inline(item)}".rstrip(), "other"
    if not line.strip():
        return line, "blank"
    return _inline(line), "paragraph"


def _fenced_code(lines: list[str], index: int, fence: re.Match[str]) -> tuple[list[str], int]:
    """The code block opened at `index` (to its closing fence or the end), and what follows."""
    indent, marker = len(fence.group(1)), fence.group(2)
    closing = re.compile(rf"[ \t]*{re.escape(marker[0])}{{{len(marker)},}}[ \t]*")
    body: list[str] = []
    index += 1
    while index < len(lines) and not closing.fullmatch(lines[index]):
        line = lines[index]
        strip = len(line) - len(line.lstrip(" \t"))
        body.append(_escape(line[min(indent, strip) :]))
        index += 1
    index += 1  # the closing fence (or past the end: an unclosed block ends with the text)
    if not any(line.strip() for line in body):
        return [], index
    return [_FENCE, *body, _FENCE], index


def _cells(line: str) -> list[str]:
    row = line.strip()
    if row.startswith("|"):
        row = row[1:]
    if row.endswith("|") and not row.endswith("\\|"):
        row = row[:-1]
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", row)]


def _is_table_start(header: str, delimiter: str) -> bool:
    if "|" not in header or "|" not in delimiter:
        return False
    cells = _cells(delimiter)
    if not all(_DELIMITER_CELL.fullmatch(cell) for cell in cells):
        return False
    return len(cells) == len(_cells(header))


def _alignment(delimiter: str) -> Literal["left", "center", "right"]:
    if delimiter.endswith(":"):
        return "center" if delimiter.startswith(":") and len(delimiter) > 1 else "right"
    return "left"


def _table(lines: list[str], index: int) -> tuple[list[str], int]:
    """The table starting at `index` as a code block with aligned columns, and what follows."""
    rows = [_cells(lines[index])]
    aligns = [_alignment(cell) for cell in _cells(lines[index + 1])]
    index += 2
    while index < len(lines) and lines[index].strip() and "|" in lines[index]:
        rows.append(_cells(lines[index]))
        index += 1
    columns = max(len(row) for row in rows)
    texts = [
        [" ".join(_render(_tokenize(cell), plain=True).split()) for cell in row]
        + [""] * (columns - len(row))
        for row in rows
    ]
    widths = [max(1, *(len(row[column]) for row in texts)) for column in range(columns)]

    def cell(text: str, column: int) -> str:
        align = aligns[column] if column < len(aligns) else "left"
        width = widths[column]
        if align == "right":
            return text.rjust(width)
        return text.center(width) if align == "center" else text.ljust(width)

    def row_text(row: list[str]) -> str:
        return " | ".join(cell(text, column) for column, text in enumerate(row)).rstrip()

    body = [row_text(texts[0]), "-+-".join("-" * width for width in widths)]
    body += [row_text(row) for row in texts[1:]]
    return [_FENCE, *(_escape(line) for line in body), _FENCE], index


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
    space, else at the limit; never inside a ``<...>`` link or mention, an ``&amp;``-style
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
        for kind in ("paragraph", "line", "space"):
            for position in self.candidates(kind, first, window_end):
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


def _button(action_id: str, label: str, style: str, value: str) -> Block:
    return {
        "type": "button",
        "action_id": action_id,
        "text": _plain(label),
        "style": style,
        "value": value,
    }


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - len(_ELLIPSIS)] + _ELLIPSIS


# Backticks occur only inside JSON strings, where \u0060 means the same: a run of three would
# close the code block the arguments are shown in.
_JSON_FENCE = re.compile(r"`{3,}")
_TRUNCATION_NOTE = "\n…(truncated, {} more characters)"
_NOTE_ROOM = len(_TRUNCATION_NOTE.format(10**12))


def _call_text(call: PendingCall, max_arg_chars: int) -> str:
    """``*tool*`` and the arguments as pretty JSON in a code block, within a section's limit."""
    header = f"*{_escape(_shorten(call.tool_name, _TOOL_NAME_LIMIT)) or '(unnamed tool)'}*"
    raw = json.dumps(call.args, indent=2, ensure_ascii=False)
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
    return f"{header}\n{_OPEN_FENCE}{body}{_CLOSE_FENCE}"


def approval_blocks(view: ApprovalView, *, intro: str, max_arg_chars: int = 1500) -> list[Block]:
    """An approval request: the intro, each call with its arguments, Approve and Deny.

    Each call is a section (``*tool_name*`` and its arguments as pretty JSON in a code block,
    cut at `max_arg_chars` with ``…(truncated, N more characters)``), so every text stays within
    3,000 characters and the message within 50 blocks; calls beyond that are counted in a
    context line ("…and N more calls"). The buttons (``block_id="approval"``, ``action_id``
    ``approve`` / ``deny``) carry `encode_decision_value` of the view. When the person cannot
    see every call, or the value would exceed Slack's 2,000 characters, there are no buttons:
    a context line says to decide the batch with the operator API instead. Arguments are shown
    as the model produced them (no secret detection).

    Args:
        view: The wait and its pending calls.
        intro: mrkdwn above the calls, e.g. ``I want to run *deploy* — approve?`` (left out
            when blank; shortened to 3,000 characters).
        max_arg_chars: The most characters of one call's escaped arguments.

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
    room = MAX_BLOCKS - len(blocks) - 1  # the buttons, or the note that replaces them
    calls = view.calls if len(view.calls) <= room else view.calls[: room - 1]
    blocks += [_section(_call_text(call, max_arg_chars)) for call in calls]
    hidden = len(view.calls) - len(calls)
    if hidden:
        blocks.append(_context(f"…and {hidden} more call{'' if hidden == 1 else 's'}."))
    value: str | None = None
    if view.calls and not hidden:
        try:
            value = encode_decision_value(view)
        except ValueError:
            value = None
    if value is not None:
        blocks.append(
            {
                "type": "actions",
                "block_id": APPROVAL_BLOCK_ID,
                "elements": [
                    _button(APPROVE_ACTION_ID, "Approve", "primary", value),
                    _button(DENY_ACTION_ID, "Deny", "danger", value),
                ],
            }
        )
    elif not view.calls:
        blocks.append(_context("There is nothing to decide in this request."))
    else:
        run = _escape(_shorten(view.run_id, 200))
        wait = _escape(_shorten(view.wait_id, 200))
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
    outcome: Literal["approved", "denied", "decided", "stopped", "ended"],
    *,
    by: str | None,
    at_ms: int,
    reason: str | None = None,
) -> str:
    """One mrkdwn line saying how an approval request closed, who closed it and when."""
    who = f" by {mention(by)}" if by else ""
    when = f" at {_when(at_ms)}"
    if outcome == "approved":
        note = f"✅ Approved{who}{when}"
    elif outcome == "denied":
        note = f"❌ Denied{who}{when}"
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


def failure_blocks(text: str) -> list[Block]:
    """A short failure notice: one context line, ``⚠️`` and `text` (Markdown) as mrkdwn."""
    body = to_mrkdwn(text).strip()
    return [_context(_clip(f"⚠️ {body}" if body else "⚠️", SECTION_TEXT_LIMIT))]
