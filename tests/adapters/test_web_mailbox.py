"""The web mailbox conformance suite on memory, SQLite, a real redis-server and a Redis
Cluster; and what each backend promises of its own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis

from adapters.web import (
    MailboxError,
    MailboxUnavailable,
    MemoryMailbox,
    NewWebItem,
    WebMailbox,
    open_mailbox,
)
from adapters.web.conformance import MailboxCase, MailboxFixture, mailbox_cases
from adapters.web.redis import RedisMailbox
from adapters.web.sqlite import SqliteMailbox
from tests.adapters.conftest import MAILBOXES, open_test_mailbox
from tests.support.redis_server import RedisServer


def reply(identity: str, text: str = "hi", at_ms: int = 1000) -> NewWebItem:
    return NewWebItem(kind="reply", id=identity, text=text, at_ms=at_ms)


# -- the contract, on every backend --------------------------------------------------------------


@pytest.fixture(params=MAILBOXES)
async def suite_mailbox(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[MailboxFixture]:
    """A fresh mailbox of each kind and, but on memory, a way to open another on its data."""
    kind = str(request.param)
    opened: list[WebMailbox] = [await open_test_mailbox(kind, request, tmp_path)]
    first = opened[0]

    async def open_another() -> WebMailbox:
        if isinstance(first, SqliteMailbox):
            opened.append(SqliteMailbox(first.path, poll_s=0.05))
        else:
            assert isinstance(first, RedisMailbox)
            opened.append(RedisMailbox(first.url, prefix=first.prefix, cluster=first.cluster))
        return opened[-1]

    yield MailboxFixture(
        name=kind, mailbox=first, open_another=None if kind == "memory" else open_another
    )
    for each in opened:
        await each.close()


CASES = mailbox_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_mailbox_conformance(suite_mailbox: MailboxFixture, case: MailboxCase) -> None:
    await case.run(suite_mailbox)


def test_every_case_has_a_unique_id() -> None:
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids))


# -- SQLite ---------------------------------------------------------------------------------------


async def test_sqlite_creates_nothing_until_used(tmp_path: Path) -> None:
    mailbox = SqliteMailbox(tmp_path / "later" / "web.db")
    assert not (tmp_path / "later").exists()
    await mailbox.close()


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


async def test_redis_append_on_a_server_is_one_call(
    redis_server: RedisServer, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread index moves inside the append script (a cluster's is in another slot)."""
    mailbox = RedisMailbox(redis_server.url, prefix=redis_prefix)
    sent: list[str] = []
    client = mailbox._client
    real = client.execute_command  # type: ignore[attr-defined]

    async def counted(*args: object, **options: object) -> object:
        sent.append(str(args[0]))
        return await real(*args, **options)

    try:
        await mailbox.append("sp", "old", reply("d0", at_ms=500))
        monkeypatch.setattr(client, "execute_command", counted)
        await mailbox.append("sp", "t1", reply("d1", at_ms=2000))
        await mailbox.append("sp", "old", reply("d2", at_ms=1500))
        assert sent == ["EVALSHA", "EVALSHA"]
        listed = [t.thread for t in await mailbox.threads("sp")]
        assert listed == ["t1", "old"]  # the index moved in both calls
        await mailbox.append("sp", "t1", reply("d3", at_ms=100))  # an older clock's item
        assert [t.thread for t in await mailbox.threads("sp")] == ["t1", "old"]  # never back
    finally:
        await mailbox.close()


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
