r"""A person's text kept within a channel's limit, with a `TextCut` saying what was left out.

The limit counts characters as Python does (code points): what a person wrote, however many
bytes each takes. A cut never splits what shows as one character (an accented letter written
as a letter and a combining mark, an emoji sequence, a flag): it ends at the last boundary of
Unicode's extended grapheme clusters (UAX #29, the `regex` module's ``\X``) at or before the
limit, so the agent never reads half a character (decision D169).
"""

from __future__ import annotations

import regex  # type: ignore[import-untyped]

from adapters.channel import TextCut

__all__ = ["keep_within"]

_GRAPHEME = regex.compile(r"\X")


def keep_within(text: str, limit: int) -> tuple[str, TextCut | None]:
    """`text` as it is when it fits in `limit` characters; else its start, and what was cut."""
    if len(text) <= limit:
        return text, None
    end = 0
    # whether a boundary falls at `limit` depends on the characters up to it and the one after
    # (the rules look back, never further ahead): the search ends there
    for cluster in _GRAPHEME.finditer(text, 0, limit + 1):
        if cluster.end() > limit:
            break
        end = cluster.end()
    end = end or limit  # one "character" longer than the limit (hostile text): cut it anyway
    return text[:end], TextCut(kept=end, total=len(text))
