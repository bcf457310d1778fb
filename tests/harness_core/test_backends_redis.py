"""The Redis plumbing every backend stands on: scripts loaded again after SCRIPT FLUSH (on a real
redis-server and a real cluster), the key rule, clients from a URL, setup once, close."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
import redis
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import SSLConnection
from redis.crc import key_slot
from redis.exceptions import ResponseError

from harness_core.backends.redis import (
    KeySpace,
    Once,
    ScriptClient,
    Scripts,
    close_clients,
    connect,
    split_cluster,
)
from tests.support.redis_cluster import LocalRedisCluster
from tests.support.redis_server import RedisServer, free_port

_SOURCES = {
    "bump": "return redis.call('INCR', KEYS[1])",
    "refuse": "return redis.error_reply('GW refused ' .. ARGV[1])",
}


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[ScriptClient]:
    opened = connect(redis_server.url)
    yield cast(ScriptClient, opened)
    await close_clients(opened)


def _flush(port: int) -> None:
    raw = redis.Redis(port=port)
    try:
        raw.script_flush()
        assert raw.script_exists(*Scripts(_SOURCES).shas.values()) == [False, False]
    finally:
        raw.close()


def _value(port: int, key: str) -> int:
    raw = redis.Redis(port=port, decode_responses=True)
    try:
        return int(raw.get(key) or 0)
    finally:
        raw.close()


# -- scripts -------------------------------------------------------------------------------------


async def test_a_script_runs_by_sha_and_once_after_script_flush(
    client: ScriptClient, redis_server: RedisServer, redis_prefix: str
) -> None:
    scripts = Scripts(_SOURCES)
    key = f"{redis_prefix}:n"
    assert await scripts.run(client, "bump", [key], []) == 1  # never loaded: NOSCRIPT, load, run
    _flush(redis_server.port)  # a restart, a failover: the cache is empty
    assert await scripts.run(client, "bump", [key], []) == 2
    assert _value(redis_server.port, key) == 2  # each call applied exactly once


async def test_run_all_resends_after_a_flush_only_what_did_not_run(
    client: ScriptClient, redis_server: RedisServer, redis_prefix: str
) -> None:
    scripts = Scripts(_SOURCES)
    keys = [f"{redis_prefix}:a", f"{redis_prefix}:b", f"{redis_prefix}:c"]
    await scripts.load(client)
    _flush(redis_server.port)
    calls: list[tuple[str, list[str], list[Any]]] = [("bump", [k], []) for k in keys]
    calls.insert(1, ("refuse", [keys[0]], ["x"]))
    replies = await scripts.run_all(client, calls, cluster=False)
    assert [replies[0], replies[2], replies[3]] == [1, 1, 1]
    assert isinstance(replies[1], ResponseError) and str(replies[1]) == "GW refused x"
    assert [_value(redis_server.port, k) for k in keys] == [1, 1, 1]
    _flush(redis_server.port)
    assert await scripts.run_all(client, [("bump", [keys[0]], [])], cluster=False) == [2]


async def test_run_all_on_a_cluster_reloads_every_node_and_runs_each_call_once(
    redis_cluster: LocalRedisCluster, redis_prefix: str
) -> None:
    opened = connect(redis_cluster.url)
    assert isinstance(opened, RedisCluster)
    scripts = Scripts(_SOURCES)
    keys = [f"{redis_prefix}:{{{tag}}}:n" for tag in ("a", "b", "c", "d", "e", "f")]
    assert len({key_slot(k.encode()) for k in keys}) > 1  # spread over the masters
    try:
        await opened.initialize()
        first = await scripts.run_all(
            cast(ScriptClient, opened), [("bump", [k], []) for k in keys], cluster=True
        )
        for node in redis_cluster.nodes:
            _flush(node.port)
        again = await scripts.run_all(
            cast(ScriptClient, opened),
            [("bump", [k], []) for k in keys],
            cluster=True,
            concurrency=2,
        )
        values = [int(str(await opened.get(k))) for k in keys]
    finally:
        await close_clients(opened)
    assert (first, again, values) == ([1] * 6, [2] * 6, [2] * 6)


def test_a_script_is_named_by_the_sha1_of_its_source() -> None:
    raw = redis.Redis()  # never connects: `Script` computes its sha locally, as the server does
    try:
        assert Scripts(_SOURCES).shas["bump"] == raw.register_script(_SOURCES["bump"]).sha
    finally:
        raw.close()


# -- keys ----------------------------------------------------------------------------------------


def test_every_key_of_a_tag_is_in_one_slot() -> None:
    keys = KeySpace("gw")
    assert keys.key("s1", "meta") == "gw:{s1}:meta"
    assert keys.key("rdy-3", "ready") == "gw:{rdy-3}:ready"
    assert keys.untagged("sessions") == "gw:sessions"
    slots = {key_slot(keys.key("s1", name).encode()) for name in ("meta", "log", "lr:main")}
    assert slots == {key_slot(b"s1")}


@pytest.mark.parametrize("prefix", ["", "a{b", "a}b", "a b", "gw\n", "gw\t", "g\u2003w"])
def test_a_prefix_with_braces_or_spaces_is_refused_in_one_line(prefix: str) -> None:
    with pytest.raises(ValueError, match="no braces or spaces") as refused:
        KeySpace(prefix)
    assert "\n" not in str(refused.value)


def test_a_prefix_may_hold_colons_and_dots() -> None:
    assert KeySpace("team:gw.v2").key("t", "x") == "team:gw.v2:{t}:x"


# -- clients -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "kind", "tls"),
    [
        ("redis://127.0.0.1:6379/0", Redis, False),
        ("rediss://127.0.0.1:6379/0", Redis, True),
        ("redis+cluster://127.0.0.1:7000", RedisCluster, False),
        ("rediss+cluster://127.0.0.1:7000", RedisCluster, True),
    ],
)
async def test_the_url_says_tls_and_cluster_and_retries_are_off(
    url: str, kind: type, tls: bool
) -> None:
    opened = connect(url, socket_timeout=3)
    try:
        assert type(opened) is kind
        if isinstance(opened, Redis):
            pool = opened.connection_pool
            assert issubclass(pool.connection_class, SSLConnection) is tls
            retry = opened.get_retry()
            assert retry is not None and retry.get_retries() == 0
            assert pool.connection_kwargs["socket_connect_timeout"] == 3
        else:
            kwargs = opened.connection_kwargs
            assert (kwargs["connection_class"] is SSLConnection) is tls
            assert opened.retry is not None and opened.retry.get_retries() == 0
            assert kwargs["max_connections"] == 10_000
    finally:
        await close_clients(opened)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("nothing", "not a redis URL: 'nothing'"),
        ("http://x", "unknown redis URL scheme 'http'"),
        ("redis+sentinel://h:1", "unknown redis URL scheme 'redis+sentinel'"),
        ("redis://:hunter2@h:99999/0", "redis URL 'redis://:***@h:99999/0': ValueError"),
    ],
)
def test_a_client_url_that_is_not_redis_is_refused_without_its_password(
    url: str, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        connect(url)


def test_split_cluster() -> None:
    assert split_cluster("rediss+cluster://h:1") == ("rediss://h:1", True)
    assert split_cluster("redis://h:1/2") == ("redis://h:1/2", False)


async def test_closing_a_client_twice_or_a_server_that_is_gone_says_nothing() -> None:
    opened = connect(f"redis://127.0.0.1:{free_port()}/0", socket_timeout=0.5)
    await close_clients(opened, opened)
    await close_clients(opened)


# -- setup once ----------------------------------------------------------------------------------


async def test_setup_runs_once_for_concurrent_callers_again_after_a_failure_or_forget() -> None:
    runs: list[str] = []
    fail = [True]

    async def setup() -> None:
        runs.append("setup")
        await asyncio.sleep(0.01)
        if fail.pop() if fail else False:
            raise ConnectionError("not yet")

    once = Once(setup)
    with pytest.raises(ConnectionError):
        await once()
    await asyncio.gather(*(once() for _ in range(5)))
    assert runs == ["setup", "setup"]  # the failed one, then one for the five
    once.forget()
    await once()
    assert runs == ["setup", "setup", "setup"]
