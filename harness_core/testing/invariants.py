"""Recovery invariants: what must hold after any crash and recovery (for tests and soaks).

Plain asserts, so pytest shows the values; `Counters` count tool runs the way the checks read
them (per tool name and per invocation idempotency key).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from harness_core._runtime.restore import restore_lane
from harness_core.harness import AgentHarness
from harness_core.messages import AssistantMessage, ToolResultMessage
from harness_core.result import Ok
from harness_core.session.entries import MessageEntry
from harness_core.session.records import (
    ApprovalDecision,
    OperationFinished,
    OperationStarted,
    PendingApproval,
    QueueCancelled,
    QueueEnqueued,
    ToolStarted,
)
from harness_core.session.types import LogItem, StoredEntry, StoredRecord
from harness_core.tools import ToolRecovery, idempotency_key

__all__ = [
    "Counters",
    "Decide",
    "assert_fixed_point",
    "check_invariants",
    "parked_deferred",
    "resume_all",
    "shape",
    "tool_of",
]


@dataclass
class Counters:
    """Tool runs seen by a harness's tools."""

    executions: Counter[str] = field(default_factory=Counter)
    """Runs per tool name."""
    invocations: Counter[str] = field(default_factory=Counter)
    """Runs per invocation (idempotency key)."""


def check_invariants(
    prefix: Sequence[LogItem],
    log: Sequence[LogItem],
    counters: Counters,
    declarations: Mapping[str, str],
    session_id: str = "s",
    policy: str = "declared",
) -> set[tuple[str, str, str]]:
    """Assert what must hold after a recovery from `prefix` produced `log`.

    Every operation finished at most once and none is left open (but a parked deferred
    request); every accepted input (initial messages, steering and follow-ups not cancelled or
    killed by an abort) is in the tree; a call started before the crash without a result was
    replayed once iff `policy` allows it (``declared``: it was and is declared ``safe``;
    ``never``; ``always``: the tool still exists) and no abort was accepted, and otherwise
    never ran again and reads "interrupted". `counters` are the recovery's tool runs. Returns
    the (started, current, action) replay cases seen.
    """
    records = [item.record for item in log if isinstance(item, StoredRecord)]
    entries = {item.id: item for item in log if isinstance(item, StoredEntry)}
    started = [r for r in records if isinstance(r, OperationStarted)]
    finished = Counter(r.run_id for r in records if isinstance(r, OperationFinished))
    for op in started:
        assert finished[op.id] <= 1, f"{op.id} finished twice"
    open_ops = [op for op in started if finished[op.id] == 0]
    for op in open_ops:  # only a parked deferred request may stay open
        newest = [
            e for e in entries.values() if isinstance(e.entry, MessageEntry) and e.lane == op.lane
        ][-1]
        message = newest.entry.message  # type: ignore[union-attr]
        assert isinstance(message, AssistantMessage), f"{op.id} left open"
        assert message.stop_reason == "deferred", f"{op.id} left open"
    # every accepted input exactly once (ids are unique, so: present when it must be)
    for op in started:
        if op.intent.kind == "run":
            for initial in op.intent.initial_messages:
                assert initial.id in entries, f"initial message {initial.id} lost"
    cancelled = {r.entry_id for r in records if isinstance(r, QueueCancelled)}
    aborted_runs = {r.run_id for r in records if r.type == "abort_requested"}
    for record in records:
        if isinstance(record, QueueEnqueued) and record.queue != "next_run":
            killed = record.run_id in aborted_runs
            if record.target.id not in cancelled and not killed:
                assert record.target.id in entries, f"queued input {record.target.id} lost"
    # X3/X4: a started call without a result replays iff both declarations are safe (the AND
    # rule) and no abort was accepted; otherwise it never runs again and reads "interrupted"
    prefix_started = {
        r.record.result_entry_id: r.record
        for r in prefix
        if isinstance(r, StoredRecord) and isinstance(r.record, ToolStarted)
    }
    prefix_entries = {item.id for item in prefix if isinstance(item, StoredEntry)}
    prefix_aborted = {
        item.record.run_id
        for item in prefix
        if isinstance(item, StoredRecord) and item.record.type == "abort_requested"
    }
    seen: set[tuple[str, str, str]] = set()
    for result_id, start in prefix_started.items():
        if result_id in prefix_entries:
            continue
        key = idempotency_key(session_id, start.assistant_entry_id, start.tool_index)
        current = declarations.get(start.tool_name, "never")
        result = entries[result_id].entry
        assert isinstance(result, MessageEntry)
        assert isinstance(result.message, ToolResultMessage)
        replays = {
            "declared": start.replay == "safe" and current == "safe",
            "never": False,
            "always": start.tool_name in declarations,
        }[policy]
        if replays and start.run_id not in prefix_aborted:
            assert counters.invocations[key] == 1, f"{start.tool_name} was not replayed once"
            assert result.message.outcome != "interrupted"
            seen.add((start.replay, current, "replayed"))
        else:
            assert counters.invocations[key] == 0, f"{start.tool_name} ran again after a crash"
            assert result.message.outcome == "interrupted"
            seen.add((start.replay, current, "interrupted"))
    return seen


