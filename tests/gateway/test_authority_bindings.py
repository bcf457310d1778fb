"""A thread the settings no longer bind to its session loses its authority at start (D268).

A route moved to another session (or an email mailbox the channel no longer has) leaves the
old lanes without authority: the start revokes them (``route_removed``), their open runs end
``authority_revoked`` instead of resuming, nothing is posted there; the route put back gives it
back. Judged once per start, idempotently, and never lifting any other revocation.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters import ThreadRef
from config.settings import Route
from gateway.authority import Scope, judge_bindings, read_scope, revoke
from gateway.broker import open_broker
from gateway.broker.contract import Broker
from gateway.channels import bindings_judge, gateway_settings
from gateway.service import Service
from harness_core import SystemClock, open_repo
from harness_core.session import RecordQuery
from tests.support.service_rig import ServiceRig

AGENT = "tests.support.gateway_agent"


def _settings(tmp_path: Path, session: str) -> Any:
    return gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"sqlite:///{tmp_path}/web.db",
        plugin=AGENT,
        lease_seconds=6,
        renew_seconds=1,
        routes=(Route(channel="web", session=session),),
    )


async def _running(tmp_path: Path, session: str) -> tuple[Service, ServiceRig]:
    service = Service(_settings(tmp_path, session))
    await service.start()
    assert service.app is not None
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=service.app), base_url="http://localhost"
    )
    return service, ServiceRig(service, http)


async def _until(probe: Any, timeout_s: float = 15.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (found := await probe()):
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)
    return found


async def test_a_route_moved_away_ends_the_lane_and_putting_it_back_restores_it(
    tmp_path: Path,
) -> None:
    service, rig = await _running(tmp_path, "desk")
    await rig.post("job", "/slow 4000")
    assert service.repo is not None

    async def started() -> Any:
        return await _records(service, "desk", "tool_started")

    await _until(started)
    await service.stop(drain_seconds=0.1)  # cut: the run stays open, to resume at the next start
    await rig.http.aclose()

    service, rig = await _running(tmp_path, "elsewhere")
    try:

        async def ended() -> Any:
            return await _records(service, "desk", "operation_finished")

        [finished] = await _until(ended)
        assert (finished.outcome, finished.error.code) == ("aborted", "authority_revoked")
        assert "to session elsewhere now, not to desk" in finished.error.message
        await asyncio.sleep(0.3)
        items = (await rig.http.get("/web/threads/job")).json()["items"]
        assert [i["kind"] for i in items] == ["message"]  # never answered
        found, _ = await read_scope(rig.broker.marks, Scope.of_lane("desk", "web:job"))
        assert found is not None and found.active and found.cause == "route_removed"
    finally:
        await service.stop(drain_seconds=1)
        await rig.http.aclose()

    service, rig = await _running(tmp_path, "desk")
    try:

        async def restored() -> Any:
            found, _ = await read_scope(rig.broker.marks, Scope.of_lane("desk", "web:job"))
            return found is not None and not found.active

        await _until(restored)
        await rig.post("job", "hello again")
        [answer] = await rig.answers("job", 1)
        assert answer["text"] == "You said: hello again"
    finally:
        await service.stop(drain_seconds=1)
        await rig.http.aclose()


async def _records(service: Service, session: str, kind: str) -> list[Any]:
    assert service.repo is not None
    if session not in {meta.id for meta in await service.repo.list()}:
        return []
    storage = await service.repo.open(session)
    try:
        found = await storage.find_records(RecordQuery(type=kind))  # type: ignore[arg-type]
    finally:
        await storage.close()
    return [stored.record for stored in found]


EMAIL = {
    "email_address": "bot@new.example",
    "email_imap_host": "imap.example",
    "email_smtp_host": "smtp.example",
    "email_password": "secret",
}


def test_a_mailbox_the_email_channel_no_longer_has_is_unbound() -> None:
    settings = gateway_settings(**EMAIL)
    judge = bindings_judge(settings, ["email", "web"])
    old = ThreadRef(channel="email", space="bot@old.example", thread="<root@x>")
    new = old.model_copy(update={"space": "bot@new.example"})
    assert judge(settings.route_for("email", old.space), old) == (
        False,
        "the email channel no longer serves bot@old.example (the settings name another)",
    )
    assert judge(settings.route_for("email", new.space), new) == (True, "")
    not_here = bindings_judge(settings, ["web"])  # its channel runs elsewhere, or is off
    assert not_here(settings.route_for("email", old.space), old) is None


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[tuple[Any, Broker]]:
    clock = SystemClock()
    repo = open_repo(f"sqlite:///{tmp_path}/store.db", clock=clock)
    broker = open_broker(f"sqlite:///{tmp_path}/broker.db", clock=clock)
    yield repo, broker
    await broker.close()
    await repo.close()


async def test_judging_twice_changes_nothing_and_lifts_no_other_revocation(
    parts: tuple[Any, Broker],
) -> None:
    repo, broker = parts
    for session in ("a", "b"):
        await repo.create(session)
        thread = ThreadRef(channel="web", space=session, thread="t")
        await broker.threads.remember(session, thread.lane, thread.model_dump(mode="json"), {})
    # an operator revoked b's lane, which the settings still bind
    await revoke(
        broker, Scope.of_lane("b", "web:t"), cause="operator", why="hold", by="op", now_ms=1
    )

    def judge(session: str, thread: ThreadRef) -> tuple[bool, str]:
        return (False, "moved") if session == "a" else (True, "")

    assert await judge_bindings(repo, broker, judge, by="gateway:w", now_ms=2) == (1, 0)
    assert await judge_bindings(repo, broker, judge, by="gateway:w", now_ms=3) == (0, 0)
    wakes = await broker.inbox.pending("a")
    assert [item.kind for item in wakes] == ["authority"]  # once, for the first judgement
    held, _ = await read_scope(broker.marks, Scope.of_lane("b", "web:t"))
    assert held is not None and held.active and held.cause == "operator"
    audited = await broker.audit.list(limit=20)
    assert [e.action for e in audited] == ["authority revoked", "authority revoked"]


async def test_a_close_that_died_while_the_route_was_away_is_sent_when_it_is_back(
    tmp_path: Path,
) -> None:
    """Switching the README's examples left the page's Approve card looking open: the close
    of its request died as `authority_revoked` and stayed a dead letter (an outside probe)."""
    service, rig = await _running(tmp_path, "desk")
    try:
        await rig.post("job", "/deploy prod")
        [asked] = await rig.answers("job", 1)
        assert asked["kind"] == "approval_request"
    finally:
        await service.stop(drain_seconds=0.1)
        await rig.http.aclose()

    service, rig = await _running(tmp_path, "elsewhere")  # the run ends; its close is held back
    try:

        async def dead() -> Any:
            return await rig.broker.outbox.list("dead")

        [letter] = await _until(dead)
        assert letter.outbound["kind"] == "approval_closed"
        assert (letter.last_error or "").startswith("authority_revoked")
    finally:
        await service.stop(drain_seconds=1)
        await rig.http.aclose()

    service, rig = await _running(tmp_path, "desk")
    try:

        async def closed() -> Any:
            items = (await rig.http.get("/web/threads/job")).json()["items"]
            return [i for i in items if i["kind"] == "approval_closed"]

        [close] = await _until(closed)
        assert "stopped by the gateway" in close["text"]  # not a worker's id
        assert await rig.broker.outbox.list("dead") == ()
    finally:
        await service.stop(drain_seconds=1)
        await rig.http.aclose()
