"""`max_turns`: a model calling tools in a loop stops at the limit instead of running on.

Without a limit a model that calls a tool again after every result (the same search, a poll
that never settles) runs, and bills, until someone aborts its run. With ``max_turns`` the run
fails ``turn_limit`` at the checkpoint that would ask the model once more; each input the run
takes (the prompt, a steer, a follow-up) starts the count again. The count is the reduction's,
read from the log, so a crash and a resume keep it (the crash matrix's trajectory "a tool loop
stopped at the turn limit" cuts it at every write).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from harness_core.harness import AgentHarness
from harness_core.messages import message_text
from harness_core.models import ModelInfo
from harness_core.models.scripted import error, text
from harness_core.options import AgentHarnessOptions, CompactionSettings
from harness_core.result import Ok
from harness_core.tools import Tool, ToolContext
from tests.support.harness_kit import make_kit
from tests.support.tool_loop import poll_tool, polling


async def test_a_tool_loop_stops_at_the_limit(backend: str, tmp_path: Path) -> None:
    ran: list[str] = []
    kit = await make_kit(backend, tmp_path, polling(9), tools=[poll_tool(ran)], max_turns=3)
    outcome = await kit.harness.prompt("wait for the job")
    assert isinstance(outcome, Ok) and outcome.value.kind == "failed"
    error_ = outcome.value.error
    assert error_ is not None and error_.code == "turn_limit"
    assert "3 turns" in error_.message
    # three turns: three requests, each tool batch ran; no fourth request
    assert len(kit.model.requests) == 3 and ran == ["c0", "c1", "c2"]

    # the next prompt is a new run with a count of its own
    again = await kit.harness.prompt("and now?")
    assert isinstance(again, Ok)
    assert again.value.error is not None and again.value.error.code == "turn_limit"
    assert len(kit.model.requests) == 6


async def test_an_answer_within_the_limit_completes(backend: str, tmp_path: Path) -> None:
    ran: list[str] = []
    script = [*polling(2), text("the job is done")]
    kit = await make_kit(backend, tmp_path, script, tools=[poll_tool(ran)], max_turns=3)
    outcome = await kit.harness.prompt("wait for the job")
    assert isinstance(outcome, Ok) and outcome.value.kind == "completed"
    assert outcome.value.final_message is not None
    assert message_text(outcome.value.final_message) == "the job is done"
    assert len(ran) == 2


async def test_a_run_at_its_limit_does_not_compact_first(backend: str, tmp_path: Path) -> None:
    # the poll's long result puts the window over the compaction threshold after the first
    # turn: a run at its limit fails there, it does not ask the model for a summary first
    kit = await make_kit(
        backend,
        tmp_path,
        [text("first answer"), *polling(3)],
        tools=[poll_tool([], "pending " * 150)],
        max_turns=1,
        compaction=CompactionSettings(reserve_tokens=100, keep_recent_tokens=50),
    )
    kit.model.info = ModelInfo(context_window=400, max_output_tokens=100)
    assert isinstance(await kit.harness.prompt("hello"), Ok)
    outcome = await kit.harness.prompt("poll the job")
    assert isinstance(outcome, Ok) and outcome.value.error is not None
    assert outcome.value.error.code == "turn_limit"
    assert [r.step for r in kit.model.requests] == ["assistant", "assistant"]


async def test_failed_attempts_do_not_count(backend: str, tmp_path: Path) -> None:
    # retried errors are not turns: two failures, then two tool turns and the answer
    script = [error("overloaded"), error("overloaded"), *polling(1), text("done")]
    kit = await make_kit(backend, tmp_path, script, tools=[poll_tool([])], max_turns=2)
    outcome = await kit.harness.prompt("go")
    assert isinstance(outcome, Ok) and outcome.value.kind == "completed"


async def test_a_steer_starts_the_count_again(backend: str, tmp_path: Path) -> None:
    ran: list[str] = []
    harnesses: list[AgentHarness] = []

    async def poll_and_steer(args: Any, ctx: ToolContext) -> str:
        ran.append(ctx.tool_call_id)
        if ctx.tool_call_id == "c1":  # the second turn: a person says more
            await harnesses[0].steer("stop polling and tell me")
        return "still pending"

    poll = Tool(name="poll", description="Poll a job", execute=poll_and_steer)
    script = [*polling(3), text("it is still pending")]
    kit = await make_kit(backend, tmp_path, script, tools=[poll], max_turns=2)
    harnesses.append(kit.harness)
    outcome = await kit.harness.prompt("wait for the job")
    assert isinstance(outcome, Ok) and outcome.value.kind == "completed", outcome
    # turns 1 and 2, the steer, then turns 1 and 2 again (the third poll and the answer)
    assert ran == ["c0", "c1", "c2"]


async def test_the_count_survives_a_restart(backend: str, tmp_path: Path) -> None:
    second = asyncio.Event()
    hang = asyncio.Event()  # never set: the process "dies" while the second poll runs

    async def hangs_on_the_second(args: Any, ctx: ToolContext) -> str:
        if ctx.tool_call_id == "c1":
            second.set()
            await hang.wait()
        return "still pending"

    poll = Tool(name="poll", description="Poll a job", execute=hangs_on_the_second)
    kit = await make_kit(backend, tmp_path, polling(9), tools=[poll], max_turns=3)
    running = asyncio.create_task(kit.harness.prompt("wait for the job"))
    await second.wait()
    ran: list[str] = []
    reopened = await kit.reopen(script=polling(9)[2:], tools=[poll_tool(ran)])
    running.cancel()
    [suspended] = reopened.suspended
    assert suspended.reason == "crash"
    outcome = await reopened.harness.resume()
    assert isinstance(outcome, Ok) and outcome.value.error is not None
    assert outcome.value.error.code == "turn_limit"
    # two turns before the crash count: one more request after it, not three
    assert len(reopened.model.requests) == 1


def test_the_limit_is_at_least_one() -> None:
    with pytest.raises(ValueError, match="max_turns must be at least 1"):
        AgentHarnessOptions(storage=None, model_client=None, model=None, max_turns=0)  # type: ignore[arg-type]
