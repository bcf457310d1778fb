"""What a thread is told when its run fails: whether asking again can help, in words (D312).

Every failure ended "You can ask again; an operator can retry it.", a revoked key and a
conversation past the model's window included, where asking again fails the same way.
"""

from __future__ import annotations

import pytest

from gateway.replies import failure_text
from harness_core.session.records import OperationError


@pytest.mark.parametrize(
    ("code", "said"),
    [
        ("auth", "the model provider refused the gateway's key"),
        ("context_overflow", "start a new thread to go on"),
        ("rate_limit", "quota is used up"),
        ("invalid_request", "refused the request as it was"),
        ("content_filter", "declined to answer this"),
    ],
)
def test_a_failure_asking_again_cannot_mend_says_what_can(code: str, said: str) -> None:
    text = failure_text(OperationError(code=code, message="the provider's words"))
    assert said in text and f"({code})" in text
    assert "ask again;" not in text and "the provider's words" not in text


def test_a_failure_that_may_pass_invites_asking_again() -> None:
    text = failure_text(OperationError(code="retries_exhausted", message="HTTP 503"))
    assert text == (
        "Sorry, I could not finish this (retries_exhausted). You can ask again; an operator "
        "can retry it."
    )
