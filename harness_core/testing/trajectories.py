"""The canonical trajectories: scenarios every recovery test drives, cuts and recovers.

A `Scenario` says how a run goes live: what the scripted model answers (`scripted_turns`), which
tools exist and how they are declared (`make_tools`), what the tools do while they run (its
``actions``), and how the test drives the harness (its ``drive``: a prompt, a steer during a
retry, an approval decision, a counted resume, ...). `SCENARIOS` is the catalog: each entry is
one trajectory through the runtime (tool batches of every declaration pair, retries, steering,
aborts, compaction, navigation, deferred requests, approvals, counted and stuck resumes).

`open_run` opens a harness for a scenario over any repository (live, or recovering an imported
prefix with the scenario's recovery declarations); `trajectory` runs a scenario live once on
the memory backend and returns its log, whose every prefix is a state a crash can leave. The
prefix-recovery tests, the crash matrix (manual drive, cut after every action) and the reducer's
canonical-prefix test all read this one catalog.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from harness_core.approvals import approve, deny
from harness_core.harness import AgentHarness
from harness_core.hooks import BeforeRequestEvent, BeforeRunEndEvent, BeforeRunEndResult
from harness_core.ids import SequentialIds
from harness_core.messages import (
    AssistantMessage,
    ImagePart,
    TextPart,
    UserMessage,
    message_text,
)
from harness_core.models import ModelInfo, ModelRef, ModelRequest
from harness_core.models.scripted import ScriptedModel, deferred, error, length, text, tool_calls
from harness_core.options import AgentHarnessOptions, CompactionSettings, RetryPolicy
from harness_core.result import Ok
from harness_core.session.contract import SessionRepo, SessionStorage
from harness_core.session.records import ApprovalDecision, PendingApproval
from harness_core.session.types import LogItem
from harness_core.storage.memory import MemorySessionRepo
from harness_core.testing.clock import ManualClock
from harness_core.testing.invariants import Counters, Decide
from harness_core.tools import Replay, Tool, ToolContext

__all__ = [
    "abort_actions",
    "abort_deferred",
    "APPROVAL",
    "approve_all",
    "calls",
    "config_actions",
    "decide_after_wait",
    "deferred_then_ready",
    "deny_all",
    "die_in_first_tool",
    "Drive",
    "follow_up_drive",
    "FOUR_DECLARATIONS",
    "make_tools",
    "manual_compaction_drive",
    "MODEL",
    "navigation_drive",
    "open_run",
    "override_all",
    "prompt",
    "Responder",
    "resume_drive",
    "retry_then",
    "Run",
    "Scenario",
    "SCENARIOS",
    "scripted_turns",
    "SMALL_CONTEXT",
    "steer_actions",
    "steer_cancel_actions",
    "steer_during_retry",
    "ToolAction",
    "ToolActions",
    "trajectory",
    "turn_index",
    "two_prompts",
    "write_actions",
]

MODEL = ModelRef(provider="scripted", model_id="test")
"""The model every scenario's harness is configured with (answered by a `ScriptedModel`)."""

Responder = Callable[[ModelRequest], AssistantMessage]
"""A scripted model's answer as a function of the request."""

Drive = Callable[[AgentHarness], Awaitable[None]]
"""How a test drives a scenario's harness live."""

ToolAction = Callable[[ToolContext], Awaitable[None]]
"""What a tool does while it runs (besides counting the run)."""

ToolActions = Callable[[dict[str, AgentHarness]], dict[str, ToolAction]]
"""Tool actions by tool name, made from a holder that maps ``"h"`` to the running harness."""


# -- the model and the tools --------------------------------------------------------------------


def turn_index(request: ModelRequest) -> int:
    """How many assistant messages follow the newest user message (0: the first answer)."""
    count = 0
    for message in reversed(request.messages):
        if isinstance(message, UserMessage):
            break
        if isinstance(message, AssistantMessage):
            count += 1
    return count


def scripted_turns(*turns: AssistantMessage | Responder) -> Responder:
    """A responder: answer n after the newest user input is `turns[n]`; summaries are fixed.

    The last turn repeats once the turns run out (a steered run may ask again).
    """

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
    replay: Mapping[str, Replay],
    actions: Mapping[str, ToolAction] | None = None,
    approval: frozenset[str] = frozenset(),
) -> list[Tool]:
    """One tool per name in `replay`, declared as given, counting every run in `counters`.

    A tool runs its action (if `actions` has one for its name) and returns a text naming its
    arguments; a tool named in `approval` requires approval.
    """
    tools = []
    for name, declared in replay.items():

        async def execute(args: Any, ctx: ToolContext, name: str = name) -> str:
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
                replay=declared,
                requires_approval=name in approval,
            )
        )
    return tools


def calls(*specs: tuple[str, str]) -> AssistantMessage:
    """An answer calling each ``(tool name, call id)`` in order, with arguments ``{"n": i}``."""
    return tool_calls(*((name, {"n": i}, call_id) for i, (name, call_id) in enumerate(specs)))


