"""Tier A: every durable prefix of every canonical trajectory, restored and resumed, twice.

Each scenario of the catalog (`harness_core.testing.trajectories`) runs live once; its log is
the trajectory. Every prefix of that log is a state a crash can leave (a write either happened
or not). Each prefix is imported into a fresh session on a real backend, the harness is created
(restore: bounded reads, no writes) and every suspended operation is resumed. After recovery
the invariants must hold: the log reduces, every operation is closed (or parked on a deferred
request), every accepted input is in the tree exactly once, no ``replay="never"`` tool ran
again, and a second recovery finds nothing to do. Recovery from the same prefix is
deterministic, and a recovery cut at any of its own writes recovers again (half-completed
recovery is safe).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from harness_core._runtime.restore import restore_lane
from harness_core.messages import UserMessage, message_text
from harness_core.result import Err, Ok
from harness_core.session.entries import MessageEntry
from harness_core.session.types import LogItem, SessionMetadata, StoredEntry, StoredRecord
from harness_core.storage.memory import MemorySessionRepo
from harness_core.testing import ManualClock
from harness_core.testing.invariants import (
    Counters,
    check_invariants,
    parked_deferred,
    resume_all,
    shape,
)
from harness_core.testing.trajectories import SCENARIOS, Run, Scenario, open_run, trajectory
from harness_core.tools import ToolRecovery
from tests.support.backends import new_repo


async def recover(
    scenario: Scenario,
    backend: str,
    prefix: Sequence[LogItem],
    ids: str,
    policy: ToolRecovery = "declared",
) -> tuple[tuple[LogItem, ...], Counters, Run]:
    repo = new_repo(backend, Path(tempfile.mkdtemp(prefix="recovery-")), clock=ManualClock())
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
        live = run.harness._rt.lanes.get(lane.name)  # a lane not in memory is the store's
        if live is not None:
            assert await restore_lane(run.storage, lane.name) == live.state
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
