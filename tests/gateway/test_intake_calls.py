"""The intake's accept on Redis: one broker call on a server (D285), and still every promise.

The inbox append remembers the thread and reads the authority epoch in the same script; a
cluster keeps the epoch, in another slot, as a read of its own. Either way a revoked thread's
message is kept, as before.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from adapters import Author, Inbound, ThreadRef
from gateway.authority import Scope, revoke
from gateway.broker.redis import RedisBroker
from gateway.intake import Intake
from tests.support.redis_cluster import LocalRedisCluster
from tests.support.redis_server import RedisServer


def _inbound(thread: str, message_id: str) -> Inbound:
    return Inbound(
        thread=ThreadRef(channel="web", space="home", thread=thread),
        message_id=message_id,
        author=Author(id="u1"),
        text="hello",
        received_at_ms=1_000,
        reply_context={"reply_to": message_id},
    )


def _sent(broker: RedisBroker, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The commands the broker's client sends from now on, by name."""
    client = broker._core.client
    real = client.execute_command  # type: ignore[attr-defined]
    sent: list[str] = []

    async def counted(*args: object, **options: object) -> object:
        sent.append(str(args[0]))
        return await real(*args, **options)

    monkeypatch.setattr(client, "execute_command", counted)
    return sent


@pytest.fixture(params=["server", "cluster"])
async def broker(request: pytest.FixtureRequest, redis_prefix: str) -> AsyncIterator[RedisBroker]:
    if request.param == "server":
        server: RedisServer = request.getfixturevalue("redis_server")
        opened = RedisBroker(server.url, prefix=redis_prefix)
    else:
        cluster: LocalRedisCluster = request.getfixturevalue("redis_cluster")
        opened = RedisBroker(cluster.url, prefix=redis_prefix)
    yield opened
    await opened.close()


async def test_an_accept_is_one_call_on_a_server_and_keeps_a_revoked_threads_message(
    broker: RedisBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    intake = Intake(broker, lambda channel, space: "s1")
    await intake.accept(_inbound("t0", "m0"))  # the session registered, the scripts loaded
    sent = _sent(broker, monkeypatch)
    accepted = await intake.accept(_inbound("t1", "m1"))
    assert not accepted.revoked
    assert sent == (["EVALSHA", "HGET"] if broker.cluster else ["EVALSHA"])
    state = await broker.threads.get("s1", "web:t1")
    assert state is not None
    assert state.reply_context == {"reply_to": "m1"}
    await revoke(
        broker, Scope.of_lane("s1", "web:t2"), cause="operator", why="test", by="op", now_ms=1
    )
    kept = await intake.accept(_inbound("t2", "m2"))  # the epoch moved: its scopes are read
    assert kept.revoked
    pending = [item.id for item in await broker.inbox.pending("s1")]
    assert pending == ["0000000000000001", "0000000000000002"]  # the kept one is not pending
    assert not (await intake.accept(_inbound("t1", "m3"))).revoked  # another lane runs


async def test_an_id_of_another_thread_s_message_is_not_logged_as_accepted(
    broker: RedisBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """A web post refused 409 (its id names another thread's message) read "message accepted"
    in the log (an outside probe)."""
    intake = Intake(broker, lambda channel, space: "s1")
    await intake.accept(_inbound("t1", "m1"))
    caplog.set_level(logging.INFO, logger="gateway.intake")
    caplog.clear()  # the first accept's line, when the logger already said info
    again = await intake.accept(_inbound("t2", "m1"))
    assert again.lane == "web:t1"
    [said] = [r for r in caplog.records if r.name == "gateway.intake"]
    assert said.getMessage() == "message id of another thread"
    assert said.msg.fields["its_lane"] == "web:t1"  # type: ignore[union-attr]
