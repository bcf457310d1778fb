"""Declaring tools: the decorator, argument validation fed back to the model, timeouts, keys."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from harness_core._runtime import lane_effects
from harness_core.messages import TextPart, ToolResultMessage, message_text
from harness_core.models.scripted import text, tool_call
from harness_core.result import Ok
from harness_core.session import MessageEntry
from harness_core.session.records import ToolStarted
from harness_core.session.types import RecordQuery
from harness_core.tools import (
    MAX_TOOL_TEXT_CHARS,
    Tool,
    ToolArgumentsError,
    ToolContext,
    ToolOutput,
    tool,
)
from tests.support.harness_kit import make_kit


class Deploy(BaseModel):
    build: int = Field(description="the build number")
    region: str = "eu"


def deploy_tool(runs: list[tuple[Deploy, str]]) -> Tool:
    @tool(requires_approval=False, timeout_seconds=5)
    async def deploy(args: Deploy, ctx: ToolContext) -> str:
        """Deploy a build to production."""
        runs.append((args, ctx.idempotency_key))
        return f"deployed {args.build} to {args.region}"

    return deploy


async def test_the_decorator_declares_a_tool(backend: str, tmp_path: Path) -> None:
    declared = deploy_tool([])
    assert (declared.name, declared.description) == ("deploy", "Deploy a build to production.")
    assert declared.args_model is Deploy and declared.replay == "never"
    assert declared.timeout_seconds == 5 and not declared.requires_approval
    schema: Any = declared.definition().parameters
    assert schema["properties"]["build"]["type"] == "integer"
    assert list(schema["required"]) == ["build"]

    @tool(name="lookup", replay="safe", requires_approval=True)
    async def free_form(args: dict[str, object], ctx: ToolContext) -> str:
        return "ok"

    assert (free_form.name, free_form.replay, free_form.requires_approval) == (
        "lookup",
        "safe",
        True,
    )
    assert free_form.args_model is None and free_form.description == "lookup"


async def test_validated_arguments_reach_the_tool(backend: str, tmp_path: Path) -> None:
    runs: list[tuple[Deploy, str]] = []
    kit = await make_kit(
        backend, tmp_path, [tool_call("deploy", {"build": 42}), text("done")],
        tools=[deploy_tool(runs)],
    )  # fmt: skip
    assert isinstance(await kit.harness.prompt("ship it"), Ok)
    assert [(args.build, args.region) for args, _ in runs] == [(42, "eu")]


async def test_invalid_arguments_go_back_to_the_model_and_nothing_starts(
    backend: str, tmp_path: Path
) -> None:
    runs: list[tuple[Deploy, str]] = []
    kit = await make_kit(
        backend, tmp_path, [tool_call("deploy", {"build": "forty-two"}), text("sorry")],
        tools=[deploy_tool(runs)],
    )  # fmt: skip
    assert isinstance(await kit.harness.prompt("ship it"), Ok)
    assert runs == []
    assert await kit.storage.find_records(RecordQuery(type="tool_started")) == ()
    result = kit.model.requests[-1].messages[-1]
    assert isinstance(result, ToolResultMessage) and result.outcome == "error"
    assert "invalid arguments for deploy: build:" in message_text(result)


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        # the model's text was no JSON object: pydantic-ai kept it so; it ran on the defaults
        (
            {"INVALID_JSON": '{"build": 7, "region": "us"'},
            'invalid arguments for deploy: they are not a JSON object: {"build": 7, "region"',
        ),
        # a misspelt key was dropped and the default region used
        (
            {"build": 7, "regoin": "us"},
            "invalid arguments for deploy: regoin: not an argument of this tool (its "
            "arguments: build, region)",
        ),
    ],
)
async def test_arguments_the_tool_would_not_read_are_refused_not_defaulted(
    backend: str, tmp_path: Path, arguments: dict[str, Any], said: str
) -> None:
    runs: list[tuple[Deploy, str]] = []
    kit = await make_kit(
        backend, tmp_path, [tool_call("deploy", arguments), text("sorry")],
        tools=[deploy_tool(runs)],
    )  # fmt: skip
    assert isinstance(await kit.harness.prompt("ship it"), Ok)
    assert runs == []
    result = kit.model.requests[-1].messages[-1]
    assert isinstance(result, ToolResultMessage) and result.outcome == "error"
    assert message_text(result).startswith(said)


def test_an_args_model_that_says_what_extra_keys_do_keeps_its_word() -> None:
    class Loose(BaseModel):
        model_config = ConfigDict(extra="ignore")
        build: int

    class Aliased(BaseModel):
        build: int = Field(alias="buildNumber")

    async def run(args: Any, ctx: ToolContext) -> str:
        return "ok"

    loose = Tool(name="loose", description="d", execute=run, args_model=Loose)
    assert loose.parse({"build": 1, "note": "x"}) == Loose(build=1)
    aliased = Tool(name="aliased", description="d", execute=run, args_model=Aliased)
    assert aliased.parse({"buildNumber": 3}).build == 3
    free = Tool(name="free", description="d", execute=run)  # a dict tool (an MCP one's kind)
    assert free.parse({"any": "key"}) == {"any": "key"}
    with pytest.raises(ToolArgumentsError, match="not a JSON object"):
        free.parse({"INVALID_JSON": "[1, 2"})


async def test_a_tool_that_overruns_its_timeout_is_an_error_result(
    backend: str, tmp_path: Path
) -> None:
    @tool(timeout_seconds=0.05)
    async def hang(args: dict[str, object], ctx: ToolContext) -> str:
        await asyncio.Event().wait()
        return "never"

    kit = await make_kit(backend, tmp_path, [tool_call("hang"), text("gave up")], tools=[hang])
    assert isinstance(await kit.harness.prompt("go"), Ok)
    result = kit.model.requests[-1].messages[-1]
    assert isinstance(result, ToolResultMessage) and result.outcome == "error"
    assert "hang timed out after 0.05 s" in message_text(result)


@pytest.mark.parametrize(
    ("raised", "said"),
    [
        (SystemExit(3), "exiter failed: SystemExit: 3"),
        (KeyboardInterrupt(), "exiter failed: KeyboardInterrupt"),
        (asyncio.CancelledError(), "exiter failed: CancelledError"),
    ],
)
@pytest.mark.parametrize("limit", [None, 5.0])
async def test_a_tool_that_exits_or_cancels_itself_fails_its_call_not_the_process(
    backend: str, tmp_path: Path, raised: BaseException, said: str, limit: float | None
) -> None:
    """A plugin tool's ``sys.exit(3)`` ended `gateway serve` with status 3, its
    KeyboardInterrupt as if an operator had pressed Ctrl-C, every thread with it; its own
    CancelledError left the lane unanswered, no word said (an outside probe). Each is the
    call's failure now, as any exception is; with a timeout of its own too (the tool ran in a
    task of its own then, whose SystemExit the event loop raises)."""

    @tool(timeout_seconds=limit)
    async def exiter(args: dict[str, object], ctx: ToolContext) -> str:
        raise raised

    kit = await make_kit(
        backend, tmp_path, [tool_call("exiter"), text("it failed")], tools=[exiter]
    )
    assert isinstance(await kit.harness.prompt("go"), Ok)
    result = kit.model.requests[-1].messages[-1]
    assert isinstance(result, ToolResultMessage) and result.outcome == "error"
    assert message_text(result).startswith(said)


def test_a_tool_declared_wrong_is_refused_where_it_is_declared() -> None:
    """Each was accepted, then: a plain def ran its effect and its call failed (the model, told
    so, would make it again); replay="maybe" faulted the session at the first call; a timeout
    of -5 was ignored; a function without (args, ctx) failed at every call (an outside probe)."""

    def plain(args: dict[str, object], ctx: ToolContext) -> str:
        return "done"

    async def takes_nothing() -> str:
        return "done"

    async def fine(args: dict[str, object], ctx: ToolContext) -> str:
        return "done"

    with pytest.raises(TypeError, match="'plain': its function must be `async def`"):
        tool()(plain)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"'takes_nothing': its function must take \(args, ctx\)"):
        tool()(takes_nothing)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="replay must be 'never' or 'safe', not 'maybe'"):
        tool(replay="maybe")(fine)  # type: ignore[arg-type]
    for limit in (-5, 0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="timeout_seconds must be a number of seconds"):
            tool(timeout_seconds=limit)(fine)
    with pytest.raises(ValueError, match="a tool needs a name"):
        tool(name=" ")(fine)
    assert tool(timeout_seconds=2)(fine).timeout_seconds == 2


class _Unreadable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str fails")


@pytest.mark.parametrize(
    ("raised", "returned", "said"),
    [
        (None, "bad \udcff byte", "bad \ufffd byte"),  # os.fsdecode's, a subprocess's
        (RuntimeError("bad \ud800 char"), None, "odd failed: RuntimeError: bad \ufffd char"),
        (_Unreadable(), None, "odd failed: _Unreadable"),
        (GeneratorExit(), None, "odd failed: GeneratorExit"),
    ],
)
async def test_a_tool_s_text_no_store_could_hold_fails_or_answers_its_call_alone(
    backend: str, tmp_path: Path, raised: BaseException | None, returned: str | None, said: str
) -> None:
    """A lone surrogate in a result or an error's text, an error whose text cannot be read, a
    GeneratorExit: each faulted the whole session, every lane with a call running in it losing
    that call's result, and after three tries parked stuck (an outside probe)."""

    @tool(replay="safe")
    async def odd(args: dict[str, object], ctx: ToolContext) -> str:
        if raised is not None:
            raise raised
        assert returned is not None
        return returned

    kit = await make_kit(backend, tmp_path, [tool_call("odd"), text("read it")], tools=[odd])
    assert isinstance(await kit.harness.prompt("go"), Ok)
    result = kit.model.requests[-1].messages[-1]
    assert isinstance(result, ToolResultMessage)
    assert result.outcome == ("ok" if raised is None else "error")
    assert message_text(result) == said


