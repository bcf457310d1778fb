"""Redis-only behaviour: one slot per session, script cache loss, imports, server-time leases."""

from __future__ import annotations

import asyncio

import pytest
import redis
from redis.crc import key_slot

from harness_core import SessionRepo, SessionStorage
from harness_core.errors import LeaseLost, SessionError
from harness_core.messages import Cost, TokenUsage
from harness_core.session.records import QueueEnqueued, Usage
from harness_core.session.types import BranchQuery, RecordQuery, SessionMetadata
from harness_core.storage.memory import MemorySessionRepo
from harness_core.storage.redis_streams import RedisSessionRepo
from harness_core.testing import ManualClock
from harness_core.testing.builders import (
    custom_entry,
    operation_finished,
    operation_started,
    user_entry,
)


@pytest.fixture
async def repo(redis_server, redis_prefix):
    repo = RedisSessionRepo(redis_server.url, prefix=redis_prefix, clock=ManualClock())
    yield repo
    await repo.close()


async def _writer(repo: SessionRepo, session_id: str = "s1") -> SessionStorage:
    await repo.create(session_id)
    lease = await repo.acquire_lease(session_id, owner="w", ttl_ms=60_000)
    return await repo.open(session_id, lease=lease)


async def test_every_key_of_a_session_is_in_one_cluster_slot(
    repo, redis_server, redis_prefix
) -> None:
    storage = await _writer(repo)
    await storage.append_entry(user_entry("a"), "main")
    await storage.create_lane("slack:C1:1.2", "a")
    await storage.append_entry(custom_entry("c", "note"), "slack:C1:1.2")
    await storage.append_record(operation_started("r", lane="slack:C1:1.2"))
    await storage.set_label("a", "x")
    client = redis.Redis(port=redis_server.port, decode_responses=True)
    keys = [k for k in client.scan_iter(f"{redis_prefix}:*") if k != f"{redis_prefix}:sessions"]
    client.close()
    assert len(keys) >= 10
    assert all("{s1}" in key for key in keys)
    assert {key_slot(key.encode()) for key in keys} == {key_slot(b"{s1}")}


async def test_a_flushed_script_cache_is_reloaded_and_the_write_applies_once(
    repo, redis_server
) -> None:
    storage = await _writer(repo)
    await storage.append_entry(user_entry("a"), "main")
    redis.Redis(port=redis_server.port).script_flush()
    stored = await storage.append_entry(user_entry("b"), "main")
    assert (stored.seq, stored.parent_id) == (2, "a")
    assert [item.seq for item in await storage.get_log()] == [1, 2]


def test_client_retries_are_off_for_writes(repo) -> None:
    # A retried write whose reply was lost could apply twice.
    retry = repo.writer.get_retry()
    assert retry is not None and retry.get_retries() == 0


async def test_an_unfinished_import_is_invisible_and_deletable(repo) -> None:
    # What a crash in the middle of an import leaves behind: the session marked "importing".
    await repo._create(SessionMetadata(id="partial", created_at=1), importing=True)
    assert [m.id for m in await repo.list()] == []
    with pytest.raises(SessionError) as caught:
        await repo.open("partial")
    assert caught.value.code == "not_found"
    with pytest.raises(SessionError) as caught:
        await repo.acquire_lease("partial", owner="w", ttl_ms=1000)
    assert caught.value.code == "not_found"
    assert await repo.delete("partial") is True
    await repo.import_session(SessionMetadata(id="partial", created_at=1), [])
    assert [m.id for m in await repo.list()] == ["partial"]


async def test_server_time_leases_expire_without_a_client_clock(redis_server, redis_prefix) -> None:
    first = RedisSessionRepo(redis_server.url, prefix=redis_prefix)
    second = RedisSessionRepo(redis_server.url, prefix=redis_prefix)
    try:
        await first.create("s1")
        lease = await first.acquire_lease("s1", owner="A", ttl_ms=150)
        storage = await first.open("s1", lease=lease)
        await storage.append_entry(user_entry("a"), "main")
        await asyncio.sleep(0.4)  # wait out the ttl on the server's clock
        taken = await second.acquire_lease("s1", owner="B", ttl_ms=60_000)
        assert taken.token > lease.token
        with pytest.raises(LeaseLost):
            await storage.append_entry(user_entry("late"), "main")
        with pytest.raises(LeaseLost):
            await first.renew_lease(lease)
        b = await second.open("s1", lease=taken)
        assert (await b.append_entry(user_entry("b"), "main")).parent_id == "a"
    finally:
        await first.close()
        await second.close()


