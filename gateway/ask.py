"""``gateway ask``: one durable prompt on a lane of the configured model (the shortest real use).

With ``GATEWAY_MODEL`` unset the model is ``scripted:echo`` (no key needed). A lane keeps its
conversation across invocations, and an invocation that finds the lane's previous run open
(the process died) resumes it before asking.

Every way it can end without an answer is an `AskFailed`: one line, and the exit status. Ctrl-C
aborts the running operation, so the store shows it finished, not open; a second Ctrl-C stops
without waiting for that (the operation stays open, and the next `ask` on the lane resumes it).
Two `ask` processes on one store take turns: each holds the session's writer lease under its own
name, and the second waits up to `LEASE_WAIT_SECONDS` for the first, then says who holds it.

The agent is the service's: the plugin's tools and model (``GATEWAY_PLUGIN``) when one is set,
and the configured MCP servers' tools (each started for the invocation and stopped after; one
that does not come up is named on stderr, and its tools are absent, as in `serve`), with the
profile `serve` would give the lane (the thread ``cli``/``default``/NAME: its route's, else
the default; its instructions, model, tools, turn limit and token budget). A
call that requires approval is put to the person at the terminal (`decide`); without one (input
is not a terminal) `ask` stops, saying what waits, and the lane keeps waiting: the next `ask` on
it in a terminal asks again before anything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from adapters import Author, ThreadRef
from config import Settings
from config.fields import number
from gateway.channels import ASK_CHANNEL
from gateway.errors import GatewayError, StatusError
from gateway.incarnation import gone, new_worker_id
from gateway.invocation import command
from gateway.live import retry_wait
from gateway.mcp.settings import mcp_section
from gateway.models import model_from_settings
from gateway.plugin import load_plugin
from gateway.profiles import LaneProfiles
from gateway.redact import Redactor, redacting
from gateway.replies import answer_text, never_repeated
from harness_core import (
    AgentHarness,
    AgentHarnessOptions,
    AgentLane,
    ApprovalDecision,
    DecisionsRequired,
    LeaseHeld,
    ModelClient,
    ModelRef,
    Ok,
    Outcome,
    PendingApproval,
    RequestOptions,
    Result,
    RetryEnd,
    RetryScheduled,
    SessionError,
    SessionRepo,
    SessionStorage,
    Tool,
    WriterLease,
    approve,
    deny,
)
from harness_core.clock import SystemClock
from harness_core.session.types import RecordQuery
from harness_core.texts import one_line

__all__ = [
    "ABORT_WAIT_SECONDS",
    "DENIED_AT_THE_TERMINAL",
    "LEASE_WAIT_SECONDS",
    "SESSION",
    "AskFailed",
    "Decide",
    "ask",
    "terminal",
]

SESSION = "cli"
LEASE_TTL_MS = 30_000
"""The session's writer lease. The harness renews it while the run works, so a long answer keeps
it, and an `ask` that was killed holds the session at most this long."""
LEASE_WAIT_SECONDS = 10.0
"""How long `ask` waits for another process's lease on the session before saying who holds it."""
ABORT_WAIT_SECONDS = 15.0
"""After Ctrl-C: how long the aborted run gets to record that it finished: past the 10 s a tool
that goes on is given before it is cut off (D407), so its call is named, not left open."""
ABORT_NOTICE_SECONDS = 1.5
"""After Ctrl-C: how long before `ask` says it is waiting for the run's running step."""
STRAGGLERS_SECONDS = 2.0
"""After a second Ctrl-C closed the harness mid-operation: how long its in-flight steps (a write
of the abort, a check of the lane) get to end while the store is still open."""
INTERRUPTED = 130
"""The exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it."""

DENIED_AT_THE_TERMINAL = "denied at the terminal"
"""The reason the model is given for a call the person at the terminal did not approve."""

Decide = Callable[[PendingApproval], Awaitable[bool]]
"""Asks a person about one pending call: True approves it, False denies it."""

_R = TypeVar("_R")


class AskFailed(StatusError):
    """`gateway ask` gave no answer: ``str()`` is one line for stderr, `status` the exit status."""


class _Aborted(AskFailed):
    """A Ctrl-C aborted the run, and it recorded its end (what it did may then be named)."""


