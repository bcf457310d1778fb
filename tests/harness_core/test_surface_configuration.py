"""Configuration (model, thinking level, active tools): defaults, setters on an idle lane (written
and persisted), and setters during a run (deferred to the next checkpoint).
"""

from __future__ import annotations

from typing import Any

from harness_core.models.scripted import text, tool_call
from harness_core.session.entries import ModelChangeEntry, ThinkingLevelChangeEntry
from harness_core.session.records import WriteDeferred
from harness_core.tools import ToolContext
from tests.support.harness_kit import MODEL, make_kit
from tests.support.surface import (
    OTHER_MODEL,
    Holder,
    acting_tool,
    collect,
    noop_ctx,
    ok,
    records_of,
    reopen,
)


async def test_configuration_defaults_and_idle_setters(backend, tmp_path) -> None:
    echo = acting_tool(noop_ctx, name="echo")
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
