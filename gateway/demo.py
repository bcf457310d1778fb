"""The crash demo: a real process is SIGKILLed mid-tool and a second process recovers every lane.

No Slack, no email, no API key: lanes are named like the threads they will be, the model is
`ScriptedModel` with a deterministic responder. The parent (`demo`) runs each half in a child
process of its own (``python -m gateway.demo``): the first answers a Slack thread, starts sending
an email for the email thread (a ``replay="never"`` tool) and says so on its stdout, and the
parent kills it with SIGKILL right there; the second takes the session once the first one's
lease lapses, restores the lanes and resumes them. Both pids and how each process ended are
printed. The store must be one two processes share (SQLite, JSONL, Redis): not ``memory://``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import IO, Any

from gateway.errors import StatusError
from harness_core import (
    AgentHarness,
    AgentHarnessOptions,
    AssistantMessage,
    LeaseHeld,
    ModelRef,
    ModelRequest,
    Ok,
    ScriptedModel,
    SessionRepo,
    SuspendedOperation,
    Tool,
    ToolContext,
    ToolResultMessage,
    UserMessage,
    message_text,
    open_repo,
)
from harness_core.models.scripted import text, tool_call
from harness_core.session.entries import MessageEntry
from harness_core.session.records import OperationStarted
from harness_core.session.types import LogItem, StoredEntry, StoredRecord

__all__ = ["EMAIL_LANE", "SLACK_LANE", "DemoError", "DemoRun", "demo"]

SLACK_LANE = "slack:C0DEMO:1764489600.000100"
EMAIL_LANE = "email:<demo-thread@example.com>"
MODEL = ModelRef(provider="scripted", model_id="demo")
LEASE_MS = 2_000
"""The children's lease: short, so the second waits at most this long for a killed first."""
IN_TOOL = "in-tool"
"""What the first child writes on its stdout once the email is being sent (then it is killed)."""
STEP_TIMEOUT_S = 60.0
"""How long the parent waits for a child to reach its point (a loaded machine is slow)."""


class DemoError(StatusError):
    """The demo cannot run (a store no second process can open, a child that failed): one line.

    `status` is what the command exits with: 2 for a ``--store`` the demo cannot use (the
    command line is wrong, as for any other command), 1 for a run that failed.
    """


@dataclass(frozen=True, kw_only=True, slots=True)
class DemoRun:
    """What the demo did: the session, and each process's pid and exit status."""

    session: str
    crashed_pid: int
    crashed_status: int
    """The first process's exit status: ``-SIGKILL`` (killed by the parent mid-tool)."""
    resumed_pid: int
    resumed_status: int


def respond(request: ModelRequest) -> AssistantMessage:
    """The demo's model: look things up, send mail, and say honestly what is unknown."""
    last = request.messages[-1]
    if isinstance(last, ToolResultMessage):
        if last.outcome == "interrupted":
            return text(
                "I started sending the incident summary but cannot confirm it went out. "
                "Please check the recipients' inboxes before I send it again."
            )
        return text(f"Done: {message_text(last)}")
    asked = message_text(last).lower() if isinstance(last, UserMessage) else ""
    if "deploy" in asked:
        return tool_call("deploy_calendar", {"team": "platform"})
    if "summar" in asked:
        return tool_call("send_email", {"to": "oncall@example.com", "subject": "Incident"})
    return text("How can I help?")


async def deploy_calendar(args: Any, ctx: ToolContext) -> str:
    return "the deploy window is Tuesdays 14:00-16:00 UTC"


def tools(send_email: Any) -> list[Tool]:
    """A read-only lookup (safe to repeat) and an email send (never repeated blindly)."""
    return [
        Tool(
            name="deploy_calendar",
            description="Look up a team's deploy window.",
            execute=deploy_calendar,
            replay="safe",
        ),
        Tool(
            name="send_email",
            description="Send an email.",
            execute=send_email,
            replay="never",
        ),
    ]


async def _open(repo: SessionRepo, session_id: str, owner: str, send_email: Any) -> Any:
    lease = await _lease(repo, session_id, owner)
    storage = await repo.open(session_id, lease=lease)
    options = AgentHarnessOptions(
        storage=storage,
        model_client=ScriptedModel(responder=respond),
        model=MODEL,
        tools=tools(send_email),
        system_prompt="You are the demo gateway agent.",
        lease_renew_ms=LEASE_MS // 4,
    )
    harness, suspended = await AgentHarness.create(options)
    return lease, storage, harness, suspended


