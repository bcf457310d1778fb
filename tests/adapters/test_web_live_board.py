"""The web channel's live board: what it keeps per thread stays bounded, and no wake is lost."""

from __future__ import annotations

import asyncio

from adapters.channel import ThreadRef
from adapters.live import LiveUpdate
from adapters.web.live import LiveBoard


def _text(thread: str, text: str) -> LiveUpdate:
    ref = ThreadRef(channel="web", space="default", thread=thread)
    return LiveUpdate(thread=ref, run_id="r1", kind="text", text=text, offset=0)


async def test_the_signals_of_many_threads_are_bounded_and_a_let_go_one_wakes() -> None:
    """A stream of each of 20,000 thread names left a signal apiece that nothing freed."""
    board = LiveBoard(max_threads=10)
    first = board.signal("default", "t0")
    for n in range(1, 1000):
        board.signal("default", f"t{n}")
    assert len(board._signals) == 10
    assert first.is_set()  # let go: its stream looks again rather than wait for nothing
    newest = board.signal("default", "t999")
    assert not newest.is_set()
    board.show(_text("t999", "hello"))
    await asyncio.sleep(0)
    assert newest.is_set()  # a change still wakes the thread's streams
