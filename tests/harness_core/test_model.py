"""The session model on its own: ids, frozen JSON, message and record shapes, the codec."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from harness_core.errors import SessionError, StoreCorrupted
from harness_core.frozen import FrozenDict, freeze_json, thaw_json
from harness_core.ids import SequentialIds, Uuid7Ids
from harness_core.messages import AssistantMessage, DeferredHandle, TokenUsage
from harness_core.session.codec import decode_entry, decode_log_item, encode_entry, encode_record
from harness_core.session.records import StepAttempt, Usage
from harness_core.testing import ManualClock
from harness_core.testing.builders import custom_entry, user_entry

UUID7 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def test_uuid7_ids_are_well_formed_and_sorted_in_creation_order() -> None:
    clock = ManualClock()
    ids = Uuid7Ids(clock)
    made = []
    for step in range(3000):
        made.append(ids.next())
        if step % 1000 == 999:
            clock.advance(1)
    assert all(UUID7.match(i) for i in made)
    assert made == sorted(made) and len(set(made)) == len(made)
    assert int(made[0].replace("-", "")[:12], 16) == clock.now_ms() - 3


def test_uuid7_counter_overflow_keeps_the_order() -> None:
    bits = iter([0xFFF - 1, *range(10**6)])
    ids = Uuid7Ids(ManualClock(), random_bits=lambda n: next(bits) & ((1 << n) - 1))
    made = [ids.next() for _ in range(5)]
    assert made == sorted(made)


def test_sequential_ids_are_deterministic() -> None:
    ids = SequentialIds("e", start=7)
    assert [ids.next(), ids.next()] == ["e7", "e8"]


def test_freeze_sorts_keys_tuples_lists_and_thaws_back() -> None:
    frozen = freeze_json({"b": [1, {"d": 2, "c": None}], "a": 1.5})
    assert list(frozen) == ["a", "b"] and isinstance(frozen, FrozenDict)
    assert frozen["b"] == (1, {"c": None, "d": 2})
    assert thaw_json(frozen) == {"a": 1.5, "b": [1, {"c": None, "d": 2}]}
    with pytest.raises(TypeError):
        frozen["a"] = 2
    with pytest.raises(TypeError):
        frozen.update({})


@pytest.mark.parametrize(
    "bad",
    [float("nan"), float("-inf"), {1: 2}, {"s": {1}}, b"x", object()],
    ids=["nan", "inf", "int key", "set", "bytes", "object"],
)
def test_freeze_refuses_what_is_not_json(bad) -> None:
    with pytest.raises(ValueError, match="JSON"):
        freeze_json(bad)


def test_freeze_refuses_cycles_and_deep_nesting() -> None:
    cyclic: list[object] = []
    cyclic.append(cyclic)
    with pytest.raises(ValueError, match="deeper than"):
        freeze_json(cyclic)


def test_a_deferred_handle_exactly_when_deferred() -> None:
    handle = DeferredHandle(provider="openai", model="gpt", id="resp_1")
    AssistantMessage(stop_reason="deferred", deferred=handle)
    with pytest.raises(ValidationError):
        AssistantMessage(stop_reason="deferred")
    with pytest.raises(ValidationError):
        AssistantMessage(stop_reason="stop", deferred=handle)


def test_usage_records_carry_exactly_their_causes_fields() -> None:
    Usage(
        id="u",
        lane="main",
        cause="assistant",
        run_id="r",
        entry_id="e",
        attempt=1,
        stop_reason="stop",
        usage=TokenUsage(),
    )
    with pytest.raises(ValidationError, match="needs attempt"):
        Usage(
            id="u",
            lane="main",
            cause="assistant",
            run_id="r",
            entry_id="e",
            stop_reason="stop",
            usage=TokenUsage(),
        )
    with pytest.raises(ValidationError, match="must not carry tool_call_id"):
        Usage(
            id="u",
            lane="main",
            cause="hook",
            run_id="r",
            entry_id="e",
            tool_call_id="c",
            usage=TokenUsage(),
        )
    Usage(
        id="u",
        lane="main",
        cause="adjustment",
        usage=TokenUsage(input=-3),
        details={"why": "refund"},
    )


def test_shapes_the_reducer_judges_still_decode() -> None:
    # compaction_reason on an assistant step is corruption for the reducer to name,
    # not a decode error
    StepAttempt(
        id="a",
        lane="main",
        run_id="r",
        step="assistant",
        attempt=1,
        result_entry_id="e",
        compaction_reason="manual",
    )
    with pytest.raises(ValidationError):
        StepAttempt(
            id="a", lane="main", run_id="r", step="assistant", attempt=0, result_entry_id="e"
        )


def test_ids_and_lanes_refuse_whitespace_and_controls() -> None:
    with pytest.raises(ValidationError):
        user_entry("has space")
    with pytest.raises(ValidationError):
        Usage(id="u", lane="bad\tlane", cause="adjustment", usage=TokenUsage())


def test_the_codec_is_canonical_and_refuses_what_it_cannot_encode() -> None:
    assert encode_entry(custom_entry("x", data={"b": 1, "a": 2})) == encode_entry(
        custom_entry("x", data={"a": 2, "b": 1})
    )
    with pytest.raises(SessionError) as caught:
        encode_entry(user_entry("x", "\ud800"))
    assert caught.value.code == "invalid_payload"
    with pytest.raises(SessionError):
        encode_entry({"id": "x"})  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_the_codec_refuses_a_non_finite_number_that_skipped_validation(bad: float) -> None:
    usage = TokenUsage(output=1)
    usage = usage.model_copy(update={"cost": usage.cost.model_copy(update={"total": bad})})
    with pytest.raises(SessionError) as caught:
        encode_record(Usage(id="u", lane="main", cause="adjustment", usage=usage))
    assert caught.value.code == "invalid_payload"
    assert "non-finite" in str(caught.value)


def test_the_words_nan_and_infinity_in_text_are_stored_as_text() -> None:
    entry = custom_entry("x", data={"note": "NaN", "more": "-Infinity and NaN"})
    assert decode_entry(encode_entry(entry), "here") == entry


def test_decoding_garbage_names_where_it_was() -> None:
    with pytest.raises(StoreCorrupted) as caught:
        decode_log_item('{"kind":"entry","seq":0}', "somewhere:3")
    assert caught.value.location == "somewhere:3"
