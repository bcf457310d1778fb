"""The web mailbox conformance suite: runner-independent checks every `WebMailbox` passes.

A test module builds a `MailboxFixture` (a fresh, empty mailbox) and runs each `MailboxCase`
with its own fixture (pytest: parametrize over `mailbox_cases()`). Each case checks one rule of
`adapters.web.mailbox`'s docstrings; a case that fails is the backend's bug (or the contract's,
to be fixed there first). A backend of a plugin runs the same cases in its own tests.

Waits are real (the mailbox has no clock: an item's time is given by its appender); a case
that checks a wait gives it a few real seconds at most.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from adapters.channel import ApprovalView, Author, DecisionItem, PendingCall
from adapters.web.mailbox import NewWebItem, WebDecision, WebMailbox

__all__ = ["MailboxCase", "MailboxFixture", "mailbox_cases"]

REAL_TIMEOUT_S = 5.0
"""How long (real seconds) a wake-up may take before a case fails."""
PAUSE_S = 0.1
"""The real pause after which a wait that should still be waiting must not have returned."""


@dataclass(frozen=True, kw_only=True)
class MailboxFixture:
    """What a case needs from a mailbox under test."""

    name: str
    mailbox: WebMailbox
    """A fresh mailbox with no threads."""
    open_another: Callable[[], Awaitable[WebMailbox]] | None = None
    """Another mailbox over the same durable data, as a second process (or the next start of
    this one) would open it; the fixture closes it. None for a backend that keeps nothing
    (memory): the durability cases then pass without checking anything."""


@dataclass(frozen=True)
class MailboxCase:
    """One backend-neutral check."""

    group: str
    name: str
    run: Callable[[MailboxFixture], Awaitable[None]]

    @property
    def id(self) -> str:
        """A stable test id."""
        return f"{self.group}:{self.name}"


_CASES: list[MailboxCase] = []


def _case(group: str) -> Callable[[Callable[[MailboxFixture], Awaitable[None]]], Any]:
    def register(fn: Callable[[MailboxFixture], Awaitable[None]]) -> Any:
        _CASES.append(MailboxCase(group, fn.__name__, fn))
        return fn

    return register


def mailbox_cases() -> tuple[MailboxCase, ...]:
    """Every conformance case, in a stable order."""
    return tuple(_CASES)


def _reply(identity: str, text: str = "hi", at_ms: int = 1000) -> NewWebItem:
    return NewWebItem(kind="reply", id=identity, text=text, at_ms=at_ms)


def _message(identity: str, text: str = "q", at_ms: int = 1000) -> NewWebItem:
    return NewWebItem(kind="message", id=identity, text=text, author=Author(id="u"), at_ms=at_ms)


# -- items -----------------------------------------------------------------------------------


@_case("items")
async def items_are_numbered_in_append_order_per_thread(fx: MailboxFixture) -> None:
    box = fx.mailbox
    first = await box.append("default", "t1", _message("m1"))
    second = await box.append("default", "t1", _reply("reply:r1"))
    other = await box.append("default", "t2", _reply("reply:r1"))
    assert (first.item.seq, second.item.seq, other.item.seq) == (1, 2, 1)
    assert [first.created, second.created, other.created] == [True, True, True]
    items = await box.read("default", "t1")
    assert [(i.seq, i.kind, i.id) for i in items] == [
        (1, "message", "m1"),
        (2, "reply", "reply:r1"),
    ]
    assert items[0].author == Author(id="u")


@_case("items")
async def an_identity_appended_again_is_stored_once_as_first_written(fx: MailboxFixture) -> None:
    box = fx.mailbox
    first = await box.append("default", "t1", _reply("reply:r1", "hello", at_ms=1))
    again = await box.append("default", "t1", _reply("reply:r1", "changed", at_ms=2))
    assert not again.created
    assert again.item == first.item
    assert [i.text for i in await box.read("default", "t1")] == ["hello"]


@_case("items")
async def identities_are_unique_per_family(fx: MailboxFixture) -> None:
    """A message id may equal a delivery id; a delivery id is one, whatever its kind."""
    box = fx.mailbox
    await box.append("default", "t1", _message("x"))
    await box.append("default", "t1", _reply("x"))
    notice = NewWebItem(kind="failure_notice", id="x", text="failed", at_ms=1)
    assert not (await box.append("default", "t1", notice)).created
    assert [i.kind for i in await box.read("default", "t1")] == ["message", "reply"]
    assert (await box.find("default", "t1", "failure_notice", "x")) is not None
    assert (await box.find("default", "t1", "decision", "x")) is None


@_case("items")
async def find_answers_by_thread_and_identity(fx: MailboxFixture) -> None:
    box = fx.mailbox
    assert await box.find("default", "t1", "reply", "reply:r1") is None
    stored = (await box.append("default", "t1", _reply("reply:r1"))).item
    assert await box.find("default", "t1", "reply", "reply:r1") == stored
    assert await box.find("default", "t2", "reply", "reply:r1") is None
    assert await box.find("other", "t1", "reply", "reply:r1") is None


@_case("items")
async def read_pages_after_a_seq(fx: MailboxFixture) -> None:
    box = fx.mailbox
    for n in range(1, 8):
        await box.append("default", "t1", _reply(f"d{n}"))
    assert [i.seq for i in await box.read("default", "t1", after=2, limit=3)] == [3, 4, 5]
    assert [i.seq for i in await box.read("default", "t1", after=5)] == [6, 7]
    assert await box.read("default", "t1", after=7) == ()
    assert await box.read("default", "t1", limit=0) == ()
    assert await box.read("default", "nothing-here") == ()


@_case("items")
async def spaces_are_separate(fx: MailboxFixture) -> None:
    box = fx.mailbox
    await box.append("a", "t1", _reply("d1", "in a"))
    await box.append("b", "t1", _reply("d1", "in b"))
    assert [i.text for i in await box.read("a", "t1")] == ["in a"]
    assert [i.text for i in await box.read("b", "t1")] == ["in b"]


@_case("items")
async def structured_items_and_any_text_round_trip(fx: MailboxFixture) -> None:
    box = fx.mailbox
    approval = ApprovalView(
        session="s1",
        run_id="run-1",
        wait_id="wait-1",
        calls=(
            PendingCall(
                tool_call_id="c1", tool_name="deploy", args={"build": 42}, args_digest="d" * 64
            ),
        ),
    )
    request = NewWebItem(
        kind="approval_request", id="approval:wait-1", text="May I?", approval=approval, at_ms=5
    )
    decision = NewWebItem(
        kind="decision",
        id="click-1",
        author=Author(id="ann", name="Ann"),
        decision=WebDecision(
            run_id="run-1",
            wait_id="wait-1",
            decisions=(DecisionItem(tool_call_id="c1", args_digest="d" * 64, approved=True),),
        ),
        at_ms=6,
    )
    text = "Markdown **stays** as written: <script>alert(1)</script> \u00e9\u6f22\U0001f600\n\ttab"
    await box.append("default", "t1", request)
    await box.append("default", "t1", decision)
    await box.append("default", "t1", _reply("d", text))
    items = await box.read("default", "t1")
    assert items[0].approval == approval
    assert items[1].decision == decision.decision
    assert items[1].author == decision.author
    assert items[2].text == text


# -- wait ------------------------------------------------------------------------------------


@_case("wait")
async def wait_returns_at_once_when_items_exist(fx: MailboxFixture) -> None:
    await fx.mailbox.append("default", "t1", _reply("d1"))
    async with asyncio.timeout(REAL_TIMEOUT_S):
        items = await fx.mailbox.wait("default", "t1", after=0, timeout_s=30)
    assert [i.id for i in items] == ["d1"]


@_case("wait")
async def wait_wakes_on_an_append_to_its_thread_only(fx: MailboxFixture) -> None:
    box = fx.mailbox
    waiter = asyncio.create_task(box.wait("default", "t1", after=0, timeout_s=30))
    try:
        await asyncio.sleep(PAUSE_S)
        assert not waiter.done()
        await box.append("default", "t2", _reply("elsewhere"))
        await asyncio.sleep(PAUSE_S)
        assert not waiter.done(), "another thread's append answered the waiter"
        await box.append("default", "t1", _reply("d1"))
        async with asyncio.timeout(REAL_TIMEOUT_S):
            items = await waiter
        assert [i.id for i in items] == ["d1"]
    finally:
        waiter.cancel()


@_case("wait")
async def wait_times_out_empty(fx: MailboxFixture) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await fx.mailbox.wait("default", "t1", after=0, timeout_s=0.2) == ()
    assert 0.15 <= loop.time() - started < REAL_TIMEOUT_S


@_case("wait")
async def a_cancelled_waiter_leaves_the_mailbox_usable(fx: MailboxFixture) -> None:
    box = fx.mailbox
    waiters = [asyncio.create_task(box.wait("default", "t1", after=0, timeout_s=30))]
    await asyncio.sleep(PAUSE_S)
    for waiter in waiters:
        waiter.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    await box.append("default", "t1", _reply("d1"))
    async with asyncio.timeout(REAL_TIMEOUT_S):
        items = await box.wait("default", "t1", after=0, timeout_s=30)
    assert [i.id for i in items] == ["d1"]


# -- threads ---------------------------------------------------------------------------------


@_case("threads")
async def threads_are_listed_most_recent_first(fx: MailboxFixture) -> None:
    box = fx.mailbox
    await box.append("default", "old", _reply("d", at_ms=100))
    await box.append("default", "new", _reply("d", at_ms=300))
    await box.append("default", "mid", _reply("d", at_ms=200))
    await box.append("other", "elsewhere", _reply("d", at_ms=400))
    listed = await box.threads("default")
    assert [(t.thread, t.updated_at_ms) for t in listed] == [
        ("new", 300),
        ("mid", 200),
        ("old", 100),
    ]
    assert [t.thread for t in await box.threads("default", limit=1)] == ["new"]
    await box.append("default", "old", _reply("d2", at_ms=500))
    assert (await box.threads("default"))[0].thread == "old"


@_case("threads")
async def threads_updated_at_once_are_listed_by_thread_id_descending(fx: MailboxFixture) -> None:
    box = fx.mailbox
    for thread in ("b", "c", "a"):
        await box.append("default", thread, _reply("d", at_ms=100))
    assert [t.thread for t in await box.threads("default")] == ["c", "b", "a"]


# -- names -----------------------------------------------------------------------------------


@_case("names")
async def names_out_of_the_rule_are_refused_and_nothing_is_stored(fx: MailboxFixture) -> None:
    box = fx.mailbox
    for space, thread in (
        ("default", "bad id"),
        ("default", ""),
        ("a{b}", "t"),
        ("x", "a" * 201),
        ("default", ".."),
        ("..", "t"),
        ("default", "a:b"),
        ("default", "cafe\u0301"),  # not composed: the channel composes before it asks
        ("e\u0301quipe", "t"),
    ):
        try:
            await box.append(space, thread, _reply("d"))
        except ValueError as exc:
            refused = str(exc)
        else:
            refused = "accepted"
        assert "1-200 letters" in refused, f"{space!r}/{thread!r}: {refused}"
    assert await box.threads("default") == ()


@_case("names")
async def names_in_any_script_are_kept(fx: MailboxFixture) -> None:
    box = fx.mailbox
    for space, thread in (("équipe", "café"), ("default", "日本"), ("default", "हिन्दी")):
        await box.append(space, thread, _reply(f"d-{thread}"))
        [item] = await box.read(space, thread)
        assert item.id == f"d-{thread}"
        assert thread in [t.thread for t in await box.threads(space)]


# -- concurrency -----------------------------------------------------------------------------


@_case("concurrency")
async def concurrent_appends_of_one_identity_store_one_item(fx: MailboxFixture) -> None:
    box = fx.mailbox
    results = await asyncio.gather(
        *(box.append("default", "t1", _reply("reply:r1", f"try {n}")) for n in range(20))
    )
    assert sum(r.created for r in results) == 1
    assert len({r.item for r in results}) == 1
    assert len(await box.read("default", "t1")) == 1


@_case("concurrency")
async def concurrent_appends_of_many_identities_get_distinct_seqs(fx: MailboxFixture) -> None:
    box = fx.mailbox
    await asyncio.gather(*(box.append("default", "t1", _reply(f"d{n}")) for n in range(30)))
    items = await box.read("default", "t1")
    assert [i.seq for i in items] == list(range(1, 31))
    assert sorted(i.id for i in items) == sorted(f"d{n}" for n in range(30))


@_case("concurrency")
async def two_openers_of_the_same_data_share_identities_and_numbering(
    fx: MailboxFixture,
) -> None:
    if fx.open_another is None:
        return
    other = await fx.open_another()
    first = await fx.mailbox.append("default", "t1", _reply("d1", "from one"))
    again = await other.append("default", "t1", _reply("d1", "from two"))
    assert not again.created
    assert again.item == first.item
    second = await other.append("default", "t1", _reply("d2"))
    assert second.item.seq == 2
    assert [i.id for i in await fx.mailbox.read("default", "t1")] == ["d1", "d2"]


# -- durability and close --------------------------------------------------------------------


@_case("durability")
async def what_was_appended_is_there_for_the_next_opener(fx: MailboxFixture) -> None:
    if fx.open_another is None:
        return
    await fx.mailbox.append("default", "t1", _message("m1", at_ms=7))
    await fx.mailbox.close()
    later = await fx.open_another()
    [item] = await later.read("default", "t1")
    assert (item.seq, item.kind, item.id, item.at_ms) == (1, "message", "m1", 7)
    assert [t.thread for t in await later.threads("default")] == ["t1"]
    assert (await later.append("default", "t1", _reply("d1"))).item.seq == 2


@_case("durability")
async def another_openers_append_wakes_a_waiter(fx: MailboxFixture) -> None:
    """What one process delivers reaches a page connected to another.

    At once, or by polling within the backend's documented interval: a few seconds at most.
    """
    if fx.open_another is None:
        return
    other = await fx.open_another()
    waiter = asyncio.create_task(fx.mailbox.wait("default", "t1", after=0, timeout_s=30))
    try:
        await asyncio.sleep(PAUSE_S)
        await other.append("default", "t1", _reply("d1"))
        async with asyncio.timeout(REAL_TIMEOUT_S):
            items = await waiter
        assert [i.id for i in items] == ["d1"]
    finally:
        waiter.cancel()


@_case("close")
async def close_wakes_waiters_and_may_be_called_twice(fx: MailboxFixture) -> None:
    box = fx.mailbox
    waiter = asyncio.create_task(box.wait("default", "t1", after=0, timeout_s=30))
    await asyncio.sleep(PAUSE_S)
    await box.close()
    async with asyncio.timeout(REAL_TIMEOUT_S):
        assert await waiter == ()
    await box.close()


@_case("close")
async def close_wakes_a_waiter_that_has_not_sent_its_read_yet(fx: MailboxFixture) -> None:
    box = fx.mailbox
    waiter = asyncio.create_task(box.wait("default", "t1", after=0, timeout_s=30))
    await asyncio.sleep(0)  # the waiter is on its way (a cluster client is discovering nodes)
    await box.close()
    async with asyncio.timeout(REAL_TIMEOUT_S):
        assert await waiter == ()
