"""Randomized interleavings: surface calls between action releases, then a crash anywhere.

Hypothesis draws a small program: which tools the model calls, and a sequence of steps (release
the next parked action, steer, follow up, seed the next run, append, reconfigure, cancel a
queued item, abort, prompt again) cut at a random point by a crash (`close()` while parked).
A new harness then restores and resumes every lane, twice. The invariants of the crash matrix
must hold after each. Failures found are pinned below as `@example`s (regression cases).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from harness_core import ScriptedModel
from harness_core.errors import HarnessClosed
from harness_core.harness import AgentHarness
from harness_core.ids import SequentialIds
from harness_core.messages import AssistantMessage, ToolResultMessage, UserMessage
from harness_core.models import ModelRequest
from harness_core.models.scripted import text, tool_calls
from harness_core.options import AgentHarnessOptions, RetryPolicy
from harness_core.result import Ok
from harness_core.session.types import LogItem, StoredEntry
from harness_core.storage.memory import MemorySessionRepo
from harness_core.testing import ManualClock
from harness_core.testing.invariants import (
    Counters,
    assert_fixed_point,
    check_invariants,
    parked_deferred,
    resume_all,
    shape,
    tool_of,
)
from harness_core.tools import Tool, ToolContext
from tests.support.harness_kit import MODEL
from tests.support.manual import started

STEPS = [
    "release",
    "steer",
    "follow_up",
    "next_run",
    "write",
    "config",
    "cancel",
    "abort",
    "prompt",
]
DECLARATIONS = {"safe_tool": "safe", "never_tool": "never"}


@dataclass(frozen=True)
class Program:
    calls: tuple[str, ...]
    """The tools the model calls after each user message (then it answers)."""
    steps: tuple[str, ...]
    crash_at: int | None
    """How many steps run before the crash (None: every step, then settle, then close)."""


RELEASES = st.integers(min_value=1, max_value=8).map(lambda n: ("release",) * n)
programs = st.builds(
    lambda calls, chunks, cut: Program(tuple(calls), tuple(s for c in chunks for s in c), cut),
    st.lists(st.sampled_from(sorted(DECLARATIONS)), max_size=2),
    st.lists(
        st.one_of(RELEASES, RELEASES, st.sampled_from(STEPS).map(lambda s: (s,))), max_size=12
    ),
    st.one_of(st.none(), st.integers(min_value=0, max_value=60)),
)


def responder(calls: tuple[str, ...]) -> Any:
    def respond(request: ModelRequest) -> AssistantMessage:
        if request.step != "assistant":
            return text("a summary")
        last = request.messages[-1]
        if isinstance(last, UserMessage) and calls:
            return tool_calls(*((name, {"i": i}, None) for i, name in enumerate(calls)))
        if isinstance(last, (ToolResultMessage, UserMessage)):
            return text("done")
        return text("ok")

    return respond


def tools(counters: Counters) -> list[Tool]:
    made = []
    for name, replay in DECLARATIONS.items():

        async def execute(args: Any, ctx: ToolContext, name: str = name) -> str:
            counters.executions[name] += 1
            counters.invocations[ctx.idempotency_key] += 1
            return f"{name} ran"

        made.append(Tool(name=name, description=name, execute=execute, replay=replay))  # type: ignore[arg-type]
    return made


async def open_harness(
    repo: MemorySessionRepo, counters: Counters, calls: tuple[str, ...], ids: str, drive: str
) -> tuple[AgentHarness, Any]:
    lease = await repo.acquire_lease("s", owner="w", ttl_ms=10**9)
    storage = await repo.open("s", lease=lease)
    options = AgentHarnessOptions(
        storage=storage,
        model_client=ScriptedModel(responder=responder(calls)),
        model=MODEL,
        tools=tools(counters),
        clock=ManualClock(),
        ids=SequentialIds(ids),
        retry=RetryPolicy(max_attempts=3, initial_delay_ms=0),
        drive=drive,  # type: ignore[arg-type]
    )
    harness, _ = await AgentHarness.create(options)
    return harness, storage


async def recover(
    repo: MemorySessionRepo, calls: tuple[str, ...], ids: str
) -> tuple[tuple[LogItem, ...], Counters]:
    counters = Counters()
    harness, storage = await open_harness(repo, counters, calls, ids, "automatic")
    await resume_all(harness)
    await assert_fixed_point(harness)
    log = await storage.get_log()
    await harness.close()
    return log, counters


async def play(program: Program) -> None:
    repo = MemorySessionRepo(clock=ManualClock())
    await repo.create("s")
    live = Counters()
    harness, storage = await open_harness(repo, live, program.calls, "live-", "manual")
    tasks = [await started(harness, harness.prompt("go"))]
    writes: list[str] = []
    queued: list[str] = []
    for i, step in enumerate(program.steps[: program.crash_at]):  # None: all of them
        if step == "release":
            if await harness.peek_action() is not None:
                await harness.execute_action()
        elif step in ("steer", "follow_up", "next_run"):
            result = await getattr(harness, step)(f"{step} {i}")
            if isinstance(result, Ok):
                queued.append(result.value)
        elif step == "write":
            writes.append(await harness.session.append_custom_entry("note", {"step": i}))
        elif step == "config":
            await harness.set_thinking_level(f"level-{i}")
        elif step == "cancel" and queued:
            assert isinstance(await harness.cancel_queued(queued[-1]), Ok)
        elif step == "abort":
            await harness.abort()
        elif step == "prompt":
            tasks.append(await started(harness, harness.prompt(f"prompt {i}")))
    if program.crash_at is None:
        await harness.run_to_completion()
    at_crash = await storage.get_log()
    await harness.close()
    for task in tasks:
        with contextlib.suppress(HarnessClosed):
            await task

    log, counters = await recover(repo, program.calls, "r1-")
    check_invariants(at_crash, log, counters, DECLARATIONS)
    for key, runs in counters.invocations.items():
        if runs and live.invocations[key]:
            assert tool_of(log, key) not in ("never_tool", None), "a replay='never' tool ran twice"
    ids = {item.id for item in log if isinstance(item, StoredEntry)}
    assert all(write in ids for write in writes), "an accepted write was lost"
    again, counters_again = await recover(repo, program.calls, "r2-")
    if not parked_deferred(log):
        assert shape(again) == shape(log)
    assert sum(counters_again.executions.values()) == 0
    await repo.close()


REGRESSIONS = [
    Program(("never_tool",), ("release",) * 12 + ("abort", "write", "release"), None),
    Program(("never_tool",), ("release",) * 10, 10),  # crash at X3 of a never tool
    Program(("safe_tool", "never_tool"), ("release",) * 20 + ("steer", "cancel"), 22),
]
"""Pinned programs: interleavings worth keeping (add every failing example found)."""


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(programs)
@example(REGRESSIONS[0])
@example(REGRESSIONS[1])
@example(REGRESSIONS[2])
def test_random_interleavings_recover(program: Program) -> None:
    asyncio.run(play(program))


def test_the_pinned_programs_reach_their_interesting_states() -> None:
    """The regressions exercise what they are kept for (an abort, a cancellation)."""
    seen: Counter[str] = Counter()
    for program in REGRESSIONS:
        seen.update(program.steps[: program.crash_at])
    assert seen["abort"] >= 1 and seen["cancel"] >= 1
    assert any(p.crash_at is not None and p.crash_at < len(p.steps) + 1 for p in REGRESSIONS)
