"""Tier A from hand-built crash states: prefill, create, resume, then create and resume again.

`test_recovery.py` recovers every prefix of logs our own harness wrote. This module writes
crash states independently, record by record and entry by entry through the public storage
API (`tests.support.crash_states.Prefill`), including states this writer never produces but a
log from another version or backend could hold: results out of source order, a result without
its `tool_started`, an assistant entry without a step attempt, no usage records at all,
attempts at the cap, approvals decided before a crash... (reference §16.1's case list).

Each case states exactly what a restarted process must find (`create()`'s suspended list), what
each resume returns, every line the recovery appends (`crash_states.render`), which tools ran
and how many model requests were made. A second process then restores and resumes again and
must change nothing (the fixed point). A corrupt lane (every validity rule of reference §3.5,
every `CorruptionReason`) is restored *faulted* with the reason of the rule it breaks: `lanes()`
reports it, `resume()` raises `HarnessFault` caused by that `RecordLogCorruption`, nothing is
written, and the session's other lanes recover normally.

Runs on the memory (reference) and SQLite backends.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness_core import ScriptedModel, SessionRepo
from harness_core._runtime.restore import restore_lane
from harness_core.approvals import approve, args_digest, deny
from harness_core.errors import CorruptionReason, HarnessFault, RecordLogCorruption
from harness_core.harness import AgentHarness, AgentLane, SuspendedOperation
from harness_core.ids import SequentialIds
from harness_core.messages import AssistantMessage, DeferredHandle, TextPart, message_text
from harness_core.models import DEFAULT_INFO, ModelInfo
from harness_core.models.scripted import deferred, error, length, text, tool_calls
from harness_core.options import AgentHarnessOptions, CompactionSettings, RetryPolicy
from harness_core.result import Err, Ok
from harness_core.session.contract import SessionStorage
from harness_core.session.entries import BranchSummaryEntry, MessageEntry, ThinkingLevelChangeEntry
from harness_core.session.records import ApprovalDecision, OperationStarted
from harness_core.session.types import (
    LogItem,
    SessionMetadata,
    StoredRecord,
    WriterLease,
)
from harness_core.testing import ManualClock
from harness_core.testing.invariants import Counters, check_invariants
from harness_core.tools import Tool, ToolRecovery
from tests.support.backends import new_repo
from tests.support.crash_states import (
    Prefill,
    assistant_error,
    assistant_text,
    compaction_entry,
    custom,
    deferred_entry,
    render_log,
    tool_result,
    tool_use,
    user,
)
from tests.support.harness_kit import MODEL

# -- the recovering process -------------------------------------------------------------------


class RejectingFetch(ScriptedModel):
    """A client whose deferred fetch raises (the provider call failed outright)."""

    async def fetch_deferred(self, handle: DeferredHandle) -> AssistantMessage:
        self.fetches.append(handle)
        raise ConnectionError("provider unreachable")


@dataclass
class Process:
    """One restarted process: its harness, what `create()` found and what it did."""

    harness: AgentHarness
    suspended: list[SuspendedOperation]
    storage: SessionStorage
    lease: WriterLease
    model: ScriptedModel
    counters: Counters
    ran: list[tuple[str, dict[str, Any]]]
    """(tool, arguments) of every tool execution, in order."""
    hooks: list[tuple[str, str]] = field(default_factory=list)
    """(hook, tool call id) of the tool hooks a `setup` chose to record."""

    async def close(self, repo: SessionRepo) -> None:
        await self.harness.close()
        await self.storage.close()
        await repo.release_lease(self.lease)


Action = Callable[[AgentLane, SuspendedOperation], Awaitable[str]]
"""What a restarted process does with one suspended operation; returns a rendered result."""
Check = Callable[[Process, Process], Awaitable[None]]
"""Extra assertions on the first and second process."""


def show(result: Any) -> str:
    """A resume result as a line: the outcome kind (+ error code, pending approvals) or the tag."""
    if isinstance(result, Err):
        return str(result.error.tag)
    assert isinstance(result, Ok), result
    outcome = result.value
    line: str = outcome.kind + (f" {outcome.error.code}" if outcome.error else "")
    if outcome.pending_approvals:
        line += " approvals=" + ",".join(
            p.tool_call_id + ("*" if p.started else "") for p in outcome.pending_approvals
        )
    return line


def show_suspended(op: SuspendedOperation) -> str:
    """A suspended operation as a line: lane, kind, id, reason and what it carries."""
    parts = [op.lane, op.kind, op.id, op.reason]
    if op.stuck:
        parts.append(f"stuck after {op.attempts}")
    if op.aborting:
        parts.append("aborting")
    if op.deferred is not None:
        parts.append(f"handle={op.deferred.id}")
    if op.missing_tools:
        parts.append("tools=" + ",".join(op.missing_tools))
    if op.missing_models:
        parts.append("models=" + ",".join(op.missing_models))
    if op.pending_approvals:
        parts.append(
            "approvals="
            + ",".join(p.tool_call_id + ("*" if p.started else "") for p in op.pending_approvals)
        )
    return " ".join(parts)


async def resume(lane: AgentLane, op: SuspendedOperation) -> str:
    """Resume as a restarted process does (a harness fault is a result too)."""
    try:
        return show(await lane.resume())
    except HarnessFault:
        return "HarnessFault"


def resume_with(policy: ToolRecovery) -> Action:
    async def act(lane: AgentLane, op: SuspendedOperation) -> str:
        return show(await lane.resume(tool_recovery=policy))

    return act


def decide(*decisions: ApprovalDecision, first: bool = False) -> Action:
    """Decide the wait `create()` found (or, if `first`, the one a plain resume runs into)."""

    async def act(lane: AgentLane, op: SuspendedOperation) -> str:
        lines: list[str] = []
        wait_id = op.wait_id
        if first:
            found = await lane.resume()
            lines.append(show(found))
            assert isinstance(found, Ok)
            wait_id = found.value.wait_id
        decided = await lane.resume(
            list(decisions), wait_id=wait_id, decided_by="ops", idempotency_key="k-new"
        )
        return "; ".join([*lines, show(decided)])

    return act


async def unstick(lane: AgentLane, op: SuspendedOperation) -> str:
    """An operator's override of a stuck lane (a fresh attempt budget)."""
    return show(await lane.resume(unstick=True))


async def abort(lane: AgentLane, op: SuspendedOperation) -> str:
    """Abort the suspended operation and wait for its reconciliation."""
    accepted = await lane.abort()
    await lane.wait_for_idle()
    return "abort accepted" if isinstance(accepted, Ok) else str(accepted.error.tag)


# -- cases ----------------------------------------------------------------------------------

Build = Callable[[Prefill], Awaitable[Any]]
DONE = (
    "R attempt assistant#1 ~",
    "R usage assistant",
    "E ~ assistant stop done",
    "R finished completed",
)
"""A fresh turn answering "done", then the run completes."""
ABORTED = ("E ~ assistant aborted (aborted)", "R finished aborted")
"""The abort closure message, then the aborted finish."""


@dataclass(frozen=True)
class Case:
    """One hand-built crash state and everything its recovery must do."""

    name: str
    build: Build
    suspended: tuple[str, ...] = ("main run run crash",)
    """`create()`'s suspended list (`show_suspended`)."""
    outcomes: tuple[str, ...] = ("completed",)
    """One rendered result per suspended operation (`show`)."""
    appended: tuple[str, ...] = DONE
    """Every line the first recovery appends (`crash_states.render`)."""
    tools: Mapping[str, str] = field(default_factory=dict)
    """Tool name -> replay declaration of the recovering process."""
    approval: frozenset[str] = frozenset()
    """Tools that require approval."""
    executions: Mapping[str, int] = field(default_factory=dict)
    requests: int = 0
    """Model requests of the first recovery."""
    script: tuple[Any, ...] = (text("done"),)
    fetches: tuple[AssistantMessage, ...] = ()
    action: Action = resume
    max_attempts: int = 3
    info: ModelInfo = DEFAULT_INFO
    compaction: CompactionSettings = field(default_factory=CompactionSettings)
    known_models: tuple[str, ...] | None = None
    rejecting_fetch: bool = False
    still: tuple[str, ...] = ()
    """What the second `create()` finds suspended (a parked or waiting operation stays)."""
    setup: Callable[[Process], None] | None = None
    """Prepares the first process before it resumes (hooks, ...)."""
    check: Check | None = None
    invariants: bool = True
    """Run `check_invariants` (every operation closed but a parked deferred request...)."""
    policy: ToolRecovery = "declared"
    """The `tool_recovery` policy `action` resumes with (what `check_invariants` expects)."""
    edit: Callable[[tuple[LogItem, ...]], Sequence[LogItem]] | None = None
    """Build in a scratch session, then import this edit of its log (states the storage's
    conditional write refuses)."""
    corrupt: CorruptionReason | None = None
    """Lane ``main``'s log breaks this validity rule: restore reports the lane faulted."""
    faulted: Mapping[str, CorruptionReason] = field(default_factory=dict)
    """Other lanes whose restore must fault with these reasons, in both processes."""
    xfail: str | None = None


