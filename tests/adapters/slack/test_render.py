"""Slack rendering: Markdown to mrkdwn, splitting at the limits, approval and decision blocks."""

from __future__ import annotations

import contextlib
import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.channel import ApprovalView, DecisionItem, PendingCall
from adapters.slack.render import (
    APPROVAL_BLOCK_ID,
    BUTTON_VALUE_LIMIT,
    DENY_ACTION_ID,
    MAX_BLOCKS,
    SECTION_TEXT_LIMIT,
    Block,
    DecisionTarget,
    approval_blocks,
    close_note,
    closed_blocks,
    decided_blocks,
    decode_decision_value,
    deny_reason_modal,
    encode_decision_value,
    failure_blocks,
    fallback_text,
    split_text,
    to_mrkdwn,
)

FAST = settings(max_examples=120, deadline=None)

# --- to_mrkdwn ----------------------------------------------------------------------------

CONVERSIONS = [
    ("bold-stars", "a **bold** b", "a *bold* b"),
    ("bold-underscores", "a __bold__ b", "a *bold* b"),
    ("italic-star", "an *italic* word", "an _italic_ word"),
    ("italic-underscore", "an _italic_ word", "an _italic_ word"),
    ("bold-italic", "***both***", "_*both*_"),
    ("strike", "~~gone~~", "~gone~"),
    ("link", "see [the docs](https://x.io/a)", "see <https://x.io/a|the docs>"),
    ("link-query-escaped", "[q](http://x?a=1&b=2)", "<http://x?a=1&amp;b=2|q>"),
    ("link-title-dropped", '[t](http://x "Title")', "<http://x|t>"),
    ("link-label-plain", "[**b** `c`](http://x)", "<http://x|b c>"),
    ("link-label-escaped", "[a < b](http://x)", "<http://x|a &lt; b>"),
    ("link-pipe-in-url", "[t](http://x/a|b)", "<http://x/a%7Cb|t>"),
    ("autolink", "go <https://example.com/x>", "go <https://example.com/x>"),
    ("email-autolink", "<me@example.com>", "<mailto:me@example.com|me@example.com>"),
    ("image", "![a cat](https://x/cat.png)", "<https://x/cat.png|a cat>"),
    ("image-no-alt", "![](https://x/cat.png)", "<https://x/cat.png>"),
    ("bold-with-link", "**bold with [link](http://x)**", "*bold with <http://x|link>*"),
    ("h1", "# Title", "*Title*"),
    ("h3-closing-hashes", "### Part two ###", "*Part two*"),
    ("h6", "###### Small", "*Small*"),
    ("heading-with-bold", "## A **big** deal", "*A big deal*"),
    ("not-a-heading", "#hashtag and C#", "#hashtag and C#"),
    ("setext", "Title\n=====\nbody", "*Title*\nbody"),
    ("bullets", "- one\n* two\n+ three", "• one\n• two\n• three"),
    ("nested-bullets", "- one\n  - two\n    - three", "• one\n  • two\n    • three"),
    ("bullet-inline", "- a **b** c", "• a *b* c"),
    ("tasks", "- [ ] todo\n- [x] done", "• ☐ todo\n• ☑ done"),
    ("ordered-unchanged", "1. one\n2. **two**", "1. one\n2. *two*"),
    ("quote-unchanged", "> a quote", "> a quote"),
    ("quote-converted-inside", "> **b** & c", "> *b* &amp; c"),
    ("rule-dashes", "a\n\n---\n\nb", "a\n\n———\n\nb"),
    ("rule-stars", "* * *", "———"),
    ("escaping", "a < b & c > d", "a &lt; b &amp; c &gt; d"),
    ("html-escaped", "<div>x</div>", "&lt;div&gt;x&lt;/div&gt;"),
    ("mention-kept", "ask <@U123> in <#C42|ops>", "ask <@U123> in <#C42|ops>"),
    ("special-mentions-kept", "<!here> <!subteam^S1|@team>", "<!here> <!subteam^S1|@team>"),
    ("slack-link-kept", "<https://x|label>", "<https://x|label>"),
    ("fence", "```python\nx = **y** < 3 & z\n```", "```\nx = **y** &lt; 3 &amp; z\n```"),
    ("fence-tildes", "~~~\n_a_\n~~~", "```\n_a_\n```"),
    ("fence-unclosed", "```\n**x**", "```\n**x**\n```"),
    ("fence-indented", "- item\n  ```\n  code\n  ```", "• item\n```\ncode\n```"),
    ("inline-code", "run `a**b** < c` now", "run `a**b** &lt; c` now"),
    ("double-backtick-code", "``a ` b``", "`a ` b`"),
    ("unbalanced-bold", "**open and *also", "**open and *also"),
    ("unbalanced-code", "a ` b", "a ` b"),
    ("snake-case", "call snake_case_name()", "call snake_case_name()"),
    ("arithmetic", "2 * 3 * 4", "2 * 3 * 4"),
    ("backslash-escape", r"1\. not \*em\*", "1. not *em*"),
    ("nested-bold-collapses", "**a **b** c**", "*a b c*"),
    ("crlf", "a\r\n**b**", "a\n*b*"),
    (
        "table",
        "| name | n |\n|:-----|--:|\n| a | 1 |\n| **bb** | 22 |",
        "```\nname |  n\n-----+---\na    |  1\nbb   | 22\n```",
    ),
    (
        "table-link-and-escape",
        "| a | b |\n|---|---|\n| [l](http://u) | x<y |",
        "```\na            | b\n-------------+----\nl (http://u) | x&lt;y\n```",
    ),
]


