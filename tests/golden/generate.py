"""Writes the golden session logs and their expectations. Run it only on purpose (README.md).

    .venv/bin/python -m tests.golden.generate [NAME...]        # write goldens that do not exist
    .venv/bin/python -m tests.golden.generate --check          # compare with the code only
    .venv/bin/python -m tests.golden.generate --expectations   # re-derive expectations of old logs
    .venv/bin/python -m tests.golden.generate --rewrite-logs   # overwrite existing logs too

Each scenario drives the real harness (memory store, `SequentialIds`, `ManualClock`, the
`ScriptedModel`) like a user would, and "crashes" a process by taking its log at a chosen
instant: a prefix of the log (a write either happened or not), or the log while a tool hangs (a
process that died in the middle of the call). A later process is a fresh session that imports
the crashed log, exactly as `AgentHarness.create()` after a restart would find it. The
expectation is then derived from the written log alone (`kit.check_session`, the same code
the test runs), so an expectation never depends on how its log was produced.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from importlib import metadata as package_metadata
from pathlib import Path
from typing import Any

from harness_core import (
    AgentHarness,
    Ok,
    Outcome,
    ScriptedModel,
    SessionRepo,
    SessionStorage,
    SuspendedOperation,
    TextPart,
    TokenUsage,
    UserMessage,
    approve,
    deny,
    open_repo,
)
from harness_core.session.codec import encode_log_item
from harness_core.session.entries import MessageEntry
from harness_core.session.records import (
    LaneConfiguration,
    OperationStarted,
    RunIntent,
    StepAttempt,
    ToolStarted,
)
from harness_core.session.types import LogItem, SessionMetadata, StoredRecord
from harness_core.testing import ManualClock
from tests.golden.kit import (
    GOLDEN_DIR,
    JSONL_FORMAT,
    MODEL,
    ToolBox,
    check_session,
    harness_options,
    read_golden,
    reply,
)

START_MS = 1_700_000_000_000
STEP_MS = 1_000
"""The writers' clock advances this much between two user actions."""

Spec = dict[str, Any]


# -- a writing process ------------------------------------------------------------------------


@dataclass
class Process:
    """One process writing a golden session on a memory store (until it "crashes")."""

    repo: SessionRepo
    storage: SessionStorage
    harness: AgentHarness
    suspended: list[SuspendedOperation]
    model: ScriptedModel
    toolbox: ToolBox
    clock: ManualClock
    pending: list[asyncio.Future[Any]] = field(default_factory=list)

    @classmethod
    async def start(
        cls,
        session_id: str,
        clock: ManualClock,
        generation: int,
        crashed: Sequence[LogItem] = (),
        meta: SessionMetadata | None = None,
    ) -> Process:
        """A new process: the first creates the session, later ones import a crashed log."""
        repo = open_repo("memory://", clock=clock)
        if meta is None:
            await repo.create(session_id, metadata={"golden": session_id})
        else:
            await repo.import_session(meta, crashed)
        lease = await repo.acquire_lease(session_id, owner=f"writer-{generation}", ttl_ms=10**9)
        storage = await repo.open(session_id, lease=lease)
        model = ScriptedModel()
        toolbox = ToolBox()
        harness, suspended = await AgentHarness.create(
            harness_options(storage, model, clock, f"g{generation}-", toolbox)
        )
        return cls(repo, storage, harness, suspended, model, toolbox, clock)

    def script(self, *replies: Spec) -> None:
        """The model's next replies (the previous script must have been used up)."""
        assert not self.model.script, f"unused script: {self.model.script}"
        self.model.script = [reply(spec) for spec in replies]

    async def ok(self, work: Awaitable[Any]) -> Any:
        """Await a harness call that must succeed; the clock then moves on."""
        result = await work
        assert isinstance(result, Ok), result
        assert not self.model.script, f"unused script: {self.model.script}"
        self.clock.advance(STEP_MS)
        return result.value

    async def done(self, work: Awaitable[Any]) -> Outcome:
        """Await an operation that must be accepted; its outcome."""
        outcome = await self.ok(work)
        assert isinstance(outcome, Outcome), outcome
        return outcome

    async def until_hung(self, work: Awaitable[Any], *call_ids: str) -> None:
        """Start `work` and return once the tool calls `call_ids` hang (the process will die)."""
        self.toolbox.hang.update(call_ids)
        task = asyncio.ensure_future(work)
        self.pending.append(task)
        async with asyncio.timeout(10):  # a store's thread may be slow on a loaded machine
            while not (set(call_ids) <= set(self.toolbox.hung) or task.done()):  # noqa: ASYNC110
                await asyncio.sleep(0.001)
        assert not task.done(), f"{call_ids} never hung: {task.result()}"
        assert set(call_ids) <= set(self.toolbox.hung), self.toolbox.hung
        self.toolbox.hung.clear()
        self.clock.advance(STEP_MS)

    async def log(self) -> list[LogItem]:
        """Everything this process made durable so far."""
        return list(await self.storage.get_log())

    async def metadata(self) -> SessionMetadata:
        """The session's metadata (its header)."""
        return await self.storage.get_metadata()

    async def crash(self) -> list[LogItem]:
        """The durable log at this instant; nothing this process does afterwards counts."""
        items = await self.log()
        await self.harness.close()
        for task in self.pending:
            task.cancel()
        await asyncio.gather(*self.pending, return_exceptions=True)
        await self.repo.close()
        return items