def retry_then(answer: AssistantMessage) -> Responder:
    """A turn whose first attempt fails retryably and whose retry answers `answer`."""
    return lambda request: error("server") if request.attempt == 1 else answer


def refuses_images(answer: AssistantMessage) -> Responder:
    """A turn the provider refuses as invalid while the request carries an image (D289)."""

    def respond(request: ModelRequest) -> AssistantMessage:
        carried = any(
            isinstance(part, ImagePart)
            for message in request.messages
            if not isinstance(message, AssistantMessage)
            for part in message.content
        )
        return error("invalid_request", retryable=False) if carried else answer

    return respond


# -- the scenario -------------------------------------------------------------------------------


@dataclass
class Scenario:
    """One trajectory: how to drive it live, and what the model and tools do."""

    name: str
    responder: Responder
    replay: dict[str, Replay] = field(default_factory=dict)
    """The tools and their declarations when the trajectory runs live."""
    drive: Drive | None = None
    """How the test drives the live run (default: one `prompt`)."""
    actions: ToolActions | None = None
    """What the tools do while they run."""
    fetches: Sequence[AssistantMessage] = ()
    """The outcomes of fetching a deferred request, in order."""
    options: dict[str, Any] = field(default_factory=dict)
    """More `AgentHarnessOptions` (compaction, tool execution, attempt budget, ...)."""
    info: ModelInfo | None = None
    """The model's limits (default: the scripted model's)."""
    recovery_replay: dict[str, Replay] | None = None
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


# -- drives and tool actions --------------------------------------------------------------------


async def prompt(harness: AgentHarness, text_: str = "please help") -> None:
    """Prompt the harness and require the prompt to be accepted."""
    result = await harness.prompt(text_)
    assert isinstance(result, Ok), result


_PIXEL = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)
"""A 1 x 1 PNG, base64."""


async def image_drive(harness: AgentHarness) -> None:
    """Drive: one prompt that carries an image."""
    image = ImagePart(media_type="image/png", data=_PIXEL)
    result = await harness.prompt(UserMessage(content=(TextPart(text="what is this?"), image)))
    assert isinstance(result, Ok), result


def resume_drive(unstick: bool = False) -> Drive:
    """Drive: continue the run a previous process left (a counted attempt)."""

    async def run(harness: AgentHarness) -> None:
        result = await harness.resume(unstick=unstick)
        assert isinstance(result, Ok), result
        assert result.value.kind == "completed", result

    return run


async def two_prompts(harness: AgentHarness) -> None:
    """Drive: a long first question, then a second (material for a compaction)."""
    await prompt(harness, "first question " + "q" * 120)
    await prompt(harness, "second question")


SMALL_CONTEXT: dict[str, Any] = {
    "compaction": CompactionSettings(reserve_tokens=60, keep_recent_tokens=10)
}
"""Options that make a small context window compact at the next checkpoint."""


async def deferred_then_ready(harness: AgentHarness) -> None:
    """Drive: a prompt the model defers, then a resume that redeems it."""
    result = await harness.prompt("take your time")
    assert isinstance(result, Ok)
    assert result.value.kind == "suspended"
    assert isinstance(await harness.resume(), Ok)


def steer_actions(harnesses: dict[str, AgentHarness]) -> dict[str, ToolAction]:
    """Tool ``act`` steers the run once while it runs."""
    steered: list[str] = []

    async def steer(ctx: ToolContext) -> None:
        if not steered:  # the model calls the tool again after the steer; steer only once
            steered.append("yes")
            result = await harnesses["h"].steer("also check the tests")
            assert isinstance(result, Ok), result

    return {"act": steer}


def write_actions(harnesses: dict[str, AgentHarness]) -> dict[str, ToolAction]:
    """Tool ``act`` appends a custom entry while it runs (a deferred write)."""

    async def write(ctx: ToolContext) -> None:
        await harnesses["h"].session.append_custom_entry("note", {"seen": True})

    return {"act": write}


def steer_cancel_actions(harnesses: dict[str, AgentHarness]) -> dict[str, ToolAction]:
    """Tool ``act`` steers the run and cancels the steer while it runs."""

    async def steer_then_cancel(ctx: ToolContext) -> None:
        harness = harnesses["h"]
        steered = await harness.steer("never mind this")
        assert isinstance(steered, Ok)
        cancelled = await harness.cancel_queued(steered.value)
        assert isinstance(cancelled, Ok)
        assert cancelled.value == "cancelled"

    return {"act": steer_then_cancel}


def config_actions(harnesses: dict[str, AgentHarness]) -> dict[str, ToolAction]:
    """Tool ``act`` changes the thinking level and the active tools while it runs."""

    async def reconfigure(ctx: ToolContext) -> None:
        await harnesses["h"].set_thinking_level("high")
        await harnesses["h"].set_active_tools(["act"])

    return {"act": reconfigure}


def abort_actions(harnesses: dict[str, AgentHarness]) -> dict[str, ToolAction]:
    """Tool ``act`` aborts the run while it runs."""

    async def abort(ctx: ToolContext) -> None:
        await harnesses["h"].abort()

    return {"act": abort}