@pytest.mark.parametrize(
    ("markdown", "expected"), [c[1:] for c in CONVERSIONS], ids=[c[0] for c in CONVERSIONS]
)
def test_to_mrkdwn_converts(markdown: str, expected: str) -> None:
    assert to_mrkdwn(markdown) == expected


MARKUP = set("*_~`[]()<>&#+-=!|\\>:\r")


@FAST
@given(st.text(alphabet=st.characters(exclude_characters=MARKUP, exclude_categories=["Cs"])))
def test_plain_text_comes_back_unchanged(text: str) -> None:
    assert to_mrkdwn(text) == text


markdownish = st.lists(
    st.sampled_from([*"*_~`[]()<>&#+-=!|\\:>@ \n\tab1.é", "http://", "```", "**", "~~"]),
    max_size=80,
).map("".join)


@FAST
@given(st.one_of(st.text(max_size=200), markdownish))
def test_to_mrkdwn_never_raises_and_escapes_every_stray_bracket(markdown: str) -> None:
    out = to_mrkdwn(markdown)
    # a raw "<" or ">" is a link or mention this wrote or kept, or a quote marker
    stray = re.sub(r"<[^<>\n]*>", "", out)
    stray = re.sub(r"^(?:[ \t]{0,3}>[ \t]?)+", "", stray, flags=re.MULTILINE)
    assert "<" not in stray and ">" not in stray


# --- split_text ---------------------------------------------------------------------------


def test_split_empty_and_whitespace_give_no_parts() -> None:
    assert split_text("") == []
    assert split_text(" \n\t\n ") == []


def test_split_returns_text_that_fits_unchanged() -> None:
    text = "  hello\n\nworld  "
    assert split_text(text, 100) == [text]


def test_split_rejects_a_limit_without_room_for_fences() -> None:
    with pytest.raises(ValueError, match="at least 16"):
        split_text("x" * 100, 15)


def test_split_prefers_paragraphs_then_lines_then_spaces_then_a_hard_cut() -> None:
    assert split_text("aaaa bbbb\ncccc\n\ndddd eeee", 20) == ["aaaa bbbb\ncccc", "dddd eeee"]
    assert split_text("aaaa bbbb\ncccc dddd eeee", 20) == ["aaaa bbbb", "cccc dddd eeee"]
    assert split_text("aaaa bbbb cccc dddd eeee", 20) == ["aaaa bbbb cccc", "dddd eeee"]
    assert split_text("x" * 30, 20) == ["x" * 16, "x" * 14]


def test_split_keeps_indentation_after_a_cut() -> None:
    assert split_text("aaaa bbbb cccc\n    dddd", 20) == ["aaaa bbbb cccc", "    dddd"]


