"""The Redis broker beyond the shared contract: its key layout, crash repair, the client setup,
and the whole conformance suite again on a local 3-master Redis Cluster."""

from __future__ import annotations

import asyncio
import zlib
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from gateway.broker.conformance import BrokerCase, BrokerFixture, broker_cases
from gateway.broker.contract import (
    Broker,
    BrokerError,
    ClaimedDelivery,
    NewAuditEvent,
    NewInboxItem,
)
from gateway.broker.redis import RedisBroker
from harness_core import SystemClock
from harness_core.testing import ManualClock
from tests.support.redis_cluster import LocalRedisCluster
from tests.support.redis_server import RedisServer

VISIBILITY_TIMEOUT_MS = 5_000
DEDUPE_TTL_MS = 60_000


def _new(key: str, session: str = "s1", lane: str = "web:t1") -> NewInboxItem:
    return NewInboxItem(
        session=session, lane=lane, dedupe_key=key, kind="message", payload={"text": key}
    )


@pytest.fixture
async def opened() -> AsyncIterator[list[Broker]]:
    """Brokers a test opened (closed after it)."""
    brokers: list[Broker] = []
    yield brokers
    for broker in brokers:
        await broker.close()


@pytest.fixture
def open_redis(redis_server: RedisServer, redis_prefix: str, opened: list[Broker]):
    """Open brokers over one fresh prefix of the session's redis-server."""

    def open_one(**options) -> RedisBroker:
        broker = RedisBroker(redis_server.url, prefix=redis_prefix, **options)
        opened.append(broker)
        return broker

    return open_one


def _raw(server: RedisServer) -> redis.Redis:
    return redis.Redis(port=server.port, decode_responses=True)


# ---------------------------------------------------------------------------------------------
# the conformance suite on Redis Cluster

CASES = broker_cases()


@pytest.fixture
async def cluster_broker(
    redis_cluster: LocalRedisCluster, redis_prefix: str, opened: list[Broker]
) -> BrokerFixture:
    clock = ManualClock()

    async def open_another() -> Broker:
        opened.append(
            RedisBroker(
                redis_cluster.url,
                prefix=redis_prefix,
                clock=clock,
                visibility_timeout_ms=VISIBILITY_TIMEOUT_MS,
                dedupe_ttl_ms=DEDUPE_TTL_MS,
            )
        )
        return opened[-1]

    return BrokerFixture(
        name="redis-cluster",
        broker=await open_another(),
        clock=clock,
        visibility_timeout_ms=VISIBILITY_TIMEOUT_MS,
        dedupe_ttl_ms=DEDUPE_TTL_MS,
        open_another=open_another,
    )


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_conformance_on_redis_cluster(cluster_broker: BrokerFixture, case: BrokerCase):
    assert isinstance(cluster_broker.broker, RedisBroker)
    assert cluster_broker.broker.cluster
    await case.run(cluster_broker)


async def test_the_cluster_spreads_shards_over_its_masters(
    redis_cluster: LocalRedisCluster, redis_prefix: str, opened: list[Broker]
):
    broker = RedisBroker(redis_cluster.url, prefix=redis_prefix)
    opened.append(broker)
    for n in range(40):
        await broker.inbox.append(_new(f"k{n}", session=f"s{n}"))
        await broker.outbox.enqueue(f"reply:{n}", f"s{n}", "web:t1", {}, now_ms=n)
    holders = Counter[int]()
    for node in redis_cluster.nodes:
        client = redis.Redis(port=node.port, decode_responses=True)
        try:
            holders[node.port] = sum(1 for _ in client.scan_iter(f"{redis_prefix}:*"))
        finally:
            client.close()
    assert all(count > 0 for count in holders.values()), holders
    assert (await broker.inbox.backlog()).pending == 40
    assert (await broker.outbox.backlog(now_ms=100)).pending == 40


# ---------------------------------------------------------------------------------------------
# key layout