async def ask(
    repo: SessionRepo,
    settings: Settings,
    lane_name: str,
    question: str,
    out: list[str],
    decide: Decide | None = None,
    notes: list[str] | None = None,
) -> int:
    """Ask `question` on lane `lane_name`; the answer goes to `out`, returns 0.

    The tokens it took, and a run of the lane's this resumed first (its notice and answer), go
    to `notes` (the command's stderr: ``ask ... | tool`` gets the answer alone), or into `out`
    when no `notes` is given.

    `decide` answers the calls that wait for approval (None: nobody can, so `ask` stops there).
    An empty `question` only continues what the lane left open (a run waiting for approval, an
    interrupted one): what `ask` tells a person to run when nobody could decide.

    Raises:
        AskFailed: the run failed (the model's real error), waits for an approval nobody here
            can give, the session is held by another process, or Ctrl-C aborted the run (130).
        ModelConfigError: ``GATEWAY_MODEL`` cannot be used (before anything is written).
        PluginError: ``GATEWAY_PLUGIN`` cannot be loaded (before anything is written).
    """
    plugin = load_plugin(settings.plugin, settings)
    client, model = plugin.model or model_from_settings(settings)
    redactor = Redactor.from_settings(settings)
    client = redacting(client, redactor)  # errors may quote the key
    with _ctrl_c() as ctrl_c:
        try:
            async with _mcp_tools(settings, redactor) as mcp_tools:
                agent = _Agent(client, model, mcp_tools(tuple(plugin.tools)), decide)
                said = out if notes is None else notes
                return await _ask(repo, settings, lane_name, question, out, said, agent, ctrl_c)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if ctrl_c.count and current is not None and current.uncancel() == 0:
                raise AskFailed("interrupted", INTERRUPTED) from None
            raise


@contextlib.asynccontextmanager
async def _mcp_tools(
    settings: Settings, redactor: Redactor
) -> AsyncIterator[Callable[[tuple[Tool, ...]], tuple[Tool, ...]]]:
    """Adds the MCP servers' tools to the plugin's, the servers running until the block ends.

    A name the plugin has is the plugin's (`gateway.mcp.source.beside`). A server that is not
    up once started (a command that does not exist, a crash, a refusal) is named on stderr
    with its last error; its tools are absent and the others are used.
    """
    servers = mcp_section(settings).servers
    if not servers:
        yield lambda own: own
        return
    from gateway.mcp.source import McpTools, beside  # the MCP SDK takes a second: only here

    mcp = McpTools(servers, clock=SystemClock(), redact=redactor.redact)
    said = _McpLines(redactor.redact)
    logger = logging.getLogger("gateway.mcp")
    logger.addHandler(said)
    propagates, logger.propagate = logger.propagate, False
    try:
        await mcp.start()
        said.starting = False
        for health in mcp.health():
            if health.state != "ready":
                why = f": {one_line(health.last_error)}" if health.last_error else ""
                if health.stderr:
                    why += f"; its stderr ended with: {one_line(health.stderr)}"
                sys.stderr.write(
                    f"(the MCP server {health.name} did not come up{why}; "
                    "its tools are not offered)\n"
                )
        yield lambda own: beside(own, mcp.tools(), set())
    finally:
        try:
            await asyncio.shield(mcp.close())  # a child process is never left behind
        finally:
            logger.removeHandler(said)
            logger.propagate = propagates


class _McpLines(logging.Handler):
    """The MCP servers' warnings during `ask`: one readable line each on stderr.

    Without it Python's last-resort handler printed a bare event name (``mcp.server_down``).
    A server that is down at the start is not repeated: `ask` names it itself, with why.
    """

    _SAID_AT_START = frozenset({"mcp.server_down", "mcp.server_failed"})

    def __init__(self, redact: Callable[[str], str]) -> None:
        super().__init__(logging.WARNING)
        self.redact = redact
        self.starting = True

    def emit(self, record: logging.LogRecord) -> None:
        """Write ``(mcp: <event>: key=value, ...)``, redacted."""
        name = str(record.msg)
        if self.starting and name in self._SAID_AT_START:
            return
        fields = getattr(record.msg, "fields", None) or {}
        detail = ", ".join(f"{key}={one_line(str(value))}" for key, value in fields.items())
        sys.stderr.write(self.redact(f"({name}: {detail})\n" if detail else f"({name})\n"))


@dataclass(frozen=True, slots=True)
class _Agent:
    """What `ask` runs: the model, the plugin's tools, and who decides approvals."""

    client: ModelClient
    model: ModelRef
    tools: Sequence[Tool]
    decide: Decide | None


