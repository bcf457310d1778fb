"""Hooks: handlers that can change execution, registered harness-wide, run in registration order.

Ten hooks (`HookName`). Every event carries the lane; a handler scopes itself. Handlers run
sequentially: each transformation sees the previous one's output. A handler that raises is
skipped and reported (a `handler_error` event); the run goes on, except for `before_tool`,
which fails closed: a policy handler that crashed must not let a tool through. `before_run` and
`before_resume` handlers need a stable `id` (the run stores each `before_run` handler's
`resume_data` under it, and hands it back to the `before_resume` handler with the same id).

The seed's eleventh hook, ``before_payload`` (the provider's wire payload), is refused at
registration with `HarnessNotImplemented`: pydantic-ai builds that payload inside its own request
call, so the runtime has no point where such a handler could run. `before_request` changes a
request's options and `transform_context` its messages.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args, overload

from harness_core.errors import HarnessNotImplemented
from harness_core.frozen import JsonValue
from harness_core.messages import AgentMessage, AssistantMessage, TokenUsage, UserContent
from harness_core.models import ModelRef
from harness_core.session.entries import Entry
from harness_core.session.records import CompactionReason, OperationKind, StepKind
from harness_core.tools import ToolOutput

__all__ = [
    "AfterResponseEvent",
    "AfterToolEvent",
    "AfterToolPatch",
    "BeforeCompactionEvent",
    "BeforeCompactionResult",
    "BeforeNavigationEvent",
    "BeforeNavigationResult",
    "BeforeRequestEvent",
    "BeforeResumeEvent",
    "BeforeRunEndEvent",
    "BeforeRunEndResult",
    "BeforeRunEvent",
    "BeforeRunResult",
    "BeforeToolEvent",
    "BeforeToolResult",
    "CompactionPreparation",
    "HookError",
    "HookName",
    "Hooks",
    "RequestOptions",
    "SummaryResult",
    "TransformContextEvent",
]

HookName = Literal[
    "before_run",
    "before_resume",
    "before_run_end",
    "transform_context",
    "before_request",
    "after_response",
    "before_tool",
    "after_tool",
    "before_compaction",
    "before_navigation",
]
_NEEDS_ID = ("before_run", "before_resume")
_REFUSED = {
    "before_payload": "the provider wire payload is built inside pydantic-ai's request call, "
    "where no hook can run: change request options with before_request, or the messages "
    "with transform_context",
}
"""Hooks of the seed's catalog this runtime cannot run, with what to use instead."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RequestOptions:
    """Provider-neutral options of one request (`before_request` may patch them)."""

    max_output_tokens: int | None = None
    temperature: float | None = None
    deferred: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class BeforeRunEvent:
    """The normalized prompt of a run about to be accepted."""

    lane: str
    prompt: tuple[AgentMessage, ...]
    system_prompt: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class BeforeRunResult:
    """Messages to add, a system prompt override, and data for `before_resume`."""

    messages: tuple[AgentMessage, ...] = ()
    """Appended after the prompt, persisted in the run's initial messages."""
    system_prompt: str | None = None
    """Replaces the system prompt for the whole run (persisted)."""
    resume_data: JsonValue = None
    """Kept under the handler's id for its `before_resume` counterpart."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BeforeResumeEvent:
    """An open operation is being resumed (rebuild process-local state; be idempotent)."""

    lane: str
    run_id: str
    kind: OperationKind
    prompt: tuple[AgentMessage, ...] = ()
    system_prompt_override: str | None = None
    resume_data: JsonValue = None


@dataclass(frozen=True, kw_only=True, slots=True)
class BeforeRunEndEvent:
    """A run reached a normal finish boundary."""

    lane: str
    run_id: str
    messages: tuple[AgentMessage, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class BeforeRunEndResult:
    """A follow-up that continues the same run (dropped if an abort wins meanwhile)."""

    follow_up: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class TransformContextEvent:
    """The messages of one request (ephemeral: shapes what the provider sees)."""

    lane: str
    messages: tuple[AgentMessage, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class BeforeRequestEvent:
    """One provider request is about to be built."""

    lane: str
    model: ModelRef
    step: StepKind
    attempt: int
    options: RequestOptions


@dataclass(frozen=True, kw_only=True, slots=True)
class AfterResponseEvent:
    """A response arrived, before its message is committed."""

    lane: str
    message: AssistantMessage


@dataclass(frozen=True, kw_only=True, slots=True)
class BeforeToolEvent:
    """A validated tool call is about to start."""

    lane: str
    run_id: str
    tool_call_id: str
    tool_name: str
    args: Mapping[str, Any]


@dataclass(frozen=True, kw_only=True, slots=True)
class BeforeToolResult:
    """Replacement arguments, or a block with its reason."""

    args: Mapping[str, Any] | None = None
    """Replacement arguments (re-validated)."""
    block: str | None = None
    """A reason: the call does not run and the model sees this as an error result."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AfterToolEvent:
    """A tool returned, before its result is committed."""

    lane: str
    run_id: str
    tool_call_id: str
    tool_name: str
    args: Mapping[str, Any]
    output: ToolOutput