# -- building blocks ------------------------------------------------------------------------


def chain(*steps: Build) -> Build:
    async def build(p: Prefill) -> None:
        for step in steps:
            await step(p)

    return build


def asked(text_: str = "please help", run_id: str = "run", uid: str = "u1") -> Build:
    async def build(p: Prefill) -> None:
        await p.run(run_id, user(uid, text_))

    return build


def batch(*calls: tuple[str, str], entry_id: str = "a1", usage: bool = True) -> Build:
    """Assistant attempt 1 answered with these tool calls (call id, tool)."""

    async def build(p: Prefill) -> None:
        await p.attempt(1, entry_id, usage="tool_use" if usage else None)
        await p.entry(tool_use(entry_id, *calls))

    return build


def answered(entry_id: str = "a1", said: str = "an answer") -> Build:
    async def build(p: Prefill) -> None:
        await p.attempt(1, entry_id, usage="stop")
        await p.entry(assistant_text(entry_id, said))

    return build


def history() -> Build:
    """An earlier exchange on the lane, long enough to compact (two questions, two answers)."""

    async def build(p: Prefill) -> None:
        await p.entries(
            user("h1", "first question " + "q" * 200),
            assistant_text("h2", "first answer " + "a" * 200),
            user("h3", "second question " + "q" * 200),
            assistant_text("h4", "second answer"),
        )

    return build


def yes(call_id: str) -> ApprovalDecision:
    """Approve a call whose wait showed the arguments ``{}`` (every hand-built wait here)."""
    return approve(call_id, args_digest=args_digest({}))


def no(call_id: str, reason: str = "not today") -> ApprovalDecision:
    """Deny such a call."""
    return deny(call_id, reason, args_digest=args_digest({}))


NAMES = ("a", "b", "c")
CALLS = (("c1", "a"), ("c2", "b"), ("c3", "c"))


def tool_state(started: int, results: int, replay: Sequence[str]) -> Build:
    """The parallel writer's crash state in a 3-call batch: `started` starts, `results` results.

    Starts come in source order (with their recorded declarations `replay`), then results in
    source order, as the live batch writes them (reference §6.8, §6.9).
    """

    async def build(p: Prefill) -> None:
        for i in range(started):
            await p.started("a1", i, CALLS[i][0], NAMES[i], f"res{i + 1}", replay[i])
        for i in range(results):
            await p.entry(tool_result(f"res{i + 1}", *CALLS[i]))

    return build


def batch_recovery(
    started: int, results: int, recorded: Sequence[str], current: Sequence[str]
) -> tuple[tuple[str, ...], dict[str, int]]:
    """What recovering the `tool_state` must append and run (reference §6.8, §7.4)."""
    lines: list[str] = []
    runs: dict[str, int] = {}
    for i, (call_id, name) in enumerate(CALLS):
        if i < results:
            continue  # X5: done
        if i < started:  # X3/X4: the AND rule
            if recorded[i] == "safe" and current[i] == "safe":
                lines.append(f"E res{i + 1} result {call_id} ok")
                runs[name] = 1
            else:
                lines.append(f"E res{i + 1} result {call_id} interrupted")
            continue
        lines += [f"R tool_started {call_id} {name} {current[i]}", f"E ~ result {call_id} ok"]
        runs[name] = 1  # X1/X2: the full path, before_tool again
    return (*lines, *DONE), runs


def batch_cases() -> list[Case]:
    cases = []
    recorded, current = ("safe", "never", "safe"), ("safe", "never", "never")
    for started in range(4):
        for results in range(started + 1):
            appended, runs = batch_recovery(started, results, recorded, current)
            cases.append(
                Case(
                    f"batch of 3: {started} started, {results} results",
                    chain(asked(), batch(*CALLS), tool_state(started, results, recorded)),
                    appended=appended,
                    tools=dict(zip(NAMES, current, strict=True)),
                    executions=runs,
                    requests=1,
                )
            )
    pairs = [("safe", "safe"), ("safe", "never"), ("never", "safe"), ("never", "never")]
    for position in range(3):
        for was, now in pairs:
            recorded_ = tuple(was if i == position else "never" for i in range(3))
            current_ = tuple(now if i == position else "never" for i in range(3))
            appended, runs = batch_recovery(position + 1, position, recorded_, current_)
            cases.append(
                Case(
                    f"X3 at call {position + 1}: started {was}, now {now}",
                    chain(asked(), batch(*CALLS), tool_state(position + 1, position, recorded_)),
                    appended=appended,
                    tools=dict(zip(NAMES, current_, strict=True)),
                    executions=runs,
                    requests=1,
                )
            )
    return cases


async def request_texts(process: Process, index: int) -> str:
    return " | ".join(message_text(m) for m in process.model.requests[index].messages)


def requests_see(*expected: tuple[int, str, bool]) -> Check:
    """Request `i` of the first recovery does (or does not) contain `text`."""

    async def check(first: Process, second: Process) -> None:
        for index, said, present in expected:
            assert (said in await request_texts(first, index)) is present, (index, said)

    return check


def record_tool_hooks(process: Process) -> None:
    async def before(event: Any) -> None:
        process.hooks.append(("before_tool", event.tool_call_id))

    async def after(event: Any) -> None:
        process.hooks.append(("after_tool", event.tool_call_id))

    process.harness.hooks.on("before_tool", before)
    process.harness.hooks.on("after_tool", after)


def tool_hooks_were(*expected: tuple[str, str]) -> Check:
    async def check(first: Process, second: Process) -> None:
        assert first.hooks == list(expected)

    return check


def ran_with(*expected: tuple[str, dict[str, Any]]) -> Check:
    async def check(first: Process, second: Process) -> None:
        assert first.ran == list(expected)

    return check


def next_run_pending(*entry_ids: str) -> Check:
    """Both processes see exactly these next-run items waiting for the lane's next run."""

    async def check(first: Process, second: Process) -> None:
        # the first process is closed by now; a lane it never used it never loaded (lane main
        # too restores on first use): then only the second process's view is there to check
        lane = first.harness._rt.lanes.get("main")
        if lane is not None:
            assert [e.id for e in lane.state.pending_next_run] == list(entry_ids)
        watch = await second.harness.watch()
        assert [e.id for e in watch.snapshot.next_run] == list(entry_ids)
        watch.unsubscribe()

    return check


def leaf_is(leaf: str | None) -> Check:
    async def check(first: Process, second: Process) -> None:
        assert await second.harness.get_leaf_id() == leaf

    return check


def fetched_then_cancelled(handle_id: str) -> Check:
    async def check(first: Process, second: Process) -> None:
        assert [h.id for h in first.model.fetches] == [handle_id]
        assert [h.id for h in first.model.cancels] == [handle_id]

    return check


def cancelled(handle_id: str) -> Check:
    async def check(first: Process, second: Process) -> None:
        assert [h.id for h in first.model.cancels] == [handle_id]
        assert first.model.fetches == []

    return check


# -- tool batches: every state, every position, every declaration pair --------------------------

