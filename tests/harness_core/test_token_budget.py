"""`token_budget`: a lane that has spent its tokens asks the model nothing more.

The budget is the lane's ledger (`AgentLane.get_usage().total_tokens`: every request's,
failed attempts and summaries included), checked at the checkpoint that would ask the model
again, before any compaction. The ledger is a running projection of durable usage records, so
a crash and a resume see the same spend. The scripted model reports each request's estimated
prompt as its input tokens and a few output tokens, so a budget of 1 is spent by one request.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from harness_core.harness import AgentLane
from harness_core.messages import message_text
from harness_core.models import ModelInfo
from harness_core.models.scripted import text
from harness_core.options import AgentHarnessOptions, CompactionSettings
from harness_core.result import Ok
from harness_core.tools import Tool, ToolContext
from tests.support.harness_kit import make_kit
from tests.support.tool_loop import poll_tool, polling


async def _spent(lane: AgentLane) -> int:
    return (await lane.get_usage()).total_tokens


async def test_a_lane_stops_once_its_budget_is_spent(backend: str, tmp_path: Path) -> None:
    ran: list[str] = []
    kit = await make_kit(backend, tmp_path, polling(9), tools=[poll_tool(ran)], token_budget=1)
    outcome = await kit.harness.prompt("wait for the job")
    assert isinstance(outcome, Ok) and outcome.value.kind == "failed"
    error_ = outcome.value.error
    assert error_ is not None and error_.code == "token_budget"
    main = await kit.harness.lane("main")
    assert main is not None
    spent = await _spent(main)
    assert spent > 1 and f"spent {spent} tokens of its budget of 1" in error_.message
    # the first request crossed the budget; its tool batch ran, no second request was made
    assert len(kit.model.requests) == 1 and ran == ["c0"]

    # a new input on the spent lane fails at its first checkpoint: no request at all
    again = await kit.harness.prompt("and now?")
    assert isinstance(again, Ok) and again.value.error is not None
    assert again.value.error.code == "token_budget"
    assert len(kit.model.requests) == 1 and await _spent(main) == spent


async def test_a_run_within_its_budget_completes(backend: str, tmp_path: Path) -> None:
    ran: list[str] = []
    script = [*polling(2), text("the job is done")]
    kit = await make_kit(backend, tmp_path, script, tools=[poll_tool(ran)], token_budget=100_000)
    outcome = await kit.harness.prompt("wait for the job")
    assert isinstance(outcome, Ok) and outcome.value.kind == "completed"
    assert outcome.value.final_message is not None
    assert message_text(outcome.value.final_message) == "the job is done"
    assert len(ran) == 2


async def test_the_budget_is_each_lane_s_own(backend: str, tmp_path: Path) -> None:
    # a function of the lane: "tight" has 1 token, "main" none; each ledger is its lane's
    budgets = {"tight": 1}
    kit = await make_kit(
        backend, tmp_path, [text("one"), text("two"), text("three")], token_budget=budgets.get
    )
    tight = await kit.harness.create_lane("tight", None)
    assert isinstance(tight, Ok)
    first = await tight.value.prompt("hello")
    assert isinstance(first, Ok) and first.value.kind == "completed"
    refused = await tight.value.prompt("hello again")
    assert isinstance(refused, Ok) and refused.value.error is not None
    assert refused.value.error.code == "token_budget"
    # the other lane spends on: the tight lane's ledger is not its own
    for _ in range(2):
        answered = await kit.harness.prompt("hello")
        assert isinstance(answered, Ok) and answered.value.kind == "completed"
    assert len(kit.model.requests) == 3


async def test_a_lane_over_its_budget_does_not_compact_first(backend: str, tmp_path: Path) -> None:
    # the poll's long result puts the window over the compaction threshold after the first
    # turn: a lane over its budget fails there, it does not ask the model for a summary first
    budgets = {"main": 10**9}
    kit = await make_kit(
        backend,
        tmp_path,
        [text("first answer"), *polling(3)],
        tools=[poll_tool([], "pending " * 150)],
        token_budget=budgets.get,
        compaction=CompactionSettings(reserve_tokens=100, keep_recent_tokens=50),
    )
    kit.model.info = ModelInfo(context_window=400, max_output_tokens=100)
    assert isinstance(await kit.harness.prompt("hello"), Ok)
    main = await kit.harness.lane("main")
    assert main is not None
    budgets["main"] = await _spent(main) + 1  # the next request crosses it
    outcome = await kit.harness.prompt("poll the job")
    assert isinstance(outcome, Ok) and outcome.value.error is not None
    assert outcome.value.error.code == "token_budget"
    assert [r.step for r in kit.model.requests] == ["assistant", "assistant"]


async def test_the_spend_survives_a_restart(backend: str, tmp_path: Path) -> None:
    second = asyncio.Event()
    hang = asyncio.Event()  # never set: the process "dies" while the second poll runs

    async def hangs_on_the_second(args: Any, ctx: ToolContext) -> str:
        if ctx.tool_call_id == "c1":
            second.set()
            await hang.wait()
        return "still pending"

    budgets = {"main": 10**9}
    poll = Tool(name="poll", description="Poll a job", execute=hangs_on_the_second)
    kit = await make_kit(backend, tmp_path, polling(9), tools=[poll], token_budget=budgets.get)
    running = asyncio.create_task(kit.harness.prompt("wait for the job"))
    await second.wait()
    main = await kit.harness.lane("main")
    assert main is not None
    budgets["main"] = await _spent(main)  # two requests' worth: spent, as the process dies
    reopened = await kit.reopen(script=polling(9)[2:], tools=[poll_tool([])])
    running.cancel()
    [suspended] = reopened.suspended
    assert suspended.reason == "crash"
    outcome = await reopened.harness.resume()
    assert isinstance(outcome, Ok) and outcome.value.error is not None
    assert outcome.value.error.code == "token_budget"
    # the interrupted call is answered (unknown outcome), then no request: the ledger is durable
    assert reopened.model.requests == []


@pytest.mark.parametrize("budget", [0, -5])
def test_the_budget_is_at_least_one(budget: int) -> None:
    with pytest.raises(ValueError, match="token_budget must be at least 1"):
        AgentHarnessOptions(storage=None, model_client=None, model=None, token_budget=budget)  # type: ignore[arg-type]
