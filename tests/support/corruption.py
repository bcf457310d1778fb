"""Stores with one flipped bit that still parses, on each persistent backend (checksum tests).

`write_session` stores a small session (a message whose text holds ``"order 42 apples"``, a
usage record, a name, a lane move); `flip` then changes the ``2`` of that text into a ``3``
(0x32 -> 0x33: one bit) where the backend keeps the entry, so the payload is still valid JSON
of a valid entry, only not the one written. Redis is changed through its own client, the files
as files.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import redis

from harness_core import SessionRepo, user_message
from harness_core.messages import TokenUsage
from harness_core.session.entries import MessageEntry
from harness_core.session.records import Usage
from tests.support.redis_server import RedisServer

__all__ = ["PERSISTENT", "SESSION", "flip", "store_url", "write_session"]

PERSISTENT = ("sqlite", "jsonl", "redis")
SESSION = "s1"
TEXT, FLIPPED = "order 42 apples", "order 43 apples"


def store_url(backend: str, directory: Path, server: RedisServer | None, prefix: str) -> str:
    """The URL `tests.support.backends.new_repo` stores at (for the ``gateway`` command)."""
    if backend == "sqlite":
        return f"sqlite:///{directory / 'store.db'}"
    if backend == "jsonl":
        return f"jsonl:///{directory}"
    assert server is not None
    return f"{server.url}?prefix={prefix}"


async def write_session(repo: SessionRepo) -> None:
    """The session every flip test corrupts (closed afterwards)."""
    await repo.create(SESSION)
    lease = await repo.acquire_lease(SESSION, owner="writer", ttl_ms=60_000)
    storage = await repo.open(SESSION, lease=lease)
    await storage.append_entry(MessageEntry(id="e1", message=user_message(TEXT)), "main")
    await storage.append_record(
        Usage(id="u1", lane="main", cause="adjustment", entry_id="e1", usage=TokenUsage(input=3))
    )
    await storage.set_name("apples")
    await storage.create_lane("side", "e1")
    await repo.release_lease(lease)
    await repo.close()


def flip(backend: str, directory: Path, server: RedisServer | None, prefix: str) -> None:
    """Change the stored message text's ``42`` into ``43`` (one bit), behind the store's back."""
    if backend == "sqlite":
        conn = sqlite3.connect(directory / "store.db")
        changed = conn.execute(
            "UPDATE entries SET payload = replace(payload, ?, ?) WHERE id = 'e1'", (TEXT, FLIPPED)
        ).rowcount
        conn.commit()
        conn.close()
        assert changed == 1
    elif backend == "jsonl":
        path = directory / f"{SESSION}.jsonl"
        data = path.read_bytes()
        assert data.count(TEXT.encode()) == 1
        path.write_bytes(data.replace(TEXT.encode(), FLIPPED.encode()))
    else:
        assert server is not None
        client = redis.Redis.from_url(server.url, decode_responses=True)
        key = f"{prefix}:{{{SESSION}}}:ep"
        payload = client.hget(key, "e1")
        assert isinstance(payload, str) and TEXT in payload
        client.hset(key, "e1", payload.replace(TEXT, FLIPPED))
        client.close()
