"""Tier A: every durable prefix of every canonical trajectory, restored and resumed, twice.

Each scenario runs live once; its log is the trajectory. Every prefix of that log is a state a
crash can leave (a write either happened or not). Each prefix is imported into a fresh session
on a real backend, the harness is created (restore: bounded reads, no writes) and every
suspended operation is resumed. After recovery the invariants must hold: the log reduces,
every operation is closed (or parked on a deferred request), every accepted input is in the
tree exactly once, no ``replay="never"`` tool ran again, and a second recovery finds nothing to
do. Recovery from the same prefix is deterministic, and a recovery cut at any of its own
writes recovers again (half-completed recovery is safe).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness_core._runtime.restore import restore_lane
from harness_core.approvals import approve, deny
from harness_core.harness import AgentHarness
from harness_core.hooks import BeforeRequestEvent, BeforeRunEndResult
from harness_core.ids import SequentialIds
from harness_core.messages import AssistantMessage, UserMessage, message_text
from harness_core.models import ModelInfo, ModelRequest
from harness_core.models.scripted import ScriptedModel, deferred, error, length, text, tool_calls
from harness_core.options import AgentHarnessOptions, CompactionSettings, RetryPolicy
from harness_core.result import Err, Ok
from harness_core.session.contract import SessionRepo, SessionStorage
from harness_core.session.entries import MessageEntry
from harness_core.session.records import ApprovalDecision, PendingApproval
from harness_core.session.types import LogItem, SessionMetadata, StoredEntry, StoredRecord
from harness_core.storage.memory import MemorySessionRepo
from harness_core.storage.sqlite import SqliteSessionRepo
from harness_core.testing import ManualClock
from harness_core.testing.invariants import (
    Counters,
    Decide,
    check_invariants,
    parked_deferred,
    resume_all,
    shape,
)
from harness_core.tools import Tool, ToolRecovery
from tests.support.harness_kit import MODEL

# -- scenarios --------------------------------------------------------------------------------


def turn_index(request: ModelRequest) -> int:
    """How many assistant messages follow the newest user message (0: the first answer)."""
    count = 0
    for message in reversed(request.messages):
        if isinstance(message, UserMessage):
            break
        if isinstance(message, AssistantMessage):
            count += 1
    return count


def scripted_turns(
    *turns: AssistantMessage | Callable[[ModelRequest], AssistantMessage],
) -> Callable[[ModelRequest], AssistantMessage]:
    """A responder: answer n after the newest user input is `turns[n]`; summaries are fixed."""

    def respond(request: ModelRequest) -> AssistantMessage:
        if request.step != "assistant":
            return text("a summary")
        index = min(turn_index(request), len(turns) - 1)
        reply = turns[index]
        return reply(request) if callable(reply) else reply

    return respond


def make_tools(
    counters: Counters,
    *,
    replay: dict[str, str],
    actions: dict[str, Any] | None = None,
    approval: frozenset[str] = frozenset(),
) -> list[Tool]:
    tools = []
    for name, declared in replay.items():

        async def execute(args: Any, ctx: Any, name: str = name) -> str:
            counters.executions[name] += 1
            counters.invocations[ctx.idempotency_key] += 1
            action = (actions or {}).get(name)
            if action is not None:
                await action(ctx)
            return f"{name} ran with {args}"

        tools.append(
            Tool(
                name=name,
                description=name,
                execute=execute,
                replay=declared,  # type: ignore[arg-type]
                requires_approval=name in approval,
            )
        )
    return tools


@dataclass
class Scenario:
    """One trajectory: how to drive it live, and what the model and tools do."""

    name: str
    responder: Callable[[ModelRequest], AssistantMessage]
    replay: dict[str, str] = field(default_factory=dict)
    drive: Callable[[AgentHarness], Any] | None = None
    actions: Callable[[dict[str, AgentHarness]], dict[str, Any]] | None = None
    fetches: Sequence[AssistantMessage] = ()
    options: dict[str, Any] = field(default_factory=dict)
    info: ModelInfo | None = None
    recovery_replay: dict[str, str] | None = None
    """The tools' declarations when recovering (a deploy may change them); default: `replay`."""
    approval: frozenset[str] = frozenset()
    """Tools that require approval."""
    decide: Decide | None = None
    """How recovery decides an approval wait it finds."""
    interrupted: bool = False
    """A previous process died while the first tool of the run ran; the live trajectory starts
    by restoring that state (so it holds the counted resume, `operation_resumed`)."""
    unstick: bool = False
    """Recovery resumes stuck lanes past their attempt budget (as an operator would)."""