async def test_a_huge_error_is_cut_as_a_huge_result_is(backend: str, tmp_path: Path) -> None:
    """D404 bounded what a tool returns, not what it raises: a 5 MB error filled the context."""

    @tool()
    async def loud(args: dict[str, object], ctx: ToolContext) -> str:
        raise RuntimeError("E" * 5_000_000)

    kit = await make_kit(backend, tmp_path, [tool_call("loud"), text("read it")], tools=[loud])
    assert isinstance(await kit.harness.prompt("go"), Ok)
    result = kit.model.requests[-1].messages[-1]
    assert isinstance(result, ToolResultMessage) and result.outcome == "error"
    assert len(message_text(result)) < MAX_TOOL_TEXT_CHARS + 200


async def test_a_tool_s_own_timeout_error_is_its_failure_not_a_timeout(
    backend: str, tmp_path: Path
) -> None:
    """It read "timed out after 0 s" for a tool that has no timeout."""

    @tool()
    async def fetch(args: dict[str, object], ctx: ToolContext) -> str:
        raise TimeoutError("the upstream did not answer")

    kit = await make_kit(backend, tmp_path, [tool_call("fetch"), text("it failed")], tools=[fetch])
    assert isinstance(await kit.harness.prompt("go"), Ok)
    result = kit.model.requests[-1].messages[-1]
    assert isinstance(result, ToolResultMessage) and result.outcome == "error"
    assert message_text(result) == "fetch failed: TimeoutError: the upstream did not answer"