TOOL_CASES = [
    *batch_cases(),
    Case(
        "policy always replays a started never/never call",
        chain(asked(), batch(("c1", "a")), tool_state(1, 0, ("never",))),
        appended=("E res1 result c1 ok", *DONE),
        tools={"a": "never"},
        executions={"a": 1},
        requests=1,
        action=resume_with("always"),
        policy="always",
    ),
    Case(
        "policy never reports a started safe/safe call interrupted",
        chain(asked(), batch(("c1", "a")), tool_state(1, 0, ("safe",))),
        appended=("E res1 result c1 interrupted", *DONE),
        tools={"a": "safe"},
        requests=1,
        action=resume_with("never"),
        policy="never",
    ),
    Case(
        "another writer: results out of source order",
        chain(
            asked(),
            batch(*CALLS),
            tool_state(3, 0, ("safe", "never", "never")),
            lambda p: p.entry(tool_result("res2", "c2", "b")),
        ),
        appended=("E res1 result c1 ok", "E res3 result c3 interrupted", *DONE),
        tools={"a": "safe", "b": "never", "c": "never"},
        executions={"a": 1},
        requests=1,
    ),
    Case(
        "another writer: starts out of source order",
        chain(
            asked(),
            batch(*CALLS),
            lambda p: p.started("a1", 1, "c2", "b", "res2", "never"),
        ),
        appended=(
            "R tool_started c1 a never",
            "E ~ result c1 ok",
            "E res2 result c2 interrupted",
            "R tool_started c3 c never",
            "E ~ result c3 ok",
            *DONE,
        ),
        tools={"a": "never", "b": "never", "c": "never"},
        executions={"a": 1, "c": 1},
        requests=1,
    ),
    Case(
        "another writer: a result without tool_started (safe tools unrecorded)",
        chain(
            asked(),
            batch(*CALLS, usage=False),
            lambda p: p.entry(tool_result("res1", "c1", "a")),
            lambda p: p.started("a1", 1, "c2", "b", "res2", "safe"),
        ),
        appended=("E res2 result c2 ok", "R tool_started c3 c safe", "E ~ result c3 ok", *DONE),
        tools={"a": "safe", "b": "safe", "c": "safe"},
        executions={"b": 1, "c": 1},
        requests=1,
    ),
    Case(
        # The call's result exists (matched by its tool-call id), so it is answered: a second
        # result for one call would make the provider context invalid.
        "another writer: a started call answered under another id",
        chain(
            asked(),
            batch(("c1", "a")),
            lambda p: p.started("a1", 0, "c1", "a", "res1", "never"),
            lambda p: p.entry(tool_result("other-1", "c1", "a")),
        ),
        tools={"a": "never"},
        requests=1,
        invariants=False,  # the provisioned res1 never materializes
    ),
    Case(
        "hooks: before_tool again for an X1 call, never for an X3 replay",
        chain(
            asked(),
            batch(("c1", "a"), ("c2", "b")),
            lambda p: p.started("a1", 0, "c1", "a", "res1", "safe"),
        ),
        appended=("E res1 result c1 ok", "R tool_started c2 b never", "E ~ result c2 ok", *DONE),
        tools={"a": "safe", "b": "never"},
        executions={"a": 1, "b": 1},
        requests=1,
        setup=record_tool_hooks,
        check=tool_hooks_were(("after_tool", "c1"), ("before_tool", "c2"), ("after_tool", "c2")),
    ),
    Case(
        "no usage records at all: tool_started, safe/safe",
        chain(asked(), batch(("c1", "a"), usage=False), tool_state(1, 0, ("safe",))),
        appended=("E res1 result c1 ok", *DONE),
        tools={"a": "safe"},
        executions={"a": 1},
        requests=1,
    ),
    Case(
        "a safe replay runs with the persisted effective arguments",
        chain(
            asked(),
            batch(("c1", "a")),
            lambda p: p.started("a1", 0, "c1", "a", "res1", "safe", args={"n": 42}),
        ),
        appended=("E res1 result c1 ok", *DONE),
        tools={"a": "safe"},
        executions={"a": 1},
        requests=1,
        check=ran_with(("a", {"n": 42})),
    ),
    Case(
        "a started call's tool is gone: resume refuses",
        chain(
            asked(),
            batch(("c1", "gone")),
            lambda p: p.started("a1", 0, "c1", "gone", "res1", "never"),
        ),
        suspended=("main run run crash tools=gone",),
        outcomes=("MissingIdentities",),
        appended=(),
        still=("main run run crash tools=gone",),
        invariants=False,
    ),
    Case(
        "a started call's tool is gone: abort still closes it",
        chain(
            asked(),
            batch(("c1", "gone")),
            lambda p: p.started("a1", 0, "c1", "gone", "res1", "safe"),
        ),
        suspended=("main run run crash tools=gone",),
        outcomes=("abort accepted",),
        appended=("R abort", "E res1 result c1 interrupted", *ABORTED),
        action=abort,
    ),
    Case(
        "the operation's model is unknown: resume refuses",
        asked(),
        suspended=("main run run crash models=scripted:test",),
        outcomes=("MissingIdentities",),
        appended=(),
        known_models=("scripted:other",),
        still=("main run run crash models=scripted:test",),
        invariants=False,
    ),
    Case(
        "truncated (length) batch: nothing executes",
        chain(
            asked(),
            lambda p: p.attempt(1, "a1"),
            lambda p: p.entry(tool_use("a1", ("c1", "a"), ("c2", "b"), stop_reason="length")),
        ),
        appended=("E ~ result c1 error", "E ~ result c2 error", *DONE),
        tools={"a": "safe", "b": "never"},
        requests=1,
    ),
    Case(
        "truncated batch with one call already answered",
        chain(
            asked(),
            lambda p: p.attempt(1, "a1"),
            lambda p: p.entry(tool_use("a1", ("c1", "a"), ("c2", "b"), stop_reason="length")),
            lambda p: p.entry(tool_result("t1", "c1", "a", "error")),
        ),
        appended=("E ~ result c2 error", *DONE),
        tools={"a": "safe", "b": "never"},
        requests=1,
    ),
]


# -- steps, attempts, compaction, overflow --------------------------------------------------

OVERFLOW_INFO = ModelInfo(context_window=100_000, max_output_tokens=100)
STUCK = ("main run run crash stuck after 3",)
SMALL_KEEP = CompactionSettings(keep_recent_tokens=10)

STEP_CASES = [
    Case(
        "interrupted twice after resumes (attempt 3 of 3): stuck, resume refuses",
        chain(
            asked(), lambda p: p.resumed(2), lambda p: p.attempt(1, "a1"), lambda p: p.resumed(3)
        ),
        suspended=STUCK,
        outcomes=("LaneStuck",),
        appended=(),
        still=STUCK,
        invariants=False,
    ),
    Case(
        "a stuck operation resumed with unstick",
        chain(asked(), lambda p: p.resumed(2), lambda p: p.resumed(3)),
        suspended=STUCK,
        action=unstick,
        requests=1,
    ),
    Case(
        "another writer: an answer without any step_attempt",
        chain(asked(), lambda p: p.entry(assistant_text("a1", "hi"))),
        appended=("R finished completed",),
    ),
    Case(
        "another writer: a tool call without any step_attempt",
        chain(asked(), lambda p: p.entry(tool_use("a1", ("c1", "a")))),
        appended=("R tool_started c1 a never", "E ~ result c1 ok", *DONE),
        tools={"a": "never"},
        executions={"a": 1},
        requests=1,
    ),
    Case(
        "an older writer: two attempts, no usage or resume records: attempt 3, not stuck",
        chain(asked(), lambda p: p.attempt(1, "a1"), lambda p: p.attempt(2, "a2")),
        appended=("R attempt assistant#3 ~", *DONE[1:]),
        requests=1,
    ),
    Case(
        "attempts at the cap across a restart: give up, no request",
        chain(
            asked(),
            lambda p: p.attempt(1, "a1", usage="error"),
            lambda p: p.attempt(2, "a2", usage="error"),
            lambda p: p.attempt(3, "a3"),
        ),
        outcomes=("failed retries_exhausted",),
        appended=("E a3 assistant error", "R finished failed retries_exhausted"),
    ),
    Case(
        "attempts at the cap with steering accepted meanwhile: give up, then the steer",
        chain(
            asked(),
            lambda p: p.attempt(1, "a1"),
            lambda p: p.attempt(2, "a2"),
            lambda p: p.enqueue("steer", user("s1", "also the tests")),
        ),
        appended=("E a2 assistant error", "E s1 user also the tests", *DONE),
        max_attempts=2,
        requests=1,
    ),
    Case(
        "steering accepted during an interrupted retry waits for the step",
        chain(
            asked(),
            lambda p: p.attempt(1, "a1", usage="error"),
            lambda p: p.enqueue("steer", user("s1", "also the tests")),
        ),
        appended=(
            "R attempt assistant#2 ~",
            "R usage assistant",
            "E ~ assistant stop first",
            "E s1 user also the tests",
            *DONE,
        ),
        script=(text("first"), text("done")),
        requests=2,
        check=requests_see((0, "also the tests", False), (1, "also the tests", True)),
    ),
    Case(
        "unfinished threshold compaction: same result id, attempt 2",
        chain(
            history(),
            asked(),
            batch(("c1", "a")),
            tool_state(1, 1, ("never",)),
            lambda p: p.attempt(1, "k1", step="compaction", reason="threshold"),
        ),
        appended=(
            "R attempt compaction#2 k1 threshold",
            "R usage compaction",
            "E k1 compaction",
            *DONE,
        ),
        tools={"a": "never"},
        script=(text("a summary"), text("done")),
        requests=2,
        compaction=SMALL_KEEP,
        check=requests_see((0, "first question", True), (1, "a summary", True)),
    ),
    Case(
        "auto-compaction attempts at the cap: the run fails, no request",
        chain(
            asked(),
            answered(),
            lambda p: p.enqueue("steer", user("s1")),
            lambda p: p.entry(user("s1")),
            *(
                (lambda p, n=n: p.attempt(n, "k1", step="compaction", reason="threshold"))
                for n in (1, 2, 3)
            ),
        ),
        outcomes=("failed retries_exhausted",),
        appended=("E ~ assistant error", "R finished failed retries_exhausted"),
    ),
    Case(
        "overflow: crash after the discarded response's usage",
        chain(history(), asked(), lambda p: p.attempt(1, "a1", usage="length")),
        appended=(
            "R attempt assistant#2 ~",
            "R usage assistant",
            "R attempt compaction#1 ~ overflow",
            "R usage compaction",
            "E ~ compaction",
            *DONE,
        ),
        script=(
            length("cut", output_tokens=1, input_tokens=99_950),
            text("a summary"),
            text("done"),
        ),
        requests=3,
        info=OVERFLOW_INFO,
        compaction=SMALL_KEEP,
    ),
    Case(
        "overflow: crash after the compaction step_attempt",
        chain(
            history(),
            asked(),
            lambda p: p.attempt(1, "a1", usage="length"),
            lambda p: p.attempt(1, "k1", step="compaction", reason="overflow"),
        ),
        appended=(
            "R attempt compaction#2 k1 overflow",
            "R usage compaction",
            "E k1 compaction",
            *DONE,
        ),
        script=(text("a summary"), text("done")),
        requests=2,
        info=OVERFLOW_INFO,
        compaction=SMALL_KEEP,
    ),
    Case(
        "overflow: crash after the compaction entry: a fresh assistant step",
        chain(
            history(),
            asked(),
            lambda p: p.attempt(1, "a1", usage="length"),
            lambda p: p.attempt(1, "k1", step="compaction", reason="overflow", usage="stop"),
            lambda p: p.entry(compaction_entry("k1")),
        ),
        requests=1,
        info=OVERFLOW_INFO,
        compaction=SMALL_KEEP,
        check=requests_see((0, "a summary", True)),
    ),
    Case(
        "threshold compaction: crash after its entry: a fresh assistant step",
        chain(
            asked(),
            batch(("c1", "a")),
            tool_state(1, 1, ("never",)),
            lambda p: p.attempt(1, "k1", step="compaction", reason="threshold"),
            lambda p: p.entry(compaction_entry("k1")),
        ),
        tools={"a": "never"},
        requests=1,
        check=requests_see((0, "a summary", True), (0, "please help", False)),
    ),
    Case(
        "overflow again inside the guard window: give up, context_overflow",
        chain(
            history(),
            asked(),
            lambda p: p.attempt(1, "a1", usage="length"),
            lambda p: p.attempt(1, "k1", step="compaction", reason="overflow", usage="stop"),
            lambda p: p.entry(compaction_entry("k1")),
            lambda p: p.attempt(1, "a2"),
        ),
        outcomes=("failed context_overflow",),
        appended=(
            "R attempt assistant#2 ~",
            "R usage assistant",
            "E ~ assistant error",
            "R finished failed context_overflow",
        ),
        script=(length("cut", output_tokens=1, input_tokens=99_950),),
        requests=1,
        info=OVERFLOW_INFO,
        compaction=SMALL_KEEP,
    ),
]


