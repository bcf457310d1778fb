"""The public surface of the harness: every member, queues, abort, configuration, hooks,
events and watch, fault and close, self-check drift, missing identities and parallel lanes.

Interleavings are made deterministic with tool bodies and `asyncio.Event`s: a tool that signals
when it starts and then waits is a run "in flight"; a harness dropped while such a tool waits is
a process that crashed mid-tool (`Kit.reopen` opens the session again as a restarted process
would, with its own id sequence so provisioned ids never collide with the crashed writer's).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pydantic import BaseModel

from harness_core._runtime.restore import restore_lane
from harness_core.errors import (
    HarnessClosed,
    HarnessError,
    HarnessFault,
    RecordLogCorruption,
    SessionError,
)
from harness_core.events import EventBus
from harness_core.harness import AgentHarness, AgentLane, LaneInfo, SessionTree, Watch
from harness_core.hooks import (
    AfterToolEvent,
    AfterToolPatch,
    BeforeResumeEvent,
    BeforeRunEvent,
    BeforeRunResult,
    BeforeToolEvent,
    BeforeToolResult,
    HookError,
    Hooks,
    TransformContextEvent,
)
from harness_core.ids import SequentialIds
from harness_core.messages import (
    AgentMessage,
    AssistantMessage,
    TokenUsage,
    ToolResultMessage,
    message_text,
    user_message,
)
from harness_core.models import ModelRef, ModelRequest
from harness_core.models.scripted import deferred, text, tool_call
from harness_core.options import AgentHarnessOptions, CompactionSettings
from harness_core.portable import CapabilityState, HarnessState
from harness_core.result import Err, Ok
from harness_core.session.entries import (
    CustomEntry,
    Entry,
    MessageEntry,
    ModelChangeEntry,
    ThinkingLevelChangeEntry,
)
from harness_core.session.records import (
    AbortRequested,
    OperationFinished,
    OperationStarted,
    QueueCancelled,
    QueueEnqueued,
    Record,
    RunIntent,
    ToolStarted,
    Usage,
    WriteDeferred,
)
from harness_core.session.types import BranchQuery, EntryQuery, RecordQuery, StoredEntry
from harness_core.tools import Tool, ToolContext
from tests.support.harness_kit import MODEL, Kit, make_kit

BACKENDS = ["memory", "sqlite"]
_R = TypeVar("_R", bound=BaseModel)
OTHER_MODEL = ModelRef(provider="scripted", model_id="bigger")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# -- helpers ------------------------------------------------------------------------------------


def said(message: AgentMessage) -> str:
    return message_text(message)


def texts(messages: Any) -> list[str]:
    return [said(m) for m in messages]


async def log_size(kit: Kit) -> int:
    return len(await kit.storage.get_log())


async def records_of(kit: Kit, kind: type[_R], lane: str | None = None) -> list[_R]:
    """The stored records of one type, oldest first."""
    record_type = kind.model_fields["type"].default
    found = await kit.storage.find_records(
        RecordQuery(type=record_type, lane=lane, order="oldest_first")
    )
    return [r.record for r in found if isinstance(r.record, kind)]


def entry_texts(entries: Iterable[Entry]) -> list[str]:
    """The texts of message entries (every entry must be a message)."""
    result = []
    for entry in entries:
        assert isinstance(entry, MessageEntry), entry
        result.append(said(entry.message))
    return result


async def transcript(kit: Kit, lane: str = "main") -> list[StoredEntry]:
    """The lane's whole path, oldest first (read from storage)."""
    pointer = await kit.storage.get_lane(lane)
    assert pointer is not None
    if pointer.leaf_id is None:
        return []
    path = await kit.storage.find_entries_on_branch(BranchQuery(start=pointer.leaf_id))
    return list(reversed(path))


def messages_of(entries: list[StoredEntry]) -> list[AgentMessage]:
    return [e.entry.message for e in entries if isinstance(e.entry, MessageEntry)]


def ok(result: Any) -> Any:
    assert isinstance(result, Ok), result
    return result.value


def err(result: Any, tag: str) -> Any:
    assert isinstance(result, Err), result
    assert result.error.tag == tag, result.error
    return result.error


class Holder:
    """Late binding for tool bodies that act on the kit that runs them."""

    kit: Kit

    @property
    def harness(self) -> AgentHarness:
        return self.kit.harness


def acting_tool(action: Callable[[ToolContext], Awaitable[Any]], name: str = "act") -> Tool:
    """A tool whose body runs `action(ctx)` (which may call the lane surface)."""

    async def execute(args: Any, ctx: ToolContext) -> str:
        await action(ctx)
        return "acted"

    return Tool(name=name, description="acts on the lane while it runs", execute=execute)


class Waiter:
    """A tool that reports when it starts, then waits for `release` (forever unless set)."""

    def __init__(self, name: str = "wait") -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.calls = 0
        self.tool = Tool(name=name, description="waits", execute=self._execute)

    async def _execute(self, args: Any, ctx: ToolContext) -> str:
        self.calls += 1
        self.started.set()
        await self.release.wait()
        return "released"


async def in_flight(kit: Kit, waiter: Waiter, prompt: str = "go") -> asyncio.Task[Any]:
    """Start a prompt and return once its tool is running (the run is in flight)."""
    task = asyncio.create_task(kit.harness.prompt(prompt))
    async with asyncio.timeout(10):
        await waiter.started.wait()
    return task