@pytest.mark.parametrize("heeds", [True, False])
async def test_an_aborted_run_s_tool_settles_or_is_cut_off_after_a_grace(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, heeds: bool
) -> None:
    """D407: a tool that ignores `ctx.abort` held its lane ``aborting`` for as long as it ran
    (for ever, hung: a `stop` and an operator's abort changed nothing). A tool that heeds the
    abort settles with its own result; one that does not is cut off after the grace, its result
    that it may have had its effect."""
    monkeypatch.setattr(lane_effects, "TOOL_ABORT_GRACE_S", 0.2)
    started = asyncio.Event()
    ended: list[str] = []

    @tool(timeout_seconds=30)
    async def work(args: dict[str, object], ctx: ToolContext) -> str:
        started.set()
        try:
            await (ctx.abort.wait() if heeds else asyncio.Event().wait())
        except asyncio.CancelledError:
            ended.append("cut")
            raise
        ended.append("stopped")
        return "stopped half way"

    kit = await make_kit(backend, tmp_path, [tool_call("work")], tools=[work])
    running = asyncio.ensure_future(kit.harness.prompt("go"))
    await started.wait()
    assert isinstance(await kit.harness.abort(), Ok)
    outcome = await asyncio.wait_for(running, 5)
    assert isinstance(outcome, Ok) and outcome.value.kind == "aborted"
    assert ended == ["stopped" if heeds else "cut"]
    [result] = [
        stored.entry.message
        for stored in await kit.harness.session.find_entries()
        if isinstance(stored.entry, MessageEntry)
        and isinstance(stored.entry.message, ToolResultMessage)
    ]
    assert isinstance(result, ToolResultMessage)
    said = message_text(result)
    if heeds:
        assert said == "stopped half way"
    else:  # its outcome unknown, as a crash mid-call leaves it
        assert result.outcome == "interrupted"
        assert said == (
            "work was cut off 0.2 s after the run was stopped; it may or may not have had its "
            "effect: check before repeating it"
        )


