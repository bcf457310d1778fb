"""`SessionNews`: per-session news positions, bounded, and waiters woken only by their session."""

from __future__ import annotations

import gc

from gateway.broker.news import SessionNews


async def test_news_of_one_session_wakes_only_its_waiters() -> None:
    news = SessionNews()
    mine, other = news.waiter("s1"), news.waiter("s2")
    assert news.waiter("s1") is mine  # every holder of s1 waits on the one event
    news.note("s2", 1)
    assert other.is_set() and not mine.is_set()
    assert news.since("s2", 0) and not news.since("s1", 0)
    assert news.waiter("s2") is not other  # a fresh event for the next news
    news.note("s1", 2)
    assert mine.is_set() and news.since("s1", 1) and not news.since("s1", 2)


async def test_past_its_cap_the_record_is_cleared_and_every_waiter_woken() -> None:
    news = SessionNews(cap=2)
    news.note("a", 1)
    news.note("b", 2)
    waiting = news.waiter("c")
    news.note("d", 3)  # a third session: a and b are forgotten
    assert waiting.is_set()  # what it waited for may have happened unseen
    assert news.since("a", 1) and news.since("z", 1)  # every position before the clear is news
    assert not news.since("a", 2) and news.since("d", 2)


async def test_an_event_nobody_waits_on_is_not_kept() -> None:
    news = SessionNews()
    for n in range(100):
        news.waiter(f"s{n}")
    gc.collect()
    kept = news.waiter("s0")
    assert not kept.is_set()
    assert len(news._waiters) == 1  # the others went with their last waiter