async def bury(kit: Kit, task: asyncio.Task[Any]) -> None:
    """Close a crashed harness that is still running in this process; its caller sees it."""
    await kit.harness.close()
    with pytest.raises(HarnessClosed):
        await task


async def reopen(kit: Kit, prefix: str, **changes: Any) -> Kit:
    return await kit.reopen(ids=SequentialIds(prefix), **changes)


def collect(kit: Kit, event_type: str | None = None) -> list[Any]:
    seen: list[Any] = []
    kit.harness.events.on(event_type, seen.append)
    return seen


def answer_tool_results(request: ModelRequest) -> AssistantMessage:
    """A responder: call `act` after user input, answer after a tool result."""
    last = request.messages[-1] if request.messages else None
    if isinstance(last, ToolResultMessage):
        return text("done")
    return tool_call("act")


# -- 1. scaffold: every public member works on a fresh harness or says it is not implemented ---

LaneCall = Callable[[Kit, AgentLane], Awaitable[None]]


async def _name(kit: Kit, lane: AgentLane) -> None:
    assert lane.name == ("main" if lane is kit.harness else "side")


async def _session(kit: Kit, lane: AgentLane) -> None:
    assert isinstance(lane.session, SessionTree)
    entry_id = await lane.session.append_message(user_message("via the view"))
    assert await lane.get_leaf_id() == entry_id  # the view writes to this lane


async def _get_leaf_id(kit: Kit, lane: AgentLane) -> None:
    assert await lane.get_leaf_id() is None


async def _prompt(kit: Kit, lane: AgentLane) -> None:
    outcome = ok(await lane.prompt("hello"))
    assert outcome.kind == "completed" and outcome.operation == "run"
    assert outcome.final_message is not None and said(outcome.final_message) == "ok"
    assert await lane.get_leaf_id() == outcome.leaf_id == outcome.final_entry_id


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
    "prompt": _prompt,
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
    off = hooks.on("before_request", _noop)
    assert (None, _noop) in hooks.registrations("before_request")
    off()
    assert (None, _noop) not in hooks.registrations("before_request")


async def _noop(event: Any) -> None:
    return None


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
    main = kit.harness.lane("main")
    assert main is not None and main.name == "main"
    assert kit.harness.lane("nope") is None
    assert [info.name for info in await kit.harness.lanes()] == ["main", "side"]  # never creates


async def _create_lane(kit: Kit) -> None:
    lane = ok(await kit.harness.create_lane("other", None))
    assert isinstance(lane, AgentLane) and lane.name == "other"
    assert kit.harness.lane("other") is not None


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
    replacement = acting_tool(_noop_ctx, name="other")
    kit.harness.set_tools([replacement])
    assert kit.harness.get_tools() == (replacement,)
    assert await kit.harness.get_active_tools() == ("other",)
    assert [e.property for e in seen] == ["tools"]


async def _noop_ctx(ctx: ToolContext) -> None:
    return None


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
    kit = await make_kit("memory", tmp_path, tools=[acting_tool(_noop_ctx)])
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


# -- 2. queues ----------------------------------------------------------------------------------


async def test_steer_and_follow_up_need_an_active_run(backend, tmp_path) -> None:
    kit = await make_kit(backend, tmp_path)
    before = await log_size(kit)
    assert err(await kit.harness.steer("x"), "NoActiveRun").lane == "main"
    assert err(await kit.harness.follow_up("x"), "NoActiveRun").lane == "main"
    assert await log_size(kit) == before and kit.writes == []
    # input validation comes first and writes nothing either
    err(await kit.harness.next_run([]), "InvalidMessage")
    err(await kit.harness.next_run([user_message("a"), user_message("b")]), "InvalidMessage")
    err(await kit.harness.prompt([]), "InvalidMessage")
    assert await log_size(kit) == before


async def test_next_run_on_an_idle_lane_is_captured_by_the_next_prompt(backend, tmp_path) -> None:
    kit = await make_kit(backend, tmp_path, [text("first"), text("second")])
    seeded = ok(await kit.harness.next_run("seed first"))
    assert kit.writes == [("R", "queue_enqueued:next_run")]
    ok(await kit.harness.prompt("the prompt"))
    started = await records_of(kit, OperationStarted)
    intent = started[0].intent
    assert isinstance(intent, RunIntent)
    assert intent.initial_messages[0].id == seeded
    assert entry_texts(intent.initial_messages) == ["seed first", "the prompt"]
    assert texts(intent.original_prompt) == ["the prompt"]  # captured items are not the prompt
    assert texts(kit.model.requests[0].messages) == ["seed first", "the prompt"]
    # captured once: the next run starts from the prompt alone
    ok(await kit.harness.prompt("again"))
    second = (await records_of(kit, OperationStarted))[1].intent
    assert isinstance(second, RunIntent) and entry_texts(second.initial_messages) == ["again"]


