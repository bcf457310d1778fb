"""A person's text kept within a limit: never half a character, and the cut counted (D169)."""

from __future__ import annotations

import pytest
import regex  # type: ignore[import-untyped]
from hypothesis import given
from hypothesis import strategies as st

from adapters.text_cut import keep_within

FAMILY = "\U0001f468\u200d\U0001f469\u200d\U0001f467"  # one emoji of five code points
FLAG = "\U0001f1e9\U0001f1ea"  # a flag: two regional indicators

# (case, text, limit, the text kept, (kept, total) or None)
CUTS: list[tuple[str, str, int, str, tuple[int, int] | None]] = [
    ("empty", "", 5, "", None),
    ("under", "abcd", 5, "abcd", None),
    ("at", "abcde", 5, "abcde", None),
    ("over", "abcdef", 5, "abcde", (5, 6)),
    ("accented-at", "ééééé", 5, "ééééé", None),
    ("cjk-over", "日本語のテキスト", 5, "日本語のテ", (5, 8)),
    ("emoji-over", "😀" * 6, 5, "😀" * 5, (5, 6)),
    ("combining-mark-at-the-limit", "abcde\u0301f", 5, "abcd", (4, 7)),
    ("combining-mark-after-the-limit", "abcd\u0301ef", 5, "abcd\u0301", (5, 7)),
    ("zwj-emoji-straddling", "abc" + FAMILY, 5, "abc", (3, 8)),
    ("flag-straddling", "abcd" + FLAG, 5, "abcd", (4, 6)),
    ("flags-paired-not-split", FLAG * 3, 5, FLAG * 2, (4, 6)),
    ("crlf", "abcd\r\nx", 5, "abcd", (4, 7)),
    ("one-cluster-over-the-limit", "e" + "\u0301" * 10, 5, "e" + "\u0301" * 4, (5, 11)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "limit", "kept", "cut"), [c[1:] for c in CUTS], ids=[c[0] for c in CUTS]
)
def test_a_cut_never_splits_a_character(
    text: str, limit: int, kept: str, cut: tuple[int, int] | None
) -> None:
    got, said = keep_within(text, limit)
    assert got == kept
    assert (None if said is None else (said.kept, said.total)) == cut


@given(st.text(max_size=60), st.integers(min_value=1, max_value=40))
def test_what_is_kept_is_whole_characters_from_the_start(text: str, limit: int) -> None:
    got, said = keep_within(text, limit)
    assert text.startswith(got) and len(got) <= limit
    if said is None:
        assert got == text
        return
    assert (said.kept, said.total) == (len(got), len(text))
    clusters = regex.findall(r"\X", text)
    whole = regex.findall(r"\X", got)
    if clusters and len(clusters[0]) <= limit:  # else one cluster alone is over: cut anyway
        assert whole == clusters[: len(whole)]