async def _ask(
    repo: SessionRepo,
    settings: Settings,
    lane_name: str,
    question: str,
    out: list[str],
    notes: list[str],
    agent: _Agent,
    ctrl_c: _CtrlC,
) -> int:
    client, model = agent.client, agent.model
    profiles = LaneProfiles(settings, model)
    thread = _thread_of(lane_name)
    try:
        await repo.create(SESSION)
    except SessionError as exc:
        if exc.code != "already_exists":
            raise
    lease = await _acquire(repo)
    gave_up: list[RetryEnd] = []
    try:
        storage = await repo.open(SESSION, lease=lease)
        harness, suspended = await AgentHarness.create(
            AgentHarnessOptions(
                storage=storage,
                model_client=client,
                model=model,
                tools=agent.tools,
                system_prompt=profiles.default_prompt(),
                max_turns=profiles.turns(thread),
                token_budget=profiles.budget(thread),
                request_options=RequestOptions(max_output_tokens=settings.model_max_output_tokens),
            )
        )
        try:
            harness.hooks.on(
                "before_run",
                lambda event: profiles.run_prompt(harness, event.lane),
                id="gateway.profile",
            )
            harness.events.on("retry_end", gave_up.append)
            harness.events.on("retry_scheduled", _retrying)
            for op in suspended:
                lane = await harness.lane(op.lane)
                if lane is not None and op.lane == lane_name:
                    resumed = await _until_done(lane, lane.resume(), ctrl_c)
                    waited = _waiting(resumed) is not None
                    ended = await _decided(lane, resumed, agent.decide, ctrl_c)
                    then = " first" if question else ""
                    # with a question, stdout is its answer alone (`x=$(gateway ask ...)`):
                    # the earlier run's notice and answer go beside it, to stderr
                    earlier = notes if question else out
                    earlier.append(
                        f"(the run before waited for approval: decided{then})"
                        if waited
                        else f"(resumed an interrupted {op.kind}{then})"
                    )
                    if isinstance(ended, Ok) and ended.value.final_message is not None:
                        earlier.append(answer_text(ended.value.final_message))
                    if not question:
                        return _continued(ended)
            if not question:
                raise AskFailed(
                    f"nothing waits on lane {lane_name}: write the question "
                    f"(`{command()} ask --lane {lane_name} TEXT...`)",
                    2,
                )
            lane = await harness.lane(lane_name)
            if lane is None:
                created = await harness.create_lane(lane_name, None)
                if not isinstance(created, Ok):
                    raise AskFailed(created.error.message)
                lane = created.value
            gave_up.clear()
            # the lane's profile, as `serve` gives a thread's lane its route's: instructions,
            # model, the tools it allows, turn limit and token budget
            await profiles.apply(lane, thread, _TERMINAL, [tool.name for tool in agent.tools])
            prompted = await _until_done(lane, lane.prompt(question), ctrl_c)
            result = await _decided(lane, prompted, agent.decide, ctrl_c)
        except _Aborted as failed:
            said = await _done_before_the_abort(storage, lane_name)
            if said is None:
                raise
            raise AskFailed(f"{failed}; {said}", INTERRUPTED) from None
        finally:
            await harness.close()  # nothing of this process writes after its lease is released
            if ctrl_c.again.is_set():  # closed mid-operation: let its shielded steps end first
                others = asyncio.all_tasks() - {asyncio.current_task()}
                if others:
                    await asyncio.wait(others, timeout=STRAGGLERS_SECONDS)
    finally:
        await repo.release_lease(lease)
        close = getattr(client, "aclose", None)
        if close is not None:
            await close()
    if not isinstance(result, Ok):
        raise AskFailed(result.error.message)
    outcome = result.value
    final = outcome.final_message
    if outcome.kind != "completed" or final is None:
        raise AskFailed(_why(outcome, [e.final_error for e in gave_up if not e.success]))
    out.append(answer_text(final))
    usage = final.usage
    if usage is not None:
        notes.append(f"({model}: {usage.input} tokens in, {usage.output} out)")
    return 0


_TERMINAL = Author(id="terminal")
"""Who writes an `ask` lane's questions (as the lane's profile names its thread's starter)."""


def _thread_of(lane_name: str) -> ThreadRef:
    """The thread an `ask` lane is, for the routes: channel ``cli``, space ``default``."""
    return ThreadRef(channel=ASK_CHANNEL, space="default", thread=lane_name.partition(":")[2])


