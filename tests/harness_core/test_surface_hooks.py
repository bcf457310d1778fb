"""Hooks: registration ids, a blocking or raising `before_tool` (fail closed), how several
handlers' results aggregate, and `resume_data` carried from `before_run` to `before_resume`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

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
from harness_core.messages import AgentMessage, ToolResultMessage, user_message
from harness_core.models.scripted import text, tool_call
from harness_core.session.records import OperationStarted, RunIntent, ToolStarted
from harness_core.tools import Tool, ToolContext
from tests.support.harness_kit import Kit, make_kit
from tests.support.surface import (
    Waiter,
    acting_tool,
    bury,
    collect,
    in_flight,
    messages_of,
    noop,
    noop_ctx,
    ok,
    records_of,
    reopen,
    said,
    texts,
    transcript,
)


def test_hook_registration_ids() -> None:
    hooks = Hooks()
    for name in ("before_run", "before_resume"):
        with pytest.raises(HookError):
            hooks.on(name, noop)
    off = hooks.on("before_run", noop, id="ext")
    with pytest.raises(HookError):
        hooks.on("before_run", noop, id="ext")  # unique per hook name
    hooks.on("before_resume", noop, id="ext")  # the same id on the counterpart hook
    hooks.on("before_tool", noop)
    hooks.on("before_tool", noop)  # anonymous handlers of other hooks may repeat
    hooks.on("before_tool", noop, id="policy")
    with pytest.raises(HookError):
        hooks.on("before_tool", noop, id="policy")  # an id is unique whatever the hook
    assert [i for i, _ in hooks.registrations("before_run")] == ["ext"]
    off()
    off()  # unregistering twice is harmless
    assert hooks.registrations("before_run") == []
    hooks.on("before_run", noop, id="ext")  # the id is free again


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


@dataclass
class Aggregated:
    """One prompt with several handlers on each of three hooks, and what they saw."""

    kit: Kit
    seen: dict[str, list[Any]]
    errors: list[Any]


async def aggregated(backend: str, tmp_path: Path) -> Aggregated:
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
        tools=[acting_tool(noop_ctx)],
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
    return Aggregated(kit, seen, errors)


async def _before_run_chains_the_prompt_and_accumulates_messages(run: Aggregated) -> None:
    # the system prompt chains and the last replaces; messages accumulate in order
    assert run.seen["system"] == ["base", "first"]
    intent = (await records_of(run.kit, OperationStarted))[0].intent
    assert isinstance(intent, RunIntent)
    assert intent.system_prompt_override == "second"
    assert texts(intent.original_prompt) == ["go"]
    first = run.kit.model.requests[0]
    assert first.system_prompt == "second"
    assert texts(first.messages)[:3] == ["go", "from first", "from second"]


async def _transform_context_chains_and_never_reaches_the_session(run: Aggregated) -> None:
    # transform_context chains (a raising handler is skipped) and never reaches the session
    first = run.kit.model.requests[0]
    assert texts(first.messages) == ["go", "from first", "from second", "ephemeral"]
    assert run.seen["context"] == ["ephemeral", "ephemeral"]
    assert [(e.name, e.kind) for e in run.errors] == [("transform_context", "hook")] * 2
    assert "ephemeral" not in texts(messages_of(await transcript(run.kit)))


async def _after_tool_patches_accumulate_field_by_field(run: Aggregated) -> None:
    assert run.seen["details"] == [{"by": "first"}]
    results = [
        m for m in messages_of(await transcript(run.kit)) if isinstance(m, ToolResultMessage)
    ]
    assert [(r.outcome, r.details, said(r)) for r in results] == [
        ("error", {"by": "first"}, "acted")
    ]


AGGREGATION_RULES: dict[str, Callable[[Aggregated], Awaitable[None]]] = {
    "before_run": _before_run_chains_the_prompt_and_accumulates_messages,
    "transform_context": _transform_context_chains_and_never_reaches_the_session,
    "after_tool": _after_tool_patches_accumulate_field_by_field,
}


@pytest.mark.parametrize("hook", list(AGGREGATION_RULES))
async def test_hook_aggregation(hook: str, backend: str, tmp_path: Path) -> None:
    """Several handlers of one hook: how their results combine (one case per hook)."""
    await AGGREGATION_RULES[hook](await aggregated(backend, tmp_path))


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