def upto(items: Sequence[LogItem], keep: Callable[[LogItem], bool]) -> list[LogItem]:
    """The prefix ending with the first item `keep` selects (a crash right after that write)."""
    for index, item in enumerate(items):
        if keep(item):
            return list(items[: index + 1])
    raise AssertionError("no item to crash after")


def is_record(record_type: str, **fields: Any) -> Callable[[LogItem], bool]:
    """Selects a record of `record_type` whose fields have the given values."""

    def select(item: LogItem) -> bool:
        if not isinstance(item, StoredRecord) or item.record.type != record_type:
            return False
        return all(getattr(item.record, k) == v for k, v in fields.items())

    return select


# -- the scenarios ----------------------------------------------------------------------------

Build = Callable[[str], Coroutine[Any, Any, tuple[SessionMetadata, list[LogItem]]]]


@dataclass(frozen=True)
class Scenario:
    """One golden log: what it covers, how it is written, and how the test resumes it."""

    about: str
    build: Build
    steps: list[Spec]


SLACK = "slack:C0GOLDEN:1700000000.000100"
EMAIL = "email:<golden-thread@example.com>"


async def finished_tool_run(session_id: str) -> tuple[SessionMetadata, list[LogItem]]:
    """Two finished runs, one with a tool that reports usage; facts, a config change, a credit."""
    clock = ManualClock(START_MS)
    p = await Process.start(session_id, clock, 1)
    h = p.harness
    await h.session.set_name("golden: a finished run")
    p.script(
        {"tool_calls": [["lookup", {"q": "deploy window"}, "call-lookup-1"]]},
        {"text": "The deploy window is Tuesday 10:00-12:00 UTC."},
    )
    first = await p.done(h.prompt("What is our deploy window?", entry_id="main:question-1"))
    assert first.final_entry_id is not None
    await h.session.set_label("main:question-1", "deploy window")
    await p.ok(
        h.record_usage(
            TokenUsage(input=-3, output=0, total_tokens=-3),
            entry_id=first.final_entry_id,
            details={"note": "provider credit"},
        )
    )
    await h.set_thinking_level("low")
    clock.advance(STEP_MS)
    created = await h.create_lane(SLACK, None)
    assert isinstance(created, Ok), created
    slack = created.value
    p.script({"text": "Hello from the Slack thread."})
    await p.done(slack.prompt("hi", entry_id=f"{SLACK}:msg-1"))
    return await p.metadata(), await p.crash()