async def test_a_writer_from_before_redis_lost_its_data_is_refused(
    repo, redis_server, redis_prefix
) -> None:
    """Redis restarted empty (no persistence): the re-created session counted its fence from 0
    again, handed the old writer's token 1 to the new one, and took the old writer's writes,
    made from a state the store no longer held: the session could not be restored again."""
    stale = await _writer(repo)
    await stale.append_entry(user_entry("before"), "main")
    client = redis.Redis(port=redis_server.port)
    for key in client.scan_iter(f"{redis_prefix}:*"):  # the loss: every key of the session
        client.delete(key)
    client.close()
    await repo.create("s1")
    lease = await repo.acquire_lease("s1", owner="new", ttl_ms=60_000)
    fresh = await repo.open("s1", lease=lease)
    with pytest.raises(LeaseLost):
        await stale.append_entry(user_entry("lost-world"), "main")
    assert (await fresh.append_entry(user_entry("after"), "main")).parent_id is None
    assert [e.id for e in await fresh.read_lane_entries("main", after=None)] == ["after"]


async def test_many_lanes_pipelined_from_two_repositories_keep_one_sequence(
    repo, redis_server, redis_prefix
) -> None:
    storage = await _writer(repo)
    for lane in range(16):
        await storage.create_lane(f"l{lane}", None)
    results = await asyncio.gather(
        *(
            storage.append_entry(user_entry(f"e{lane}-{i}"), f"l{lane}")
            for i in range(20)
            for lane in range(16)
        )
    )
    assert sorted(r.seq for r in results) == list(range(17, 17 + 320))
    reader = RedisSessionRepo(redis_server.url, prefix=redis_prefix)
    try:
        view = await reader.open("s1")
        for lane in range(16):
            entries = await view.read_lane_entries(f"l{lane}", after=None)
            assert [e.id for e in entries] == [f"e{lane}-{i}" for i in range(20)]
    finally:
        await reader.close()


def _evalsha_calls(redis_server) -> int:
    client = redis.Redis(port=redis_server.port)
    stats = client.info("commandstats").get("cmdstat_evalsha", {"calls": 0})
    client.close()
    return int(stats["calls"])


async def test_a_sessions_writes_queued_together_commit_in_one_script_call(
    repo, redis_server
) -> None:
    storage = await _writer(repo)
    await storage.append_entry(user_entry("a"), "main")
    before = _evalsha_calls(redis_server)
    results = await asyncio.gather(
        *(storage.append_record(QueueEnqueued(id=f"q{i}", lane="main", queue="steer",
                                              target=user_entry(f"t{i}"))) for i in range(40))
    )  # fmt: skip
    assert _evalsha_calls(redis_server) - before == 1  # one group commit
    assert [r.seq for r in results] == list(range(2, 42))
    assert [item.seq for item in await storage.get_log()] == list(range(1, 42))


async def test_a_refused_write_inside_a_batch_leaves_no_trace_and_the_rest_commit(
    repo,
) -> None:
    storage = await _writer(repo)
    results = await asyncio.gather(
        storage.append_entry(user_entry("a"), "main"),
        storage.append_entry(user_entry("x"), "nowhere"),
        storage.append_entry(user_entry("a"), "main"),  # the id is taken by the first write
        storage.append_record(operation_started("r", lane="main")),
        storage.append_record(operation_started("r2", lane="main")),  # the lane is busy now
        storage.append_entry(user_entry("b"), "main"),
        return_exceptions=True,
    )
    codes = [r.code if isinstance(r, SessionError) else r.seq for r in results]  # type: ignore[union-attr]
    assert codes == [1, "unknown_lane", "already_exists", 2, "lane_busy", 3]
    assert [item.seq for item in await storage.get_log()] == [1, 2, 3]
    stats = await storage.get_stats()
    assert (stats.entries, stats.records) == (2, 1)
    assert (await storage.get_entry("b")).parent_id == "a"  # type: ignore[union-attr]


