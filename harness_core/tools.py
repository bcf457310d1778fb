"""Tools: what the model may call, how a call runs, and the identity that makes it idempotent.

A tool declares `replay`: ``"never"`` (the default: an interrupted call is reported to the model
as "interrupted, may have happened") or ``"safe"`` (recovery may run it again). Every call gets an
idempotency key derived from its durable invocation identity (session, assistant entry, tool
index), so a tool can make its own external effect idempotent (for example as an HTTP
``Idempotency-Key``).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import json
import math
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from pydantic import BaseModel, ValidationError, model_validator

from harness_core.frozen import Frozen, FrozenJson, freeze_json, thaw_json
from harness_core.messages import TextPart, TokenUsage, ToolCallPart, ToolFile, UserContent
from harness_core.models import ToolDefinition

__all__ = [
    "idempotency_key",
    "PreparedToolCall",
    "Replay",
    "Tool",
    "tool",
    "ToolArgumentsError",
    "ToolContext",
    "MAX_TOOL_FILES",
    "MAX_TOOL_FILES_BYTES",
    "MAX_TOOL_TEXT_CHARS",
    "ToolOutput",
    "ToolRecovery",
]

Replay = Literal["never", "safe"]

MAX_TOOL_FILES = 10
"""The most files one tool result may carry (D227)."""
MAX_TOOL_FILES_BYTES = 5_000_000
"""What the files of one tool result may hold together, in bytes (D227): they are stored with
the result in the session, so they are bounded like any entry should be."""
MAX_TOOL_TEXT_CHARS = 100_000
"""The most characters of text one tool result keeps; the rest is cut, and a note says how much
(D404). A tool that returned 50 MB had it stored whole, and its thread's next request counted
13 million tokens and failed `context_overflow` (an outside probe)."""


class ToolOutput(Frozen):
    """What a tool returns.

    `terminate` asks the run not to call the model again for this batch; it takes effect only
    when every result of the batch says so.
    """

    content: tuple[UserContent, ...] = ()
    details: FrozenJson = None
    is_error: bool = False
    usage: TokenUsage | None = None
    terminate: bool = False
    files: tuple[ToolFile, ...] = ()
    """Files sent with the run's reply (a report, a CSV): at most `MAX_TOOL_FILES` of
    `MAX_TOOL_FILES_BYTES` together. Stored with the result; the model is told each one's name,
    type and size in the result's text, never its bytes."""

    @model_validator(mode="after")
    def _bounded_files(self) -> ToolOutput:
        if len(self.files) > MAX_TOOL_FILES:
            raise ValueError(f"a tool result carries at most {MAX_TOOL_FILES} files")
        if sum(file.size for file in self.files) > MAX_TOOL_FILES_BYTES:
            raise ValueError(f"a tool result's files hold at most {MAX_TOOL_FILES_BYTES} bytes")
        return self

    @classmethod
    def text(cls, text: str, *, is_error: bool = False) -> ToolOutput:
        """A one-part text result."""
        return cls(content=(TextPart(text=text),), is_error=is_error)


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolContext:
    """What a running tool may know about its call."""

    session_id: str
    lane: str
    run_id: str
    tool_call_id: str
    tool_name: str
    idempotency_key: str
    """Stable across every replay of this call: derive external idempotency from it."""
    abort: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the run is aborted; a long tool should stop and return early (one that goes on
    10 s more is cut off, its result saying it may have had its effect)."""
    on_update: Callable[[FrozenJson], None] | None = None

    def update(self, partial: Any) -> None:
        """Report progress (any JSON value): a live `tool_update` event, never persisted."""
        if self.on_update is not None:
            self.on_update(freeze_json(partial))


class ToolArgumentsError(ValueError):
    """The model's arguments do not fit the tool's schema; the message is fed back to the model."""


ToolExecute = Callable[[Any, ToolContext], Awaitable[ToolOutput | str]]


@dataclass(frozen=True, kw_only=True)
class Tool:
    """A tool the harness can run.

    `execute(args, ctx)` receives the arguments validated by `args_model` (an instance of it) or,
    without a model, a plain dict. Returning a string is shorthand for a text result; raising is
    an error result (a tool never crashes the run).
    """

    name: str
    description: str
    execute: ToolExecute
    args_model: type[BaseModel] | None = None
    parameters: Mapping[str, Any] | None = None
    """JSON schema of the arguments; derived from `args_model` when not given."""
    replay: Replay = "never"
    execution_mode: Literal["parallel", "sequential"] = "parallel"
    requires_approval: bool = False
    timeout_seconds: float | None = None

    def __post_init__(self) -> None:
        # refused where it is declared, as a plugin loads: each was accepted, then faulted the
        # session at the first call ("maybe"), or was silently ignored (a timeout of -5)
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"a tool needs a name, not {self.name!r}")
        if self.replay not in get_args(Replay):
            raise ValueError(
                f"tool {self.name!r}: replay must be 'never' or 'safe', not {self.replay!r}"
            )
        if self.execution_mode not in ("parallel", "sequential"):
            raise ValueError(
                f"tool {self.name!r}: execution_mode must be 'parallel' or 'sequential', not "
                f"{self.execution_mode!r}"
            )
        limit = self.timeout_seconds
        if limit is not None and (
            isinstance(limit, bool)
            or not isinstance(limit, int | float)
            or not math.isfinite(limit)
            or limit <= 0
        ):
            raise ValueError(
                f"tool {self.name!r}: timeout_seconds must be a number of seconds above 0 (or "
                f"None: no limit), not {limit!r}"
            )

    def definition(self) -> ToolDefinition:
        """How the model sees this tool."""
        schema: Mapping[str, Any]
        if self.parameters is not None:
            schema = self.parameters
        elif self.args_model is not None:
            schema = _schema_of(self.args_model)
        else:
            schema = {"type": "object", "properties": {}}
        return ToolDefinition(name=self.name, description=self.description, parameters=dict(schema))

    def parse(self, args: Mapping[str, Any]) -> Any:
        """Validate arguments; raises `ToolArgumentsError` with a message for the model.

        Arguments the model wrote that were no JSON object (kept under `UNPARSED_ARGUMENTS`)
        are refused, and so is an argument the args model does not name, unless its config
        says what to do with extra keys: either way the tool would run on its defaults in
        place of what the model asked for (D308).
        """
        plain = thaw_json(args)
        unparsed = plain.get(UNPARSED_ARGUMENTS) if len(plain) == 1 else None
        if isinstance(unparsed, str):
            shown = unparsed if len(unparsed) <= 200 else unparsed[:200] + "..."
            raise ToolArgumentsError(
                f"invalid arguments for {self.name}: they are not a JSON object: {shown}"
            )
        if self.args_model is None:
            return plain
        if self.args_model.model_config.get("extra") is None:
            unknown = sorted(set(plain) - _argument_names(self.args_model))
            if unknown:
                named = ", ".join(sorted(self.args_model.model_fields)) or "none"
                raise ToolArgumentsError(
                    f"invalid arguments for {self.name}: {', '.join(unknown)}: not an argument "
                    f"of this tool (its arguments: {named})"
                )
        try:
            return self.args_model.model_validate(plain)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in error['loc']) or '(arguments)'}: {error['msg']}"
                for error in exc.errors(include_url=False)
            )
            raise ToolArgumentsError(f"invalid arguments for {self.name}: {problems}") from exc


UNPARSED_ARGUMENTS = "INVALID_JSON"
"""The one key under which a model's tool arguments that were no JSON object are kept (as
pydantic-ai keeps them, and as Anthropic asks them to be sent back): never run as arguments."""


@functools.lru_cache(maxsize=256)
def _argument_names(model: type[BaseModel]) -> frozenset[str]:
    """The keys `model` takes: each field's name and its validation aliases."""
    names: set[str] = set()
    for name, info in model.model_fields.items():
        names.add(name)
        if isinstance(info.alias, str):
            names.add(info.alias)
        choices = getattr(info.validation_alias, "choices", None)
        if isinstance(info.validation_alias, str):
            names.add(info.validation_alias)
        elif choices is not None:
            names.update(c for c in choices if isinstance(c, str))
    return frozenset(names)