def test_every_key_of_a_session_or_a_shard_shares_one_slot():
    prefix, session = "gwb", "slack-C0123"
    session_keys = ["st", "inbox", "dd:slack:Ev1", "claim", "rej", "rejitem", "threads", "audit"]
    assert len({key_slot(f"{prefix}:{{{session}}}:{k}".encode()) for k in session_keys}) == 1
    for tag, names in (
        ("rdy-3", ["ready", "claims", "sessions"]),
        ("obx-3", ["o:reply:r1", "due", "leased", "pend", "ls:pending", "settled", "deadat"]),
        ("audit", ["seq", "log"]),
    ):
        assert len({key_slot(f"{prefix}:{{{tag}}}:{n}".encode()) for n in names}) == 1


async def test_shards_follow_crc32(open_redis, redis_server: RedisServer, redis_prefix: str):
    broker = open_redis(shards=4)
    await broker.inbox.append(_new("a", session="alpha"))
    shard = zlib.crc32(b"alpha") % 4
    raw = _raw(redis_server)
    try:
        assert raw.sismember(f"{redis_prefix}:{{rdy-{shard}}}:sessions", "alpha")
        assert raw.xlen(f"{redis_prefix}:{{rdy-{shard}}}:ready") == 1
        assert raw.xlen(f"{redis_prefix}:{{alpha}}:inbox") == 1
    finally:
        raw.close()


# ---------------------------------------------------------------------------------------------
# repair after a crash between a session's step and its shard's step


async def test_a_lost_ready_signal_is_sent_again_by_the_sweep(
    open_redis, redis_server: RedisServer, redis_prefix: str
):
    clock = ManualClock()
    broker = open_redis(clock=clock, visibility_timeout_ms=1_000)
    await broker.inbox.append(_new("a"))
    raw = _raw(redis_server)
    try:  # the process died after the session's script, before its shard's XADD
        shard = zlib.crc32(b"s1") % 16
        raw.xtrim(f"{redis_prefix}:{{rdy-{shard}}}:ready", maxlen=0)
    finally:
        raw.close()
    assert await broker.sweep() == 0  # the signal is recent: it may still be on its way
    assert await broker.inbox.take_session("w1") is None
    clock.advance(1_000)
    assert await broker.sweep() == 1
    ticket = await broker.inbox.take_session("w1")
    assert ticket is not None
    assert ticket.session == "s1"
    assert await broker.sweep() == 0  # held: nothing to signal


async def test_a_stale_signal_does_not_stop_the_next_append_from_signalling(
    open_redis, redis_server: RedisServer, redis_prefix: str
):
    clock = ManualClock()
    broker = open_redis(clock=clock, visibility_timeout_ms=1_000)
    await broker.inbox.append(_new("a"))
    raw = _raw(redis_server)
    try:
        raw.xtrim(f"{redis_prefix}:{{rdy-{zlib.crc32(b's1') % 16}}}:ready", maxlen=0)
    finally:
        raw.close()
    await broker.inbox.append(_new("b"))  # within the window: coalesced with the lost signal
    assert await broker.inbox.take_session("w1") is None
    clock.advance(1_000)
    await broker.inbox.append(_new("c"))
    ticket = await broker.inbox.take_session("w1")
    assert ticket is not None
    assert [i.dedupe_key for i in await broker.inbox.pending("s1")] == ["a", "b", "c"]


async def test_a_claim_whose_index_entry_was_lost_is_recovered_by_xautoclaim(
    open_redis, redis_server: RedisServer, redis_prefix: str
):
    """Crash after the take script, before the claim was indexed: the server-time backstop."""
    broker = open_redis(clock=SystemClock(), visibility_timeout_ms=300)
    await broker.inbox.append(_new("a"))
    first = await broker.inbox.take_session("w1")
    assert first is not None
    raw = _raw(redis_server)
    try:
        raw.delete(f"{redis_prefix}:{{rdy-{zlib.crc32(b's1') % 16}}}:claims")
    finally:
        raw.close()
    assert await broker.inbox.take_session("w2") is None
    second = await broker.inbox.take_session("w2", wait_ms=3_000)
    assert second is not None
    assert second.session == "s1"
    assert await broker.inbox.renew(first) is False