async def crash_mid_tool(session_id: str) -> tuple[SessionMetadata, list[LogItem]]:
    """A run whose process died while a safe lookup and a never email were both running."""
    clock = ManualClock(START_MS)
    p = await Process.start(session_id, clock, 1)
    created = await p.harness.create_lane(EMAIL, None)
    assert isinstance(created, Ok), created
    lane = created.value
    p.script(
        {
            "tool_calls": [
                ["lookup", {"q": "incident 2024-11-30"}, "call-lookup-1"],
                ["send_email", {"to": "ops@example.com", "subject": "Incident"}, "call-email-1"],
            ]
        }
    )
    await p.until_hung(
        lane.prompt("Summarise yesterday's incident and email it to ops."),
        "call-lookup-1",
        "call-email-1",
    )
    started = [i.record for i in await p.log() if isinstance(i, StoredRecord)]
    names = [r.tool_name for r in started if isinstance(r, ToolStarted)]
    assert names == ["lookup", "send_email"], names  # both started, neither has a result
    return await p.metadata(), await p.crash()


async def approvals(session_id: str) -> tuple[SessionMetadata, list[LogItem]]:
    """One lane waits for an approval; another died right after its decision was recorded."""
    clock = ManualClock(START_MS)
    p = await Process.start(session_id, clock, 1)
    h = p.harness
    waiting = await h.create_lane("approval:waiting", None)
    decided = await h.create_lane("approval:decided", None)
    assert isinstance(waiting, Ok) and isinstance(decided, Ok)
    p.script(
        {
            "tool_calls": [
                ["lookup", {"q": "changelog 42"}, "call-w-lookup"],
                ["deploy", {"build": 42, "env": "prod"}, "call-w-deploy"],
            ]
        }
    )
    outcome = await p.done(waiting.value.prompt("Look up the changelog, then deploy build 42."))
    assert outcome.wait_id is not None and len(outcome.pending_approvals) == 1
    p.script(
        {
            "tool_calls": [
                ["deploy", {"build": 43, "env": "prod"}, "call-d-43"],
                ["deploy", {"build": 44, "env": "prod"}, "call-d-44"],
            ]
        }
    )
    outcome = await p.done(decided.value.prompt("Deploy builds 43 and 44."))
    pending = {call.tool_call_id: call for call in outcome.pending_approvals}
    p.script({"text": "Build 43 is deployed; 44 was denied."})
    await p.done(
        decided.value.resume(
            [approve(pending["call-d-43"]), deny(pending["call-d-44"], "not this week")],
            wait_id=outcome.wait_id,
            decided_by="ops@example.com",
            idempotency_key="golden-decision-43-44",
        )
    )
    meta = await p.metadata()
    crashed = upto(await p.crash(), is_record("approval_decided", lane="approval:decided"))
    return meta, crashed


async def counted_and_stuck(session_id: str) -> tuple[SessionMetadata, list[LogItem]]:
    """A run resumed once after a crash (attempt 2), and a run that crashed three times (stuck)."""
    clock = ManualClock(START_MS)
    p = await Process.start(session_id, clock, 1)
    counted = await p.harness.create_lane("ops:counted", None)
    stuck = await p.harness.create_lane("ops:stuck", None)
    assert isinstance(counted, Ok) and isinstance(stuck, Ok)
    p.script({"tool_calls": [["charge", {"order": 1001, "cents": 1299}, "call-c-charge"]]})
    await p.until_hung(counted.value.prompt("Charge order 1001."), "call-c-charge")
    p.script({"tool_calls": [["charge", {"order": 2002, "cents": 4500}, "call-s-charge"]]})
    await p.until_hung(stuck.value.prompt("Charge order 2002."), "call-s-charge")
    meta = await p.metadata()
    crashed = await p.crash()

    # process 2: both runs resume (attempt 2); each model checks the ledger, which hangs
    p = await Process.start(session_id, clock, 2, crashed, meta)
    assert [op.attempts for op in p.suspended] == [1, 1]
    for lane, ledger in (("ops:counted", "call-c-ledger"), ("ops:stuck", "call-s-ledger")):
        resumed = await p.harness.lane(lane)
        assert resumed is not None
        order = 1001 if lane == "ops:counted" else 2002
        p.script({"tool_calls": [["lookup", {"q": f"ledger order {order}"}, ledger]]})
        await p.until_hung(resumed.resume(), ledger)
    crashed = await p.crash()

    # process 3: only the stuck lane resumes (attempt 3); the safe lookup replays and hangs again
    p = await Process.start(session_id, clock, 3, crashed, meta)
    resumed = await p.harness.lane("ops:stuck")
    assert resumed is not None
    await p.until_hung(resumed.resume(), "call-s-ledger")
    return meta, await p.crash()


