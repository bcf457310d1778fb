"""deploy/alerts.yml: promtool accepts it, and each alert fires on a real gateway in its state.

Each test puts a real gateway in a state (SQLite or Redis, the test agent of
`tests.support.gateway_agent`, the real web or webhook channel, a real MCP server, a real
`gateway serve` process killed with SIGKILL), scrapes its ``/metrics`` once, turns the scrape
into ``promtool test rules`` input (`tests.support.alert_series`: the state, lasting) and asks
promtool which alerts fire. Every check names every alert of the file: the ones the state must
fire (with their rendered labels and annotations) and, at the same time, the ones it must not.
A healthy idle gateway fires none.

Where a state takes long to reach for real, the cheapest honest way is used and said: a dead
letter after 2 attempts with a 1 s backoff (settings a deployment could give), a message left
pending by ``busy_policy=next_run`` behind an approval wait, a reply left in the outbox by
stopping the deliverer. Ages are scraped at a second or so; `Timeline` grows them as the time
the state lasts (the rules' thresholds are minutes and hours).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from config import Settings
from gateway.channels import gateway_settings
from gateway.service import Service
from tests.support.alert_series import (
    TARGET,
    AlertCheck,
    Timeline,
    alert_rules,
    expected_alert,
    input_series,
    promtool_test,
)
from tests.support.gateway_process import GatewayProcess
from tests.support.redis_server import RedisServer
from tests.support.service_rig import ServiceRig
from tests.support.webhook_peer import WebhookPeer, new_secret

ROOT = Path(__file__).resolve().parents[2]
RULE_FILE = ROOT / "deploy" / "alerts.yml"
RULES = alert_rules(RULE_FILE)
AGENT = "tests.support.gateway_agent"

FIRES_BY: Mapping[str, str] = {
    # the age passes 5 min after ~5 min, then `for: 5m`
    "GatewayInboxStale": "11m",
    "GatewayOutboxStale": "11m",
    "GatewayDeadLetters": "3m",  # from the first step, then `for: 1m`
    "GatewayDeadLettersGrowing": "1h10m",  # 1 h of history (offset), then `for: 5m`
    "GatewayStuckLanes": "3m",
    "GatewayRepeatedTakeovers": "1h",  # the subquery's window
    "GatewayDeliveryFailures": "35m",  # a 15 min window, then `for: 15m`
    "GatewayApprovalWaiting": "24h15m",  # a day, then `for: 10m`
    "GatewayMetricsStale": "15m",  # failures in every 5 min window, then `for: 10m`
    "GatewayMcpServerDown": "7m",  # `for: 5m`
    "GatewayRunsFailing": "30m",  # a 10 min window, then `for: 15m`
    "GatewayModelThrottled": "30m",  # a 10 min window, then `for: 15m`
}
"""When each alert must fire if its state lasts (and must not on a healthy gateway)."""

STEPS = 24 * 60 + 20
"""Minutes the series run: past the latest `FIRES_BY`."""
ONCE = Timeline(steps=STEPS)
"""What the scrape counted happened once."""
RECURRING = Timeline(steps=STEPS, repeat_every_s=300)
"""What the scrape counted happens again every 5 minutes (the state keeps doing it)."""

JOB = {"job": TARGET["job"]}
REPLICA = dict(TARGET)


# -- the rule file ---------------------------------------------------------------------------


def test_promtool_accepts_the_rule_file() -> None:
    checked = subprocess.run(
        ["promtool", "check", "rules", str(RULE_FILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(RULES)} rules found" in checked.stdout


def test_every_alert_has_a_severity_its_texts_and_a_documented_threshold() -> None:
    docs = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    alerts_section = docs.split("## Alerts", 1)[1].split("\n## ", 1)[0]
    assert set(RULES) == set(FIRES_BY)  # a new alert gets its firing test here
    for name, rule in RULES.items():
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert set(rule["annotations"]) == {"summary", "description", "runbook"}, name
        for text in rule["annotations"].values():
            # only label templates, so the tests below can render every annotation exactly
            assert "{{" not in re.sub(r"\{\{ \$labels\.[a-z_]+ \}\}", "", text), (name, text)
        assert f"`{name}`" in alerts_section, f"docs/deploy.md, Alerts: {name} is missing"


# -- checking a scrape -------------------------------------------------------------------------


def fires(
    scrape: str,
    timeline: Timeline,
    expected: Mapping[str, Sequence[Mapping[str, str]]],
    directory: Path,
    name: str,
) -> None:
    """Promtool fires exactly `expected` (alert -> the labels of each firing series), by the
    alerts' `FIRES_BY` times, on `scrape` lasting over `timeline`; every other alert is silent."""
    unknown = set(expected) - set(RULES)
    assert not unknown, unknown
    checks = [
        AlertCheck(
            alert=alert,
            eval_time=FIRES_BY[alert],
            expected=tuple(
                expected_alert(RULES[alert], labels) for labels in expected.get(alert, [])
            ),
        )
        for alert in RULES
    ]
    series = input_series(scrape, timeline)
    for ran in promtool_test(RULE_FILE, series, checks, timeline, directory, name):
        assert ran.returncode == 0, f"{name}:\n{ran.stdout}\n{ran.stderr}"
        assert "SUCCESS" in ran.stdout, ran.stdout


