"""Real process death: an agent process SIGKILLed at random moments, recovered, checked.

The child (``python -m tests.support.kill_soak child URL EFFECTS``) resumes whatever a
predecessor left open, then runs prompts on two lanes forever: the model calls ``charge``
(``replay="never"``: an external effect that must not happen twice) and ``lookup``
(``replay="safe"``), and lane ``a`` is steered mid-run. Each tool appends a line to the
effects file (fsynced) when it runs, so the file is the ground truth of what happened outside.

`soak()` kills a child at random points; after every other kill it recovers in place (as a
restarted process would) and checks the recovery invariants against the state the kill left;
the other kills are recovered by the next child and checked at the following kill. Across the
whole soak no ``charge`` invocation may appear twice in the effects file.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness_core import ScriptedModel, SessionRepo
from harness_core.errors import SessionError
from harness_core.harness import AgentHarness
from harness_core.messages import AssistantMessage, ToolResultMessage, UserMessage
from harness_core.models import ModelRef, ModelRequest
from harness_core.models.scripted import text, tool_calls
from harness_core.options import AgentHarnessOptions, RetryPolicy
from harness_core.result import Ok
from harness_core.session.contract import SessionStorage
from harness_core.session.records import OperationFinished, OperationStarted
from harness_core.session.types import LogItem, StoredRecord
from harness_core.storage import open_repo
from harness_core.testing.invariants import (
    Counters,
    assert_fixed_point,
    check_invariants,
    resume_all,
)
from harness_core.tools import Tool, ToolContext

__all__ = ["SESSION", "SoakReport", "soak"]

SESSION = "soak"
OWNER = "agent"
DECLARATIONS = {"charge": "never", "lookup": "safe"}
MODEL = ModelRef(provider="scripted", model_id="soak")


def _respond(request: ModelRequest) -> AssistantMessage:
    last = request.messages[-1]
    if request.step != "assistant":
        return text("summary")
    if isinstance(last, UserMessage):
        return tool_calls(("charge", {"cents": 100}, None), ("lookup", {"q": "status"}, None))
    if isinstance(last, ToolResultMessage):
        return text("charged and looked up")
    return text("ok")


def _tools(effects: Path, who: str) -> list[Tool]:
    def effect(name: str) -> Any:
        async def run(args: Any, ctx: ToolContext) -> str:
            _record_effect(effects, name, ctx.idempotency_key, who)
            # a tool takes a moment: with instant tools and model a turn is over so fast that
            # kills land between operations as often as inside one (the soak wants inside:
            # here, between an effect and its durable result; 2 ms let a fast machine finish
            # the operation before the kill came in 16 of 20 kills, failing the soak's bound)
            await asyncio.sleep(0.02)
            return f"{name} done"

        return run

    return [
        Tool(name=name, description=name, execute=effect(name), replay=replay)  # type: ignore[arg-type]
        for name, replay in DECLARATIONS.items()
    ]


def _record_effect(effects: Path, tool: str, key: str, who: str) -> None:
    with effects.open("a") as file:  # small synchronous append: the effect is durable first
        file.write(f"{tool} {key} {who}\n")
        file.flush()
        os.fsync(file.fileno())


async def _open(repo: SessionRepo, effects: Path, who: str) -> tuple[AgentHarness, SessionStorage]:
    try:
        await repo.create(SESSION)
    except SessionError as exc:
        if exc.code != "already_exists":
            raise
    lease = await repo.acquire_lease(SESSION, owner=OWNER, ttl_ms=60_000)  # supersedes itself
    storage = await repo.open(SESSION, lease=lease)
    options = AgentHarnessOptions(
        storage=storage,
        model_client=ScriptedModel(responder=_respond),
        model=MODEL,
        tools=_tools(effects, who),
        retry=RetryPolicy(max_attempts=3, initial_delay_ms=0),
    )
    harness, _ = await AgentHarness.create(options)
    return harness, storage


async def child(url: str, effects: Path) -> None:
    """The agent process: recover, then prompt two lanes forever (until killed)."""
    repo = open_repo(url)
    harness, _ = await _open(repo, effects, f"child-{os.getpid()}")
    await resume_all(harness)
    lanes = []
    for name in ("a", "b"):
        lane = await harness.lane(name)
        if lane is None:
            created = await harness.create_lane(name, None)
            assert isinstance(created, Ok)
            lane = created.value
        lanes.append(lane)
    print("READY", flush=True)

    async def converse(index: int) -> None:
        lane = lanes[index]
        for n in range(10**9):
            running = asyncio.ensure_future(lane.prompt(f"turn {n} on {lane.name}"))
            if index == 0 and n % 2 == 0:
                await asyncio.sleep(0)
                await lane.steer(f"and a steer {n}")  # Ok, or NoActiveRun if it already ended
            result = await running
            assert isinstance(result, Ok), result
            print("TICK", lane.name, n, flush=True)

    await asyncio.gather(converse(0), converse(1))


@dataclass
class SoakReport:
    """What a soak did."""

    kills: int = 0
    open_at_kill: int = 0
    """Kills that left at least one operation open (a mid-operation crash)."""
    recovered_here: int = 0
    charges: int = 0
    checks: list[str] = field(default_factory=list)


def _effect_lines(effects: Path) -> list[tuple[str, str]]:
    if not effects.exists():
        return []
    lines = effects.read_text().splitlines()
    return [(line.split()[0], line.split()[1]) for line in lines if line.strip()]


def _counters(lines: Sequence[tuple[str, str]]) -> Counters:
    """Tool runs since a kill, in the shape `check_invariants` reads.

    A safe call replayed by a recovery that was itself killed and recovered again ran more than
    once, which is allowed: it counts as replayed (once).
    """
    counters = Counters()
    for tool, key in lines:
        counters.executions[tool] += 1
        if DECLARATIONS[tool] == "safe" and counters.invocations[key]:
            continue
        counters.invocations[key] += 1
    return counters


async def _kill_child(url: str, effects: Path, wait_lines: int, cwd: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.support.kill_soak", "child", url, str(effects),
        cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None
    assert process.stderr is not None
    try:
        async with asyncio.timeout(60):
            seen = -1  # READY first
            while seen < wait_lines:
                line = await process.stdout.readline()
                if not line:
                    error = (await process.stderr.read()).decode()
                    raise AssertionError(f"the agent process exited: {error[-3000:]}")
                seen += 1
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        await process.communicate()


async def _recover_here(url: str, effects: Path) -> tuple[LogItem, ...]:
    repo = open_repo(url)
    try:
        harness, storage = await _open(repo, effects, "recovery")
        await resume_all(harness)
        await assert_fixed_point(harness)
        log = await storage.get_log()
        await harness.close()
        return log
    finally:
        await repo.close()


async def _log(url: str) -> tuple[LogItem, ...]:
    repo = open_repo(url)
    try:
        return await (await repo.open(SESSION)).get_log()
    finally:
        await repo.close()


async def soak(url: str, effects: Path, *, kills: int, seed: int, cwd: Path) -> SoakReport:
    """Kill an agent process `kills` times at random points; check every recovery."""
    rng = random.Random(seed)
    report = SoakReport()
    pending: list[tuple[tuple[LogItem, ...], int]] = []  # (state at a kill, effects offset)
    for kill in range(kills):
        await _kill_child(url, effects, rng.randint(1, 12), cwd)
        report.kills += 1
        at_kill = await _log(url)
        offset = len(_effect_lines(effects))
        records = [item.record for item in at_kill if isinstance(item, StoredRecord)]
        started = {r.id for r in records if isinstance(r, OperationStarted)}
        ended = {r.run_id for r in records if isinstance(r, OperationFinished)}
        report.open_at_kill += bool(started - ended)
        pending.append((at_kill, offset))
        if kill % 2 == 1 or kill == kills - 1:  # this kill, and the previous one, get checked
            log = await _recover_here(url, effects)
            report.recovered_here += 1
            lines = _effect_lines(effects)
            for state, since in pending:
                check_invariants(state, log, _counters(lines[since:]), DECLARATIONS, SESSION)
                report.checks.append(f"kill state with {len(state)} items")
            pending.clear()
    charges = Counter(key for tool, key in _effect_lines(effects) if tool == "charge")
    twice = [key for key, n in charges.items() if n > 1]
    assert not twice, f"a replay='never' charge happened twice: {twice}"
    report.charges = len(charges)
    return report


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        asyncio.run(child(sys.argv[2], Path(sys.argv[3])))