async def deferred_and_queues(session_id: str) -> tuple[SessionMetadata, list[LogItem]]:
    """A run parked on a background request, with steer, follow-up, next-run, a cancelled
    steer and two deferred writes waiting for its next checkpoint."""
    clock = ManualClock(START_MS)
    p = await Process.start(session_id, clock, 1)
    created = await p.harness.create_lane("bg:report", None)
    assert isinstance(created, Ok), created
    lane = created.value
    p.script({"deferred": "job-q3-report"})
    outcome = await p.done(lane.prompt("Write the Q3 report."))
    assert outcome.kind == "suspended", outcome
    await p.ok(lane.steer("Use the EU figures.", entry_id="bg:steer-eu"))
    cancelled = await p.ok(lane.steer("Ignore the EU figures."))
    await p.ok(lane.cancel_queued(cancelled))
    await p.ok(lane.follow_up("Then list the open risks."))
    await p.ok(lane.next_run("Next time, start with the summary.", entry_id="bg:next-1"))
    await lane.session.append_custom_entry("report_meta", {"quarter": "Q3", "draft": 1})
    await lane.set_thinking_level("high")
    return await p.metadata(), await p.crash()


async def compaction_navigation(session_id: str) -> tuple[SessionMetadata, list[LogItem]]:
    """Turns, a manual compaction, a navigation with a branch summary and a label, then a second
    navigation whose process died during its summary request."""
    clock = ManualClock(START_MS)
    p = await Process.start(session_id, clock, 1)
    h = p.harness
    answers = []
    for topic, answer in (
        ("Alpha", "Alpha is the billing rewrite; it ships in March with a budget of 40k."),
        ("Beta", "Beta is the search migration; it is blocked on the index rebuild."),
        ("Gamma", "Gamma is the mobile app refresh; design review is next week."),
    ):
        p.script({"text": answer})
        outcome = await p.done(h.prompt(f"Tell me about project {topic}."))
        answers.append(outcome.final_entry_id)
    p.script({"text": "Projects Alpha (billing, March), Beta (search, blocked) and Gamma."})
    compacted = await p.done(h.compact("Keep the project names."))
    assert compacted.kind == "completed", compacted
    p.script({"text": "Discussed Beta and Gamma after Alpha."})
    assert answers[0] is not None
    navigated = await p.done(h.navigate_tree(answers[0], summarize=True, label="alpha"))
    assert navigated.kind == "completed", navigated
    p.script({"text": "Alpha's budget is 40k."})
    await p.done(h.prompt("Back to Alpha: what is its budget?"))
    p.script({"text": "Asked for Alpha's budget: 40k."})
    assert compacted.entry_id is not None
    await p.done(h.navigate_tree(compacted.entry_id, summarize=True, label="compacted"))
    items = await p.log()
    meta = await p.metadata()
    await p.crash()
    summaries = [i for i in items if is_record("step_attempt", step="branch_summary")(i)]
    assert len(summaries) == 2
    crashed = upto(items, lambda item: item is summaries[1])
    return meta, crashed


async def impossible_lanes(session_id: str) -> tuple[SessionMetadata, list[LogItem]]:
    """A healthy lane beside two lanes no single writer could have left: a step attempt 2
    without attempt 1 (written through the storage API) and two open operations (imported)."""
    clock = ManualClock(START_MS)
    p = await Process.start(session_id, clock, 1)
    p.script({"text": "pong"})
    await p.done(p.harness.prompt("ping"))
    await p.harness.create_lane("broken:attempts", None)
    await p.harness.create_lane("broken:two-open", None)
    storage = p.storage
    config = LaneConfiguration(provider=MODEL.provider, model_id=MODEL.model_id)

    def run_start(lane: str, run_id: str, entry_id: str, text: str) -> OperationStarted:
        message = UserMessage(content=(TextPart(text=text),))
        return OperationStarted(
            id=run_id,
            lane=lane,
            source_leaf_id=None,
            intent=RunIntent(
                original_prompt=(message,),
                initial_messages=(MessageEntry(id=entry_id, message=message),),
            ),
            configuration=config,
        )

    # another writer: its step attempt 2 has no attempt 1
    other = run_start("broken:attempts", "other-run-1", "other-user-1", "count to three")
    await storage.append_record(other)
    assert isinstance(other.intent, RunIntent)
    await storage.append_entry(other.intent.initial_messages[0], "broken:attempts")
    await storage.append_record(
        StepAttempt(
            id="other-step-2",
            lane="broken:attempts",
            run_id="other-run-1",
            step="assistant",
            attempt=2,
            result_entry_id="other-answer-1",
        )
    )
    clock.advance(STEP_MS)
    await storage.append_record(
        run_start("broken:two-open", "other-run-2", "other-user-2", "first of two")
    )
    items = await p.log()
    meta = await p.metadata()
    await p.crash()
    # the contract refuses a second open operation (lane_busy), an imported log may hold one
    second = StoredRecord(
        seq=items[-1].seq + 1,
        timestamp=clock.now_ms(),
        record=run_start("broken:two-open", "other-run-3", "other-user-3", "second of two"),
    )
    return meta, [*items, second]


