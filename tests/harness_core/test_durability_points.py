"""Which commits are fsynced under each durability setting (D233), counted at the backends' own
fsync hooks on real files.

A turn here is: prompt -> model request -> tool call -> tool run -> model request -> answer. Its
durability points under ``effects`` are the tool's intent (unless the tool is declared safe to
replay and needs no approval) and the operation's end; the two model requests are not. ``full``
(SQLite) leaves every fsync to SQLite's own ``synchronous=FULL``, ``normal`` / ``never`` make
none, JSONL ``always`` fsyncs at every barrier.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel

import harness_core as hc
from harness_core.backends import sqlite as sqlite_family
from harness_core.storage import jsonl as jsonl_backend
from harness_core.storage import open_repo

pytestmark = pytest.mark.backends("sqlite")


class LookupArgs(BaseModel):
    item: str


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every fsync the SQLite family or the JSONL backend makes itself, by what it synced."""
    seen: list[str] = []
    real_file, real_fd = sqlite_family.fsync_file, jsonl_backend.fsync_fd

    def fsync_file(path: Path) -> None:
        seen.append("wal" if path.name.endswith("-wal") else "dir")
        real_file(path)

    def fsync_fd(fd: int) -> None:
        seen.append("jsonl")
        real_fd(fd)

    monkeypatch.setattr(sqlite_family, "fsync_file", fsync_file)
    monkeypatch.setattr(jsonl_backend, "fsync_fd", fsync_fd)
    return seen


async def one_turn(
    url: str,
    *,
    replay: Literal["never", "safe"] = "never",
    approval: bool = False,
    tool: bool = True,
) -> tuple[hc.AgentHarness, hc.SessionRepo]:
    """A harness on session "s" of `url` whose prompts each call the tool once (or answer)."""
    repo = open_repo(url)
    await repo.create("s")
    lease = await repo.acquire_lease("s", owner="t", ttl_ms=60_000)
    calls = iter(range(100))

    def respond(request: hc.ModelRequest) -> hc.AssistantMessage:
        if not tool or isinstance(request.messages[-1], hc.ToolResultMessage):
            return hc.scripted.text("done")
        return hc.scripted.tool_call("lookup", {"item": "a"}, call_id=f"c{next(calls)}")

    async def lookup(args: LookupArgs, ctx: hc.ToolContext) -> str:
        return "found " + args.item

    harness, _ = await hc.AgentHarness.create(
        hc.AgentHarnessOptions(
            storage=await repo.open("s", lease=lease),
            model_client=hc.ScriptedModel(responder=respond),
            model=hc.ModelRef(provider="scripted", model_id="m"),
            tools=[
                hc.Tool(
                    name="lookup",
                    description="d",
                    execute=lookup,
                    args_model=LookupArgs,
                    replay=replay,
                    requires_approval=approval,
                )
            ],
        )
    )
    return harness, repo


async def fsyncs_of_a_turn(
    fsyncs: list[str], url: str, **how: bool | str
) -> tuple[list[str], hc.AgentHarness, hc.SessionRepo]:
    harness, repo = await one_turn(url, **how)  # type: ignore[arg-type]
    assert isinstance(await harness.prompt("warm"), hc.Ok)  # the WAL's directory entry, once
    fsyncs.clear()
    result = await harness.prompt("go")
    assert isinstance(result, hc.Ok), result
    return list(fsyncs), harness, repo


async def test_effects_fsyncs_a_never_tools_intent_and_the_turns_end(
    backend: str, tmp_path: Path, fsyncs: list[str]
) -> None:
    seen, harness, repo = await fsyncs_of_a_turn(fsyncs, f"sqlite:///{tmp_path}/s.db")
    assert seen == ["wal", "wal"]  # the default is `effects`
    await harness.close()
    await repo.close()


async def test_effects_skips_the_point_before_a_safe_tool_and_before_model_requests(
    backend: str, tmp_path: Path, fsyncs: list[str]
) -> None:
    seen, harness, repo = await fsyncs_of_a_turn(
        fsyncs, f"sqlite:///{tmp_path}/s.db?synchronous=effects", replay="safe"
    )
    assert seen == ["wal"]  # the turn's end only
    await harness.close()
    await repo.close()
    seen, harness, repo = await fsyncs_of_a_turn(fsyncs, f"sqlite:///{tmp_path}/t.db", tool=False)
    assert seen == ["wal"]  # a plain answer: one point, its end
    await harness.close()
    await repo.close()


async def test_a_safe_tool_that_needs_approval_is_a_point_all_the_same(
    backend: str, tmp_path: Path, fsyncs: list[str]
) -> None:
    harness, repo = await one_turn(f"sqlite:///{tmp_path}/s.db", replay="safe", approval=True)
    started = await harness.prompt("go")
    assert isinstance(started, hc.Ok) and started.value.kind == "suspended", started
    fsyncs.clear()
    decisions = [hc.approve(p) for p in started.value.pending_approvals]
    resumed = await harness.resume(decisions, wait_id=started.value.wait_id)
    assert isinstance(resumed, hc.Ok) and resumed.value.kind == "completed", resumed
    # the decision (before its event), the approved tool's intent, the end
    assert fsyncs.count("wal") == 3, fsyncs
    await harness.close()
    await repo.close()


@pytest.mark.parametrize(
    "url", ["sqlite:///{}/s.db?synchronous=full", "sqlite:///{}/s.db?synchronous=normal"]
)
async def test_full_and_normal_make_no_fsync_of_their_own(
    backend: str, tmp_path: Path, fsyncs: list[str], url: str
) -> None:
    seen, harness, repo = await fsyncs_of_a_turn(fsyncs, url.format(tmp_path))
    assert seen == []  # full: SQLite fsyncs each commit itself; normal: nobody does
    await harness.close()
    await repo.close()


@pytest.mark.parametrize(
    ("fsync", "expected"), [("effects", 2), ("always", 4), ("never", 0)], ids=str
)
async def test_jsonl_fsyncs_at_points_at_every_barrier_or_never(
    backend: str, tmp_path: Path, fsyncs: list[str], fsync: str, expected: int
) -> None:
    seen, harness, repo = await fsyncs_of_a_turn(fsyncs, f"jsonl:///{tmp_path}/j?fsync={fsync}")
    assert seen == ["jsonl"] * expected
    await harness.close()
    await repo.close()


async def test_a_point_with_nothing_new_to_make_durable_makes_no_fsync(
    backend: str, tmp_path: Path, fsyncs: list[str]
) -> None:
    harness, repo = await one_turn(f"sqlite:///{tmp_path}/s.db")
    storage = await repo.open("s")
    fsyncs.clear()
    await storage.sync()
    await storage.sync(point=False)
    assert fsyncs == []
    await harness.close()
    await repo.close()


async def test_opening_a_database_makes_no_fsync_until_a_commit_changes_something(
    backend: str, tmp_path: Path, fsyncs: list[str]
) -> None:
    harness, repo = await one_turn(f"sqlite:///{tmp_path}/s.db")
    assert isinstance(await harness.prompt("go"), hc.Ok)
    await harness.close()
    await repo.close()
    fsyncs.clear()
    repo = open_repo(f"sqlite:///{tmp_path}/s.db")
    storage = await repo.open("s")  # the schema check's transaction changes no row
    assert len(await storage.get_lanes()) == 1
    await storage.sync()
    assert fsyncs == []
    await repo.acquire_lease("s", owner="t", ttl_ms=60_000)  # a point that wrote: the WAL's
    assert fsyncs == ["wal", "dir"]  # fsync, and its directory entry's (a new WAL)
    await repo.close()