def test_split_never_cuts_inside_a_link_or_an_entity() -> None:
    link = "<https://example.com/a|the label>"
    parts = split_text(f"words {link} more words and &amp; tail", 45)
    assert any(link in part for part in parts)
    parts = split_text("x" * 12 + " " + "&amp;" * 3, 16)
    assert all(re.fullmatch(r"[x ]*(&amp;)*", part) for part in parts)
    assert "".join(parts).count("&amp;") == 3


def test_split_closes_and_reopens_a_cut_code_block() -> None:
    code = "\n".join(f"line {n}" for n in range(8))
    parts = split_text(f"intro\n\n```\n{code}\n```\noutro", 40)
    assert parts[0].startswith("intro\n\n```\nline 0") and parts[0].endswith("\n```")
    assert all(part.startswith("```\n") for part in parts[1:-1])
    assert parts[-1].endswith("outro")
    assert all(part.count("```") % 2 == 0 for part in parts)


def test_split_does_not_post_a_first_line_alone() -> None:
    """The last paragraph break that fit was taken however early: "Sure!" was a message of its
    own before the rest (an outside probe). A break in the part's second half comes first."""
    body = "\n".join("word " * 10 for _ in range(100))
    parts = split_text("Sure!\n\n" + body, 3000)
    assert parts[0].startswith("Sure!\n\nword") and len(parts[0]) > 2900
    assert [len(p) for p in parts] == [2963, 2140]
    # an early break is still taken where nothing later fits
    assert split_text("Sure!\n\n" + "x" * 60, 40) == ["Sure!", "x" * 36, "x" * 24]


def test_split_takes_the_texts_own_closing_fence_rather_than_adding_one() -> None:
    parts = split_text("```\n" + "a" * 20 + "\n```\nnext words here", 32)
    assert parts == ["```\n" + "a" * 20 + "\n```", "next words here"]


def _normalized(text: str) -> str:
    return re.sub(r"\s", "", text.replace("```", ""))


def _balanced(text: str) -> str:
    return text if text.count("```") % 2 == 0 else text + "\n```"


split_alphabet = st.sampled_from(
    [
        "a",
        "b",
        "word",
        " ",
        "  ",
        "\n",
        "\n\n",
        "```",
        "`",
        "```py\n",
        "<http://x|l k>",
        "&amp;",
        "é",
    ]
)
split_texts = st.lists(split_alphabet, max_size=80).map("".join)


@FAST
@given(text=split_texts.map(_balanced), limit=st.integers(16, 90))
def test_split_properties(text: str, limit: int) -> None:
    parts = split_text(text, limit)
    assert all(len(part) <= limit for part in parts)
    assert all(part.strip() for part in parts)
    assert all(part.count("```") % 2 == 0 for part in parts)
    assert "".join(_normalized(part) for part in parts) == _normalized(text)


@FAST
@given(
    words=st.lists(
        st.sampled_from(["alpha", "be", "<https://x.io/p|a link>", "&amp;", "<@U1>", "\n", "\n\n"]),
        max_size=60,
    ),
    limit=st.integers(30, 80),
)
def test_split_keeps_every_link_mention_and_entity_whole(words: list[str], limit: int) -> None:
    text = " ".join(words)
    atom = r"<[^<>\n]*>|&amp;"
    parts = split_text(text, limit)
    assert [found for part in parts for found in re.findall(atom, part)] == re.findall(atom, text)


@FAST
@given(st.text(max_size=300), st.integers(16, 60))
def test_split_any_text(text: str, limit: int) -> None:
    parts = split_text(text, limit)
    assert all(len(part) <= limit and part.strip() for part in parts)
    assert "".join(_normalized(part) for part in parts) == _normalized(text)


def test_split_of_converted_markdown_renders_each_part() -> None:
    markdown = (
        "# Report\n\n" + "Some **bold** text & more. " * 40 + "\n\n```\n" + "x < y\n" * 50 + "```"
    )
    parts = split_text(to_mrkdwn(markdown), 300)
    assert len(parts) > 3
    assert all(len(part) <= 300 and part.count("```") % 2 == 0 for part in parts)


