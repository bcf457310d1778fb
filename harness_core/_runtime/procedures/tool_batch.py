"""The tool batch: prepare (the durability point), execute, finalize; recovery; approvals."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from harness_core import texts
from harness_core._runtime.lane_effects import InterruptedOutput
from harness_core._runtime.procedures.common import (
    Part,
    _AwaitApproval,
    _NeedsApproval,
)
from harness_core._runtime.reduction import (
    ToolCallState,
)
from harness_core._runtime.telemetry import Telemetry
from harness_core.approvals import args_digest
from harness_core.events import (
    RunSuspend,
    ToolEnd,
    ToolStart,
    ToolUpdate,
)
from harness_core.frozen import (
    FrozenJson,
)
from harness_core.hooks import (
    AfterToolEvent,
    BeforeToolEvent,
    BeforeToolResult,
)
from harness_core.messages import (
    TextPart,
    ToolOutcome,
    ToolResultMessage,
)
from harness_core.session.entries import MessageEntry
from harness_core.session.records import (
    ApprovalDecision,
    ApprovalRequested,
    PendingApproval,
    ToolStarted,
    Usage,
)
from harness_core.tools import (
    PreparedToolCall,
    Tool,
    ToolArgumentsError,
    ToolContext,
    ToolOutput,
    idempotency_key,
)

__all__ = ["ToolBatch"]


class ToolBatch(Part):
    """The tool calls of the newest assistant message: run live, or recovered call by call."""

    def synthetic(
        self, call: ToolCallState, entry_id: str, outcome: ToolOutcome, text: str
    ) -> MessageEntry:
        return MessageEntry(
            id=entry_id,
            message=ToolResultMessage(
                tool_call_id=call.call.id,
                tool_name=call.call.name,
                content=(TextPart(text=text),),
                outcome=outcome,
            ),
        )

    def _context(self, call: ToolCallState, assistant_entry_id: str) -> ToolContext:
        return ToolContext(
            session_id=self.rt.session_id,
            lane=self.lane.name,
            run_id=self.op.id,
            tool_call_id=call.call.id,
            tool_name=call.call.name,
            idempotency_key=idempotency_key(
                self.rt.session_id, assistant_entry_id, call.tool_index
            ),
            abort=self.lane.abort_signal,
            on_update=self._tool_progress(call),
        )

    def _tool_progress(self, call: ToolCallState) -> Callable[[FrozenJson], None]:
        lane, run_id = self.lane.name, self.op.id

        def report(partial: FrozenJson) -> None:
            self._emit(
                ToolUpdate(
                    lane=lane,
                    run_id=run_id,
                    tool_call_id=call.call.id,
                    tool_name=call.call.name,
                    partial=partial,
                )
            )

        return report

    async def _prepare(
        self, call: ToolCallState, assistant_entry_id: str
    ) -> PreparedToolCall | MessageEntry | _NeedsApproval:
        """Phase 1 and the durability point of one call.

        Returns a prepared call (its `tool_started` written), the result of a call that will not
        run (no `tool_started`: nothing started), or a call that waits for a person's decision.
        """
        active = {tool.name: tool for tool in self._active_tools()}
        tool = active.get(call.call.name)
        if tool is None:
            return self.synthetic(call, self._id(), "error", texts.no_such_tool(call.call.name))
        approval = self.op.approval
        decision = approval.decision(call.call.id) if approval is not None else None
        args = call.call.arguments
        if decision is not None and approval is not None:
            if not decision.approved:
                return self._denied(call, self._id(), decision)
            if decision.supplied is not None:  # done elsewhere: nothing runs here (D236)
                return self._supplied(call, self._id(), decision)
            pending = next(p for p in approval.requested.calls if p.tool_call_id == call.call.id)
            args = decision.override_args if decision.override_args is not None else pending.args
        try:
            tool.parse(args)
        except ToolArgumentsError as exc:
            return self.synthetic(call, self._id(), "error", str(exc))
        hook = await self.fx.run_hook(
            "before_tool",
            BeforeToolEvent(
                lane=self.lane.name,
                run_id=self.op.id,
                tool_call_id=call.call.id,
                tool_name=tool.name,
                args=args,
            ),
        )
        if isinstance(hook, BeforeToolResult):
            if hook.block is not None:
                return self.synthetic(call, self._id(), "blocked", hook.block)
            if hook.args is not None and decision is not None and hook.args != args:
                return self.synthetic(call, self._id(), "blocked", texts.CHANGED_AFTER_APPROVAL)
            if hook.args is not None and hook.args is not args:  # the same args parsed above
                try:
                    tool.parse(hook.args)
                except ToolArgumentsError as exc:
                    return self.synthetic(call, self._id(), "error", str(exc))
                args = hook.args
        if tool.requires_approval and decision is None:
            return _NeedsApproval(call, args)
        if self.op.aborting:
            return self.synthetic(call, self._id(), "error", texts.ABORTED_CALL)
        result_id = self._id()
        started = ToolStarted(
            id=self._id(),
            lane=self.lane.name,
            run_id=self.op.id,
            assistant_entry_id=assistant_entry_id,
            tool_index=call.tool_index,
            tool_call_id=call.call.id,
            tool_name=tool.name,
            effective_args=dict(args),
            result_entry_id=result_id,
            replay=tool.replay,
        )
        await self.fx.append_record(started)
        if self._wants("tool_start"):
            self._emit(
                ToolStart(
                    lane=self.lane.name,
                    run_id=self.op.id,
                    tool_call_id=call.call.id,
                    tool_name=tool.name,
                    args=dict(args),
                )
            )
        return PreparedToolCall(
            tool_index=call.tool_index,
            call=call.call,
            tool=tool,
            args=started.effective_args,
            context=self._context(call, assistant_entry_id),
        )

    async def _finalize(
        self, prepared: PreparedToolCall, output: ToolOutput, result_id: str
    ) -> ToolResultMessage:
        """Phase 3 and the result entry (under the provisioned id)."""
        fx = self.fx
        call = prepared.call
        event = AfterToolEvent(
            lane=self.lane.name,
            run_id=self.op.id,
            tool_call_id=call.id,
            tool_name=call.name,
            args=prepared.args,
            output=output,
        )
        patched = await fx.run_hook("after_tool", event)
        if isinstance(patched, ToolOutput) and patched is not output:
            output = self.lane.external.checked_output(patched, call.name)
        if output.usage is not None:
            await fx.append_record(
                Usage(
                    id=self._id(),
                    lane=self.lane.name,
                    cause="tool",
                    run_id=self.op.id,
                    entry_id=result_id,
                    tool_call_id=call.id,
                    usage=output.usage,
                )
            )
        named = tuple(
            TextPart(text=texts.file_sent(file.name, file.media_type, file.size))
            for file in output.files
        )
        message = ToolResultMessage(
            tool_call_id=call.id,
            tool_name=call.name,
            content=output.content + named,
            outcome=_outcome(output),
            details=output.details,
            usage=output.usage,
            files=output.files,
        )
        await fx.append_entry_if_missing(
            MessageEntry(id=result_id, message=message, terminate=output.terminate)
        )
        if self._wants("tool_end"):
            self._emit(
                ToolEnd(
                    lane=self.lane.name,
                    run_id=self.op.id,
                    tool_call_id=call.id,
                    tool_name=call.name,
                    result=message,
                    terminate=output.terminate,
                )
            )
        return message

    async def _immediate(self, entry: MessageEntry) -> ToolResultMessage:
        await self.fx.append_entry(entry)
        message = entry.message
        assert isinstance(message, ToolResultMessage)
        return message

    def _result_id(self, prepared: PreparedToolCall) -> str:
        batch = self.op.tool_batch
        assert batch is not None
        started = batch.calls[prepared.tool_index].started
        assert started is not None
        return started.result_entry_id

    async def run(self) -> tuple[ToolResultMessage, ...]:
        """Run the tool calls of the newest assistant message (live)."""
        batch = self.op.tool_batch
        assert batch is not None
        if batch.truncated:
            return await self._truncated(batch.calls)
        assistant_id = batch.assistant_entry_id
        tools = self.rt.tools
        sequential = self.rt.options.tool_execution == "sequential" or any(
            (tool := tools.get(c.call.name)) is not None and tool.execution_mode == "sequential"
            for c in batch.calls
        )
        results: list[ToolResultMessage] = []
        waiting: list[_NeedsApproval] = []
        if sequential:
            for call in batch.calls:
                if self.op.aborting:
                    break
                done = await self._single_call(call, assistant_id)
                if isinstance(done, _NeedsApproval):
                    waiting.append(done)
                else:
                    results.append(done)
            await self._request_approval(waiting)
            return tuple(results)
        prepared: list[PreparedToolCall | MessageEntry | _NeedsApproval] = []
        for call in batch.calls:
            if self.op.aborting:
                break
            prepared.append(await self._prepare(call, assistant_id))
        runnable = [p for p in prepared if isinstance(p, PreparedToolCall)]
        outputs = await asyncio.gather(*(self._execute_tool(p) for p in runnable))
        by_index = {p.tool_index: output for p, output in zip(runnable, outputs, strict=True)}
        for item in prepared:  # finalize in source order, after every execution settled
            if isinstance(item, PreparedToolCall):
                results.append(
                    await self._finalize(item, by_index[item.tool_index], self._result_id(item))
                )
            elif isinstance(item, _NeedsApproval):
                waiting.append(item)
            else:
                results.append(await self._immediate(item))
        await self._request_approval(waiting)
        return tuple(results)

    async def _single_call(
        self, call: ToolCallState, assistant_id: str
    ) -> ToolResultMessage | _NeedsApproval:
        prepared = await self._prepare(call, assistant_id)
        if isinstance(prepared, _NeedsApproval):
            return prepared
        if isinstance(prepared, MessageEntry):
            return await self._immediate(prepared)
        output = await self._execute_tool(prepared)
        return await self._finalize(prepared, output, self._result_id(prepared))

    async def _execute_tool(self, prepared: PreparedToolCall, replay: bool = False) -> ToolOutput:
        """Run one call, in its own span (the tool's name and outcome; never its data)."""
        span = self.telemetry.start(
            "harness.tool",
            self.span,
            {
                "harness.lane": self.lane.name,
                "harness.run_id": self.op.id,
                "harness.tool.name": prepared.tool.name,
                "harness.tool.call_id": prepared.call.id,
                "harness.tool.replay": prepared.tool.replay,
                "harness.tool.replayed": replay,
            },
        )
        with Telemetry.current(span):  # the tool's own spans nest under its run
            output = await self.fx.execute_tool(prepared)
        Telemetry.end(
            span,
            {"harness.tool.outcome": "error" if output.is_error else "ok"},
            error="tool_error" if output.is_error else None,
        )
        return output

    async def _request_approval(self, waiting: list[_NeedsApproval]) -> None:
        """Suspend the run until a person decides the waiting calls (their batch is settled)."""
        if not waiting or self.op.aborting:
            return
        batch = self.op.tool_batch
        assert batch is not None
        calls = tuple(
            PendingApproval(
                tool_call_id=item.call.call.id,
                tool_index=item.call.tool_index,
                tool_name=item.call.call.name,
                args=item.args,
                args_digest=args_digest(item.args),
                started=item.started,
            )
            for item in waiting
        )
        record = ApprovalRequested(
            id=self._id(),
            lane=self.lane.name,
            run_id=self.op.id,
            assistant_entry_id=batch.assistant_entry_id,
            calls=calls,
            leaf_id=self.lane.state.leaf_id,
        )
        await self.fx.append_record(record)
        self._emit(
            RunSuspend(
                lane=self.lane.name,
                run_id=self.op.id,
                reason="approval",
                approvals=calls,
                wait_id=record.id,
            )
        )
        raise _AwaitApproval(record)

    async def _truncated(self, calls: tuple[ToolCallState, ...]) -> tuple[ToolResultMessage, ...]:
        results = []
        for call in calls:
            if not call.result_exists:
                results.append(
                    await self._immediate(
                        self.synthetic(call, self._id(), "error", texts.TRUNCATED_CALL)
                    )
                )
        return tuple(results)

    async def reconcile(self) -> None:
        """Recover a batch call by call, in source order, each at its own crash site."""
        batch = self.op.tool_batch
        assert batch is not None
        if batch.truncated:
            await self._truncated(batch.calls)
            return
        waiting: list[_NeedsApproval] = []
        surface = self._current_surface()  # a switched-off tool never runs again (D234)
        for index in range(len(batch.calls)):
            if self.op.aborting:
                return
            current = self.op.tool_batch
            assert current is not None
            call = current.calls[index]
            if call.result_exists:
                continue  # X5: done
            started = call.started
            if started is None:
                done = await self._single_call(call, current.assistant_entry_id)  # X1/X2
                if isinstance(done, _NeedsApproval):
                    waiting.append(done)
                continue
            tool = surface.get(started.tool_name)
            # a resume that chose to run it again asked anew, and that wait is the choice: the
            # decision's resume (a person's click, under the default policy) keeps it
            replays = tool is not None and (
                self._replay_asked(call) or self._replays(started, tool)
            )
            if tool is not None and replays and tool.requires_approval:
                decision = self._replay_decision(call)  # an earlier approval does not count
                if decision is None:
                    waiting.append(_NeedsApproval(call, started.effective_args, started=True))
                    continue
                if not decision.approved:
                    await self.fx.append_entry_if_missing(
                        self._denied(call, started.result_entry_id, decision)
                    )
                    continue
                if decision.supplied is not None:
                    await self.fx.append_entry_if_missing(
                        self._supplied(call, started.result_entry_id, decision)
                    )
                    continue
            if tool is not None and replays:  # X3/X4: replay
                prepared = PreparedToolCall(
                    tool_index=call.tool_index,
                    call=call.call,
                    tool=tool,
                    args=started.effective_args,
                    context=self._context(call, current.assistant_entry_id),
                )
                output = await self._execute_tool(prepared, replay=True)
                await self._finalize(prepared, output, started.result_entry_id)
            else:
                await self.fx.append_entry_if_missing(
                    self.synthetic(call, started.result_entry_id, "interrupted", texts.INTERRUPTED)
                )
        await self._request_approval(waiting)

    def _replays(self, started: ToolStarted, tool: Tool) -> bool:
        """Whether a started call without a result runs again, under this resume's policy."""
        if self.ctx.tool_recovery == "never":
            return False
        if self.ctx.tool_recovery == "always":
            return True
        return started.replay == "safe" and tool.replay == "safe"

    def _replay_asked(self, call: ToolCallState) -> bool:
        """Whether the current wait asks to run this started call again (a resume chose to)."""
        approval = self.op.approval
        return approval is not None and any(
            p.tool_call_id == call.call.id and p.started for p in approval.requested.calls
        )

    def _replay_decision(self, call: ToolCallState) -> ApprovalDecision | None:
        """A decision made for replaying this started call (not the one that first ran it)."""
        approval = self.op.approval
        if approval is None or not self._replay_asked(call):
            return None
        return approval.decision(call.call.id)

    def _supplied(
        self, call: ToolCallState, entry_id: str, decision: ApprovalDecision
    ) -> MessageEntry:
        """The result a decision supplied, as the call's result entry (the tool never ran)."""
        supplied = decision.supplied
        assert supplied is not None
        decided = self.op.approval.decided if self.op.approval else None
        by = decided.decided_by if decided else None
        return MessageEntry(
            id=entry_id,
            message=ToolResultMessage(
                tool_call_id=call.call.id,
                tool_name=call.call.name,
                content=(TextPart(text=supplied.text),),
                outcome="error" if supplied.is_error else "ok",
                details={"supplied": True, "note": texts.supplied_note(by)},
            ),
        )

    def _denied(
        self, call: ToolCallState, entry_id: str, decision: ApprovalDecision
    ) -> MessageEntry:
        decided = self.op.approval.decided if self.op.approval else None
        text = texts.denied(decided.decided_by if decided else None, decision.reason)
        return self.synthetic(call, entry_id, "denied", text)


def _outcome(output: ToolOutput) -> ToolOutcome:
    """How a call that ran ended: cut off mid-call (D407), failed, or fine."""
    if isinstance(output, InterruptedOutput):
        return "interrupted"
    return "error" if output.is_error else "ok"