def tool_of(log: Sequence[LogItem], key: str, session_id: str = "s") -> str | None:
    """The tool of the invocation whose idempotency key is `key` (None: no such start)."""
    for item in log:
        if isinstance(item, StoredRecord) and isinstance(item.record, ToolStarted):
            record = item.record
            if key == idempotency_key(session_id, record.assistant_entry_id, record.tool_index):
                return record.tool_name
    return None


def parked_deferred(log: Sequence[LogItem]) -> bool:
    """Whether an operation is still open (allowed only for a parked deferred request)."""
    records = [item.record for item in log if isinstance(item, StoredRecord)]
    finished = {r.run_id for r in records if isinstance(r, OperationFinished)}
    return any(isinstance(r, OperationStarted) and r.id not in finished for r in records)


def shape(log: Sequence[LogItem]) -> list[str]:
    """The kinds of a log's items (``record:usage``, ``entry:message``...), for comparisons."""
    return [f"{item.kind}:{getattr(item, 'type', getattr(item, 'lane', ''))}" for item in log]


Decide = Callable[[tuple[PendingApproval, ...]], Sequence[ApprovalDecision]]
"""How a recovering operator decides a wait found on restore."""


async def resume_all(
    harness: AgentHarness,
    decide: Decide | None = None,
    tool_recovery: ToolRecovery = "declared",
    *,
    unstick: bool = False,
) -> None:
    """Resume every lane a restore found with an open operation, as a restarted process does.

    A lane waiting for approval is decided with `decide` (under a fixed idempotency key, so a
    repeated recovery replays the same decision) and resumed again if the decision leads to a
    new wait. With `unstick`, a stuck lane is resumed past its attempt budget (an operator's
    decision).
    """
    for info in await harness.lanes():
        if info.operation_id is None:
            continue
        lane = await harness.lane(info.name)
        assert lane is not None
        result = await lane.resume(tool_recovery=tool_recovery, unstick=unstick)
        for _ in range(8):
            if isinstance(result, Ok) and not result.value.pending_approvals:
                break
            if isinstance(result, Ok):
                pending, wait_id = result.value.pending_approvals, result.value.wait_id
            else:
                pending = getattr(result.error, "pending", ())
                wait_id = getattr(result.error, "wait_id", None)
            assert decide is not None, result
            assert pending, result
            result = await lane.resume(
                decide(pending),
                wait_id=wait_id,
                idempotency_key=f"recovery-{wait_id}",
                tool_recovery=tool_recovery,
            )
        assert isinstance(result, Ok), result


async def assert_fixed_point(harness: AgentHarness) -> None:
    """Every lane's live state equals a fresh reduction of the store (checked from outside).

    A lane not in memory has no live state to differ: its next use restores it from the store.
    """
    runtime = harness._rt
    for info in await harness.lanes():
        live = runtime.lanes.get(info.name)
        if live is not None:
            assert await restore_lane(runtime.storage, info.name) == live.state
