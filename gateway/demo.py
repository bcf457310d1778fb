"""The embedded demo: a real harness crashes mid-tool and a new process recovers every lane.

No Slack, no email, no API key: lanes are named like the threads they will be, the model is
`ScriptedModel` with a deterministic responder, and the "crash" is a process that stops while
a tool runs (its harness is closed, its lease released: the durable state is exactly what a
SIGKILL would leave).
"""

from __future__ import annotations

import asyncio
from typing import Any

from harness_core import (
    AgentHarness,
    AgentHarnessOptions,
    AssistantMessage,
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
)
from harness_core.models.scripted import text, tool_call
from harness_core.session.entries import MessageEntry
from harness_core.session.records import OperationStarted
from harness_core.session.types import LogItem, StoredEntry, StoredRecord

__all__ = ["EMAIL_LANE", "SLACK_LANE", "demo"]

SLACK_LANE = "slack:C0DEMO:1764489600.000100"
EMAIL_LANE = "email:<demo-thread@example.com>"
MODEL = ModelRef(provider="scripted", model_id="demo")


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
    lease = await repo.acquire_lease(session_id, owner=owner, ttl_ms=30_000)
    storage = await repo.open(session_id, lease=lease)
    options = AgentHarnessOptions(
        storage=storage,
        model_client=ScriptedModel(responder=respond),
        model=MODEL,
        tools=tools(send_email),
        system_prompt="You are the demo gateway agent.",
    )
    harness, suspended = await AgentHarness.create(options)
    return lease, storage, harness, suspended


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


async def demo(repo: SessionRepo, url: str, out: list[str]) -> str:
    """Run two threads, crash one mid-tool, recover it in a new "process"; returns the session."""
    meta = await repo.create(metadata={"purpose": "gateway demo"})
    sending = asyncio.Event()

    async def send_email_and_die(args: Any, ctx: ToolContext) -> str:
        sending.set()
        await asyncio.Event().wait()  # the process dies while the mail is going out
        return "unreachable"

    # process 1: answers the Slack thread, dies while sending mail for the email thread
    lease, storage, harness, _ = await _open(repo, meta.id, "gateway-1", send_email_and_die)
    await storage.set_name("Demo: one Slack thread and one email thread")
    slack = await harness.create_lane(SLACK_LANE, None)
    email = await harness.create_lane(EMAIL_LANE, None)
    assert isinstance(slack, Ok)
    assert isinstance(email, Ok)
    answered = await slack.value.prompt("@bot what is our deploy window?")
    assert isinstance(answered, Ok)
    crashing = asyncio.ensure_future(email.value.prompt("Please summarise yesterday's incident."))
    await sending.wait()
    await harness.close()  # stops mid-tool: what a crash leaves behind
    await asyncio.gather(crashing, return_exceptions=True)
    await repo.release_lease(lease)

    out.append(f"store   {url}")
    out.append(f"session {meta.id}  ({(await storage.get_metadata()).name})")
    out.append("process 1 answered the Slack thread, then died while sending an email:")
    for item in await storage.get_log():
        out.append(f"  {item.seq:>3} {describe(item)}")

    async def send_email(args: Any, ctx: ToolContext) -> str:
        raise AssertionError("a started replay='never' tool must not run again")

    # process 2: restores the open lanes (bounded reads, no writes), then resumes them
    lease, storage, harness, suspended = await _open(repo, meta.id, "gateway-2", send_email)
    out.append("")
    out.append("process 2 restores the lanes with open work (bounded reads, no writes):")
    for op in suspended:
        out.append(_suspended(op))
    for info in await harness.lanes():
        if info.status == "idle":
            out.append(f"  {info.name}: idle")
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
    return meta.id
