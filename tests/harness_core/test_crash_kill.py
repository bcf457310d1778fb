"""Real process death: SIGKILL a writer mid-loop (SQLite, JSONL) or the Redis server (AOF always),
reopen, and find every acknowledged write in a valid prefix."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from harness_core.errors import LeaseHeld, SessionError
from harness_core.session.contract import SessionStorage
from harness_core.storage import open_repo
from harness_core.storage.redis_streams import RedisSessionRepo
from harness_core.testing.builders import custom_entry
from tests.support.prefix_check import assert_valid_prefix
from tests.support.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
KILLS = 4


async def _run_and_kill(url: str, owner: str, acks: int, acked: dict[str, int]) -> None:
    """Start a writer process, let it acknowledge about `acks` writes, then SIGKILL it."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.support.writer_loop", url, "s1", owner,
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None
    seen = 0
    try:
        async with asyncio.timeout(60):
            while seen < acks:
                line = (await process.stdout.readline()).decode()
                if not line:
                    stderr = await process.stderr.read() if process.stderr else b""
                    raise AssertionError(f"writer exited early: {stderr.decode()[-2000:]}")
                if line.startswith("ACK "):
                    _, _, item_id, seq = line.split()
                    acked[item_id] = int(seq)
                    seen += 1
    finally:
        with contextlib.suppress(
            ProcessLookupError
        ):  # it may have died on its own (reported above)
            os.kill(process.pid, signal.SIGKILL)
        # Whatever it printed before dying was acknowledged too; a line the kill cut short
        # (no newline yet) was not seen whole, so it counts as not acknowledged.
        rest, _ = await process.communicate()
        for line in rest.decode().split("\n")[:-1]:
            if line.startswith("ACK "):
                _, _, item_id, seq = line.split()
                acked[item_id] = int(seq)
    assert process.returncode == -signal.SIGKILL


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["sqlite", "jsonl"])
async def test_a_killed_writer_process_leaves_every_acknowledged_write(tmp_path, scheme) -> None:
    url = f"{scheme}:///{tmp_path}/store" + (".db" if scheme == "sqlite" else "")
    acked: dict[str, int] = {}
    rng = random.Random(7)
    for kill in range(KILLS):
        # The same owner takes the lease over at once (a restarted process supersedes itself).
        await _run_and_kill(url, "writer", rng.randint(30, 300), acked)
        repo = open_repo(url)
        try:
            n = await assert_valid_prefix(await repo.open("s1"), acked)
            assert n >= len(acked)
        finally:
            await repo.close()
        del kill
    # After the last crash the store is still writable by a new writer.
    repo = open_repo(url)
    try:
        lease = await repo.acquire_lease("s1", owner="writer", ttl_ms=1000)
        storage = await repo.open("s1", lease=lease)
        stored = await storage.append_entry(custom_entry("after-crash"), "a")
        assert stored.seq == (await storage.get_stats()).last_seq
        await assert_valid_prefix(storage, acked)
    finally:
        await repo.close()


@pytest.mark.slow
async def test_a_dead_writers_sqlite_lease_blocks_others_until_it_expires(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    await _run_and_kill(url, "dead-writer", 10, {})
    repo = open_repo(url)
    try:
        with pytest.raises(LeaseHeld) as caught:
            await repo.acquire_lease("s1", owner="someone-else", ttl_ms=1000)
        assert caught.value.owner == "dead-writer"
    finally:
        await repo.close()


async def _write_until_killed(
    storage: SessionStorage, server: RedisServer, tag: str, target: int, acked: dict[str, int]
) -> None:
    for n in range(10**9):
        entry = custom_entry(f"{tag}-{n}", data={"pad": "x" * 200})
        stored = await storage.append_entry(entry, "a")
        acked[stored.id] = stored.seq
        if n == target:
            server.kill()  # SIGKILL while later writes are in flight


@pytest.mark.slow
async def test_redis_with_aof_always_killed_mid_loop_loses_no_acknowledged_write(tmp_path) -> None:
    server = RedisServer(tmp_path / "redis", appendonly=True, appendfsync="always").start()
    acked: dict[str, int] = {}
    rng = random.Random(11)
    try:
        for round_ in range(KILLS):
            repo = RedisSessionRepo(server.url, prefix="kill")
            if round_ == 0:
                await repo.create("s1")
            lease = await repo.acquire_lease("s1", owner=f"w{round_}-{rng.random()}", ttl_ms=60_000)
            storage = await repo.open("s1", lease=lease)
            if round_ == 0:
                await storage.create_lane("a", None)
            target = rng.randint(50, 400)
            with pytest.raises(SessionError) as caught:  # the loop dies with the server
                await _write_until_killed(storage, server, f"r{round_}", target, acked)
            assert caught.value.code == "storage"
            await repo.close()
            server.start()  # same port, same data directory: replays the AOF
            # The dead writer's lease survives the restart: take over as a fresh owner.
            reopened = RedisSessionRepo(server.url, prefix="kill")
            try:
                await assert_valid_prefix(await reopened.open("s1"), acked)
            finally:
                await reopened.close()
            cleaner = aioredis.Redis(port=server.port)
            await cleaner.delete("kill:{s1}:lease")
            await cleaner.aclose()
    finally:
        server.stop()
