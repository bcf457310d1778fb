"""Approvals (DESIGN §4.6): suspend, decide exactly the pending calls, one durable record first."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from harness_core.approvals import approve, args_digest, deny, supply
from harness_core.messages import ToolResultMessage, message_text
from harness_core.models.scripted import text, tool_calls
from harness_core.result import Err, Ok, Outcome
from harness_core.session.records import (
    ApprovalDecided,
    ApprovalDecision,
    ApprovalRequested,
    PendingApproval,
    ToolStarted,
)
from harness_core.session.types import LogItem, StoredEntry, StoredRecord
from harness_core.tools import Tool, ToolContext, tool
from tests.support.harness_kit import Kit, make_kit


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


WAITS: dict[int, Outcome] = {}
"""The suspension each waiting kit's harness returned (by harness identity)."""


async def waiting_kit(backend: str, tmp_path: Path, effects: Effects, *script: Any) -> Kit:
    kit = await make_kit(backend, tmp_path, [MIXED, *script], tools=effects.tools())
    outcome = await kit.harness.prompt("ship 42")
    assert isinstance(outcome, Ok) and outcome.value.kind == "suspended"
    assert [p.tool_call_id for p in outcome.value.pending_approvals] == ["c2"]
    assert outcome.value.wait_id is not None
    WAITS[id(kit.harness)] = outcome.value
    return kit


def wait_of(kit: Kit) -> Outcome:
    return WAITS[id(kit.harness)]


def c2(kit: Kit) -> PendingApproval:
    """The waiting deploy call, as the approver saw it."""
    return wait_of(kit).pending_approvals[0]


async def decide(kit: Kit, *decisions: ApprovalDecision, **kwargs: Any) -> Any:
    """Resume the kit's run with `decisions` for the wait it suspended on."""
    return await kit.harness.resume(list(decisions), wait_id=wait_of(kit).wait_id, **kwargs)


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
    assert required.wait_id == wait_of(kit).wait_id
    digest = c2(kit).args_digest
    wrong = refused(await decide(kit, approve("c9", args_digest=digest)), "DecisionsMismatch")
    assert (wrong.missing, wrong.unexpected) == (("c2",), ("c9",))
    twice = await decide(kit, approve(c2(kit)), deny(c2(kit), "no"))
    assert refused(twice, "DecisionsMismatch").reason == "duplicate"
    bad = await decide(kit, approve(c2(kit), args={"build": "latest"}))
    assert refused(bad, "DecisionsMismatch").reason == "invalid_arguments"
    unbound = await kit.harness.resume([approve(c2(kit))])
    assert refused(unbound, "DecisionsMismatch").reason == "unbound"
    assert len(await kit.storage.get_log()) == before  # refusals write nothing
    busy = await kit.harness.prompt("something else")
    assert isinstance(busy, Err) and busy.error.tag == "LaneBusy"  # the wait holds the lane


async def test_an_approved_call_runs_after_its_durable_decision(
    backend: str, tmp_path: Path
) -> None:
    effects = Effects()
    kit = await waiting_kit(backend, tmp_path, effects, text("done"))
    resumed = await decide(kit, approve(c2(kit)), decided_by="U_ALICE", idempotency_key="k1")
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


async def test_two_calls_the_provider_gave_one_id_are_each_decided_and_run_once(
    backend: str, tmp_path: Path
) -> None:
    """Both calls' approvals went to the first: approved, it ran twice (a never-replayed
    deploy) and the second, the one the approver also saw, never ran (D308)."""
    effects = Effects()
    same = tool_calls(("deploy", {"build": 1}, "dup"), ("deploy", {"build": 2}, "dup"))
    kit = await make_kit(backend, tmp_path, [same, text("done")], tools=effects.tools())
    waiting = await kit.harness.prompt("ship both")
    assert isinstance(waiting, Ok) and waiting.value.kind == "suspended"
    pending = waiting.value.pending_approvals
    assert [(p.tool_call_id, dict(p.args)) for p in pending] == [
        ("dup", {"build": 1}),
        ("dup_2", {"build": 2}),
    ]
    resumed = await kit.harness.resume(
        [approve(pending[0]), deny(pending[1], "not 2")], wait_id=waiting.value.wait_id
    )
    assert isinstance(resumed, Ok) and resumed.value.kind == "completed"
    assert effects.deployed == [1]
    results = [m for m in kit.model.requests[-1].messages if isinstance(m, ToolResultMessage)]
    assert [(r.tool_call_id, r.outcome) for r in results] == [("dup", "ok"), ("dup_2", "denied")]


