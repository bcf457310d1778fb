"""A lane's external effects: model requests, tool runs, deferred requests, hooks and sleeps.

Never inside a job (the mutation line stays free while they wait), each one first makes the
procedure's writes durable (`HarnessRuntime.durable`, a barrier) and, before paid work, waits
for the writer lease's authority; an abort of the lane settles it early. What comes back from
foreign code (a provider, a tool, a hook) is validated here before it can reach a record.
`LaneRuntime`'s `Effects` methods delegate to these bodies.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

from pydantic import ValidationError

from harness_core import texts
from harness_core._runtime.effects import LaterEvent
from harness_core.events import MessageStart, MessageUpdate
from harness_core.frozen import invalid_reason, revalidated
from harness_core.hooks import HookName, run_hook
from harness_core.messages import (
    AssistantMessage,
    DeferredHandle,
    ModelError,
    TextPart,
    TokenUsage,
    UserContent,
)
from harness_core.models import ModelRequest
from harness_core.tools import MAX_TOOL_TEXT_CHARS, PreparedToolCall, ToolOutput

if TYPE_CHECKING:
    from harness_core._runtime.lane import HarnessRuntime

__all__ = ["AbortSignal", "ExternalEffects"]

_T = TypeVar("_T")


TOOL_ABORT_GRACE_S: Final = 10.0
"""How long a tool may go on after its run's abort before it is cut off (D407): a tool that
ignores `ToolContext.abort` held its lane ``aborting`` for as long as it ran, for ever if it
hung; cut, its result says it may have had its effect (the race catalog's row 10)."""


class InterruptedOutput(ToolOutput):
    """A tool's result when it was cut off mid-call: the outcome is unknown (``interrupted``)."""


class AbortSignal(asyncio.Event):
    """A lane's abort signal: an `asyncio.Event` that also calls back when it is set.

    An effect races its work against the abort; a callback does that without a second task
    waiting on the event (and an `asyncio.wait` over both) for every model request.
    """

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], object]] = []

    def set(self) -> None:
        """Set the event, wake its waiters and call every callback."""
        super().set()
        for callback in list(self._callbacks):
            callback()

    def add_callback(self, callback: Callable[[], object]) -> None:
        """Call `callback` (no arguments) whenever the signal is set, until removed."""
        self._callbacks.append(callback)

    def remove_callback(self, callback: Callable[[], object]) -> None:
        """Stop calling `callback` (no error if it was not added)."""
        with contextlib.suppress(ValueError):
            self._callbacks.remove(callback)


