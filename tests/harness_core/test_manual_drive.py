"""Manual drive: the gate's invariants (reference §11.2, §16.3 gate invariants 2-5)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from harness_core.errors import HarnessClosed, HarnessError
from harness_core.models.scripted import deferred, text, tool_call, tool_calls
from harness_core.result import Ok
from harness_core.testing import ManualClock
from harness_core.testing.trajectories import SCENARIOS, Scenario, open_run, prompt
from harness_core.tools import Tool, ToolContext
from tests.support.backends import new_repo
from tests.support.harness_kit import Kit, make_kit
from tests.support.manual import drive, kinds, started


def counting_tool(name: str, runs: list[str]) -> Tool:
    async def execute(args: Any, ctx: ToolContext) -> str:
        runs.append(name)
        return f"{name} done"

    return Tool(name=name, description=name, execute=execute, replay="safe")


async def settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


async def snapshot(kit: Kit) -> tuple[int, int]:
    return len(await kit.storage.get_log()), len(kit.model.requests)


async def test_peek_is_stable_and_nothing_happens_while_parked(
    backend: str, tmp_path: Path
) -> None:
    runs: list[str] = []
    kit = await make_kit(
        backend,
        tmp_path,
        [tool_call("look"), text("done")],
        tools=[counting_tool("look", runs)],
        drive="manual",
    )
    running = await started(kit.harness, kit.harness.prompt("go"))
    released = 0
    while (action := await kit.harness.peek_action()) is not None:
        before = await snapshot(kit), list(runs)
        await settle()
        assert await kit.harness.peek_action() == action  # stable, no side effect
        assert (await snapshot(kit), list(runs)) == before  # parked: no write, request or run
        after = await kit.harness.execute_action()
        released += 1
        if after is not None:
            assert after == await kit.harness.peek_action()
    outcome = await running
    assert isinstance(outcome, Ok) and outcome.value.kind == "completed"
    assert runs == ["look"] and released > 10


async def test_execute_releases_exactly_the_peeked_action(backend: str, tmp_path: Path) -> None:
    kit = await make_kit(backend, tmp_path, [text("done")], drive="manual")
    running = await started(kit.harness, kit.harness.prompt("go"))
    seen = []
    while (action := await kit.harness.peek_action()) is not None:
        writes = len(kit.writes)
        await kit.harness.execute_action()
        new = kit.writes[writes:]
        if action.kind in ("append_entry", "append_entry_if_missing", "append_record"):
            # the released write, and only it (hooks are recorded as ("H", name))
            assert [w for w in new if w[0] in "ER"] and len([w for w in new if w[0] in "ER"]) == 1
        elif action.kind == "run_hook":
            assert new == [("H", action.detail["name"])]
        seen.append(action.kind)
    assert isinstance(await running, Ok)
    # the prompt's user message (an intent's entry, so if missing), then before_request
    assert seen[:2] == ["append_entry_if_missing", "run_hook"]


async def test_parallel_tools_park_separately_in_source_order(backend: str, tmp_path: Path) -> None:
    runs: list[str] = []
    tools = [counting_tool(name, runs) for name in ("a", "b", "c")]
    batch = tool_calls(("a", {}, "c1"), ("b", {}, "c2"), ("c", {}, "c3"))
    kit = await make_kit(backend, tmp_path, [batch, text("done")], tools=tools, drive="manual")
    (outcome, actions) = await drive(kit.harness, kit.harness.prompt("go"))
    assert isinstance(outcome, Ok)
    executed = [a.detail["tool_name"] for _, a in actions if a.kind == "execute_tool"]
    assert executed == runs == ["a", "b", "c"]
    labels = kinds(actions)
    # phase 1 writes every tool_started before any execution; results land after all settle
    first_run = labels.index("execute_tool:a")
    assert labels[:first_run].count("append_record:tool_started") == 3
    assert labels[labels.index("execute_tool:c") :].count("append_entry_if_missing:message") >= 3


async def test_the_surface_is_not_gated(backend: str, tmp_path: Path) -> None:
    kit = await make_kit(backend, tmp_path, [tool_call("look"), text("done")], drive="manual")
    kit.harness.set_tools([counting_tool("look", [])])
    running = await started(kit.harness, kit.harness.prompt("go"))
    while (action := await kit.harness.peek_action()) is not None and action.kind != "execute_tool":
        await kit.harness.execute_action()
    steered = await asyncio.wait_for(kit.harness.steer("also this"), 5)  # no driver needed
    assert isinstance(steered, Ok)
    await kit.harness.run_to_completion()
    assert isinstance(await running, Ok)
    texts = [str(r.messages[-1]) for r in kit.model.requests]
    assert "also this" in texts[-1]


async def test_close_while_parked_rejects_and_leaves_the_released_prefix(
    backend: str, tmp_path: Path
) -> None:
    runs: list[str] = []
    kit = await make_kit(
        backend, tmp_path, [tool_call("look"), text("done")], tools=[counting_tool("look", runs)],
        drive="manual",
    )  # fmt: skip
    running = await started(kit.harness, kit.harness.prompt("go"))
    while (action := await kit.harness.peek_action()) is not None and action.kind != "execute_tool":
        await kit.harness.execute_action()
    log = await kit.storage.get_log()
    await kit.harness.close()
    with pytest.raises(HarnessClosed):
        await running
    assert await kit.storage.get_log() == log and runs == []
    reopened = await kit.reopen(drive="automatic")
    assert [op.reason for op in reopened.suspended] == ["crash"]
    resumed = await reopened.harness.resume()
    assert isinstance(resumed, Ok) and resumed.value.kind == "completed"
    assert runs == ["look"]  # replay="safe" and started: replayed once, never twice


async def test_drive_controls_are_for_one_driver(backend: str, tmp_path: Path) -> None:
    kit = await make_kit(backend, tmp_path, [text("done")], drive="manual")
    running = await started(kit.harness, kit.harness.prompt("go"))
    await kit.harness.peek_action()
    first = asyncio.ensure_future(kit.harness.execute_action())
    await asyncio.sleep(0)
    with pytest.raises(HarnessError, match="two drivers"):
        await kit.harness.execute_action()
    await first
    await kit.harness.run_to_completion()
    assert isinstance(await running, Ok)


async def test_abort_on_a_suspended_lane_parks_at_its_first_action(
    backend: str, tmp_path: Path
) -> None:
    kit = await make_kit(backend, tmp_path, [deferred("job-1")], drive="manual")
    outcome, _ = await drive(kit.harness, kit.harness.prompt("go"))
    assert isinstance(outcome, Ok) and outcome.value.kind == "suspended"
    assert await kit.harness.peek_action() is None
    accepted = await kit.harness.abort()
    assert isinstance(accepted, Ok)
    first = await kit.harness.peek_action()
    assert first is not None and first.kind == "cancel_deferred"
    assert kit.model.cancels == []  # parked: not called yet
    await kit.harness.run_to_completion()
    assert [h.id for h in kit.model.cancels] == ["job-1"]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_manual_and_automatic_drive_write_the_same_log(
    scenario: Scenario, backend: str, tmp_path: Path
) -> None:
    logs = []
    for mode in ("automatic", "manual"):
        repo = new_repo(backend, tmp_path / mode, clock=ManualClock())
        run = await open_run(scenario, repo, "live-", create=True, drive=mode)
        work = scenario.drive(run.harness) if scenario.drive else prompt(run.harness)
        if mode == "manual":
            await drive(run.harness, work)
        else:
            await work
        logs.append(await run.storage.get_log())
        await repo.close()
    assert logs[0] == logs[1]


async def test_stopping_before_any_action_leaves_exactly_the_released_prefix(
    backend: str, tmp_path: Path
) -> None:
    """Gate invariant 4, at every action of a trajectory: close before it, compare the log."""
    scenario = SCENARIOS[0]  # one tool, replay="never"
    reference = new_repo(backend, tmp_path / "reference", clock=ManualClock())
    run = await open_run(scenario, reference, "live-", create=True, drive="manual")
    running = await started(run.harness, prompt(run.harness))
    after_each: list[tuple[Any, ...]] = []  # the log while parked before action k
    while await run.harness.peek_action() is not None:
        after_each.append(tuple(await run.storage.get_log()))
        await run.harness.execute_action()
    await running
    await reference.close()
    assert len(after_each) > 10
    for k in range(len(after_each)):
        repo = new_repo(backend, tmp_path / f"cut{k}", clock=ManualClock())
        cut = await open_run(scenario, repo, "live-", create=True, drive="manual")
        running = await started(cut.harness, prompt(cut.harness))
        for _ in range(k):
            await cut.harness.execute_action()
        await cut.harness.close()
        with pytest.raises(HarnessClosed):
            await running
        assert await cut.storage.get_log() == after_each[k], f"stopped before action {k}"
        await repo.close()
