"""``gateway store check``: the store's fsck from the terminal, on every persistent backend."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import redis

from config import Settings
from gateway.cli import main
from gateway.store_check import PROBLEMS_FOUND
from harness_core import user_message
from harness_core.session.entries import MessageEntry
from harness_core.storage.jsonl import _SEAL, _SEALED_AT
from tests.support.backends import new_repo
from tests.support.corruption import PERSISTENT, SESSION, flip, store_url, write_session


@pytest.mark.parametrize("backend", PERSISTENT)
async def test_a_flipped_bit_is_reported_with_a_non_zero_exit(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, redis_prefix: str, capsys
) -> None:
    server = request.getfixturevalue("redis_server") if backend == "redis" else None
    await write_session(new_repo(backend, tmp_path, redis=server, prefix=redis_prefix))
    url = store_url(backend, tmp_path, server, redis_prefix)
    assert await _check(url) == 0
    assert capsys.readouterr().out == "checked 1 session, 4 items: clean\n"
    flip(backend, tmp_path, server, redis_prefix)
    assert await _check(url) == PROBLEMS_FOUND
    problem, summary = capsys.readouterr().out.splitlines()
    where = (
        f"{tmp_path / SESSION}.jsonl:2"
        if backend == "jsonl"
        else f"{backend} session 's1' entry seq 1"
    )
    assert problem.startswith(f"problem: {where}: checksum mismatch (stored ")
    assert summary == "checked 1 session, 4 items: 1 problem"
    # a mistyped name is no damage: it was "problem: ... no such session", exit 4
    assert await _check(url, "nope") == 1
    said = capsys.readouterr()
    assert said.out == ""
    assert said.err == "gateway: session 'nope' does not exist (`gateway store list` lists them)\n"
    assert await _check(url, "no pe") == 2
    assert capsys.readouterr().err.startswith("gateway: invalid session id 'no pe'")


@pytest.mark.parametrize("backend", PERSISTENT)
async def test_an_edit_whose_checksum_was_taken_away_is_reported(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, redis_prefix: str, capsys
) -> None:
    """An item without a checksum was taken for one written before checksums, so an edit that
    also removed it (or lost it with a deleted Redis key) checked clean (an outside probe). One
    among items that carry theirs is not that."""
    server = request.getfixturevalue("redis_server") if backend == "redis" else None
    repo = new_repo(backend, tmp_path, redis=server, prefix=redis_prefix)
    await repo.create(SESSION)
    lease = await repo.acquire_lease(SESSION, owner="writer", ttl_ms=60_000)
    storage = await repo.open(SESSION, lease=lease)
    await storage.append_entry(MessageEntry(id="e1", message=user_message("first")), "main")
    await storage.append_entry(MessageEntry(id="e2", message=user_message("pay 10")), "main")
    await repo.release_lease(lease)
    await repo.close()
    url = store_url(backend, tmp_path, server, redis_prefix)
    assert await _check(url) == 0
    capsys.readouterr()
    if backend == "sqlite":
        with contextlib.closing(sqlite3.connect(tmp_path / "store.db")) as db:
            db.execute(
                "UPDATE entries SET payload = replace(payload, 'pay 10', 'pay 99'), "
                "checksum = NULL WHERE id = 'e2'"
            )
            db.commit()
        where = "sqlite session 's1' entry seq 2"
    elif backend == "jsonl":
        path = tmp_path / f"{SESSION}.jsonl"
        lines = path.read_bytes().split(b"\n")
        assert lines[2].startswith(_SEAL)
        lines[2] = (b"{" + lines[2][_SEALED_AT:]).replace(b"pay 10", b"pay 99")
        path.write_bytes(b"\n".join(lines))
        where = f"{path}:3"
    else:
        assert server is not None
        client = redis.Redis.from_url(server.url, decode_responses=True)
        payloads = f"{redis_prefix}:{{{SESSION}}}:ep"
        client.hset(payloads, "e2", str(client.hget(payloads, "e2")).replace("pay 10", "pay 99"))
        client.hdel(f"{redis_prefix}:{{{SESSION}}}:ek", "e2")
        client.close()
        where = "redis session 's1' entry seq 2"
    assert await _check(url) == PROBLEMS_FOUND
    problem, summary = capsys.readouterr().out.splitlines()
    assert problem == (
        f"problem: {where}: has no checksum, though items written before it have one: its "
        "checksum was removed or lost, so what it holds cannot be trusted"
    )
    assert summary == "checked 1 session, 2 items: 1 problem"


def _overwrite(path: Path, *, at: int) -> None:
    with path.open("r+b") as file:
        file.seek(at)
        file.write(b"\xff" * 64)


async def _check(url: str, *sessions: str) -> int:
    """`main` runs its own event loop: in a thread of its own here."""
    import asyncio

    return await asyncio.to_thread(main, ["store", "check", *sessions, "--store", url], Settings())


@pytest.mark.parametrize("lost", ["meta", "listing"])
async def test_a_redis_session_the_store_no_longer_lists_is_a_problem(
    lost: str, tmp_path: Path, redis_server: Any, redis_prefix: str, capsys
) -> None:
    """Its :meta key or its entry in :sessions deleted, the rest of its keys kept: "checked 0
    sessions, 0 items: clean", while the gateway faulted on it at every take (an outside
    probe)."""
    await write_session(new_repo("redis", tmp_path, redis=redis_server, prefix=redis_prefix))
    url = store_url("redis", tmp_path, redis_server, redis_prefix)
    admin = redis.Redis(port=redis_server.port)
    try:
        if lost == "meta":
            assert admin.delete(f"{redis_prefix}:{{{SESSION}}}:meta") == 1
        else:
            assert admin.zrem(f"{redis_prefix}:sessions", SESSION) == 1
    finally:
        admin.close()
    assert await _check(url) == PROBLEMS_FOUND
    problem, summary = capsys.readouterr().out.splitlines()
    assert problem == (
        f"problem: redis session {SESSION!r}: its log is kept but the store does not list it "
        "(its :meta key or its entry in :sessions is gone): nothing can read it as it is"
    )
    assert summary == "checked 0 sessions, 0 items: 1 problem"


def test_a_bad_store_is_one_clear_line(tmp_path: Path, capsys) -> None:
    assert (
        main(["store", "check", "--store", "postgres://x/y"], settings=Settings()) == 2
    )  # the command line (D301)
    err = capsys.readouterr().err
    assert err.startswith("gateway: ") and "unsupported store URL 'postgres://x/y'" in err
    assert err.count("\n") == 1
    missing = f"sqlite:///{tmp_path}/none/gw.db"
    assert main(["store", "check", "--store", missing], settings=Settings()) == 2
    assert capsys.readouterr().err.startswith("gateway: no store at ")
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database, only some bytes " * 100)
    assert main(["store", "check", "--store", f"sqlite:///{garbage}"], settings=Settings()) == 1
    err = capsys.readouterr().err
    assert err == (
        f"gateway: cannot use the store sqlite:///{garbage}: file is not a database "
        "(damaged, or not a SQLite file)\n"
    )


async def test_a_sqlite_file_with_damaged_pages_is_a_problem_found(tmp_path: Path, capsys) -> None:
    """SQLite's own "malformed" was the one line of a store that cannot be used, exit 1: the
    very damage the check is for (an outside probe)."""
    await write_session(new_repo("sqlite", tmp_path))
    url = store_url("sqlite", tmp_path, None, "")
    assert await _check(url) == 0
    capsys.readouterr()
    _overwrite(tmp_path / "store.db", at=100)  # page 1's b-tree header, after the file header
    assert await _check(url) == PROBLEMS_FOUND
    said = capsys.readouterr()
    assert said.out.splitlines() == [
        f"problem: {url}: SQLite cannot read it: database disk image is malformed",
        "checked: the file is damaged (restore it from a backup)",
    ]
    assert said.err == ""


async def test_a_jsonl_file_no_session_is_read_from_is_a_problem_and_the_rest_is_listed(
    tmp_path: Path, capsys
) -> None:
    """A copied session file was listed twice; a file with a bad header failed the listing (and
    `store check` exited 1, as if the store could not be read): an outside probe."""
    import asyncio

    repo = new_repo("jsonl", tmp_path)
    await write_session(repo)
    (tmp_path / "s1 copy.jsonl").write_bytes((tmp_path / f"{SESSION}.jsonl").read_bytes())
    (tmp_path / "bad.jsonl").write_bytes(b'{"kind":"header","format"\n')
    (tmp_path / "new.jsonl").write_bytes(b'{"kind":"hea')  # cut short, or being published
    (tmp_path / "emptied.jsonl").write_bytes(b"")  # it checked clean while `ask` refused it
    assert [meta.id for meta in await new_repo("jsonl", tmp_path).list()] == [SESSION]
    url = store_url("jsonl", tmp_path, None, "")
    assert await asyncio.to_thread(main, ["store", "list", "--store", url], Settings()) == 0
    assert capsys.readouterr().out.count(SESSION) == 1
    assert await _check(url) == PROBLEMS_FOUND
    assert capsys.readouterr().out.splitlines() == [
        f"problem: {tmp_path}/bad.jsonl:1: bad header: Expecting ':' delimiter: line 1 column 26 "
        "(char 25) (left out of the store)",
        *(
            f"problem: {tmp_path}/{name}.jsonl:1: no complete header line: the file was emptied "
            "or cut short (its session is lost), unless a session is being created this moment"
            for name in ("emptied", "new")
        ),
        f"problem: {tmp_path}/s1 copy.jsonl: holds session 's1' but only s1.jsonl is read as it "
        "(a copy or a renamed file: left out of the store)",
        "checked 1 session, 4 items: 4 problems",
    ]
