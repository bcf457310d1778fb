"""The web mailbox contract, on memory, SQLite and a real redis-server; and each backend's own."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis

from adapters.channel import ApprovalView, Author, DecisionItem, PendingCall
from adapters.web import (
    MailboxError,
    MailboxUnavailable,
    MemoryMailbox,
    NewWebItem,
    WebDecision,
    WebMailbox,
    open_mailbox,
)
from adapters.web.redis import RedisMailbox
from adapters.web.sqlite import SqliteMailbox
from tests.support.redis_server import RedisServer


def reply(identity: str, text: str = "hi", at_ms: int = 1000) -> NewWebItem:
    return NewWebItem(kind="reply", id=identity, text=text, at_ms=at_ms)


def message(identity: str, text: str = "q", at_ms: int = 1000) -> NewWebItem:
    return NewWebItem(kind="message", id=identity, text=text, author=Author(id="u"), at_ms=at_ms)


# -- the contract, on every backend --------------------------------------------------------------


async def test_items_are_numbered_in_append_order(mailbox: WebMailbox) -> None:
    first = await mailbox.append("default", "t1", message("m1"))
    second = await mailbox.append("default", "t1", reply("reply:r1"))
    other = await mailbox.append("default", "t2", reply("reply:r1"))
    assert (first.item.seq, second.item.seq, other.item.seq) == (1, 2, 1)
    assert first.created and second.created and other.created
    items = await mailbox.read("default", "t1")
    assert [(i.seq, i.kind, i.id) for i in items] == [
        (1, "message", "m1"),
        (2, "reply", "reply:r1"),
    ]
    assert items[0].author == Author(id="u")


async def test_appending_an_identity_again_stores_it_once(mailbox: WebMailbox) -> None:
    first = await mailbox.append("default", "t1", reply("reply:r1", "hello", at_ms=1))
    again = await mailbox.append("default", "t1", reply("reply:r1", "changed", at_ms=2))
    assert not again.created
    assert again.item == first.item  # the first one stays, as it was
    assert [i.text for i in await mailbox.read("default", "t1")] == ["hello"]


async def test_identities_are_unique_per_family(mailbox: WebMailbox) -> None:
    """A message id may equal a delivery id; a delivery id is one, whatever its kind."""
    await mailbox.append("default", "t1", message("x"))
    await mailbox.append("default", "t1", reply("x"))
    notice = NewWebItem(kind="failure_notice", id="x", text="failed", at_ms=1)
    assert not (await mailbox.append("default", "t1", notice)).created
    assert [i.kind for i in await mailbox.read("default", "t1")] == ["message", "reply"]
    assert (await mailbox.find("default", "t1", "failure_notice", "x")) is not None
    assert (await mailbox.find("default", "t1", "decision", "x")) is None


async def test_find_answers_by_identity(mailbox: WebMailbox) -> None:
    assert await mailbox.find("default", "t1", "reply", "reply:r1") is None
    stored = (await mailbox.append("default", "t1", reply("reply:r1"))).item
    assert await mailbox.find("default", "t1", "reply", "reply:r1") == stored
    assert await mailbox.find("default", "t2", "reply", "reply:r1") is None
    assert await mailbox.find("other", "t1", "reply", "reply:r1") is None


async def test_read_pages_after_a_seq(mailbox: WebMailbox) -> None:
    for n in range(1, 8):
        await mailbox.append("default", "t1", reply(f"d{n}"))
    assert [i.seq for i in await mailbox.read("default", "t1", after=2, limit=3)] == [3, 4, 5]
    assert [i.seq for i in await mailbox.read("default", "t1", after=5)] == [6, 7]
    assert await mailbox.read("default", "t1", after=7) == ()
    assert await mailbox.read("default", "t1", limit=0) == ()
    assert await mailbox.read("default", "nothing-here") == ()


async def test_spaces_are_separate(mailbox: WebMailbox) -> None:
    await mailbox.append("a", "t1", reply("d1", "in a"))
    await mailbox.append("b", "t1", reply("d1", "in b"))
    assert [i.text for i in await mailbox.read("a", "t1")] == ["in a"]
    assert [i.text for i in await mailbox.read("b", "t1")] == ["in b"]


async def test_structured_items_round_trip(mailbox: WebMailbox) -> None:
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
    await mailbox.append("default", "t1", request)
    await mailbox.append("default", "t1", decision)
    await mailbox.append("default", "t1", reply("d", text))
    items = await mailbox.read("default", "t1")
    assert items[0].approval == approval
    assert items[1].decision == decision.decision and items[1].author == decision.author
    assert items[2].text == text


async def test_wait_returns_at_once_when_items_exist(mailbox: WebMailbox) -> None:
    await mailbox.append("default", "t1", reply("d1"))
    items = await mailbox.wait("default", "t1", after=0, timeout_s=5)
    assert [i.id for i in items] == ["d1"]


async def test_wait_wakes_on_an_append(mailbox: WebMailbox) -> None:
    waiter = asyncio.create_task(mailbox.wait("default", "t1", after=0, timeout_s=10))
    await asyncio.sleep(0.1)
    assert not waiter.done()
    await mailbox.append("default", "t2", reply("elsewhere"))
    await asyncio.sleep(0.1)
    assert not waiter.done()  # another thread's append does not answer this waiter
    await mailbox.append("default", "t1", reply("d1"))
    async with asyncio.timeout(5):
        items = await waiter
    assert [i.id for i in items] == ["d1"]


async def test_wait_times_out_empty(mailbox: WebMailbox) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await mailbox.wait("default", "t1", after=0, timeout_s=0.2) == ()
    assert 0.15 <= loop.time() - started < 3


async def test_threads_are_listed_most_recent_first(mailbox: WebMailbox) -> None:
    await mailbox.append("default", "old", reply("d", at_ms=100))
    await mailbox.append("default", "new", reply("d", at_ms=300))
    await mailbox.append("default", "mid", reply("d", at_ms=200))
    await mailbox.append("other", "elsewhere", reply("d", at_ms=400))
    listed = await mailbox.threads("default")
    assert [(t.thread, t.updated_at_ms) for t in listed] == [
        ("new", 300),
        ("mid", 200),
        ("old", 100),
    ]
    assert [t.thread for t in await mailbox.threads("default", limit=1)] == ["new"]
    await mailbox.append("default", "old", reply("d2", at_ms=500))
    assert (await mailbox.threads("default"))[0].thread == "old"


async def test_names_are_checked(mailbox: WebMailbox) -> None:
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
        with pytest.raises(ValueError, match="1-200 letters"):
            await mailbox.append(space, thread, reply("d"))


async def test_names_in_any_script_are_kept_on_every_backend(mailbox: WebMailbox) -> None:
    for space, thread in (("équipe", "café"), ("default", "日本"), ("default", "हिन्दी")):
        await mailbox.append(space, thread, reply(f"d-{thread}"))
        [item] = await mailbox.read(space, thread)
        assert item.id == f"d-{thread}"
        assert thread in [t.thread for t in await mailbox.threads(space)]


async def test_concurrent_appends_of_one_identity_store_one_item(mailbox: WebMailbox) -> None:
    results = await asyncio.gather(
        *(mailbox.append("default", "t1", reply("reply:r1", f"try {n}")) for n in range(20))
    )
    assert sum(r.created for r in results) == 1
    assert len({r.item for r in results}) == 1
    assert len(await mailbox.read("default", "t1")) == 1


async def test_concurrent_appends_of_many_identities_get_distinct_seqs(mailbox: WebMailbox) -> None:
    await asyncio.gather(*(mailbox.append("default", "t1", reply(f"d{n}")) for n in range(30)))
    items = await mailbox.read("default", "t1")
    assert [i.seq for i in items] == list(range(1, 31))
    assert sorted(i.id for i in items) == sorted(f"d{n}" for n in range(30))


# -- SQLite ---------------------------------------------------------------------------------------


async def test_sqlite_keeps_threads_across_reopening(tmp_path: Path) -> None:
    path = tmp_path / "dir" / "web.db"
    first = SqliteMailbox(path)
    await first.append("default", "t1", reply("d1"))
    await first.close()
    second = SqliteMailbox(path)
    try:
        assert [i.id for i in await second.read("default", "t1")] == ["d1"]
        assert not (await second.append("default", "t1", reply("d1"))).created
        assert (await second.append("default", "t1", reply("d2"))).item.seq == 2
    finally:
        await second.close()


async def test_sqlite_creates_nothing_until_used(tmp_path: Path) -> None:
    mailbox = SqliteMailbox(tmp_path / "later" / "web.db")
    assert not (tmp_path / "later").exists()
    await mailbox.close()


async def test_sqlite_waiter_sees_another_process_writes_by_polling(tmp_path: Path) -> None:
    """Two mailboxes on one file stand for two processes: the waiter polls."""
    writer = SqliteMailbox(tmp_path / "web.db")
    reader = SqliteMailbox(tmp_path / "web.db", poll_s=0.05)
    try:
        await writer.read("default", "t1")  # the schema exists before the reader polls
        waiter = asyncio.create_task(reader.wait("default", "t1", after=0, timeout_s=10))
        await asyncio.sleep(0.1)
        await writer.append("default", "t1", reply("d1"))
        async with asyncio.timeout(5):
            assert [i.id for i in await waiter] == ["d1"]
    finally:
        await writer.close()
        await reader.close()


async def test_sqlite_unusable_file_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "web.db").mkdir()  # a directory where the file belongs
    mailbox = SqliteMailbox(tmp_path / "web.db")
    try:
        with pytest.raises(MailboxUnavailable):
            await mailbox.append("default", "t1", reply("d1"))
    finally:
        await mailbox.close()


async def test_closed_sqlite_mailbox_refuses_and_wakes_waiters(tmp_path: Path) -> None:
    mailbox = SqliteMailbox(tmp_path / "web.db")
    waiter = asyncio.create_task(mailbox.wait("default", "t1", after=0, timeout_s=30))
    await asyncio.sleep(0.05)
    await mailbox.close()
    async with asyncio.timeout(5):
        assert await waiter == ()
    with pytest.raises(MailboxUnavailable):
        await mailbox.append("default", "t1", reply("d1"))
    await mailbox.close()  # idempotent


# -- Redis ----------------------------------------------------------------------------------------


async def test_redis_keys_are_hash_tagged_per_thread(
    redis_server: RedisServer, redis_prefix: str
) -> None:
    mailbox = RedisMailbox(redis_server.url, prefix=redis_prefix)
    try:
        await mailbox.append("sp", "t.1", reply("d1"))
    finally:
        await mailbox.close()
    client = redis.Redis(port=redis_server.port, decode_responses=True)
    try:
        keys = sorted(str(k) for k in client.keys(f"{redis_prefix}:*"))
    finally:
        client.close()
    assert keys == [
        f"{redis_prefix}:{{index:sp}}:threads",
        f"{redis_prefix}:{{sp:t.1}}:items",
        f"{redis_prefix}:{{sp:t.1}}:keys",
    ]


async def test_redis_waiter_sees_what_another_process_delivered(
    redis_server: RedisServer, redis_prefix: str
) -> None:
    """Two mailboxes (two connection sets) stand for two `gateway serve` processes."""
    process_a = RedisMailbox(redis_server.url, prefix=redis_prefix)
    process_b = RedisMailbox(redis_server.url, prefix=redis_prefix)
    try:
        loop = asyncio.get_running_loop()
        waiter = asyncio.create_task(process_a.wait("default", "t1", after=0, timeout_s=10))
        await asyncio.sleep(0.1)
        sent = loop.time()
        await process_b.append("default", "t1", reply("d1"))
        async with asyncio.timeout(5):
            assert [i.id for i in await waiter] == ["d1"]
        assert loop.time() - sent < 1  # woken by XREAD, not by a poll
        again = await process_a.append("default", "t1", reply("d1"))
        assert not again.created  # the identity is shared too
    finally:
        await process_a.close()
        await process_b.close()


async def test_redis_unreachable_is_unavailable_with_unknown_outcome() -> None:
    from tests.support.redis_server import free_port

    mailbox = RedisMailbox(f"redis://127.0.0.1:{free_port()}/0", socket_timeout=1)
    try:
        with pytest.raises(MailboxUnavailable) as caught:
            await mailbox.append("default", "t1", reply("d1"))
        assert caught.value.unknown_outcome
        with pytest.raises(MailboxUnavailable):
            await mailbox.find("default", "t1", "reply", "d1")
    finally:
        await mailbox.close()


async def test_closing_redis_wakes_a_blocked_waiter(
    redis_server: RedisServer, redis_prefix: str
) -> None:
    mailbox = RedisMailbox(redis_server.url, prefix=redis_prefix)
    waiter = asyncio.create_task(mailbox.wait("default", "t1", after=0, timeout_s=20))
    await asyncio.sleep(0.1)
    await mailbox.close()
    async with asyncio.timeout(5):
        assert await waiter == ()


async def test_cancelled_redis_waiters_leave_the_mailbox_usable(
    redis_server: RedisServer, redis_prefix: str
) -> None:
    """A client that disconnects cancels its XREAD; the connection is dropped, not reused."""
    mailbox = RedisMailbox(redis_server.url, prefix=redis_prefix)
    try:
        for _ in range(5):
            waiter = asyncio.create_task(mailbox.wait("default", "t1", after=0, timeout_s=20))
            await asyncio.sleep(0.02)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
        await mailbox.append("default", "t1", reply("d1"))
        items = await mailbox.wait("default", "t1", after=0, timeout_s=5)
        assert [i.id for i in items] == ["d1"]
    finally:
        await mailbox.close()


# -- URLs -----------------------------------------------------------------------------------------


async def test_open_mailbox_by_url(tmp_path: Path, redis_server: RedisServer) -> None:
    assert isinstance(open_mailbox("memory://"), MemoryMailbox)
    relative = open_mailbox("sqlite:///.gateway/web.db")
    assert isinstance(relative, SqliteMailbox) and str(relative.path) == ".gateway/web.db"
    absolute = open_mailbox(f"sqlite:///{tmp_path}/web.db")
    assert isinstance(absolute, SqliteMailbox) and absolute.path == tmp_path / "web.db"
    remote = open_mailbox(f"{redis_server.url}?prefix=webx")
    assert isinstance(remote, RedisMailbox) and remote.prefix == "webx"
    for opened in (relative, absolute, remote):
        await opened.close()


@pytest.mark.parametrize(
    "url",
    [
        "web.db",
        "memory://x",
        "sqlite://",
        "sqlite:///",
        "sqlite:///dir/",
        "sqlite:///x.db?mode=ro",
        "redis://",
        "redis://host:99999/0",
        "redis://host/zero",
        "redis://host/0?prefix=a{b}",
        "redis://host/0?db=1",
        "postgres://host/db",
    ],
)
def test_malformed_urls_are_refused_with_the_accepted_forms(url: str) -> None:
    with pytest.raises(MailboxError, match="accepted web mailbox URLs"):
        open_mailbox(url)