async def prompt(harness: AgentHarness, text_: str = "please help") -> None:
    result = await harness.prompt(text_)
    assert isinstance(result, Ok), result


def calls(*specs: tuple[str, str]) -> AssistantMessage:
    return tool_calls(*((name, {"n": i}, call_id) for i, (name, call_id) in enumerate(specs)))


def retry_then(answer: AssistantMessage) -> Callable[[ModelRequest], AssistantMessage]:
    return lambda request: error("server") if request.attempt == 1 else answer


def resume_drive(unstick: bool = False) -> Callable[[AgentHarness], Any]:
    """Drive: continue the run a previous process left (a counted attempt)."""

    async def run(harness: AgentHarness) -> None:
        result = await harness.resume(unstick=unstick)
        assert isinstance(result, Ok) and result.value.kind == "completed", result

    return run


async def two_prompts(harness: AgentHarness) -> None:
    await prompt(harness, "first question " + "q" * 120)
    await prompt(harness, "second question")


SMALL_CONTEXT = {"compaction": CompactionSettings(reserve_tokens=60, keep_recent_tokens=10)}


async def deferred_then_ready(harness: AgentHarness) -> None:
    result = await harness.prompt("take your time")
    assert isinstance(result, Ok) and result.value.kind == "suspended"
    assert isinstance(await harness.resume(), Ok)


def steer_actions(harnesses: dict[str, AgentHarness]) -> dict[str, Any]:
    steered: list[str] = []

    async def steer(ctx: Any) -> None:
        if not steered:  # the model calls the tool again after the steer; steer only once
            steered.append("yes")
            result = await harnesses["h"].steer("also check the tests")
            assert isinstance(result, Ok), result

    return {"act": steer}


def write_actions(harnesses: dict[str, AgentHarness]) -> dict[str, Any]:
    async def write(ctx: Any) -> None:
        await harnesses["h"].session.append_custom_entry("note", {"seen": True})

    return {"act": write}


def steer_cancel_actions(harnesses: dict[str, AgentHarness]) -> dict[str, Any]:
    async def steer_then_cancel(ctx: Any) -> None:
        harness = harnesses["h"]
        steered = await harness.steer("never mind this")
        assert isinstance(steered, Ok)
        cancelled = await harness.cancel_queued(steered.value)
        assert isinstance(cancelled, Ok) and cancelled.value == "cancelled"

    return {"act": steer_then_cancel}


def config_actions(harnesses: dict[str, AgentHarness]) -> dict[str, Any]:
    async def reconfigure(ctx: Any) -> None:
        await harnesses["h"].set_thinking_level("high")
        await harnesses["h"].set_active_tools(["act"])

    return {"act": reconfigure}


def abort_actions(harnesses: dict[str, AgentHarness]) -> dict[str, Any]:
    async def abort(ctx: Any) -> None:
        await harnesses["h"].abort()

    return {"act": abort}


async def follow_up_drive(harness: AgentHarness) -> None:
    fired: list[int] = []

    async def once(event: Any) -> BeforeRunEndResult | None:
        if fired:
            return None
        fired.append(1)
        return BeforeRunEndResult(follow_up="one more thing")

    harness.hooks.on("before_run_end", once)
    await prompt(harness)