async def test_scripts_are_loaded_again_after_the_server_lost_them(
    open_redis, redis_server: RedisServer
):
    broker = open_redis()
    await broker.inbox.append(_new("a"))
    raw = _raw(redis_server)
    try:
        raw.script_flush()
    finally:
        raw.close()
    assert (await broker.inbox.append(_new("b"))).duplicate is False
    assert await broker.outbox.claim("d1", now_ms=0, limit=5, lease_ms=1_000) == ()
    assert (await broker.inbox.take_session("w1")) is not None


# ---------------------------------------------------------------------------------------------
# the client


async def test_the_client_never_retries_a_command_on_its_own(open_redis):
    broker = open_redis()
    client = broker._core.client
    assert client.get_retry().get_retries() == 0


async def test_a_server_that_is_not_there_is_a_storage_error(tmp_path: Path, opened):
    from tests.support.redis_server import free_port

    broker = RedisBroker(f"redis://127.0.0.1:{free_port()}/0", socket_timeout=0.5)
    opened.append(broker)
    with pytest.raises(BrokerError) as raised:
        await broker.inbox.append(_new("a"))
    assert raised.value.code == "storage"


async def test_a_closed_broker_refuses_calls(open_redis):
    broker = open_redis()
    await broker.inbox.append(_new("a"))
    await broker.close()
    with pytest.raises(BrokerError) as raised:
        await broker.inbox.pending("s1")
    assert raised.value.code == "closed"


@pytest.mark.parametrize(
    ("url", "cluster"),
    [
        ("redis://127.0.0.1:6379/0", False),
        ("rediss://127.0.0.1:6379/0", False),
        ("redis+cluster://127.0.0.1:7000", True),
        ("rediss+cluster://127.0.0.1:7000", True),
    ],
)
async def test_the_url_scheme_says_whether_it_is_a_cluster(url: str, cluster: bool, opened):
    broker = RedisBroker(url)
    opened.append(broker)
    assert broker.cluster is cluster


@pytest.mark.parametrize("url", ["http://x", "redis+sentinel://h:1", "nothing"])
def test_other_urls_are_refused(url: str):
    with pytest.raises(BrokerError) as raised:
        RedisBroker(url)
    assert raised.value.code == "invalid_url"


async def test_an_empty_session_is_refused_before_it_reaches_redis(opened):
    broker = RedisBroker("redis://127.0.0.1:1/0")
    opened.append(broker)
    with pytest.raises(ValueError, match="session"):
        await broker.inbox.append(_new("a", session=""))


# ---------------------------------------------------------------------------------------------
# retention and caps


async def test_settled_deliveries_are_purged_after_their_retention(open_redis):
    broker = open_redis(settled_retention_ms=1_000, dead_retention_ms=5_000)
    outbox = broker.outbox
    for delivery_id in ("ok", "dead", "pending"):
        await outbox.enqueue(delivery_id, "s1", "web:t1", {}, now_ms=0)
    claims = {c.delivery.id: c for c in await outbox.claim("d", now_ms=0, limit=3, lease_ms=10)}
    await outbox.settle_delivered(claims["ok"], now_ms=10)
    await outbox.settle_dead(claims["dead"], reason="x", now_ms=10)
    assert await broker.purge(now_ms=1_009) == 0
    assert await broker.purge(now_ms=1_010) == 1
    assert await outbox.get("ok") is None
    assert await outbox.list("delivered") == ()
    assert await broker.purge(now_ms=5_010) == 1
    assert await outbox.list("dead") == ()
    assert [d.id for d in await outbox.list("pending")] == ["pending"]  # never purged
    assert await outbox.enqueue("ok", "s1", "web:t1", {}, now_ms=6_000)  # forgotten after it