def _continued(ended: Result[Any, Any]) -> int:
    """0 when what the lane left open ended with an answer; why not, as `AskFailed`, otherwise."""
    if not isinstance(ended, Ok):
        raise AskFailed(ended.error.message)
    outcome = ended.value
    if outcome.kind != "completed" or outcome.final_message is None:
        raise AskFailed(_why(outcome, []))
    return 0


async def _decided(
    lane: AgentLane, result: Result[Any, Any], decide: Decide | None, ctrl_c: _CtrlC
) -> Result[Any, Any]:
    """`result`, or once the lane waits for approval: what the run did after `decide` answered."""
    while True:
        waiting = _waiting(result)
        if waiting is None:
            return result
        pending, wait_id = waiting
        if decide is None:
            calls = "; ".join(_call_text(call) for call in pending)
            # refused, the question was not taken: said so, or it read as asked (an outside probe)
            refused = not isinstance(result, Ok) and isinstance(result.error, DecisionsRequired)
            untaken = "this question was not taken; " if refused else ""
            raise AskFailed(
                f"the run on lane {lane.name} waits for approval of {calls}: {untaken}nobody "
                f"here can decide (input is not a terminal); `{command()} ask --lane "
                f"{lane.name}` in a terminal asks again, and the lane keeps waiting until then"
            )
        decisions: list[ApprovalDecision] = []
        for call in pending:
            try:
                approved = await decide(call)
            except NoAnswer:
                sys.stderr.write("\n")  # the prompt's line is still open
                raise AskFailed(
                    f"no answer: nothing was decided; the run on lane {lane.name} keeps "
                    f"waiting for approval (`{command()} ask --lane {lane.name}` asks again)"
                ) from None
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if not ctrl_c.count or current is None or current.uncancel() > 0:
                    raise
                sys.stderr.write("\n")  # the prompt's line is still open
                raise AskFailed(
                    f"interrupted: nothing was decided; the run on lane {lane.name} keeps "
                    f"waiting for approval (`{command()} ask --lane {lane.name}` asks again)",
                    INTERRUPTED,
                ) from None
            decisions.append(approve(call) if approved else deny(call, DENIED_AT_THE_TERMINAL))
        resumed = lane.resume(decisions, wait_id=wait_id, decided_by="gateway ask (terminal)")
        result = await _until_done(lane, resumed, ctrl_c)


def terminal() -> Decide | None:
    """Asks the person at the terminal about each call (y/N on stderr), or None without one."""
    if sys.stdin is None or not sys.stdin.isatty():
        return None

    async def decide(call: PendingApproval) -> bool:
        prompt = f"{_call_text(call)}\n  approve? [y/N] "
        while True:
            answer = await _line(prompt)
            if not answer:  # the end of input (Ctrl-D): no answer, so no decision
                raise NoAnswer
            said = answer.strip().lower()
            if said in ("y", "yes"):
                return True
            if said in ("", "n", "no"):
                return False
            # "yep", "yes please": a denial recorded for good was never what they meant
            prompt = "  please answer y (approve) or n (deny): "

    return decide


class NoAnswer(GatewayError):
    """Input ended at an approval prompt: nothing is decided, the lane keeps waiting."""


def _retrying(retry: RetryScheduled) -> None:
    """Say on stderr that the model's request failed and goes again (the wait is not silent)."""
    kind = retry.error_kind or "unknown"
    when = retry_wait(retry.delay_ms) or "now"
    sys.stderr.write(
        f"(the model request failed: {kind}; attempt {retry.attempt + 1} of "
        f"{retry.max_attempts} {when})\n"
    )


async def _line(prompt: str) -> str:
    """One line from stdin, read by a daemon thread: Ctrl-C or the end never wait for Enter."""
    loop = asyncio.get_running_loop()
    read: asyncio.Future[str] = loop.create_future()

    def settle(text: str) -> None:
        if not read.done():
            read.set_result(text)

    def reader() -> None:
        sys.stderr.write(prompt)
        sys.stderr.flush()
        text = sys.stdin.readline()  # "" at the end of input: not approved
        with contextlib.suppress(RuntimeError):  # the loop ended while this waited
            loop.call_soon_threadsafe(settle, text)

    threading.Thread(target=reader, name="gateway-ask-input", daemon=True).start()
    return await read