async def test_approve_with_override_arguments(backend: str, tmp_path: Path) -> None:
    effects = Effects()
    kit = await waiting_kit(backend, tmp_path, effects, text("done"))
    resumed = await decide(kit, approve(c2(kit), args={"build": 43}))
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
    resumed = await decide(kit, deny(c2(kit), "not on a Friday"), decided_by="U_BOB")
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
    first = await decide(kit, approve(c2(kit)), idempotency_key="click-1")
    again = await decide(kit, approve(c2(kit)), idempotency_key="click-1")
    assert isinstance(first, Ok) and isinstance(again, Ok)
    assert (again.value.run_id, again.value.kind) == (first.value.run_id, "completed")
    assert effects.deployed == [42]
    other = await decide(kit, deny(c2(kit), "changed my mind"), idempotency_key="click-2")
    assert isinstance(other, Err) and other.error.tag == "WaitSuperseded"


async def test_new_input_queues_and_never_closes_the_wait(backend: str, tmp_path: Path) -> None:
    effects = Effects()
    kit = await waiting_kit(backend, tmp_path, effects, text("deployed, and noted"))
    steered = await kit.harness.steer("also tell ops")
    assert isinstance(steered, Ok)
    lanes = await kit.harness.lanes()
    assert lanes[0].status == "suspended"
    resumed = await decide(kit, approve(c2(kit)))
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
    late = await decide(kit, approve(c2(kit)))
    assert isinstance(late, Err) and late.error.tag == "WaitSuperseded"


async def test_a_restarted_process_sees_the_wait_and_takes_decisions(
    backend: str, tmp_path: Path
) -> None:
    effects = Effects()
    kit = await waiting_kit(backend, tmp_path, effects)
    reopened = await kit.reopen(script=[text("done")], tools=effects.tools())
    (suspended,) = reopened.suspended
    assert suspended.reason == "approval"
    assert [p.tool_call_id for p in suspended.pending_approvals] == ["c2"]
    assert suspended.wait_id == wait_of(kit).wait_id
    resumed = await reopened.harness.resume(
        [approve(suspended.pending_approvals[0])], wait_id=suspended.wait_id
    )
    assert isinstance(resumed, Ok) and resumed.value.kind == "completed"
    assert effects.deployed == [42]