async def test_a_sessions_audit_index_is_capped(open_redis):
    broker = open_redis(audit_max_events_per_session=3)
    events = [
        await broker.audit.record(
            NewAuditEvent(actor="worker:w", action="a", session="s1", outcome="ok")
        )
        for _ in range(5)
    ]
    assert await broker.audit.list(session="s1") == tuple(events[2:])
    assert await broker.audit.list() == tuple(events)


# ---------------------------------------------------------------------------------------------
# many processes' workers on one Redis, real time


async def test_workers_of_three_brokers_process_every_item_once_one_holder_at_a_time(open_redis):
    brokers = [open_redis(clock=SystemClock(), visibility_timeout_ms=2_000) for _ in range(3)]
    sessions = [f"s{n}" for n in range(30)]
    keys = [f"k{n}" for n in range(300)]
    holders: set[str] = set()
    overlaps: list[str] = []
    accepted: Counter[str] = Counter()
    feeding = True

    async def feed() -> None:
        nonlocal feeding
        for n, key in enumerate(keys):
            await brokers[n % 3].inbox.append(_new(key, session=sessions[n % len(sessions)]))
            if n % 7 == 0:
                await asyncio.sleep(0)
        feeding = False

    async def worker(name: str, broker: Broker) -> None:
        idle = 0
        while feeding or idle < 3:
            ticket = await broker.inbox.take_session(name, wait_ms=100)
            if ticket is None:
                idle += 1
                continue
            idle = 0
            if ticket.session in holders:
                overlaps.append(ticket.session)
            holders.add(ticket.session)
            for item in await broker.inbox.pending(ticket.session):
                accepted[item.dedupe_key] += 1
                await broker.inbox.ack(ticket.session, item.id)
                await asyncio.sleep(0)
            assert await broker.inbox.renew(ticket)
            holders.discard(ticket.session)
            await broker.inbox.done(ticket)

    await asyncio.wait_for(
        asyncio.gather(feed(), *(worker(f"w{n}", brokers[n % 3]) for n in range(9))), 60
    )
    assert overlaps == []
    assert sorted(accepted) == sorted(keys)
    assert set(accepted.values()) == {1}
    backlog = await brokers[0].inbox.backlog()
    assert (backlog.pending, backlog.dead) == (0, 0)


# ---------------------------------------------------------------------------------------------
# dedupe keys and cursors


async def test_a_dedupe_key_lasts_while_its_item_is_pending_or_rejected(
    open_redis, redis_server: RedisServer, redis_prefix: str
):
    clock = ManualClock()
    broker = open_redis(clock=clock, dedupe_ttl_ms=60_000)
    a = (await broker.inbox.append(_new("a"))).item
    b = (await broker.inbox.append(_new("b"))).item
    raw = _raw(redis_server)
    try:

        def ttl(key: str) -> int:
            return int(raw.pttl(f"{redis_prefix}:{{s1}}:dd:{key}"))

        assert (ttl("a"), ttl("b")) == (-1, -1)  # pending: kept however long it waits
        clock.advance(45_000)
        await broker.inbox.ack("s1", a.id)
        await broker.inbox.reject("s1", b.id, "bad")
        assert 14_000 < ttl("a") <= 15_000  # the rest of its window
        assert ttl("b") == -1  # rejected items are kept, and so are their keys
        clock.advance(20_000)
        await broker.inbox.ack("s1", a.id)  # settled already: nothing changes
        assert 14_000 < ttl("a") <= 15_000
    finally:
        raw.close()


async def test_an_item_acked_after_its_window_lets_its_key_go_at_once(
    open_redis, redis_server: RedisServer, redis_prefix: str
):
    clock = ManualClock()
    broker = open_redis(clock=clock, dedupe_ttl_ms=60_000)
    first = (await broker.inbox.append(_new("a"))).item
    clock.advance(61_000)
    await broker.inbox.ack("s1", first.id)
    await asyncio.sleep(0.01)
    again = await broker.inbox.append(_new("a"))
    assert again.duplicate is False
    assert again.item.id != first.id