def samples(scrape: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(scrape)
        for sample in family.samples
    }


def value(scrape: str, name: str, **labels: str) -> float:
    return samples(scrape).get((name, frozenset(labels.items())), 0.0)


def idle(scrape: str) -> bool:
    """Nothing waits in the inbox or the outbox.

    A scrape reads the backlogs before it prints the counters, so one taken while a reply is
    being sent can show it delivered and still pending: its age, lasting, would be a reply
    that never goes out. A test that means a state without waits scrapes until this holds.
    """
    return all(value(scrape, f"gateway_{box}_backlog") == 0 for box in ("inbox", "outbox"))


# -- a gateway in the test's process ---------------------------------------------------------


class Gateway(ServiceRig):
    """A started service, a client for its app, and its scrape (read afresh each time)."""

    async def scrape(self) -> str:
        response = await self.http.get("/metrics")  # no token: a scraper's request
        assert response.status_code == 200, response.text
        return response.text

    async def until(self, check: Callable[[str], bool], timeout_s: float = 15) -> str:
        """Scrape until `check` holds; that scrape."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            scrape = await self.scrape()
            if check(scrape):
                return scrape
            assert asyncio.get_running_loop().time() < deadline, scrape
            await asyncio.sleep(0.05)


def _settings(tmp_path: Path, **more: Any) -> Settings:
    stores = {"web_url": f"sqlite:///{tmp_path}/web.db"}
    if "redis_url" not in more:  # an explicit store or broker URL would win over Redis
        stores |= {
            "store_url": f"sqlite:///{tmp_path}/store.db",
            "broker_url": f"sqlite:///{tmp_path}/broker.db",
        }
    return gateway_settings(**{**stores, "plugin": AGENT, **more})


@contextlib.asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[Gateway]:
    service = Service(settings)
    await service.start()
    assert service.app is not None and service.metrics is not None
    service.metrics.broker_ttl_s = service.metrics.lanes_ttl_s = 0  # each scrape reads afresh
    transport = httpx.ASGITransport(app=service.app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            yield Gateway(service, http)
    finally:
        await service.stop(drain_seconds=1)


# -- healthy -----------------------------------------------------------------------------------


async def answered(
    gw: Gateway, said: Mapping[str, str], counted: Callable[[str], bool]
) -> tuple[list[str], str]:
    """Post each thread its text and wait for its first answer; then scrape until nothing
    waits and `counted` holds. The answers' texts and that scrape."""
    for thread, text in said.items():
        await gw.post(thread, text)
    answers = [(await gw.answers(thread, 1))[0]["text"] for thread in said]
    return answers, await gw.until(lambda s: idle(s) and counted(s))