def _waiting(result: Result[Any, Any]) -> tuple[tuple[PendingApproval, ...], str] | None:
    """The calls `result` says wait for approval and the wait they answer, or None."""
    if isinstance(result, Ok):
        outcome = result.value
        if isinstance(outcome, Outcome) and outcome.pending_approvals and outcome.wait_id:
            return outcome.pending_approvals, outcome.wait_id
        return None
    if isinstance(result.error, DecisionsRequired):
        return tuple(result.error.pending), result.error.wait_id
    return None


def _call_text(call: PendingApproval) -> str:
    """A pending call as a person reads it: the tool and its arguments as JSON."""
    args = json.dumps(call.model_dump(mode="json")["args"], ensure_ascii=False, sort_keys=True)
    return f"{call.tool_name} {args}"


def _why(outcome: Outcome, gave_up: list[str | None]) -> str:
    """Why a run ended without an answer, with the model's own error when it gave up retrying."""
    error = outcome.error
    if error is None:
        return f"the run ended {outcome.kind}"
    last = gave_up[-1] if gave_up else None
    if error.code == "retries_exhausted":
        if "; the last error: " in error.message:  # the harness kept the provider's words
            return error.message
        if last:  # a run that gave up before it did (D312), or in another process
            return f"{error.message}; the last error: {last}"
    if outcome.kind == "failed":
        return f"the run failed: {error.message}"
    return f"the run ended {outcome.kind}: {error.message}"


async def _acquire(repo: SessionRepo) -> WriterLease:
    """The session's writer lease, waiting up to `LEASE_WAIT_SECONDS` for another holder."""
    owner = f"gateway ask {new_worker_id()}"  # names its process: see `gone`
    deadline = time.monotonic() + LEASE_WAIT_SECONDS
    while True:
        try:
            return await repo.acquire_lease(SESSION, owner=owner, ttl_ms=LEASE_TTL_MS)
        except LeaseHeld as held:
            if held.expires_at_ms is not None and gone(held.owner):
                # a process on this machine that died holding it (killed, SIGTERM before this
                # handled it): its lease is taken at once, as `gateway serve` does (D159)
                with contextlib.suppress(LeaseHeld):
                    dead = await repo.acquire_lease(SESSION, owner=held.owner, ttl_ms=1)
                    await repo.release_lease(dead)
                continue
            if time.monotonic() >= deadline:
                raise AskFailed(_held(held)) from None
        await asyncio.sleep(0.1)


def _held(held: LeaseHeld) -> str:
    until = ""
    if held.expires_at_ms is not None:
        clock = datetime.datetime.fromtimestamp(held.expires_at_ms / 1000).strftime("%H:%M:%S")
        until = f", its lease running until {clock} unless renewed"
    return (
        f"session {SESSION!r} is in use by {held.owner}{until}; waited "
        f"{number(LEASE_WAIT_SECONDS)} s: try again when it is done"
    )


class _CtrlC:
    """Ctrl-C while `ask` works: the first cancels the waiting task, a later one sets `again`.

    So the run is aborted on the first, waiting for that stops on the second, and none raises
    `KeyboardInterrupt` in the middle of a write (what ``asyncio.run`` does with a second one).
    """

    def __init__(self, task: asyncio.Task[Any] | None) -> None:
        self.count = 0
        self.again = asyncio.Event()
        self._task = task

    def __call__(self) -> None:
        self.count += 1
        if self.count == 1 and self._task is not None:
            self._task.cancel()
        else:
            self.again.set()


@contextlib.contextmanager
def _ctrl_c() -> Iterator[_CtrlC]:
    """Take SIGINT and SIGTERM over while the block runs (where the loop can: the main thread).

    SIGTERM (a supervisor, ``kill``) is a Ctrl-C: the run is aborted and the lease released;
    it used to end the process holding the lease, and the next ``ask`` waited for it to lapse.
    """
    loop = asyncio.get_running_loop()
    handler = _CtrlC(asyncio.current_task())
    previous = signal.getsignal(signal.SIGINT)
    try:
        loop.add_signal_handler(signal.SIGINT, handler)
        loop.add_signal_handler(signal.SIGTERM, handler)
    except (ValueError, RuntimeError, NotImplementedError):  # not the main thread, no signals
        yield handler
        return
    try:
        yield handler
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        loop.remove_signal_handler(signal.SIGTERM)
        # After a Ctrl-C, a second press may still be on its way (a quick double press, a
        # loaded machine): absorbed, it cannot replace the line saying what became of the run;
        # one more after it is asyncio.run's again (it stops the process).
        signal.signal(signal.SIGINT, _absorb_once(previous) if handler.count else previous)