async def test_audit_cursors_may_be_any_string(open_redis):
    broker = open_redis()
    events = [
        await broker.audit.record(NewAuditEvent(actor="worker:w", action="a", outcome="ok"))
        for _ in range(3)
    ]
    assert await broker.audit.list(after="") == tuple(events)
    assert await broker.audit.list(after=events[0].id + "x") == tuple(events[1:])
    assert await broker.audit.list(after="~") == ()


# ---------------------------------------------------------------------------------------------
# real time: a dead worker's session is taken over after the visibility timeout, a renewed one
# never is


async def test_a_dead_workers_session_is_taken_over_right_after_the_timeout(open_redis):
    alive, other = (open_redis(clock=SystemClock(), visibility_timeout_ms=400) for _ in range(2))
    await alive.inbox.append(_new("a"))
    assert await alive.inbox.take_session("w1") is not None  # ... and w1 dies
    loop = asyncio.get_running_loop()
    started = loop.time()
    ticket = await other.inbox.take_session("w2", wait_ms=5_000)
    took = loop.time() - started
    assert ticket is not None
    assert ticket.session == "s1"
    assert 0.3 < took < 1.0, took


async def test_a_renewed_session_is_never_handed_to_another_worker(open_redis):
    holder, other = (open_redis(clock=SystemClock(), visibility_timeout_ms=300) for _ in range(2))
    await holder.inbox.append(_new("a"))
    ticket = await holder.inbox.take_session("w1")
    assert ticket is not None
    stolen: list[str] = []

    async def keep() -> None:
        for _ in range(12):
            await asyncio.sleep(0.1)
            assert await holder.inbox.renew(ticket)

    async def try_to_take() -> None:
        while not keeper.done():
            got = await other.inbox.take_session("w2", wait_ms=200)
            if got is not None:
                stolen.append(got.session)

    keeper = asyncio.ensure_future(keep())
    await asyncio.gather(keeper, try_to_take())
    assert stolen == []
    await holder.inbox.done(ticket)
    again = await other.inbox.take_session("w2", wait_ms=1_000)
    assert again is not None


async def test_a_session_deferred_by_one_process_is_taken_by_another_when_due(open_redis):
    first, second = (open_redis(clock=SystemClock(), visibility_timeout_ms=30_000) for _ in "ab")
    await first.inbox.append(_new("a"))
    ticket = await first.inbox.take_session("w1")
    assert ticket is not None
    assert await second.inbox.take_session("w2") is None  # held: second looked, knows when
    loop = asyncio.get_running_loop()
    waiting = asyncio.ensure_future(second.inbox.take_session("w2", wait_ms=5_000))
    await asyncio.sleep(0.05)
    started = loop.time()
    await first.inbox.done(ticket, again_in_ms=300)  # e.g. another process holds the lease
    again = await asyncio.wait_for(waiting, 5)
    took = loop.time() - started
    assert again is not None
    assert again.session == "s1"
    assert 0.25 < took < 1.0, took


# ---------------------------------------------------------------------------------------------
# a deliverer looks only where something may be claimable