def _schema_of(model: type[BaseModel]) -> Mapping[str, Any]:
    """An arguments model's JSON schema (a fresh copy: the caller may keep or change it)."""
    parsed: Mapping[str, Any] = json.loads(_schema_text(model))
    return parsed


@functools.lru_cache(maxsize=256)
def _schema_text(model: type[BaseModel]) -> str:
    # made once per model class: every model request lists every tool, and generating a
    # schema costs about a millisecond (a class does not change)
    return json.dumps(model.model_json_schema())


@dataclass(frozen=True, kw_only=True, slots=True)
class PreparedToolCall:
    """A call that passed validation and `before_tool`: ready to run (phase 2)."""

    tool_index: int
    call: ToolCallPart
    tool: Tool
    args: Mapping[str, Any]
    """The effective arguments (after `before_tool`), as persisted in `tool_started`."""
    context: ToolContext


def idempotency_key(session_id: str, assistant_entry_id: str, tool_index: int) -> str:
    """The stable key of one tool invocation (the same on every replay after a crash)."""
    digest = hashlib.sha256(f"{session_id}\x00{assistant_entry_id}\x00{tool_index}".encode())
    return "call_" + digest.hexdigest()[:40]


def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    replay: Replay = "never",
    requires_approval: bool = False,
    timeout_seconds: float | None = None,
    execution_mode: Literal["parallel", "sequential"] = "parallel",
) -> Callable[[ToolExecute], Tool]:
    """Declare a tool from an async function ``(args, ctx) -> str | ToolOutput``.

    The arguments model is the annotation of the first parameter (a pydantic model; a plain
    ``dict`` means free-form JSON), the name defaults to the function's and the description to
    its docstring. ``replay`` defaults to ``"never"``: say ``"safe"`` only for calls that may run
    twice (reads, or effects made idempotent with ``ctx.idempotency_key``).

    Example::

        class Deploy(BaseModel):
            build: int

        @tool(requires_approval=True, timeout_seconds=60)
        async def deploy(args: Deploy, ctx: ToolContext) -> str:
            "Deploy a build to production."  # the docstring becomes the description
            ...
    """

    def build(execute: ToolExecute) -> Tool:
        tool_name: str = name or str(getattr(execute, "__name__", ""))
        if not inspect.iscoroutinefunction(execute):
            # a plain def ran its effect, then its call failed ("object str can't be used in
            # 'await' expression"): the model, told it failed, would make it again
            raise TypeError(
                f"tool {tool_name!r}: its function must be `async def` (a plain def would "
                "also hold every other thread while it runs)"
            )
        try:
            inspect.signature(execute).bind(None, None)
        except TypeError:
            raise TypeError(f"tool {tool_name!r}: its function must take (args, ctx)") from None
        hints = typing.get_type_hints(execute)
        parameters = list(inspect.signature(execute).parameters)
        annotation = hints.get(parameters[0]) if parameters else None
        args_model = (
            annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel)
            else None
        )
        doc = inspect.getdoc(execute) or ""
        return Tool(
            name=tool_name,
            description=description or doc or tool_name,
            execute=execute,
            args_model=args_model,
            replay=replay,
            requires_approval=requires_approval,
            timeout_seconds=timeout_seconds,
            execution_mode=execution_mode,
        )

    return build


ToolRecovery = Literal["declared", "never", "always"]
"""How `resume()` treats a tool call that started before a crash and has no result:
``declared`` replays it only if the tool was and is declared ``replay="safe"``; ``never`` reports
every such call interrupted; ``always`` replays every one whose tool still exists. Recorded and
already-interrupted results are never reopened, and a tool that requires approval is replayed
only after a new approval."""
