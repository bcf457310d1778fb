"""Model steps: the one retry loop every model request goes through, assistant or summary."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

from opentelemetry.trace import Span

from harness_core import texts
from harness_core._runtime.context import estimate_tokens
from harness_core._runtime.lane_context import Withheld
from harness_core._runtime.procedures.common import (
    Part,
    _Aborted,
    _give_up,
    _message_error,
    _Overflow,
    _Park,
    _RunFailed,
)
from harness_core._runtime.telemetry import Telemetry
from harness_core.events import (
    RetryEnd,
    RetryScheduled,
    RetryStart,
    RunSuspend,
)
from harness_core.hooks import (
    AfterResponseEvent,
    BeforeRequestEvent,
    RequestOptions,
    TransformContextEvent,
)
from harness_core.messages import (
    AssistantMessage,
    ModelErrorKind,
    TextPart,
    TokenUsage,
    ToolCallPart,
    UserMessage,
    message_text,
)
from harness_core.models import (
    ModelRequest,
    is_context_overflow,
    is_recoverable_length,
    is_retryable,
)
from harness_core.options import RetryPolicy
from harness_core.session.entries import MessageEntry
from harness_core.session.records import (
    CompactionReason,
    OperationError,
    StepAttempt,
    StepKind,
    Usage,
)
from harness_core.session.types import StoredEntry

__all__ = ["Steps"]


def _refused(message: AssistantMessage) -> bool:
    """The provider refused the request as invalid: the same request would be refused again."""
    return message.error is not None and message.error.kind == "invalid_request"


class Steps(Part):
    """Model requests: a durable `step_attempt` first, the usage record before any decision."""

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

    async def _assistant_request(self, options: RequestOptions, attempt: int) -> ModelRequest:
        context = await self.lane.context.request_messages()
        event = await self.fx.run_hook(
            "transform_context", TransformContextEvent(lane=self.lane.name, messages=context)
        )
        messages = event.messages if isinstance(event, TransformContextEvent) else context
        system_prompt = self._system_prompt()
        tokens = (
            await self.lane.context.tokens(system_prompt)
            if messages is context
            else estimate_tokens(messages, system_prompt)
        )
        config = self.op.configuration
        fields: dict[str, Any] = {
            "model": self._model(),
            "system_prompt": system_prompt,
            "estimated_input_tokens": tokens,
            "messages": messages,
            "tools": self.rt.tool_definitions(self._active_tools()),
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

    async def settle(self, message: AssistantMessage) -> AssistantMessage:
        result = await self.fx.run_hook(
            "after_response", AfterResponseEvent(lane=self.lane.name, message=message)
        )
        if isinstance(result, AfterResponseEvent) and result.message is not message:
            return self.lane.external.checked_response(result.message, "after_response")
        return message

    def usage(
        self,
        cause: StepKind | Literal["deferred_fetch"],
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
        window = info.context_window if info is not None else None
        return is_context_overflow(message, info) or is_recoverable_length(message, desired, window)

    async def _backoff(self, step: StepKind, attempt: int, message: AssistantMessage) -> None:
        error = message.error
        hint = error.retry_after_ms if error else None
        delay = self.rt.options.retry.delay_ms(attempt, hint, spread=f"{self.op.id}:{step}")
        self._retry_scheduled(
            step, attempt, delay, error.message if error else "", error.kind if error else None
        )
        await self.fx.sleep(delay / 1000)
        self._retry_start(step, attempt)

    def _withheld_retry(self, attempt: int, refused: AssistantMessage) -> None:
        """Tell subscribers the refused request goes again at once, its images withheld."""
        error = refused.error
        note = f"{error.message if error else ''} (sent again without the conversation's images)"
        self._retry_scheduled("assistant", attempt, 0, note, error.kind if error else None)
        self._retry_start("assistant", attempt)

    def _retry_scheduled(
        self, step: StepKind, attempt: int, delay_ms: int, error: str, kind: ModelErrorKind | None
    ) -> None:
        self._emit(
            RetryScheduled(
                lane=self.lane.name,
                run_id=self.op.id,
                step=step,
                attempt=attempt,
                max_attempts=self.rt.options.retry.max_attempts,
                delay_ms=delay_ms,
                error_message=error,
                error_kind=kind,
            )
        )

    def _retry_start(self, step: StepKind, attempt: int) -> None:
        self._emit(
            RetryStart(lane=self.lane.name, run_id=self.op.id, step=step, attempt=attempt + 1)
        )

    async def assistant_step(self) -> tuple[StoredEntry, AssistantMessage]:
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
        with Telemetry.current(span):  # the client's own spans (HTTP, pydantic-ai) nest here
            answer = await self.fx.stream_assistant(request)
        final = await self.settle(answer)
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

    async def _attempts(
        self,
        kind: StepKind,
        span: Span,
        build: Callable[[RequestOptions, int], Awaitable[ModelRequest]],
        screen: Callable[[str, AssistantMessage, RequestOptions], Awaitable[None]],
        *,
        result_id: str | None = None,
        reason: CompactionReason | None = None,
    ) -> tuple[str, AssistantMessage, int, bool]:
        """The one retry loop of every model step: (result id, final message, attempt, retried).

        Each attempt is durable before its request (`step_attempt`, counted, so a restart never
        resets the cap) and its usage is recorded before any decision. `screen` sees every
        settled message first and may end the step (an overflow, a park, an anomaly); then a
        retryable error backs off and tries again, a request the provider refused as invalid
        goes once more with the window's images withheld (D289), and anything else is
        returned. Assistant attempts each provision a fresh result id; summary attempts share
        `result_id`. At the cap the step fails `retries_exhausted` (an assistant step first
        writes its failure marker under the last attempt's id).
        """
        fx = self.fx
        retried = False
        withheld = False  # this step withheld the window's images after a refusal (D289)
        before: Withheld | None = None
        last_error: str | None = None  # the provider's words for the last retryable failure
        while True:
            if self.op.aborting:
                raise _Aborted()
            step = self.op.step
            attempt = (step.attempts if step is not None and step.kind == kind else 0) + 1
            retry = self.rt.options.retry
            if attempt > retry.max_attempts:
                error = OperationError(
                    code="retries_exhausted", message=_exhausted(kind, retry, last_error)
                )
                if kind == "assistant":
                    assert step is not None
                    await fx.append_entry(_give_up(step.result_entry_id, error))
                if retried:
                    final_error = last_error or error.message
                    self._retry_end(kind, attempt - 1, success=False, final_error=final_error)
                raise _RunFailed(error)
            options = await self._request_options(kind, attempt)
            this_id = result_id if result_id is not None else self._id()
            await fx.append_record(
                StepAttempt(
                    id=self._id(),
                    lane=self.lane.name,
                    run_id=self.op.id,
                    step=kind,
                    attempt=attempt,
                    result_entry_id=this_id,
                    compaction_reason=reason,
                )
            )
            final = await self._stream(await build(options, attempt), span)
            await fx.append_record(self.usage(kind, this_id, attempt, final))  # the ledger first
            await screen(this_id, final, options)
            last = attempt >= retry.max_attempts  # at the cap: fail now, no wait, no retry said
            if final.stop_reason == "error" and is_retryable(final):
                retried = True
                last_error = final.error.message if final.error is not None else None
                if not last:
                    await self._backoff(kind, attempt, final)
                continue
            if kind == "assistant" and not last and _refused(final):
                if withheld:  # refused with the images withheld too: they were not why
                    self.lane.context.withheld = before
                else:
                    before = self.lane.context.withheld
                    withheld = self.lane.context.withhold_images(await self.lane.context.messages())
                    if withheld:
                        retried = True
                        self._withheld_retry(attempt, final)
                        continue
            return this_id, final, attempt, retried

    def _retry_end(
        self, kind: StepKind, attempt: int, *, success: bool, final_error: str | None = None
    ) -> None:
        self._emit(
            RetryEnd(
                lane=self.lane.name,
                run_id=self.op.id,
                step=kind,
                attempt=attempt,
                success=success,
                final_error=final_error,
            )
        )

    async def _screen_assistant(
        self, result_id: str, final: AssistantMessage, options: RequestOptions
    ) -> None:
        if self._recoverable_overflow(final, options):
            raise _Overflow()  # discarded: its id stays unfulfilled, its cost is recorded
        if final.stop_reason == "deferred" and final.deferred is not None:
            await self.fx.append_entry(MessageEntry(id=result_id, message=final))
            self._emit(RunSuspend(lane=self.lane.name, run_id=self.op.id, deferred=final.deferred))
            raise _Park(final.deferred)

    async def _assistant_attempts(self, span: Span) -> tuple[StoredEntry, AssistantMessage]:
        result_id, final, attempt, retried = await self._attempts(
            "assistant", span, self._assistant_request, self._screen_assistant
        )
        final = _unique_call_ids(final)
        stored = await self.fx.append_entry(MessageEntry(id=result_id, message=final))
        if retried:
            self._retry_end("assistant", attempt, success=final.stop_reason != "error")
        if final.stop_reason == "error":
            raise _RunFailed(_message_error(final))
        return stored, final

    async def summary_step(
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
        span: Span,
    ) -> tuple[str, TokenUsage | None]:
        async def build(options: RequestOptions, attempt: int) -> ModelRequest:
            return ModelRequest(
                model=self._model(),
                system_prompt=texts.SUMMARY_SYSTEM,
                messages=(UserMessage(content=(TextPart(text=text),)),),
                thinking_level=self.op.configuration.thinking_level,
                max_output_tokens=options.max_output_tokens,
                deferred=False,
                step=kind,
                attempt=attempt,
            )

        async def screen(_: str, final: AssistantMessage, options: RequestOptions) -> None:
            if final.stop_reason == "deferred":
                # a provider anomaly fails this operation; the session's other lanes go on
                if final.deferred is not None:
                    await self.fx.cancel_deferred(final.deferred)
                raise _RunFailed(
                    OperationError(
                        code="provider_anomaly",
                        message=f"a {kind} request got a deferred answer "
                        "(summary requests are never deferred)",
                    )
                )
            if final.stop_reason == "aborted":
                raise _Aborted()

        _, final, attempt, retried = await self._attempts(
            kind, span, build, screen, result_id=result_id, reason=reason
        )
        if retried:
            self._retry_end(kind, attempt, success=final.stop_reason != "error")
        if final.stop_reason == "error":
            raise _RunFailed(_message_error(final))
        return message_text(final).strip() or "(empty summary)", final.usage


def _exhausted(kind: StepKind, retry: RetryPolicy, last_error: str | None) -> str:
    """Why the step gave up.

    With the provider's last words when this process heard them: an operator read only "the
    model failed 3 times".
    """
    said = (
        f"the model failed {retry.max_attempts} times"
        if kind == "assistant"
        else f"the {kind} step failed every attempt"
    )
    if last_error:
        said += f"; the last error: {texts.one_line(last_error)}"
    return said


def _unique_call_ids(message: AssistantMessage) -> AssistantMessage:
    """`message` with no two tool calls under one id: a repeat becomes ``<id>_2`` (``_3``...).

    A provider that gave two calls one id had one call's approval, decision and result taken
    for the other's: the first ran twice and the second never. The new id is the call's from
    here on, sent back to the provider with its call and its result (D308).
    """
    calls = [part for part in message.content if isinstance(part, ToolCallPart)]
    if len({call.id for call in calls}) == len(calls):
        return message
    taken: set[str] = set()
    content: list[Any] = []
    for part in message.content:
        if isinstance(part, ToolCallPart):
            unique, n = part.id, 1
            while unique in taken:
                n += 1
                unique = f"{part.id}_{n}"
            taken.add(unique)
            content.append(part.model_copy(update={"id": unique}))
        else:
            content.append(part)
    return message.model_copy(update={"content": tuple(content)})
