"""``gateway store check``: the store's fsck from the terminal, on every persistent backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from config import Settings
from gateway.cli import main
from gateway.store_check import PROBLEMS_FOUND
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


async def _check(url: str, *sessions: str) -> int:
    """`main` runs its own event loop: in a thread of its own here."""
    import asyncio

    return await asyncio.to_thread(main, ["store", "check", *sessions, "--store", url], Settings())


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
    (tmp_path / "new.jsonl").write_bytes(b'{"kind":"hea')  # being published: no session yet
    assert [meta.id for meta in await new_repo("jsonl", tmp_path).list()] == [SESSION]
    url = store_url("jsonl", tmp_path, None, "")
    assert await asyncio.to_thread(main, ["store", "list", "--store", url], Settings()) == 0
    assert capsys.readouterr().out.count(SESSION) == 1
    assert await _check(url) == PROBLEMS_FOUND
    assert capsys.readouterr().out.splitlines() == [
        f"problem: {tmp_path}/bad.jsonl:1: bad header: Expecting ':' delimiter: line 1 column 26 "
        "(char 25) (left out of the store)",
        f"problem: {tmp_path}/s1 copy.jsonl: holds session 's1' but only s1.jsonl is read as it "
        "(a copy or a renamed file: left out of the store)",
        "checked 1 session, 4 items: 2 problems",
    ]