def runs(outcome: str, count: int) -> Callable[[str], bool]:
    """A scrape counts `count` runs ended with `outcome`."""
    return lambda s: value(s, "gateway_operations_total", kind="run", outcome=outcome) == count


async def test_a_healthy_idle_gateway_fires_nothing(tmp_path: Path) -> None:
    async with serving(_settings(tmp_path)) as gw:
        _, scrape = await answered(
            gw,
            {"hello": "hello"},
            lambda s: value(s, "gateway_deliveries_total", channel="web", outcome="delivered") == 1,
        )
    assert value(scrape, "gateway_messages_accepted_total", channel="web") == 1
    # what it did, done once or again every 5 minutes: no alert either way
    fires(scrape, ONCE, {}, tmp_path, "healthy-once")
    fires(scrape, RECURRING, {}, tmp_path, "healthy-recurring")


# -- waits: a message not taken in, a reply not sent, an approval not given -------------------


async def test_waiting_messages_replies_and_approvals_fire_their_alerts(tmp_path: Path) -> None:
    settings = _settings(tmp_path, busy_policy="next_run")
    async with serving(settings) as gw:
        await gw.post("ship", "/deploy prod")
        await gw.answers("ship", 1)  # the approval request, delivered
        await gw.post("ship", "and after that?")  # next_run: pending behind the open run
        await gw.answers("ship", 2)  # told it waits behind the request (D334), delivered
        assert gw.service.deliverer is not None
        await gw.service.deliverer.stop(1)  # the deliverer is gone: replies stay in the outbox
        await gw.post("other", "hello")
        scrape = await gw.until(
            lambda s: (
                value(s, "gateway_inbox_oldest_age_seconds") > 0
                and value(s, "gateway_outbox_oldest_age_seconds") > 0
                and value(s, "gateway_approvals_waiting") == 1
            )
        )
    assert value(scrape, "gateway_inbox_backlog") == 1
    assert value(scrape, "gateway_outbox_backlog") == 1
    fires(
        scrape,
        ONCE,
        {
            "GatewayInboxStale": [JOB],
            "GatewayOutboxStale": [JOB],
            "GatewayApprovalWaiting": [JOB],
        },
        tmp_path,
        "waits",
    )


# -- a channel that refuses every reply ------------------------------------------------------


async def test_a_refusing_channel_fires_delivery_failures_and_dead_letters(
    tmp_path: Path,
) -> None:
    secret = new_secret("alerts")
    async with WebhookPeer(secret=secret) as peer:
        peer.fail(503, times=1000)
        settings = _settings(
            tmp_path,
            webhook_url=peer.url,
            webhook_secret=secret,
            outbox_max_attempts=2,  # dead after 2 attempts (12 by default: hours)
            outbox_max_delay_seconds=1,  # ... 1 s apart
        )
        async with serving(settings) as gw:
            sent = await peer.send(
                gw.http, {"thread": "t1", "text": "hello", "author": {"id": "u"}}
            )
            assert sent.status_code == 202, sent.text
            scrape = await gw.until(lambda s: idle(s) and value(s, "gateway_dead_letters") == 1)
    assert len(peer.posts) == 2 and not peer.taken
    webhook = {"channel": "webhook"}
    for outcome, count in (("retry", 1), ("dead", 1), ("delivered", 0)):
        assert value(scrape, "gateway_deliveries_total", outcome=outcome, **webhook) == count
    # once: one reply lost, a ticket; nothing pages
    fires(scrape, ONCE, {"GatewayDeadLetters": [JOB]}, tmp_path, "refused-once")
    # the channel keeps refusing: most attempts fail and dead letters pile up
    fires(
        scrape,
        RECURRING,
        {
            "GatewayDeadLetters": [JOB],
            "GatewayDeadLettersGrowing": [JOB],
            "GatewayDeliveryFailures": [{**JOB, **webhook}],
        },
        tmp_path,
        "refused-recurring",
    )


