"""How a golden log is read, restored, resumed and described (shared by the test and generator).

A golden log is a JSONL backend session file (`<session id>.jsonl`: the header line, then one
encoded `LogItem` per line) checked in beside `<session id>.expected.json`. The expectation says
what `AgentHarness.create()` must report for the log (`restore`) and how to resume it
(`resume`: each step names the lane, the call and its arguments, the scripted model replies and
deferred fetches, and what the step must return, append, ask the model and run).

Everything here describes behaviour in plain JSON, independent of how the runtime is laid out:
ids the log holds are kept verbatim (they are what a later version must keep honouring), ids the
checking harness mints (``new-<n>``) render as ``~``, and token counts (an estimate) and
timestamps are left out.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness_core import (
    AgentHarness,
    AgentHarnessOptions,
    AgentMessage,
    ApprovalDecision,
    AssistantMessage,
    CompactionSettings,
    DeferredHandle,
    Err,
    HarnessError,
    LaneInfo,
    ModelError,
    ModelRef,
    ModelRequest,
    Ok,
    Outcome,
    PendingApproval,
    RetryPolicy,
    ScriptedModel,
    SequentialIds,
    SessionRepo,
    SessionStorage,
    SuspendedOperation,
    TextPart,
    TokenUsage,
    Tool,
    ToolCallPart,
    ToolContext,
    ToolOutput,
    ToolResultMessage,
    UserMessage,
)
from harness_core.session.codec import decode_log_item
from harness_core.session.entries import (
    ActiveToolsChangeEntry,
    BranchSummaryEntry,
    CompactionEntry,
    CustomEntry,
    Entry,
    MessageEntry,
    ModelChangeEntry,
    ThinkingLevelChangeEntry,
)
from harness_core.session.records import (
    AbortRequested,
    ApprovalDecided,
    ApprovalRequested,
    OperationFinished,
    OperationResumed,
    OperationStarted,
    QueueCancelled,
    QueueEnqueued,
    Record,
    RunIntent,
    StepAttempt,
    ToolStarted,
    Usage,
    WriteDeferred,
)
from harness_core.session.types import (
    FactSet,
    LaneMove,
    LogItem,
    SessionMetadata,
    StoredEntry,
    StoredRecord,
)
from harness_core.testing import ManualClock

__all__ = [
    "CHECK_START_MS",
    "GOLDEN_DIR",
    "JSONL_FORMAT",
    "MODEL",
    "Checker",
    "GoldenLog",
    "ToolBox",
    "golden_names",
    "check_session",
    "harness_options",
    "read_golden",
    "render_item",
    "reply",
]

GOLDEN_DIR = Path(__file__).parent
JSONL_FORMAT = "durable-gateway/session-jsonl/1"
"""The header format of every golden file of this generation."""

MODEL = ModelRef(provider="scripted", model_id="test")
MINTED = re.compile(r"^new-\d+$")
"""Ids the checking harness mints: rendered as ``~`` (how many a procedure draws is not a
contract; which ids it reuses from the log is)."""

CHECK_START_MS = 1_800_000_000_000
"""The checking harness's clock (later than every golden log's timestamps)."""

OWNER = "golden"


# -- the golden files ---------------------------------------------------------------------------


@dataclass(frozen=True)
class GoldenLog:
    """One checked-in log: its header metadata, its raw item lines and the decoded items."""

    name: str
    path: Path
    header: dict[str, Any]
    metadata: SessionMetadata
    lines: tuple[bytes, ...]
    """The item lines (without the header), exactly as stored, without their newline."""
    items: tuple[LogItem, ...]

    @property
    def expectation_path(self) -> Path:
        """The JSON file of what restore and resume must do with this log."""
        return self.path.with_name(f"{self.name}.expected.json")

    def expectation(self) -> dict[str, Any]:
        """The checked-in expectation."""
        loaded: dict[str, Any] = json.loads(self.expectation_path.read_text())
        return loaded


def golden_names(directory: Path = GOLDEN_DIR) -> list[str]:
    """The session ids of the golden logs in `directory`, sorted."""
    return sorted(path.stem for path in directory.glob("*.jsonl"))


def read_golden(path: Path) -> GoldenLog:
    """Parse a golden file with the current codec (line by line: a bad line names itself)."""
    raw = path.read_bytes()
    assert raw.endswith(b"\n"), f"{path} does not end with a newline"
    header_line, *lines = raw[:-1].split(b"\n")
    header = json.loads(header_line)
    metadata = SessionMetadata.model_validate(header["metadata"])
    items = tuple(
        decode_log_item(line, f"{path}:{number}") for number, line in enumerate(lines, start=2)
    )
    return GoldenLog(path.stem, path, header, metadata, tuple(lines), items)


# -- the harness a golden log is checked with -----------------------------------------------------


def _text_output(text: str, usage: TokenUsage | None = None) -> ToolOutput:
    return ToolOutput(content=(TextPart(text=text),), usage=usage)


@dataclass
class ToolBox:
    """The tool registry of every golden log, recording each execution as ``[name, args]``.

    A call whose id is in `hang` never returns once it started (its id goes to `hung`): the
    generator's way to leave a process dead in the middle of a tool.
    """

    runs: list[list[Any]] = field(default_factory=list)
    hang: set[str] = field(default_factory=set)
    hung: list[str] = field(default_factory=list)

    async def _run(self, name: str, args: dict[str, Any], ctx: ToolContext) -> None:
        self.runs.append([name, args])
        if ctx.tool_call_id in self.hang:
            self.hung.append(ctx.tool_call_id)
            await asyncio.Event().wait()  # the process dies here

    def tools(self) -> list[Tool]:
        """`lookup` (safe, reports usage), `send_email` and `charge` (never), `deploy`
        (never, needs approval)."""

        async def lookup(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
            await self._run("lookup", args, ctx)
            return _text_output(f"lookup {args.get('q')}: 42", TokenUsage(input=1, output=2))

        async def send_email(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
            await self._run("send_email", args, ctx)
            return _text_output(f"sent to {args.get('to')}")

        async def charge(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
            await self._run("charge", args, ctx)
            return _text_output(f"charged {args.get('cents')} cents")

        async def deploy(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
            await self._run("deploy", args, ctx)
            return _text_output(f"deployed build {args.get('build')}")

        return [
            Tool(name="lookup", description="Look a fact up.", execute=lookup, replay="safe"),
            Tool(name="send_email", description="Send an email.", execute=send_email),
            Tool(name="charge", description="Charge a card.", execute=charge),
            Tool(
                name="deploy",
                description="Deploy a build.",
                execute=deploy,
                requires_approval=True,
            ),
        ]


def harness_options(
    storage: SessionStorage,
    model: ScriptedModel,
    clock: ManualClock,
    ids_prefix: str,
    toolbox: ToolBox,
) -> AgentHarnessOptions:
    """The options every golden log is written and checked with (defaults where possible)."""
    return AgentHarnessOptions(
        storage=storage,
        model_client=model,
        model=MODEL,
        tools=toolbox.tools(),
        clock=clock,
        ids=SequentialIds(ids_prefix),
        retry=RetryPolicy(max_attempts=3, initial_delay_ms=0),
        compaction=CompactionSettings(keep_recent_tokens=30),
    )


def reply(spec: Mapping[str, Any]) -> AssistantMessage:
    """A scripted model reply from its JSON form.

    ``{"text": ...}``, ``{"tool_calls": [[name, args, call_id], ...]}``,
    ``{"deferred": handle_id}`` or ``{"error": kind, "retryable": bool}``.
    """
    if "text" in spec:
        return AssistantMessage(
            content=(TextPart(text=spec["text"]),), stop_reason="stop", usage=TokenUsage(output=5)
        )
    if "tool_calls" in spec:
        parts = tuple(
            ToolCallPart(id=call_id, name=name, arguments=args)
            for name, args, call_id in spec["tool_calls"]
        )
        return AssistantMessage(
            content=parts, stop_reason="tool_use", usage=TokenUsage(output=10 * len(parts))
        )
    if "deferred" in spec:
        return AssistantMessage(
            stop_reason="deferred",
            deferred=DeferredHandle(
                provider=MODEL.provider, model=MODEL.model_id, id=spec["deferred"]
            ),
            usage=TokenUsage(),
        )
    if "error" in spec:
        return AssistantMessage(
            stop_reason="error",
            error=ModelError(
                kind=spec["error"], message="scripted failure", retryable=spec["retryable"]
            ),
            usage=TokenUsage(),
        )
    raise ValueError(f"not a reply spec: {spec!r}")


class Checker:
    """A harness over one imported golden session, and the steps that resume it."""

    def __init__(
        self,
        storage: SessionStorage,
        harness: AgentHarness,
        suspended: list[SuspendedOperation],
        model: ScriptedModel,
        toolbox: ToolBox,
    ) -> None:
        self.storage = storage
        self.harness = harness
        self.suspended = suspended
        self.model = model
        self.toolbox = toolbox

    @classmethod
    async def open(cls, repo: SessionRepo, session_id: str, clock: ManualClock) -> Checker:
        """Take the session's lease and create a harness over it (restore: no writes)."""
        lease = await repo.acquire_lease(session_id, owner=OWNER, ttl_ms=10**9)
        storage = await repo.open(session_id, lease=lease)
        model = ScriptedModel()
        toolbox = ToolBox()
        harness, suspended = await AgentHarness.create(
            harness_options(storage, model, clock, "new-", toolbox)
        )
        return cls(storage, harness, suspended, model, toolbox)

    async def restore_report(self) -> dict[str, Any]:
        """What `create()` reported and every lane's restored state."""
        lanes = await self.harness.lanes()
        state: dict[str, Any] = {}
        for info in lanes:
            lane = await self.harness.lane(info.name)
            assert lane is not None
            if info.status == "faulted":
                try:
                    await lane.watch()
                except HarnessError as exc:
                    state[info.name] = {"raises": type(exc).__name__}
                else:
                    state[info.name] = {"raises": None}
                continue
            watch = await lane.watch()
            watch.unsubscribe()
            snapshot = watch.snapshot
            state[info.name] = {
                "status": snapshot.status,
                "operation_id": snapshot.operation_id,
                "leaf_id": snapshot.leaf_id,
                "transcript": [stored.id for stored in snapshot.transcript],
                "steer": [_entry_ref(e) for e in snapshot.steer],
                "follow_up": [_entry_ref(e) for e in snapshot.follow_up],
                "next_run": [_entry_ref(e) for e in snapshot.next_run],
                "pending_writes": [_entry_ref(e) for e in snapshot.pending_writes],
                "usage": _usage(await lane.get_usage()),
            }
        stats = await self.harness.session.get_stats()
        report = {
            "session": {
                "name": await self.harness.session.get_name(),
                "last_seq": stats.last_seq,
                "entries": stats.entries,
                "messages": stats.messages,
                "records": stats.records,
                "usage": _usage(stats.usage),
            },
            "suspended": [_suspended(op) for op in self.suspended],
            "lanes": [_lane_info(info) for info in lanes],
            "state": state,
        }
        return _scrubbed(report)

    async def run_step(self, step: Mapping[str, Any]) -> dict[str, Any]:
        """Run one resume step and describe what it did."""
        before = len(await self.storage.get_log())
        self.model.script = [reply(spec) for spec in step.get("script", ())]
        self.model.fetch_script = [reply(spec) for spec in step.get("fetches", ())]
        self.model.requests.clear()
        runs_before = len(self.toolbox.runs)
        lane = await self.harness.lane(step["lane"])
        assert lane is not None, f"no lane {step['lane']!r}"
        args = dict(step.get("args", {}))
        result: Any
        try:
            if step["call"] == "resume":
                decisions = args.pop("decisions", None)
                result = await lane.resume(
                    None if decisions is None else [ApprovalDecision(**d) for d in decisions],
                    **args,
                )
            elif step["call"] == "prompt":
                result = await lane.prompt(args.pop("text"), **args)
            else:
                raise ValueError(f"unknown call {step['call']!r}")
        except HarnessError as exc:
            rendered: Any = {"raises": type(exc).__name__}
        else:
            await lane.wait_for_idle()
            rendered = _result(result)
        log = await self.storage.get_log()
        out = {
            "result": rendered,
            "writes": [render_item(item) for item in log[before:]],
            "requests": [_request(r) for r in self.model.requests],
            "tool_runs": self.toolbox.runs[runs_before:],
            "script_left": len(self.model.script),
            "lanes_after": [_lane_brief(info) for info in await self.harness.lanes()],
        }
        return _scrubbed(out)


