"""Runs: the driver loop and its checkpoints, failure, abort and deferred redemption."""

from __future__ import annotations

from typing import Literal

from harness_core import texts
from harness_core._runtime.effects import LaterEvent
from harness_core._runtime.procedures.common import (
    OperationContext,
    Part,
    _Aborted,
    _AwaitApproval,
    _give_up,
    _message_error,
    _over_budget,
    _Overflow,
    _Park,
    _RunFailed,
    _tool_calls,
    _truncation,
    _turn_limit,
)
from harness_core._runtime.procedures.steps import Steps
from harness_core._runtime.procedures.structural import Structural
from harness_core._runtime.procedures.tool_batch import ToolBatch
from harness_core._runtime.reduction import (
    OperationState,
    has_pending_work,
    needs_assistant,
)
from harness_core.errors import RecordLogCorruption
from harness_core.events import (
    RunEnd,
    RunSuspend,
    TurnEnd,
    TurnStart,
)
from harness_core.hooks import (
    BeforeRunEndEvent,
)
from harness_core.messages import (
    AssistantMessage,
    TextPart,
    TokenUsage,
    ToolResultMessage,
    UserMessage,
)
from harness_core.portable import HarnessState, capabilities_of
from harness_core.result import Outcome
from harness_core.session.entries import Entry, MessageEntry
from harness_core.session.records import (
    OperationError,
)

__all__ = ["Run"]


