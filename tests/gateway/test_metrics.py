"""``/metrics`` of a running service: the numbers agree with what happened, and reveal nothing.

Each test runs a whole `Service` on SQLite with the test agent (tests/support/gateway_agent.py),
posts messages through the web channel, and scrapes ``/metrics`` over ASGI. The scrape-time
caches are turned off (``*_ttl_s = 0``) except where the cache itself is tested.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import gateway.metrics as metrics_module
from adapters.channel import Outbound, ThreadRef
from adapters.testing import RecordingChannel
from config import Settings
from gateway.broker import open_broker
from gateway.channels import gateway_settings
from gateway.deliverer import Deliverer, DelivererConfig
from gateway.metrics import LANE_STATUSES, MODEL_ERROR_KINDS, Metrics
from gateway.service import Service
from harness_core import TokenUsage, open_repo
from harness_core.testing import ManualClock
from tests.support.service_rig import ServiceRig

AGENT = "tests.support.gateway_agent"
OPERATOR = "operator-secret-abcdefghijklmnop"
AS_OPERATOR = {"Authorization": f"Bearer {OPERATOR}"}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class Running(ServiceRig):
    """A started service and an HTTP client for its app."""

    def __init__(self, service: Service, http: httpx.AsyncClient) -> None:
        super().__init__(service, http)
        self.stopped = False

    async def stop(self, drain_seconds: float = 2) -> None:
        if not self.stopped:
            self.stopped = True
            await self.http.aclose()
            await self.service.stop(drain_seconds=drain_seconds)

    async def scrape(self) -> str:
        response = await self.http.get("/metrics")  # no token: the scrapers' convention
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/plain; version=")
        return response.text

    async def samples(self) -> Samples:
        return parse(await self.scrape())

    async def until(self, check: Callable[[Samples], bool]) -> Samples:
        """Scrape until `check` holds (counters move after the replies are visible)."""
        deadline = asyncio.get_running_loop().time() + 15
        while True:
            found = await self.samples()
            if check(found):
                return found
            assert asyncio.get_running_loop().time() < deadline, found
            await asyncio.sleep(0.05)

    async def session_usage(self, session: str) -> TokenUsage:
        storage = await self.repo.open(session)
        try:
            return (await storage.get_stats()).usage
        finally:
            await storage.close()


def parse(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def families(text: str) -> set[tuple[str, str]]:
    return {(family.name, family.type) for family in text_string_to_metric_families(text)}


def _settings(tmp_path: Path) -> Settings:
    return gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"sqlite:///{tmp_path}/web.db",
        plugin=AGENT,
        lease_seconds=3,  # a drained worker's ticket lapses after it: the takeover test waits
        renew_seconds=0.5,
        ops_tokens=(f"alice:operator:{OPERATOR}",),
    )


Start = Callable[..., Awaitable[Running]]


@pytest.fixture
async def services(tmp_path: Path) -> AsyncIterator[Start]:
    """Start services on the test's SQLite files (one after the other); stopped at the end."""
    running: list[Running] = []

    async def start(*, fresh_reads: bool = True) -> Running:
        service = Service(_settings(tmp_path))
        await service.start()
        assert service.app is not None and service.metrics is not None
        if fresh_reads:
            service.metrics.broker_ttl_s = service.metrics.lanes_ttl_s = 0
        http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=service.app), base_url="http://localhost"
        )
        running.append(Running(service, http))
        return running[-1]

    yield start
    for gw in reversed(running):
        await gw.stop()


