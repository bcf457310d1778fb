"""Checksummed records (D240, D241): a flipped bit that still parses is caught, old stores open.

Every persistent backend stores a CRC32C beside each payload and verifies it on read; a payload
whose checksum matches is decoded without re-validation (the trusted decoders), which must give
exactly what full validation gives. A store written before checksums keeps opening, its items
validated in full.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import redis

from harness_core import SessionRepo, StoreCorrupted, open_repo, user_message
from harness_core.session import codec
from harness_core.session.entries import MessageEntry
from harness_core.session.types import BranchQuery, StoredEntry
from harness_core.storage.fsck import check_store
from harness_core.storage.sqlite import SCHEMA_VERSION
from tests.golden.kit import GOLDEN_DIR, golden_names, read_golden
from tests.support.backends import new_repo
from tests.support.corruption import PERSISTENT, SESSION, flip, write_session

pytestmark = pytest.mark.backends(*PERSISTENT)


def _repo(backend: str, tmp_path: Path, request: pytest.FixtureRequest, prefix: str):
    server = request.getfixturevalue("redis_server") if backend == "redis" else None
    return new_repo(backend, tmp_path, redis=server, prefix=prefix), server


async def test_a_flipped_bit_that_still_parses_is_caught_on_read(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, redis_prefix: str
) -> None:
    repo, server = _repo(backend, tmp_path, request, redis_prefix)
    await write_session(repo)
    repo, _ = _repo(backend, tmp_path, request, redis_prefix)
    storage = await repo.open(SESSION)
    assert (await storage.get_entry("e1")) is not None  # clean: reads back
    await repo.close()
    flip(backend, tmp_path, server, redis_prefix)
    repo, _ = _repo(backend, tmp_path, request, redis_prefix)
    try:
        with pytest.raises(StoreCorrupted) as caught:  # JSONL replays its file on open
            await _read_path(repo)
        if backend == "jsonl":
            assert caught.value.location == f"{tmp_path / SESSION}.jsonl:2"
        else:
            assert caught.value.location == f"{backend} session {SESSION!r} entry seq 1"
        assert "checksum" in str(caught.value)
        report = await check_store(repo)
    finally:
        await repo.close()
    assert [problem.message.split(" (")[0] for problem in report.problems] == ["checksum mismatch"]
    assert (report.sessions, report.items) == (1, 4)


async def _read_path(repo: SessionRepo) -> None:
    storage = await repo.open(SESSION)
    await storage.find_entries_on_branch(BranchQuery(start="e1"))


async def test_a_clean_store_checks_clean(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, redis_prefix: str
) -> None:
    repo, _ = _repo(backend, tmp_path, request, redis_prefix)
    await write_session(repo)
    repo, _ = _repo(backend, tmp_path, request, redis_prefix)
    try:
        report = await check_store(repo)
    finally:
        await repo.close()
    assert report.clean, report.problems
    assert (report.sessions, report.items) == (1, 4)


@pytest.mark.backends("sqlite", "redis")
async def test_a_projection_that_disagrees_with_the_log_is_reported(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, redis_prefix: str
) -> None:
    repo, server = _repo(backend, tmp_path, request, redis_prefix)
    await write_session(repo)
    if backend == "sqlite":
        conn = sqlite3.connect(tmp_path / "store.db")
        conn.execute("UPDATE lanes SET leaf_id = NULL WHERE lane = 'side'")
        conn.execute("UPDATE usage_sums SET u_input = 4 WHERE scope = 'entry'")
        conn.commit()
        conn.close()
    else:
        assert server is not None
        client = redis.Redis.from_url(server.url, decode_responses=True)
        base = f"{redis_prefix}:{{{SESSION}}}:"
        client.hset(base + "lanes", "side", "")
        client.hset(base + "ue", "e1", "4 0 0 0 0 0 0 0 0 0")
        client.hdel(base + "rid", "u1")
        client.close()
    repo, _ = _repo(backend, tmp_path, request, redis_prefix)
    try:
        report = await check_store(repo)
    finally:
        await repo.close()
    messages = [problem.message for problem in report.problems]
    assert "lane 'side' leaf: stored None, the log gives 'e1'" in messages
    assert any(m.startswith("usage sum of entry 'e1': stored") for m in messages), messages
    if backend == "redis":
        assert "index :rid disagrees with the log" in messages
    assert len(messages) == (3 if backend == "redis" else 2), messages


async def test_a_sqlite_store_of_schema_2_opens_and_reads_in_full(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    repo = open_repo(f"sqlite:///{path}")
    await write_session(repo)
    conn = sqlite3.connect(path)  # what schema 2 left: no checksum columns
    for table in ("entries", "records", "lane_moves", "facts"):
        conn.execute(f"ALTER TABLE {table} DROP COLUMN checksum")
    conn.execute("UPDATE schema_version SET version = 2")
    conn.commit()
    conn.close()
    repo = open_repo(f"sqlite:///{path}")
    lease = await repo.acquire_lease(SESSION, owner="new", ttl_ms=60_000)
    storage = await repo.open(SESSION, lease=lease)
    log = await storage.get_log()
    assert [item.seq for item in log] == [1, 2, 3, 4]
    assert isinstance(log[0], StoredEntry) and log[0].entry.id == "e1"
    await storage.append_entry(MessageEntry(id="e2", message=user_message("more")), "main")
    await repo.close()
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT version FROM schema_version").fetchone() == (SCHEMA_VERSION,)
    sums = dict(conn.execute("SELECT id, checksum FROM entries").fetchall())
    assert sums["e1"] is None and isinstance(sums["e2"], int)  # old rows are not vouched for
    # an old row is validated in full: a payload of the wrong shape is refused by validation
    conn.execute('UPDATE entries SET payload = \'{"id":"e1","type":"message"}\' WHERE id=\'e1\'')
    conn.commit()
    conn.close()
    repo = open_repo(f"sqlite:///{path}")
    storage = await repo.open(SESSION)
    with pytest.raises(StoreCorrupted, match="does not decode") as caught:
        await storage.get_entry("e1")
    assert caught.value.location == f"sqlite session {SESSION!r} entry seq 1"
    assert (await storage.get_entry("e2")) is not None
    await repo.close()


async def test_a_jsonl_file_of_format_1_opens_and_takes_checksummed_lines(tmp_path: Path) -> None:
    repo = open_repo(f"jsonl:///{tmp_path}")
    await write_session(repo)
    path = tmp_path / f"{SESSION}.jsonl"
    header, *lines = path.read_bytes()[:-1].split(b"\n")
    old = [header.replace(b"session-jsonl/2", b"session-jsonl/1")]
    old += [b"{" + line[len(b'{"crc32c":"01234567",') :] for line in lines]
    path.write_bytes(b"\n".join(old) + b"\n")
    repo = open_repo(f"jsonl:///{tmp_path}")
    lease = await repo.acquire_lease(SESSION, owner="new", ttl_ms=60_000)
    storage = await repo.open(SESSION, lease=lease)
    assert [item.seq for item in await storage.get_log()] == [1, 2, 3, 4]
    await storage.append_entry(MessageEntry(id="e2", message=user_message("more")), "main")
    await repo.close()
    written = path.read_bytes().split(b"\n")
    assert written[:5] == old and written[5].startswith(b'{"crc32c":"')
    repo = open_repo(f"jsonl:///{tmp_path}")
    assert len(await (await repo.open(SESSION)).get_log()) == 5
    assert (await check_store(repo)).clean
    await repo.close()


async def test_a_redis_session_without_checksums_reads_in_full(
    tmp_path: Path, request: pytest.FixtureRequest, redis_prefix: str
) -> None:
    repo, server = _repo("redis", tmp_path, request, redis_prefix)
    await write_session(repo)
    assert server is not None
    client = redis.Redis.from_url(server.url, decode_responses=True)
    base = f"{redis_prefix}:{{{SESSION}}}:"
    client.delete(base + "ek")  # what a write before checksums left: no entry checksums
    rows: list[tuple[str, dict[str, str]]] = client.xrange(base + "lr:main")  # type: ignore[assignment]
    client.delete(base + "lr:main")
    for stream_id, fields in rows:  # and records without their crc field
        client.xadd(base + "lr:main", {k: v for k, v in fields.items() if k != "crc"}, stream_id)
    client.hset(base + "ep", "e1", '{"id":"e1","type":"message"}')  # the wrong shape
    client.close()
    repo, _ = _repo("redis", tmp_path, request, redis_prefix)
    storage = await repo.open(SESSION)
    try:
        with pytest.raises(StoreCorrupted, match="does not decode"):
            await storage.get_entry("e1")
        (usage,) = await storage.find_records()
        assert usage.id == "u1"
    finally:
        await repo.close()


@pytest.mark.parametrize("name", golden_names())
def test_the_trusted_decoders_give_what_validation_gives(name: str) -> None:
    """On every item of every golden log, every entry, record and fact type among them."""
    golden = read_golden(GOLDEN_DIR / f"{name}.jsonl")
    for line in golden.lines:
        full = codec.log_item_adapter.validate_json(line)
        trusted = codec.trusted_log_item(line, "x")
        assert trusted == full
        assert trusted.model_fields_set == full.model_fields_set
        assert codec.encode_log_item(trusted).encode() == line
        inner = full.entry if isinstance(full, StoredEntry) else getattr(full, "record", None)
        if inner is not None:
            payload = codec.encode(inner)
            decoder = codec.trusted_entry if isinstance(full, StoredEntry) else codec.trusted_record
            assert decoder(payload, "x") == inner


def test_the_trusted_decoders_leave_out_every_check_and_only_checks() -> None:
    def after_validators(schema: object) -> set[str]:
        found: set[str] = set()
        if isinstance(schema, dict):
            if schema.get("type") == "function-after":
                found.add(schema["function"]["function"].__qualname__)
            for value in schema.values():
                found |= after_validators(value)
        elif isinstance(schema, list):
            for value in schema:
                found |= after_validators(value)
        return found

    everything = after_validators(codec.log_item_adapter.core_schema)
    assert everything == set(codec._CHECKS)  # a new validator must be judged: check or transform
    assert after_validators(codec._unchecked(codec.log_item_adapter.core_schema)) == set()


async def test_every_golden_log_checks_clean_once_imported(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, redis_prefix: str
) -> None:
    """fsck agrees with every backend on every shape the goldens hold (queues, approvals,
    compactions, navigations, custom entries, usage, forks, impossible lanes)."""
    repo, _ = _repo(backend, tmp_path, request, redis_prefix)
    names = golden_names()
    try:
        for name in names:
            golden = read_golden(GOLDEN_DIR / f"{name}.jsonl")
            await repo.import_session(golden.metadata, golden.items)
        report = await check_store(repo)
    finally:
        await repo.close()
    assert report.clean, report.problems
    assert report.sessions == len(names)
    assert report.items == sum(len(read_golden(GOLDEN_DIR / f"{n}.jsonl").items) for n in names)
