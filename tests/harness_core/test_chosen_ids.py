"""Caller-chosen entry ids: re-submitting an inbound message after a crash is a point lookup that
returns the original acceptance, never a second message; the same id with other content is
refused."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from harness_core.messages import UserMessage, message_text, user_message
from harness_core.models.scripted import text, tool_call
from harness_core.result import Err, Ok
from harness_core.session.entries import MessageEntry
from harness_core.session.types import StoredEntry, StoredRecord
from harness_core.tools import Tool, ToolContext
from tests.support.harness_kit import Kit, make_kit

SLACK = "slack:C1:1719432.0021"


async def log_size(kit: Kit) -> int:
    return len(await kit.storage.get_log())


async def user_entries(kit: Kit) -> list[tuple[str, str]]:
    return [
        (i.id, message_text(i.entry.message))
        for i in await kit.storage.get_log()
        if isinstance(i, StoredEntry)
        and isinstance(i.entry, MessageEntry)
        and isinstance(i.entry.message, UserMessage)
    ]


async def test_a_prompt_submitted_twice_runs_once_and_returns_the_same_outcome(
    backend: str, tmp_path: Path
) -> None:
    kit = await make_kit(backend, tmp_path, [text("the answer")])
    hooks: list[Any] = []

    async def before_run(event: Any) -> None:
        hooks.append(event)

    kit.harness.hooks.on("before_run", before_run, id="counter")
    first = await kit.harness.prompt("what is it?", entry_id=SLACK)
    assert isinstance(first, Ok) and first.value.kind == "completed"
    size = await log_size(kit)
    again = await kit.harness.prompt("what is it?", entry_id=SLACK)
    assert isinstance(again, Ok) and again.value == first.value
    assert await log_size(kit) == size and len(kit.model.requests) == 1 and len(hooks) == 1
    assert await user_entries(kit) == [(SLACK, "what is it?")]


async def test_the_same_id_with_other_content_is_refused_and_writes_nothing(
    backend: str, tmp_path: Path
) -> None:
    kit = await make_kit(backend, tmp_path, [text("a1")])
    assert isinstance(await kit.harness.prompt("hello", entry_id=SLACK), Ok)
    size = await log_size(kit)
    for call in (
        kit.harness.prompt("something else", entry_id=SLACK),
        kit.harness.next_run("something else", entry_id=SLACK),
    ):
        refused = await call
        assert isinstance(refused, Err) and refused.error.tag == "InvalidMessage"
        assert refused.error.reason == "entry_id_conflict"  # type: ignore[union-attr]
    first_answer = next(
        i.id
        for i in await kit.storage.get_log()
        if isinstance(i, StoredEntry) and i.entry.type == "message" and i.id != SLACK
    )
    taken = await kit.harness.prompt("hi", entry_id=first_answer)  # an answer's id
    assert isinstance(taken, Err) and taken.error.reason == "entry_id_conflict"  # type: ignore[union-attr]
    assert await log_size(kit) == size


async def test_malformed_chosen_ids_are_refused(backend: str, tmp_path: Path) -> None:
    kit = await make_kit(backend, tmp_path)
    for entry_id in ("", "has space", "x" * 257, "tab\there"):
        refused = await kit.harness.prompt("hi", entry_id=entry_id)
        assert isinstance(refused, Err) and refused.error.reason == "entry_id"  # type: ignore[union-attr]
    several = await kit.harness.prompt([user_message("a"), user_message("b")], entry_id="m1")
    assert isinstance(several, Err) and several.error.reason == "entry_id"  # type: ignore[union-attr]
    assert await log_size(kit) == 0


async def test_queued_input_submitted_twice_is_queued_once(backend: str, tmp_path: Path) -> None:
    release = asyncio.Event()
    started = asyncio.Event()

    async def wait(args: Any, ctx: ToolContext) -> str:
        started.set()
        await release.wait()
        return "waited"

    tool = Tool(name="wait", description="wait", execute=wait)
    kit = await make_kit(backend, tmp_path, [tool_call("wait", {}), text("saw it")], tools=[tool])
    running = asyncio.ensure_future(kit.harness.prompt("start", entry_id="m1"))
    await started.wait()
    first = await kit.harness.steer("also this", entry_id="m2")
    size = await log_size(kit)
    again = await kit.harness.steer("also this", entry_id="m2")
    as_follow_up = await kit.harness.follow_up("also this", entry_id="m2")
    assert first == again == as_follow_up == Ok("m2")
    assert await log_size(kit) == size
    as_prompt = await kit.harness.prompt("also this", entry_id="m2")
    assert isinstance(as_prompt, Err) and as_prompt.error.tag == "AlreadyAccepted"
    assert as_prompt.error.queue == "steer"  # type: ignore[union-attr]
    release.set()
    outcome = await running
    assert isinstance(outcome, Ok) and outcome.value.kind == "completed"
    after = await kit.harness.steer("also this", entry_id="m2")  # consumed long ago
    assert after == Ok("m2")
    assert await user_entries(kit) == [("m1", "start"), ("m2", "also this")]


async def test_a_next_run_item_submitted_twice_seeds_the_next_run_once(
    backend: str, tmp_path: Path
) -> None:
    kit = await make_kit(backend, tmp_path, [text("ok")])
    assert await kit.harness.next_run("context", entry_id="n1") == Ok("n1")
    assert await kit.harness.next_run("context", entry_id="n1") == Ok("n1")
    assert isinstance(await kit.harness.prompt("go", entry_id="p1"), Ok)
    assert await user_entries(kit) == [("n1", "context"), ("p1", "go")]


async def test_a_prompt_accepted_before_a_crash_is_found_by_the_new_process(
    backend: str, tmp_path: Path
) -> None:
    kit = await make_kit(backend, tmp_path, [text("never")])
    started = asyncio.Event()

    async def stall(event: Any) -> None:
        started.set()
        await asyncio.Event().wait()  # the process dies before the model answers

    kit.harness.hooks.on("before_request", stall)
    running = asyncio.ensure_future(kit.harness.prompt("ship it", entry_id=SLACK))
    await started.wait()
    reopened = await kit.reopen(script=[text("shipped")])
    (suspended,) = reopened.suspended
    size = await log_size(reopened)
    again = await reopened.harness.prompt("ship it", entry_id=SLACK)  # the inbox re-delivers
    assert isinstance(again, Ok) and again.value.kind == "suspended"
    assert again.value.run_id == suspended.id and await log_size(reopened) == size
    resumed = await reopened.harness.resume()
    assert isinstance(resumed, Ok) and resumed.value.kind == "completed"
    third = await reopened.harness.prompt("ship it", entry_id=SLACK)
    assert isinstance(third, Ok) and third.value == resumed.value
    assert await user_entries(reopened) == [(SLACK, "ship it")]
    running.cancel()


async def test_an_input_accepted_on_one_lane_cannot_be_used_on_another(
    backend: str, tmp_path: Path
) -> None:
    kit = await make_kit(backend, tmp_path, [text("a1")])
    assert isinstance(await kit.harness.prompt("hello", entry_id=SLACK), Ok)
    other = (await kit.harness.create_lane("b", None)).value  # type: ignore[union-attr]
    refused = await other.prompt("hello", entry_id=SLACK)
    assert isinstance(refused, Err) and refused.error.reason == "entry_id_conflict"  # type: ignore[union-attr]
    records = [i for i in await kit.storage.get_log() if isinstance(i, StoredRecord)]
    assert [r.record.lane for r in records if r.type == "operation_started"] == ["main"]


async def test_a_new_input_is_looked_up_once_when_nothing_was_written_in_between(
    backend: str, tmp_path: Path
) -> None:
    """D273: the acceptance re-reads a chosen id only when a write may have used it since."""
    kit = await make_kit(backend, tmp_path, [text("a1"), text("a2")])
    assert kit.recording is not None
    lookups: list[str] = []
    inner = kit.recording.get_record

    async def get_record(record_id: str) -> StoredRecord | None:
        lookups.append(record_id)
        found: StoredRecord | None = await inner(record_id)
        return found

    kit.recording.get_record = get_record  # type: ignore[attr-defined]
    assert isinstance(await kit.harness.prompt("hello", entry_id=SLACK), Ok)
    assert len(lookups) == 1
    assert isinstance(await kit.harness.prompt("hello", entry_id=SLACK), Ok)  # a repeat
    assert len(lookups) == 2 and await user_entries(kit) == [(SLACK, "hello")]


async def test_the_same_input_accepted_while_the_first_is_in_its_hooks_is_found_again(
    backend: str, tmp_path: Path
) -> None:
    """A write between the first lookup and the acceptance (here: the same input, accepted by a
    second submission while the first waits in `before_run`) makes the acceptance look again."""
    kit = await make_kit(backend, tmp_path, [text("the answer"), text("never")])
    nested: list[Any] = []

    async def before_run(event: Any) -> None:
        if not nested:
            nested.append(None)
            nested[0] = await kit.harness.prompt("hello", entry_id=SLACK)

    kit.harness.hooks.on("before_run", before_run, id="resubmit")
    outer = await kit.harness.prompt("hello", entry_id=SLACK)
    inner = nested[0]
    assert isinstance(inner, Ok) and isinstance(outer, Ok) and outer.value == inner.value
    assert await user_entries(kit) == [(SLACK, "hello")] and len(kit.model.requests) == 1