SCENARIOS: dict[str, Scenario] = {
    "finished-tool-run": Scenario(
        about="Two finished runs on two lanes (main, a Slack thread) with a tool that reports "
        "usage, a usage adjustment, a name and a label fact, a thinking-level change made while "
        "idle, and caller-chosen input ids. Resume finds nothing to do; a repeated input id is "
        "answered from the log without a write; a new prompt sees the restored context.",
        build=finished_tool_run,
        steps=[
            {"lane": "main", "call": "resume"},
            {
                "lane": SLACK,
                "call": "prompt",
                "args": {"text": "hi", "entry_id": f"{SLACK}:msg-1"},
            },
            {
                "lane": "main",
                "call": "prompt",
                "args": {"text": "And the change freeze?"},
                "script": [{"text": "The freeze starts on December 15."}],
            },
        ],
    ),
    "crash-mid-tool": Scenario(
        about="A run whose process died while both calls of a parallel batch ran: a "
        "replay='safe' lookup and a replay='never' send_email, each with a tool_started and no "
        "result. Resume counts attempt 2, runs the lookup again, never runs send_email (its "
        "result is the INTERRUPTED text) and lets the model answer.",
        build=crash_mid_tool,
        steps=[
            {
                "lane": EMAIL,
                "call": "resume",
                "script": [{"text": "I cannot confirm the email went out; please check."}],
            },
            {"lane": EMAIL, "call": "resume"},
        ],
    ),
    "approvals": Scenario(
        about="approval:waiting waits on an approval_requested (its wait id, the argument "
        "digest) after the batch's safe lookup ran; approval:decided died right after its "
        "approval_decided (approve one call, deny the other). Resume without decisions is "
        "refused; decisions naming the wait are recorded and run the call; the same key "
        "replays the result without a write; the decided run resumes and runs what was approved.",
        build=approvals,
        steps=[
            {"lane": "approval:waiting", "call": "resume"},
            {
                "lane": "approval:waiting",
                "call": "resume",
                "args": {
                    "wait_id": "<wait>",
                    "decided_by": "ops@example.com",
                    "idempotency_key": "golden-decision-42",
                    "decisions": "<approve all>",
                },
                "script": [{"text": "Build 42 is deployed."}],
            },
            {
                "lane": "approval:waiting",
                "call": "resume",
                "args": {
                    "wait_id": "<wait>",
                    "decided_by": "ops@example.com",
                    "idempotency_key": "golden-decision-42",
                    "decisions": "<approve all>",
                },
            },
            {
                "lane": "approval:decided",
                "call": "resume",
                "script": [{"text": "Build 43 is deployed; 44 was denied."}],
            },
        ],
    ),
    "counted-and-stuck": Scenario(
        about="ops:counted was resumed once after a crash (operation_resumed attempt 2) and died "
        "again in a safe ledger lookup; ops:stuck died three times (attempts 3 = max_attempts): "
        "it is stuck. Resume of the counted lane is attempt 3 and replays the lookup; the stuck "
        "lane refuses a plain resume (LaneStuck) and completes with unstick=True.",
        build=counted_and_stuck,
        steps=[
            {
                "lane": "ops:counted",
                "call": "resume",
                "script": [{"text": "Order 1001 was charged once; nothing more to do."}],
            },
            {"lane": "ops:stuck", "call": "resume"},
            {
                "lane": "ops:stuck",
                "call": "resume",
                "args": {"unstick": True},
                "script": [{"text": "Order 2002 was charged once."}],
            },
        ],
    ),
    "deferred-and-queues": Scenario(
        about="A run parked on a deferred (background) model request, holding a pending steer, "
        "a steer that was cancelled, a follow-up, a next-run item and two deferred writes (a "
        "custom entry, a thinking-level change). Resume fetches the answer, applies the writes, "
        "consumes the steer and the follow-up; the next prompt starts with the next-run item.",
        build=deferred_and_queues,
        steps=[
            {
                "lane": "bg:report",
                "call": "resume",
                "fetches": [{"text": "Q3 report draft."}],
                "script": [
                    {"text": "Q3 report, EU figures."},
                    {"text": "Open risks: supplier delays."},
                ],
            },
            {
                "lane": "bg:report",
                "call": "prompt",
                "args": {"text": "Now the Q4 outlook."},
                "script": [{"text": "Summary first: Q4 looks flat."}],
            },
        ],
    ),
    "compaction-navigation": Scenario(
        about="Three turns, a manual compaction, a navigation back to the first answer with a "
        "branch summary and a label, a turn on the new branch, then a second navigation whose "
        "process died after its branch-summary step_attempt. Resume completes the navigation "
        "(summary, leaf move, label); the next prompt sees the compaction and branch summaries.",
        build=compaction_navigation,
        steps=[
            {
                "lane": "main",
                "call": "resume",
                "script": [{"text": "Asked for Alpha's budget: 40k."}],
            },
            {
                "lane": "main",
                "call": "prompt",
                "args": {"text": "Where were we?"},
                "script": [{"text": "We were on the compacted thread: Alpha, Beta, Gamma."}],
            },
        ],
    ),
    "impossible-lanes": Scenario(
        about="main is healthy; broken:attempts holds a step attempt 2 without attempt 1 "
        "(attempts_not_consecutive) and broken:two-open two open operations "
        "(multiple_open_operations, representable only by import). Both restore faulted, every "
        "call on them raises HarnessFault, and main keeps working.",
        build=impossible_lanes,
        steps=[
            {"lane": "broken:attempts", "call": "resume"},
            {"lane": "broken:two-open", "call": "resume"},
            {
                "lane": "main",
                "call": "prompt",
                "args": {"text": "ping again"},
                "script": [{"text": "pong again"}],
            },
        ],
    ),
}