@dataclass(frozen=True, kw_only=True, slots=True)
class AfterToolPatch:
    """Field-by-field patch of a tool result (None leaves a field alone)."""

    content: tuple[UserContent, ...] | None = None
    details: JsonValue | None = None
    is_error: bool | None = None
    usage: TokenUsage | None = None
    terminate: bool | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class CompactionPreparation:
    """What a compaction would do: summarize `to_summarize`, keep `retained_tail` verbatim."""

    to_summarize: tuple[AgentMessage, ...]
    retained_tail: tuple[AgentMessage, ...]
    tokens_before: int


@dataclass(frozen=True, kw_only=True, slots=True)
class SummaryResult:
    """A summary a hook supplies instead of the model."""

    summary: str
    details: JsonValue = None
    usage: TokenUsage | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class BeforeCompactionEvent:
    """A compaction is about to summarize context."""

    lane: str
    reason: CompactionReason
    preparation: CompactionPreparation
    custom_instructions: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class BeforeCompactionResult:
    """Decline the compaction, or supply its summary."""

    decline: bool = False
    compaction: SummaryResult | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class BeforeNavigationEvent:
    """A lane is about to move and summarize the branch it leaves."""

    lane: str
    target_id: str | None
    abandoned: tuple[Entry, ...]
    """The entries of the branch being left (oldest first), what a summary would cover."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BeforeNavigationResult:
    """Decline the navigation, or supply the branch summary."""

    decline: bool = False
    summary: SummaryResult | None = None


Handler = Callable[[Any], Awaitable[Any]]


class HookError(ValueError):
    """A registration breaks the rules (a missing or duplicate id)."""


@dataclass(kw_only=True, slots=True)
class _Registration:
    id: str | None
    handler: Handler


@dataclass(slots=True)
class Hooks:
    """The harness-wide hook registry."""

    _by_name: dict[str, list[_Registration]] = field(default_factory=dict)

    @overload
    def on(
        self,
        name: Literal["before_run"],
        handler: Callable[[BeforeRunEvent], Awaitable[BeforeRunResult | None]],
        *,
        id: str | None = None,
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self,
        name: Literal["before_resume"],
        handler: Callable[[BeforeResumeEvent], Awaitable[None]],
        *,
        id: str | None = None,
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self,
        name: Literal["before_run_end"],
        handler: Callable[[BeforeRunEndEvent], Awaitable[BeforeRunEndResult | None]],
        *,
        id: str | None = None,
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self,
        name: Literal["transform_context"],
        handler: Callable[[TransformContextEvent], Awaitable[Sequence[AgentMessage] | None]],
        *,
        id: str | None = None,
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self,
        name: Literal["before_request"],
        handler: Callable[[BeforeRequestEvent], Awaitable[RequestOptions | None]],
        *,
        id: str | None = None,
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self,
        name: Literal["after_response"],
        handler: Callable[[AfterResponseEvent], Awaitable[AssistantMessage | None]],
        *,
        id: str | None = None,
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self,
        name: Literal["before_tool"],
        handler: Callable[[BeforeToolEvent], Awaitable[BeforeToolResult | None]],
        *,
        id: str | None = None,
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self,
        name: Literal["after_tool"],
        handler: Callable[[AfterToolEvent], Awaitable[AfterToolPatch | None]],
        *,
        id: str | None = None,
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self,
        name: Literal["before_compaction"],
        handler: Callable[[BeforeCompactionEvent], Awaitable[BeforeCompactionResult | None]],
        *,
        id: str | None = None,
    ) -> Callable[[], None]: ...
    @overload
    def on(
        self,
        name: Literal["before_navigation"],
        handler: Callable[[BeforeNavigationEvent], Awaitable[BeforeNavigationResult | None]],
        *,
        id: str | None = None,
    ) -> Callable[[], None]: ...
    def on(self, name: str, handler: Handler, *, id: str | None = None) -> Callable[[], None]:
        """Register `handler` for `name`; returns a function that unregisters it.

        Typed per hook: a ``before_tool`` handler takes a `BeforeToolEvent` and returns a
        `BeforeToolResult` or None. A hook name computed at run time goes through `on_any`.

        Raises:
            HookError: `before_run`/`before_resume` without an id, or a duplicate id.
            HarnessNotImplemented: a hook this runtime cannot run (``before_payload``): a
                handler that is accepted and never called would be a silent stub.
        """
        return self.on_any(name, handler, id=id)

    def on_any(self, name: str, handler: Handler, *, id: str | None = None) -> Callable[[], None]:
        """`on` for a hook name computed at run time (no per-hook check of the handler).

        Raises:
            HookError: an unknown hook name (a handler that could never run), a missing or
                duplicate id.
            HarnessNotImplemented: ``before_payload``.
        """
        if (instead := _REFUSED.get(name)) is not None:
            refused = HarnessNotImplemented(f"hooks.on({name!r})")
            refused.add_note(instead)
            raise refused
        if name not in get_args(HookName):
            raise HookError(
                f"there is no hook {name!r} (the hooks: {', '.join(get_args(HookName))})"
            )
        registrations = self._by_name.setdefault(name, [])
        if name in _NEEDS_ID and not id:
            raise HookError(f"{name} handlers need a stable id")
        if id is not None and any(r.id == id for r in registrations):
            raise HookError(f"{name} already has a handler with id {id!r}")
        registration = _Registration(id=id, handler=handler)
        registrations.append(registration)

        def off() -> None:
            if registration in registrations:
                registrations.remove(registration)

        return off

    def registrations(self, name: HookName) -> Sequence[tuple[str | None, Handler]]:
        """The handlers of a hook, in registration order."""
        return [(r.id, r.handler) for r in self._by_name.get(name, [])]


ErrorReporter = Callable[[HookName, BaseException], None]


async def run_hook(hooks: Hooks, name: HookName, event: Any, report: ErrorReporter) -> Any:
    """Run every handler of `name` in order and aggregate their results (see the module doc)."""
    registrations = hooks.registrations(name)
    if name == "before_run":
        return await _before_run(registrations, event, report)
    if name == "before_tool":
        return await _before_tool(registrations, event, report)
    if name == "after_tool":
        return await _after_tool(registrations, event, report)
    if name == "before_resume":
        data = event.resume_data if isinstance(event.resume_data, Mapping) else {}
        for hook_id, handler in registrations:
            try:
                await handler(replace(event, resume_data=data.get(hook_id or "")))
            except Exception as exc:
                report(name, exc)
        return None
    if name in ("before_compaction", "before_navigation"):
        last = None
        for _, handler in registrations:
            try:
                result = await handler(event)
            except Exception as exc:
                report(name, exc)
                continue
            if result is not None:
                last = result
                if result.decline:
                    break  # the first decline wins
        return last
    if name in ("transform_context", "before_request", "after_response"):
        current = event
        for _, handler in registrations:
            try:
                result = await handler(current)
            except Exception as exc:
                report(name, exc)
                continue
            if result is not None:
                current = _chain(name, current, result)
        return current
    last_result = None
    for _, handler in registrations:  # before_run_end: the last answer wins
        try:
            result = await handler(event)
        except Exception as exc:
            report(name, exc)
            continue
        if result is not None:
            last_result = result
    return last_result


def _chain(name: HookName, current: Any, result: Any) -> Any:
    if name == "transform_context":
        return replace(current, messages=tuple(result))
    if name == "before_request":
        return replace(current, options=result)
    if not isinstance(result, AssistantMessage):
        raise TypeError("after_response handlers return an AssistantMessage")
    return replace(current, message=result)


async def _before_run(
    registrations: Sequence[tuple[str | None, Handler]],
    event: BeforeRunEvent,
    report: ErrorReporter,
) -> tuple[tuple[AgentMessage, ...], str | None, dict[str, JsonValue]]:
    messages: tuple[AgentMessage, ...] = ()
    system_prompt = event.system_prompt
    override: str | None = None
    resume_data: dict[str, JsonValue] = {}
    for hook_id, handler in registrations:
        try:
            result: BeforeRunResult | None = await handler(
                replace(event, system_prompt=system_prompt)
            )
        except Exception as exc:
            report("before_run", exc)
            continue
        if result is None:
            continue
        messages += tuple(result.messages)
        if result.system_prompt is not None:
            system_prompt = override = result.system_prompt
        if result.resume_data is not None and hook_id is not None:
            resume_data[hook_id] = result.resume_data
    return messages, override, resume_data


async def _before_tool(
    registrations: Sequence[tuple[str | None, Handler]],
    event: BeforeToolEvent,
    report: ErrorReporter,
) -> BeforeToolResult:
    args = event.args
    for _, handler in registrations:
        try:
            result: BeforeToolResult | None = await handler(replace(event, args=args))
        except Exception as exc:
            report("before_tool", exc)
            return BeforeToolResult(
                block=f"a before_tool hook failed ({type(exc).__name__}); blocked"
            )
        if result is None:
            continue
        if result.block is not None:
            return BeforeToolResult(block=result.block)
        if result.args is not None:
            args = result.args
    return BeforeToolResult(args=args)


async def _after_tool(
    registrations: Sequence[tuple[str | None, Handler]],
    event: AfterToolEvent,
    report: ErrorReporter,
) -> ToolOutput:
    output = event.output
    for _, handler in registrations:
        try:
            patch: AfterToolPatch | None = await handler(replace(event, output=output))
        except Exception as exc:
            report("after_tool", exc)
            continue
        if patch is None:
            continue
        changes = {
            name: value
            for name in ("content", "details", "is_error", "usage", "terminate")
            if (value := getattr(patch, name)) is not None
        }
        output = ToolOutput(**{**dict(output), **changes})
    return output