async def test_a_busy_lane_rejects_a_second_operation(backend, tmp_path) -> None:
    waiter = Waiter()
    kit = await make_kit(
        backend,
        tmp_path,
        [text("a1"), tool_call("wait"), text("done")],
        tools=[waiter.tool],
        compaction=CompactionSettings(keep_recent_tokens=1),
    )
    ok(await kit.harness.prompt("q1"))  # an earlier turn: something a compaction could summarize
    task = await in_flight(kit, waiter)
    run_id = (await records_of(kit, OperationStarted))[-1].id
    before = await log_size(kit)
    busy = err(await kit.harness.prompt("another"), "LaneBusy")
    assert (busy.operation_id, busy.operation_kind) == (run_id, "run")
    err(await kit.harness.compact(), "LaneBusy")
    err(await kit.harness.resume(), "LaneBusy")
    assert await log_size(kit) == before
    waiter.release.set()
    assert ok(await task).kind == "completed"


async def test_cancel_queued_outcomes(backend, tmp_path) -> None:
    holder = Holder()
    inside: dict[str, Any] = {}

    async def steer_then_abort(ctx: ToolContext) -> None:
        queued = ok(await holder.harness.steer("killed by the abort"))
        ok(await holder.harness.abort())
        inside["queued"] = queued
        inside["after_abort"] = await holder.harness.cancel_queued(queued)

    kit = await make_kit(
        backend,
        tmp_path,
        [text("first"), tool_call("act")],
        tools=[acting_tool(steer_then_abort)],
    )
    holder.kit = kit
    harness = kit.harness
    # cancelled: a pending next-run item is retracted and never appended
    dropped = ok(await harness.next_run("drop me"))
    assert await harness.cancel_queued(dropped) == Ok("cancelled")
    assert await harness.cancel_queued(dropped) == Ok("already_cleared")  # an earlier cancel won
    # already consumed: the run appended it
    kept = ok(await harness.next_run("keep me"))
    ok(await harness.prompt("first"))
    assert await harness.cancel_queued(kept) == Ok("already_consumed")
    assert texts(kit.model.requests[0].messages) == ["keep me", "first"]
    assert await kit.storage.get_entry(dropped) is None
    # already cleared: an abort killed the steering item
    assert ok(await harness.prompt("second")).kind == "aborted"
    assert inside["after_abort"] == Ok("already_cleared")
    assert await harness.cancel_queued(inside["queued"]) == Ok("already_cleared")
    # unknown
    unknown = err(await harness.cancel_queued("no-such-item"), "UnknownQueueItem")
    assert (unknown.lane, unknown.entry_id) == ("main", "no-such-item")
    assert len(await records_of(kit, QueueCancelled)) == 1  # only the real cancellation wrote


async def test_abort_returns_the_drained_queues_and_next_run_survives(backend, tmp_path) -> None:
    holder = Holder()
    inside: dict[str, Any] = {}

    async def queue_then_abort(ctx: ToolContext) -> None:
        harness = holder.harness
        ok(await harness.steer("steer it"))
        ok(await harness.follow_up("then this"))
        inside["next"] = ok(await harness.next_run("for later"))
        inside["abort"] = ok(await harness.abort())
        inside["late"] = await harness.steer("too late")  # the run is aborting

    kit = await make_kit(
        backend,
        tmp_path,
        [tool_call("act"), text("next answer")],
        tools=[acting_tool(queue_then_abort)],
    )
    holder.kit = kit
    aborts = collect(kit, "run_abort")
    outcome = ok(await kit.harness.prompt("go"))
    assert outcome.kind == "aborted"
    accepted = inside["abort"]
    assert accepted.run_id == outcome.run_id
    assert entry_texts(accepted.steer) == ["steer it"]
    assert entry_texts(accepted.follow_up) == ["then this"]
    assert len(aborts) == 1
    assert (texts(aborts[0].steer), texts(aborts[0].follow_up)) == (["steer it"], ["then this"])
    err(inside["late"], "NoActiveRun")
    assert all("steer it" not in str(r.messages) for r in kit.model.requests)
    assert "steer it" not in texts(messages_of(await transcript(kit)))
    # the next-run item survived the abort and seeds the next run
    watch = await kit.harness.watch()
    assert [e.id for e in watch.snapshot.next_run] == [inside["next"]]
    watch.unsubscribe()
    ok(await kit.harness.prompt("next"))
    assert texts(kit.model.requests[-1].messages)[-2:] == ["for later", "next"]


# -- 3. abort -----------------------------------------------------------------------------------


async def test_abort_on_an_idle_lane_is_rejected_without_a_write(backend, tmp_path) -> None:
    kit = await make_kit(backend, tmp_path, [text("ok")])
    ok(await kit.harness.prompt("hi"))  # a finished run is not abortable either
    before = await log_size(kit)
    assert err(await kit.harness.abort(), "NoActiveOperation").lane == "main"
    assert await log_size(kit) == before