async def manual_compaction_drive(harness: AgentHarness) -> None:
    await two_prompts(harness)
    result = await harness.compact()
    assert isinstance(result, Ok) and result.value.kind == "completed", result


async def navigation_drive(harness: AgentHarness) -> None:
    first = await harness.prompt("first")
    assert isinstance(first, Ok)
    await prompt(harness, "second")
    result = await harness.navigate_tree(first.value.final_entry_id, summarize=True, label="here")
    assert isinstance(result, Ok) and result.value.kind == "completed", result


async def abort_deferred(harness: AgentHarness) -> None:
    result = await harness.prompt("take your time")
    assert isinstance(result, Ok) and result.value.kind == "suspended"
    aborted = await harness.abort()
    assert isinstance(aborted, Ok), aborted
    await harness.wait_for_idle()


async def steer_during_retry(harness: AgentHarness) -> None:
    steered: list[int] = []

    async def steer(event: BeforeRequestEvent) -> None:
        if event.attempt == 2 and not steered:
            steered.append(1)
            assert isinstance(await harness.steer("and check the tests"), Ok)

    harness.hooks.on("before_request", steer)
    await prompt(harness)


FOUR_DECLARATIONS = {"a": "safe", "b": "safe", "c": "never", "d": "never"}
"""Live declarations; recovery sees a, b, c, d as safe, never, safe, never: all four pairs."""


def approve_all(pending: tuple[PendingApproval, ...]) -> list[ApprovalDecision]:
    return [approve(p) for p in pending]


def deny_all(pending: tuple[PendingApproval, ...]) -> list[ApprovalDecision]:
    return [deny(p, "not now") for p in pending]


def override_all(pending: tuple[PendingApproval, ...]) -> list[ApprovalDecision]:
    return [approve(p, args={"n": 99}) for p in pending]


def decide_after_wait(
    decide: Decide, *, steer: str | None = None, abort: bool = False
) -> Callable[[AgentHarness], Any]:
    """Drive: prompt, find the run waiting for approval, then steer / abort / decide."""

    async def run(harness: AgentHarness) -> None:
        result = await harness.prompt("ship it")
        assert isinstance(result, Ok) and result.value.kind == "suspended", result
        pending, wait_id = result.value.pending_approvals, result.value.wait_id
        assert pending, "the run should wait for approval"
        if steer is not None:
            assert isinstance(await harness.steer(steer), Ok)
        if abort:
            assert isinstance(await harness.abort(), Ok)
            await harness.wait_for_idle()
            return
        kind = "suspended"
        for round_ in range(4):  # a steered run may call the tool (and wait) again
            decided = await harness.resume(
                decide(pending), wait_id=wait_id, decided_by="U_OPS", idempotency_key=f"k{round_}"
            )
            assert isinstance(decided, Ok), decided
            pending, kind = decided.value.pending_approvals, decided.value.kind
            wait_id = decided.value.wait_id
            if not pending:
                break
        assert kind == "completed"

    return run


APPROVAL = frozenset({"deploy"})