# -- terminal failure, initial messages, queues, deferred writes --------------------------------


def failed_step() -> Build:
    async def build(p: Prefill) -> None:
        await p.attempt(1, "a1", usage="error")
        await p.entry(assistant_error("a1"))

    return build


FLOW_CASES = [
    Case(
        "terminal-failure marker: recovery closes the run failed",
        chain(asked(), failed_step()),
        outcomes=("failed invalid_request",),  # the marker's own error, as the live run ended
        appended=("R finished failed invalid_request",),
    ),
    Case(
        "terminal-failure marker, steering pending: it clears the failure",
        chain(asked(), failed_step(), lambda p: p.enqueue("steer", user("s1", "try again"))),
        appended=("E s1 user try again", *DONE),
        requests=1,
    ),
    Case(
        "terminal-failure marker, steering already consumed",
        chain(
            asked(),
            failed_step(),
            lambda p: p.enqueue("steer", user("s1", "try again")),
            lambda p: p.entry(user("s1", "try again")),
        ),
        requests=1,
    ),
    Case(
        "terminal-failure marker, a follow-up pending",
        chain(asked(), failed_step(), lambda p: p.enqueue("follow_up", user("f1", "and then"))),
        appended=("E f1 user and then", *DONE),
        requests=1,
    ),
    Case(
        "terminal-failure marker, only a deferred write pending: applied, still failed",
        chain(asked(), failed_step(), lambda p: p.write(custom("w1"))),
        outcomes=("failed invalid_request",),
        appended=("E w1 custom note", "R finished failed invalid_request"),
    ),
    Case(
        "an applied deferred-write error message is not a failure marker",
        chain(
            asked(),
            answered(),
            lambda p: p.write(assistant_error("w1")),
            lambda p: p.entry(assistant_error("w1")),
        ),
        appended=("R finished completed",),
    ),
    Case(
        "missing initial messages: none appended",
        chain(
            lambda p: p.enqueue("next_run", user("n1", "queued before")),
            lambda p: p.run(
                "run", user("n1", "queued before"), user("u1"), append=0, prompt=[user("u1")]
            ),
        ),
        appended=("E n1 user queued before", "E u1 user please help", *DONE),
        requests=1,
    ),
    Case(
        "missing initial messages: only some appended",
        chain(
            lambda p: p.enqueue("next_run", user("n1", "queued before")),
            lambda p: p.run(
                "run", user("n1", "queued before"), user("u1"), append=1, prompt=[user("u1")]
            ),
        ),
        appended=("E u1 user please help", *DONE),
        requests=1,
    ),
    Case(
        "pending steer after the answer: consumed, another turn",
        chain(asked(), answered(), lambda p: p.enqueue("steer", user("s1", "more detail"))),
        appended=("E s1 user more detail", *DONE),
        requests=1,
    ),
    Case(
        "cancelled steer: never appended",
        chain(
            asked(),
            answered(),
            lambda p: p.enqueue("steer", user("s1")),
            lambda p: p.cancel("s1"),
        ),
        appended=("R finished completed",),
    ),
    Case(
        "pending follow-up at the finish boundary",
        chain(asked(), answered(), lambda p: p.enqueue("follow_up", user("f1", "one more"))),
        appended=("E f1 user one more", *DONE),
        requests=1,
    ),
    Case(
        "next-run item queued during the run waits for the next run",
        chain(asked(), answered(), lambda p: p.enqueue("next_run", user("n2", "tomorrow"))),
        appended=("R finished completed",),
        check=next_run_pending("n2"),
    ),
    Case(
        "next-run item queued then cancelled during the run",
        chain(
            asked(),
            answered(),
            lambda p: p.enqueue("next_run", user("n2")),
            lambda p: p.cancel("n2", run_id=None),
        ),
        appended=("R finished completed",),
        check=next_run_pending(),
    ),
    Case(
        "idle lane: a next-run item after a finished run",
        chain(
            asked(),
            answered(),
            lambda p: p.finish(),
            lambda p: p.enqueue("next_run", user("n3", "later")),
        ),
        suspended=(),
        outcomes=(),
        appended=(),
        check=next_run_pending("n3"),
    ),
    Case(
        # Reference §9.1: only items after the newest run start are pending; an older one was
        # that run's to capture.
        "another writer: a next-run item older than the newest run, not captured",
        chain(
            lambda p: p.enqueue("next_run", user("n0")),
            asked(),
            answered(),
            lambda p: p.finish(),
        ),
        suspended=(),
        outcomes=(),
        appended=(),
        check=next_run_pending(),
    ),
    Case(
        "a deferred write pending at the crash",
        chain(asked(), answered(), lambda p: p.write(custom("w1"))),
        appended=("E w1 custom note", "R finished completed"),
    ),
    Case(
        "a deferred write pending during an unfinished step: applied at the next checkpoint",
        chain(asked(), lambda p: p.attempt(1, "a1"), lambda p: p.write(custom("w1"))),
        appended=(
            "R attempt assistant#2 ~",
            "R usage assistant",
            "E ~ assistant stop done",
            "E w1 custom note",
            "R finished completed",
        ),
        requests=1,
    ),
    Case(
        "a pending thinking-level write shapes the next request",
        chain(
            asked(),
            lambda p: p.write(ThinkingLevelChangeEntry(id="t1", thinking_level="high")),
        ),
        appended=("E t1 thinking_level_change high", *DONE),
        requests=1,
        check=lambda first, second: _thinking(first, "high"),
    ),
    Case(
        "usage adjustments and another lane's records interleaved",
        chain(
            lambda p: p.lane("other"),
            asked(),
            lambda p: p.usage(),
            lambda p: p.entry(user("o1"), "other"),
            lambda p: p.attempt(1, "a1"),
            lambda p: p.usage(lane="other"),
        ),
        appended=("R attempt assistant#2 ~", *DONE[1:]),
        requests=1,
    ),
]


async def _thinking(process: Process, level: str) -> None:
    assert [r.thinking_level for r in process.model.requests] == [level]


# -- abort before and after each durable point ----------------------------------------------

ABORTING = ("main run run crash aborting",)


def aborted_after(*steps: Build) -> Build:
    async def mark(p: Prefill) -> None:
        await p.abort()

    return chain(*steps, mark)


