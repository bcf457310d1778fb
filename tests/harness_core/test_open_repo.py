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
    assert isinstance(absolute, JsonlSessionRepo) and absolute.fsync == "effects"
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
        ("redis://localhost:6379/0?prefix=gw%0A", "invalid redis key prefix"),
    ],
)
def test_bad_urls_say_what_is_accepted(url: str, fragment: str) -> None:
    with pytest.raises(SessionError) as caught:
        open_repo(url)
    assert caught.value.code == "invalid_query"
    assert fragment in str(caught.value)


ACCEPTED = ("memory://", "jsonl:///", "sqlite:///", "redis://host:port/db")


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///?synchronous=full",
        "sqlite:///",
        "sqlite:////",
        "sqlite:///data/",
        "sqlite:///existing-dir",
        "sqlite:///a-file/gw.db",
        "sqlite:",
        "sqlite:relative.db",
        "sqlite://host/x.db",
        "jsonl:///?fsync=always",
        "jsonl:///",
        "jsonl:////",
        "jsonl:///a-file",
        "jsonl://sessions",
        "redis://host:notaport/0",
        "redis://host:0/0",
        "redis://host:65536/0",
        "redis://host:6379/zero",
        "redis://host:6379/-1",
        "redis://host:6379/0/extra",
        "redis://host:6379/0?db=1",
        "redis:///0",
        "memory://somewhere",
        "memory:///x",
        "",
        "gw.db",
        "/var/lib/gw.db",
        "file:///tmp/gw.db",
        "postgres://localhost/db",
    ],
)
def test_malformed_urls_are_refused_creating_nothing(url: str, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "existing-dir").mkdir()
    (tmp_path / "a-file").write_text("not a directory")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(SessionError) as caught:
        open_repo(url)
    assert caught.value.code == "invalid_query"
    for form in ACCEPTED:
        assert form in str(caught.value), f"{url!r}: the message must name {form!r}"
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "a refused URL created a file"


@pytest.mark.parametrize(
    "url",
    [
        "redis://localhost",
        "redis://localhost:6380",
        "redis://:secret@localhost:6379/2",
        "rediss://user:secret@cache.example.com:6380/0?prefix=gw2",
        "sqlite:///:memory:",
        "sqlite:///data/gw.db",
        "jsonl:///sessions/",
    ],
)
async def test_well_formed_urls_are_accepted_without_creating_anything(
    url: str, tmp_path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    repo = open_repo(url)
    assert list(tmp_path.iterdir()) == [], "opening a repository creates nothing until used"
    await repo.close()


def test_a_refused_url_never_shows_its_password() -> None:
    from harness_core import open_repo as open_store
    from harness_core.errors import SessionError as StoreError

    for url in ("redis://:hunter2@localhost:99999/0", "redis://u:hunter2@localhost/0?bad=1"):
        with pytest.raises(StoreError) as caught:
            open_store(url)
        assert "hunter2" not in str(caught.value)
        assert ":***@" in str(caught.value)