# --- fallback_text ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "*Deploy* <https://x|the build> to _prod_ &amp; <@U1>\nmore",
            "Deploy the build to prod &amp; <@U1>",
        ),
        ("\n\n• first item\n• second", "first item"),
        ("```\ncode line\n```", "code line"),
        ("> *quoted* `code`", "quoted code"),
        ("", ""),
    ],
)
def test_fallback_text(text: str, expected: str) -> None:
    assert fallback_text(text) == expected


def test_fallback_text_is_shortened_with_an_ellipsis_outside_entities() -> None:
    assert fallback_text("word " * 100, 30) == "word word word word word word…"
    short = fallback_text("ab " + "&amp;" * 20, 10)
    assert short.endswith("…") and len(short) <= 10
    assert re.fullmatch(r"ab (&amp;)*…", short)


# --- approval blocks ----------------------------------------------------------------------


def _call(n: int, args: dict[str, Any] | None = None, *, digest_size: int = 71) -> PendingCall:
    return PendingCall(
        tool_call_id=f"call_{n}",
        tool_name="deploy",
        args=args if args is not None else {"service": "api", "n": n},
        args_digest=("sha256:" + f"{n:x}" * 80)[:digest_size],
    )


def _view(*calls: PendingCall) -> ApprovalView:
    return ApprovalView(session="ops", run_id="run-1", wait_id="wait-1", calls=calls)


def _texts(blocks: list[Block]) -> list[str]:
    texts = []
    for block in blocks:
        if block["type"] == "section":
            texts.append(block["text"]["text"])
        elif block["type"] == "context":
            texts += [element["text"] for element in block["elements"]]
    return texts


def _actions(blocks: list[Block]) -> list[Block]:
    return [block for block in blocks if block["type"] == "actions"]


def test_approval_blocks_show_intro_calls_and_buttons() -> None:
    view = _view(_call(1), _call(2, {"note": "a < b & ```c```"}))
    blocks = approval_blocks(view, intro="I want to run *deploy* — approve?")
    assert blocks[0] == {
        "type": "section",
        "text": {"type": "mrkdwn", "text": "I want to run *deploy* — approve?"},
    }
    assert blocks[1]["text"]["text"] == '*deploy*\n```\n{\n  "n": 1,\n  "service": "api"\n}\n```'
    second = blocks[2]["text"]["text"]
    assert "a &lt; b &amp; " in second and second.count("```") == 2
    (actions,) = _actions(blocks)
    assert actions["block_id"] == APPROVAL_BLOCK_ID
    approve, deny, supply = actions["elements"]
    assert (approve["action_id"], approve["style"], approve["text"]["text"]) == (
        "approve",
        "primary",
        "Approve",
    )
    assert (deny["action_id"], deny["style"], deny["text"]["text"]) == ("deny", "danger", "Deny")
    assert (supply["action_id"], supply["text"]["text"]) == ("supply", "Done it myself")
    assert "style" not in supply  # a plain button: Slack knows only primary and danger
    assert approve["value"] == deny["value"] == supply["value"] == encode_decision_value(view)
    target = decode_decision_value(approve["value"])
    assert target == DecisionTarget(
        session="ops",
        run_id="run-1",
        wait_id="wait-1",
        calls=tuple((c.tool_call_id, c.args_digest) for c in view.calls),
    )
    assert target.decisions(approved=False, reason="no") == tuple(
        DecisionItem(
            tool_call_id=c.tool_call_id, args_digest=c.args_digest, approved=False, reason="no"
        )
        for c in view.calls
    )


def test_long_arguments_are_truncated_readably() -> None:
    args = {"lines": [f"line {n} " + "x" * 40 for n in range(200)]}
    blocks = approval_blocks(_view(_call(1, args)), intro="ok?", max_arg_chars=1500)
    text = blocks[1]["text"]["text"]
    assert len(text) <= SECTION_TEXT_LIMIT
    shown = json.dumps(args, indent=2)
    match = re.search(r"\n…\(truncated, (\d+) more characters\)\n```$", text)
    assert match is not None
    kept = text[len("*deploy*\n```\n") : match.start()]
    assert shown.startswith(kept) and len(kept) + int(match.group(1)) == len(shown)
    # what was cut was not seen, so it cannot be approved here (D52): Deny only, and how
    [actions] = _actions(blocks)
    assert [b["action_id"] for b in actions["elements"]] == [DENY_ACTION_ID]
    note = _texts(blocks)[-1]
    assert "cannot be approved from Slack" in note and "`gateway ops approve`" in note
    assert "session `ops`, run `run-1`, wait `wait-1`" in note