async def test_a_second_abort_is_accepted_again_without_a_second_marker(backend, tmp_path) -> None:
    """D22: the second abort of the same operation resolves Ok with the same run id and empty
    payloads (the queues were already drained), writes nothing and emits no second event."""
    holder = Holder()
    inside: dict[str, Any] = {}

    async def abort_twice(ctx: ToolContext) -> None:
        ok(await holder.harness.steer("queued"))
        inside["first"] = ok(await holder.harness.abort())
        size = await log_size(holder.kit)
        inside["second"] = ok(await holder.harness.abort())
        inside["wrote"] = await log_size(holder.kit) - size

    kit = await make_kit(backend, tmp_path, [tool_call("act")], tools=[acting_tool(abort_twice)])
    holder.kit = kit
    aborts = collect(kit, "run_abort")
    outcome = ok(await kit.harness.prompt("go"))
    assert outcome.kind == "aborted"
    first, second = inside["first"], inside["second"]
    assert first.run_id == second.run_id == outcome.run_id
    assert entry_texts(first.steer) == ["queued"]
    assert (second.steer, second.follow_up) == ((), ())
    assert inside["wrote"] == 0
    assert len(await records_of(kit, AbortRequested)) == 1
    assert [texts(e.steer) for e in aborts] == [["queued"]]
    assert [r.outcome for r in await records_of(kit, OperationFinished)] == ["aborted"]
    err(await kit.harness.abort(), "NoActiveOperation")  # after the finish


async def test_abort_of_a_suspended_deferred_run_cancels_the_request(backend, tmp_path) -> None:
    kit = await make_kit(backend, tmp_path, [deferred("resp_1")])
    suspended = ok(await kit.harness.prompt("take your time"))
    assert suspended.kind == "suspended" and suspended.deferred is not None
    assert [(i.name, i.status) for i in await kit.harness.lanes()] == [("main", "suspended")]
    ends = collect(kit, "run_end")
    accepted = ok(await kit.harness.abort())
    assert accepted.run_id == suspended.run_id
    async with asyncio.timeout(10):
        await kit.harness.wait_for_idle()
    assert kit.model.cancels == [suspended.deferred]
    assert kit.model.fetches == []  # aborting never redeems the request
    assert [(e.run_id, e.outcome) for e in ends] == [(suspended.run_id, "aborted")]
    finished = await records_of(kit, OperationFinished)
    assert [(r.run_id, r.outcome) for r in finished] == [(suspended.run_id, "aborted")]
    stops = [
        m.stop_reason for m in messages_of(await transcript(kit)) if isinstance(m, AssistantMessage)
    ]
    assert stops == ["deferred", "aborted"]  # the deferred entry stays, then the closure
    assert [(i.name, i.status) for i in await kit.harness.lanes()] == [("main", "idle")]


# -- 4. configuration ---------------------------------------------------------------------------


async def test_configuration_defaults_and_idle_setters(backend, tmp_path) -> None:
    echo = acting_tool(_noop_ctx, name="echo")
    kit = await make_kit(backend, tmp_path, [text("ok")], tools=[echo])
    harness = kit.harness
    assert await harness.get_model() == MODEL
    assert await harness.get_thinking_level() == "off"
    assert await harness.get_active_tools() == ("echo",)
    updates = collect(kit, "config_update")
    await harness.set_model(OTHER_MODEL)
    await harness.set_thinking_level("high")
    await harness.set_active_tools([])
    assert kit.writes == [
        ("E", "model_change"),
        ("E", "thinking_level_change"),
        ("E", "active_tools_change"),
    ]
    assert [(e.property, e.value) for e in updates] == [
        ("model", str(OTHER_MODEL)),
        ("thinking_level", "high"),
        ("active_tools", ()),
    ]
    assert await harness.get_model() == OTHER_MODEL
    assert await harness.get_thinking_level() == "high"
    assert await harness.get_active_tools() == ()
    ok(await harness.prompt("hi"))
    request = kit.model.requests[0]
    assert (request.model, request.thinking_level, request.tools) == (OTHER_MODEL, "high", ())
    # persisted: a restarted process reads the same configuration from the path
    reopened = await reopen(kit, "r-")
    assert await reopened.harness.get_model() == OTHER_MODEL
    assert await reopened.harness.get_thinking_level() == "high"
    assert await reopened.harness.get_active_tools() == ()
    # lanes are configured independently
    side = ok(await reopened.harness.create_lane("side", None))
    assert await side.get_model() == MODEL


async def test_setters_during_a_run_are_deferred_to_the_next_checkpoint(backend, tmp_path) -> None:
    holder = Holder()
    inside: dict[str, Any] = {}

    async def configure(ctx: ToolContext) -> None:
        await holder.harness.set_model(OTHER_MODEL)
        await holder.harness.set_thinking_level("high")
        inside["model"] = await holder.harness.get_model()  # not applied yet
        inside["pending"] = (await holder.harness.watch()).snapshot.pending_writes

    kit = await make_kit(
        backend, tmp_path, [tool_call("act"), text("done")], tools=[acting_tool(configure)]
    )
    holder.kit = kit
    pending = collect(kit, "write_pending")
    added = collect(kit, "entry_added")
    ok(await kit.harness.prompt("go"))
    assert inside["model"] == MODEL
    assert [type(e) for e in inside["pending"]] == [ModelChangeEntry, ThinkingLevelChangeEntry]
    index = kit.writes.index(("R", "tool_started"))
    assert kit.writes[index : index + 7] == [
        ("R", "tool_started"),
        ("R", "write_deferred"),
        ("R", "write_deferred"),
        ("H", "after_tool"),
        ("E", "message:tool_result:ok"),
        ("E", "model_change"),  # applied at the checkpoint, in acceptance order
        ("E", "thinking_level_change"),
    ]
    deferred_ids = [r.target.id for r in await records_of(kit, WriteDeferred)]
    assert [e.entry_id for e in pending] == deferred_ids == [e.entry.id for e in added]
    first, second = kit.model.requests
    assert (first.model, first.thinking_level) == (MODEL, "off")
    assert (second.model, second.thinking_level) == (OTHER_MODEL, "high")
    assert await kit.harness.get_model() == OTHER_MODEL


