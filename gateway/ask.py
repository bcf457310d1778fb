"""``gateway ask``: one durable prompt on a lane of the configured model (the shortest real use).

With ``GATEWAY_MODEL`` unset the model is ``scripted:echo`` (no key needed). A lane keeps its
conversation across invocations, and an invocation that finds the lane's previous run open
(the process died) resumes it before asking.

Every way it can end without an answer is an `AskFailed`: one line, and the exit status. Ctrl-C
aborts the running operation, so the store shows it finished, not open; a second Ctrl-C stops
without waiting for that (the operation stays open, and the next `ask` on the lane resumes it).
Two `ask` processes on one store take turns: each holds the session's writer lease under its own
name, and the second waits up to `LEASE_WAIT_SECONDS` for the first, then says who holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import signal
import socket
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from config import Settings
from config.settings import number
from gateway.models import model_from_settings
from harness_core import (
    AgentHarness,
    AgentHarnessOptions,
    AgentLane,
    LeaseHeld,
    ModelClient,
    ModelRef,
    Ok,
    Outcome,
    RequestOptions,
    RetryScheduled,
    SessionError,
    SessionRepo,
    WriterLease,
    message_text,
)

__all__ = ["ABORT_WAIT_SECONDS", "LEASE_WAIT_SECONDS", "SESSION", "AskFailed", "ask"]

SESSION = "cli"
LEASE_TTL_MS = 30_000
"""The session's writer lease. The harness renews it while the run works, so a long answer keeps
it, and an `ask` that was killed holds the session at most this long."""
LEASE_WAIT_SECONDS = 10.0
"""How long `ask` waits for another process's lease on the session before saying who holds it."""
ABORT_WAIT_SECONDS = 10.0
"""After Ctrl-C: how long the aborted run gets to record that it finished."""
STRAGGLERS_SECONDS = 2.0
"""After a second Ctrl-C closed the harness mid-operation: how long its in-flight steps (a write
of the abort, a check of the lane) get to end while the store is still open."""
INTERRUPTED = 130
"""The exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it."""

_R = TypeVar("_R")


class AskFailed(Exception):
    """`gateway ask` gave no answer: ``str()`` is one line for stderr, `status` the exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


async def ask(
    repo: SessionRepo, settings: Settings, lane_name: str, question: str, out: list[str]
) -> int:
    """Ask `question` on lane `lane_name`; the answer goes to `out`, returns 0.

    Raises:
        AskFailed: the run failed (the model's real error), the session is held by another
            process, or Ctrl-C aborted the run (status 130).
        ModelConfigError: ``GATEWAY_MODEL`` cannot be used (before anything is written).
    """
    client, model = model_from_settings(settings)
    with _ctrl_c() as ctrl_c:
        try:
            return await _ask(repo, settings, lane_name, question, out, client, model, ctrl_c)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if ctrl_c.count and current is not None and current.uncancel() == 0:
                raise AskFailed("interrupted", INTERRUPTED) from None
            raise


async def _ask(
    repo: SessionRepo,
    settings: Settings,
    lane_name: str,
    question: str,
    out: list[str],
    client: ModelClient,
    model: ModelRef,
    ctrl_c: _CtrlC,
) -> int:
    try:
        await repo.create(SESSION)
    except SessionError as exc:
        if exc.code != "already_exists":
            raise
    lease = await _acquire(repo)
    retries: list[RetryScheduled] = []
    try:
        storage = await repo.open(SESSION, lease=lease)
        harness, suspended = await AgentHarness.create(
            AgentHarnessOptions(
                storage=storage,
                model_client=client,
                model=model,
                request_options=RequestOptions(max_output_tokens=settings.model_max_output_tokens),
            )
        )
        try:
            harness.events.on("retry_scheduled", retries.append)
            for op in suspended:
                lane = await harness.lane(op.lane)
                if lane is not None and op.lane == lane_name:
                    out.append(f"(resuming an interrupted {op.kind} first)")
                    await _until_done(lane, lane.resume(), ctrl_c)
            lane = await harness.lane(lane_name)
            if lane is None:
                created = await harness.create_lane(lane_name, None)
                if not isinstance(created, Ok):
                    raise AskFailed(created.error.message)
                lane = created.value
            retries.clear()
            result = await _until_done(lane, lane.prompt(question), ctrl_c)
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
        raise AskFailed(_why(outcome, retries))
    out.append(message_text(final))
    usage = final.usage
    if usage is not None:
        out.append(f"({model}: {usage.input} tokens in, {usage.output} out)")
    return 0


def _why(outcome: Outcome, retries: list[RetryScheduled]) -> str:
    """Why a run ended without an answer, with the model's own error when it gave up retrying."""
    error = outcome.error
    if error is None:
        return f"the run ended {outcome.kind}"
    if error.code == "retries_exhausted" and retries:
        return f"{error.message}; the last error: {retries[-1].error_message}"
    if outcome.kind == "failed":
        return f"the run failed: {error.message}"
    return f"the run ended {outcome.kind}: {error.message}"


async def _acquire(repo: SessionRepo) -> WriterLease:
    """The session's writer lease, waiting up to `LEASE_WAIT_SECONDS` for another holder."""
    owner = f"gateway ask (pid {os.getpid()} on {socket.gethostname()})"
    deadline = time.monotonic() + LEASE_WAIT_SECONDS
    while True:
        try:
            return await repo.acquire_lease(SESSION, owner=owner, ttl_ms=LEASE_TTL_MS)
        except LeaseHeld as held:
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
    """Take SIGINT over while the block runs (where the loop can: in the main thread)."""
    loop = asyncio.get_running_loop()
    handler = _CtrlC(asyncio.current_task())
    previous = signal.getsignal(signal.SIGINT)
    try:
        loop.add_signal_handler(signal.SIGINT, handler)
    except (ValueError, RuntimeError, NotImplementedError):  # not the main thread, no signals
        yield handler
        return
    try:
        yield handler
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        signal.signal(signal.SIGINT, previous)  # asyncio.run's own handler, as it expects


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
        remaining = max(0.0, deadline - time.monotonic())
        await asyncio.wait({task, again}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
    finally:
        again.cancel()
    resumes = f"the next `gateway ask --lane {lane.name}` resumes it"
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
    raise AskFailed(f"interrupted: the run on lane {lane.name} was aborted", INTERRUPTED)


def _retrieved(task: asyncio.Future[Any]) -> None:
    """Mark a run's failure as seen (a run cut off by closing the harness ends `HarnessClosed`)."""
    if not task.cancelled():
        task.exception()