def test_arguments_that_fit_keep_every_button() -> None:
    args = {"lines": [f"line {n} " + "x" * 40 for n in range(50)]}  # 2,9xx characters: whole
    [actions] = _actions(approval_blocks(_view(_call(1, args)), intro="ok?"))
    assert len(actions["elements"]) == 3  # Approve, Deny, Done it myself


def test_format_characters_in_a_call_are_shown_not_obeyed() -> None:
    # a Trojan-Source argument: the override makes "rm -rf" read as a comment's tail
    args = {"command": "echo done \u202e\u2066// keep it safe\u2069 ;rm -rf /srv/data #"}
    call = _call(1, args).model_copy(update={"tool_name": "shell\u200b"})
    text = approval_blocks(_view(call), intro="ok?")[1]["text"]["text"]
    assert not any(c in text for c in "\u202e\u2066\u2069\u200b")
    assert text.startswith("*shell\\u200b*")
    assert "echo done \\u202e\\u2066// keep it safe\\u2069 ;rm -rf /srv/data #" in text


def test_too_many_calls_are_counted_and_cannot_be_decided_from_slack() -> None:
    calls = [_call(n, digest_size=8) for n in range(60)]
    blocks = approval_blocks(_view(*calls), intro="ok?")
    assert len(blocks) == MAX_BLOCKS - 1  # room is kept for buttons and a note beside them
    assert not _actions(blocks)
    texts = _texts(blocks)
    assert "…and 14 more calls." in texts
    assert "too large to decide from Slack" in texts[-1] and "operator API" in texts[-1]


def test_a_batch_whose_value_is_too_long_has_no_buttons() -> None:
    view = _view(*(_call(n) for n in range(25)))
    with pytest.raises(ValueError, match="2000"):
        encode_decision_value(view)
    blocks = approval_blocks(view, intro="ok?")
    assert not _actions(blocks)
    assert "decide it with the operator API (run `run-1`, wait `wait-1`)" in _texts(blocks)[-1]
    assert len(blocks) == 1 + 25 + 1


def test_a_batch_without_calls_has_nothing_to_decide() -> None:
    blocks = approval_blocks(_view(), intro="")
    assert blocks == [
        {
            "type": "context",
            "elements": [{"type": "mrkdwn", "text": "There is nothing to decide in this request."}],
        }
    ]
    with pytest.raises(ValueError, match="without calls"):
        encode_decision_value(_view())


