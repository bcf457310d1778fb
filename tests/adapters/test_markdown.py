"""The one Markdown parse both channels render from: what it recognizes and what it refuses."""

from __future__ import annotations

import pytest
from markdown_it.tree import SyntaxTreeNode

from adapters.markdown import LINK_SCHEMES, normalize, parse


def _inline(text: str) -> list[SyntaxTreeNode]:
    (paragraph,) = parse(text).children
    assert paragraph.type == "paragraph"
    return paragraph.children[0].children


def _kinds(nodes: list[SyntaxTreeNode]) -> list[str]:
    return [node.type for node in nodes]


def test_raw_html_is_text() -> None:
    assert _kinds(_inline("<b>x</b> <script>")) == ["text"]
    assert [node.type for node in parse("<div>\nx\n</div>").children] == ["paragraph"]


@pytest.mark.parametrize(
    "url", ["https://x.example/a", "http://x.example", "mailto:a@x.example", "HTTPS://X.EXAMPLE"]
)
def test_links_to_the_web_and_to_mail_parse_as_links(url: str) -> None:
    (link,) = _inline(f"[t]({url})")
    assert link.type == "link" and str(link.attrs["href"]).lower() == url.lower()


@pytest.mark.parametrize(
    "url",
    [
        "javascript:alert(1)",
        "data:text/html,x",
        "vbscript:x",
        "file:///etc",
        "/relative",
        "ftp://x",
    ],
)
def test_links_elsewhere_stay_text(url: str) -> None:
    assert _kinds(_inline(f"[t]({url}) <{url}> ![i]({url})")) == ["text"]
    assert url.split(":")[0] not in LINK_SCHEMES


def test_bare_links_need_a_scheme() -> None:
    nodes = _inline("see https://x.example/a_b. and x.example")
    assert _kinds(nodes) == ["text", "link", "text"]
    assert nodes[1].attrs["href"] == "https://x.example/a_b" and nodes[1].markup == "linkify"


def test_slack_syntax_is_one_token() -> None:
    text = "<@U1> <#C1|ops> <!here> <!subteam^S1|@team> <https://x|a *b*>"
    tokens = [node.content for node in _inline(text) if node.type == "slack_token"]
    assert tokens == ["<@U1>", "<#C1|ops>", "<!here>", "<!subteam^S1|@team>", "<https://x|a *b*>"]


def test_tables_strikes_and_line_maps() -> None:
    root = parse("a\r\n\r\n| x |\r|---|\n| ~~y~~ |")
    assert [(node.type, node.map) for node in root.children] == [
        ("paragraph", (0, 1)),
        ("table", (2, 5)),
    ]
    assert normalize("a\r\nb\rc") == "a\nb\nc"
    assert "s" in {node.type for node in root.children[1].walk()}


def test_nul_is_left_as_written() -> None:
    assert [node.content for node in _inline("a\x00b")] == ["a\x00b"]
