"""A Redis that lost the gateway's data (flushed, restarted empty) is said, in every process (D348).

Before, a ``FLUSHALL`` or a Redis restarted with nothing on disk went by without a word: the
accepted messages, the sessions and the replies were gone, and the log said nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from pathlib import Path

import httpx
import pytest
import redis

from gateway.kept import MARK, KeptWatch, first_words
from tests.support.gateway_process import GatewayProcess
from tests.support.redis_server import RedisServer

AGENT = "tests.support.gateway_agent"


async def test_every_process_says_a_flushed_redis_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = RedisServer(tmp_path / "redis").start()
    store, broker = f"{server.url}?prefix=st", f"{server.url}?prefix=br"
    one = KeptWatch.of([(store, "gw"), (broker, "gwb")], random.Random(1))
    two = KeptWatch.of([(store, "gw"), (broker, "gwb")], random.Random(2))
    other = KeptWatch.of([("sqlite:///x.db", "gw"), ("memory://", "gwb")], random.Random(3))
    assert one is not None and two is not None and other is None
    client = redis.Redis(port=server.port)
    try:
        caplog.set_level(logging.ERROR, logger="gateway.kept")
        assert await one.check() == [] and await two.check() == []  # the first looks learn
        assert await one.check() == [] and await two.check() == []
        assert client.keys("*") == [f"st:{MARK}".encode()]  # one mark: the store's prefix
        client.flushall()
        assert await one.check() == [server.url]  # writes a new mark
        assert await two.check() == [server.url]  # finds another than it saw
        assert await one.check() == [] and await two.check() == []  # said once per loss
        server.kill()
        assert await one.check() == []  # unreachable: the outage says so, not this
        server.start()  # no AOF, no snapshot: empty
        assert await one.check() == [server.url]
        assert await two.check() == [server.url]
    finally:
        await one.close()
        await two.close()
        client.close()
        server.stop()
    lost = [r for r in caplog.records if r.getMessage() == "redis lost the gateway's data"]
    assert len(lost) == 4
    assert getattr(lost[0].msg, "fields", {})["url"] == server.url


async def test_gateway_serve_says_a_redis_restarted_empty(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()  # no AOF: a restart is empty
    url = f"{server.url}?prefix=gone"
    settings = {"store_url": url, "broker_url": url, "web_url": url, "plugin": AGENT}
    gateway = GatewayProcess("gw", tmp_path, settings).start()
    try:
        server.kill()
        server.start()
        deadline = time.monotonic() + 15  # a look every 10 s
        while "redis lost the gateway's data" not in gateway.log_path.read_text():
            assert time.monotonic() < deadline, gateway.tail(40)
            await asyncio.sleep(0.2)
    finally:
        gateway.stop()
        server.stop()
    lines = [json.loads(x) for x in gateway.log_path.read_text().splitlines() if x[:1] == "{"]
    [lost] = [e for e in lines if e["event"] == "redis lost the gateway's data"]
    assert lost["level"] == "error" and lost["url"] == server.url, lost


def test_a_redis_that_refuses_writes_is_not_ready_and_a_user_without_eval_not_served(
    tmp_path: Path,
) -> None:
    """Every write the gateway makes is a script: a user without EVAL started and said ready
    while every post was 503, and a Redis full under noeviction said ready for the whole
    minute every post was refused (an outside probe)."""
    server = RedisServer(tmp_path / "redis").start()
    admin = redis.Redis(port=server.port)
    url = f"{server.url}?prefix=w"
    settings = {"store_url": url, "broker_url": url, "web_url": url, "plugin": AGENT}
    gateway = GatewayProcess("gw", tmp_path, settings).start()
    try:
        ready = httpx.get(f"{gateway.url}/readyz", timeout=10)
        assert ready.status_code == 200 and ready.json()["redis_write"] == "ok", ready.text
        used = int(admin.info("memory")["used_memory"])
        admin.config_set("maxmemory", used + 1024)  # full: noeviction refuses every write
        try:
            full = httpx.get(f"{gateway.url}/readyz", timeout=10)
        finally:
            admin.config_set("maxmemory", 0)
        assert full.status_code == 503 and full.json()["redis_write"] != "ok", full.text
        assert full.json()["broker"] == "ok"  # what was probed before: reads answer
    finally:
        gateway.stop()
    admin.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", "noeval", "on", ">noeval-password-0123456789", "~*", "&*", "+@all",
        "-eval", "-evalsha",
    )  # fmt: skip
    refused_url = f"redis://noeval:noeval-password-0123456789@127.0.0.1:{server.port}/0?prefix=w"
    refused = {**settings, "store_url": refused_url, "broker_url": refused_url}
    try:
        started, said = _refused_start("gw2", tmp_path, {**refused, "web_url": refused_url})
    finally:
        admin.close()
        server.stop()
    assert any("cannot run the gateway's scripts" in x and "EVAL" in x for x in said), said
    assert "noeval-password" not in started.log_path.read_text()


def test_a_redis_that_closes_at_once_is_refused_in_its_own_words(tmp_path: Path) -> None:
    """A Redis at its maxclients (or in protected mode, reached from another host) writes one
    error line on accept, then closes: `gateway serve` said only "Connection lost", the line
    reset away by the close as it sent its first command (an outside probe)."""
    server = RedisServer(tmp_path / "redis", options=("--maxclients", "1")).start()
    holder = redis.Redis(port=server.port)
    holder.ping()  # the one connection it takes
    url = f"{server.url}?prefix=w"
    settings = {"store_url": url, "broker_url": url, "web_url": url, "plugin": AGENT}
    try:
        assert asyncio.run(first_words(server.url)) == "ERR max number of clients reached"
        _, said = _refused_start("gw", tmp_path, settings)
    finally:
        holder.close()
        server.stop()
    assert said == [
        f"gateway: the broker and the store at {url} cannot be used (ConnectionRefusedError: "
        "the server said: ERR max number of clients reached)"
    ], said


async def test_a_redis_that_says_nothing_on_accept_has_no_first_words(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    try:
        assert await first_words(server.url, within_s=0.2) is None  # a healthy Redis waits
        assert await first_words(f"rediss://127.0.0.1:{server.port}/0") is None  # not asked
    finally:
        server.stop()
    assert await first_words(server.url, within_s=0.2) is None  # nothing listens now


def _refused_start(
    name: str, tmp_path: Path, settings: dict[str, str]
) -> tuple[GatewayProcess, list[str]]:
    """`gateway serve` that must refuse to start: it, and its lines for people (exit 1)."""
    started = GatewayProcess(name, tmp_path, settings)
    try:
        started.start(wait_ready_s=0)
        assert started.process is not None
        code = started.process.wait(timeout=30)
    finally:
        started.stop()
    said = [x for x in started.log_path.read_text().splitlines() if x.startswith("gateway: ")]
    assert code == 1, started.tail(40)
    return started, said


def test_rediss_against_a_plain_redis_says_to_look_at_tls(tmp_path: Path) -> None:
    """It said only "no answer in 5 s": a plain Redis waits for a command, never for TLS's
    hello (an outside probe)."""
    server = RedisServer(tmp_path / "redis").start()
    url = f"rediss://127.0.0.1:{server.port}/0?prefix=w"
    settings = {"store_url": url, "broker_url": url, "web_url": url, "plugin": AGENT}
    try:
        _, said = _refused_start("gw", tmp_path, settings)
    finally:
        server.stop()
    [line] = said
    assert "TimeoutError" in line, line
    assert line.endswith("rediss:// speaks TLS: is the server set up for it (else redis://)?)")


async def test_a_session_named_like_the_broker_s_keys_under_one_prefix_is_refused() -> None:
    """With one ?prefix on GATEWAY_REDIS_URL, a session named `audit` wrote its log into the
    broker's audit trail: its events were lost, and `ops audit` answered 500 (an outside
    probe). Refused at start now, before anything is opened."""
    from config.settings import Route
    from gateway.channels import gateway_settings
    from gateway.service import Service, StartRefused

    url = "redis://:s3cret@127.0.0.1:1/0?prefix=dep"
    routes = (Route(channel="web", session="audit"),)
    with pytest.raises(StartRefused) as refused:
        await Service(gateway_settings(redis_url=url, routes=routes)).start()
    said = str(refused.value)
    assert said.startswith("the session 'audit' would share its Redis keys with the broker's")
    assert "s3cret" not in said and "GATEWAY_BROKER_URL with another ?prefix" in said
    # a prefix of the store's own (the broker keeps its default, gwb) shares nothing
    apart = gateway_settings(store_url=url, broker_url="redis://127.0.0.1:1/0", routes=routes)
    from gateway.service import _broker_keys_clash

    assert _broker_keys_clash(apart) is None