class Run(Part):
    """A run, from wherever its durable state says it stands to its end or suspension."""

    def __init__(
        self, ctx: OperationContext, steps: Steps, tools: ToolBatch, structural: Structural
    ) -> None:
        super().__init__(ctx)
        self.steps = steps
        self.tools = tools
        self.structural = structural

    async def run(self) -> Outcome:
        """Continue (or start) the open run from wherever its durable state says it stands."""
        try:
            for entry in self.op.missing_initial:
                await self.fx.append_entry_if_missing(entry)
            if self.op.aborting:
                return await self._abort_path()
            if self.op.deferred is not None:
                redeemed = await self._redeem_deferred()
                if _tool_calls(redeemed):
                    await self.tools.run()
            batch = self.op.tool_batch
            if batch is not None and batch.unresolved:
                await self.tools.reconcile()
            step = self.op.step
            if step is not None and step.kind == "assistant":
                outcome = await self._run_turn()
                if outcome is not None:
                    return outcome
            elif step is not None and step.kind == "compaction":
                await self.structural.auto_compact(step.compaction_reason or "threshold")
            elif step is not None:
                raise RecordLogCorruption(
                    "branch_summary_in_run", f"run {self.op.id!r} has a branch-summary step"
                )
            if self.op.terminal_failure:
                return await self._handle_run_failed(await self._recorded_failure())
            return await self._driver_loop()
        except (_Park, _Aborted, _RunFailed, _AwaitApproval) as signal:
            return await self._handle_signal(signal)

    async def _handle_signal(self, signal: BaseException) -> Outcome:
        if isinstance(signal, (_AwaitApproval, _Park)):
            op = self.op
            parked = isinstance(signal, _Park)
            return Outcome(
                operation="run",
                run_id=op.id,
                kind="suspended",
                leaf_id=self.lane.state.leaf_id,
                final_entry_id=op.deferred_entry_id if parked else op.last_assistant_entry_id,
                deferred=signal.handle if isinstance(signal, _Park) else None,
                pending_approvals=signal.wait.calls if isinstance(signal, _AwaitApproval) else (),
                wait_id=signal.wait.id if isinstance(signal, _AwaitApproval) else None,
            )
        if isinstance(signal, _Aborted):
            return await self._abort_path()
        assert isinstance(signal, _RunFailed)
        return await self._handle_run_failed(signal.error)

    def _steering(self, op: OperationState) -> tuple[Entry, ...]:
        items = op.pending_steer
        return items if self.rt.options.steering_mode == "all" else items[:1]

    def _follow_ups(self, op: OperationState) -> tuple[Entry, ...]:
        items = op.pending_follow_up
        return items if self.rt.options.follow_up_mode == "all" else items[:1]

    async def _driver_loop(self) -> Outcome:
        fx = self.fx
        while True:
            op = self.op
            for write in op.pending_writes:
                await fx.apply_pending_write(op.id, write.id)
            for item in self._steering(self.op):
                await fx.consume_queue_item(op.id, "steer", item.id)
            if self.op.aborting:
                return await self._abort_path()
            if needs_assistant(self.op):
                # before compacting: a run at its limit asks the model nothing more, not a summary
                self._within_turns()
                if self.rt.options.token_budget is not None:
                    await self._within_budget()
            if await self.structural.context_over_limit():
                await self.structural.auto_compact("threshold")
            if needs_assistant(self.op):
                outcome = await self._run_turn()
                if outcome is not None:
                    return outcome
                continue
            for item in self._follow_ups(self.op):
                await fx.consume_queue_item(op.id, "follow_up", item.id)
            if has_pending_work(self.op):
                continue
            result = await fx.run_hook("before_run_end", LaterEvent(self._run_end_event))
            follow_up = getattr(result, "follow_up", None)
            if follow_up:
                entry = MessageEntry(
                    id=self._id(), message=UserMessage(content=(TextPart(text=follow_up),))
                )
                await fx.commit_run_end_follow_up(op.id, entry)
            if has_pending_work(self.op) or self.op.aborting:
                continue
            if await fx.try_finish_run(op.id, "completed") == "finished":
                return await self._finished("completed")

    def _within_turns(self) -> None:
        """Fail the run if it took its turns for this input (`max_turns`)."""
        limit = self.rt.options.max_turns_of(self.lane.name)
        if limit is not None and self.op.turns >= limit:
            raise _RunFailed(_turn_limit(limit))

    async def _within_budget(self) -> None:
        """Fail the run if its lane has spent its tokens (`token_budget`)."""
        lane = self.lane.name
        budget = self.rt.options.token_budget_of(lane)
        if budget is not None:  # the ledger is a running projection: one bounded read
            storage = self.rt.storage
            spent = (await storage.get_usage(lane=lane)).total_tokens
            if spent >= budget:
                raise _RunFailed(_over_budget(spent, budget))

    async def _run_end_event(self) -> BeforeRunEndEvent:
        messages = tuple(await self.lane.context.messages())
        return BeforeRunEndEvent(lane=self.lane.name, run_id=self.op.id, messages=messages)

    async def _finished(
        self, kind: Literal["completed", "aborted", "failed"], error: OperationError | None = None
    ) -> Outcome:
        op = self.lane.last_finished
        assert op is not None
        final_id = op.last_assistant_entry_id
        final: AssistantMessage | None = None
        if final_id is not None:
            stored = await self.lane.context.entry(final_id)
            if stored is not None and isinstance(stored.entry, MessageEntry):
                message = stored.entry.message
                final = message if isinstance(message, AssistantMessage) else None
        leaf = self.lane.state.leaf_id
        if self._wants("run_end"):
            self._emit(
                RunEnd(
                    lane=self.lane.name,
                    run_id=op.id,
                    outcome=kind,
                    leaf_id=leaf,
                    final_entry_id=final_id,
                    error=error,
                )
            )
        return Outcome(
            operation="run",
            run_id=op.id,
            kind=kind,
            leaf_id=leaf,
            final_entry_id=final_id,
            final_message=final,
            error=error,
            state=await self._state_reached() if kind == "failed" else None,
        )

    async def _state_reached(self) -> HarnessState:
        """The failed run's state candidate (a13n C6, D235): what a host may inspect or fork."""
        custom = await self.lane.context.path_entries_of_type("custom")
        return HarnessState(
            thread_id=self.lane.name,
            messages=await self.lane.context.messages(),
            capabilities=capabilities_of([stored.entry for stored in custom]),
        )

    async def _run_turn(self) -> Outcome | None:
        turn_id = self._id()  # drawn whether or not anyone listens: ids never depend on that
        if self._wants("turn_start"):
            self._emit(TurnStart(lane=self.lane.name, run_id=self.op.id, turn_id=turn_id))
        try:
            _, message = await self.steps.assistant_step()
        except _Overflow:
            return await self._recover_overflow()
        if message.stop_reason == "aborted" or self.op.aborting:
            return await self._abort_path()
        results: tuple[ToolResultMessage, ...] = ()
        if _tool_calls(message):
            results = await self.tools.run()
        if self._wants("turn_end"):
            self._emit(
                TurnEnd(
                    lane=self.lane.name,
                    run_id=self.op.id,
                    turn_id=turn_id,
                    message=message,
                    tool_results=results,
                )
            )
        return None

    async def _recover_overflow(self) -> Outcome | None:
        if self.op.aborting:
            return await self._abort_path()
        if self.op.overflow_recovery_used:
            step = self.op.step
            assert step is not None
            await self.fx.append_entry(_give_up(step.result_entry_id, _truncation()))
            return await self._handle_run_failed(_truncation())
        await self.structural.auto_compact("overflow")
        return None

    async def _recorded_failure(self) -> OperationError:
        """The error of the run's durable failure marker (a recovery ends as the live run would)."""
        newest = self.op.newest_own
        stored = await self.lane.context.entry(newest.entry_id) if newest else None
        if stored is not None and isinstance(stored.entry, MessageEntry):
            message = stored.entry.message
            if isinstance(message, AssistantMessage) and message.error is not None:
                return _message_error(message)
        return OperationError(code="failed", message="the run failed")

    async def _handle_run_failed(self, error: OperationError) -> Outcome:
        fx = self.fx
        op = self.op
        if not op.terminal_failure and not op.aborting:
            # Make the failure durable before draining, so recovery never completes this run
            # (overflow with nothing to compact, an exhausted compaction: no entry said so yet).
            step = op.step
            marker_id = (
                step.result_entry_id
                if step is not None and step.kind == "assistant"
                else self._id()
            )
            await fx.append_entry(_give_up(marker_id, error))
        try:
            while True:
                op = self.op
                for write in op.pending_writes:
                    await fx.apply_pending_write(op.id, write.id)
                consumed = 0
                for item in self._steering(self.op):
                    consumed += await fx.consume_queue_item(op.id, "steer", item.id) == "consumed"
                if consumed == 0:
                    for item in self._follow_ups(self.op):
                        consumed += (
                            await fx.consume_queue_item(op.id, "follow_up", item.id) == "consumed"
                        )
                if self.op.aborting:
                    return await self._abort_path()
                if consumed:
                    return await self._driver_loop()  # new input clears the failure
                if await fx.try_finish_run(op.id, "failed", error) == "finished":
                    return await self._finished("failed", error)
        except (_Park, _Aborted, _RunFailed) as signal:
            return await self._handle_signal(signal)

    async def _abort_path(self) -> Outcome:
        fx = self.fx
        op = self.op
        if op.deferred is not None:
            await fx.cancel_deferred(op.deferred)
        while True:
            op = self.op
            batch = op.tool_batch
            for call in batch.calls if batch is not None else ():
                if call.result_exists:
                    continue
                if call.started is not None:
                    await fx.append_entry_if_missing(
                        self.tools.synthetic(
                            call, call.started.result_entry_id, "interrupted", texts.INTERRUPTED
                        )
                    )
                else:
                    await fx.append_entry_if_missing(
                        self.tools.synthetic(call, self._id(), "error", texts.ABORTED_CALL)
                    )
            for write in self.op.pending_writes:
                await fx.apply_pending_write(op.id, write.id)
            newest = self.op.newest_own
            if newest is None or newest.role != "assistant" or newest.stop_reason != "aborted":
                closure = AssistantMessage(
                    content=(TextPart(text=texts.ABORTED_CLOSURE),),
                    stop_reason="aborted",
                    usage=TokenUsage(),
                )
                await fx.append_entry_if_missing(MessageEntry(id=self._id(), message=closure))
            reason = op.abort_reason  # said with the abort (D266), closing the run with it
            if await fx.finish_operation(op.id, "aborted", reason) == "finished":
                return await self._finished("aborted", reason)

    async def _redeem_deferred(self) -> AssistantMessage:
        fx = self.fx
        handle = self.op.deferred
        assert handle is not None
        final = await self.steps.settle(await fx.fetch_deferred(handle))
        result_id = self._id()
        reported = final.usage is not None and final.usage != TokenUsage()
        if final.stop_reason != "deferred" or reported:
            await fx.append_record(self.steps.usage("deferred_fetch", result_id, 1, final))
        if self.op.aborting:
            raise _Aborted()
        if final.stop_reason == "deferred":
            same = final.deferred is not None and (
                final.deferred.provider,
                final.deferred.model,
                final.deferred.id,
            ) == (handle.provider, handle.model, handle.id)
            if not same:  # its data may change between polls (status), never its identity
                await fx.cancel_deferred(handle)  # a provider anomaly fails this run only
                raise _RunFailed(
                    OperationError(
                        code="provider_anomaly",
                        message="the provider returned a different deferred handle "
                        "for a pending request",
                    )
                )
            self._emit(RunSuspend(lane=self.lane.name, run_id=self.op.id, deferred=handle))
            raise _Park(handle)
        if final.stop_reason == "aborted":
            raise _Aborted()
        await fx.append_entry(MessageEntry(id=result_id, message=final))
        if final.stop_reason == "error":
            raise _RunFailed(_message_error(final))
        return final
