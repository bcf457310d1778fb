"""`open_repo(url)` picks the backend, its path and its options from a URL, and refuses bad ones."""

from __future__ import annotations

import pytest

from harness_core.errors import SessionError
from harness_core.storage import open_repo
from harness_core.storage.jsonl import JsonlSessionRepo
from harness_core.storage.memory import MemorySessionRepo
from harness_core.storage.redis_streams import RedisSessionRepo
from harness_core.storage.sqlite import SqliteSessionRepo


async def _roundtrip(repo) -> None:
    meta = await repo.create("s1")
    assert [m.id for m in await repo.list()] == [meta.id]
    await repo.close()


async def test_memory() -> None:
    repo = open_repo("memory://")
    assert isinstance(repo, MemorySessionRepo)
    await _roundtrip(repo)


async def test_jsonl_relative_and_absolute(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    relative = open_repo("jsonl:///sessions?fsync=always")
    assert isinstance(relative, JsonlSessionRepo)
    assert relative.fsync == "always"
    await _roundtrip(relative)
    assert (tmp_path / "sessions" / "s1.jsonl").exists()
    absolute = open_repo(f"jsonl:///{tmp_path}/abs")
    assert isinstance(absolute, JsonlSessionRepo) and absolute.fsync == "never"
    await _roundtrip(absolute)
    assert (tmp_path / "abs" / "s1.jsonl").exists()


async def test_sqlite_relative_and_absolute(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    relative = open_repo("sqlite:///data/gw.db")
    assert isinstance(relative, SqliteSessionRepo)
    await _roundtrip(relative)
    assert (tmp_path / "data" / "gw.db").exists()
    absolute = open_repo(f"sqlite:///{tmp_path}/other.db?synchronous=full")
    assert isinstance(absolute, SqliteSessionRepo)
    await _roundtrip(absolute)
    assert (tmp_path / "other.db").stat().st_size > 0


async def test_redis_with_prefix(redis_server, redis_prefix) -> None:
    repo = open_repo(f"{redis_server.url}?prefix={redis_prefix}")
    assert isinstance(repo, RedisSessionRepo) and repo.prefix == redis_prefix
    await _roundtrip(repo)


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("postgres://localhost/db", "unsupported store URL"),
        ("sqlite://relative.db", "expected sqlite:///relative"),
        ("jsonl:///dir?fsync=sometimes", "fsync must be one of"),
        ("sqlite:///x.db?journal=wal", "unknown option 'journal'"),
        ("memory://?x=1", "unknown option"),
        ("redis://localhost:6379/0?prefix=a{b}", "invalid redis key prefix"),
    ],
)
def test_bad_urls_say_what_is_accepted(url: str, fragment: str) -> None:
    with pytest.raises(SessionError) as caught:
        open_repo(url)
    assert caught.value.code == "invalid_query"
    assert fragment in str(caught.value)