async def test_a_crash_after_the_decision_runs_the_call_once(backend: str, tmp_path: Path) -> None:
    effects = Effects()
    kit = await waiting_kit(backend, tmp_path, effects)
    gate = asyncio.Event()
    reached = asyncio.Event()

    async def stop_before_deploying(event: Any) -> None:
        if event.tool_name == "deploy":
            reached.set()
            await gate.wait()  # the process "dies" here: decided, not started

    kit.harness.hooks.on("before_tool", stop_before_deploying)
    running = asyncio.ensure_future(decide(kit, approve(c2(kit)), idempotency_key="k"))
    await reached.wait()
    assert len(items(await kit.storage.get_log(), "approval_decided")) == 1
    reopened = await kit.reopen(script=[text("done")], tools=effects.tools())
    assert reopened.suspended[0].reason == "crash"  # decided: no longer waiting
    other = await reopened.harness.resume(
        [deny(c2(kit), "too late")], wait_id=wait_of(kit).wait_id, idempotency_key="k2"
    )
    mismatch = refused(other, "DecisionsMismatch")
    assert mismatch.reason == "already_decided"
    # who came first, not the run's internal id (an operator's 409 named "accept-4ad5...")
    assert mismatch.message.startswith("this request was already decided")
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
    running = asyncio.ensure_future(decide(kit, approve(c2(kit))))
    await started.wait()
    reopened = await kit.reopen(script=[text("done")], tools=effects.tools(deploy_replay="safe"))
    waiting = await reopened.harness.resume(tool_recovery="always")
    assert isinstance(waiting, Ok) and waiting.value.kind == "suspended"  # a new approval first
    (pending,) = waiting.value.pending_approvals
    assert pending.started and pending.tool_call_id == "c2"
    assert waiting.value.wait_id != wait_of(kit).wait_id  # a new wait
    stale = await reopened.harness.resume([approve(c2(kit))], wait_id=wait_of(kit).wait_id)
    assert refused(stale, "WaitSuperseded").current_wait_id == waiting.value.wait_id
    resumed = await reopened.harness.resume([approve(pending)], wait_id=waiting.value.wait_id)
    assert isinstance(resumed, Ok) and resumed.value.kind == "completed"
    assert effects.deployed == [42, 42]  # replayed, after the second approval only
    running.cancel()


@pytest.mark.parametrize("approved", [True, False])
async def test_a_decision_on_a_replay_an_operator_chose_keeps_that_choice(
    backend: str, tmp_path: Path, approved: bool
) -> None:
    """A never-replayed deploy cut mid-run; the operator resumed with "always" (run it again),
    which asks anew. The decision's own resume, under the default policy, read the call as
    not to be replayed: approved, it never ran ("interrupted"), and a Deny read the same."""
    effects = Effects()
    started = asyncio.Event()
    kit = await waiting_kit(backend, tmp_path, effects)
    deploy, lookup = effects.tools()

    async def dying(args: Deploy, ctx: ToolContext) -> str:
        effects.deployed.append(args.build)
        started.set()
        await asyncio.Event().wait()
        return "unreachable"

    kit.harness.set_tools([Tool(**{**deploy.__dict__, "execute": dying}), lookup])
    running = asyncio.ensure_future(decide(kit, approve(c2(kit))))
    await started.wait()
    reopened = await kit.reopen(script=[text("done")], tools=effects.tools())
    waiting = await reopened.harness.resume(tool_recovery="always")
    assert isinstance(waiting, Ok) and waiting.value.kind == "suspended"
    (pending,) = waiting.value.pending_approvals
    decision = approve(pending) if approved else deny(pending, "not twice")
    resumed = await reopened.harness.resume([decision], wait_id=waiting.value.wait_id)
    assert isinstance(resumed, Ok) and resumed.value.kind == "completed"
    assert effects.deployed == ([42, 42] if approved else [42])
    result = reopened.model.requests[-1].messages[-1]
    assert isinstance(result, ToolResultMessage)
    assert result.outcome == ("ok" if approved else "denied")
    running.cancel()