SCENARIOS = [
    Scenario(
        "one tool, never", scripted_turns(calls(("echo", "c1")), text("done")), {"echo": "never"}
    ),
    Scenario(
        "one tool, safe", scripted_turns(calls(("echo", "c1")), text("done")), {"echo": "safe"}
    ),
    Scenario(
        "parallel batch: safe, never, safe",
        scripted_turns(calls(("a", "c1"), ("b", "c2"), ("c", "c3")), text("done")),
        {"a": "safe", "b": "never", "c": "safe"},
    ),
    Scenario(
        "sequential batch: never, safe",
        scripted_turns(calls(("a", "c1"), ("b", "c2")), text("done")),
        {"a": "never", "b": "safe"},
        options={"tool_execution": "sequential"},
    ),
    Scenario(
        "parallel batch, every declaration pair",
        scripted_turns(calls(("a", "c1"), ("b", "c2"), ("c", "c3"), ("d", "c4")), text("done")),
        FOUR_DECLARATIONS,
        recovery_replay={"a": "safe", "b": "never", "c": "safe", "d": "never"},
    ),
    Scenario(
        "sequential batch, every declaration pair",
        scripted_turns(calls(("a", "c1"), ("b", "c2"), ("c", "c3"), ("d", "c4")), text("done")),
        FOUR_DECLARATIONS,
        recovery_replay={"a": "safe", "b": "never", "c": "safe", "d": "never"},
        options={"tool_execution": "sequential"},
    ),
    Scenario("retry then answer", scripted_turns(retry_then(text("done")))),
    Scenario("retries exhausted", scripted_turns(error("server"))),
    Scenario(
        "steer, then cancel it",
        scripted_turns(calls(("act", "c1")), text("done")),
        {"act": "never"},
        actions=steer_cancel_actions,
    ),
    Scenario(
        "config setters mid-run",
        scripted_turns(calls(("act", "c1")), text("done")),
        {"act": "never"},
        actions=config_actions,
    ),
    Scenario(
        "steering during a retry",
        scripted_turns(retry_then(calls(("echo", "c1"))), text("done")),
        {"echo": "never"},
        drive=steer_during_retry,
    ),
    Scenario("terminal error", scripted_turns(error("invalid_request", retryable=False))),
    Scenario(
        "steering during a tool",
        scripted_turns(calls(("act", "c1")), text("done")),
        {"act": "never"},
        actions=steer_actions,
    ),
    Scenario(
        "deferred write mid-turn",
        scripted_turns(calls(("act", "c1")), text("done")),
        {"act": "never"},
        actions=write_actions,
    ),
    Scenario(
        "abort during a tool",
        scripted_turns(calls(("act", "c1")), text("done")),
        {"act": "never"},
        actions=abort_actions,
    ),
    Scenario(
        "follow-up at the finish boundary", scripted_turns(text("done")), drive=follow_up_drive
    ),
    Scenario(
        "truncated tool batch",
        scripted_turns(
            tool_calls(("echo", {}, "c1")).model_copy(update={"stop_reason": "length"}),
            text("done"),
        ),
        {"echo": "never"},
        info=ModelInfo(context_window=100_000, max_output_tokens=10),
    ),
    Scenario(
        "overflow, compaction, retry",
        scripted_turns(
            lambda r: (
                length("cut", output_tokens=1)
                if not message_text(r.messages[0]).startswith("Summary") and len(r.messages) > 2
                else text("answer")
            )
        ),
        drive=two_prompts,
        options={"compaction": CompactionSettings(keep_recent_tokens=10)},
        info=ModelInfo(context_window=100_000, max_output_tokens=100),
    ),
    Scenario(
        "auto compaction at a checkpoint",
        scripted_turns(text("an answer " + "a" * 120)),
        drive=two_prompts,
        options=SMALL_CONTEXT,
        info=ModelInfo(context_window=160, max_output_tokens=50),
    ),
    Scenario(
        "manual compaction",
        scripted_turns(text("answer")),
        drive=manual_compaction_drive,
        options={"compaction": CompactionSettings(keep_recent_tokens=10)},
    ),
    Scenario(
        "navigation with summary and label", scripted_turns(text("answer")), drive=navigation_drive
    ),
    Scenario(
        "abort a suspended deferred lane", scripted_turns(deferred("job-1")), drive=abort_deferred
    ),
    Scenario(
        "approval: approve",
        scripted_turns(calls(("deploy", "c1")), text("done")),
        {"deploy": "never"},
        drive=decide_after_wait(approve_all),
        approval=APPROVAL,
        decide=approve_all,
    ),
    Scenario(
        "approval: deny",
        scripted_turns(calls(("deploy", "c1")), text("done")),
        {"deploy": "never"},
        drive=decide_after_wait(deny_all),
        approval=APPROVAL,
        decide=deny_all,
    ),
    Scenario(
        "approval: mixed batch, override arguments",
        scripted_turns(calls(("lookup", "c1"), ("deploy", "c2")), text("done")),
        {"lookup": "safe", "deploy": "safe"},
        drive=decide_after_wait(override_all),
        approval=APPROVAL,
        decide=override_all,
    ),
    Scenario(
        "approval: steered while waiting",
        scripted_turns(calls(("deploy", "c1")), text("done")),
        {"deploy": "never"},
        drive=decide_after_wait(approve_all, steer="and tell ops"),
        approval=APPROVAL,
        decide=approve_all,
    ),
    Scenario(
        "approval: aborted while waiting",
        scripted_turns(calls(("deploy", "c1")), text("done")),
        {"deploy": "never"},
        drive=decide_after_wait(approve_all, abort=True),
        approval=APPROVAL,
        decide=approve_all,
    ),
    Scenario(
        "deferred request",
        scripted_turns(deferred("job-1")),
        drive=deferred_then_ready,
        fetches=(text("ready now"),),
    ),
    Scenario(
        "approval: a second wait reuses the call id",
        scripted_turns(
            calls(("deploy", "c1")), tool_calls(("deploy", {"n": 7}, "c1")), text("done")
        ),
        {"deploy": "never"},
        drive=decide_after_wait(approve_all),
        approval=APPROVAL,
        decide=approve_all,
    ),
    Scenario(
        "resumed after a crash, counted",
        scripted_turns(calls(("act", "c1")), text("done")),
        {"act": "safe"},
        drive=resume_drive(),
        options={"max_attempts": 5},  # recoveries of recoveries stay under the budget
        interrupted=True,
    ),
    Scenario(
        "stuck, then unstuck",
        scripted_turns(calls(("act", "c1")), text("done")),
        {"act": "safe"},
        drive=resume_drive(unstick=True),
        options={"max_attempts": 1},
        interrupted=True,
        unstick=True,
    ),
]


