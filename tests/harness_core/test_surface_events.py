"""Events and watch: the event order of a prompt, a raising listener isolated, a lane's watch
scoped to its lane, and a snapshot plus its stream that sees every entry exactly once, also when
a commit races the snapshot's read (or a compaction's read).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest

from harness_core.messages import user_message
from harness_core.models.scripted import text, tool_call
from harness_core.options import CompactionSettings
from harness_core.session.types import BranchQuery
from harness_core.tools import ToolContext
from tests.support.harness_kit import Kit, make_kit
from tests.support.surface import (
    Holder,
    acting_tool,
    collect,
    messages_of,
    noop_ctx,
    ok,
    reopen,
    texts,
    transcript,
)

SIMPLE_PROMPT_EVENTS = [
    "run_start",
    "message_start:user",
    "message_end:user",
    "turn_start",
    "message_start:assistant",  # streamed: start and updates while the request is in flight
    "message_update:assistant",
    "usage",
    "message_end:assistant",
    "tool_start",
    "message_start:tool_result",
    "message_end:tool_result",
    "tool_end",
    "turn_end",
    "turn_start",
    "message_start:assistant",
    "message_update:assistant",
    "usage",
    "message_end:assistant",
    "turn_end",
    "run_end",
]


async def test_the_event_order_of_a_simple_prompt(backend, tmp_path) -> None:
    kit = await make_kit(
        backend, tmp_path, [tool_call("act"), text("done")], tools=[acting_tool(noop_ctx)]
    )
    seen = collect(kit)
    outcome = ok(await kit.harness.prompt("hi"))
    names = [f"{e.type}:{e.message.role}" if e.type.startswith("message") else e.type for e in seen]
    assert names == SIMPLE_PROMPT_EVENTS
    assert {e.lane for e in seen} == {"main"}
    assert {e.run_id for e in seen if e.type != "usage"} == {outcome.run_id}
    # every message_end names a committed entry, in commit order
    committed = [e.id for e in await transcript(kit)]
    assert [e.entry_id for e in seen if e.type == "message_end"] == committed
    end = seen[-1]
    assert (end.outcome, end.leaf_id, end.final_entry_id) == (
        "completed",
        outcome.leaf_id,
        outcome.final_entry_id,
    )


async def test_a_raising_listener_is_isolated(backend, tmp_path) -> None:
    kit = await make_kit(backend, tmp_path, [text("ok")])

    def broken(event: Any) -> None:
        raise RuntimeError("listener bug")

    kit.harness.events.on("turn_start", broken)
    errors = collect(kit, "handler_error")
    assert ok(await kit.harness.prompt("hi")).kind == "completed"
    assert [(e.kind, e.name) for e in errors] == [("event", "turn_start")]
    assert "listener bug" in errors[0].error


async def test_a_lane_watch_sees_only_its_lane_and_global_events(backend, tmp_path) -> None:
    kit = await make_kit(backend, tmp_path, [text("main answer"), text("side answer")])
    side = ok(await kit.harness.create_lane("side", None))
    watch = await side.watch()
    seen: list[Any] = []
    watch.start(seen.append)
    ok(await kit.harness.prompt("on main"))
    assert [(e.type, e.lane) for e in seen] == [("usage", "main")]  # usage is harness-global
    ok(await side.prompt("on side"))
    assert {e.lane for e in seen[1:]} == {"side"} and seen[-1].type == "run_end"
    watch.unsubscribe()
    ok(await side.next_run("unwatched"))
    assert seen[-1].type == "run_end"  # nothing after unsubscribe


async def test_watch_has_no_gap_and_no_duplicate(backend, tmp_path) -> None:
    holder = Holder()
    watched: list[Any] = []
    inside: dict[str, Any] = {}

    async def watch_mid_run(ctx: ToolContext) -> None:
        watch = await holder.harness.watch()
        inside["watch"] = watch
        ok(await holder.harness.steer("and the tests"))  # buffered until start()
        await holder.harness.session.append_custom_entry("note")  # a deferred write
        watch.start(watched.append)

    kit = await make_kit(
        backend,
        tmp_path,
        [tool_call("act"), text("done")],
        tools=[acting_tool(watch_mid_run)],
    )
    holder.kit = kit
    outcome = ok(await kit.harness.prompt("go"))
    snapshot = inside["watch"].snapshot
    assert (snapshot.status, snapshot.operation_id) == ("running", outcome.run_id)
    assert [m.role for m in messages_of(list(snapshot.transcript))] == ["user", "assistant"]
    assert len(snapshot.transcript) == 2
    assert [e.type for e in watched[:2]] == ["queue_update", "write_pending"]  # buffered, in order
    assert watched[-1].type == "run_end"
    later = [e.entry_id for e in watched if e.type == "message_end"]
    later += [e.entry.id for e in watched if e.type == "entry_added"]
    covered = Counter([e.id for e in snapshot.transcript] + later)
    assert covered == Counter(e.id for e in await transcript(kit))  # each entry exactly once


class ParkedRead:
    """Parks a kit's next cold context read (a branch query) until `gate` is set, and reports
    when an entry append reaches storage: a slow read with a commit racing it."""

    def __init__(self, kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
        recording = kit.recording
        assert recording is not None
        self.reading, self.gate, self.appending = asyncio.Event(), asyncio.Event(), asyncio.Event()
        read_branch, append_entry = recording.find_entries_on_branch, recording.append_entry

        async def slow_read(query: BranchQuery) -> Any:
            self.reading.set()
            await self.gate.wait()
            return await read_branch(query)

        async def observed_append(entry: Any, lane: str) -> Any:
            self.appending.set()
            return await append_entry(entry, lane)

        monkeypatch.setattr(recording, "find_entries_on_branch", slow_read)
        monkeypatch.setattr(recording, "append_entry", observed_append)

    async def race(self, reader: asyncio.Task[Any], write: Awaitable[str]) -> str:
        """Start `write` while `reader` is parked in its read; return the written entry's id.

        The write gets every chance to commit while the read is parked (bounded yields, no
        timing): if it reaches storage it finishes before the read continues; if the runtime
        holds it back (the read is on the lane's mutation line), the read goes first.
        """
        async with asyncio.timeout(10):
            await self.reading.wait()
        writing = asyncio.ensure_future(write)
        for _ in range(50):
            if self.appending.is_set():
                break
            await asyncio.sleep(0)
        if self.appending.is_set():
            await writing
        self.gate.set()
        async with asyncio.timeout(10):
            await reader
            return await writing


async def cold_lane(backend: str, tmp_path: Path, turns: int, **options: Any) -> Kit:
    """A session with finished turns on main, reopened (nothing of the lane is cached)."""
    kit = await make_kit(backend, tmp_path, [text("ok")] * turns, **options)
    for _ in range(turns):
        ok(await kit.harness.prompt("hi"))
    return await reopen(kit, "r-")


async def test_watch_taken_while_another_job_commits_sees_each_entry_once(
    backend, tmp_path, monkeypatch
) -> None:
    """A snapshot read racing a commit on the same lane: the entry is either in the snapshot or
    announced after it (never both, never neither), the snapshot's leaf matches its transcript,
    and the lane's cached context stays complete (the next request sees the entry)."""
    kit = await cold_lane(backend, tmp_path, 1)
    parked = ParkedRead(kit, monkeypatch)
    watching = asyncio.create_task(kit.harness.watch())
    entry_id = await parked.race(
        watching, kit.harness.session.append_message(user_message("meanwhile"))
    )
    monkeypatch.undo()
    watch = watching.result()
    seen: list[Any] = []
    watch.start(seen.append)
    snapshot = watch.snapshot
    in_snapshot = [e.id for e in snapshot.transcript].count(entry_id)
    announced = [e.entry_id for e in seen if e.type == "message_end"].count(entry_id)
    assert in_snapshot + announced == 1
    assert snapshot.leaf_id == snapshot.transcript[-1].id
    kit.model.script.append(text("ok again"))
    ok(await kit.harness.prompt("next"))
    assert texts(kit.model.requests[-1].messages) == ["hi", "ok", "meanwhile", "next"]


async def test_compact_racing_a_commit_keeps_the_context_complete(
    backend, tmp_path, monkeypatch
) -> None:
    """compact()'s "anything to summarize?" read is a cold context read too: a message committed
    while it is in flight must still be in the context the compaction and later runs see."""
    kit = await cold_lane(backend, tmp_path, 2, compaction=CompactionSettings(keep_recent_tokens=1))
    parked = ParkedRead(kit, monkeypatch)
    kit.model.script.extend([text("the summary"), text("after")])
    compacting = asyncio.create_task(kit.harness.compact())
    await parked.race(compacting, kit.harness.session.append_message(user_message("meanwhile")))
    monkeypatch.undo()
    assert ok(compacting.result()).kind == "completed"
    ok(await kit.harness.prompt("next"))
    summary, *rest = texts(kit.model.requests[-1].messages)
    assert "the summary" in summary and rest == ["meanwhile", "next"]