ABORT_CASES = [
    Case(
        "abort after operation_started: the initial message first",
        aborted_after(lambda p: p.run("run", user("u1"), append=0)),
        suspended=ABORTING,
        outcomes=("aborted",),
        appended=("E u1 user please help", *ABORTED),
    ),
    Case(
        "abort after the user message",
        aborted_after(asked()),
        suspended=ABORTING,
        outcomes=("aborted",),
        appended=ABORTED,
    ),
    Case(
        "abort after a step_attempt",
        aborted_after(asked(), lambda p: p.attempt(1, "a1")),
        suspended=ABORTING,
        outcomes=("aborted",),
        appended=ABORTED,
    ),
    Case(
        "abort after the tool calls (X1): every call reads aborted",
        aborted_after(asked(), batch(("c1", "a"), ("c2", "b"))),
        suspended=ABORTING,
        outcomes=("aborted",),
        appended=("E ~ result c1 error", "E ~ result c2 error", *ABORTED),
        tools={"a": "safe", "b": "safe"},
    ),
    Case(
        "abort after tool_started (X3): interrupted, even safe/safe",
        aborted_after(asked(), batch(("c1", "a"), ("c2", "b")), tool_state(1, 0, ("safe",))),
        suspended=ABORTING,
        outcomes=("aborted",),
        appended=("E res1 result c1 interrupted", "E ~ result c2 error", *ABORTED),
        tools={"a": "safe", "b": "safe"},
    ),
    Case(
        "abort after the tool result (X5)",
        aborted_after(asked(), batch(("c1", "a")), tool_state(1, 1, ("safe",))),
        suspended=ABORTING,
        outcomes=("aborted",),
        appended=ABORTED,
        tools={"a": "safe"},
    ),
    Case(
        "abort after the closing message: only the finish",
        chain(
            aborted_after(asked()),
            lambda p: p.entry(
                MessageEntry(
                    id="x1",
                    message=AssistantMessage(
                        content=(TextPart(text="(aborted)"),), stop_reason="aborted"
                    ),
                )
            ),
        ),
        suspended=ABORTING,
        outcomes=("aborted",),
        appended=("R finished aborted",),
    ),
    Case(
        "abort with queued steering and a follow-up: both killed",
        aborted_after(
            asked(),
            answered(),
            lambda p: p.enqueue("steer", user("s1")),
            lambda p: p.enqueue("follow_up", user("f1")),
        ),
        suspended=ABORTING,
        outcomes=("aborted",),
        appended=ABORTED,
    ),
    Case(
        "abort with a pending deferred write: applied first",
        aborted_after(asked(), answered(), lambda p: p.write(custom("w1"))),
        suspended=ABORTING,
        outcomes=("aborted",),
        appended=("E w1 custom note", *ABORTED),
    ),
    Case(
        "abort with missing initial messages and a captured next-run item",
        aborted_after(
            lambda p: p.enqueue("next_run", user("n1", "queued before")),
            lambda p: p.run(
                "run", user("n1", "queued before"), user("u1"), append=0, prompt=[user("u1")]
            ),
        ),
        suspended=ABORTING,
        outcomes=("aborted",),
        appended=("E n1 user queued before", "E u1 user please help", *ABORTED),
    ),
    Case(
        "abort after a deferred entry: best-effort cancel, no fetch",
        aborted_after(
            asked(), lambda p: p.attempt(1, "a1"), lambda p: p.entry(deferred_entry("a1"))
        ),
        suspended=("main run run deferred aborting handle=job-1",),
        outcomes=("aborted",),
        appended=ABORTED,
        check=cancelled("job-1"),
    ),
    Case(
        "abort while waiting for approval",
        aborted_after(
            asked(),
            batch(("c1", "deploy")),
            lambda p: p.approval_requested("a1", (0, "c1", "deploy")),
        ),
        suspended=ABORTING,
        outcomes=("aborted",),
        appended=("E ~ result c1 error", *ABORTED),
        tools={"deploy": "never"},
        approval=frozenset({"deploy"}),
    ),
    Case(
        "abort after an approval was decided, before the tool ran",
        aborted_after(
            asked(),
            batch(("c1", "deploy")),
            lambda p: p.approval_requested("a1", (0, "c1", "deploy")),
            lambda p: p.approval_decided(yes("c1")),
        ),
        suspended=ABORTING,
        outcomes=("aborted",),
        appended=("E ~ result c1 error", *ABORTED),
        tools={"deploy": "never"},
        approval=frozenset({"deploy"}),
    ),
    Case(
        "abort during a manual compaction's attempt",
        chain(
            history(),
            lambda p: p.compaction(),
            lambda p: p.attempt(1, "cmp", run_id="op", step="compaction", reason="manual"),
            lambda p: p.abort(run_id="op"),
        ),
        suspended=("main compaction op crash aborting",),
        outcomes=("aborted",),
        appended=("R finished aborted",),
    ),
    Case(
        "abort after a navigation's move: the lane stays moved",
        chain(
            history(),
            lambda p: p.navigation("h2", summary_entry_id="sum1"),
            lambda p: p.move("h2"),
            lambda p: p.abort(run_id="nav"),
        ),
        suspended=("main navigation nav crash aborting",),
        outcomes=("aborted",),
        appended=("R finished aborted",),
        check=leaf_is("h2"),
    ),
    Case(
        "another writer: two abort markers",
        aborted_after(aborted_after(asked())),
        suspended=ABORTING,
        outcomes=("aborted",),
        appended=ABORTED,
    ),
    Case(
        "abort accepted by the restarted process on a crashed step",
        chain(asked(), lambda p: p.attempt(1, "a1")),
        outcomes=("abort accepted",),
        appended=("R abort", *ABORTED),
        action=abort,
    ),
]


# -- deferred handles -------------------------------------------------------------------------

PARKED = ("main run run deferred handle=job-1",)


def parked() -> Build:
    return chain(asked(), lambda p: p.attempt(1, "a1"), lambda p: p.entry(deferred_entry("a1")))


DEFERRED_CASES = [
    Case(
        "deferred handle, still pending: nothing written, parked again",
        parked(),
        suspended=PARKED,
        outcomes=("suspended",),
        appended=(),
        still=PARKED,
    ),
    Case(
        "deferred handle, ready",
        parked(),
        suspended=PARKED,
        appended=("R usage deferred_fetch", "E ~ assistant stop ready now", "R finished completed"),
        fetches=(text("ready now"),),
    ),
    Case(
        "deferred handle, ready with a tool call",
        parked(),
        suspended=PARKED,
        appended=(
            "R usage deferred_fetch",
            "E ~ assistant tool_use calls=c1",
            "R tool_started c1 a never",
            "E ~ result c1 ok",
            *DONE,
        ),
        fetches=(tool_calls(("a", {}, "c1")),),
        tools={"a": "never"},
        executions={"a": 1},
        requests=1,
    ),
    Case(
        "deferred handle, ready, with steering accepted while parked",
        chain(parked(), lambda p: p.enqueue("steer", user("s1", "and be brief"))),
        suspended=PARKED,
        appended=(
            "R usage deferred_fetch",
            "E ~ assistant stop ready now",
            "E s1 user and be brief",
            *DONE,
        ),
        fetches=(text("ready now"),),
        requests=1,
    ),
    Case(
        "deferred handle, terminal (expired): failed, no replacement request",
        parked(),
        suspended=PARKED,
        outcomes=("failed expired",),
        appended=(
            "R usage deferred_fetch",
            "E ~ assistant error",
            "R finished failed expired",
        ),
        fetches=(error("expired", retryable=False),),
    ),
    Case(
        "deferred handle, the fetch raised: failed",
        parked(),
        suspended=PARKED,
        outcomes=("failed unknown",),
        appended=("R usage deferred_fetch", "E ~ assistant error", "R finished failed unknown"),
        rejecting_fetch=True,
    ),
    Case(
        # A provider anomaly is the lane's failure, not the harness's (issue 8, item 7): the
        # run fails and the handle is cancelled; nothing replaces it.
        "deferred handle, the provider returns another handle: the run fails",
        parked(),
        suspended=PARKED,
        outcomes=("failed provider_anomaly",),
        appended=("E ~ assistant error", "R finished failed provider_anomaly"),
        fetches=(deferred("job-2"),),
        check=fetched_then_cancelled("job-1"),
    ),
    Case(
        "deferred handle already redeemed, crash before the finish",
        chain(parked(), lambda p: p.entry(assistant_text("a2", "ready now"))),
        appended=("R finished completed",),
    ),
]


# -- navigation and manual compaction ---------------------------------------------------------


def navigating(*steps: Build, label: str | None = "here", summary: str | None = "sum1") -> Build:
    async def accept(p: Prefill) -> None:
        await p.navigation("h2", summary_entry_id=summary, label=label)

    return chain(history(), accept, *steps)


NAVIGATION = ("main navigation nav crash",)


async def summarized(p: Prefill) -> None:
    await p.entry(BranchSummaryEntry(id="sum1", from_id="h4", summary="a summary"))


LABEL = "F label h2=here"