async def test_a_batch_renews_the_lease_and_a_superseded_writer_in_it_is_refused(
    repo, redis_server, redis_prefix
) -> None:
    storage = await _writer(repo)
    lease = storage.lease
    assert lease is not None
    repo.clock.advance(40_000)  # less than half of the 60 s ttl is left
    old = await repo.open("s1", lease=lease)
    await asyncio.gather(*(storage.append_entry(user_entry(f"e{i}"), "main") for i in range(3)))
    renewed = storage.lease
    assert renewed is not None and renewed.expires_at_ms == repo.clock.now_ms() + 60_000
    # a newer writer takes the session over once the renewed lease has run out; the old
    # writer's writes queued with the new one's are refused, the new one's commit
    repo.clock.advance(60_001)
    newer = await repo.acquire_lease("s1", owner="B", ttl_ms=60_000)
    fresh = await repo.open("s1", lease=newer)
    results = await asyncio.gather(
        old.append_entry(user_entry("stale"), "main"),
        fresh.append_entry(user_entry("f"), "main"),
        old.append_entry(user_entry("stale2"), "main"),
        return_exceptions=True,
    )
    assert isinstance(results[0], LeaseLost) and isinstance(results[2], LeaseLost)
    assert results[1].parent_id == "e2"  # type: ignore[union-attr]
    assert [item.seq for item in await fresh.get_log()] == [1, 2, 3, 4]


async def test_a_write_redis_cannot_encode_fails_alone(repo) -> None:
    # The codecs refuse lone surrogates before a write is queued; this guards the queue itself.
    storage = await _writer(repo)
    lease = storage.lease
    assert lease is not None
    bad = (repo.key("s1", "meta"), ("lane", str(lease.token), "", "x\ud800", "", "1"))
    results = await asyncio.gather(
        storage.append_entry(user_entry("a"), "main"),
        repo.writes.submit(bad),
        storage.append_entry(user_entry("b"), "main"),
        return_exceptions=True,
    )
    assert isinstance(results[1], SessionError) and results[1].code == "invalid_payload"
    assert [item.seq for item in await storage.get_log()] == [1, 2]


async def _mixed_history(storage) -> None:
    await storage.create_lane("t1", None)
    await storage.append_record(operation_started("cmp", lane="t1", kind="compaction"))
    await storage.append_record(operation_finished("cmp-fin", "cmp", lane="t1"))
    for n, (lane, entry_id, cost) in enumerate(
        [("main", "a", 0.1), ("t1", "a", 0.2), ("t1", None, 0.7), ("main", "b", 0.3)]
    ):
        amount = TokenUsage(input=n + 1, cost=Cost(total=cost))
        usage = Usage(id=f"u{n}", lane=lane, cause="adjustment", entry_id=entry_id, usage=amount)
        await storage.append_record(usage)
    await storage.append_record(
        QueueEnqueued(id="q", lane="t1", queue="next_run", target=user_entry("x"))
    )


async def _answers(storage) -> list[object]:
    queries = [
        RecordQuery(lane="t1", type="operation_finished", limit=1),
        RecordQuery(lane="t1", type="operation_started", operation_kind="compaction"),
        RecordQuery(lane="t1", type="queue_enqueued", after_seq=2),
        RecordQuery(lane="main", type="usage", order="oldest_first"),
    ]
    return [
        *[await storage.find_records(query) for query in queries],
        await storage.get_usage(entry_id="a"),
        await storage.get_usage(entry_id="b"),
        await storage.get_usage(lane="main"),
        await storage.get_usage(lane="t1"),
        await storage.get_stats(),
    ]


