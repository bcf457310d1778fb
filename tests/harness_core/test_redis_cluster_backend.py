"""The Redis backend on a Redis Cluster (three masters): one slot per session, several nodes.

The storage conformance suite runs on the cluster too (``redis-cluster`` in
test_storage_conformance.py); these are the cluster-only checks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
import redis
from redis.crc import key_slot

from harness_core import open_repo
from harness_core.errors import LeaseLost, SessionError
from harness_core.messages import Cost, TokenUsage
from harness_core.session.records import QueueEnqueued, Usage
from harness_core.session.types import RecordQuery
from harness_core.storage.redis_streams import RedisSessionRepo
from harness_core.testing import ManualClock
from harness_core.testing.builders import (
    custom_entry,
    operation_finished,
    operation_started,
    user_entry,
)
from tests.support.redis_cluster import LocalRedisCluster


@pytest.fixture
async def repo(redis_cluster: LocalRedisCluster, redis_prefix: str) -> AsyncIterator[object]:
    repo = open_repo(f"{redis_cluster.url}?prefix={redis_prefix}", clock=ManualClock())
    assert isinstance(repo, RedisSessionRepo) and repo.cluster
    yield repo
    await repo.close()


def _node_of_slot(cluster: LocalRedisCluster) -> dict[int, int]:
    """Slot -> the port of the master serving it."""
    client = redis.Redis(port=cluster.nodes[0].port, decode_responses=True)
    try:
        ranges = cast(Any, client).execute_command("CLUSTER", "SLOTS")
    finally:
        client.close()
    owner: dict[int, int] = {}
    for first, last, master, *_ in ranges:
        for slot in range(int(first), int(last) + 1):
            owner[slot] = int(master[1])
    return owner


def _keys_by_port(cluster: LocalRedisCluster, prefix: str) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for node in cluster.nodes:
        client = redis.Redis(port=node.port, decode_responses=True)
        try:
            found[node.port] = list(client.scan_iter(f"{prefix}:*", count=1000))
        finally:
            client.close()
    return found


def _sessions_on_different_nodes(cluster: LocalRedisCluster, count: int) -> list[str]:
    owner = _node_of_slot(cluster)
    chosen: dict[int, str] = {}
    for n in range(10_000):
        session_id = f"s{n}"
        chosen.setdefault(owner[key_slot(f"{{{session_id}}}".encode())], session_id)
        if len(chosen) == count:
            return list(chosen.values())
    raise AssertionError("no sessions found on enough nodes")  # pragma: no cover


async def _fill(repo: RedisSessionRepo, session_id: str) -> None:
    """Touch every kind of key: entries, lanes, custom types, records, runs, usage, facts."""
    await repo.create(session_id)
    lease = await repo.acquire_lease(session_id, owner="w", ttl_ms=60_000)
    storage = await repo.open(session_id, lease=lease)
    await storage.append_entry(user_entry(f"{session_id}-a"), "main")
    await storage.create_lane("slack:C1:1.2", f"{session_id}-a")
    await storage.append_entry(custom_entry(f"{session_id}-c", "note"), "slack:C1:1.2")
    await storage.append_record(operation_started(f"{session_id}-r", lane="slack:C1:1.2"))
    amount = TokenUsage(input=3, cost=Cost(total=0.25))
    await storage.append_record(
        Usage(
            id=f"{session_id}-u",
            lane="slack:C1:1.2",
            cause="adjustment",
            entry_id=f"{session_id}-a",
            usage=amount,
        )
    )
    await storage.append_record(
        QueueEnqueued(id=f"{session_id}-q", lane="main", queue="next_run", target=user_entry("x"))
    )
    await storage.append_record(
        operation_finished(f"{session_id}-f", f"{session_id}-r", lane="slack:C1:1.2")
    )
    await storage.set_label(f"{session_id}-a", "x")
    await storage.set_name(f"name of {session_id}")
    await storage.close()
    assert await repo.release_lease(lease) is True


async def test_every_key_of_a_session_hashes_to_its_slot_on_one_node(
    repo: RedisSessionRepo, redis_cluster: LocalRedisCluster, redis_prefix: str
) -> None:
    await _fill(repo, "s1")
    by_port = _keys_by_port(redis_cluster, redis_prefix)
    index = f"{redis_prefix}:sessions"
    session_keys = {port: [key for key in keys if key != index] for port, keys in by_port.items()}
    holders = [port for port, keys in session_keys.items() if keys]
    assert len(holders) == 1  # one node holds the whole session
    keys = session_keys[holders[0]]
    assert len(keys) >= 15
    assert all(key.startswith(f"{redis_prefix}:{{s1}}:") for key in keys)
    assert {key_slot(key.encode()) for key in keys} == {key_slot(b"{s1}")}
    assert _node_of_slot(redis_cluster)[key_slot(b"{s1}")] == holders[0]
    assert sum(index in keys for keys in by_port.values()) == 1  # the index: its own key


async def test_sessions_on_different_nodes_all_work(
    repo: RedisSessionRepo, redis_cluster: LocalRedisCluster, redis_prefix: str
) -> None:
    sessions = _sessions_on_different_nodes(redis_cluster, len(redis_cluster.nodes))
    await asyncio.gather(*(_fill(repo, session_id) for session_id in sessions))
    holders = {
        port
        for port, keys in _keys_by_port(redis_cluster, redis_prefix).items()
        if any("{" in key for key in keys)
    }
    assert holders == {node.port for node in redis_cluster.nodes}
    assert [m.id for m in await repo.list()] == sorted(sessions)
    for session_id in sessions:
        storage = await repo.open(session_id)
        assert (await storage.get_metadata()).name == f"name of {session_id}"
        assert (await storage.get_lane("slack:C1:1.2")) is not None
        records = await storage.find_records(
            RecordQuery(run_id=f"{session_id}-r", order="oldest_first")
        )
        assert [r.record.id for r in records] == [f"{session_id}-r", f"{session_id}-f"]
        usage = await storage.get_usage(lane="slack:C1:1.2")
        assert (usage.input, usage.cost.total) == (3, 0.25)
        entries = await storage.read_lane_entries("slack:C1:1.2", after=None)
        assert [e.entry.id for e in entries] == [f"{session_id}-a", f"{session_id}-c"]
    # a second process sees the same; deleting one session leaves the others
    other = open_repo(f"{redis_cluster.url}?prefix={redis_prefix}", clock=ManualClock())
    try:
        assert await other.delete(sessions[0]) is True
        assert [m.id for m in await repo.list()] == sorted(sessions[1:])
        lease = await other.acquire_lease(sessions[1], owner="second", ttl_ms=60_000)
        writer = await other.open(sessions[1], lease=lease)
        assert (await writer.append_entry(user_entry("later"), "main")).parent_id is not None
    finally:
        await other.close()
    assert not any(
        "{" + sessions[0] + "}" in key
        for keys in _keys_by_port(redis_cluster, redis_prefix).values()
        for key in keys
    )


async def test_concurrent_first_use_and_batched_writes_keep_each_sessions_order(
    repo: RedisSessionRepo, redis_cluster: LocalRedisCluster
) -> None:
    # Many calls before the client has discovered the cluster (redis-py's cluster client
    # fails such a race unless it is initialized first), then batches of writes to sessions
    # on every node: each session's writes commit in submission order.
    sessions = _sessions_on_different_nodes(redis_cluster, len(redis_cluster.nodes))
    await asyncio.gather(*(repo.create(session_id) for session_id in sessions))
    leases = await asyncio.gather(
        *(repo.acquire_lease(session_id, owner="w", ttl_ms=60_000) for session_id in sessions)
    )
    storages = [
        await repo.open(session_id, lease=lease)
        for session_id, lease in zip(sessions, leases, strict=True)
    ]
    writes = [
        storage.append_entry(user_entry(f"{storage.session_id}-{n}"), "main")
        for n in range(40)
        for storage in storages
    ]
    await asyncio.gather(*writes)
    for storage in storages:
        entries = await storage.read_lane_entries("main", after=None)
        assert [e.entry.id for e in entries] == [f"{storage.session_id}-{n}" for n in range(40)]
        assert [e.seq for e in entries] == list(range(1, 41))
    # past redis-py's default 100 connections per node: waits, no MaxConnectionsError
    stats = await asyncio.gather(*(storages[0].get_stats() for _ in range(300)))
    assert {s.entries for s in stats} == {40}


async def test_fencing_is_checked_inside_the_scripts_on_the_cluster(
    repo: RedisSessionRepo,
) -> None:
    await repo.create("s1")
    first = await repo.acquire_lease("s1", owner="a", ttl_ms=1_000)
    stale = await repo.open("s1", lease=first)
    assert repo.clock is not None
    repo.clock.advance(2_000)  # type: ignore[attr-defined]
    second = await repo.acquire_lease("s1", owner="b", ttl_ms=60_000)
    assert second.token > first.token
    with pytest.raises(LeaseLost):
        await stale.append_entry(user_entry("late"), "main")
    current = await repo.open("s1", lease=second)
    assert (await current.append_entry(user_entry("a"), "main")).seq == 1


async def test_a_flushed_script_cache_is_reloaded_on_every_node(
    repo: RedisSessionRepo, redis_cluster: LocalRedisCluster
) -> None:
    sessions = _sessions_on_different_nodes(redis_cluster, len(redis_cluster.nodes))
    storages = []
    for session_id in sessions:
        await repo.create(session_id)
        lease = await repo.acquire_lease(session_id, owner="w", ttl_ms=60_000)
        storages.append(await repo.open(session_id, lease=lease))
    for node in redis_cluster.nodes:
        redis.Redis(port=node.port).script_flush()
    for storage in storages:
        stored = await storage.append_entry(user_entry("b"), "main")
        assert stored.seq == 1
        assert [e.entry.id for e in await storage.read_lane_entries("main", after=None)] == ["b"]


def test_client_retries_are_off_on_the_cluster(repo: RedisSessionRepo) -> None:
    # A retried write whose reply was lost could apply twice.
    assert repo.writer.retry.get_retries() == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("redis+cluster://host:6379/1", "database 0 only"),
        ("rediss+cluster://host:6379/0/x", "database 0 only"),
        ("redis+cluster:///0", "a host is required"),
        ("redis+cluster://host:6379?prefix=a{b}", "invalid redis key prefix"),
        ("redis+sentinel://host:6379", "unsupported store URL"),
    ],
)
def test_bad_cluster_urls_are_refused(url: str, fragment: str) -> None:
    with pytest.raises(SessionError) as caught:
        open_repo(url)
    assert caught.value.code == "invalid_query"
    assert fragment in str(caught.value)
    assert "redis+cluster://host:port" in str(caught.value)


@pytest.mark.parametrize(
    "url", ["redis+cluster://h:7000", "redis+cluster://h:7000/0?prefix=x", "rediss+cluster://h:1/"]
)
async def test_cluster_urls_open_a_cluster_repo(url: str) -> None:
    repo = open_repo(url)
    assert isinstance(repo, RedisSessionRepo) and repo.cluster
    assert repo.prefix == ("x" if "prefix" in url else "gw")
    await repo.close()


async def test_a_cluster_no_node_of_answers_is_a_storage_error() -> None:
    """redis-py's `RedisClusterUnreachableError` is no `RedisError`: it passed every handler,
    and `store list` read "unexpected error" (found trying edge inputs)."""
    from tests.support.redis_server import free_port

    repo = open_repo(f"redis+cluster://127.0.0.1:{free_port()}")
    try:
        with pytest.raises(SessionError) as caught:
            await repo.list()
        assert caught.value.code == "storage" and "cannot reach redis" in str(caught.value)
    finally:
        await repo.close()