# -- the backends stop answering -------------------------------------------------------------


async def test_backends_that_stop_answering_fire_stale_metrics(tmp_path: Path) -> None:
    redis = RedisServer(tmp_path / "redis").start()
    try:
        async with serving(_settings(tmp_path, redis_url=redis.url)) as gw:
            healthy = await gw.until(idle)  # the values served once reads fail
            redis.stop()
            scrape = await gw.until(
                lambda s: (
                    value(s, "gateway_metrics_read_errors_total", source="broker") > 0
                    and value(s, "gateway_metrics_read_errors_total", source="store") > 0
                )
            )
            redis.start()  # back, so the service stops cleanly
    finally:
        redis.stop()
    assert value(healthy, "gateway_metrics_read_errors_total", source="broker") == 0
    replica = [{**REPLICA, "source": "broker"}, {**REPLICA, "source": "store"}]
    fires(scrape, RECURRING, {"GatewayMetricsStale": replica}, tmp_path, "stale-recurring")
    fires(scrape, ONCE, {}, tmp_path, "stale-once")  # one failed read is a blip


async def test_an_mcp_server_that_cannot_start_fires_mcp_server_down(tmp_path: Path) -> None:
    # "broken" exits at once every time it is started (retried with a backoff); "demo" works
    demo = {
        "name": "demo",
        "command": sys.executable,
        "args": ["-m", "tests.support.mcp_servers", "--stdio"],
        "cwd": str(ROOT),
    }
    broken = {"name": "broken", "command": "/bin/false"}
    settings = _settings(tmp_path, mcp_servers=(demo, broken))
    async with serving(settings) as gw:
        scrape = await gw.until(idle)
    assert value(scrape, "gateway_mcp_server_up", server="broken") == 0
    assert value(scrape, "gateway_mcp_server_up", server="demo") == 1
    down = {"GatewayMcpServerDown": [{**REPLICA, "server": "broken"}]}
    fires(scrape, ONCE, down, tmp_path, "mcp")


# -- the model side: a refused key, a throttling provider ------------------------------------


async def test_a_model_that_refuses_the_key_fires_runs_failing(tmp_path: Path) -> None:
    async with serving(_settings(tmp_path)) as gw:
        # the scripted model: an authentication error
        notices, scrape = await answered(gw, dict.fromkeys("abc", "/fail"), runs("failed", 3))
    assert all("(auth)" in notice for notice in notices)
    assert value(scrape, "gateway_operations_total", kind="run", outcome="completed") == 0
    # three failures once: a burst that stopped, nothing fires
    fires(scrape, ONCE, {}, tmp_path, "failing-once")
    # every run keeps failing: page
    fires(scrape, RECURRING, {"GatewayRunsFailing": [JOB]}, tmp_path, "failing-recurring")


async def test_threads_that_spent_their_budget_do_not_page(tmp_path: Path) -> None:
    async with serving(_settings(tmp_path, token_budget=1)) as gw:
        await answered(gw, dict.fromkeys("abc", "hello"), runs("completed", 3))
        notices = []
        for thread in "abc":  # each asks twice more: stopped at its budget both times
            for count in (2, 3):
                await gw.post(thread, "again")
                notices.append((await gw.answers(thread, count))[-1]["text"])
        scrape = await gw.until(lambda s: idle(s) and runs("failed", 6)(s))
    assert len(notices) == 6 and all("(token_budget)" in notice for notice in notices)
    assert value(scrape, "gateway_runs_stopped_total", limit="token_budget") == 6
    assert value(scrape, "gateway_runs_stopped_total", limit="turn_limit") == 0
    # two runs of three failed, again and again: what the operator's budget does, not a page
    fires(scrape, RECURRING, {}, tmp_path, "budget-recurring")


