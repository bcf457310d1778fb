r"""The one Markdown parse every channel renders from: the model's text as a CommonMark tree.

The model writes Markdown; each channel writes its own markup (Slack mrkdwn in
`adapters.slack.render`, email HTML in `adapters.email.compose`). Both walk the tree `parse`
returns, built by markdown-it-py with the same options (decision D175):

* CommonMark, plus GFM tables and ``~~strikethrough~~``, plus bare ``https://`` links (the
  linkify inline rule: only links written with a scheme, never a guessed ``example.com``).
* No raw HTML: ``<div>`` or ``<script>`` is text, which every renderer escapes.
* Links only to `LINK_SCHEMES` (http, https, mailto): a ``[label](javascript:...)`` is no
  link at all, it stays text as written; a definition pointing elsewhere defines nothing.
* Slack's own angle syntax (``<@U123>``, ``<#C1|general>``, ``<!here>``, ``<url|label>``) is
  one ``slack_token`` node, so no rule takes it apart: Slack keeps it, email shows it as text.
* Line endings become ``\n``; NUL characters are left to each renderer (markdown-it's own
  normalization would replace them, and Slack's renderer gives plain text back unchanged).

Every block node carries ``map``, the ``[first, end)`` lines of the source it was read from:
`normalize` gives the source exactly as it was parsed, for a renderer that keeps lines as
written.
"""

from __future__ import annotations

import re
from functools import cache

from markdown_it import MarkdownIt
from markdown_it.rules_inline import StateInline
from markdown_it.tree import SyntaxTreeNode

__all__ = ["LINK_SCHEMES", "SLACK_TOKEN", "normalize", "parse"]

LINK_SCHEMES = frozenset({"http", "https", "mailto"})
"""The schemes a link may have; anything else (javascript:, data:, relative paths) stays text."""

SLACK_TOKEN = re.compile(
    r"<(?:[@#][A-Za-z0-9][^\s<>|]*|![A-Za-z][^<>|\n]*)(?:\|[^<>\n]*)?>"
    r"|<[A-Za-z][A-Za-z0-9+.-]{1,31}:[^\s<>|]+\|[^<>\n]+>"
)
"""Slack's own syntax: mentions ``<@U1>``, channels ``<#C1|general>``, special mentions and
commands ``<!here>``, ``<!subteam^S1|@team>``, ``<!date^...|fallback>``, labelled links."""

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]{0,31}):")


class _Parser(MarkdownIt):
    def validateLink(self, url: str) -> bool:
        scheme = _SCHEME.match(url)
        return scheme is not None and scheme.group(1).lower() in LINK_SCHEMES


def _slack_token(state: StateInline, silent: bool) -> bool:
    if state.src[state.pos] != "<":
        return False
    match = SLACK_TOKEN.match(state.src, state.pos, state.posMax)
    if match is None:
        return False
    if not silent:
        token = state.push("slack_token", "", 0)
        token.content = match.group()
    state.pos = match.end()
    return True


@cache
def _parser() -> MarkdownIt:
    parser = _Parser("commonmark", {"html": False, "linkify": True})
    parser.enable(["table", "strikethrough"])
    parser.inline.ruler.enable("linkify")  # the inline rule only: scheme://... links
    parser.core.ruler.disable("normalize")  # `normalize` below; NUL is left as written
    parser.inline.ruler.before("autolink", "slack_token", _slack_token)
    return parser


def normalize(text: str) -> str:
    r"""`text` as `parse` reads it: every line ending a ``\n``."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def parse(text: str) -> SyntaxTreeNode:
    """The Markdown tree of `text` (see the module docstring for what it recognizes)."""
    return SyntaxTreeNode(_parser().parse(normalize(text)))
