"""Every rule for a name says what it takes: a rule that refuses ``é`` says "ASCII letters".

The web channel's thread-name rule said "letters" and refused ``é`` (issue 24, item 20). Each
rule here is checked against names in and out of ASCII: a name it takes, or a refusal whose
message names the rule truthfully (D165). A new rule is one line in `RULES`, a new name one line
in `NAMES`.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pydantic import ValidationError

from adapters.web.mailbox import normal_name
from config.settings import Route
from harness_core import SessionError
from harness_core.session.names import check_session_id

RULES: list[tuple[str, Callable[[str], object]]] = [
    ("web thread", lambda name: normal_name(name, "thread")),
    ("web space", lambda name: normal_name(name, "space")),
    ("session id", check_session_id),
    ("a route's session", lambda name: Route(channel="web", space="*", session=name)),
]

NAMES = ["plain-1", "café", "e\u0301quipe", "日本", "привет", "a b", ""]


def _refusal(rule: Callable[[str], object], name: str) -> str | None:
    try:
        rule(name)
    except (ValueError, SessionError, ValidationError) as exc:
        return str(exc)
    return None


@pytest.mark.parametrize(("what", "rule"), RULES, ids=[what for what, _ in RULES])
@pytest.mark.parametrize("name", NAMES)
def test_a_rule_says_what_it_takes(what: str, rule: Callable[[str], object], name: str) -> None:
    said = _refusal(rule, name)
    takes_non_ascii = _refusal(rule, "café") is None
    if said is None:
        assert name.isascii() or takes_non_ascii, (what, name)
        return
    assert "letters" in said, (what, said)
    if takes_non_ascii:
        assert "ASCII" not in said and "any script" in said, (what, said)
    else:
        assert "ASCII letters" in said, (what, said)