# -- 5. hooks -----------------------------------------------------------------------------------


def test_hook_registration_ids() -> None:
    hooks = Hooks()
    for name in ("before_run", "before_resume"):
        with pytest.raises(HookError):
            hooks.on(name, _noop)
    off = hooks.on("before_run", _noop, id="ext")
    with pytest.raises(HookError):
        hooks.on("before_run", _noop, id="ext")  # unique per hook name
    hooks.on("before_resume", _noop, id="ext")  # the same id on the counterpart hook
    hooks.on("before_tool", _noop)
    hooks.on("before_tool", _noop)  # anonymous handlers of other hooks may repeat
    hooks.on("before_tool", _noop, id="policy")
    with pytest.raises(HookError):
        hooks.on("before_tool", _noop, id="policy")  # an id is unique whatever the hook
    assert [i for i, _ in hooks.registrations("before_run")] == ["ext"]
    off()
    off()  # unregistering twice is harmless
    assert hooks.registrations("before_run") == []
    hooks.on("before_run", _noop, id="ext")  # the id is free again


async def test_a_blocking_before_tool_writes_no_tool_started(backend, tmp_path) -> None:
    ran: list[Any] = []

    async def execute(args: Any, ctx: ToolContext) -> str:
        ran.append(args)
        return "ran"

    async def block(event: BeforeToolEvent) -> BeforeToolResult:
        return BeforeToolResult(block="not on a friday")

    kit = await make_kit(
        backend,
        tmp_path,
        [tool_call("echo", {"x": 1}), text("understood")],
        tools=[Tool(name="echo", description="echo", execute=execute)],
    )
    kit.harness.hooks.on("before_tool", block)
    starts = collect(kit, "tool_start")
    assert ok(await kit.harness.prompt("go")).kind == "completed"
    assert ran == [] and starts == []
    assert await records_of(kit, ToolStarted) == []
    index = kit.writes.index(("E", "message:assistant:tool_use"))
    assert kit.writes[index + 1 : index + 3] == [
        ("H", "before_tool"),
        ("E", "message:tool_result:blocked"),
    ]
    result = kit.model.requests[-1].messages[-1]
    assert isinstance(result, ToolResultMessage) and said(result) == "not on a friday"


async def test_a_raising_before_tool_hook_fails_closed(backend, tmp_path) -> None:
    ran: list[Any] = []
    later: list[Any] = []

    async def execute(args: Any, ctx: ToolContext) -> str:
        ran.append(args)
        return "ran"

    async def broken(event: BeforeToolEvent) -> None:
        raise RuntimeError("policy service down")

    async def allow(event: BeforeToolEvent) -> None:
        later.append(event)

    kit = await make_kit(
        backend,
        tmp_path,
        [tool_call("echo"), text("ok")],
        tools=[Tool(name="echo", description="echo", execute=execute)],
    )
    kit.harness.hooks.on("before_tool", broken)
    kit.harness.hooks.on("before_tool", allow)
    errors = collect(kit, "handler_error")
    assert ok(await kit.harness.prompt("go")).kind == "completed"
    assert ran == [] and later == []  # blocked, and the handlers after it never ran
    assert await records_of(kit, ToolStarted) == []
    assert [(e.kind, e.name) for e in errors] == [("hook", "before_tool")]
    assert "policy service down" in errors[0].error
    results = [m for m in messages_of(await transcript(kit)) if isinstance(m, ToolResultMessage)]
    assert [r.outcome for r in results] == ["blocked"]


