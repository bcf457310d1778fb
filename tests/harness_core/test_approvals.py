"""Approvals (DESIGN §4.6): suspend, decide exactly the pending calls, one durable record first."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from harness_core.approvals import approve, args_digest, deny
from harness_core.context import message_text
from harness_core.messages import ToolResultMessage
from harness_core.result import Err, Ok
from harness_core.scripted import text, tool_calls
from harness_core.session.records import ApprovalDecided, ApprovalRequested, ToolStarted
from harness_core.session.types import LogItem, StoredEntry, StoredRecord
from harness_core.tools import Tool, ToolContext, tool
from tests.support.harness_kit import Kit, make_kit

pytestmark = pytest.mark.parametrize("backend", ["memory", "sqlite"])


class Deploy(BaseModel):
    build: int


class Effects:
    """What the tools did (the outside world)."""

    def __init__(self) -> None:
        self.deployed: list[int] = []
        self.looked = 0

    def tools(self, *, deploy_replay: str = "never") -> list[Tool]:
        @tool(requires_approval=True, replay=deploy_replay)  # type: ignore[arg-type]
        async def deploy(args: Deploy, ctx: ToolContext) -> str:
            """Deploy a build."""
            self.deployed.append(args.build)
            return f"deployed {args.build}"

        @tool(replay="safe")
        async def lookup(args: dict[str, Any], ctx: ToolContext) -> str:
            """Look something up."""
            self.looked += 1
            return "green"

        return [deploy, lookup]


MIXED = tool_calls(("lookup", {}, "c1"), ("deploy", {"build": 42}, "c2"))


def refused(result: Any, tag: str) -> Any:
    """The rejection of an `Err` result with this tag."""
    assert isinstance(result, Err) and result.error.tag == tag, result
    return result.error


def items(log: tuple[LogItem, ...], kind: str) -> list[Any]:
    return [i for i in log if isinstance(i, StoredRecord) and i.type == kind]


async def waiting_kit(backend: str, tmp_path: Path, effects: Effects, *script: Any) -> Kit:
    kit = await make_kit(backend, tmp_path, [MIXED, *script], tools=effects.tools())
    outcome = await kit.harness.prompt("ship 42")
    assert isinstance(outcome, Ok) and outcome.value.kind == "suspended"
    assert [p.tool_call_id for p in outcome.value.pending_approvals] == ["c2"]
    return kit


async def test_an_approval_call_waits_until_the_rest_of_its_batch_settled(
    backend: str, tmp_path: Path
) -> None:
    effects = Effects()
    kit = await waiting_kit(backend, tmp_path, effects)
    log = await kit.storage.get_log()
    requested = items(log, "approval_requested")
    assert len(requested) == 1 and effects.deployed == [] and effects.looked == 1
    record = requested[0].record
    assert isinstance(record, ApprovalRequested)
    (pending,) = record.calls
    assert (pending.tool_name, dict(pending.args)) == ("deploy", {"build": 42})
    assert pending.args_digest == args_digest({"build": 42})
    lookup_result = next(
        i.seq for i in log if isinstance(i, StoredEntry) and "green" in str(i.entry)
    )
    assert lookup_result < requested[0].seq  # the other call settled first
    assert [r.record.tool_name for r in items(log, "tool_started")] == ["lookup"]
    lanes = await kit.harness.lanes()
    assert [(lane.name, lane.status) for lane in lanes] == [("main", "suspended")]


async def test_resume_needs_exactly_the_pending_decisions(backend: str, tmp_path: Path) -> None:
    effects = Effects()
    kit = await waiting_kit(backend, tmp_path, effects)
    before = len(await kit.storage.get_log())
    required = refused(await kit.harness.resume(), "DecisionsRequired")
    assert [p.tool_call_id for p in required.pending] == ["c2"]
    wrong = refused(await kit.harness.resume([approve("c9")]), "DecisionsMismatch")
    assert (wrong.missing, wrong.unexpected) == (("c2",), ("c9",))
    twice = await kit.harness.resume([approve("c2"), deny("c2", "no")])
    assert refused(twice, "DecisionsMismatch").reason == "duplicate"
    bad = await kit.harness.resume([approve("c2", args={"build": "latest"})])
    assert refused(bad, "DecisionsMismatch").reason == "invalid_arguments"
    assert len(await kit.storage.get_log()) == before  # refusals write nothing
    busy = await kit.harness.prompt("something else")
    assert isinstance(busy, Err) and busy.error.tag == "LaneBusy"  # the wait holds the lane


async def test_an_approved_call_runs_after_its_durable_decision(
    backend: str, tmp_path: Path
) -> None:
    effects = Effects()
    kit = await waiting_kit(backend, tmp_path, effects, text("done"))
    resumed = await kit.harness.resume([approve("c2")], decided_by="U_ALICE", idempotency_key="k1")
    assert isinstance(resumed, Ok) and resumed.value.kind == "completed"
    assert effects.deployed == [42] and effects.looked == 1
    log = await kit.storage.get_log()
    (decided,) = items(log, "approval_decided")
    record = decided.record
    assert isinstance(record, ApprovalDecided)
    assert (record.decided_by, record.idempotency_key) == ("U_ALICE", "k1")
    deploy_start = next(r for r in items(log, "tool_started") if r.record.tool_name == "deploy")
    assert decided.seq < deploy_start.seq  # decided before anything ran
    result = kit.model.requests[-1].messages[-1]
    assert isinstance(result, ToolResultMessage) and message_text(result) == "deployed 42"


async def test_approve_with_override_arguments(backend: str, tmp_path: Path) -> None:
    effects = Effects()
    kit = await waiting_kit(backend, tmp_path, effects, text("done"))
    resumed = await kit.harness.resume([approve("c2", args={"build": 43})])
    assert isinstance(resumed, Ok)
    assert effects.deployed == [43]
    start = next(
        r.record
        for r in items(await kit.storage.get_log(), "tool_started")
        if r.record.tool_name == "deploy"
    )
    assert isinstance(start, ToolStarted) and dict(start.effective_args) == {"build": 43}


async def test_a_denied_call_gets_a_denied_result_the_model_reads(
    backend: str, tmp_path: Path
) -> None:
    effects = Effects()
    kit = await waiting_kit(backend, tmp_path, effects, text("ok, not deploying"))
    resumed = await kit.harness.resume([deny("c2", "not on a Friday")], decided_by="U_BOB")
    assert isinstance(resumed, Ok) and resumed.value.kind == "completed"
    assert effects.deployed == []
    result = kit.model.requests[-1].messages[-1]
    assert isinstance(result, ToolResultMessage) and result.outcome == "denied"
    assert message_text(result) == "This tool call was denied by U_BOB: not on a Friday"
    started = [r.record.tool_name for r in items(await kit.storage.get_log(), "tool_started")]
    assert started == ["lookup"]


async def test_the_same_key_replays_the_same_result(backend: str, tmp_path: Path) -> None:
    effects = Effects()
    kit = await waiting_kit(backend, tmp_path, effects, text("done"))
    first = await kit.harness.resume([approve("c2")], idempotency_key="click-1")
    again = await kit.harness.resume([approve("c2")], idempotency_key="click-1")
    assert isinstance(first, Ok) and isinstance(again, Ok)
    assert (again.value.run_id, again.value.kind) == (first.value.run_id, "completed")
    assert effects.deployed == [42]
    other = await kit.harness.resume([deny("c2", "changed my mind")], idempotency_key="click-2")
    assert isinstance(other, Err) and other.error.tag == "NothingToResume"


async def test_new_input_queues_and_never_closes_the_wait(backend: str, tmp_path: Path) -> None:
    effects = Effects()
    kit = await waiting_kit(backend, tmp_path, effects, text("deployed, and noted"))
    steered = await kit.harness.steer("also tell ops")
    assert isinstance(steered, Ok)
    lanes = await kit.harness.lanes()
    assert lanes[0].status == "suspended"
    resumed = await kit.harness.resume([approve("c2")])
    assert isinstance(resumed, Ok) and resumed.value.kind == "completed"
    seen = [message_text(m) for m in kit.model.requests[-1].messages]
    assert seen.index("deployed 42") < seen.index("also tell ops")  # after the batch


async def test_abort_closes_the_wait(backend: str, tmp_path: Path) -> None:
    effects = Effects()
    kit = await waiting_kit(backend, tmp_path, effects)
    assert isinstance(await kit.harness.abort(), Ok)
    await kit.harness.wait_for_idle()
    assert effects.deployed == []
    log = await kit.storage.get_log()
    assert [r.record.outcome for r in items(log, "operation_finished")] == ["aborted"]
    late = await kit.harness.resume([approve("c2")])
    assert isinstance(late, Err) and late.error.tag == "NothingToResume"


async def test_a_restarted_process_sees_the_wait_and_takes_decisions(
    backend: str, tmp_path: Path
) -> None:
    effects = Effects()
    kit = await waiting_kit(backend, tmp_path, effects)
    reopened = await kit.reopen(script=[text("done")], tools=effects.tools())
    (suspended,) = reopened.suspended
    assert suspended.reason == "approval"
    assert [p.tool_call_id for p in suspended.pending_approvals] == ["c2"]
    resumed = await reopened.harness.resume([approve("c2")])
    assert isinstance(resumed, Ok) and resumed.value.kind == "completed"
    assert effects.deployed == [42]


async def test_a_crash_after_the_decision_runs_the_call_once(backend: str, tmp_path: Path) -> None:
    effects = Effects()
    kit = await waiting_kit(backend, tmp_path, effects)
    gate = asyncio.Event()

    async def stop_before_deploying(event: Any) -> None:
        if event.tool_name == "deploy":
            await gate.wait()  # the process "dies" here: decided, not started

    kit.harness.hooks.on("before_tool", stop_before_deploying)
    running = asyncio.ensure_future(kit.harness.resume([approve("c2")], idempotency_key="k"))
    for _ in range(100):
        await asyncio.sleep(0)
    assert len(items(await kit.storage.get_log(), "approval_decided")) == 1
    reopened = await kit.reopen(script=[text("done")], tools=effects.tools())
    assert reopened.suspended[0].reason == "crash"  # decided: no longer waiting
    other = await reopened.harness.resume([deny("c2", "too late")], idempotency_key="k2")
    assert refused(other, "DecisionsMismatch").reason == "already_decided"
    resumed = await reopened.harness.resume()
    assert isinstance(resumed, Ok) and resumed.value.kind == "completed"
    assert effects.deployed == [42]
    running.cancel()


@pytest.mark.parametrize(
    ("policy", "declared", "replayed"),
    [
        ("declared", "safe", True),
        ("declared", "never", False),
        ("never", "safe", False),
        ("always", "never", True),
    ],
)
async def test_tool_recovery_policies(
    backend: str, tmp_path: Path, policy: str, declared: str, replayed: bool
) -> None:
    runs: list[str] = []
    first = asyncio.Event()

    async def body(args: Any, ctx: ToolContext) -> str:
        runs.append(ctx.idempotency_key)
        if len(runs) == 1:
            first.set()
            await asyncio.Event().wait()  # dies mid-call
        return "done"

    work = Tool(name="work", description="work", execute=body, replay=declared)  # type: ignore[arg-type]
    kit = await make_kit(backend, tmp_path, [tool_calls(("work", {}, "c1"))], tools=[work])
    running = asyncio.ensure_future(kit.harness.prompt("go"))
    await first.wait()
    reopened = await kit.reopen(script=[text("finished")])
    resumed = await reopened.harness.resume(tool_recovery=policy)  # type: ignore[arg-type]
    assert isinstance(resumed, Ok) and resumed.value.kind == "completed"
    assert len(runs) == (2 if replayed else 1)
    result = reopened.model.requests[-1].messages[-1]
    assert isinstance(result, ToolResultMessage)
    assert (result.outcome == "interrupted") == (not replayed)
    running.cancel()


async def test_an_old_approval_is_never_replay_permission(backend: str, tmp_path: Path) -> None:
    effects = Effects()
    started = asyncio.Event()
    kit = await waiting_kit(backend, tmp_path, effects)

    # run the approved deploy but die while it executes (started, no result)
    tools = effects.tools(deploy_replay="safe")
    deploy = tools[0]

    async def dying(args: Deploy, ctx: ToolContext) -> str:
        effects.deployed.append(args.build)
        started.set()
        await asyncio.Event().wait()
        return "unreachable"

    kit.harness.set_tools([Tool(**{**deploy.__dict__, "execute": dying}), tools[1]])
    running = asyncio.ensure_future(kit.harness.resume([approve("c2")]))
    await started.wait()
    reopened = await kit.reopen(script=[text("done")], tools=effects.tools(deploy_replay="safe"))
    waiting = await reopened.harness.resume(tool_recovery="always")
    assert isinstance(waiting, Ok) and waiting.value.kind == "suspended"  # a new approval first
    (pending,) = waiting.value.pending_approvals
    assert pending.started and pending.tool_call_id == "c2"
    resumed = await reopened.harness.resume([approve("c2")])
    assert isinstance(resumed, Ok) and resumed.value.kind == "completed"
    assert effects.deployed == [42, 42]  # replayed, after the second approval only
    running.cancel()