class ExternalEffects:
    """One lane's effects outside the store, stopped by its abort signal."""

    def __init__(self, runtime: HarnessRuntime, lane: str, abort_signal: AbortSignal) -> None:
        self.runtime = runtime
        self.lane = lane
        self.abort_signal = abort_signal
        self.streaming = False
        """A `message_start` for the assistant message in flight was emitted (streaming).

        The lane's commit of that message reads and clears it, so the message starts once.
        """

    async def _until_aborted(self, work: Awaitable[_T]) -> _T | None:
        """Run `work`, abandoning it (None) if the lane's abort signal fires first."""
        task = asyncio.ensure_future(work)
        settled = asyncio.get_running_loop().create_future()

        def wake(_: object = None) -> None:
            if not settled.done():
                settled.set_result(None)

        task.add_done_callback(wake)
        signal = self.abort_signal
        signal.add_callback(wake)
        if signal.is_set():
            asyncio.get_running_loop().call_soon(wake)  # after the work's first step, as before
        try:
            await settled
        finally:
            task.remove_done_callback(wake)
            signal.remove_callback(wake)
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        return None

    async def stream_assistant(self, request: ModelRequest, run_id: str | None) -> AssistantMessage:
        """One provider request; an abort (or close) settles it as ``stop_reason="aborted"``."""
        self.runtime.check()
        events = self.runtime.events

        def progress(partial: AssistantMessage) -> None:
            if not self.streaming:
                self.streaming = True
                if events.wants("message_start"):
                    events.emit(MessageStart(lane=self.lane, run_id=run_id, message=partial))
            if events.wants("message_update"):
                events.emit(MessageUpdate(lane=self.lane, run_id=run_id or "", message=partial))

        self.streaming = False  # a retried attempt streams (and starts) again
        # the request's intent (its step attempt) first; a power loss may send it again (D233)
        await self.runtime.durable(point=False)
        await self.runtime.authority()  # never start a paid call on a lapsing lease
        if self.abort_signal.is_set():  # aborted before the request went out: never send it
            return AssistantMessage(stop_reason="aborted", usage=TokenUsage())
        try:
            message = await self._until_aborted(self.runtime.model.request(request, progress))
        except Exception as exc:  # a client that raised instead of answering in band
            return AssistantMessage(
                stop_reason="error",
                error=ModelError(
                    kind="unknown", message=f"{type(exc).__name__}: {exc}", retryable=True
                ),
                usage=TokenUsage(),
            )
        self.runtime.check()
        if message is None:
            return AssistantMessage(stop_reason="aborted", usage=TokenUsage())
        return self.checked_response(message, str(request.model))

    def checked_response(self, message: AssistantMessage, source: str) -> AssistantMessage:
        """A provider's (or hook's) message, valid before it can reach a record or an entry.

        A message whose only invalid part is its usage (a NaN cost) keeps its content with the
        usage zeroed, and the loss is reported; any other invalid message becomes a retryable
        error, so a provider's bad number never faults the lane's store.
        """
        try:
            return revalidated(message)
        except ValidationError as exc:
            reason = invalid_reason(exc)
        try:
            kept = revalidated(message.model_copy(update={"usage": TokenUsage()}))
        except ValidationError:
            self.runtime.report("model", source, f"invalid message ({reason})")
            return AssistantMessage(
                stop_reason="error",
                error=ModelError(
                    kind="unknown",
                    message=f"the provider returned an invalid message ({reason})",
                    retryable=True,
                ),
                usage=TokenUsage(),
            )
        self.runtime.report("model", source, f"invalid usage dropped ({reason})")
        return kept

    async def execute_tool(self, prepared: PreparedToolCall) -> ToolOutput:
        """Run a tool; after an abort it may settle (it sees `ctx.abort`) for the grace, D407.

        A call whose run was aborted before it started does not start: its result says so.
        Whatever it gives or raises becomes a result that can be stored: its text cut to
        `MAX_TOOL_TEXT_CHARS` (D404), a character no JSON can hold (an unpaired surrogate, as
        ``os.fsdecode`` makes) replaced. Such a text faulted the whole session, every lane with
        a call running in it losing that call's result (an outside probe).
        """
        output = _text_bounded(await self._run_tool(prepared))
        try:
            output.model_dump_json()
        except ValueError:  # pydantic's serialization error: the surrogates' UnicodeEncodeError
            self.runtime.report("tool", prepared.tool.name, "unpaired surrogates replaced")
            output = type(output).model_validate(_without_surrogates(output.model_dump()))
        return output

    async def _run_tool(self, prepared: PreparedToolCall) -> ToolOutput:
        self.runtime.check()
        tool = prepared.tool
        # the call's intent first: a power-loss durability point unless it may run again (D233)
        await self.runtime.durable(point=tool.replay != "safe" or tool.requires_approval)
        await self.runtime.authority()
        if self.abort_signal.is_set():
            return ToolOutput.text(texts.NOT_RUN_ABORTED, is_error=True)
        loop = asyncio.get_running_loop()
        limit = loop.time() + tool.timeout_seconds if tool.timeout_seconds else None
        cut = False  # the abort's grace ran out, not the tool's own timeout
        scope: asyncio.Timeout | None = None

        def aborted() -> None:
            nonlocal cut
            grace_end = loop.time() + TOOL_ABORT_GRACE_S
            # once only, and never on a scope already expiring: a second abort (`ask`'s Ctrl-C
            # path sets it again) raised "Cannot change state of expiring Timeout" into the
            # one who aborted (an outside probe), and would have moved the grace's end later
            if cut or scope is None or scope.expired():
                return
            if limit is None or grace_end < limit:
                cut = True
                scope.reschedule(grace_end)

        try:
            args = tool.parse(prepared.args)
            # in this task, not a new one: a tool's SystemExit stays a failure of its call
            async with asyncio.timeout_at(limit) as scope:
                self.abort_signal.add_callback(aborted)
                if self.abort_signal.is_set():
                    aborted()
                try:
                    raw = await tool.execute(args, prepared.context)
                finally:
                    self.abort_signal.remove_callback(aborted)
        except TimeoutError as exc:
            # raised by the tool itself (the scope did not expire): its failure, not a timeout
            if scope is None or not scope.expired():
                return ToolOutput.text(texts.tool_failed(tool.name, exc), is_error=True)
            if cut:
                said = texts.tool_cut_by_abort(tool.name, TOOL_ABORT_GRACE_S)
                return InterruptedOutput.text(said, is_error=True)
            return ToolOutput.text(
                texts.tool_timed_out(tool.name, tool.timeout_seconds or 0), is_error=True
            )
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # this task is being cancelled: the run's abort, the process stopping
            # raised by the tool itself: its failure, or the lane sat unanswered, no word said
            return ToolOutput.text(texts.tool_failed(tool.name, exc), is_error=True)
        except BaseException as exc:
            # foreign code: a tool that calls sys.exit(), raises KeyboardInterrupt or
            # GeneratorExit fails its call; the first two ended the whole process, every lane
            # with it, the third faulted the session (outside probes)
            return ToolOutput.text(texts.tool_failed(tool.name, exc), is_error=True)
        returned: object = raw  # typed, but a tool is foreign code
        if isinstance(returned, str):
            return ToolOutput.text(returned)
        if not isinstance(returned, ToolOutput):
            return ToolOutput.text(
                f"{tool.name} returned {type(returned).__name__}, not text or a ToolOutput",
                is_error=True,
            )
        return self.checked_output(returned, tool.name)

    def checked_output(self, output: ToolOutput, tool_name: str) -> ToolOutput:
        """A tool's (or hook's) output, valid before it can reach a record or an entry."""
        try:
            return revalidated(output)
        except ValidationError as exc:
            reason = invalid_reason(exc)
        self.runtime.report("tool", tool_name, f"invalid output ({reason})")
        return ToolOutput.text(texts.invalid_result(tool_name, reason), is_error=True)

    async def fetch_deferred(self, handle: DeferredHandle) -> AssistantMessage:
        """Check a deferred request once; a raised failure becomes an error message."""
        await self.runtime.durable(point=False)  # a check: asking again is harmless
        await self.runtime.authority()
        try:
            message = await self._until_aborted(self.runtime.model.fetch_deferred(handle))
        except Exception as exc:
            return AssistantMessage(
                stop_reason="error",
                error=ModelError(kind="unknown", message=f"deferred fetch failed: {exc}"),
                usage=TokenUsage(),
            )
        if message is None:
            return AssistantMessage(stop_reason="aborted", usage=TokenUsage())
        return self.checked_response(message, f"{handle.provider}:{handle.model}")

    async def cancel_deferred(self, handle: DeferredHandle) -> None:
        """Best effort: a failure is reported, not raised."""
        await self.runtime.durable(point=False)  # cancelling again is harmless
        try:
            await self.runtime.model.cancel_deferred(handle)
        except Exception as exc:
            self.runtime.report("hook", "cancel_deferred", exc)

    async def run_hook(self, name: HookName, event: Any) -> Any:
        """Run a hook's handlers; a failing handler is isolated and reported."""
        self.runtime.check()
        if self.runtime.hooks.registrations(name):
            await self.runtime.durable()  # a handler is foreign code: it may act on what it sees
            if isinstance(event, LaterEvent):
                event = await event.make()
        elif isinstance(event, LaterEvent):
            return None  # no handler: nobody sees the event, and the answer is None
        return await run_hook(
            self.runtime.hooks,
            name,
            event,
            lambda hook, exc: self.runtime.report("hook", hook, exc),
        )

    async def sleep(self, seconds: float) -> Literal["elapsed", "aborted"]:
        """Back off; an abort ends the wait."""
        self.runtime.check()
        # never hold deferred writes (and SQLite's lock) across a wait; nobody depends on them
        await self.runtime.durable(point=False)

        async def wait() -> bool:
            await self.runtime.clock.sleep(seconds)
            return True

        waited = await self._until_aborted(wait())
        return "elapsed" if waited else "aborted"


_SURROGATE = re.compile("[\ud800-\udfff]")


def _without_surrogates(value: Any) -> Any:
    """`value` (a model's dump) with every unpaired surrogate written as U+FFFD."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_without_surrogates(k): _without_surrogates(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_surrogates(item) for item in value]
    return value


def _text_bounded(output: ToolOutput) -> ToolOutput:
    """`output` with its text cut to `MAX_TOOL_TEXT_CHARS`, a note saying how much (D404)."""
    total = sum(len(part.text) for part in output.content if isinstance(part, TextPart))
    if total <= MAX_TOOL_TEXT_CHARS:
        return output
    left = MAX_TOOL_TEXT_CHARS
    kept: list[UserContent] = []
    for part in output.content:
        if not isinstance(part, TextPart):
            kept.append(part)
        elif shown := part.text[:left]:
            left -= len(shown)
            kept.append(TextPart(text=shown))
    kept.append(TextPart(text=texts.tool_output_cut(total, MAX_TOOL_TEXT_CHARS)))
    return output.model_copy(update={"content": tuple(kept)})