async def _lease(repo: SessionRepo, session_id: str, owner: str) -> Any:
    """The session's lease, once a killed holder's has lapsed (it never released it)."""
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while True:
        try:
            return await repo.acquire_lease(session_id, owner=owner, ttl_ms=LEASE_MS)
        except LeaseHeld as held:
            if time.monotonic() > deadline:
                raise
            waited = (held.expires_at_ms or 0) - int(time.time() * 1000)
            await asyncio.sleep(min(max(waited, 0) / 1000 + 0.02, 0.5))


def describe(item: LogItem) -> str:
    """One log item on one line."""
    if isinstance(item, StoredEntry):
        entry = item.entry
        detail = ""
        if isinstance(entry, MessageEntry):
            detail = f"{entry.message.role}: {message_text(entry.message)[:60]}"
        return f"entry   {item.lane or '-':<34} {entry.type:<18} {detail}"
    if isinstance(item, StoredRecord):
        record = item.record
        detail = str(
            getattr(record, "tool_name", None)
            or getattr(record, "outcome", None)
            or getattr(record, "cause", None)
            or getattr(record, "attempt", "")
        )
        if isinstance(record, OperationStarted):
            detail = record.intent.kind
        return f"record  {record.lane:<34} {record.type:<18} {detail}"
    if item.kind == "lane":
        return f"lane    {item.lane:<34} {'created' if item.created else 'moved'}"
    return f"fact    {item.fact.model_dump_json()}"


def _suspended(op: SuspendedOperation) -> str:
    said = " ".join(message_text(m) for m in op.prompt)
    return f"  {op.lane}: SUSPENDED ({op.reason}) {op.kind} {op.id} - asked: {said!r}"


async def demo(repo: SessionRepo, url: str, out: list[str]) -> DemoRun:
    """Run two threads, SIGKILL the process mid-tool, recover it in a second process.

    Raises:
        DemoError: the store is this process's only (``memory://``), or a child failed.
    """
    if url.partition("://")[0] == "memory":
        raise DemoError(
            "the demo's two processes need a store both can open: sqlite:///file.db, "
            "jsonl:///dir or redis://..., not memory://",
            status=2,
        )
    meta = await repo.create(metadata={"purpose": "gateway demo"})
    job = json.dumps({"store": url, "session": meta.id})

    with tempfile.TemporaryFile() as errors:
        first = await _child("crash", job, errors)
        try:
            await _until_line(first, IN_TOOL, "process 1", errors)
        except BaseException:
            await _reap(first)
            raise
    first.send_signal(signal.SIGKILL)  # mid-tool: no close, no release, no last write
    crashed = await first.wait()
    storage = await repo.open(meta.id)  # read-only: what the kill left
    try:
        out.append(f"store   {url}")
        out.append(f"session {meta.id}  ({(await storage.get_metadata()).name})")
        out.append(
            f"process 1 (pid {first.pid}) answered the Slack thread, then was killed "
            f"({_ended(crashed)}) while sending an email:"
        )
        for item in await storage.get_log():
            out.append(f"  {item.seq:>3} {describe(item)}")
    finally:
        await storage.close()

    with tempfile.TemporaryFile() as errors:
        second = await _child("resume", job, errors)
        try:
            said, _ = await second.communicate()
        except BaseException:  # interrupted: no child outlives the demo
            await _reap(second)
            raise
        resumed = second.returncode if second.returncode is not None else -1
        if resumed != 0:
            raise DemoError(
                f"process 2 (pid {second.pid}) failed ({_ended(resumed)}): {_last(errors)}"
            )
    out.append("")
    out.append(f"process 2 (pid {second.pid}) {said.decode().rstrip()}")
    return DemoRun(
        session=meta.id,
        crashed_pid=first.pid,
        crashed_status=crashed,
        resumed_pid=second.pid,
        resumed_status=resumed,
    )