async def follow_up_drive(harness: AgentHarness) -> None:
    """Drive: a prompt whose ``before_run_end`` hook adds one follow-up at the finish."""
    fired: list[int] = []

    async def once(event: BeforeRunEndEvent) -> BeforeRunEndResult | None:
        if fired:
            return None
        fired.append(1)
        return BeforeRunEndResult(follow_up="one more thing")

    harness.hooks.on("before_run_end", once)
    await prompt(harness)


async def manual_compaction_drive(harness: AgentHarness) -> None:
    """Drive: two prompts, then a manual compaction."""
    await two_prompts(harness)
    result = await harness.compact()
    assert isinstance(result, Ok), result
    assert result.value.kind == "completed", result


async def navigation_drive(harness: AgentHarness) -> None:
    """Drive: two prompts, then navigate back to the first answer with a summary and a label."""
    first = await harness.prompt("first")
    assert isinstance(first, Ok)
    await prompt(harness, "second")
    result = await harness.navigate_tree(first.value.final_entry_id, summarize=True, label="here")
    assert isinstance(result, Ok), result
    assert result.value.kind == "completed", result


async def abort_deferred(harness: AgentHarness) -> None:
    """Drive: a prompt the model defers, then an abort of the suspended lane."""
    result = await harness.prompt("take your time")
    assert isinstance(result, Ok)
    assert result.value.kind == "suspended"
    aborted = await harness.abort()
    assert isinstance(aborted, Ok), aborted
    await harness.wait_for_idle()


async def steer_during_retry(harness: AgentHarness) -> None:
    """Drive: a prompt steered while its step's second attempt is about to be requested."""
    steered: list[int] = []

    async def steer(event: BeforeRequestEvent) -> None:
        if event.attempt == 2 and not steered:
            steered.append(1)
            assert isinstance(await harness.steer("and check the tests"), Ok)

    harness.hooks.on("before_request", steer)
    await prompt(harness)


FOUR_DECLARATIONS: dict[str, Replay] = {"a": "safe", "b": "safe", "c": "never", "d": "never"}
"""Live declarations; recovery sees a, b, c, d as safe, never, safe, never: all four pairs."""


def approve_all(pending: tuple[PendingApproval, ...]) -> list[ApprovalDecision]:
    """Approve every pending call as requested."""
    return [approve(p) for p in pending]


def deny_all(pending: tuple[PendingApproval, ...]) -> list[ApprovalDecision]:
    """Deny every pending call."""
    return [deny(p, "not now") for p in pending]


def override_all(pending: tuple[PendingApproval, ...]) -> list[ApprovalDecision]:
    """Approve every pending call with other arguments (``{"n": 99}``)."""
    return [approve(p, args={"n": 99}) for p in pending]


def decide_after_wait(decide: Decide, *, steer: str | None = None, abort: bool = False) -> Drive:
    """Drive: prompt, find the run waiting for approval, then steer / abort / decide."""

    async def run(harness: AgentHarness) -> None:
        result = await harness.prompt("ship it")
        assert isinstance(result, Ok), result
        assert result.value.kind == "suspended", result
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
"""The tools that require approval in the approval scenarios."""


# -- the catalog --------------------------------------------------------------------------------

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
        "a tool loop stopped at the turn limit",
        scripted_turns(calls(("echo", "c1")), calls(("echo", "c2")), text("never asked for")),
        {"echo": "never"},
        options={"max_turns": 2},
    ),
    Scenario(
        "a tool run stopped at the lane's token budget",
        scripted_turns(calls(("echo", "c1")), text("never asked for")),
        {"echo": "never"},
        options={"token_budget": 1},  # the first request spends it
    ),
    Scenario(
        "an image the provider refuses, withheld",
        scripted_turns(refuses_images(calls(("echo", "c1"))), refuses_images(text("done"))),
        {"echo": "never"},
        drive=image_drive,
    ),
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
                length("cut", output_tokens=1, input_tokens=99_950)  # 50 left of a 100 cap
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
"""Every canonical trajectory, by name (names are unique: tests use them as ids)."""


# -- running ------------------------------------------------------------------------------------


@dataclass
class Run:
    """A scenario's harness over an open session, with its tools' counters and its model."""

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
    drive: Literal["automatic", "manual"] = "automatic",
    counters: Counters | None = None,
) -> Run:
    """Open session ``s`` of `repo` under a harness configured for `scenario`.

    With `create`, the session is created first (and, for an ``interrupted`` scenario, a dead
    process's run is left in it) and the tools carry the live declarations; otherwise the
    session must exist (an imported prefix) and the tools carry the recovery declarations.
    Entry and record ids start with `ids`.
    """
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
        drive=drive,
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

    async def hang(ctx: ToolContext) -> None:
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
    """Run `scenario` live once (memory backend) and return its log: the trajectory."""
    repo = MemorySessionRepo(clock=ManualClock())
    run = await open_run(scenario, repo, "live-", create=True)
    if scenario.drive is not None:
        await scenario.drive(run.harness)
    else:
        await prompt(run.harness)
    log = await run.storage.get_log()
    await repo.close()
    return log
