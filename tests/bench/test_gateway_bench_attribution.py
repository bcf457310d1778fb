"""The gateway bench attributes each reply to the messages it answers, as the lane took them.

CI once read a message as unanswered that was answered: two messages of a thread posted at once
were held by the inbox the other way round from the thread (the thread first, then the inbox:
D162), and the reply said "You said: s94 / You said: s88". The bench took the last echo as the
newest message and left s94 unanswered.
"""

from __future__ import annotations

from adapters.web.mailbox import WebItem
from bench.gateway_bench import Msg, attribute


def _message(seq: int, key: str) -> WebItem:
    return WebItem(kind="message", id=key, text=key, at_ms=1_000 + seq, seq=seq)


def _reply(seq: int, text: str) -> WebItem:
    return WebItem(kind="reply", id=f"reply:s:r{seq}", text=text, at_ms=2_000 + seq, seq=seq)


def _posted(*keys: str) -> list[Msg]:
    return [Msg(key, "s0", "t4", order, accepted_ms=1.0) for order, key in enumerate(keys, 1)]


def test_a_reply_answering_two_messages_the_other_way_round_answers_both() -> None:
    msgs = _posted("s88", "s94")
    items = [_message(17, "s88"), _message(18, "s94"), _reply(19, "You said: s94\n\nYou said: s88")]
    attribute(items, msgs)
    assert [(m.key, m.answered_ms, m.merged) for m in msgs] == [
        ("s88", 2_019.0, True),
        ("s94", 2_019.0, False),  # the latest in the thread it names: its own reply
    ]
    assert msgs[1].reply_id == "reply:s:r19"


def test_a_steered_message_is_answered_by_the_reply_naming_a_later_one_and_no_more() -> None:
    msgs = _posted("s4", "s10", "s16")
    items = [
        _message(3, "s4"),
        _message(4, "s10"),
        _message(5, "s16"),
        _reply(6, "You said: s10"),  # s4 was steered into the run that answered s10
    ]
    attribute(items, msgs)
    assert [m.answered_ms for m in msgs] == [2_006.0, 2_006.0, 0.0]  # s16 waits for its own
    assert [m.merged for m in msgs] == [True, False, False]


def test_a_reply_naming_no_message_of_the_plan_answers_nothing() -> None:
    msgs = _posted("l1")
    attribute([_message(9, "l1"), _reply(10, "You said: w1"), _reply(11, "the run failed")], msgs)
    assert msgs[0].answered_ms == 0.0 and msgs[0].seq == 9
