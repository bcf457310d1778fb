"""Golden logs: session files an earlier version wrote must restore, reduce and resume the same.

Each ``tests/golden/<name>.jsonl`` is a JSONL backend session file written by the version named
in ``<name>.expected.json``, which holds what restore must report and how each resume step must
go (see ``tests/golden/README.md``; the files are never rewritten to make this test pass).
Every log is checked on every backend: imported with ``repo.import_session`` into memory,
JSONL, SQLite and Redis, and opened as-is from a copy of the file (the JSONL on-disk format
itself). A change of the on-disk format or of what an old log means fails here, not for a user.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness_core import SessionRepo, open_repo
from harness_core.session.codec import encode_log_item
from harness_core.session.records import ToolStarted
from harness_core.session.types import StoredEntry, StoredRecord
from harness_core.storage.jsonl import sealed, unsealed
from harness_core.testing import ManualClock
from harness_core.texts import INTERRUPTED
from tests.golden.kit import (
    CHECK_START_MS,
    GOLDEN_DIR,
    JSONL_FORMAT,
    GoldenLog,
    check_session,
    golden_names,
    read_golden,
)

NAMES = golden_names()
JSONL_CURRENT_FORMAT = "durable-gateway/session-jsonl/2"
"""What the JSONL backend writes now: the golden format's lines, each with its checksum (D240);
the golden files themselves stay format /1 and open through the same reader."""
STORES = ["memory", "jsonl", "sqlite", "redis", "jsonl-file"]
"""Every backend, importing the log's items; ``jsonl-file`` opens a byte copy of the file. (Not
the shared ``backend`` fixture: ``jsonl-file`` is no backend of its own.)"""


def _golden(name: str) -> GoldenLog:
    return read_golden(GOLDEN_DIR / f"{name}.jsonl")


def test_the_golden_set_is_complete() -> None:
    assert len(NAMES) >= 5, NAMES
    expectations = sorted(p.name.removesuffix(".expected.json") for p in GOLDEN_DIR.glob("*.json"))
    assert expectations == NAMES, "every golden log needs its expectation and vice versa"


@pytest.mark.parametrize("name", NAMES)
def test_the_format_is_stable(name: str) -> None:
    """Every line decodes with the current codec and encodes back to exactly the same bytes."""
    golden = _golden(name)
    expected = golden.expectation()
    assert golden.header["kind"] == "header"
    assert golden.header["format"] == expected["format"] == JSONL_FORMAT
    assert golden.metadata.id == expected["session_id"] == name
    assert len(golden.items) == expected["items"]
    assert [item.seq for item in golden.items] == list(range(1, len(golden.items) + 1))
    for number, (line, item) in enumerate(zip(golden.lines, golden.items, strict=True), start=2):
        assert encode_log_item(item).encode() == line, (
            f"{golden.path}:{number} re-encodes differently"
        )


async def _repo(
    store: str, golden: GoldenLog, clock: ManualClock, tmp_path: Path, request: Any
) -> SessionRepo:
    """A repository holding the golden session, stored the way `store` stores it."""
    if store == "jsonl-file":
        directory = tmp_path / "jsonl-file"
        directory.mkdir()
        shutil.copyfile(golden.path, directory / golden.path.name)
        return open_repo(f"jsonl:///{directory}", clock=clock)
    if store == "memory":
        repo = open_repo("memory://", clock=clock)
    elif store == "jsonl":
        repo = open_repo(f"jsonl:///{tmp_path / 'jsonl'}", clock=clock)
    elif store == "sqlite":
        repo = open_repo(f"sqlite:///{tmp_path / 'golden.db'}", clock=clock)
    else:
        server = request.getfixturevalue("redis_server")
        prefix = request.getfixturevalue("redis_prefix")
        repo = open_repo(f"{server.url}?prefix={prefix}", clock=clock)
    imported = await repo.import_session(golden.metadata, golden.items)
    assert imported.id == golden.metadata.id
    if store == "jsonl":  # the JSONL backend writes the same items, in its current format
        header, *lines = (tmp_path / "jsonl" / golden.path.name).read_bytes()[:-1].split(b"\n")
        assert json.loads(header) == {**golden.header, "format": JSONL_CURRENT_FORMAT}
        assert lines == [sealed(line.decode()).encode() for line in golden.lines]
        assert [unsealed(line, "x") for line in lines] == [(line, True) for line in golden.lines]
    return repo


def _compare(actual: dict[str, Any], expected: dict[str, Any], where: str) -> None:
    """Compare key by key, so a failure names the part that changed."""
    assert sorted(actual) == sorted(expected), where
    for key, value in expected.items():
        assert actual[key] == value, f"{where}: {key} differs"


def _interrupted_never_calls(golden: GoldenLog) -> list[ToolStarted]:
    """The replay="never" calls the log left started without a result."""
    entries = {item.id for item in golden.items if isinstance(item, StoredEntry)}
    return [
        item.record
        for item in golden.items
        if isinstance(item, StoredRecord)
        and isinstance(item.record, ToolStarted)
        and item.record.replay == "never"
        and item.record.result_entry_id not in entries
    ]


def test_a_never_tool_interrupted_by_a_crash_is_covered() -> None:
    assert any(_interrupted_never_calls(_golden(name)) for name in NAMES)


def _never_replayed(golden: GoldenLog, results: list[dict[str, Any]]) -> None:
    """A replay="never" call the log left started without a result is never run again, and its
    result (if resume writes one) is the interrupted text."""
    open_calls = _interrupted_never_calls(golden)
    runs = [run for result in results for run in result["tool_runs"]]
    writes = [write for result in results for write in result["writes"]]
    for call in open_calls:
        assert [call.tool_name, json.loads(json.dumps(dict(call.effective_args)))] not in runs
        for write in writes:
            if write["kind"] == "entry" and write["id"] == call.result_entry_id:
                assert write["outcome"] == "interrupted" and write["text"] == INTERRUPTED, write


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("name", NAMES)
async def test_the_golden_log_restores_and_resumes(
    name: str, store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    golden = _golden(name)
    expected = golden.expectation()
    clock = ManualClock(CHECK_START_MS)
    repo = await _repo(store, golden, clock, tmp_path, request)
    try:
        reader = await repo.open(name)  # read-only: the stored log is the golden log, exactly
        assert [encode_log_item(item).encode() for item in await reader.get_log()] == list(
            golden.lines
        )
        meta = await reader.get_metadata()
        assert (meta.id, meta.created_at, meta.metadata) == (
            golden.metadata.id,
            golden.metadata.created_at,
            golden.metadata.metadata,
        )
        steps = [{k: v for k, v in step.items() if k != "expect"} for step in expected["resume"]]
        restore, results = await check_session(repo, name, clock, steps)
        _compare(restore, expected["restore"], f"{name} on {store}: restore")
        for number, (step, result) in enumerate(zip(expected["resume"], results, strict=True)):
            where = f"{name} on {store}: step {number} ({step['call']} {step['lane']})"
            _compare(result, step["expect"], where)
        _never_replayed(golden, results)
    finally:
        await repo.close()