async def test_an_answer_to_an_earlier_wait_never_decides_a_later_one(
    backend: str, tmp_path: Path
) -> None:
    """The audit's case: the model calls deploy(42) as c1, it is approved and runs; the model
    then calls deploy(666) reusing the id c1. The first Approve, replayed or forwarded, must not
    approve the second wait: the batch names its wait and each decision its arguments."""
    effects = Effects()
    first = tool_calls(("deploy", {"build": 42}, "c1"))
    second = tool_calls(("deploy", {"build": 666}, "c1"))
    kit = await make_kit(backend, tmp_path, [first, second, text("done")], tools=effects.tools())
    waiting = await kit.harness.prompt("ship 42")
    assert isinstance(waiting, Ok) and waiting.value.wait_id is not None
    (old,) = waiting.value.pending_approvals
    again = await kit.harness.resume([approve(old)], wait_id=waiting.value.wait_id)
    assert isinstance(again, Ok) and again.value.kind == "suspended"
    (new,) = again.value.pending_approvals
    assert (new.tool_call_id, dict(new.args)) == ("c1", {"build": 666})
    assert effects.deployed == [42]
    before = len(await kit.storage.get_log())

    replayed = await kit.harness.resume([approve(old)], wait_id=waiting.value.wait_id)
    superseded = refused(replayed, "WaitSuperseded")
    assert (superseded.wait_id, superseded.current_wait_id) == (
        waiting.value.wait_id,
        again.value.wait_id,
    )
    forwarded = await kit.harness.resume([approve(old)], wait_id=again.value.wait_id)
    assert refused(forwarded, "DecisionsMismatch").reason == "stale_arguments"
    assert len(await kit.storage.get_log()) == before and effects.deployed == [42]

    decided = await kit.harness.resume([deny(new, "not 666")], wait_id=again.value.wait_id)
    assert isinstance(decided, Ok) and decided.value.kind == "completed"
    assert effects.deployed == [42]


async def test_a_decision_needs_the_digest_of_the_arguments_it_decides(
    backend: str, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="args_digest"):
        approve("c2")
    with pytest.raises(ValueError, match="args_digest"):
        deny("c2", "no")
    effects = Effects()
    kit = await waiting_kit(backend, tmp_path, effects)
    other = args_digest({"build": 43})
    wrong = await decide(kit, approve("c2", args_digest=other))
    assert refused(wrong, "DecisionsMismatch").reason == "stale_arguments"
    right = await decide(kit, approve("c2", args_digest=c2(kit).args_digest))
    assert isinstance(right, Ok) and effects.deployed == [42]


async def test_the_reducer_refuses_a_decision_record_for_another_wait_or_other_arguments(
    backend: str, tmp_path: Path
) -> None:
    """Another writer (or version) that recorded a decision for the wrong wait or arguments
    left a log no correct writer produces: the lane restores faulted, the others work."""
    effects = Effects()
    kit = await waiting_kit(backend, tmp_path, effects)
    await kit.storage.append_record(
        ApprovalDecided(
            id="forged",
            lane="main",
            run_id=wait_of(kit).run_id,
            wait_id="not-the-wait",
            idempotency_key="k",
            decisions=(approve(c2(kit)),),
        )
    )
    reopened = await kit.reopen(tools=effects.tools())
    (info,) = await reopened.harness.lanes()
    assert info.status == "faulted" and info.fault is not None
    assert "approval_mismatch" in info.fault and "not-the-wait" in info.fault
    assert effects.deployed == []


async def test_a_replayed_key_returns_the_original_result_however_much_came_after(
    backend: str, tmp_path: Path
) -> None:
    """A double click an hour later: after the run finished, after 70 more decided waits (the
    old lookup searched the newest 64), the same key returns the first result, final message
    included."""
    effects = Effects()
    later = [tool_calls(("deploy", {"build": 100 + n}, f"d{n}")) for n in range(70)]
    script: list[Any] = [text("deployed 42")]
    for call in later:
        script += [call, text("ok")]
    kit = await waiting_kit(backend, tmp_path, effects, *script)
    first = await decide(kit, approve(c2(kit)), idempotency_key="click-1", decided_by="U_A")
    assert isinstance(first, Ok) and first.value.kind == "completed"
    assert first.value.final_message is not None
    for n in range(70):
        waiting = await kit.harness.prompt(f"ship {n}")
        assert isinstance(waiting, Ok) and waiting.value.wait_id is not None
        (pending,) = waiting.value.pending_approvals
        done = await kit.harness.resume(
            [approve(pending)], wait_id=waiting.value.wait_id, idempotency_key=f"k{n}"
        )
        assert isinstance(done, Ok) and done.value.kind == "completed"
    size = len(await kit.storage.get_log())
    replayed = await decide(kit, approve(c2(kit)), idempotency_key="click-1", decided_by="U_A")
    assert isinstance(replayed, Ok) and replayed.value == first.value
    assert len(await kit.storage.get_log()) == size and effects.deployed.count(42) == 1