# -- running ----------------------------------------------------------------------------------


@dataclass
class Run:
    repo: SessionRepo
    storage: SessionStorage
    harness: AgentHarness
    counters: Counters
    model: ScriptedModel


async def open_run(
    scenario: Scenario,
    repo: SessionRepo,
    ids: str,
    *,
    create: bool,
    drive: str = "automatic",
    counters: Counters | None = None,
) -> Run:
    if create:
        await repo.create("s")
        if scenario.interrupted:
            await die_in_first_tool(scenario, repo)
    lease = await repo.acquire_lease("s", owner="w", ttl_ms=10**9)
    storage = await repo.open("s", lease=lease)
    counters = counters or Counters()
    holder: dict[str, AgentHarness] = {}
    actions = scenario.actions(holder) if scenario.actions else None
    model = ScriptedModel(responder=scenario.responder, fetches=scenario.fetches)
    if scenario.info is not None:
        model.info = scenario.info
    options = AgentHarnessOptions(
        storage=storage,
        model_client=model,
        model=MODEL,
        tools=make_tools(
            counters,
            replay=scenario.replay if create else (scenario.recovery_replay or scenario.replay),
            actions=actions,
            approval=scenario.approval,
        ),
        clock=ManualClock(),
        ids=SequentialIds(ids),
        retry=RetryPolicy(max_attempts=3, initial_delay_ms=0),
        drive=drive,  # type: ignore[arg-type]
        **scenario.options,
    )
    harness, _ = await AgentHarness.create(options)
    holder["h"] = harness
    return Run(repo, storage, harness, counters, model)