async def test_a_throttling_provider_fires_model_throttled(tmp_path: Path) -> None:
    said = {f"t{n}": "/busy" for n in range(6)}  # rate limited once, answered 1 s later
    async with serving(_settings(tmp_path)) as gw:
        answers, scrape = await answered(gw, said, runs("completed", 6))
    assert answers == ["You said: /busy"] * 6
    assert value(scrape, "gateway_model_retries_total", kind="rate_limit") == 6
    # six retries once: nothing; six every 5 minutes, and the runs still answer: a warning
    fires(scrape, ONCE, {}, tmp_path, "throttled-once")
    fires(scrape, RECURRING, {"GatewayModelThrottled": [JOB]}, tmp_path, "throttled-recurring")


# -- a crash: `gateway serve` killed -----------------------------------------------------------


VIEWER = "alerts-viewer-secret-0123456789"


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_killed_process_fires_stuck_lanes_and_repeated_takeovers(tmp_path: Path) -> None:
    settings = {
        "store_url": f"sqlite:///{tmp_path}/store.db",
        "broker_url": f"sqlite:///{tmp_path}/broker.db",
        "web_url": f"sqlite:///{tmp_path}/web.db",
        "plugin": AGENT,
        "lease_seconds": "3",
        "renew_seconds": "0.5",
        # the web space "fragile" allows one attempt: its interrupted lane is parked at once
        "profiles": json.dumps([{"name": "fragile", "max_attempts": 1}]),
        "routes": json.dumps(
            [{"channel": "web", "space": "fragile", "session": "web-fragile", "profile": "fragile"}]
        ),
        "ops_tokens": f"ann:viewer:{VIEWER}",
    }
    gateway = GatewayProcess("gw", tmp_path, settings).start()
    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as http:

            async def lanes(query: str, count: int) -> None:
                """Wait until the operator API lists `count` lanes (it reads the store afresh,
                where /metrics would serve its 15 s cache: the first scrape comes after)."""
                auth = {"Authorization": f"Bearer {VIEWER}"}
                deadline = asyncio.get_running_loop().time() + 30
                while True:
                    listed = await http.get(f"/api/v1/lanes?{query}", headers=auth)
                    if listed.status_code == 200 and len(listed.json()["items"]) == count:
                        return
                    assert asyncio.get_running_loop().time() < deadline, gateway.tail()
                    await asyncio.sleep(0.1)

            async def scrape(check: Callable[[str], bool]) -> str:
                """Scrape until `check` holds and nothing waits (a stuck notice not sent yet,
                say: `idle`); the backlogs are read at most every 5 s here."""
                deadline = asyncio.get_running_loop().time() + 30
                while True:
                    response = await http.get("/metrics")
                    assert response.status_code == 200, response.text
                    found = response.text
                    if idle(found) and check(found):
                        return found
                    assert asyncio.get_running_loop().time() < deadline, gateway.tail()
                    await asyncio.sleep(0.1)

            for space, thread in (("fragile", "alpha"), ("default", "bravo")):
                posted = await http.post(
                    f"/web/threads/{thread}/messages", json={"text": "/slow 60000", "space": space}
                )
                assert posted.status_code == 202, posted.text
            await lanes("status=running", 2)
            gateway.kill()  # SIGKILL mid-run: both runs' operations stay open
            gateway.restart()  # this machine's dead holder: its sessions are taken at once
            await lanes("stuck=true", 1)
            crashed = await scrape(
                lambda s: (
                    value(s, "gateway_takeovers_total") == 1
                    and value(s, "gateway_stuck_lanes") == 1
                )
            )
    finally:
        gateway.stop()
    assert value(crashed, "gateway_lanes", status="running") == 1  # bravo, taken over
    # one crash: the parked lane pages, the takeover does not; the same crash again every 5
    # minutes: takeovers in every window of the hour
    fires(crashed, ONCE, {"GatewayStuckLanes": [JOB]}, tmp_path, "crash-once")
    both = {"GatewayStuckLanes": [JOB], "GatewayRepeatedTakeovers": [JOB]}
    fires(crashed, RECURRING, both, tmp_path, "crash-recurring")
