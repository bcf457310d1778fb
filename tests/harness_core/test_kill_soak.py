"""Real process death of a running agent: SIGKILL at random moments on SQLite and Redis.

`tests.support.kill_soak` runs the agent in a subprocess (two lanes, a never-replayed
`charge` tool, a safe `lookup`, steering), kills it at random points and checks every recovery
against the state the kill left; no `charge` may ever happen twice. `bench/kill_soak.py` runs
the same with many more kills.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.kill_soak import soak
from tests.support.redis_server import RedisServer

# kill rates and deadlines are part of what these measure: scripts/test runs them by themselves
pytestmark = pytest.mark.alone

ROOT = Path(__file__).resolve().parents[2]
KILLS = 20


@pytest.mark.slow
@pytest.mark.timeout(180)  # ~30 s alone
@pytest.mark.backends("sqlite", "redis")
async def test_an_agent_killed_at_random_moments_recovers_every_time(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        url = f"{server.url}?prefix=soak{tmp_path.name[-8:]}"
    else:
        url = f"sqlite:///{tmp_path}/soak.db"
    report = await soak(url, tmp_path / "effects.log", kills=KILLS, seed=2026, cwd=ROOT)
    assert report.kills == KILLS
    assert report.recovered_here == KILLS // 2
    assert report.open_at_kill >= KILLS // 4, "the kills should mostly land mid-operation"
    assert report.charges > 0