STRUCTURAL_CASES = [
    Case(
        "navigation after operation_started: summary, move, summary entry, label",
        navigating(),
        suspended=NAVIGATION,
        appended=(
            "R attempt branch_summary#1 sum1",
            "R usage branch_summary",
            "L main h2",
            "E sum1 branch_summary from=h4",
            LABEL,
            "R finished completed",
        ),
        script=(text("a summary"),),
        requests=1,
        check=leaf_is("sum1"),
    ),
    Case(
        "navigation after its summary step_attempt: attempt 2, then the move",
        navigating(lambda p: p.attempt(1, "sum1", run_id="nav", step="branch_summary")),
        suspended=NAVIGATION,
        appended=(
            "R attempt branch_summary#2 sum1",
            "R usage branch_summary",
            "L main h2",
            "E sum1 branch_summary from=h4",
            LABEL,
            "R finished completed",
        ),
        script=(text("a summary"),),
        requests=1,
    ),
    Case(
        "navigation after the move: the summary is regenerated below the target",
        navigating(
            lambda p: p.attempt(1, "sum1", run_id="nav", step="branch_summary"),
            lambda p: p.move("h2"),
        ),
        suspended=NAVIGATION,
        appended=(
            "R attempt branch_summary#2 sum1",
            "R usage branch_summary",
            "E sum1 branch_summary from=h4",
            LABEL,
            "R finished completed",
        ),
        script=(text("a summary"),),
        requests=1,
        check=leaf_is("sum1"),
    ),
    Case(
        "navigation after a hook-supplied move (no attempt): the summary is generated",
        navigating(lambda p: p.move("h2")),
        suspended=NAVIGATION,
        appended=(
            "R attempt branch_summary#1 sum1",
            "R usage branch_summary",
            "E sum1 branch_summary from=h4",
            LABEL,
            "R finished completed",
        ),
        script=(text("a summary"),),
        requests=1,
    ),
    Case(
        "navigation after the summary entry: label, finish",
        navigating(lambda p: p.move("h2"), summarized),
        suspended=NAVIGATION,
        appended=(LABEL, "R finished completed"),
        check=leaf_is("sum1"),
    ),
    Case(
        "navigation after the label: finish (setting the label again is idempotent)",
        navigating(lambda p: p.move("h2"), summarized, lambda p: p.storage.set_label("h2", "here")),
        suspended=NAVIGATION,
        appended=(LABEL, "R finished completed"),
        check=leaf_is("sum1"),
    ),
    Case(
        "navigation without summary, after operation_started: move, label, finish",
        navigating(summary=None),
        suspended=NAVIGATION,
        appended=("L main h2", LABEL, "R finished completed"),
        check=leaf_is("h2"),
    ),
    Case(
        "navigation without summary, after the move",
        navigating(lambda p: p.move("h2"), summary=None, label=None),
        suspended=NAVIGATION,
        appended=("R finished completed",),
        check=leaf_is("h2"),
    ),
    Case(
        "navigation to the root, after the move",
        chain(
            history(),
            lambda p: p.navigation(None),
            lambda p: p.move(None),
        ),
        suspended=NAVIGATION,
        appended=("R finished completed",),
        check=leaf_is(None),
    ),
    Case(
        "manual compaction after operation_started",
        chain(history(), lambda p: p.compaction()),
        suspended=("main compaction op crash",),
        appended=(
            "R attempt compaction#1 cmp manual",
            "R usage compaction",
            "E cmp compaction",
            "R finished completed",
        ),
        script=(text("a summary"),),
        requests=1,
        compaction=SMALL_KEEP,
    ),
    Case(
        "manual compaction: a step attempt and no entry",
        chain(
            history(),
            lambda p: p.compaction(),
            lambda p: p.attempt(1, "cmp", run_id="op", step="compaction", reason="manual"),
        ),
        suspended=("main compaction op crash",),
        appended=(
            "R attempt compaction#2 cmp manual",
            "R usage compaction",
            "E cmp compaction",
            "R finished completed",
        ),
        script=(text("a summary"),),
        requests=1,
        compaction=SMALL_KEEP,
    ),
    Case(
        "manual compaction after its entry",
        chain(
            history(),
            lambda p: p.compaction(),
            lambda p: p.attempt(1, "cmp", run_id="op", step="compaction", reason="manual"),
            lambda p: p.entry(compaction_entry("cmp")),
        ),
        suspended=("main compaction op crash",),
        appended=("R finished completed",),
    ),
    Case(
        "manual compaction attempts at the cap: failed, no request",
        chain(
            history(),
            lambda p: p.compaction(),
            *(
                (
                    lambda p, n=n: p.attempt(
                        n, "cmp", run_id="op", step="compaction", reason="manual"
                    )
                )
                for n in (1, 2, 3)
            ),
        ),
        suspended=("main compaction op crash",),
        outcomes=("failed retries_exhausted",),
        appended=("R finished failed retries_exhausted",),
        compaction=SMALL_KEEP,
    ),
]


# -- approvals ----------------------------------------------------------------------------------


DEPLOY = {"deploy": "never"}
NEEDS = frozenset({"deploy"})


def waiting(*calls: tuple[str, str]) -> Build:
    return chain(
        asked(),
        batch(*(calls or (("c1", "deploy"),))),
    )


APPROVAL_CASES = [
    Case(
        "approval wait, decided by the restarted process",
        chain(waiting(), lambda p: p.approval_requested("a1", (0, "c1", "deploy"))),
        suspended=("main run run approval approvals=c1",),
        appended=(
            "R approval_decided c1+",
            "R tool_started c1 deploy never",
            "E ~ result c1 ok",
            *DONE,
        ),
        tools=DEPLOY,
        approval=NEEDS,
        action=decide(yes("c1")),
        executions={"deploy": 1},
        requests=1,
    ),
    Case(
        "approval wait, resumed without decisions: refused, nothing written",
        chain(waiting(), lambda p: p.approval_requested("a1", (0, "c1", "deploy"))),
        suspended=("main run run approval approvals=c1",),
        outcomes=("DecisionsRequired",),
        appended=(),
        tools=DEPLOY,
        approval=NEEDS,
        still=("main run run approval approvals=c1",),
        invariants=False,
    ),
    Case(
        "approval decided (approve), crash before the tool started",
        chain(
            waiting(),
            lambda p: p.approval_requested("a1", (0, "c1", "deploy")),
            lambda p: p.approval_decided(yes("c1")),
        ),
        appended=("R tool_started c1 deploy never", "E ~ result c1 ok", *DONE),
        tools=DEPLOY,
        approval=NEEDS,
        executions={"deploy": 1},
        requests=1,
    ),
    Case(
        "approval decided (deny), crash before the result",
        chain(
            waiting(),
            lambda p: p.approval_requested("a1", (0, "c1", "deploy")),
            lambda p: p.approval_decided(no("c1", "not today")),
        ),
        appended=("E ~ result c1 denied", *DONE),
        tools=DEPLOY,
        approval=NEEDS,
        requests=1,
    ),
    Case(
        "approved call started (never), no result: interrupted",
        chain(
            waiting(),
            lambda p: p.approval_requested("a1", (0, "c1", "deploy")),
            lambda p: p.approval_decided(yes("c1")),
            lambda p: p.started("a1", 0, "c1", "deploy", "res1", "never"),
        ),
        appended=("E res1 result c1 interrupted", *DONE),
        tools=DEPLOY,
        approval=NEEDS,
        requests=1,
    ),
    Case(
        "approved call started (safe/safe), no result: the old approval is not enough",
        chain(
            waiting(),
            lambda p: p.approval_requested("a1", (0, "c1", "deploy")),
            lambda p: p.approval_decided(yes("c1")),
            lambda p: p.started("a1", 0, "c1", "deploy", "res1", "safe"),
        ),
        outcomes=("suspended approvals=c1*",),
        appended=("R approval_requested c1*",),
        tools={"deploy": "safe"},
        approval=NEEDS,
        still=("main run run approval approvals=c1*",),
        invariants=False,
    ),
    Case(
        "approved call started (safe/safe): a new approval replays it",
        chain(
            waiting(),
            lambda p: p.approval_requested("a1", (0, "c1", "deploy")),
            lambda p: p.approval_decided(yes("c1")),
            lambda p: p.started("a1", 0, "c1", "deploy", "res1", "safe"),
        ),
        outcomes=("suspended approvals=c1*; completed",),
        appended=(
            "R approval_requested c1*",
            "R approval_decided c1+",
            "E res1 result c1 ok",
            *DONE,
        ),
        tools={"deploy": "safe"},
        approval=NEEDS,
        action=decide(yes("c1"), first=True),
        executions={"deploy": 1},
        requests=1,
    ),
    Case(
        "approval wait with steering accepted while waiting: decided, then the steer",
        chain(
            waiting(),
            lambda p: p.approval_requested("a1", (0, "c1", "deploy")),
            lambda p: p.enqueue("steer", user("s1", "and tell ops")),
        ),
        suspended=("main run run approval approvals=c1",),
        appended=(
            "R approval_decided c1+",
            "R tool_started c1 deploy never",
            "E ~ result c1 ok",
            "E s1 user and tell ops",
            *DONE,
        ),
        tools=DEPLOY,
        approval=NEEDS,
        action=decide(yes("c1")),
        executions={"deploy": 1},
        requests=1,
    ),
    Case(
        "mixed batch: the safe call answered, the approval denied",
        chain(
            waiting(("c1", "lookup"), ("c2", "deploy")),
            lambda p: p.started("a1", 0, "c1", "lookup", "res1", "safe"),
            lambda p: p.entry(tool_result("res1", "c1", "lookup")),
            lambda p: p.approval_requested("a1", (1, "c2", "deploy")),
        ),
        suspended=("main run run approval approvals=c2",),
        appended=("R approval_decided c2-", "E ~ result c2 denied", *DONE),
        tools={"lookup": "safe", "deploy": "never"},
        approval=NEEDS,
        action=decide(no("c2", "no")),
        requests=1,
    ),
    Case(
        "another writer: approval requested before the rest of the batch ran",
        chain(
            waiting(("c1", "lookup"), ("c2", "deploy")),
            lambda p: p.approval_requested("a1", (1, "c2", "deploy")),
        ),
        suspended=("main run run approval approvals=c2",),
        appended=(
            "R approval_decided c2+",
            "R tool_started c1 lookup safe",
            "E ~ result c1 ok",
            "R tool_started c2 deploy never",
            "E ~ result c2 ok",
            *DONE,
        ),
        tools={"lookup": "safe", "deploy": "never"},
        approval=NEEDS,
        action=decide(yes("c2")),
        executions={"lookup": 1, "deploy": 1},
        requests=1,
    ),
]