def _count_peeks(broker: RedisBroker, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many shards each claim looked at (one count per claim that looked at any: its
    pipelined peeks, or 1 for a one-shard claim's `outbox_take`)."""
    core = broker._core
    evals, eval_ = core.evals, core.eval
    counts: list[int] = []

    async def counted(calls):
        counts.append(sum(1 for name, _, _ in calls if name == "outbox_peek"))
        return await evals(calls)

    async def counted_one(name, keys, args):
        if name == "outbox_take":
            counts.append(1)
        return await eval_(name, keys, args)

    monkeypatch.setattr(core, "evals", counted)
    monkeypatch.setattr(core, "eval", counted_one)
    return counts


async def test_a_deliverer_peeks_only_at_the_shard_rung_by_an_enqueue(
    open_redis, monkeypatch: pytest.MonkeyPatch
):
    deliverer = open_redis(clock=SystemClock())
    other = open_redis(clock=SystemClock())  # another process enqueues
    outbox = deliverer.outbox
    peeks = _count_peeks(deliverer, monkeypatch)
    now = SystemClock().now_ms()
    assert await outbox.claim("d", now_ms=now, limit=8, lease_ms=60_000) == ()
    assert peeks == [16]  # nothing known yet: every shard
    waiting = asyncio.ensure_future(outbox.wait(5_000))  # reads when each shard may be due
    await asyncio.sleep(0.1)
    assert not waiting.done()
    await other.outbox.enqueue("reply:x", "s1", "web:t1", {}, now_ms=SystemClock().now_ms())
    await asyncio.wait_for(waiting, 5)  # the ring woke it
    claimed = await outbox.claim("d", now_ms=SystemClock().now_ms(), limit=8, lease_ms=60_000)
    assert [c.delivery.id for c in claimed] == ["reply:x"]
    assert peeks[1:] == [1]  # only the rung shard, in one call that read when it may be due
    assert await outbox.claim("d", now_ms=SystemClock().now_ms(), limit=8, lease_ms=60_000) == ()
    assert peeks[2:] == []  # every shard is known: nothing claimable before the lease ends


async def test_a_retry_another_process_settles_is_claimed_when_due_not_at_its_lease_expiry(
    open_redis,
):
    deliverer = open_redis(clock=SystemClock())
    other = open_redis(clock=SystemClock())
    clock = SystemClock()
    await other.outbox.enqueue("reply:r", "s1", "web:t1", {}, now_ms=clock.now_ms())
    (held,) = await other.outbox.claim("o", now_ms=clock.now_ms(), limit=1, lease_ms=60_000)
    outbox = deliverer.outbox
    assert await outbox.claim("d", now_ms=clock.now_ms(), limit=8, lease_ms=60_000) == ()
    waiting = asyncio.ensure_future(outbox.wait(30_000))  # reads: the lease ends in 60 s
    await asyncio.sleep(0.1)
    assert not waiting.done()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await other.outbox.settle_retry(
        held,
        due_at_ms=clock.now_ms() + 300,
        reason="x",
        unknown_outcome=False,
        now_ms=clock.now_ms(),
    )
    claimed: tuple[ClaimedDelivery, ...] = ()
    while not claimed and loop.time() - started < 30:  # half the lease: a slow machine passes
        await asyncio.wait_for(waiting, 30)
        claimed = await outbox.claim("d", now_ms=clock.now_ms(), limit=8, lease_ms=60_000)
        waiting = asyncio.ensure_future(outbox.wait(30_000))
    waiting.cancel()
    assert [c.delivery.id for c in claimed] == ["reply:r"]
    assert 0.25 < loop.time() - started < 30  # when due (0.3 s), not when the lease ends (60 s)


async def test_an_enqueue_whose_ring_was_lost_is_found_by_the_next_full_look(
    open_redis, monkeypatch: pytest.MonkeyPatch
):
    deliverer = open_redis(clock=SystemClock())
    silent = open_redis(clock=SystemClock())

    async def lost(hint: str = "") -> None:  # the wake-up never reached the server
        return None

    monkeypatch.setattr(silent._core.outbox_bell, "ring", lost)
    clock = SystemClock()
    outbox = deliverer.outbox
    assert await outbox.claim("d", now_ms=clock.now_ms(), limit=8, lease_ms=60_000) == ()
    await outbox.wait(0)  # every shard read: nothing anywhere
    await silent.outbox.enqueue("reply:q", "s1", "web:t1", {}, now_ms=clock.now_ms())
    loop = asyncio.get_running_loop()
    started = loop.time()
    claimed: tuple[ClaimedDelivery, ...] = ()
    while not claimed and loop.time() - started < 10:  # a deliverer's loop, idle wait 200 ms
        claimed = await outbox.claim("d", now_ms=clock.now_ms(), limit=8, lease_ms=60_000)
        if not claimed:
            await outbox.wait(200)
    assert [c.delivery.id for c in claimed] == ["reply:q"]
    # found by a full look (every poll interval, 1 s): without one it never would be; the
    # bound leaves a slow machine ten times that