@FAST
@given(
    calls=st.integers(0, 60),
    arg_text=st.text(max_size=20),
    repeat=st.integers(0, 400),
    intro=st.text(max_size=4000),
    max_arg_chars=st.integers(1, 4000),
    digest_size=st.integers(8, 80),
)
def test_approval_blocks_stay_within_slack_limits(
    calls: int, arg_text: str, repeat: int, intro: str, max_arg_chars: int, digest_size: int
) -> None:
    args = {"text": arg_text * repeat, "list": [arg_text] * (repeat // 20), "n": repeat}
    view = _view(*(_call(n, args, digest_size=digest_size) for n in range(calls)))
    blocks = approval_blocks(view, intro=intro, max_arg_chars=max_arg_chars)
    assert len(blocks) <= MAX_BLOCKS
    assert all(0 < len(text) <= SECTION_TEXT_LIMIT for text in _texts(blocks))
    for actions in _actions(blocks):
        for button in actions["elements"]:
            assert len(button["value"]) <= BUTTON_VALUE_LIMIT
            target = decode_decision_value(button["value"])
            assert target.calls == tuple((c.tool_call_id, c.args_digest) for c in view.calls)


GARBAGE = [
    ("not-json", "approve"),
    ("a-list", "[1, 2]"),
    ("a-string", '"s"'),
    ("empty-object", "{}"),
    ("missing-key", '{"v":1,"s":"a","r":"b","c":[["x","y"]]}'),
    ("extra-key", '{"v":1,"s":"a","r":"b","w":"c","c":[["x","y"]],"z":1}'),
    ("wrong-version", '{"v":2,"s":"a","r":"b","w":"c","c":[["x","y"]]}'),
    ("bool-version", '{"v":true,"s":"a","r":"b","w":"c","c":[["x","y"]]}'),
    ("number-id", '{"v":1,"s":1,"r":"b","w":"c","c":[["x","y"]]}'),
    ("empty-id", '{"v":1,"s":"","r":"b","w":"c","c":[["x","y"]]}'),
    ("control-character", '{"v":1,"s":"a\\u0000","r":"b","w":"c","c":[["x","y"]]}'),
    ("lone-surrogate", '{"v":1,"s":"a","r":"b","w":"c","c":[["\\ud800","y"]]}'),
    ("calls-not-list", '{"v":1,"s":"a","r":"b","w":"c","c":"x"}'),
    ("no-calls", '{"v":1,"s":"a","r":"b","w":"c","c":[]}'),
    ("pair-of-three", '{"v":1,"s":"a","r":"b","w":"c","c":[["x","y","z"]]}'),
    ("pair-not-strings", '{"v":1,"s":"a","r":"b","w":"c","c":[["x",1]]}'),
    ("duplicate-call", '{"v":1,"s":"a","r":"b","w":"c","c":[["x","y"],["x","z"]]}'),
    ("huge", '{"v":1,"s":"' + "a" * 3000 + '","r":"b","w":"c","c":[["x","y"]]}'),
    ("deep", "[" * 1999),
    ("nan", "NaN"),
]


@pytest.mark.parametrize("value", [g[1] for g in GARBAGE], ids=[g[0] for g in GARBAGE])
def test_decode_rejects_garbage(value: str) -> None:
    with pytest.raises(ValueError, match="decision value"):
        decode_decision_value(value)


def test_decode_rejects_a_value_that_is_not_a_string() -> None:
    with pytest.raises(ValueError, match="must be a string"):
        decode_decision_value(None)  # type: ignore[arg-type]


@FAST
@given(st.text(max_size=300))
def test_decode_raises_only_value_error(value: str) -> None:
    with contextlib.suppress(ValueError):
        decode_decision_value(value)


# --- after the decision; modal; failures --------------------------------------------------

DECIDED_AT = int(datetime(2026, 12, 1, 14, 3, 27, tzinfo=UTC).timestamp() * 1000)


def test_decided_blocks_show_who_and_when_without_buttons() -> None:
    blocks = decided_blocks(
        "I want to run *deploy* — approve?",
        approved=True,
        decided_by="U123",
        decided_at_ms=DECIDED_AT,
        reason=None,
    )
    assert not _actions(blocks)
    assert _texts(blocks) == [
        "I want to run *deploy* — approve?",
        "✅ Approved by <@U123> at 2026-12-01 14:03 UTC",
    ]


def test_denied_blocks_show_the_reason_escaped_and_shortened() -> None:
    blocks = decided_blocks(
        "ok?",
        approved=False,
        decided_by="U0G9QF9C6",
        decided_at_ms=DECIDED_AT,
        reason="too <risky> & late\n" * 100,
    )
    note = _texts(blocks)[-1]
    assert note.startswith("❌ Denied by <@U0G9QF9C6> at 2026-12-01 14:03 UTC — reason: ")
    assert note.split(" — reason: ")[1].startswith("too &lt;risky&gt; &amp; late too &lt;")
    assert note.endswith("…") and "\n" not in note
    reason = note.split(" — reason: ")[1]
    assert len(reason.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")) == 500


def test_decided_by_a_name_is_escaped_and_a_long_request_stays_within_50_blocks() -> None:
    blocks = decided_blocks(
        "word " * 40_000, approved=True, decided_by="ops <bot>", decided_at_ms=0, reason=""
    )
    assert len(blocks) == MAX_BLOCKS
    assert _texts(blocks)[-1] == "✅ Approved by ops &lt;bot&gt; at 1970-01-01 00:00 UTC"


def test_deny_reason_modal() -> None:
    view = deny_reason_modal('{"v":1}')
    assert view["type"] == "modal" and view["callback_id"] == "deny_reason"
    assert [view[key]["text"] for key in ("title", "submit", "close")] == ["Deny", "Deny", "Cancel"]
    assert view["private_metadata"] == '{"v":1}'
    (block,) = view["blocks"]
    assert (block["block_id"], block["optional"]) == ("reason", True)
    element = block["element"]
    assert (element["type"], element["action_id"], element["multiline"], element["max_length"]) == (
        "plain_text_input",
        "reason",
        True,
        500,
    )
    assert len(json.dumps(view)) < 3000
    deny_reason_modal("m" * 3000)
    with pytest.raises(ValueError, match="3000"):
        deny_reason_modal("m" * 3001)


def test_failure_blocks() -> None:
    assert failure_blocks("The run **failed**: <timeout>") == [
        {
            "type": "context",
            "elements": [{"type": "mrkdwn", "text": "⚠️ The run *failed*: &lt;timeout&gt;"}],
        }
    ]
    (block,) = failure_blocks("x " * 5000)
    assert len(block["elements"][0]["text"]) <= SECTION_TEXT_LIMIT


AT = 1_796_256_000_000  # 2026-12-03 00:00 UTC


@pytest.mark.parametrize(
    ("outcome", "by", "reason", "note"),
    [
        ("approved", "U0AAA9", None, "✅ Approved by <@U0AAA9> at 2026-12-03 00:00 UTC"),
        (
            "denied",
            "U0AAA9",
            "not  today",
            "❌ Denied by <@U0AAA9> at 2026-12-03 00:00 UTC — reason: not today",
        ),
        (
            "approved",
            "operator:alice",
            None,
            "✅ Approved by operator:alice at 2026-12-03 00:00 UTC",
        ),
        (
            "decided",
            "U0AAA9",
            None,
            "☑️ Decided by <@U0AAA9> at 2026-12-03 00:00 UTC: some calls approved, some denied",
        ),
        ("stopped", "U0AAA7", None, "⏹️ Closed: stopped by <@U0AAA7> at 2026-12-03 00:00 UTC"),
        ("stopped", None, None, "⏹️ Closed: stopped at 2026-12-03 00:00 UTC"),
        ("ended", None, None, "⏹️ Closed at 2026-12-03 00:00 UTC: the run ended"),
        (
            "approved",
            "<!channel> & co",
            None,
            "✅ Approved by &lt;!channel&gt; &amp; co at 2026-12-03 00:00 UTC",
        ),
    ],
)
def test_a_closed_request_says_how_who_and_when(
    outcome: Any, by: str | None, reason: str | None, note: str
) -> None:
    assert close_note(outcome, by=by, at_ms=AT, reason=reason) == note
    blocks = closed_blocks("*deploy* prod", note)
    assert [b["type"] for b in blocks] == ["section", "context"]  # its words, no buttons
    assert blocks[-1]["elements"][0]["text"] == note


# --- to_mrkdwn: what the one parse changed (D175) -----------------------------------------

PARSED = [
    ("js-link-stays-text", "[x](javascript:alert(1))", "[x](javascript:alert(1))"),
    ("relative-link-stays-text", "[t](/a/b)", "[t](/a/b)"),
    ("ftp-autolink-stays-text", "<ftp://x.example/f>", "&lt;ftp://x.example/f&gt;"),
    ("entities-decoded", "&amp; &copy; &#42;", "&amp; © *"),
    ("indented-code-as-written", "    **code** <x>", "    **code** &lt;x&gt;"),
    ("setext-over-lines", "a\nb\n---", "*a b*"),
    (
        "bare-url-as-written",
        "https://x.example/a_b_c?d=1&e=2.",
        "https://x.example/a_b_c?d=1&amp;e=2.",
    ),
    ("quoted-fence", "> ```\n> x < y\n> ```", "> ```\n> x &lt; y\n> ```"),
    ("quote-in-item", "- > q", "• &gt; q"),
    ("code-span-over-lines", "a `b\nc` d\ne", "a `b c` d\ne"),
]


@pytest.mark.parametrize(
    ("markdown", "expected"), [c[1:] for c in PARSED], ids=[c[0] for c in PARSED]
)
def test_to_mrkdwn_follows_commonmark(markdown: str, expected: str) -> None:
    assert to_mrkdwn(markdown) == expected