async def _child(half: str, job: str, errors: IO[bytes]) -> asyncio.subprocess.Process:
    """One half in a process of its own; its stderr goes to `errors` (a pipe could fill up)."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.demo",
        half,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=errors,
    )
    assert child.stdin is not None
    child.stdin.write(job.encode() + b"\n")  # the store URL (a password in it stays off argv)
    await child.stdin.drain()
    child.stdin.close()
    return child


async def _until_line(
    child: asyncio.subprocess.Process, line: str, who: str, errors: IO[bytes]
) -> None:
    """Read `child`'s stdout until `line` (DemoError if it ends or hangs first)."""
    assert child.stdout is not None
    try:
        async with asyncio.timeout(STEP_TIMEOUT_S):
            while True:
                said = await child.stdout.readline()
                if said.decode().strip() == line:
                    return
                if not said:
                    break
    except TimeoutError:
        raise DemoError(f"{who} (pid {child.pid}) did not reach its tool") from None
    status = await child.wait()
    raise DemoError(f"{who} (pid {child.pid}) failed ({_ended(status)}): {_last(errors)}")


async def _reap(child: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        child.kill()
    await child.wait()


def _ended(status: int) -> str:
    if status < 0:
        with contextlib.suppress(ValueError):
            return f"{signal.Signals(-status).name}, exit status {status}"
    return f"exit status {status}"


def _last(errors: IO[bytes]) -> str:
    """The last line a child wrote on its stderr."""
    errors.seek(0)
    said = errors.read().decode(errors="replace")
    lines = [line for line in said.splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no error output"


# -- the two halves, each in a process of its own ---------------------------------------------


async def _crash_half(repo: SessionRepo, session_id: str) -> None:
    """Answer the Slack thread, start sending the email, say so, and wait to be killed."""

    async def send_email_and_wait(args: Any, ctx: ToolContext) -> str:
        print(IN_TOOL, flush=True)  # the parent kills this process now
        await asyncio.Event().wait()
        return "unreachable"

    _, storage, harness, _ = await _open(
        repo, session_id, f"demo-{os.getpid()}", send_email_and_wait
    )
    await storage.set_name("Demo: one Slack thread and one email thread")
    slack = await harness.create_lane(SLACK_LANE, None)
    email = await harness.create_lane(EMAIL_LANE, None)
    assert isinstance(slack, Ok)
    assert isinstance(email, Ok)
    answered = await slack.value.prompt("@bot what is our deploy window?")
    assert isinstance(answered, Ok)
    await email.value.prompt("Please summarise yesterday's incident.")  # never returns


async def _resume_half(repo: SessionRepo, session_id: str, out: list[str]) -> None:
    """Take the session, restore the open lanes (bounded reads, no writes), resume them."""

    async def send_email(args: Any, ctx: ToolContext) -> str:
        raise AssertionError("a started replay='never' tool must not run again")

    asked = time.monotonic()
    lease, storage, harness, suspended = await _open(
        repo, session_id, f"demo-{os.getpid()}", send_email
    )
    waited = time.monotonic() - asked
    out.append(
        f"took the session after {waited:.1f} s (process 1 was killed holding its lease) "
        "and restores the lanes with open work (bounded reads, no writes):"
    )
    for op in suspended:
        out.append(_suspended(op))
    for info in await harness.lanes():
        if info.status == "idle":  # listed, not restored: nothing of it was open
            out.append(f"  {info.name}: idle (nothing open: not restored)")
    for op in suspended:
        lane = await harness.lane(op.lane)
        assert lane is not None
        resumed = await lane.resume()
        assert isinstance(resumed, Ok)
        out.append(f"resume {op.lane}: {resumed.value.kind}")
        for stored in reversed(await lane.session.find_entries_on_branch()):
            entry = stored.entry
            if isinstance(entry, MessageEntry):
                out.append(f"  {entry.message.role:>11}: {message_text(entry.message)}")
    stats = await storage.get_stats()
    await harness.close()
    await repo.release_lease(lease)
    out.append(
        f"stats   {stats.entries} entries, {stats.records} records, "
        f"{stats.usage.total_tokens} tokens"
    )


async def _child_main(half: str) -> int:
    job = json.loads(sys.stdin.readline())
    repo = open_repo(job["store"])
    out: list[str] = []
    try:
        if half == "crash":
            await _crash_half(repo, job["session"])
        else:
            await _resume_half(repo, job["session"], out)
    finally:
        await repo.close()
    print("\n".join(out), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:] not in (["crash"], ["resume"]):
        sys.exit("usage: python -m gateway.demo crash|resume (a job on stdin; see gateway demo)")
    sys.exit(asyncio.run(_child_main(sys.argv[1])))