# -- writing ----------------------------------------------------------------------------------


def log_text(meta: SessionMetadata, items: Sequence[LogItem]) -> str:
    """The JSONL backend's file for this session: its header line, then one item per line."""
    header = {
        "kind": "header",
        "format": JSONL_FORMAT,
        "metadata": meta.model_dump(mode="json", exclude={"name"}),
    }
    lines = [json.dumps(header, ensure_ascii=False), *(encode_log_item(i) for i in items)]
    return "\n".join(lines) + "\n"


async def _concrete_steps(path: Path, steps: Sequence[Spec]) -> list[Spec]:
    """Fill the placeholders a scenario cannot know before its log exists (the wait's id and
    the decisions for its pending calls), from a restore of the written log."""
    golden = read_golden(path)
    clock = ManualClock()
    repo = open_repo("memory://", clock=clock)
    await repo.import_session(golden.metadata, golden.items)
    restore, _ = await check_session(repo, golden.name, clock, [])
    await repo.close()
    waits = {op["lane"]: op for op in restore["suspended"] if op["reason"] == "approval"}
    concrete = []
    for step in steps:
        args = dict(step.get("args", {}))
        if args.get("wait_id") == "<wait>":
            args["wait_id"] = waits[step["lane"]]["wait_id"]
        if args.get("decisions") == "<approve all>":
            args["decisions"] = [
                approve(call["tool_call_id"], args_digest=call["args_digest"]).model_dump(
                    mode="json", exclude_none=True
                )
                for call in waits[step["lane"]]["pending_approvals"]
            ]
        concrete.append({**step, "args": args} if args else dict(step))
    return concrete