# -- rendering -------------------------------------------------------------------------------


def _scrubbed(value: dict[str, Any]) -> dict[str, Any]:
    out = _scrub(value)
    assert isinstance(out, dict)
    return out


def _scrub(value: Any) -> Any:
    """Plain JSON: tuples become lists, minted ids become ``~``."""
    if isinstance(value, str):
        return "~" if MINTED.match(value) else value
    if isinstance(value, Mapping):
        return {str(k): _scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(v) for v in value]
    return value


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=_default))


def _default(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, frozenset | set):
        return sorted(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def _text(content: Sequence[Any]) -> str:
    return "".join(part.text for part in content if isinstance(part, TextPart))


def render_message(message: AgentMessage) -> dict[str, Any]:
    """A message's role and what it says (no usage, no timestamps)."""
    if isinstance(message, UserMessage):
        return {"role": "user", "text": _text(message.content)}
    if isinstance(message, ToolResultMessage):
        return {
            "role": "tool_result",
            "tool_call_id": message.tool_call_id,
            "tool_name": message.tool_name,
            "outcome": message.outcome,
            "text": _text(message.content),
        }
    out: dict[str, Any] = {"role": "assistant", "stop_reason": message.stop_reason}
    if text := _text(message.content):
        out["text"] = text
    calls = [
        [part.id, part.name, _plain(part.arguments)]
        for part in message.content
        if isinstance(part, ToolCallPart)
    ]
    if calls:
        out["calls"] = calls
    if message.error is not None:
        out["error"] = message.error.kind
    if message.deferred is not None:
        out["deferred"] = message.deferred.id
    return out


def _entry(entry: Entry) -> dict[str, Any]:
    out: dict[str, Any] = {"type": entry.type, "id": entry.id}
    if isinstance(entry, MessageEntry):
        out.update(render_message(entry.message))
        if entry.terminate:
            out["terminate"] = True
    elif isinstance(entry, ModelChangeEntry):
        out["model"] = f"{entry.provider}:{entry.model_id}"
    elif isinstance(entry, ThinkingLevelChangeEntry):
        out["thinking_level"] = entry.thinking_level
    elif isinstance(entry, ActiveToolsChangeEntry):
        out["active_tools"] = list(entry.active_tool_names)
    elif isinstance(entry, CompactionEntry):
        out["summary"] = entry.summary
        out["retained_tail"] = [render_message(m) for m in entry.retained_tail]
    elif isinstance(entry, BranchSummaryEntry):
        out["from_id"] = entry.from_id
        out["summary"] = entry.summary
    elif isinstance(entry, CustomEntry):
        out["custom_type"] = entry.custom_type
        out["data"] = _plain(entry.data)
    return out


def _usage(usage: TokenUsage) -> dict[str, int]:
    return {
        "input": usage.input,
        "output": usage.output,
        "cache_read": usage.cache_read,
        "cache_write": usage.cache_write,
        "total_tokens": usage.total_tokens,
    }


def _entry_ref(entry: Entry) -> list[str]:
    return [entry.id, entry.type]


def _record(record: Record) -> dict[str, Any]:
    out: dict[str, Any] = {"lane": record.lane, "type": record.type, "id": record.id}
    if isinstance(record, OperationStarted):
        intent = record.intent
        out["operation"] = intent.kind
        out["source_leaf_id"] = record.source_leaf_id
        if isinstance(intent, RunIntent):
            out["prompt"] = [render_message(m)["text"] for m in intent.original_prompt]
            out["initial"] = [entry.id for entry in intent.initial_messages]
        else:
            out["intent"] = _plain(intent.model_dump(mode="json", exclude={"kind"}))
    elif isinstance(record, StepAttempt):
        out.update(
            run_id=record.run_id,
            step=record.step,
            attempt=record.attempt,
            result_entry_id=record.result_entry_id,
        )
        if record.compaction_reason is not None:
            out["compaction_reason"] = record.compaction_reason
    elif isinstance(record, ToolStarted):
        out.update(
            run_id=record.run_id,
            assistant_entry_id=record.assistant_entry_id,
            tool_index=record.tool_index,
            tool_call_id=record.tool_call_id,
            tool_name=record.tool_name,
            args=_plain(record.effective_args),
            result_entry_id=record.result_entry_id,
            replay=record.replay,
        )
    elif isinstance(record, OperationFinished):
        out.update(run_id=record.run_id, outcome=record.outcome)
        if record.error is not None:
            out["error"] = record.error.code
        out.update(final_entry_id=record.final_entry_id, leaf_id=record.leaf_id)
    elif isinstance(record, OperationResumed):
        out.update(run_id=record.run_id, attempt=record.attempt, unstick=record.unstick)
    elif isinstance(record, Usage):
        out["cause"] = record.cause
        for name in ("run_id", "entry_id", "attempt", "stop_reason", "tool_call_id"):
            if (value := getattr(record, name)) is not None:
                out[name] = value
    elif isinstance(record, ApprovalRequested):
        out.update(
            run_id=record.run_id,
            assistant_entry_id=record.assistant_entry_id,
            calls=[_pending(call) for call in record.calls],
        )
    elif isinstance(record, ApprovalDecided):
        out.update(
            run_id=record.run_id,
            wait_id=record.wait_id,
            idempotency_key=record.idempotency_key,
            decided_by=record.decided_by,
            decisions=[_plain(d.model_dump(mode="json")) for d in record.decisions],
        )
    elif isinstance(record, QueueEnqueued):
        out.update(queue=record.queue, run_id=record.run_id, target=_entry(record.target))
    elif isinstance(record, QueueCancelled):
        out.update(run_id=record.run_id, entry_id=record.entry_id)
    elif isinstance(record, WriteDeferred):
        out.update(run_id=record.run_id, target=_entry(record.target))
    elif isinstance(record, AbortRequested):
        out["run_id"] = record.run_id
    return out


def render_item(item: LogItem) -> dict[str, Any]:
    """A log item's compact shape: kind, lane, type and key fields (no seq, no timestamp)."""
    if isinstance(item, StoredEntry):
        return _scrubbed(
            {"kind": "entry", "lane": item.lane, "parent_id": item.parent_id, **_entry(item.entry)}
        )
    if isinstance(item, StoredRecord):
        return _scrubbed({"kind": "record", **_record(item.record)})
    if isinstance(item, LaneMove):
        return _scrubbed(
            {"kind": "lane", "lane": item.lane, "leaf_id": item.leaf_id, "created": item.created}
        )
    assert isinstance(item, FactSet)
    return _scrubbed({"kind": "fact", **_plain(item.fact.model_dump(mode="json"))})


def _pending(call: PendingApproval) -> dict[str, Any]:
    return {
        "tool_call_id": call.tool_call_id,
        "tool_index": call.tool_index,
        "tool_name": call.tool_name,
        "args": _plain(call.args),
        "args_digest": call.args_digest,
        "started": call.started,
    }


def _suspended(op: SuspendedOperation) -> dict[str, Any]:
    return {
        "lane": op.lane,
        "kind": op.kind,
        "id": op.id,
        "started_at": op.started_at,
        "reason": op.reason,
        "prompt": [render_message(m).get("text") for m in op.prompt],
        "deferred": op.deferred.id if op.deferred is not None else None,
        "aborting": op.aborting,
        "missing_tools": list(op.missing_tools),
        "missing_models": list(op.missing_models),
        "pending_approvals": [_pending(call) for call in op.pending_approvals],
        "wait_id": op.wait_id,
        "attempts": op.attempts,
        "stuck": op.stuck,
    }


def _lane_info(info: LaneInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "leaf_id": info.leaf_id,
        "operation_id": info.operation_id,
        "operation_kind": info.operation_kind,
        "status": info.status,
        "suspended": info.suspended,
        "attempts": info.attempts,
        "last_outcome": info.last_outcome,
        "error": info.error.code if info.error is not None else None,
        # the reason code, not the wording: `RecordLogCorruption` renders as "reason: message"
        "fault": info.fault.split(":", 1)[0] if info.fault is not None else None,
    }


def _lane_brief(info: LaneInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "status": info.status,
        "operation_id": info.operation_id,
        "attempts": info.attempts,
        "last_outcome": info.last_outcome,
    }


def _outcome(outcome: Outcome) -> dict[str, Any]:
    return {
        "operation": outcome.operation,
        "run_id": outcome.run_id,
        "kind": outcome.kind,
        "leaf_id": outcome.leaf_id,
        "final_entry_id": outcome.final_entry_id,
        "final_message": (
            render_message(outcome.final_message) if outcome.final_message is not None else None
        ),
        "error": outcome.error.code if outcome.error is not None else None,
        "deferred": outcome.deferred.id if outcome.deferred is not None else None,
        "entry_id": outcome.entry_id,
        "pending_approvals": [_pending(call) for call in outcome.pending_approvals],
        "wait_id": outcome.wait_id,
    }


def _result(result: Any) -> dict[str, Any]:
    if isinstance(result, Ok):
        value = result.value
        return {"ok": _outcome(value) if isinstance(value, Outcome) else _plain(value)}
    assert isinstance(result, Err), result
    rejection = result.error
    fields = {
        item.name: getattr(rejection, item.name)
        for item in dataclasses.fields(rejection)
        if item.name != "message"
    }
    return {"err": rejection.tag, **_plain(fields)}


def _request(request: ModelRequest) -> dict[str, Any]:
    return {
        "step": request.step,
        "attempt": request.attempt,
        "model": str(request.model),
        "thinking_level": request.thinking_level,
        "system_prompt": request.system_prompt,
        "tools": [tool.name for tool in request.tools],
        "messages": [render_message(m) for m in request.messages],
    }


async def check_session(
    repo: SessionRepo, session_id: str, clock: ManualClock, steps: Sequence[Mapping[str, Any]]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Restore a stored golden session and run its resume steps: (restore report, step results).

    The generator writes exactly this into the expectation; the test compares it on every
    backend.
    """
    before = len(await (await repo.open(session_id)).get_log())
    checker = await Checker.open(repo, session_id, clock)
    try:
        restore = await checker.restore_report()
        # restore is bounded reads and no writes: nothing may have been appended
        restore["writes"] = [render_item(i) for i in (await checker.storage.get_log())[before:]]
        results = [await checker.run_step(step) for step in steps]
    finally:
        await checker.harness.close()
    return restore, results