async def test_a_second_abort_neither_moves_the_grace_nor_fails_its_caller(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The abort signal calls its callbacks at every set: a second abort moved the grace's end
    later, and one that came as the grace ran out raised "Cannot change state of expiring
    Timeout" into its caller (`gateway ask`'s Ctrl-C: exit 1, an outside probe)."""
    monkeypatch.setattr(lane_effects, "TOOL_ABORT_GRACE_S", 1.0)
    started = asyncio.Event()

    @tool()
    async def deaf(args: dict[str, object], ctx: ToolContext) -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    kit = await make_kit(backend, tmp_path, [tool_call("deaf")], tools=[deaf])
    running = asyncio.ensure_future(kit.harness.prompt("go"))
    await started.wait()
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert isinstance(await kit.harness.abort(), Ok)
    await asyncio.sleep(0.8)
    again = await kit.harness.abort()  # raised nothing; the grace still ends at 1 s
    outcome = await asyncio.wait_for(running, 5)
    assert loop.time() - began < 1.5  # was 1.8: the second abort began a grace of its own
    assert isinstance(outcome, Ok) and outcome.value.kind == "aborted", (again, outcome)


async def test_a_run_cancelled_while_its_tool_runs_is_still_cancelled(
    backend: str, tmp_path: Path
) -> None:
    """The other order: a cancellation of the run's own task is not taken for the tool's."""
    started = asyncio.Event()

    @tool()
    async def waits(args: dict[str, object], ctx: ToolContext) -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    kit = await make_kit(backend, tmp_path, [tool_call("waits")], tools=[waits])
    running = asyncio.ensure_future(kit.harness.prompt("go"))
    await started.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running


async def test_the_idempotency_key_survives_a_crash_and_replay(
    backend: str, tmp_path: Path
) -> None:
    keys: list[str] = []
    first_run = asyncio.Event()

    @tool(replay="safe")
    async def charge(args: dict[str, object], ctx: ToolContext) -> str:
        keys.append(ctx.idempotency_key)
        if len(keys) == 1:
            first_run.set()
            await asyncio.Event().wait()  # the process dies while the effect is in flight
        return "charged"

    kit = await make_kit(backend, tmp_path, [tool_call("charge")], tools=[charge])
    running = asyncio.ensure_future(kit.harness.prompt("pay"))
    await first_run.wait()
    reopened = await kit.reopen(script=[text("paid")])
    assert isinstance(await reopened.harness.resume(), Ok)
    running.cancel()
    started = await kit.storage.find_records(RecordQuery(type="tool_started"))
    assert len(started) == 1 and isinstance(started[0].record, ToolStarted)
    assert len(keys) == 2 and keys[0] == keys[1]  # the same key on the replay


async def test_a_tool_s_huge_text_is_cut_with_a_note_before_it_is_stored(
    backend: str, tmp_path: Path
) -> None:
    """50 MB from a plugin tool was stored whole, and the thread's next request counted 13
    million tokens and failed `context_overflow` (an outside probe)."""

    @tool()
    async def dump(args: dict[str, object], ctx: ToolContext) -> str:
        return "x" * (MAX_TOOL_TEXT_CHARS + 5_000)

    @tool(name="dump_parts")
    async def parts(args: dict[str, object], ctx: ToolContext) -> ToolOutput:
        half = "y" * (MAX_TOOL_TEXT_CHARS // 2 + 1)
        return ToolOutput(content=(TextPart(text=half), TextPart(text=half)))

    script = [tool_call("dump"), tool_call("dump_parts"), text("done")]
    kit = await make_kit(backend, tmp_path, script, tools=[dump, parts])
    assert isinstance(await kit.harness.prompt("go"), Ok)
    results = [m for m in kit.model.requests[-1].messages if isinstance(m, ToolResultMessage)]
    totals = (MAX_TOOL_TEXT_CHARS + 5_000, MAX_TOOL_TEXT_CHARS + 2)
    for result, total in zip(results, totals, strict=True):
        said = message_text(result)
        assert len(said) < MAX_TOOL_TEXT_CHARS + 200
        assert said.endswith(
            f"[output cut: {total - MAX_TOOL_TEXT_CHARS:,} of {total:,} characters not shown "
            f"(the limit is {MAX_TOOL_TEXT_CHARS:,})]"
        )