async def test_the_numbers_agree_with_what_happened(services: Start) -> None:
    gw: Running = await services()
    texts = {
        "thread-alpha-7": "hello-marker-alpha",
        "thread-bravo-8": "question-marker-bravo",
    }
    accepted = [await gw.post(thread, text) for thread, text in texts.items()]
    await gw.post("thread-charlie-9", "/fail")
    await gw.post("thread-delta-10", "/deploy prod-marker-delta")
    for thread in (*texts, "thread-charlie-9", "thread-delta-10"):
        await gw.answers(thread, 1)  # the replies, the failure notice, the approval request

    # The page shows a reply before the deliverer records it delivered: wait for the record.
    deadline = asyncio.get_running_loop().time() + 15
    while (delivered := len(await gw.broker.outbox.list("delivered"))) < 4:
        assert asyncio.get_running_loop().time() < deadline, delivered
        await asyncio.sleep(0.02)

    def settled(s: Samples) -> bool:
        return (
            value(s, "gateway_deliveries_total", channel="web", outcome="delivered") == delivered
            and value(s, "gateway_lanes", status="suspended") == 1
        )

    samples = await gw.until(settled)
    assert value(samples, "gateway_operations_total", kind="run", outcome="completed") == 2
    assert value(samples, "gateway_operations_total", kind="run", outcome="failed") == 1
    assert value(samples, "gateway_operations_total", kind="run", outcome="aborted") == 0
    assert value(samples, "gateway_suspensions_total", reason="approval") == 1
    assert value(samples, "gateway_messages_accepted_total", channel="web") == 4
    assert value(samples, "gateway_operation_seconds_count", kind="run") == 4  # 3 ends, 1 park
    assert value(samples, "gateway_operation_seconds_sum", kind="run") > 0
    assert value(samples, "gateway_delivery_seconds_count") == delivered
    assert value(samples, "gateway_takeovers_total") == 0
    assert 1 <= value(samples, "gateway_session_takes_total") <= 4  # one session, 4 messages

    statuses = {status: value(samples, "gateway_lanes", status=status) for status in LANE_STATUSES}
    assert statuses == {
        "idle": 2,
        "running": 0,
        "suspended": 1,
        "aborting": 0,
        "failed": 1,
        "stuck": 0,
        "faulted": 0,
    }
    assert value(samples, "gateway_stuck_lanes") == 0
    assert value(samples, "gateway_lanes_truncated") == 0
    assert value(samples, "gateway_approvals_waiting") == 1  # the deploy
    assert value(samples, "gateway_approval_oldest_wait_seconds") > 0

    usage = await gw.session_usage(accepted[0]["session"])
    tokens = {
        kind: value(samples, "gateway_model_tokens_total", kind=kind)
        for kind in ("input", "output", "cache_read", "cache_write")
    }
    assert tokens["input"] > 0 and tokens["output"] > 0
    assert tokens == {
        "input": usage.input,
        "output": usage.output,
        "cache_read": usage.cache_read,
        "cache_write": usage.cache_write,
    }
    assert value(samples, "gateway_model_cost_total") == pytest.approx(usage.cost.total)

    # idle: nothing waits
    for name in (
        "gateway_inbox_backlog",
        "gateway_inbox_oldest_age_seconds",
        "gateway_inbox_rejected",
        "gateway_outbox_backlog",
        "gateway_outbox_oldest_age_seconds",
        "gateway_dead_letters",
    ):
        assert value(samples, name) == 0, name
    assert value(samples, "gateway_metrics_read_errors_total", source="broker") == 0
    assert value(samples, "gateway_metrics_read_errors_total", source="store") == 0

    # a dead letter (claimed and settled dead here, or by the deliverer: it is malformed)
    now = gw.service.parts.clock.now_ms()
    await gw.broker.outbox.enqueue("dl-1", "web-default", "web:x", {"text": "hi"}, now_ms=now)
    claimed = await gw.broker.outbox.claim("t", now_ms=now, limit=1, lease_ms=60_000)
    for one in claimed:
        assert await gw.broker.outbox.settle_dead(one, reason="HTTP 500", now_ms=now)
    await gw.until(lambda s: value(s, "gateway_dead_letters") == 1)

    # nothing anyone wrote, and no session, lane, thread or user name is in the scrape
    text = await gw.scrape()
    session = accepted[0]["session"]
    secret_free = [
        *texts.values(),
        *texts,
        "thread-charlie-9",
        "thread-delta-10",
        "prod-marker-delta",
        "web:",
        session,
        "alice",
        OPERATOR,
    ]
    assert [word for word in secret_free if word in text] == []


async def test_the_series_stay_the_same_as_threads_come_and_go(
    services: Start,
) -> None:
    gw: Running = await services()
    await gw.post("first", "one")
    await gw.answers("first", 1)
    await gw.until(
        lambda s: value(s, "gateway_deliveries_total", channel="web", outcome="delivered") == 1
    )
    before = await gw.scrape()
    for n in range(5):
        await gw.post(f"more-{n}", f"message {n}")
    for n in range(5):
        await gw.answers(f"more-{n}", 1)
    await gw.until(
        lambda s: value(s, "gateway_deliveries_total", channel="web", outcome="delivered") == 6
    )
    after = await gw.scrape()
    assert families(before) == families(after)
    assert set(parse(before)) == set(parse(after))  # the same series: no label per thread
    assert value(parse(after), "gateway_approvals_waiting") == 0
    assert value(parse(after), "gateway_approval_oldest_wait_seconds") == 0
    assert {name for name, _ in families(after)} >= {
        "gateway_inbox_backlog",
        "gateway_inbox_oldest_age_seconds",
        "gateway_inbox_rejected",
        "gateway_outbox_backlog",
        "gateway_outbox_oldest_age_seconds",
        "gateway_dead_letters",
        "gateway_lanes",
        "gateway_stuck_lanes",
        "gateway_lanes_truncated",
        "gateway_approvals_waiting",
        "gateway_approval_oldest_wait_seconds",
        "gateway_takeovers",
        "gateway_session_takes",
        "gateway_messages_accepted",
        "gateway_deliveries",
        "gateway_model_tokens",
        "gateway_model_cost",
        "gateway_operations",
        "gateway_operation_seconds",
        "gateway_delivery_seconds",
        "process_cpu_seconds",
        "process_resident_memory_bytes",
        "python_gc_collections",
    }


