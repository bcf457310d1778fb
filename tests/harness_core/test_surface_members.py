"""Every public member of the harness, of a lane and of a lane's session tree, on a fresh
harness: one table row per member (a minimal real use, or the rejection an idle lane gives),
and the tables cover every public member.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from harness_core.errors import HarnessError
from harness_core.events import EventBus
from harness_core.harness import AgentHarness, AgentLane, LaneInfo, SessionTree, Watch
from harness_core.hooks import Hooks
from harness_core.messages import TokenUsage, user_message
from harness_core.models.scripted import text
from harness_core.options import AgentHarnessOptions
from harness_core.portable import CapabilityState, HarnessState
from harness_core.session.entries import CustomEntry, MessageEntry
from harness_core.session.records import Usage
from harness_core.session.types import EntryQuery
from tests.support.harness_kit import MODEL, Kit, make_kit
from tests.support.surface import (
    OTHER_MODEL,
    acting_tool,
    collect,
    err,
    noop,
    noop_ctx,
    ok,
    records_of,
    said,
)

LaneCall = Callable[[Kit, AgentLane], Awaitable[None]]


async def _name(kit: Kit, lane: AgentLane) -> None:
    assert lane.name == ("main" if lane is kit.harness else "side")


async def _session(kit: Kit, lane: AgentLane) -> None:
    assert isinstance(lane.session, SessionTree)
    entry_id = await lane.session.append_message(user_message("via the view"))
    assert await lane.get_leaf_id() == entry_id  # the view writes to this lane


async def _get_leaf_id(kit: Kit, lane: AgentLane) -> None:
    assert await lane.get_leaf_id() is None


async def _info(kit: Kit, lane: AgentLane) -> None:
    info = await lane.info()
    assert (info.name, info.status) == (lane.name, "idle")
    assert info.leaf_id is None and info.operation_id is None


async def _prompt(kit: Kit, lane: AgentLane) -> None:
    outcome = ok(await lane.prompt("hello"))
    assert outcome.kind == "completed" and outcome.operation == "run"
    assert outcome.final_message is not None and said(outcome.final_message) == "ok"
    assert await lane.get_leaf_id() == outcome.leaf_id == outcome.final_entry_id


async def _start(kit: Kit, lane: AgentLane) -> None:
    started = ok(await lane.start("hello"))
    outcome = await started.outcome()
    assert (outcome.run_id, outcome.kind) == (started.run_id, "completed")


async def _resume(kit: Kit, lane: AgentLane) -> None:
    assert err(await lane.resume(), "NothingToResume").lane == lane.name


async def _abort(kit: Kit, lane: AgentLane) -> None:
    assert err(await lane.abort(), "NoActiveOperation").lane == lane.name


async def _compact(kit: Kit, lane: AgentLane) -> None:
    err(await lane.compact(), "NothingToCompact")


async def _navigate_tree(kit: Kit, lane: AgentLane) -> None:
    assert err(await lane.navigate_tree("nope"), "UnknownTarget").target_id == "nope"
    err(await lane.navigate_tree(None), "UnknownTarget")  # already at the root
    first = await lane.session.append_message(user_message("one"))
    await lane.session.append_message(user_message("two"))
    outcome = ok(await lane.navigate_tree(first))
    assert outcome.kind == "completed" and await lane.get_leaf_id() == first


async def _steer(kit: Kit, lane: AgentLane) -> None:
    err(await lane.steer("x"), "NoActiveRun")


async def _follow_up(kit: Kit, lane: AgentLane) -> None:
    err(await lane.follow_up("x"), "NoActiveRun")


async def _next_run(kit: Kit, lane: AgentLane) -> None:
    entry_id = ok(await lane.next_run("seed"))
    watch = await lane.watch()
    assert [e.id for e in watch.snapshot.next_run] == [entry_id]
    watch.unsubscribe()


async def _cancel_queued(kit: Kit, lane: AgentLane) -> None:
    assert err(await lane.cancel_queued("nope"), "UnknownQueueItem").entry_id == "nope"


async def _record_usage(kit: Kit, lane: AgentLane) -> None:
    assert ok(await lane.record_usage(TokenUsage(input=-5), details={"why": "refund"})) is None
    usage = await records_of(kit, Usage)
    assert [(u.lane, u.cause, u.usage.input) for u in usage] == [(lane.name, "adjustment", -5)]


async def _get_usage(kit: Kit, lane: AgentLane) -> None:
    assert await lane.get_usage() == TokenUsage()
    assert ok(await lane.record_usage(TokenUsage(output=4), entry_id="e1")) is None
    assert (await lane.get_usage()).output == 4
    assert (await lane.get_usage("e1")).output == 4


async def _wait_for_idle(kit: Kit, lane: AgentLane) -> None:
    async with asyncio.timeout(5):
        await lane.wait_for_idle()
    infos = {info.name: info.status for info in await kit.harness.lanes()}
    assert infos[lane.name] == "idle"


async def _get_model(kit: Kit, lane: AgentLane) -> None:
    assert await lane.get_model() == MODEL


async def _set_model(kit: Kit, lane: AgentLane) -> None:
    await lane.set_model(OTHER_MODEL)
    assert await lane.get_model() == OTHER_MODEL


async def _get_thinking_level(kit: Kit, lane: AgentLane) -> None:
    assert await lane.get_thinking_level() == "off"


async def _set_thinking_level(kit: Kit, lane: AgentLane) -> None:
    await lane.set_thinking_level("high")
    assert await lane.get_thinking_level() == "high"


async def _get_active_tools(kit: Kit, lane: AgentLane) -> None:
    assert await lane.get_active_tools() == ("act",)


async def _set_active_tools(kit: Kit, lane: AgentLane) -> None:
    await lane.set_active_tools([])
    assert await lane.get_active_tools() == ()


async def _watch(kit: Kit, lane: AgentLane) -> None:
    watch = await lane.watch()
    assert isinstance(watch, Watch)
    snapshot = watch.snapshot
    assert (snapshot.lane, snapshot.status, snapshot.transcript) == (lane.name, "idle", ())
    assert not snapshot.faulted
    seen: list[Any] = []
    watch.start(seen.append)
    await lane.session.append_custom_entry("note")
    assert [e.type for e in seen] == ["entry_added"]
    watch.unsubscribe()


async def _export_state(kit: Kit, lane: AgentLane) -> None:
    state = await lane.export_state()
    assert (state.thread_id, state.messages, dict(state.capabilities)) == (lane.name, (), {})


async def _set_capability(kit: Kit, lane: AgentLane) -> None:
    await lane.set_capability("acme.counter", CapabilityState(version="1", data={"n": 1}))
    assert (await lane.export_state()).capabilities["acme.counter"].data == {"n": 1}


async def _get_capability(kit: Kit, lane: AgentLane) -> None:
    assert await lane.get_capability("acme.counter", "1") is None
    await lane.set_capability("acme.counter", CapabilityState(version="2", data=[1]))
    assert await lane.get_capability("acme.counter", "1") is None  # the version must match
    assert await lane.get_capability("acme.counter", "2") == (1,)


def _manual_only(name: str) -> LaneCall:
    """Drive controls are a programmer error in automatic drive (test_manual_drive.py has more)."""

    async def call(kit: Kit, lane: AgentLane) -> None:
        with pytest.raises(HarnessError, match="drive='manual'"):
            await getattr(lane, name)()

    return call


LANE_CALLS: dict[str, LaneCall] = {
    "name": _name,
    "session": _session,
    "get_leaf_id": _get_leaf_id,
    "info": _info,
    "prompt": _prompt,
    "start": _start,
    "resume": _resume,
    "abort": _abort,
    "compact": _compact,
    "navigate_tree": _navigate_tree,
    "steer": _steer,
    "follow_up": _follow_up,
    "next_run": _next_run,
    "cancel_queued": _cancel_queued,
    "record_usage": _record_usage,
    "get_usage": _get_usage,
    "wait_for_idle": _wait_for_idle,
    "get_model": _get_model,
    "set_model": _set_model,
    "get_thinking_level": _get_thinking_level,
    "set_thinking_level": _set_thinking_level,
    "get_active_tools": _get_active_tools,
    "set_active_tools": _set_active_tools,
    "watch": _watch,
    "export_state": _export_state,
    "set_capability": _set_capability,
    "get_capability": _get_capability,
    "peek_action": _manual_only("peek_action"),
    "execute_action": _manual_only("execute_action"),
    "run_to_completion": _manual_only("run_to_completion"),
}

HarnessCall = Callable[[Kit], Awaitable[None]]


async def _create(kit: Kit) -> None:
    def options(**changes: Any) -> AgentHarnessOptions:
        return AgentHarnessOptions(
            storage=kit.storage, model_client=kit.model, model=MODEL, **changes
        )

    manual, _ = await AgentHarness.create(options(drive="manual"))
    assert await manual.peek_action() is None  # nothing to drive on an idle lane
    assert await manual.execute_action() is None
    await manual.run_to_completion()
    await manual.close()
    harness, suspended = await AgentHarness.create(options())
    assert suspended == [] and [info.name for info in await harness.lanes()] == ["main", "side"]
    await harness.close()


async def _hooks(kit: Kit) -> None:
    hooks = kit.harness.hooks
    assert isinstance(hooks, Hooks)
    off = hooks.on("before_request", noop)
    assert (None, noop) in hooks.registrations("before_request")
    off()
    assert (None, noop) not in hooks.registrations("before_request")


async def _events(kit: Kit) -> None:
    bus = kit.harness.events
    assert isinstance(bus, EventBus)
    seen: list[Any] = []
    off = bus.on("fact_update", seen.append)
    await kit.harness.session.set_name("one")
    off()
    await kit.harness.session.set_name("two")
    assert [e.name for e in seen] == ["one"]


async def _lane(kit: Kit) -> None:
    main = await kit.harness.lane("main")
    assert main is not None and main.name == "main"
    assert await kit.harness.lane("nope") is None
    assert [info.name for info in await kit.harness.lanes()] == ["main", "side"]  # never creates


async def _create_lane(kit: Kit) -> None:
    lane = ok(await kit.harness.create_lane("other", None))
    assert isinstance(lane, AgentLane) and lane.name == "other"
    assert await kit.harness.lane("other") is not None


async def _lanes(kit: Kit) -> None:
    assert await kit.harness.lanes() == [
        LaneInfo(name="main", leaf_id=None),
        LaneInfo(name="side", leaf_id=None),
    ]


async def _import_state(kit: Kit) -> None:
    state = HarnessState(thread_id="t-1", messages=(user_message("hello"),))
    lane = ok(await kit.harness.import_state("imported", state))
    assert (await lane.export_state("t-1")).messages == state.messages
    err(await kit.harness.import_state("imported", state), "LaneExists")


async def _get_tools(kit: Kit) -> None:
    assert [tool.name for tool in kit.harness.get_tools()] == ["act"]


async def _set_tools(kit: Kit) -> None:
    seen = collect(kit, "config_update")
    replacement = acting_tool(noop_ctx, name="other")
    kit.harness.set_tools([replacement])
    assert kit.harness.get_tools() == (replacement,)
    assert await kit.harness.get_active_tools() == ("other",)
    assert [e.property for e in seen] == ["tools"]


async def _hold(kit: Kit) -> None:
    async with kit.harness.hold():  # the lease is kept as while a lane works
        assert kit.harness._rt.busy()
    assert not kit.harness._rt.busy()
    ok(await kit.harness.prompt("after"))


async def _close(kit: Kit) -> None:
    await kit.harness.close()
    await kit.harness.close()  # idempotent
    assert isinstance(err(await kit.harness.prompt("x"), "Closed"), object)


HARNESS_CALLS: dict[str, HarnessCall] = {
    "create": _create,
    "hooks": _hooks,
    "events": _events,
    "lane": _lane,
    "create_lane": _create_lane,
    "import_state": _import_state,
    "lanes": _lanes,
    "get_tools": _get_tools,
    "set_tools": _set_tools,
    "hold": _hold,
    "close": _close,
}

TreeCall = Callable[[SessionTree], Awaitable[None]]


async def _tree_get_leaf_id(tree: SessionTree) -> None:
    assert await tree.get_leaf_id() is None
    entry_id = await tree.append_message(user_message("x"))
    assert await tree.get_leaf_id() == entry_id


async def _tree_get_entry(tree: SessionTree) -> None:
    assert await tree.get_entry("nope") is None
    entry_id = await tree.append_custom_entry("note", {"k": 1})
    stored = await tree.get_entry(entry_id)
    assert stored is not None and isinstance(stored.entry, CustomEntry)


async def _tree_find_entries(tree: SessionTree) -> None:
    assert await tree.find_entries() == ()
    await tree.append_custom_entry("a")
    await tree.append_custom_entry("b")
    found = await tree.find_entries(EntryQuery(custom_type="b"))
    assert len(found) == 1 and found[0].entry == CustomEntry(id=found[0].id, custom_type="b")


async def _tree_find_entries_on_branch(tree: SessionTree) -> None:
    assert await tree.find_entries_on_branch() == ()  # an empty lane has an empty path
    first = await tree.append_custom_entry("a")
    second = await tree.append_custom_entry("b")
    assert [e.id for e in await tree.find_entries_on_branch()] == [second, first]


async def _tree_get_name(tree: SessionTree) -> None:
    assert await tree.get_name() is None


async def _tree_set_name(tree: SessionTree) -> None:
    await tree.set_name("a session")
    assert await tree.get_name() == "a session"


async def _tree_get_label(tree: SessionTree) -> None:
    assert await tree.get_label("nope") is None


async def _tree_set_label(tree: SessionTree) -> None:
    entry_id = await tree.append_custom_entry("a")
    await tree.set_label(entry_id, "here")
    assert await tree.get_label(entry_id) == "here"
    await tree.set_label(entry_id, None)
    assert await tree.get_label(entry_id) is None


async def _tree_get_stats(tree: SessionTree) -> None:
    before = await tree.get_stats()
    await tree.append_message(user_message("x"))
    after = await tree.get_stats()
    assert (after.entries - before.entries, after.messages - before.messages) == (1, 1)


async def _tree_append_message(tree: SessionTree) -> None:
    entry_id = await tree.append_message(user_message("hi"))
    stored = await tree.get_entry(entry_id)
    assert stored is not None and isinstance(stored.entry, MessageEntry)
    assert said(stored.entry.message) == "hi"


async def _tree_append_custom_entry(tree: SessionTree) -> None:
    entry_id = await tree.append_custom_entry("note", {"k": [1, 2]})
    stored = await tree.get_entry(entry_id)
    assert stored is not None and isinstance(stored.entry, CustomEntry)
    assert stored.entry.custom_type == "note" and stored.entry.data == {"k": (1, 2)}


TREE_CALLS: dict[str, TreeCall] = {
    "get_leaf_id": _tree_get_leaf_id,
    "get_entry": _tree_get_entry,
    "find_entries": _tree_find_entries,
    "find_entries_on_branch": _tree_find_entries_on_branch,
    "get_name": _tree_get_name,
    "set_name": _tree_set_name,
    "get_label": _tree_get_label,
    "set_label": _tree_set_label,
    "get_stats": _tree_get_stats,
    "append_message": _tree_append_message,
    "append_custom_entry": _tree_append_custom_entry,
}


def public(obj: object) -> set[str]:
    return {name for name in dir(obj) if not name.startswith("_")}


async def fresh(tmp_path: Path) -> tuple[Kit, AgentLane]:
    """A fresh harness (memory) with one idle side lane and a model that answers "ok"."""
    kit = await make_kit("memory", tmp_path, tools=[acting_tool(noop_ctx)])
    kit.model.responder = lambda request: text("ok")
    side = ok(await kit.harness.create_lane("side", None))
    return kit, side


async def test_the_call_tables_cover_every_public_member(tmp_path) -> None:
    kit, side = await fresh(tmp_path)
    assert set(LANE_CALLS) == public(side)
    assert set(HARNESS_CALLS) == public(kit.harness) - public(side)
    assert public(kit.harness) >= public(side)  # the harness is lane main
    assert set(TREE_CALLS) == public(side.session)


@pytest.mark.parametrize("target", ["main", "side"])
@pytest.mark.parametrize("member", sorted(LANE_CALLS))
async def test_lane_member_on_a_fresh_harness(member: str, target: str, tmp_path) -> None:
    kit, side = await fresh(tmp_path)
    lane = kit.harness if target == "main" else side
    await LANE_CALLS[member](kit, lane)


@pytest.mark.parametrize("member", sorted(HARNESS_CALLS))
async def test_harness_member_on_a_fresh_harness(member: str, tmp_path) -> None:
    kit, _ = await fresh(tmp_path)
    await HARNESS_CALLS[member](kit)


@pytest.mark.parametrize("target", ["main", "side"])
@pytest.mark.parametrize("member", sorted(TREE_CALLS))
async def test_session_tree_member_on_a_fresh_harness(member: str, target: str, tmp_path) -> None:
    kit, side = await fresh(tmp_path)
    lane = kit.harness if target == "main" else side
    await TREE_CALLS[member](lane.session)