async def test_hook_aggregation(backend, tmp_path) -> None:
    seen: dict[str, list[Any]] = {"system": [], "details": [], "context": []}

    async def first_run(event: BeforeRunEvent) -> BeforeRunResult:
        seen["system"].append(event.system_prompt)
        return BeforeRunResult(messages=(user_message("from first"),), system_prompt="first")

    async def second_run(event: BeforeRunEvent) -> BeforeRunResult:
        seen["system"].append(event.system_prompt)  # sees the first handler's prompt
        return BeforeRunResult(messages=(user_message("from second"),), system_prompt="second")

    async def first_tool(event: AfterToolEvent) -> AfterToolPatch:
        return AfterToolPatch(details={"by": "first"})

    async def second_tool(event: AfterToolEvent) -> AfterToolPatch:
        seen["details"].append(event.output.details)  # sees the first patch
        return AfterToolPatch(is_error=True)

    async def inject(event: TransformContextEvent) -> tuple[AgentMessage, ...]:
        return (*event.messages, user_message("ephemeral"))

    async def broken(event: TransformContextEvent) -> None:
        raise ValueError("isolated")

    async def observe(event: TransformContextEvent) -> None:
        seen["context"].append(texts(event.messages)[-1])

    kit = await make_kit(
        backend,
        tmp_path,
        [tool_call("act"), text("done")],
        tools=[acting_tool(_noop_ctx)],
        system_prompt="base",
    )
    hooks = kit.harness.hooks
    hooks.on("before_run", first_run, id="first")
    hooks.on("before_run", second_run, id="second")
    hooks.on("after_tool", first_tool)
    hooks.on("after_tool", second_tool)
    hooks.on("transform_context", inject)
    hooks.on("transform_context", broken)
    hooks.on("transform_context", observe)
    errors = collect(kit, "handler_error")
    assert ok(await kit.harness.prompt("go")).kind == "completed"
    # before_run: the system prompt chains and the last replaces; messages accumulate in order
    assert seen["system"] == ["base", "first"]
    intent = (await records_of(kit, OperationStarted))[0].intent
    assert isinstance(intent, RunIntent)
    assert intent.system_prompt_override == "second"
    assert texts(intent.original_prompt) == ["go"]
    first = kit.model.requests[0]
    assert first.system_prompt == "second"
    # transform_context chains (a raising handler is skipped) and never reaches the session
    assert texts(first.messages) == ["go", "from first", "from second", "ephemeral"]
    assert seen["context"] == ["ephemeral", "ephemeral"]
    assert [(e.name, e.kind) for e in errors] == [("transform_context", "hook")] * 2
    assert "ephemeral" not in texts(messages_of(await transcript(kit)))
    # after_tool: patches accumulate field by field
    assert seen["details"] == [{"by": "first"}]
    results = [m for m in messages_of(await transcript(kit)) if isinstance(m, ToolResultMessage)]
    assert [(r.outcome, r.details, said(r)) for r in results] == [
        ("error", {"by": "first"}, "acted")
    ]


async def test_resume_data_round_trips_to_before_resume_after_a_crash(backend, tmp_path) -> None:
    waiter = Waiter()
    kit = await make_kit(backend, tmp_path, [tool_call("wait")], tools=[waiter.tool])
    runs: list[BeforeRunEvent] = []

    def before_run(data: Any) -> Callable[[BeforeRunEvent], Awaitable[BeforeRunResult]]:
        async def handler(event: BeforeRunEvent) -> BeforeRunResult:
            runs.append(event)
            return BeforeRunResult(resume_data=data)

        return handler

    kit.harness.hooks.on("before_run", before_run({"cursor": 7}), id="ext")
    kit.harness.hooks.on("before_run", before_run(None), id="quiet")
    kit.harness.hooks.on("before_run", before_run("token"), id="other")
    task = await in_flight(kit, waiter)
    # the process dies here; a new one opens the session
    fresh_kit = await reopen(kit, "r-", script=[text("recovered")])
    [suspended] = fresh_kit.suspended
    assert (suspended.lane, suspended.kind, suspended.reason) == ("main", "run", "crash")
    assert texts(suspended.prompt) == ["go"]
    resumed: dict[str, BeforeResumeEvent] = {}

    def before_resume(hook_id: str) -> Callable[[BeforeResumeEvent], Awaitable[None]]:
        async def handler(event: BeforeResumeEvent) -> None:
            resumed[hook_id] = event

        return handler

    for hook_id in ("ext", "quiet", "other", "new"):
        fresh_kit.harness.hooks.on("before_resume", before_resume(hook_id), id=hook_id)
    outcome = ok(await fresh_kit.harness.resume())
    assert outcome.kind == "completed" and outcome.run_id == suspended.id
    assert len(runs) == 3, "before_run never runs again on resume"
    assert {hook_id: event.resume_data for hook_id, event in resumed.items()} == {
        "ext": {"cursor": 7},
        "quiet": None,
        "other": "token",
        "new": None,
    }
    event = resumed["ext"]
    assert (event.run_id, event.kind, texts(event.prompt)) == (suspended.id, "run", ["go"])
    results = [
        m for m in messages_of(await transcript(fresh_kit)) if isinstance(m, ToolResultMessage)
    ]
    assert [r.outcome for r in results] == ["interrupted"]  # replay="never": not run again
    assert waiter.calls == 1
    await bury(kit, task)


# -- 6. events and watch ------------------------------------------------------------------------

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
        backend, tmp_path, [tool_call("act"), text("done")], tools=[acting_tool(_noop_ctx)]
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


# -- 7. fault and close -------------------------------------------------------------------------


async def test_a_storage_write_failure_faults_and_a_reopen_resumes(
    backend, tmp_path, monkeypatch
) -> None:
    calls: list[str] = []

    async def execute(args: Any, ctx: ToolContext) -> str:
        calls.append(ctx.run_id)
        return "ran"

    tool = Tool(name="echo", description="echo", execute=execute)
    kit = await make_kit(backend, tmp_path, [tool_call("echo")], tools=[tool])
    recording = kit.recording
    assert recording is not None
    append_record = recording.append_record
    failure = SessionError("storage", "disk full")

    async def failing(record: Record) -> Any:
        if record.type == "tool_started":
            raise failure
        return await append_record(record)

    monkeypatch.setattr(recording, "append_record", failing)
    faults = collect(kit, "fault")
    with pytest.raises(HarnessFault) as caught:
        await kit.harness.prompt("go")
    fault = caught.value
    assert fault.__cause__ is failure
    assert [e.message for e in faults] == ["disk full"]
    assert calls == []  # the durability point failed: the tool never started
    # every later call raises the same fault
    for call in (
        lambda: kit.harness.prompt("again"),
        lambda: kit.harness.steer("x"),
        lambda: kit.harness.abort(),
        lambda: kit.harness.get_model(),
        lambda: kit.harness.lanes(),
        lambda: kit.harness.watch(),
        lambda: kit.harness.session.get_entry("x"),
    ):
        with pytest.raises(HarnessFault) as again:
            await call()
        assert again.value is fault
    with pytest.raises(HarnessFault):
        kit.harness.lane("main")
    # the store is a valid prefix: a new process restores it and resume completes the run
    fresh_kit = await reopen(kit, "r-", script=[text("recovered")])
    [suspended] = fresh_kit.suspended
    assert (suspended.reason, suspended.missing_tools) == ("crash", ())
    outcome = ok(await fresh_kit.harness.resume())
    assert outcome.kind == "completed" and outcome.run_id == suspended.id
    assert calls == [suspended.id]  # no tool_started existed: the call ran in full, once
    assert [r.outcome for r in await records_of(fresh_kit, OperationFinished)] == ["completed"]