async def expectation_for(name: str, scenario: Scenario, directory: Path) -> str:
    """The expectation file of a written log: what the current code restores and resumes."""
    path = directory / f"{name}.jsonl"
    golden = read_golden(path)
    steps = await _concrete_steps(path, scenario.steps)
    clock = ManualClock()
    repo = open_repo("memory://", clock=clock)
    await repo.import_session(golden.metadata, golden.items)
    restore, results = await check_session(repo, name, clock, steps)
    await repo.close()
    for step, result in zip(steps, results, strict=True):
        assert result["script_left"] == 0, f"{name}: unused script in {step}"
    expectation = {
        "about": scenario.about,
        "written_by": f"durable-gateway {package_metadata.version('durable-gateway')}",
        "format": golden.header["format"],
        "session_id": golden.metadata.id,
        "items": len(golden.items),
        "restore": restore,
        "resume": [{**step, "expect": result} for step, result in zip(steps, results, strict=True)],
    }
    return dump_json(expectation) + "\n"


ONE_PER_LINE = frozenset({"writes", "messages", "lanes", "lanes_after", "tool_runs", "script"})
"""Lists shown one element per line (a diff of an expectation then names one write each)."""


def dump_json(value: Any, key: str | None = None, indent: str = "") -> str:
    """JSON for reading and reviewing: short values on one line, the lists above one element
    per line, everything else indented by one space per level."""
    flat = json.dumps(value, ensure_ascii=False)
    if not isinstance(value, dict | list) or not value or len(indent) + len(flat) <= 96:
        return flat
    inner = indent + " "
    if isinstance(value, list):
        if key in ONE_PER_LINE:
            items = [inner + json.dumps(v, ensure_ascii=False) for v in value]
        else:
            items = [inner + dump_json(v, None, inner) for v in value]
    else:
        items = [f"{inner}{json.dumps(k)}: {dump_json(v, k, inner)}" for k, v in value.items()]
    opening, closing = ("[", "]") if isinstance(value, list) else ("{", "}")
    return opening + "\n" + ",\n".join(items) + "\n" + indent + closing


def _report(path: Path, new: str) -> bool:
    """Print how `path` differs from `new`; True when they are the same."""
    old = path.read_text() if path.exists() else ""
    if old == new:
        return True
    diff = difflib.unified_diff(
        old.splitlines(), new.splitlines(), str(path), "regenerated", lineterm="", n=1
    )
    print("\n".join(list(diff)[:40]))
    return False


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or check) the golden logs and expectations; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m tests.golden.generate")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="compare only, write nothing")
    mode.add_argument(
        "--expectations", action="store_true", help="re-derive the expectations of existing logs"
    )
    mode.add_argument("--rewrite-logs", action="store_true", help="overwrite existing logs too")
    parser.add_argument("--dir", type=Path, default=GOLDEN_DIR, help="(default: tests/golden)")
    parser.add_argument("names", nargs="*", help="scenarios (default: all)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenarios {unknown}; known: {sorted(SCENARIOS)}")
    directory: Path = args.dir
    directory.mkdir(parents=True, exist_ok=True)
    same = True
    for name in args.names or list(SCENARIOS):
        scenario = SCENARIOS[name]
        log_path = directory / f"{name}.jsonl"
        expected_path = directory / f"{name}.expected.json"
        exists = log_path.exists()
        if args.expectations and not exists:
            print(f"{log_path}: no such log (write it first)")
            continue
        if exists and not (args.check or args.expectations or args.rewrite_logs):
            print(f"{log_path}: exists, kept (see README.md before passing any option)")
            continue
        if not args.expectations:  # write (or, with --check, compare) the log itself
            meta, items = asyncio.run(scenario.build(name))
            text = log_text(meta, items)
            if args.check:
                same = _report(log_path, text) and same
            else:
                log_path.write_text(text)
                print(f"wrote {log_path} ({len(items)} items)")
        if args.check and not exists:
            continue
        expected = asyncio.run(expectation_for(name, scenario, directory))
        if args.check:
            same = _report(expected_path, expected) and same
        else:
            expected_path.write_text(expected)
            print(f"wrote {expected_path}")
    if args.check:
        print("golden files match the current code" if same else "golden files differ")
        return 0 if same else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