def _absorb_once(previous: Any) -> Callable[[int, Any], None]:
    """A SIGINT handler that ignores the first signal, then hands over to `previous`."""

    def absorb(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, previous)

    return absorb


async def _until_done(lane: AgentLane, call: Coroutine[Any, Any, _R], ctrl_c: _CtrlC) -> _R:
    """Wait for `call` (a prompt or a resume on `lane`) to end.

    Ctrl-C (`_CtrlC` cancels the waiting task) aborts the lane's operation and waits up to
    `ABORT_WAIT_SECONDS` for it to record its end, then raises `AskFailed` (status 130). A
    second Ctrl-C stops waiting: the operation then stays open (closing the harness leaves it
    resumable) and the next `ask` on the lane resumes it.
    """
    task = asyncio.ensure_future(call)
    task.add_done_callback(_retrieved)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is None or current.uncancel() > 0:
            raise  # cancelled for another reason as well: not ours to absorb
    again = asyncio.ensure_future(ctrl_c.again.wait())
    try:
        deadline = time.monotonic() + ABORT_WAIT_SECONDS
        while not task.done() and not again.done() and time.monotonic() < deadline:
            if isinstance(await lane.abort(), Ok):
                break
            await asyncio.wait({task, again}, timeout=0.05)  # not accepted yet: abort once it is
        waited = {task, again}
        first = min(ABORT_NOTICE_SECONDS, max(0.0, deadline - time.monotonic()))
        await asyncio.wait(waited, timeout=first, return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and not again.done():
            # a running tool is not cancelled (it settles, seeing the abort): say what waits
            sys.stderr.write(
                f"(stopping: the run ends once its running step does, within "
                f"{number(ABORT_WAIT_SECONDS)} s; Ctrl-C again to stop waiting)\n"
            )
            sys.stderr.flush()
            remaining = max(0.0, deadline - time.monotonic())
            await asyncio.wait(waited, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
    finally:
        again.cancel()
    resumes = f"the next `{command()} ask --lane {lane.name}` resumes it"
    if not task.done() and ctrl_c.again.is_set():
        raise AskFailed(
            f"interrupted twice: stopped without waiting for the run on lane {lane.name} to "
            f"end (if it stays open, {resumes})",
            INTERRUPTED,
        )
    if not task.done():
        raise AskFailed(
            f"interrupted; the run on lane {lane.name} did not stop within "
            f"{number(ABORT_WAIT_SECONDS)} s and stays open ({resumes})",
            INTERRUPTED,
        )
    result = task.result()
    ended = result.value if isinstance(result, Ok) else None
    if isinstance(ended, Outcome) and ended.kind != "aborted":
        raise AskFailed(
            f"interrupted; the run on lane {lane.name} had ended {ended.kind}", INTERRUPTED
        )
    raise _Aborted(f"interrupted: the run on lane {lane.name} was aborted", INTERRUPTED)


async def _done_before_the_abort(storage: SessionStorage, lane: str) -> str | None:
    """What the aborted run's never-replayed tools did, as the thread's stop notice says it.

    Ctrl-C said only "aborted" while a `create_ticket` cut by it had made the ticket: a call
    that is never run again either ran, or may have (D353).
    """
    started = await storage.find_records(
        RecordQuery(lane=lane, type="operation_started", order="newest_first", limit=1)
    )
    if not started:
        return None
    run_id = started[0].record.id  # an operation's start: its id is the run's
    calls = await storage.find_records(
        RecordQuery(lane=lane, type="tool_started", run_id=run_id, order="oldest_first")
    )
    ran, maybe = [], []
    for call, result in await never_repeated(storage, calls):
        outcome = result.outcome if result is not None else "interrupted"
        if outcome == "ok":
            ran.append(call.tool_name)
        elif outcome == "interrupted":
            maybe.append(call.tool_name)
    said = []
    if ran:
        said.append(f"before it stopped, this had already run: {', '.join(ran)}")
    if maybe:
        said.append(f"this may have happened (cut mid-call, never run again): {', '.join(maybe)}")
    return "; ".join(said) or None


def _retrieved(task: asyncio.Future[Any]) -> None:
    """Mark a run's failure as seen (a run cut off by closing the harness ends `HarnessClosed`)."""
    if not task.cancelled():
        task.exception()
