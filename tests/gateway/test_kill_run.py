"""The proof that matters: gateway processes SIGKILLed again and again lose and repeat nothing.

Three `gateway serve` processes share one Redis; 200 threads get 2,000 messages while one process
is SIGKILLed every few seconds and restarted. Then every accepted message has exactly one user
entry, every run's reply reached the channel exactly once, and no ``replay="never"`` tool ran
twice. The same with the embedded SQLite service, one process killed and restarted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.kill_run import kill_run
from tests.support.redis_server import RedisServer

# kill rates and deadlines are part of what these measure: scripts/test runs them by themselves
pytestmark = pytest.mark.alone


def _report(capsys: pytest.CaptureFixture[str], title: str, line: str) -> None:
    with capsys.disabled():
        print(f"\n{title}: {line}")


@pytest.mark.timeout(600)
async def test_three_processes_on_redis_killed_every_few_seconds(
    tmp_path: Path, redis_server: RedisServer, redis_prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    urls = {
        "store_url": f"{redis_server.url}?prefix={redis_prefix}s",
        "broker_url": f"{redis_server.url}?prefix={redis_prefix}b",
        "web_url": f"{redis_server.url}?prefix={redis_prefix}w",
    }
    counts = await kill_run(tmp_path, urls, processes=3, threads=200, messages=2000, min_kills=3)
    _report(capsys, "kill run, 3 processes on Redis", counts.line())
    assert counts.kills >= 3
    assert counts.resumed > 0  # kills hit running operations, which were resumed
    assert counts.clean, (counts.line(), counts.problems[:20])
    assert counts.operations > 0 and counts.replies_delivered == counts.operations
    assert counts.charges > 0


@pytest.mark.timeout(600)
async def test_the_embedded_service_killed_and_restarted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    urls = {
        "store_url": f"sqlite:///{tmp_path}/store.db",
        "broker_url": f"sqlite:///{tmp_path}/broker.db",
        "web_url": f"sqlite:///{tmp_path}/web.db",
    }
    counts = await kill_run(
        tmp_path, urls, processes=1, threads=100, messages=600, send_seconds=25, min_kills=2
    )
    _report(capsys, "kill run, embedded SQLite", counts.line())
    assert counts.kills >= 2
    assert counts.clean, (counts.line(), counts.problems[:20])
    assert counts.operations > 0 and counts.replies_delivered == counts.operations