# -- several lanes ----------------------------------------------------------------------------

LANE_CASES = [
    Case(
        "two lanes: a crashed step and a parked deferred request, interleaved",
        chain(
            lambda p: p.lane("t1"),
            asked(),
            lambda p: p.run("run2", user("v1", "on t1"), lane="t1"),
            lambda p: p.attempt(1, "a1"),
            lambda p: p.attempt(1, "b1", run_id="run2", lane="t1"),
            lambda p: p.entry(deferred_entry("b1"), "t1"),
        ),
        suspended=("main run run crash", "t1 run run2 deferred handle=job-1"),
        outcomes=("completed", "suspended"),
        appended=("R attempt assistant#2 ~", *DONE[1:]),
        requests=1,
        still=("t1 run run2 deferred handle=job-1",),
    ),
    Case(
        "a corrupt lane is faulted; the session's other lane recovers",
        chain(
            lambda p: p.lane("bad"),
            lambda p: p.run("run9", user("v1"), lane="bad"),
            asked(),
            lambda p: p.attempt(1, "b1", run_id="run9", lane="bad"),
            lambda p: p.attempt(1, "a1"),
            lambda p: p.attempt(3, "b3", run_id="run9", lane="bad"),
        ),
        appended=("R attempt assistant#2 ~", *DONE[1:]),
        requests=1,
        faulted={"bad": "attempts_not_consecutive"},
        invariants=False,  # the faulted lane's run stays open
    ),
]


# -- corrupt states: restore faults the lane with the rule's reason (reference §3.5) ----------


def drop_first_finish(log: tuple[LogItem, ...]) -> list[LogItem]:
    """The log without its first `operation_finished`, renumbered (contiguous seq)."""
    index = next(
        i
        for i, item in enumerate(log)
        if isinstance(item, StoredRecord) and item.type == "operation_finished"
    )
    kept = [*log[:index], *log[index + 1 :]]
    return [item.model_copy(update={"seq": seq}) for seq, item in enumerate(kept, start=1)]


def corrupt(name: str, reason: CorruptionReason, *steps: Build, **kwargs: Any) -> Case:
    return Case(name, chain(*steps), corrupt=reason, **kwargs)


def two_runs() -> Build:
    async def build(p: Prefill) -> None:
        await p.run("r1", user("u0"))
        await p.finish(run_id="r1")
        await p.run("run", user("u1"))

    return build


CORRUPT_CASES = [
    corrupt(
        "two open operations (an imported log)",
        "multiple_open_operations",
        two_runs(),
        edit=drop_first_finish,
    ),
    corrupt(
        "a record names an operation that does not exist",
        "unknown_operation",
        asked(),
        lambda p: p.attempt(1, "a1", run_id="ghost"),
    ),
    corrupt(
        "a record of a finished operation after it finished",
        "unknown_operation",
        two_runs(),
        lambda p: p.attempt(1, "a0", run_id="r1"),
    ),
    corrupt(
        "attempts not consecutive (1 then 3)",
        "attempts_not_consecutive",
        asked(),
        lambda p: p.attempt(1, "a1"),
        lambda p: p.attempt(3, "a3"),
    ),
    corrupt(
        "a first attempt numbered 2",
        "attempts_not_consecutive",
        asked(),
        lambda p: p.attempt(2, "a2"),
    ),
    corrupt(
        "resume records not consecutive (2 then 4)",
        "attempts_not_consecutive",
        asked(),
        lambda p: p.resumed(2),
        lambda p: p.resumed(4),
    ),
    corrupt(
        "a compaction attempt without its reason",
        "compaction_reason",
        asked(),
        lambda p: p.attempt(1, "k1", step="compaction"),
    ),
    corrupt(
        "an assistant attempt with a compaction reason",
        "compaction_reason",
        asked(),
        lambda p: p.attempt(1, "a1", reason="threshold"),
    ),
    corrupt(
        "steering queued after the abort",
        "queue_after_abort",
        asked(),
        lambda p: p.abort(),
        lambda p: p.enqueue("steer", user("s1")),
    ),
    corrupt(
        "a cancel of an item never queued",
        "cancel_unknown_item",
        asked(),
        lambda p: p.cancel("nope"),
    ),
    corrupt(
        "a cancel of an item already consumed",
        "cancel_unknown_item",
        asked(),
        answered(),
        lambda p: p.enqueue("steer", user("s1")),
        lambda p: p.entry(user("s1")),
        lambda p: p.cancel("s1"),
    ),
    corrupt(
        "an idle lane's cancel of an unknown next-run item",
        "cancel_unknown_item",
        lambda p: p.cancel("nope", run_id=None),
    ),
    corrupt(
        "manual compaction attempts disagree on the result id",
        "structural_step_mismatch",
        history(),
        lambda p: p.compaction(),
        lambda p: p.attempt(1, "cmp", run_id="op", step="compaction", reason="manual"),
        lambda p: p.attempt(2, "cmp-2", run_id="op", step="compaction", reason="manual"),
    ),
    corrupt(
        "compaction attempts disagree on the reason",
        "structural_step_mismatch",
        asked(),
        lambda p: p.attempt(1, "k1", step="compaction", reason="threshold"),
        lambda p: p.attempt(2, "k1", step="compaction", reason="overflow"),
    ),
    corrupt(
        "tool_started with an index outside the batch",
        "tool_identity_mismatch",
        asked(),
        batch(("c1", "a")),
        lambda p: p.started("a1", 1, "c1", "a", "res1"),
    ),
    corrupt(
        "tool_started naming another tool",
        "tool_identity_mismatch",
        asked(),
        batch(("c1", "a")),
        lambda p: p.started("a1", 0, "c1", "b", "res1"),
    ),
    corrupt(
        "tool_started naming another call id",
        "tool_identity_mismatch",
        asked(),
        batch(("c1", "a")),
        lambda p: p.started("a1", 0, "c9", "a", "res1"),
    ),
    corrupt(
        "tool_started for an older batch",
        "tool_identity_mismatch",
        asked(),
        batch(("c1", "a")),
        lambda p: p.entry(tool_result("res1", "c1", "a")),
        lambda p: p.attempt(1, "a2"),
        lambda p: p.entry(tool_use("a2", ("c2", "a"))),
        lambda p: p.started("a1", 0, "c1", "a", "res9"),
    ),
    corrupt(
        "two tool_started for one invocation",
        "duplicate_tool_start",
        asked(),
        batch(("c1", "a")),
        lambda p: p.started("a1", 0, "c1", "a", "res1"),
        lambda p: p.started("a1", 0, "c1", "a", "res2"),
    ),
    corrupt(
        "an initial message stored with other content",
        "content_mismatch",
        lambda p: p.run("run", user("u1", "hello"), append=0),
        lambda p: p.entry(user("u1", "goodbye")),
    ),
    corrupt(
        "a steer consumed with other content",
        "content_mismatch",
        asked(),
        answered(),
        lambda p: p.enqueue("steer", user("s1", "this")),
        lambda p: p.entry(user("s1", "that")),
    ),
    corrupt(
        "a deferred write applied with other content",
        "content_mismatch",
        asked(),
        lambda p: p.write(custom("w1", data=1)),
        lambda p: p.entry(custom("w1", data=2)),
    ),
    corrupt(
        "a branch-summary step inside a run",
        "branch_summary_in_run",
        asked(),
        lambda p: p.attempt(1, "b1", step="branch_summary"),
    ),
    corrupt(
        "the lane was moved off its open run's path",
        "leaf_mismatch",
        lambda p: p.entries(user("u0"), user("x0")),
        lambda p: p.move("u0"),
        lambda p: p.entry(user("y0")),
        lambda p: p.move("x0"),
        asked(),
        lambda p: p.move("y0"),
    ),
    corrupt(
        "a decision without a wait",
        "approval_mismatch",
        waiting(),
        lambda p: p.approval_decided(yes("c1"), wait_id="no-such-wait"),
    ),
    corrupt(
        "a wait for a call that already has a result",
        "approval_mismatch",
        waiting(),
        lambda p: p.entry(tool_result("res1", "c1", "deploy")),
        lambda p: p.approval_requested("a1", (0, "c1", "deploy")),
    ),
    corrupt(
        "decisions naming other calls than the wait",
        "approval_mismatch",
        waiting(),
        lambda p: p.approval_requested("a1", (0, "c1", "deploy")),
        lambda p: p.approval_decided(yes("c7")),
    ),
    corrupt(
        "a decision answering an earlier, superseded wait",
        "approval_mismatch",
        waiting(),
        lambda p: p.approval_requested("a1", (0, "c1", "deploy")),
        lambda p: p.approval_decided(yes("c1")),
        lambda p: p.started("a1", 0, "c1", "deploy", "res1"),
        lambda p: p.entry(tool_result("res1", "c1", "deploy")),
        lambda p: p.attempt(1, "a2"),
        lambda p: p.entry(tool_use("a2", ("c2", "deploy"))),
        lambda p: p.approval_requested("a2", (0, "c2", "deploy")),
        lambda p: p.approval_decided(yes("c2"), wait_id=p.waits[0], key="k-2"),
    ),
    corrupt(
        "a decision for other arguments than the wait showed",
        "approval_mismatch",
        waiting(),
        lambda p: p.approval_requested("a1", (0, "c1", "deploy")),
        lambda p: p.approval_decided(approve("c1", args_digest=args_digest({"n": 1}))),
    ),
    corrupt(
        "a wait naming another tool batch",
        "approval_mismatch",
        waiting(),
        lambda p: p.approval_requested("u1", (0, "c1", "deploy")),
    ),
    corrupt(
        "a wait requested after the abort",
        "approval_mismatch",
        waiting(),
        lambda p: p.abort(),
        lambda p: p.approval_requested("a1", (0, "c1", "deploy")),
    ),
]