async def test_model_retries_are_counted_by_what_failed(
    services: Start, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.worker")
    gw: Running = await services()
    before = await gw.samples()
    assert {
        ("gateway_model_retries_total", frozenset({("kind", k)})) for k in MODEL_ERROR_KINDS
    } <= set(before)  # every kind is served from the first scrape on, at 0
    await gw.post("throttled", "/busy now")
    answers = await gw.answers("throttled", 1)
    assert answers[-1]["text"] == "You said: /busy now"
    samples = await gw.until(
        lambda s: value(s, "gateway_operations_total", kind="run", outcome="completed") == 1
    )
    retries = {
        kind: value(samples, "gateway_model_retries_total", kind=kind) for kind in MODEL_ERROR_KINDS
    }
    assert retries == {kind: float(kind == "rate_limit") for kind in MODEL_ERROR_KINDS}
    # and the log says so, for the operator who reads it after an alert
    await gw.post("refused", "/fail")
    assert "(auth)" in (await gw.answers("refused", 1))[-1]["text"]
    logged = {
        (str(r.msg), tuple(sorted(getattr(r.msg, "fields", {}).items())))
        for r in caplog.records
        if str(r.msg) in ("model request retried", "run failed")
    }
    assert {
        (name, dict(fields).get("kind") or dict(fields).get("code")) for name, fields in logged
    } == {
        ("model request retried", "rate_limit"),
        ("run failed", "auth"),
    }
    assert all(dict(fields)["lane"].startswith("web:") for _, fields in logged)


async def test_a_run_cut_by_a_drain_is_taken_over_and_counted(
    services: Start,
) -> None:
    first: Running = await services()
    await first.post("long", "/slow 1500")
    await first.until(lambda s: value(s, "gateway_lanes", status="running") == 1)
    await first.stop(drain_seconds=0.2)  # the run is cut; its operation stays open

    second: Running = await services()
    answers = await second.answers("long", 1)
    assert answers[-1]["text"] == "Done: slept 1500 ms"
    samples = await second.until(
        lambda s: value(s, "gateway_operations_total", kind="run", outcome="completed") == 1
    )
    assert value(samples, "gateway_takeovers_total") == 1
    assert value(samples, "gateway_session_takes_total") == 1  # taken once, kept warm after
    assert value(samples, "gateway_operation_seconds_count", kind="run") == 1  # from its resume
    assert value(samples, "gateway_messages_accepted_total", channel="web") == 0
    assert value(samples, "gateway_lanes", status="idle") == 1


async def test_scrape_time_reads_are_cached_and_bounded(services: Start) -> None:
    gw: Running = await services(fresh_reads=False)
    metrics = gw.service.metrics
    assert metrics is not None
    assert (metrics.broker_ttl_s, metrics.lanes_ttl_s) == (5.0, 15.0)
    assert value(await gw.samples(), "gateway_dead_letters") == 0
    now = gw.service.parts.clock.now_ms()
    await gw.broker.outbox.enqueue("dl-2", "web-default", "web:x", {"text": "hi"}, now_ms=now)
    for one in await gw.broker.outbox.claim("t", now_ms=now, limit=1, lease_ms=60_000):
        await gw.broker.outbox.settle_dead(one, reason="HTTP 500", now_ms=now)
    await asyncio.sleep(0.3)  # dead either way (malformed if the deliverer claimed it)
    scrapes = await asyncio.gather(*(gw.samples() for _ in range(5)))
    assert {value(s, "gateway_dead_letters") for s in scrapes} == {0}  # cached: 5 s

    for thread in ("a", "b", "c"):
        await gw.post(thread, "hi")
    for thread in ("a", "b", "c"):
        await gw.answers(thread, 1)
    metrics.broker_ttl_s = metrics.lanes_ttl_s = 0
    metrics.max_lanes = 2
    samples = await gw.samples()
    assert value(samples, "gateway_dead_letters") == 1
    assert value(samples, "gateway_lanes_truncated") == 1
    assert sum(value(samples, "gateway_lanes", status=s) for s in LANE_STATUSES) <= 2


async def test_a_read_that_hangs_is_cut_off_and_the_scrape_answers_in_time(
    services: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Redis that hung held a scrape 20 s (the broker's read, then the store's, each waiting
    out its socket's timeout), past Prometheus' 10 s: every scrape failed, no alert could fire
    (an outside probe). Each read is cut off at `READ_BOUND_S` now, both at once."""
    gw: Running = await services(fresh_reads=False)
    metrics = gw.service.metrics
    assert metrics is not None
    await gw.samples()
    monkeypatch.setattr(metrics_module, "READ_BOUND_S", 0.3)

    async def hung(*args: object, **kwargs: object) -> object:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    monkeypatch.setattr(gw.broker.inbox, "backlog", hung)
    monkeypatch.setattr(metrics._repo, "list", hung)
    metrics.broker_ttl_s = metrics.lanes_ttl_s = 0
    began = asyncio.get_running_loop().time()
    samples = await gw.samples()
    assert asyncio.get_running_loop().time() - began < 2.0  # both at once, each cut at 0.3 s
    assert value(samples, "gateway_metrics_read_errors_total", source="broker") == 1
    assert value(samples, "gateway_metrics_read_errors_total", source="store") == 1


class _ThreeAttempts:
    """Every lane's caps: 3 attempts, no token budget."""

    def attempts(self, thread: ThreadRef | None) -> int:
        return 3

    def budget(self, thread: ThreadRef | None) -> int | None:
        return None


async def test_delivery_outcomes_are_counted_by_channel(tmp_path: Path) -> None:
    clock = ManualClock()
    broker = open_broker(f"sqlite:///{tmp_path}/broker.db", clock=clock)
    repo = open_repo(f"sqlite:///{tmp_path}/store.db", clock=clock)
    fake = RecordingChannel(clock=clock)
    metrics = Metrics(repo, broker, clock, limits=_ThreeAttempts(), channels=["fake"])
    deliverer = Deliverer(
        DelivererConfig(deliverer_id="d1", idle_wait_ms=10, max_attempts=2),
        broker,
        {"fake": fake},
        clock,
        random.Random(7),
        metrics,
    )

    async def enqueue(delivery_id: str, channel: str = "fake") -> None:
        thread = ThreadRef(channel=channel, space="default", thread="t1")
        outbound = Outbound(delivery_id=delivery_id, thread=thread, kind="reply", text="hi")
        await broker.outbox.enqueue(
            delivery_id, "s", f"{channel}:t1", outbound.model_dump(mode="json"), now_ms=0
        )

    async def until(delivery_id: str, status: str, attempts: int) -> None:
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            found = await broker.outbox.get(delivery_id)
            settled = found is not None and (found.status != "pending" or found.last_error)
            if (
                found is not None
                and settled
                and (found.status, found.attempts) == (status, attempts)
            ):
                return
            assert asyncio.get_running_loop().time() < deadline, found
            await asyncio.sleep(0.005)

    fake.lose_ack_next(1)  # it arrives, unacknowledged: the next attempt reconciles it
    await enqueue("lost-ack")
    await enqueue("nowhere", channel="pigeon")  # no adapter: retried, then dead
    deliverer.start()
    try:
        await until("lost-ack", "pending", 1)
        await until("nowhere", "pending", 1)
        clock.advance(3_600_000)
        await until("lost-ack", "delivered", 2)
        await until("nowhere", "dead", 2)
        await asyncio.sleep(0.05)  # the counters move after the settling write
    finally:
        await deliverer.stop(1)
        await broker.close()
        await repo.close()
    samples = parse((await metrics.text()).decode())
    counted = {
        (dict(labels)["channel"], dict(labels)["outcome"]): count
        for (name, labels), count in samples.items()
        if name == "gateway_deliveries_total" and count
    }
    assert counted == {
        ("fake", "retry"): 1,
        ("fake", "reconciled"): 1,
        ("other", "retry"): 1,  # a channel no adapter serves is never a label of its own
        ("other", "dead"): 1,
    }
    assert value(samples, "gateway_delivery_seconds_count") == 4
    assert value(samples, "gateway_metrics_read_errors_total", source="broker") == 1  # closed