async def die_in_first_tool(scenario: Scenario, repo: SessionRepo) -> None:
    """A previous process: prompt, and die while the first tool runs (nothing after it lands)."""
    lease = await repo.acquire_lease("s", owner="dead", ttl_ms=10**9)
    storage = await repo.open("s", lease=lease)
    started = asyncio.Event()

    async def hang(ctx: Any) -> None:
        started.set()
        await asyncio.Event().wait()

    options = AgentHarnessOptions(
        storage=storage,
        model_client=ScriptedModel(responder=scenario.responder),
        model=MODEL,
        tools=make_tools(
            Counters(), replay=scenario.replay, actions=dict.fromkeys(scenario.replay, hang)
        ),
        clock=ManualClock(),
        ids=SequentialIds("dead-"),
        **scenario.options,
    )
    harness, _ = await AgentHarness.create(options)
    running = asyncio.ensure_future(harness.prompt("please help"))
    await started.wait()
    await harness.close()  # the process dies: the run stays open, its tool started
    await asyncio.gather(running, return_exceptions=True)
    await repo.release_lease(lease)


async def trajectory(scenario: Scenario) -> tuple[LogItem, ...]:
    repo = MemorySessionRepo(clock=ManualClock())
    run = await open_run(scenario, repo, "live-", create=True)
    if scenario.drive is not None:
        await scenario.drive(run.harness)
    else:
        await prompt(run.harness)
    log = await run.storage.get_log()
    await repo.close()
    return log


def new_repo(backend: str, directory: Path) -> SessionRepo:
    clock = ManualClock()
    return (
        MemorySessionRepo(clock=clock)
        if backend == "memory"
        else SqliteSessionRepo(directory / "r.db", clock=clock)
    )


async def recover(
    scenario: Scenario,
    backend: str,
    prefix: Sequence[LogItem],
    ids: str,
    policy: ToolRecovery = "declared",
) -> tuple[tuple[LogItem, ...], Counters, Run]:
    repo = new_repo(backend, Path(tempfile.mkdtemp(prefix="recovery-")))
    await repo.import_session(SessionMetadata(id="s", created_at=1), prefix)
    run = await open_run(scenario, repo, ids, create=False)
    await resume_all(run.harness, scenario.decide, policy, unstick=scenario.unstick)
    return await run.storage.get_log(), run.counters, run


async def check_prefix(
    scenario: Scenario, backend: str, prefix: Sequence[LogItem], half_completed: bool
) -> tuple[int, set[tuple[str, str, str]]]:
    declarations = scenario.recovery_replay or scenario.replay
    log, counters, run = await recover(scenario, backend, prefix, "r1-")
    seen = check_invariants(prefix, log, counters, declarations)
    # recovery is read-only until resume, and a second recovery finds nothing more to do
    for lane in await run.harness.lanes():
        assert await restore_lane(run.storage, lane.name) == run.harness._rt.lanes[lane.name].state
    await run.repo.close()
    again, counters_again, run_again = await recover(scenario, backend, log, "r2-")
    if not parked_deferred(log):  # a parked deferred request is fetched again on every resume
        assert shape(again) == shape(log), "a second recovery changed a recovered log"
    assert sum(counters_again.executions.values()) == 0
    await run_again.repo.close()
    # deterministic: the same prefix recovers to the same log
    same, _, run_same = await recover(scenario, backend, prefix, "r1-")
    assert same == log
    await run_same.repo.close()
    checked = 1
    if half_completed:
        for cut in range(len(prefix) + 1, len(log)):
            partial, partial_counters, run_partial = await recover(
                scenario, backend, log[:cut], "r3-"
            )
            seen |= check_invariants(log[:cut], partial, partial_counters, declarations)
            await run_partial.repo.close()
            checked += 1
    return checked, seen


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_every_prefix_recovers(scenario: Scenario, backend: str) -> None:
    log = await trajectory(scenario)
    assert log, "the scenario wrote nothing"
    checked = 0
    seen: set[tuple[str, str, str]] = set()
    for k in range(1, len(log) + 1):
        count, cases = await check_prefix(
            scenario, backend, log[:k], half_completed=backend == "memory"
        )
        checked += count
        seen |= cases
    assert checked >= len(log)
    if scenario.recovery_replay is not None:  # every declaration pair met a crash at X3/X4
        assert seen == {
            ("safe", "safe", "replayed"),
            ("safe", "never", "interrupted"),
            ("never", "safe", "interrupted"),
            ("never", "never", "interrupted"),
        }


