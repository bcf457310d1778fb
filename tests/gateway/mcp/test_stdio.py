"""The bounded stdio reader: lines found once each, a line too long dropped as it comes."""

from __future__ import annotations

import json

import mcp_types as types
import pytest
from mcp.shared.message import SessionMessage

from gateway.mcp.stdio import (
    MAX_BLOCKS,
    TOO_LARGE_CODE,
    TooLarge,
    _Lines,
    _Long,
    bound_blocks,
    read_message,
)

LIMIT = 1024 * 1024


def _answer(ident: int, text: str) -> bytes:
    return json.dumps(
        {"jsonrpc": "2.0", "id": ident, "result": {"content": [{"type": "text", "text": text}]}}
    ).encode()


def _fed(lines: _Lines, data: bytes, size: int) -> list[SessionMessage | Exception | _Long]:
    found: list[SessionMessage | Exception | _Long] = []
    for at in range(0, len(data), size):
        found.extend(lines.feed(data[at : at + size]))
    return found


def test_messages_split_across_chunks_and_packed_in_one_are_each_read() -> None:
    """A character cut between two chunks, many messages in one, blank lines between."""
    wire = b"\n".join([_answer(1, "caf\u00e9 \u2603"), b"", b"  ", _answer(2, "two")]) + b"\n"
    for size in (1, 3, 7, len(wire)):
        found = _fed(_Lines(LIMIT), wire, size)
        assert [type(item) for item in found] == [SessionMessage, SessionMessage], size
        first = found[0]
        assert isinstance(first, SessionMessage)
        assert isinstance(first.message, types.JSONRPCResponse)
        assert first.message.result["content"][0]["text"] == "caf\u00e9 \u2603"


def test_a_line_that_is_no_message_is_its_error_and_the_next_is_read() -> None:
    found = _Lines(LIMIT).feed(b"\xff\xfe a stray print\n" + _answer(3, "ok") + b"\n")
    assert isinstance(found[0], ValueError) and isinstance(found[1], SessionMessage)


def test_a_line_too_long_is_kept_only_to_its_head_and_answers_its_request() -> None:
    """The SDK's reader kept all of it (and joined and split it again with every chunk)."""
    lines = _Lines(LIMIT)
    wire = _answer(41, "z" * (5 * LIMIT)) + b"\n" + _answer(42, "next") + b"\n"
    found: list[SessionMessage | Exception | _Long] = []
    most = 0
    for at in range(0, len(wire), 65536):
        found.extend(lines.feed(wire[at : at + 65536]))
        most = max(most, len(lines._kept))
    assert most <= LIMIT  # never more than the limit held, however long the line
    [cut, after] = found
    assert isinstance(cut, SessionMessage) and isinstance(cut.message, types.JSONRPCError)
    assert cut.message.id == 41 and cut.message.error.code == TOO_LARGE_CODE
    assert cut.message.error.message.startswith("its answer (5.0 MiB) is larger than the 1 MiB")
    assert isinstance(after, SessionMessage) and after.message.id == 42  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "head",
    [
        # the id after the result: the head cannot say which request it answers
        b'{"jsonrpc": "2.0", "result": {"id": 7, "content": [{"type": "text", "text": "',
        # a request or notification of the server's own, not an answer
        b'{"jsonrpc": "2.0", "id": 8, "method": "notifications/message", "params": {"data": "',
        # no JSON at all
        b"Traceback (most recent call last): " + b"x" * 100,
    ],
)
def test_a_line_too_long_that_names_no_request_is_one_unreadable_message(head: bytes) -> None:
    lines = _Lines(LIMIT)
    found = _fed(lines, head + b"w" * (2 * LIMIT) + b'"}]}}\n' + _answer(9, "ok") + b"\n", 4096)
    [cut, after] = found
    assert isinstance(cut, TooLarge) and "a message (2.0 MiB) of more than" in str(cut)
    assert isinstance(after, SessionMessage)


def test_a_long_line_is_left_to_a_thread_and_many_blocks_are_joined_and_bounded() -> None:
    """450,000 one-letter blocks held the event loop 4.6 s in the SDK's validation."""
    blocks = [{"type": "text", "text": "c"} for _ in range(450_000)]
    blocks[10] = {"type": "image", "data": "aGk=", "mimeType": "image/png"}
    wire = json.dumps({"jsonrpc": "2.0", "id": 7, "result": {"content": blocks}}).encode()
    [long] = _Lines(MAX_BLOCKS * 1024 * 1024).feed(wire + b"\n")
    assert isinstance(long, _Long)  # over 1 MiB: parsed off the event loop
    parsed = read_message(long.text)
    assert isinstance(parsed, SessionMessage)
    assert isinstance(parsed.message, types.JSONRPCResponse)
    content = parsed.message.result["content"]
    assert content == [
        {"type": "text", "text": "\n".join("c" * 10)},  # one per line: the blocks were apart
        blocks[10],
        {"type": "text", "text": "\n".join("c" * (450_000 - 11))},
    ]
    many = [{"type": "image", "data": "aGk=", "mimeType": "image/png"}] * (MAX_BLOCKS + 5)
    line = json.dumps({"jsonrpc": "2.0", "id": 8, "result": {"content": many}})
    cut = read_message(line)
    assert isinstance(cut, SessionMessage) and isinstance(cut.message, types.JSONRPCResponse)
    kept = cut.message.result["content"]
    assert len(kept) == MAX_BLOCKS
    assert kept[-1] == {
        "type": "text",
        "text": "[6 more content blocks of this result were left out]",
    }


def test_an_answer_read_by_the_sdk_is_bounded_as_it_is_heard() -> None:
    """An HTTP server's answer is read by the SDK itself: it is bounded where it is heard."""
    blocks = [{"type": "text", "text": "c"} for _ in range(5_000)]
    answer = types.JSONRPCResponse(jsonrpc="2.0", id=3, result={"content": blocks})
    bound_blocks(answer)
    assert answer.result["content"] == [{"type": "text", "text": "\n".join("c" * 5_000)}]
    few = types.JSONRPCResponse(jsonrpc="2.0", id=4, result={"content": blocks[:3]})
    bound_blocks(few)
    assert len(few.result["content"]) == 3  # at most MAX_BLOCKS: left as they came
