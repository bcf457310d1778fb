"""Lanes: they run in parallel, `create_lane`'s rejections and branch point, and tool progress
(a live event, never stored).
"""

from __future__ import annotations

import asyncio

from harness_core.messages import AssistantMessage, ToolResultMessage
from harness_core.models import ModelRequest
from harness_core.models.scripted import text, tool_call
from harness_core.tools import ToolContext
from tests.support.harness_kit import make_kit
from tests.support.surface import (
    acting_tool,
    collect,
    err,
    messages_of,
    ok,
    said,
    texts,
    transcript,
)


def answer_tool_results(request: ModelRequest) -> AssistantMessage:
    """A responder: call `act` after user input, answer after a tool result."""
    last = request.messages[-1] if request.messages else None
    if isinstance(last, ToolResultMessage):
        return text("done")
    return tool_call("act")


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
    assert await harness.lane("thread") is not None and await harness.lane("missing") is None
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
