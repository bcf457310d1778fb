"""The operation procedures: run, compaction and navigation, for live execution and resume alike.

A procedure reads the lane's live state and acts only through its `Effects` object, so manual
drive can park it before every effect and tests can cut it at any of them. Intent precedes
effect everywhere: a `step_attempt` before each model request (its usage recorded before any
decision), a `tool_started` before each tool, provisioned ids for every result. Control flow
signals (`RunFailed`, `Park`, `Aborted`, `Overflow`) never leave this module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from opentelemetry.trace import INVALID_SPAN, Span
from pydantic import ValidationError

from harness_core import texts
from harness_core._runtime.context import estimate_tokens, plan_compaction, summary_request_text
from harness_core._runtime.effects import Effects
from harness_core._runtime.lane import LaneRuntime
from harness_core._runtime.reduction import (
    OperationState,
    ToolCallState,
    has_pending_work,
    needs_assistant,
)
from harness_core._runtime.telemetry import Telemetry
from harness_core.approvals import args_digest
from harness_core.errors import RecordLogCorruption
from harness_core.events import (
    CompactionEnd,
    CompactionStart,
    NavigationEnd,
    RetryEnd,
    RetryScheduled,
    RetryStart,
    RunEnd,
    RunSuspend,
    ToolEnd,
    ToolStart,
    ToolUpdate,
    TurnEnd,
    TurnStart,
)
from harness_core.frozen import (
    FrozenJson,
    FrozenJsonObject,
    freeze_json,
    invalid_reason,
    revalidated,
)
from harness_core.hooks import (
    AfterResponseEvent,
    AfterToolEvent,
    BeforeCompactionEvent,
    BeforeCompactionResult,
    BeforeNavigationEvent,
    BeforeNavigationResult,
    BeforeRequestEvent,
    BeforeRunEndEvent,
    BeforeToolEvent,
    BeforeToolResult,
    CompactionPreparation,
    RequestOptions,
    SummaryResult,
    TransformContextEvent,
)
from harness_core.messages import (
    AssistantMessage,
    DeferredHandle,
    ModelError,
    TextPart,
    TokenUsage,
    ToolCallPart,
    ToolOutcome,
    ToolResultMessage,
    UserMessage,
    message_text,
)
from harness_core.models import (
    ModelRef,
    ModelRequest,
    is_context_overflow,
    is_recoverable_length,
    is_retryable,
)
from harness_core.result import Outcome
from harness_core.session.entries import BranchSummaryEntry, CompactionEntry, Entry, MessageEntry
from harness_core.session.records import (
    ApprovalDecision,
    ApprovalRequested,
    CompactionIntent,
    CompactionReason,
    NavigationIntent,
    OperationError,
    PendingApproval,
    RunIntent,
    StepAttempt,
    StepKind,
    ToolStarted,
    Usage,
)
from harness_core.session.types import LabelFact, StoredEntry
from harness_core.tools import (
    PreparedToolCall,
    Tool,
    ToolArgumentsError,
    ToolContext,
    ToolOutput,
    ToolRecovery,
    idempotency_key,
)

__all__ = ["Procedures"]


@dataclass(frozen=True, slots=True)
class _NeedsApproval:
    call: ToolCallState
    args: FrozenJsonObject
    started: bool = False


class _AwaitApproval(Exception):
    def __init__(self, wait: ApprovalRequested) -> None:
        super().__init__("awaiting approval")
        self.wait = wait


class _RunFailed(Exception):
    def __init__(self, error: OperationError) -> None:
        super().__init__(error.message)
        self.error = error


class _Park(Exception):
    def __init__(self, handle: DeferredHandle) -> None:
        super().__init__("parked")
        self.handle = handle


class _Aborted(Exception):
    pass


class _Overflow(Exception):
    pass


def _message_error(message: AssistantMessage) -> OperationError:
    error = message.error
    return OperationError(
        code=error.kind if error else "error",
        message=error.message if error else "the model failed",
    )


def _truncation() -> OperationError:
    return OperationError(
        code="context_overflow", message="the conversation does not fit the model's context window"
    )


def _give_up(entry_id: str, error: OperationError) -> MessageEntry:
    message = AssistantMessage(
        stop_reason="error",
        error=ModelError(kind="unknown", message=error.message),
        usage=TokenUsage(),
    )
    return MessageEntry(id=entry_id, message=message)


def _tool_calls(message: AssistantMessage) -> tuple[ToolCallPart, ...]:
    return tuple(part for part in message.content if isinstance(part, ToolCallPart))


class Procedures:
    """The procedures of one lane's open operation, acting through `fx`."""

    def __init__(
        self, lane: LaneRuntime, fx: Effects, tool_recovery: ToolRecovery = "declared"
    ) -> None:
        self.lane = lane
        self.fx = fx
        self.rt = lane.runtime
        self.tool_recovery = tool_recovery
        self.telemetry = Telemetry(self.rt.options.tracer, self.rt.options.trace_parent)
        self.span: Span = INVALID_SPAN
        """The operation's span (the parent of its step and tool spans)."""

    @property
    def op(self) -> OperationState:
        """The operation this procedure drives."""
        return self.lane.operation

    def _id(self) -> str:
        return self.rt.ids.next()

    def _emit(self, event: object) -> None:
        self.rt.events.emit(event)

    # -- runs --------------------------------------------------------------------------------

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
                    await self._run_tool_batch()
            batch = self.op.tool_batch
            if batch is not None and batch.unresolved:
                await self._reconcile_tool_batch()
            step = self.op.step
            if step is not None and step.kind == "assistant":
                outcome = await self._run_turn()
                if outcome is not None:
                    return outcome
            elif step is not None and step.kind == "compaction":
                await self._auto_compact(step.compaction_reason or "threshold")
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
            if await self._context_over_limit():
                await self._auto_compact("threshold")
            if needs_assistant(self.op):
                outcome = await self._run_turn()
                if outcome is not None:
                    return outcome
                continue
            for item in self._follow_ups(self.op):
                await fx.consume_queue_item(op.id, "follow_up", item.id)
            if has_pending_work(self.op):
                continue
            messages = tuple(await self.lane.context_messages())
            result = await fx.run_hook(
                "before_run_end",
                BeforeRunEndEvent(lane=self.lane.name, run_id=op.id, messages=messages),
            )
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

    async def _finished(
        self, kind: Literal["completed", "aborted", "failed"], error: OperationError | None = None
    ) -> Outcome:
        op = self.lane.last_finished
        assert op is not None
        final_id = op.last_assistant_entry_id
        final: AssistantMessage | None = None
        if final_id is not None:
            stored = await self.rt.storage.get_entry(final_id)
            if stored is not None and isinstance(stored.entry, MessageEntry):
                message = stored.entry.message
                final = message if isinstance(message, AssistantMessage) else None
        leaf = self.lane.state.leaf_id
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
        )

    async def _run_turn(self) -> Outcome | None:
        turn_id = self._id()
        self._emit(TurnStart(lane=self.lane.name, run_id=self.op.id, turn_id=turn_id))
        try:
            _, message = await self._assistant_step()
        except _Overflow:
            return await self._recover_overflow()
        if message.stop_reason == "aborted" or self.op.aborting:
            return await self._abort_path()
        results: tuple[ToolResultMessage, ...] = ()
        if _tool_calls(message):
            results = await self._run_tool_batch()
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
        await self._auto_compact("overflow")
        return None

    async def _recorded_failure(self) -> OperationError:
        """The error of the run's durable failure marker (a recovery ends as the live run would)."""
        newest = self.op.newest_own
        stored = await self.rt.storage.get_entry(newest.entry_id) if newest else None
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

    # -- model steps ---------------------------------------------------------------------------

    def _model(self) -> ModelRef:
        config = self.op.configuration
        return ModelRef(provider=config.provider, model_id=config.model_id)

    async def _request_options(self, step: StepKind, attempt: int) -> RequestOptions:
        event = BeforeRequestEvent(
            lane=self.lane.name,
            model=self._model(),
            step=step,
            attempt=attempt,
            options=self.rt.options.request_options,
        )
        result = await self.fx.run_hook("before_request", event)
        return result.options if isinstance(result, BeforeRequestEvent) else event.options

    def _system_prompt(self) -> str | None:
        intent = self.op.intent
        if isinstance(intent, RunIntent) and intent.system_prompt_override is not None:
            return intent.system_prompt_override
        return self.rt.system_prompt(self.lane.name)

    def _active_tools(self) -> list[Tool]:
        names = self.op.configuration.active_tools
        tools = self.rt.tools
        if names is None:
            return list(tools.values())
        return [tools[name] for name in names if name in tools]

    async def _assistant_request(self, options: RequestOptions, attempt: int) -> ModelRequest:
        context = await self.lane.context_messages()
        event = await self.fx.run_hook(
            "transform_context", TransformContextEvent(lane=self.lane.name, messages=context)
        )
        messages = event.messages if isinstance(event, TransformContextEvent) else context
        system_prompt = self._system_prompt()
        tokens = (
            await self.lane.context_tokens(system_prompt)
            if messages is context
            else estimate_tokens(messages, system_prompt)
        )
        config = self.op.configuration
        fields: dict[str, Any] = {
            "model": self._model(),
            "system_prompt": system_prompt,
            "estimated_input_tokens": tokens,
            "messages": messages,
            "tools": tuple(tool.definition() for tool in self._active_tools()),
            "thinking_level": config.thinking_level,
            "max_output_tokens": options.max_output_tokens,
            "deferred": options.deferred,
            "step": "assistant",
            "attempt": attempt,
        }
        if messages is context:
            # built from validated parts: skip re-validating a context that grows with the lane
            return ModelRequest.model_construct(**fields)
        return ModelRequest(**fields)

    async def _settle(self, message: AssistantMessage) -> AssistantMessage:
        result = await self.fx.run_hook(
            "after_response", AfterResponseEvent(lane=self.lane.name, message=message)
        )
        if isinstance(result, AfterResponseEvent) and result.message is not message:
            return self.lane.checked_response(result.message, "after_response")
        return message

    def _usage(
        self,
        cause: Literal["assistant", "compaction", "branch_summary", "deferred_fetch"],
        entry_id: str,
        attempt: int,
        message: AssistantMessage,
    ) -> Usage:
        return Usage(
            id=self._id(),
            lane=self.lane.name,
            cause=cause,
            run_id=self.op.id,
            entry_id=entry_id,
            attempt=attempt,
            stop_reason=message.stop_reason,
            usage=message.usage or TokenUsage(),
        )

    def _recoverable_overflow(self, message: AssistantMessage, options: RequestOptions) -> bool:
        info = self.rt.model.model_info(self._model())
        # the intended cap is the lower of the caller's and the model's own (D31)
        caps = [cap for cap in (options.max_output_tokens, info and info.max_output_tokens) if cap]
        desired = min(caps) if caps else 0
        return is_context_overflow(message, info) or is_recoverable_length(message, desired)

    async def _backoff(self, step: StepKind, attempt: int, message: AssistantMessage) -> None:
        retry = self.rt.options.retry
        error = message.error
        delay = retry.delay_ms(attempt, error.retry_after_ms if error else None)
        name = self.lane.name
        self._emit(
            RetryScheduled(
                lane=name,
                run_id=self.op.id,
                step=step,
                attempt=attempt,
                max_attempts=retry.max_attempts,
                delay_ms=delay,
                error_message=error.message if error else "",
            )
        )
        await self.fx.sleep(delay / 1000)
        self._emit(RetryStart(lane=name, run_id=self.op.id, step=step, attempt=attempt + 1))

    async def _assistant_step(self) -> tuple[StoredEntry, AssistantMessage]:
        span = self.telemetry.start("harness.step", self.span, self._step_attributes("assistant"))
        try:
            stored, final = await self._assistant_attempts(span)
        except BaseException as exc:
            Telemetry.end(span, {}, error=type(exc).__name__.strip("_").lower())
            raise
        Telemetry.end(span, {"harness.stop_reason": final.stop_reason})
        return stored, final

    def _step_attributes(self, kind: str) -> dict[str, str | int]:
        return {"harness.lane": self.lane.name, "harness.run_id": self.op.id, "harness.step": kind}

    async def _stream(self, request: ModelRequest, step: Span) -> AssistantMessage:
        """One provider request, in its own span (identifiers and counts only)."""
        span = self.telemetry.start(
            "harness.model_request",
            step,
            {
                "gen_ai.system": request.model.provider,
                "gen_ai.request.model": request.model.model_id,
                "harness.attempt": request.attempt,
            },
        )
        final = await self._settle(await self.fx.stream_assistant(request))
        usage = final.usage or TokenUsage()
        Telemetry.end(
            span,
            {
                "gen_ai.response.finish_reasons": final.stop_reason,
                "gen_ai.usage.input_tokens": usage.input,
                "gen_ai.usage.output_tokens": usage.output,
            },
            error=final.error.kind if final.error is not None else None,
        )
        return final

    async def _assistant_attempts(self, step_span: Span) -> tuple[StoredEntry, AssistantMessage]:
        fx = self.fx
        retried = False
        while True:
            if self.op.aborting:
                raise _Aborted()
            step = self.op.step
            attempt = (step.attempts if step is not None and step.kind == "assistant" else 0) + 1
            retry = self.rt.options.retry
            if attempt > retry.max_attempts:
                error = OperationError(
                    code="retries_exhausted", message=f"the model failed {retry.max_attempts} times"
                )
                assert step is not None
                await fx.append_entry(_give_up(step.result_entry_id, error))
                if retried:
                    self._emit(
                        RetryEnd(
                            lane=self.lane.name,
                            run_id=self.op.id,
                            step="assistant",
                            attempt=attempt - 1,
                            success=False,
                            final_error=error.message,
                        )
                    )
                raise _RunFailed(error)
            options = await self._request_options("assistant", attempt)
            result_id = self._id()
            await fx.append_record(
                StepAttempt(
                    id=self._id(),
                    lane=self.lane.name,
                    run_id=self.op.id,
                    step="assistant",
                    attempt=attempt,
                    result_entry_id=result_id,
                )
            )
            request = await self._assistant_request(options, attempt)
            final = await self._stream(request, step_span)
            await fx.append_record(
                self._usage("assistant", result_id, attempt, final)
            )  # the ledger first
            if self._recoverable_overflow(final, options):
                raise _Overflow()  # discarded: its id stays unfulfilled, its cost is recorded
            if final.stop_reason == "deferred" and final.deferred is not None:
                stored = await fx.append_entry(MessageEntry(id=result_id, message=final))
                self._emit(
                    RunSuspend(lane=self.lane.name, run_id=self.op.id, deferred=final.deferred)
                )
                raise _Park(final.deferred)
            if final.stop_reason == "error" and is_retryable(final):
                retried = True
                await self._backoff("assistant", attempt, final)
                continue
            stored = await fx.append_entry(MessageEntry(id=result_id, message=final))
            if retried:
                self._emit(
                    RetryEnd(
                        lane=self.lane.name,
                        run_id=self.op.id,
                        step="assistant",
                        attempt=attempt,
                        success=final.stop_reason != "error",
                    )
                )
            if final.stop_reason == "error":
                raise _RunFailed(_message_error(final))
            return stored, final

    async def _summary_step(
        self, kind: StepKind, reason: CompactionReason | None, result_id: str, text: str
    ) -> tuple[str, TokenUsage | None]:
        """Generate a summary (compaction or branch summary) under one provisioned result id."""
        span = self.telemetry.start("harness.step", self.span, self._step_attributes(kind))
        try:
            summary = await self._summary_attempts(kind, reason, result_id, text, span)
        except BaseException as exc:
            Telemetry.end(span, {}, error=type(exc).__name__.strip("_").lower())
            raise
        Telemetry.end(span, {})
        return summary

    async def _summary_attempts(
        self,
        kind: StepKind,
        reason: CompactionReason | None,
        result_id: str,
        text: str,
        step_span: Span,
    ) -> tuple[str, TokenUsage | None]:
        fx = self.fx
        while True:
            if self.op.aborting:
                raise _Aborted()
            step = self.op.step
            attempt = (step.attempts if step is not None and step.kind == kind else 0) + 1
            if attempt > self.rt.options.retry.max_attempts:
                raise _RunFailed(
                    OperationError(
                        code="retries_exhausted", message=f"the {kind} step failed every attempt"
                    )
                )
            options = await self._request_options(kind, attempt)
            await fx.append_record(
                StepAttempt(
                    id=self._id(),
                    lane=self.lane.name,
                    run_id=self.op.id,
                    step=kind,
                    attempt=attempt,
                    result_entry_id=result_id,
                    compaction_reason=reason,
                )
            )
            request = ModelRequest(
                model=self._model(),
                system_prompt=texts.SUMMARY_SYSTEM,
                messages=(UserMessage(content=(TextPart(text=text),)),),
                thinking_level=self.op.configuration.thinking_level,
                max_output_tokens=options.max_output_tokens,
                deferred=False,
                step=kind,
                attempt=attempt,
            )
            final = await self._stream(request, step_span)
            cause: Literal["compaction", "branch_summary"] = (
                "compaction" if kind == "compaction" else "branch_summary"
            )
            await fx.append_record(self._usage(cause, result_id, attempt, final))
            if final.stop_reason == "deferred":
                # a provider anomaly fails this operation; the session's other lanes go on
                if final.deferred is not None:
                    await fx.cancel_deferred(final.deferred)
                raise _RunFailed(
                    OperationError(
                        code="provider_anomaly",
                        message=f"a {kind} request got a deferred answer "
                        "(summary requests are never deferred)",
                    )
                )
            if final.stop_reason == "aborted":
                raise _Aborted()
            if final.stop_reason == "error":
                if is_retryable(final):
                    await self._backoff(kind, attempt, final)
                    continue
                raise _RunFailed(_message_error(final))
            return message_text(final).strip() or "(empty summary)", final.usage

    # -- compaction ----------------------------------------------------------------------------

    async def _preparation(self) -> CompactionPreparation:
        entries = await self.lane.context_entries()
        messages = await self.lane.context_messages()
        to_summarize, tail = plan_compaction(
            messages, self.rt.options.compaction.keep_recent_tokens
        )
        if entries and isinstance(entries[0].entry, CompactionEntry) and len(to_summarize) <= 1:
            # only the newest summary would be summarized again: it cannot get smaller
            to_summarize, tail = (), tuple(messages)
        return CompactionPreparation(
            to_summarize=to_summarize,
            retained_tail=tail,
            tokens_before=estimate_tokens(messages, self._system_prompt()),
        )

    async def _context_over_limit(self) -> bool:
        settings = self.rt.options.compaction
        if not settings.enabled:
            return False
        info = self.rt.model.model_info(self._model())
        if info is None:
            return False
        tokens = await self.lane.context_tokens(self._system_prompt())
        return tokens > info.context_window - settings.reserve_tokens

    async def _auto_compact(self, reason: CompactionReason) -> None:
        """Compact inside a run (no operation of its own)."""
        fx = self.fx
        op = self.op
        name = self.lane.name
        step = op.step
        resuming = step is not None and step.kind == "compaction"
        result_id = step.result_entry_id if resuming and step is not None else self._id()
        prep = await self._preparation()
        self._emit(CompactionStart(lane=name, run_id=op.id, reason=reason, recovery=resuming))
        if not resuming:
            if not prep.to_summarize:
                self._emit(
                    CompactionEnd(lane=name, run_id=op.id, reason=reason, outcome="declined")
                )
                if reason == "overflow":
                    raise _RunFailed(_truncation())
                return
            hook = await fx.run_hook(
                "before_compaction",
                BeforeCompactionEvent(lane=name, reason=reason, preparation=prep),
            )
            if isinstance(hook, BeforeCompactionResult) and hook.decline:
                self._emit(
                    CompactionEnd(lane=name, run_id=op.id, reason=reason, outcome="declined")
                )
                if reason == "overflow":
                    raise _RunFailed(_truncation())
                return
            supplied = (
                self._checked_summary("before_compaction", hook.compaction)
                if isinstance(hook, BeforeCompactionResult)
                else None
            )
            if supplied is not None:
                if reason == "overflow":  # the once-per-input guard must count it
                    await fx.append_record(
                        StepAttempt(
                            id=self._id(),
                            lane=name,
                            run_id=op.id,
                            step="compaction",
                            attempt=1,
                            result_entry_id=result_id,
                            compaction_reason=reason,
                        )
                    )
                await self._hook_usage(result_id, supplied)
                await fx.append_entry_if_missing(
                    self._compaction_entry(result_id, supplied.summary, prep, supplied)
                )
                self._emit(
                    CompactionEnd(
                        lane=name,
                        run_id=op.id,
                        reason=reason,
                        outcome="completed",
                        entry_id=result_id,
                        from_hook=True,
                    )
                )
                return
        summary, usage = await self._summary_step(
            "compaction", reason, result_id, summary_request_text(prep.to_summarize, None)
        )
        await fx.append_entry_if_missing(
            self._compaction_entry(result_id, summary, prep, None, usage)
        )
        self._emit(
            CompactionEnd(
                lane=name, run_id=op.id, reason=reason, outcome="completed", entry_id=result_id
            )
        )

    def _checked_summary(self, hook: str, supplied: SummaryResult | None) -> SummaryResult | None:
        """A hook-supplied summary that can be stored, or None (reported) if it cannot."""
        if supplied is None:
            return None
        try:
            usage = revalidated(supplied.usage) if supplied.usage is not None else None
            details = freeze_json(supplied.details)
        except (ValidationError, ValueError) as exc:
            reason = invalid_reason(exc) if isinstance(exc, ValidationError) else str(exc)
            self.rt.report("hook", hook, f"invalid summary ignored ({reason})")
            return None
        return SummaryResult(summary=str(supplied.summary), details=details, usage=usage)

    async def _hook_usage(self, entry_id: str, supplied: SummaryResult) -> None:
        if supplied.usage is not None:
            await self.fx.append_record(
                Usage(
                    id=self._id(),
                    lane=self.lane.name,
                    cause="hook",
                    run_id=self.op.id,
                    entry_id=entry_id,
                    usage=supplied.usage,
                )
            )

    def _compaction_entry(
        self,
        entry_id: str,
        summary: str,
        prep: CompactionPreparation,
        supplied: SummaryResult | None,
        usage: TokenUsage | None = None,
    ) -> CompactionEntry:
        return CompactionEntry(
            id=entry_id,
            summary=summary,
            retained_tail=prep.retained_tail,
            tokens_before=prep.tokens_before,
            details=supplied.details if supplied else None,
            usage=supplied.usage if supplied else usage,
        )

    async def compaction(self) -> Outcome:
        """The manual compaction operation."""
        fx = self.fx
        op = self.op
        intent = op.intent
        assert isinstance(intent, CompactionIntent)
        name = self.lane.name
        self._emit(
            CompactionStart(lane=name, run_id=op.id, reason="manual", recovery=op.step is not None)
        )
        try:
            if op.aborting:
                return await self._finish_structural("aborted")
            if not op.result_written:
                prep = await self._preparation()
                supplied: SummaryResult | None = None
                if op.step is None:  # no attempt yet: the decision hook may still run
                    hook = await fx.run_hook(
                        "before_compaction",
                        BeforeCompactionEvent(
                            lane=name,
                            reason="manual",
                            preparation=prep,
                            custom_instructions=intent.custom_instructions,
                        ),
                    )
                    if isinstance(hook, BeforeCompactionResult) and hook.decline:
                        return await self._finish_structural("declined")
                    if isinstance(hook, BeforeCompactionResult):
                        supplied = self._checked_summary("before_compaction", hook.compaction)
                    if supplied is not None:
                        await self._hook_usage(intent.result_entry_id, supplied)
                if supplied is not None:
                    entry = self._compaction_entry(
                        intent.result_entry_id, supplied.summary, prep, supplied
                    )
                else:
                    summary, usage = await self._summary_step(
                        "compaction",
                        "manual",
                        intent.result_entry_id,
                        summary_request_text(prep.to_summarize, intent.custom_instructions),
                    )
                    entry = self._compaction_entry(
                        intent.result_entry_id, summary, prep, None, usage
                    )
                await fx.append_entry_if_missing(entry)
            return await self._finish_structural("completed")
        except (_Aborted, _RunFailed, _Park) as signal:
            return await self._structural_signal(signal)

    # -- navigation ----------------------------------------------------------------------------

    async def _abandoned(self, source: str | None, target: str | None) -> tuple[Entry, ...]:
        """The entries on the source path that the target's path does not share."""
        if source is None:
            return ()
        from harness_core.session.types import BranchQuery

        storage = self.rt.storage
        target_ids: set[str] = set()
        if target is not None:
            target_ids = {
                e.id for e in await storage.find_entries_on_branch(BranchQuery(start=target))
            }
        abandoned: list[Entry] = []
        for stored in await storage.find_entries_on_branch(BranchQuery(start=source)):
            if stored.id in target_ids:
                break
            abandoned.append(stored.entry)
        return tuple(reversed(abandoned))

    async def navigation(self) -> Outcome:
        """The navigation operation: move first (the commit point), then summary and label."""
        fx = self.fx
        op = self.op
        intent = op.intent
        assert isinstance(intent, NavigationIntent)
        old_leaf = op.source_leaf_id
        try:
            if op.aborting:
                return await self._finish_structural("aborted")
            # the move is the commit point: after it the leaf is the target, or the branch
            # summary appended below it
            moved = self.lane.state.leaf_id == intent.target_id or op.result_written
            summary: SummaryResult | None = None
            abandoned: tuple[Entry, ...] = ()
            if intent.summarize and not op.result_written:
                abandoned = await self._abandoned(op.source_leaf_id, intent.target_id)
                if not moved and op.step is None:  # the decision hook: once, before the move
                    hook = await fx.run_hook(
                        "before_navigation",
                        BeforeNavigationEvent(
                            lane=self.lane.name, target_id=intent.target_id, abandoned=abandoned
                        ),
                    )
                    if isinstance(hook, BeforeNavigationResult) and hook.decline:
                        return await self._finish_structural("declined")
                    if isinstance(hook, BeforeNavigationResult):
                        summary = self._checked_summary("before_navigation", hook.summary)
                    if summary is not None:
                        assert intent.summary_entry_id is not None
                        await self._hook_usage(intent.summary_entry_id, summary)
                if summary is None:
                    assert intent.summary_entry_id is not None
                    messages = tuple(e.message for e in abandoned if isinstance(e, MessageEntry))
                    text, usage = await self._summary_step(
                        "branch_summary",
                        None,
                        intent.summary_entry_id,
                        summary_request_text(messages, intent.custom_instructions),
                    )
                    summary = SummaryResult(summary=text, usage=usage)
            if not moved:
                await fx.move_lane(intent.target_id)  # THE commit point
            if intent.summarize and not self.op.result_written and summary is not None:
                assert intent.summary_entry_id is not None
                await fx.append_entry_if_missing(
                    BranchSummaryEntry(
                        id=intent.summary_entry_id,
                        from_id=op.source_leaf_id or "root",
                        summary=summary.summary,
                        details=summary.details,
                        usage=summary.usage,
                    )
                )
            if intent.label is not None and intent.target_id is not None:
                await fx.set_fact(LabelFact(target_id=intent.target_id, label=intent.label))
            outcome = await self._finish_structural("completed")
            self._emit(
                NavigationEnd(
                    lane=self.lane.name,
                    run_id=op.id,
                    outcome="completed",
                    old_leaf_id=old_leaf,
                    new_leaf_id=self.lane.state.leaf_id,
                    summary_entry_id=intent.summary_entry_id if intent.summarize else None,
                )
            )
            return outcome
        except (_Aborted, _RunFailed, _Park) as signal:
            return await self._structural_signal(signal)

    # -- structural endings ----------------------------------------------------------------------

    async def _finish_structural(
        self, outcome: Literal["completed", "declined", "aborted"]
    ) -> Outcome:
        op = self.op
        result = await self.fx.finish_operation(op.id, outcome)
        if result == "continue":  # an abort won the ordering
            return await self._finish_structural("aborted")
        return self._structural_outcome(op, outcome)

    def _structural_outcome(
        self,
        op: OperationState,
        kind: Literal["completed", "declined", "aborted", "failed"],
        error: OperationError | None = None,
    ) -> Outcome:
        intent = op.intent
        entry_id = None
        if kind == "completed":
            if isinstance(intent, CompactionIntent):
                entry_id = intent.result_entry_id
            elif isinstance(intent, NavigationIntent):
                entry_id = intent.summary_entry_id
        if isinstance(intent, CompactionIntent):
            self._emit(
                CompactionEnd(
                    lane=self.lane.name,
                    run_id=op.id,
                    reason="manual",
                    outcome=kind,
                    entry_id=entry_id,
                    error=error,
                )
            )
        operation: Literal["compaction", "navigation"] = (
            "compaction" if isinstance(intent, CompactionIntent) else "navigation"
        )
        return Outcome(
            operation=operation,
            run_id=op.id,
            kind=kind,
            leaf_id=self.lane.state.leaf_id,
            error=error,
            entry_id=entry_id,
        )

    async def _structural_signal(self, signal: BaseException) -> Outcome:
        op = self.op
        if (
            isinstance(signal, _RunFailed)
            and await self.fx.finish_operation(op.id, "failed", signal.error) == "finished"
        ):
            return self._structural_outcome(op, "failed", signal.error)
        return await self._finish_structural("aborted")

    # -- abort ----------------------------------------------------------------------------------

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
                        self._synthetic(
                            call, call.started.result_entry_id, "interrupted", texts.INTERRUPTED
                        )
                    )
                else:
                    await fx.append_entry_if_missing(
                        self._synthetic(call, self._id(), "error", texts.ABORTED_CALL)
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
            if await fx.finish_operation(op.id, "aborted") == "finished":
                return await self._finished("aborted")

    # -- tools ----------------------------------------------------------------------------------

    def _synthetic(
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
            return self._synthetic(call, self._id(), "error", texts.no_such_tool(call.call.name))
        approval = self.op.approval
        decision = approval.decision(call.call.id) if approval is not None else None
        args = call.call.arguments
        if decision is not None and approval is not None:
            if not decision.approved:
                return self._denied(call, self._id(), decision)
            pending = next(p for p in approval.requested.calls if p.tool_call_id == call.call.id)
            args = decision.override_args if decision.override_args is not None else pending.args
        try:
            tool.parse(args)
        except ToolArgumentsError as exc:
            return self._synthetic(call, self._id(), "error", str(exc))
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
                return self._synthetic(call, self._id(), "blocked", hook.block)
            if hook.args is not None and decision is not None and hook.args != args:
                return self._synthetic(call, self._id(), "blocked", texts.CHANGED_AFTER_APPROVAL)
            if hook.args is not None:
                try:
                    tool.parse(hook.args)
                except ToolArgumentsError as exc:
                    return self._synthetic(call, self._id(), "error", str(exc))
                args = hook.args
        if tool.requires_approval and decision is None:
            return _NeedsApproval(call, args)
        if self.op.aborting:
            return self._synthetic(call, self._id(), "error", texts.ABORTED_CALL)
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
            output = self.lane.checked_output(patched, call.name)
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
        message = ToolResultMessage(
            tool_call_id=call.id,
            tool_name=call.name,
            content=output.content,
            outcome="error" if output.is_error else "ok",
            details=output.details,
            usage=output.usage,
        )
        await fx.append_entry_if_missing(
            MessageEntry(id=result_id, message=message, terminate=output.terminate)
        )
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

    async def _run_tool_batch(self) -> tuple[ToolResultMessage, ...]:
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
                        self._synthetic(call, self._id(), "error", texts.TRUNCATED_CALL)
                    )
                )
        return tuple(results)

    async def _reconcile_tool_batch(self) -> None:
        """Recover a batch call by call, in source order, each at its own crash site."""
        batch = self.op.tool_batch
        assert batch is not None
        if batch.truncated:
            await self._truncated(batch.calls)
            return
        waiting: list[_NeedsApproval] = []
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
            tool = self.rt.tools.get(started.tool_name)
            if tool is not None and self._replays(started, tool) and tool.requires_approval:
                decision = self._replay_decision(call)  # an earlier approval does not count
                if decision is None:
                    waiting.append(_NeedsApproval(call, started.effective_args, started=True))
                    continue
                if not decision.approved:
                    await self.fx.append_entry_if_missing(
                        self._denied(call, started.result_entry_id, decision)
                    )
                    continue
            if tool is not None and self._replays(started, tool):  # X3/X4: replay
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
                    self._synthetic(call, started.result_entry_id, "interrupted", texts.INTERRUPTED)
                )
        await self._request_approval(waiting)

    def _replays(self, started: ToolStarted, tool: Tool) -> bool:
        """Whether a started call without a result runs again, under this resume's policy."""
        if self.tool_recovery == "never":
            return False
        if self.tool_recovery == "always":
            return True
        return started.replay == "safe" and tool.replay == "safe"

    def _replay_decision(self, call: ToolCallState) -> ApprovalDecision | None:
        """A decision made for replaying this started call (not the one that first ran it)."""
        approval = self.op.approval
        if approval is None or not any(
            p.tool_call_id == call.call.id and p.started for p in approval.requested.calls
        ):
            return None
        return approval.decision(call.call.id)

    def _denied(
        self, call: ToolCallState, entry_id: str, decision: ApprovalDecision
    ) -> MessageEntry:
        decided = self.op.approval.decided if self.op.approval else None
        text = texts.denied(decided.decided_by if decided else None, decision.reason)
        return self._synthetic(call, entry_id, "denied", text)

    # -- deferred ---------------------------------------------------------------------------------

    async def _redeem_deferred(self) -> AssistantMessage:
        fx = self.fx
        handle = self.op.deferred
        assert handle is not None
        final = await self._settle(await fx.fetch_deferred(handle))
        result_id = self._id()
        reported = final.usage is not None and final.usage != TokenUsage()
        if final.stop_reason != "deferred" or reported:
            await fx.append_record(self._usage("deferred_fetch", result_id, 1, final))
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
