"""A session another worker holds: taken at once from a holder that is gone, else waited for.

Whoever holds a session's inbox ticket and store lease is named by its worker id. A holder of
this machine whose process no longer runs is gone: a starting service hands its tickets back
and the worker that takes the session takes its lease over at once (D159). Any other holder
keeps the session until its lease runs out, and the log says how long that is and why.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from adapters.channel import Author, Inbound, ThreadRef
from config import Settings
from gateway.broker import open_broker
from gateway.broker.contract import NewInboxItem
from gateway.channels import gateway_settings
from gateway.incarnation import gone, new_worker_id, parse
from harness_core import open_repo
from tests.support.gateway_rig import serving, thread_items

SESSION = "web-default"
LEASE_S = 30


def _settings(tmp_path: Path) -> Settings:
    return gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"sqlite:///{tmp_path}/web.db",
        lease_seconds=LEASE_S,
    )


def _dead_worker() -> str:
    """The worker id a process of this machine had: it exited (and was reaped) since."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    own = parse(new_worker_id())
    assert own is not None, "this test needs /proc"
    with open(f"/proc/{proc.pid}/stat") as stat:
        start = int(stat.read().rsplit(")", 1)[1].split()[19])
    proc.wait()
    worker = replace(own, pid=proc.pid, start=start).worker_id
    assert gone(worker)
    return worker


async def _held_by(settings: Settings, holder: str, thread: str, *, ticket: bool = True) -> None:
    """A message of `thread` in the inbox, its session's lease (and ticket) taken by `holder`."""
    inbound = Inbound(
        thread=ThreadRef(channel="web", space="default", thread=thread),
        message_id=f"m-{thread}",
        author=Author(id="someone"),
        text="are you there?",
        received_at_ms=int(time.time() * 1000),
    )
    broker = open_broker(settings.effective_broker_url)
    repo = open_repo(settings.effective_store_url)
    try:
        await broker.threads.remember(
            SESSION, inbound.thread.lane, inbound.thread.model_dump(mode="json"), {}
        )
        await broker.inbox.append(
            NewInboxItem(
                session=SESSION,
                lane=inbound.thread.lane,
                dedupe_key=inbound.dedupe_key,
                kind="message",
                payload=inbound.model_dump(mode="json"),
            )
        )
        if ticket:
            assert await broker.inbox.take_session(holder) is not None
        await repo.create(SESSION)
        await repo.acquire_lease(SESSION, owner=holder, ttl_ms=LEASE_S * 1000)
    finally:
        await broker.close()
        await repo.close()


def _said(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, Any]]:
    return [dict(getattr(r.msg, "fields", {})) for r in caplog.records if str(r.msg) == name]


async def test_a_holder_that_is_gone_is_taken_over_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = _settings(tmp_path)
    dead = _dead_worker()
    await _held_by(settings, dead, "t1")
    caplog.set_level(logging.INFO, logger="gateway")
    began = time.monotonic()
    async with serving(settings) as http:
        [reply] = await thread_items(http, "t1", ["reply"], 1)
        assert time.monotonic() - began < 5  # not the 30 s lease
    assert reply["text"] == "You said: are you there?"
    [handed] = _said(caplog, "sessions of a stopped process taken over")
    assert handed["holder"] == dead and handed["sessions"] == 1
    [taken] = _said(caplog, "lease taken over")
    assert taken["holder"] == dead and taken["session"] == SESSION


HOLDERS = [
    "elsewhere-41-0badc0de",  # another machine (or an older gateway): nothing is known
    "ours-7-0badc0de.000000000000.1",  # another pid namespace (a container)
]


@pytest.mark.parametrize("holder", HOLDERS)
async def test_a_holder_that_may_be_alive_keeps_the_session_and_the_log_says_until_when(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, holder: str
) -> None:
    settings = _settings(tmp_path)
    await _held_by(settings, holder, "t1")
    caplog.set_level(logging.INFO, logger="gateway")
    async with serving(settings) as http:
        [held] = _said(caplog, "sessions held by another process")
        assert held["holder"] == holder and held["sessions"] == 1
        assert 25 <= held["wait_s"] <= LEASE_S
        assert "they are taken when its tickets run out" in held["why"]
        await asyncio.sleep(1.0)
        items = (await http.get("/web/threads/t1")).json()["items"]
        assert [i["kind"] for i in items] == []  # the reply waits: the lease is respected
    assert _said(caplog, "lease taken over") == []


@pytest.mark.parametrize("holder", HOLDERS)
async def test_a_lease_that_may_be_alive_is_waited_for_and_the_log_says_how_long(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, holder: str
) -> None:
    settings = _settings(tmp_path)
    await _held_by(settings, holder, "t1", ticket=False)  # its ticket lapsed, not its lease
    caplog.set_level(logging.INFO, logger="gateway")
    async with serving(settings) as http:
        deadline = time.monotonic() + 5
        while not (said := _said(caplog, "session held by another process")):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        assert said[0]["holder"] == holder and said[0]["session"] == SESSION
        assert 25 <= said[0]["wait_s"] <= LEASE_S + 0.2
        assert "its lease runs out then" in said[0]["why"]
        items = (await http.get("/web/threads/t1")).json()["items"]
        assert [i["kind"] for i in items] == []
    assert _said(caplog, "lease taken over") == []
