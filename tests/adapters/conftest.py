"""Fixtures of the adapter tests: a mailbox on each backend, a web channel and its app, Dovecot."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from adapters.web import MemoryMailbox, WebChannel, WebLimits, WebMailbox, open_mailbox
from adapters.web.redis import RedisMailbox
from adapters.web.sqlite import SqliteMailbox
from harness_core import SequentialIds
from harness_core.testing import ManualClock
from tests.adapters.kit import TestSink
from tests.support.mail_servers import Dovecot
from tests.support.redis_cluster import LocalRedisCluster
from tests.support.redis_server import RedisServer

MAILBOXES = ("memory", "sqlite", "redis", "redis-cluster")


async def open_test_mailbox(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> WebMailbox:
    if kind == "memory":
        return MemoryMailbox()
    if kind == "sqlite":
        return SqliteMailbox(tmp_path / "web.db", poll_s=0.05)
    prefix: str = request.getfixturevalue("redis_prefix")
    if kind == "redis-cluster":
        cluster: LocalRedisCluster = request.getfixturevalue("redis_cluster")
        mailbox = open_mailbox(f"{cluster.url}?prefix={prefix}")
        assert isinstance(mailbox, RedisMailbox) and mailbox.cluster
        return mailbox
    server: RedisServer = request.getfixturevalue("redis_server")
    return RedisMailbox(server.url, prefix=prefix)


@pytest.fixture(params=MAILBOXES)
async def mailbox(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[WebMailbox]:
    """A mailbox on each backend (memory, SQLite, a real redis-server)."""
    opened = await open_test_mailbox(str(request.param), request, tmp_path)
    yield opened
    await opened.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def sink() -> TestSink:
    return TestSink()


@pytest.fixture
async def channel(clock: ManualClock, sink: TestSink) -> AsyncIterator[WebChannel]:
    """A started web channel on a memory mailbox, with a manual clock and sequential ids."""
    web = WebChannel(
        MemoryMailbox(),
        clock=clock,
        ids=SequentialIds("id-"),
        limits=WebLimits(max_text_chars=1000, max_body_bytes=16_000, keepalive_s=0.2),
    )
    await web.start(sink)
    yield web
    await web.close()


@pytest.fixture
def app(channel: WebChannel) -> FastAPI:
    application = FastAPI()
    application.include_router(channel.router)
    return application


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://web.test") as http:
        yield http


@pytest.fixture(scope="session")
def dovecot() -> Iterator[Dovecot]:
    """One Dovecot for the whole run; tests isolate themselves with ``dovecot.fresh_user()``."""
    with Dovecot() as server:
        yield server