async def test_a_session_of_the_first_layout_is_upgraded_on_open(
    repo, redis_server, redis_prefix
) -> None:
    storage = await _writer(repo)
    await _mixed_history(storage)
    expected = await _answers(storage)
    client = redis.Redis(port=redis_server.port, decode_responses=True)
    # what layout 1 left: no type indexes, no lane or entry usage sums, no layout mark
    derived = [k for k in client.scan_iter(f"{redis_prefix}:{{s1}}:*") if ":lt:" in k]
    assert len(derived) >= 5
    client.delete(*derived, f"{redis_prefix}:{{s1}}:ul", f"{redis_prefix}:{{s1}}:ue")
    client.hdel(f"{redis_prefix}:{{s1}}:meta", "layout")
    reader = await repo.open("s1")
    assert await _answers(reader) == expected
    assert client.hget(f"{redis_prefix}:{{s1}}:meta", "layout") == "3"
    lease = await repo.acquire_lease("s1", owner="w", ttl_ms=60_000)
    writer = await repo.open("s1", lease=lease)
    await writer.append_record(operation_finished("late", "cmp", lane="t1"))
    finished = await writer.find_records(RecordQuery(lane="t1", type="operation_finished"))
    assert [r.id for r in finished] == ["late", "cmp-fin"]
    client.close()


async def test_a_session_of_layout_2_gets_its_session_wide_open_index_on_open(
    repo, redis_server, redis_prefix
) -> None:
    storage = await _writer(repo)
    await storage.create_lane("t1", None)
    await storage.create_lane("t2", None)
    await storage.append_record(operation_started("open-1", lane="t1"))
    await storage.append_record(operation_started("done", lane="t2"))
    await storage.append_record(operation_finished("done-fin", "done", lane="t2"))
    await storage.append_record(operation_started("open-2", lane="t2"))
    client = redis.Redis(port=redis_server.port, decode_responses=True)
    # what layout 2 left: per-lane open sets only
    assert client.delete(f"{redis_prefix}:{{s1}}:opens") == 1
    client.hset(f"{redis_prefix}:{{s1}}:meta", "layout", "2")
    reader = await repo.open("s1")
    assert [r.id for r in await reader.find_open_operations(None)] == ["open-2", "open-1"]
    assert client.hget(f"{redis_prefix}:{{s1}}:meta", "layout") == "3"
    await storage.append_record(operation_finished("open-1-fin", "open-1", lane="t1"))
    assert [r.id for r in await reader.find_open_operations(None)] == ["open-2"]
    client.close()


async def test_delete_removes_every_key_of_the_session(repo, redis_server, redis_prefix) -> None:
    storage = await _writer(repo)
    await _mixed_history(storage)
    await storage.append_entry(custom_entry("c", "note"), "t1")
    client = redis.Redis(port=redis_server.port, decode_responses=True)
    assert any(":lt:" in k for k in client.scan_iter(f"{redis_prefix}:{{s1}}:*"))
    assert storage.lease is not None
    assert await repo.delete("s1", lease=storage.lease) is True
    assert list(client.scan_iter(f"{redis_prefix}:{{s1}}:*")) == []
    client.close()


async def test_a_path_longer_than_every_walk_batch_reads_back_like_memory(repo) -> None:
    # 2,400 entries: the walk takes 256 nodes, then 2,048, then the rest; payloads 2,048 a call.
    source = await _writer(MemorySessionRepo(), "long")
    for i in range(2400):
        await source.append_entry(user_entry(f"e{i:04d}"), "main")
    await source.create_lane("t1", "e1000")
    for i in range(3):
        await source.append_entry(custom_entry(f"t{i}"), "t1")
    await repo.import_session(SessionMetadata(id="long", created_at=1), await source.get_log())
    stored = await repo.open("long")
    leaf = "e2399"
    for query in (
        BranchQuery(start=leaf),
        BranchQuery(start=leaf, order="oldest_first", after_seq=10),
        BranchQuery(start=leaf, stop_at_id="e0040"),  # found in the third walk call
        BranchQuery(start="t2", type="message", limit=5),
    ):
        assert await stored.find_entries_on_branch(query) == (
            await source.find_entries_on_branch(query)
        ), query
    for lane, after in (("main", None), ("main", "e0040"), ("main", "e2200"), ("t1", "e1000")):
        expected = await source.read_lane_entries(lane, after=after)
        assert await stored.read_lane_entries(lane, after=after) == expected, (lane, after)
    assert len(await stored.read_lane_entries("main", after=None)) == 2400