async def test_create_is_read_only_and_reports_suspended_operations() -> None:
    scenario = SCENARIOS[0]
    log = await trajectory(scenario)
    cut = (
        next(
            i
            for i, item in enumerate(log)
            if isinstance(item, StoredRecord) and item.type == "tool_started"
        )
        + 1
    )
    repo = MemorySessionRepo(clock=ManualClock())
    await repo.import_session(SessionMetadata(id="s", created_at=1), log[:cut])
    run = await open_run(scenario, repo, "r-", create=False)
    assert await run.storage.get_log() == tuple(log[:cut]), "create() wrote something"
    assert run.model.requests == [] and sum(run.counters.executions.values()) == 0
    lanes = await run.harness.lanes()
    assert [(lane.name, lane.status) for lane in lanes] == [("main", "suspended")]
    idle = await run.harness.create_lane("other", None)
    assert isinstance(idle, Ok)
    nothing = await idle.value.resume()
    assert isinstance(nothing, Err) and nothing.error.tag == "NothingToResume"
    await repo.close()


async def test_steering_accepted_during_an_interrupted_retry_waits_for_the_step() -> None:
    """Reference §6.4: the unfinished step resumes first; the checkpoint consumes the steer."""
    scenario = next(s for s in SCENARIOS if s.name == "steering during a retry")
    log = await trajectory(scenario)
    cut = next(
        i for i, item in enumerate(log) if item.kind == "record" and item.type == "queue_enqueued"
    )
    recovered, _, run = await recover(scenario, "memory", log[: cut + 1], "r-")
    await run.repo.close()
    after = recovered[cut + 1 :]
    kinds = [
        item.record.type if isinstance(item, StoredRecord) else item.entry.message.role  # type: ignore[union-attr]
        for item in after[:6]
    ]
    assert kinds == [
        "operation_resumed",  # the recovery is the run's second execution, counted first
        "step_attempt",
        "usage",
        "assistant",
        "tool_started",
        "tool_result",
    ]
    after = after[1:]
    first_attempt = after[0]
    assert isinstance(first_attempt, StoredRecord) and first_attempt.record.attempt == 2  # type: ignore[union-attr]
    user = [
        item
        for item in after
        if isinstance(item, StoredEntry)
        and isinstance(item.entry, MessageEntry)
        and isinstance(item.entry.message, UserMessage)
    ]
    assert [message_text(u.entry.message) for u in user] == ["and check the tests"]  # type: ignore[union-attr]


POLICY_SCENARIOS = [s for s in SCENARIOS if "every declaration pair" in s.name]


@pytest.mark.parametrize("policy", ["declared", "never", "always"])
@pytest.mark.parametrize("scenario", POLICY_SCENARIOS, ids=[s.name for s in POLICY_SCENARIOS])
async def test_every_policy_at_every_batch_position(scenario: Scenario, policy: str) -> None:
    """`tool_recovery` x each declaration pair (a..d) x each position: crash at every prefix."""
    log = await trajectory(scenario)
    declarations = scenario.recovery_replay or scenario.replay
    seen: set[tuple[str, str, str]] = set()
    for k in range(1, len(log) + 1):
        recovered, counters, run = await recover(
            scenario,
            "memory",
            log[:k],
            "p-",
            policy,  # type: ignore[arg-type]
        )
        seen |= check_invariants(log[:k], recovered, counters, declarations, policy=policy)
        await run.repo.close()
    actions = {action for _, _, action in seen}
    expected = {"declared": {"replayed", "interrupted"}, "never": {"interrupted"}}
    assert actions == expected.get(policy, {"replayed"})
    assert {(started, current) for started, current, _ in seen} == {
        ("safe", "safe"), ("safe", "never"), ("never", "safe"), ("never", "never")
    }  # fmt: skip
