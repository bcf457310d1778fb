"""The ``gateway`` command: a store demo and store inspection (the service itself comes later)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from config import Settings
from harness_core.errors import HarnessError
from harness_core.messages import AssistantMessage, TextPart, TokenUsage, user_message
from harness_core.session.contract import SessionRepo, SessionStorage
from harness_core.session.entries import MessageEntry
from harness_core.session.records import (
    LaneConfiguration,
    OperationFinished,
    OperationStarted,
    RunIntent,
    StepAttempt,
    Usage,
)
from harness_core.session.types import LogItem, StoredEntry, StoredRecord
from harness_core.storage import open_repo

__all__ = ["main"]

_NOT_YET = (
    "gateway serve: not implemented yet (the service lands with the gateway issues); "
    "try `gateway demo`"
)
SLACK_LANE = "slack:C0DEMO:1764489600.000100"
EMAIL_LANE = "email:<demo-thread@example.com>"


def _describe(item: LogItem) -> str:
    if isinstance(item, StoredEntry):
        entry = item.entry
        text = ""
        if isinstance(entry, MessageEntry):
            parts = getattr(entry.message, "content", ())
            text = " ".join(p.text for p in parts if isinstance(p, TextPart))
            text = f"{entry.message.role}: {text[:60]}"
        return f"entry   {item.lane or '-':<34} {entry.type:<8} {entry.id:<22} {text}"
    if isinstance(item, StoredRecord):
        record = item.record
        run = getattr(record, "run_id", None)
        detail = (
            f"run={run}"
            if run
            else f"kind={record.intent.kind}"
            if isinstance(record, OperationStarted)
            else ""
        )
        return f"record  {record.lane:<34} {record.type:<18} {record.id:<12} {detail}"
    if item.kind == "lane":
        return f"lane    {item.lane:<34} {'created' if item.created else 'moved'} at {item.leaf_id}"
    return f"fact    {item.fact.model_dump_json()}"


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


async def _converse(
    storage: SessionStorage, lane: str, tag: str, question: str, answer: str, *, finish: bool
) -> None:
    """One run on a lane, written the way the harness will: intent before effect."""
    lane_now = await storage.get_lane(lane)
    prompt = MessageEntry(id=f"{tag}-prompt", message=user_message(question, sender="demo-user"))
    run = OperationStarted(
        id=f"{tag}-run",
        lane=lane,
        source_leaf_id=lane_now.leaf_id if lane_now else None,
        intent=RunIntent(original_prompt=(prompt.message,), initial_messages=(prompt,)),
        configuration=LaneConfiguration(provider="scripted", model_id="demo"),
    )
    await storage.append_record(run)
    await storage.append_entry(prompt, lane)
    await storage.append_record(
        StepAttempt(
            id=f"{tag}-attempt",
            lane=lane,
            run_id=run.id,
            step="assistant",
            attempt=1,
            result_entry_id=f"{tag}-reply",
        )
    )
    if not finish:
        return  # the process "dies" here: the model call's outcome was never written
    usage = TokenUsage(input=42, output=17, total_tokens=59)
    reply = AssistantMessage(
        content=(TextPart(text=answer),),
        stop_reason="stop",
        provider="scripted",
        model="demo",
        usage=usage,
    )
    await storage.append_record(
        Usage(
            id=f"{tag}-usage",
            lane=lane,
            cause="assistant",
            run_id=run.id,
            entry_id=f"{tag}-reply",
            attempt=1,
            stop_reason="stop",
            usage=usage,
        )
    )
    await storage.append_entry(MessageEntry(id=f"{tag}-reply", message=reply), lane)
    await storage.append_record(
        OperationFinished(id=f"{tag}-done", lane=lane, run_id=run.id, outcome="completed")
    )


async def demo(repo: SessionRepo, url: str, out: list[str]) -> str:
    """Write a small two-lane session, leave one run open as if crashed, and restore it."""
    meta = await repo.create(metadata={"purpose": "gateway demo"})
    lease = await repo.acquire_lease(meta.id, owner="gateway-demo", ttl_ms=30_000)
    storage = await repo.open(meta.id, lease=lease)
    await storage.set_name("Demo: one Slack thread and one email thread")
    await storage.create_lane(SLACK_LANE, None)
    await storage.create_lane(EMAIL_LANE, None)
    await _converse(
        storage,
        SLACK_LANE,
        "s1",
        "@bot what is our deploy window?",
        "Tuesdays 14:00-16:00 UTC.",
        finish=True,
    )
    await _converse(
        storage, EMAIL_LANE, "m1", "Please summarise yesterday's incident.", "", finish=False
    )
    await repo.release_lease(lease)

    out.append(f"store   {url}")
    out.append(f"session {meta.id}  ({(await storage.get_metadata()).name})")
    for item in await storage.get_log():
        out.append(f"  {item.seq:>3} {_describe(item)}")
    out.append("")
    out.append("restore, as a new process would (bounded reads, no writes):")
    reader = await repo.open(meta.id)
    for pointer in await reader.get_lanes():
        opened = await reader.find_open_operations(pointer.lane, limit=2)
        if not opened:
            out.append(f"  {pointer.lane}: idle at {pointer.leaf_id}")
            continue
        start = opened[0].record
        assert isinstance(start, OperationStarted)
        records = await reader.read_operation_records(pointer.lane, start.id)
        own = await reader.read_lane_entries(pointer.lane, after=start.source_leaf_id)
        out.append(
            f"  {pointer.lane}: SUSPENDED (crash) in run {start.id}: "
            f"{_count(len(records), 'record')} and {_count(len(own), 'entry', 'entries')} "
            "since it started"
        )
    stats = await reader.get_stats()
    tokens = stats.usage.total_tokens
    out.append(f"stats   {stats.entries} entries, {stats.records} records, {tokens} tokens")
    return meta.id


async def show(repo: SessionRepo, session_id: str | None, out: list[str]) -> None:
    """List sessions, or print one session's lanes and log."""
    if session_id is None:
        for meta in await repo.list():
            out.append(f"{meta.id}  {meta.name or ''}")
        return
    storage = await repo.open(session_id)
    for pointer in await storage.get_lanes():
        state = (
            "open operation"
            if await storage.find_open_operations(pointer.lane, limit=1)
            else "idle"
        )
        out.append(f"lane {pointer.lane:<34} leaf={pointer.leaf_id} ({state})")
    for item in await storage.get_log():
        out.append(f"  {item.seq:>3} {_describe(item)}")


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    url = args.store or settings.store_url
    repo = open_repo(url)
    out: list[str] = []
    try:
        if args.command == "demo":
            session_id = await demo(repo, url, out)
            out.append(f"inspect it again: gateway store show {session_id} --store {url}")
        elif args.command == "store":
            await show(repo, args.session, out)
        else:
            print(_NOT_YET, file=sys.stderr)
            return 2
    finally:
        await repo.close()
        print("\n".join(out))
    return 0


def main(argv: Sequence[str] | None = None, settings: Settings | None = None) -> int:
    """Run the ``gateway`` command; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="gateway", description="A durable LLM agent gateway for Slack and email."
    )
    parser.add_argument(
        "--store", help="store URL (default: $GATEWAY_STORE_URL or sqlite:///.gateway/gateway.db)"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="write a small two-lane session, crash one run, restore it")
    store = commands.add_parser("store", help="list sessions, or show one session's lanes and log")
    store.add_argument("session", nargs="?")
    store.add_argument("--store", dest="store", default=argparse.SUPPRESS)
    demo_parser = commands.choices["demo"]
    demo_parser.add_argument("--store", dest="store", default=argparse.SUPPRESS)
    commands.add_parser("serve", help="run the gateway service (not implemented yet)")
    args = parser.parse_args(argv)
    if settings is None:
        from config import load_settings

        settings = load_settings()
    try:
        return asyncio.run(_run(args, settings))
    except HarnessError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 1