async def test_close_during_a_run(backend, tmp_path) -> None:
    waiter = Waiter()
    kit = await make_kit(backend, tmp_path, [tool_call("wait")], tools=[waiter.tool])
    side = ok(await kit.harness.create_lane("side", None))
    task = await in_flight(kit, waiter)
    before = await log_size(kit)
    await kit.harness.close()
    with pytest.raises(HarnessClosed):
        await task
    harness = kit.harness
    # Result-returning calls resolve Err(Closed)
    for result in (
        await harness.prompt("x"),
        await harness.resume(),
        await harness.abort(),
        await harness.compact(),
        await harness.navigate_tree(None),
        await harness.steer("x"),
        await harness.follow_up("x"),
        await harness.next_run("x"),
        await harness.cancel_queued("x"),
        await harness.record_usage(TokenUsage()),
        await harness.create_lane("third", None),
        await side.prompt("x"),
    ):
        err(result, "Closed")
    # other calls raise HarnessClosed
    for call in (
        lambda: harness.get_model(),
        lambda: harness.get_leaf_id(),
        lambda: harness.set_thinking_level("high"),
        lambda: harness.wait_for_idle(),
        lambda: harness.watch(),
        lambda: harness.lanes(),
        lambda: harness.session.get_entry("x"),
        lambda: side.get_active_tools(),
    ):
        with pytest.raises(HarnessClosed):
            await call()
    await harness.close()  # a second close is a no-op
    assert await log_size(kit) == before, "closing wrote nothing"
    # the operation stays open and resumable by a new harness
    fresh_kit = await reopen(kit, "r-", script=[text("recovered")])
    [suspended] = fresh_kit.suspended
    assert (suspended.lane, suspended.reason) == ("main", "crash")
    assert ok(await fresh_kit.harness.resume()).kind == "completed"
    assert waiter.calls == 1


# -- 8. self-check drift --------------------------------------------------------------------------


async def test_drift_faults_the_harness(backend, tmp_path) -> None:
    """Another writer appends to the lane's log behind the harness's back (the ownership rule
    broken): the self-check at the next operation end recomputes the lane from storage, finds
    a queued item the live state never saw, and faults."""
    kit = await make_kit(backend, tmp_path, [text("a1")])
    first = ok(await kit.harness.prompt("q1"))
    user_entry = (await transcript(kit))[0].id
    sneaked = MessageEntry(id="sneaked-entry", message=user_message("behind your back"))
    await kit.storage.append_record(
        QueueEnqueued(id="sneaked", lane="main", queue="next_run", run_id=None, target=sneaked)
    )
    faults = collect(kit, "fault")
    with pytest.raises(HarnessFault) as caught:
        await kit.harness.navigate_tree(user_entry)  # needs no model; ends with the self-check
    cause = caught.value.__cause__
    assert isinstance(cause, RecordLogCorruption) and cause.reason == "drift"
    assert len(faults) == 1
    finished = await records_of(kit, OperationFinished)
    assert len(finished) == 2, "the navigation itself committed before the check"
    with pytest.raises(HarnessFault):
        await kit.harness.prompt("q2")
    # storage is the truth: a reopened harness sees the item and the next run captures it
    fresh_kit = await reopen(kit, "r-", script=[text("a2")])
    assert fresh_kit.suspended == []
    assert await fresh_kit.harness.get_leaf_id() == user_entry != first.leaf_id
    ok(await fresh_kit.harness.prompt("q2"))
    assert texts(fresh_kit.model.requests[-1].messages)[-2:] == ["behind your back", "q2"]


async def test_the_self_check_passes_when_only_the_harness_writes(backend, tmp_path) -> None:
    """The converse of drift: a harness that alone writes its lanes never trips the check."""
    kit = await make_kit(backend, tmp_path, [text("a1"), text("a2")])
    faults = collect(kit, "fault")
    ok(await kit.harness.prompt("q1"))
    ok(await kit.harness.next_run("later"))
    ok(await kit.harness.navigate_tree((await transcript(kit))[0].id))
    ok(await kit.harness.prompt("q2"))
    ok(await kit.harness.next_run("pending"))
    state = await restore_lane(kit.storage, "main")
    assert entry_texts(state.pending_next_run) == ["pending"]
    assert state.leaf_id == await kit.harness.get_leaf_id() and faults == []