CASES = [
    *TOOL_CASES,
    *STEP_CASES,
    *FLOW_CASES,
    *ABORT_CASES,
    *DEFERRED_CASES,
    *STRUCTURAL_CASES,
    *APPROVAL_CASES,
    *LANE_CASES,
    *CORRUPT_CASES,
]


# -- running a case -------------------------------------------------------------------------------


async def prefill(case: Case, repo: SessionRepo) -> tuple[LogItem, ...]:
    """Write the case's state into session ``s`` (via a scratch session when it is edited)."""
    session = "scratch" if case.edit else "s"
    await repo.create(session)
    lease = await repo.acquire_lease(session, owner="prefill", ttl_ms=10**9)
    storage = await repo.open(session, lease=lease)
    await case.build(Prefill(storage))
    log = await storage.get_log()
    await storage.close()
    await repo.release_lease(lease)
    if case.edit is not None:
        await repo.import_session(SessionMetadata(id="s", created_at=1), case.edit(log))
        reader = await repo.open("s")
        log = await reader.get_log()
        await reader.close()
    return log


def make_tools(case: Case, counters: Counters, ran: list[tuple[str, dict[str, Any]]]) -> list[Tool]:
    tools = []
    for name, declared in case.tools.items():

        async def execute(args: Any, ctx: Any, name: str = name) -> str:
            counters.executions[name] += 1
            counters.invocations[ctx.idempotency_key] += 1
            ran.append((name, dict(args)))
            return f"{name} ran"

        tools.append(
            Tool(
                name=name,
                description=name,
                execute=execute,
                replay=declared,  # type: ignore[arg-type]
                requires_approval=name in case.approval,
            )
        )
    return tools


async def open_process(case: Case, repo: SessionRepo, number: int) -> Process:
    """A restarted process: a new lease, harness and model (the first gets the case's script)."""
    lease = await repo.acquire_lease("s", owner=f"process-{number}", ttl_ms=10**9)
    storage = await repo.open("s", lease=lease)
    kind = RejectingFetch if case.rejecting_fetch and number == 1 else ScriptedModel
    model = kind(
        script=case.script if number == 1 else (),
        fetches=case.fetches if number == 1 else (),
        info=case.info,
        known_models=case.known_models,
    )
    counters, ran = Counters(), list[tuple[str, dict[str, Any]]]()
    options = AgentHarnessOptions(
        storage=storage,
        model_client=model,
        model=MODEL,
        tools=make_tools(case, counters, ran),
        clock=ManualClock(),
        ids=SequentialIds(f"g{number}-"),
        retry=RetryPolicy(max_attempts=case.max_attempts, initial_delay_ms=0),
        compaction=case.compaction,
    )
    try:
        harness, suspended = await AgentHarness.create(options)
    except BaseException:
        await storage.close()
        await repo.release_lease(lease)
        raise
    return Process(harness, suspended, storage, lease, model, counters, ran)


def prompts(prefix: Sequence[LogItem]) -> dict[str, tuple[str, ...]]:
    """Each run's original prompt texts, from its `operation_started`."""
    found = {}
    for item in prefix:
        if isinstance(item, StoredRecord) and isinstance(item.record, OperationStarted):
            intent = item.record.intent
            if intent.kind == "run":
                found[item.record.id] = tuple(message_text(m) for m in intent.original_prompt)
    return found


async def fixed_point(process: Process) -> None:
    """Every restorable lane's live state equals a fresh reduction of the store."""
    runtime = process.harness._rt
    faulted = await faults(process)
    for info in await process.harness.lanes():
        live = runtime.lanes.get(info.name)  # a lane not in memory is the store's
        if info.name not in faulted and live is not None:
            assert await restore_lane(process.storage, info.name) == live.state


async def faults(process: Process) -> dict[str, str]:
    """Faulted lanes and the validity rule their restore broke (from `lanes()`)."""
    return {
        info.name: (info.fault or "").split(":")[0]
        for info in await process.harness.lanes()
        if info.status == "faulted"
    }


async def run_corrupt(case: Case, repo: SessionRepo, prefix: tuple[LogItem, ...]) -> None:
    """Restore refuses the lane: it is reported faulted with the rule's reason, every call on it
    raises `HarnessFault`, and nothing is written (the second process finds the same)."""
    for number in (1, 2):
        process = await open_process(case, repo, number)
        assert process.suspended == []
        info = {lane.name: lane for lane in await process.harness.lanes()}["main"]
        assert info.status == "faulted", info
        assert info.fault is not None and info.fault.startswith(f"{case.corrupt}: "), info.fault
        with pytest.raises(HarnessFault) as caught:
            await process.harness.resume()
        cause = caught.value.__cause__
        assert isinstance(cause, RecordLogCorruption) and cause.reason == case.corrupt
        assert await process.storage.get_log() == prefix
        await process.close(repo)


async def run_recovery(case: Case, repo: SessionRepo, prefix: tuple[LogItem, ...]) -> None:
    first = await open_process(case, repo, 1)
    assert [show_suspended(op) for op in first.suspended] == list(case.suspended)
    assert await faults(first) == dict(case.faulted)
    assert await first.storage.get_log() == prefix, "create() wrote something"
    if case.setup is not None:
        case.setup(first)
    asked_for = prompts(prefix)
    for op in first.suspended:
        if op.kind == "run":
            assert tuple(message_text(m) for m in op.prompt) == asked_for[op.id]
    outcomes = []
    for op in first.suspended:
        lane = await first.harness.lane(op.lane)
        assert lane is not None
        outcomes.append(await case.action(lane, op))
    assert outcomes == list(case.outcomes)
    log = await first.storage.get_log()
    assert log[: len(prefix)] == prefix
    assert render_log(log[len(prefix) :]) == list(case.appended)
    assert +first.counters.executions == Counter(case.executions)
    assert len(first.model.requests) == case.requests
    await fixed_point(first)
    if case.invariants:
        check_invariants(prefix, log, first.counters, case.tools, policy=case.policy)
    await first.close(repo)

    # a second process: the same operations (only a parked or waiting one is still open),
    # resumed again, change nothing
    second = await open_process(case, repo, 2)
    assert [show_suspended(op) for op in second.suspended] == list(case.still)
    assert await faults(second) == dict(case.faulted)
    for op in second.suspended:
        lane = await second.harness.lane(op.lane)
        assert lane is not None
        await lane.resume()
    assert await second.storage.get_log() == log, "a second recovery changed the log"
    assert not second.counters.executions and second.model.requests == []
    await fixed_point(second)
    if case.check is not None:
        await case.check(first, second)
    await second.close(repo)


def params() -> list[Any]:
    names = [case.name for case in CASES]
    assert len(set(names)) == len(names), "case names must be unique"
    return [
        pytest.param(
            case,
            id=case.name,
            marks=[pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else [],
        )
        for case in CASES
    ]


@pytest.mark.parametrize("case", params())
async def test_hand_built_state_recovers_twice(case: Case, backend: str, tmp_path: Path) -> None:
    repo = new_repo(backend, tmp_path, clock=ManualClock())
    try:
        prefix = await prefill(case, repo)
        if case.corrupt is not None:
            await run_corrupt(case, repo, prefix)
        else:
            await run_recovery(case, repo, prefix)
    finally:
        await repo.close()


def test_the_case_list_covers_every_corruption_reason_restore_can_meet() -> None:
    """Every `CorruptionReason` but writer/reducer drift (found by the self-check) has a case."""
    import typing

    reasons = set(typing.get_args(CorruptionReason)) - {"drift"}
    assert {case.corrupt for case in CASES if case.corrupt} == reasons