async def test_a_replayed_key_after_a_newer_wait_returns_that_suspension(
    backend: str, tmp_path: Path
) -> None:
    effects = Effects()
    second = tool_calls(("deploy", {"build": 43}, "c3"))
    kit = await waiting_kit(backend, tmp_path, effects, second, text("done"))
    first = await decide(kit, approve(c2(kit)), idempotency_key="click-1")
    assert isinstance(first, Ok) and first.value.kind == "suspended"  # waits for c3 now
    assert first.value.wait_id != wait_of(kit).wait_id
    replayed = await decide(kit, approve(c2(kit)), idempotency_key="click-1")
    assert isinstance(replayed, Ok) and replayed.value == first.value
    (pending,) = first.value.pending_approvals
    done = await kit.harness.resume([approve(pending)], wait_id=first.value.wait_id)
    assert isinstance(done, Ok) and done.value.kind == "completed"
    still = await decide(kit, approve(c2(kit)), idempotency_key="click-1")
    assert isinstance(still, Ok) and still.value == first.value
    assert effects.deployed == [42, 43]


async def test_a_key_reused_for_another_batch_is_refused(backend: str, tmp_path: Path) -> None:
    effects = Effects()
    kit = await waiting_kit(backend, tmp_path, effects, text("done"))
    assert isinstance(await decide(kit, approve(c2(kit)), idempotency_key="k"), Ok)
    other = await decide(kit, deny(c2(kit), "no"), idempotency_key="k")
    assert refused(other, "DecisionsMismatch").reason == "key_reused"
    assert effects.deployed == [42]


@pytest.mark.parametrize("switched_off", [True, False])
async def test_always_recovery_runs_only_what_the_lane_offers_now(
    backend: str, tmp_path: Path, switched_off: bool
) -> None:
    """a13n B4: `tool_recovery="always"` replays an interrupted call only while the lane still
    offers its tool. Switched off after the crash (still registered), it stays interrupted."""
    runs: list[str] = []
    first = asyncio.Event()

    async def body(args: Any, ctx: ToolContext) -> str:
        runs.append(ctx.idempotency_key)
        if len(runs) == 1:
            first.set()
            await asyncio.Event().wait()  # dies mid-call
        return "done"

    def tools() -> list[Tool]:
        return [
            Tool(name="work", description="work", execute=body),  # replay="never"
            Tool(name="other", description="other", execute=body),
        ]

    kit = await make_kit(backend, tmp_path, [tool_calls(("work", {}, "c1"))], tools=tools())
    running = asyncio.ensure_future(kit.harness.prompt("go"))
    await first.wait()
    reopened = await kit.reopen(script=[text("finished")], tools=tools())
    lane = await reopened.harness.lane("main")
    assert lane is not None
    if switched_off:
        await lane.set_active_tools(["other"])  # an open operation: a pending write
    resumed = await reopened.harness.resume(tool_recovery="always")
    assert isinstance(resumed, Ok) and resumed.value.kind == "completed"
    assert len(runs) == (1 if switched_off else 2)
    result = reopened.model.requests[-1].messages[-1]
    assert isinstance(result, ToolResultMessage)
    assert (result.outcome == "interrupted") == switched_off
    running.cancel()