# -- 9. missing identities ------------------------------------------------------------------------


async def test_missing_identities_block_resume_but_not_abort(backend, tmp_path) -> None:
    waiter = Waiter()
    kit = await make_kit(backend, tmp_path, [tool_call("wait")], tools=[waiter.tool])
    task = await in_flight(kit, waiter)
    kit.model.known_models = {"scripted:another"}  # the restarted process lacks the model too
    fresh_kit = await reopen(kit, "r-", tools=[])
    [suspended] = fresh_kit.suspended
    assert suspended.missing_tools == ("wait",)
    assert suspended.missing_models == (str(MODEL),)
    before = await log_size(fresh_kit)
    missing = err(await fresh_kit.harness.resume(), "MissingIdentities")
    assert (missing.lane, missing.tools, missing.models) == ("main", ("wait",), (str(MODEL),))
    assert await log_size(fresh_kit) == before
    accepted = ok(await fresh_kit.harness.abort())
    assert accepted.run_id == suspended.id
    async with asyncio.timeout(10):
        await fresh_kit.harness.wait_for_idle()
    finished = await records_of(fresh_kit, OperationFinished)
    assert [(r.run_id, r.outcome) for r in finished] == [(suspended.id, "aborted")]
    results = [
        m for m in messages_of(await transcript(fresh_kit)) if isinstance(m, ToolResultMessage)
    ]
    assert [r.outcome for r in results] == ["interrupted"]
    assert waiter.calls == 1
    assert len(fresh_kit.model.requests) == 1  # only the crashed process's request
    await bury(kit, task)
    third = await reopen(fresh_kit, "s-")
    assert third.suspended == []


# -- 10. lanes ----------------------------------------------------------------------------------


async def test_lanes_run_in_parallel(backend, tmp_path) -> None:
    arrived = {"a": asyncio.Event(), "b": asyncio.Event()}

    async def meet(ctx: ToolContext) -> None:
        arrived[ctx.lane].set()
        other = "b" if ctx.lane == "a" else "a"
        await arrived[other].wait()  # only finishes if the other lane runs meanwhile

    kit = await make_kit(backend, tmp_path, tools=[acting_tool(meet)])
    kit.model.responder = answer_tool_results
    a = ok(await kit.harness.create_lane("a", None))
    b = ok(await kit.harness.create_lane("b", None))
    async with asyncio.timeout(10):
        first, second = await asyncio.gather(a.prompt("lane a"), b.prompt("lane b"))
    assert ok(first).kind == ok(second).kind == "completed"
    for lane, prompt in (("a", "lane a"), ("b", "lane b")):
        path = messages_of(await transcript(kit, lane))
        assert said(path[0]) == prompt and said(path[-1]) == "done"
        assert [m.role for m in path] == ["user", "assistant", "tool_result", "assistant"]
    assert await kit.harness.get_leaf_id() is None  # main was untouched
    infos = {info.name: info.status for info in await kit.harness.lanes()}
    assert infos == {"a": "idle", "b": "idle", "main": "idle"}


async def test_create_lane_rejections(backend, tmp_path) -> None:
    kit = await make_kit(backend, tmp_path, [text("ok")])
    harness = kit.harness
    assert err(await harness.create_lane("main", None), "LaneExists").lane == "main"
    invalid = err(await harness.create_lane("bad\nname", None), "InvalidLane")
    assert (invalid.lane, invalid.reason) == ("bad\nname", "name")
    err(await harness.create_lane("", None), "InvalidLane")
    assert err(await harness.create_lane("x", "nope"), "UnknownTarget").target_id == "nope"
    assert [info.name for info in await harness.lanes()] == ["main"]
    outcome = ok(await harness.prompt("hi"))
    thread = ok(await harness.create_lane("thread", outcome.leaf_id))
    assert await thread.get_leaf_id() == outcome.leaf_id  # copies nothing: it points there
    err(await harness.create_lane("thread", None), "LaneExists")
    assert harness.lane("thread") is not None and harness.lane("missing") is None
    created = [r for r in await kit.storage.get_lanes()]
    assert sorted(p.lane for p in created) == ["main", "thread"]
    # a lane's first run sees the branch it was created on
    kit.model.script.append(text("threaded"))
    ok(await thread.prompt("in the thread"))
    assert texts(kit.model.requests[-1].messages) == ["hi", "ok", "in the thread"]
    assert await harness.get_leaf_id() == outcome.leaf_id  # main did not move


async def test_tool_progress_is_a_live_event_and_never_stored(backend, tmp_path) -> None:
    async def report(ctx: ToolContext) -> None:
        ctx.update({"done": 1, "of": 2})
        ctx.update("almost")

    kit = await make_kit(
        backend, tmp_path, [tool_call("act"), text("done")], tools=[acting_tool(report)]
    )
    updates = collect(kit, "tool_update")
    outcome = ok(await kit.harness.prompt("go"))
    assert [(u.tool_name, u.run_id) for u in updates] == [("act", outcome.run_id)] * 2
    assert [u.partial for u in updates] == [{"done": 1, "of": 2}, "almost"]
    stored = "".join(item.model_dump_json() for item in await kit.storage.get_log())
    assert "almost" not in stored