async def test_a_supplied_result_stands_in_for_the_call(backend: str, tmp_path: Path) -> None:
    """a13n C2: whoever decides may have done the action themselves; the decision carries the
    result, the tool never runs, the model reads the result as the call's, and the record says
    who supplied it. Repeating the batch under its key changes nothing."""
    effects = Effects()
    kit = await waiting_kit(backend, tmp_path, effects, text("noted"))
    decision = supply(c2(kit), "deployed 42 by hand at 10:02", note="ran it from the console")
    resumed = await decide(kit, decision, decided_by="ops:ana", idempotency_key="k1")
    assert isinstance(resumed, Ok) and resumed.value.kind == "completed", resumed
    assert effects.deployed == []  # the tool never ran
    result = kit.model.requests[-1].messages[-1]
    assert isinstance(result, ToolResultMessage) and result.tool_call_id == "c2"
    assert message_text(result) == "deployed 42 by hand at 10:02" and result.outcome == "ok"
    assert result.details == {"supplied": True, "note": "supplied by ops:ana"}
    log = await kit.storage.get_log()
    assert not [r for r in items(log, "tool_started") if r.record.tool_call_id == "c2"]
    (decided,) = items(log, "approval_decided")
    assert decided.record.decisions[0].supplied.text == "deployed 42 by hand at 10:02"
    again = await decide(kit, decision, decided_by="ops:ana", idempotency_key="k1")
    assert isinstance(again, Ok) and again.value.run_id == resumed.value.run_id
    assert len(items(await kit.storage.get_log(), "approval_decided")) == 1


async def test_a_supplied_failure_reads_as_a_failed_call(backend: str, tmp_path: Path) -> None:
    effects = Effects()
    kit = await waiting_kit(backend, tmp_path, effects, text("noted"))
    resumed = await decide(kit, supply(c2(kit), "the deploy failed: disk full", is_error=True))
    assert isinstance(resumed, Ok) and resumed.value.kind == "completed"
    result = kit.model.requests[-1].messages[-1]
    assert isinstance(result, ToolResultMessage) and result.is_error and effects.deployed == []


async def test_a_supplied_result_follows_the_coverage_and_argument_rules(
    backend: str, tmp_path: Path
) -> None:
    effects = Effects()
    kit = await waiting_kit(backend, tmp_path, effects, text("noted"))
    other = supply("c2", "done", args_digest=args_digest({"build": 666}))
    assert refused(await decide(kit, other), "DecisionsMismatch").reason == "stale_arguments"
    twice = [supply(c2(kit), "done"), supply(c2(kit), "done again")]
    assert refused(await decide(kit, *twice), "DecisionsMismatch").reason == "duplicate"
    with pytest.raises(ValueError, match="at least 1 character"):
        supply(c2(kit), "")  # an empty result says nothing
    assert effects.deployed == []


async def test_a_started_call_replayed_after_a_crash_can_be_answered_with_its_result(
    backend: str, tmp_path: Path
) -> None:
    """The call ran (or may have) before a crash: the person who checks what happened supplies
    the result instead of approving a second run."""
    effects = Effects()
    started = asyncio.Event()
    kit = await waiting_kit(backend, tmp_path, effects)
    tools = effects.tools(deploy_replay="safe")

    async def dying(args: Deploy, ctx: ToolContext) -> str:
        effects.deployed.append(args.build)
        started.set()
        await asyncio.Event().wait()
        return "unreachable"

    kit.harness.set_tools([Tool(**{**tools[0].__dict__, "execute": dying}), tools[1]])
    running = asyncio.ensure_future(decide(kit, approve(c2(kit))))
    await started.wait()
    reopened = await kit.reopen(script=[text("done")], tools=effects.tools(deploy_replay="safe"))
    waiting = await reopened.harness.resume(tool_recovery="always")
    assert isinstance(waiting, Ok) and waiting.value.kind == "suspended"
    (pending,) = waiting.value.pending_approvals
    assert pending.started
    resumed = await reopened.harness.resume(
        [supply(pending, "it did deploy: build 42 is live")], wait_id=waiting.value.wait_id
    )
    assert isinstance(resumed, Ok) and resumed.value.kind == "completed"
    assert effects.deployed == [42]  # once, before the crash; never again
    result = reopened.model.requests[-1].messages[-1]
    assert isinstance(result, ToolResultMessage)
    assert message_text(result) == "it did deploy: build 42 is live"
    running.cancel()
