"""`abort(reason)`: the operation ends ``aborted`` with the reason as its error, durably (D266).

The reason is recorded with the abort (`AbortRequested.reason`), so the operation's end says
why wherever it is read: its `OperationFinished`, the `Outcome`, the ``run_end`` event, the
lane's status, and the end a restarted process reaches after a crash between the two. An abort
without a reason encodes exactly as before the field existed.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from harness_core import OperationError
from harness_core.models.scripted import deferred, text, tool_call
from harness_core.session.codec import decode_record, encode_record
from harness_core.session.records import AbortRequested, OperationFinished
from harness_core.tools import ToolContext
from tests.support.harness_kit import make_kit
from tests.support.manual import drive
from tests.support.surface import Holder, acting_tool, collect, ok, records_of

REVOKED = OperationError(code="authority_revoked", message="the bot was removed from the channel")


async def test_an_abort_with_a_reason_ends_the_run_with_it(backend: str, tmp_path: Path) -> None:
    holder = Holder()

    async def revoke_mid_tool(ctx: ToolContext) -> None:
        ok(await holder.harness.abort(REVOKED))

    kit = await make_kit(
        backend, tmp_path, [tool_call("act"), text("never")], tools=[acting_tool(revoke_mid_tool)]
    )
    holder.kit = kit
    ends = collect(kit, "run_end")
    outcome = ok(await kit.harness.prompt("go"))
    assert (outcome.kind, outcome.error) == ("aborted", REVOKED)
    [aborted] = await records_of(kit, AbortRequested)
    assert aborted.reason == REVOKED
    [finished] = await records_of(kit, OperationFinished)
    assert (finished.outcome, finished.error) == ("aborted", REVOKED)
    assert [(e.outcome, e.error) for e in ends] == [("aborted", REVOKED)]
    [info] = await kit.harness.lanes()
    assert (info.status, info.last_outcome, info.error) == ("idle", "aborted", REVOKED)


async def test_a_second_abort_keeps_the_first_reason(backend: str, tmp_path: Path) -> None:
    holder = Holder()

    async def abort_twice(ctx: ToolContext) -> None:
        ok(await holder.harness.abort())  # an operator's plain abort came first
        ok(await holder.harness.abort(REVOKED))

    kit = await make_kit(backend, tmp_path, [tool_call("act")], tools=[acting_tool(abort_twice)])
    holder.kit = kit
    outcome = ok(await kit.harness.prompt("go"))
    assert (outcome.kind, outcome.error) == ("aborted", None)
    assert [r.reason for r in await records_of(kit, AbortRequested)] == [None]


async def test_a_crash_after_the_abort_ends_with_its_reason(backend: str, tmp_path: Path) -> None:
    """The process dies after the abort is durable and before the operation closes: the next
    one closes it with the reason the log holds, not as a plain abort."""
    kit = await make_kit(backend, tmp_path, [deferred("job-1")], drive="manual")
    outcome, _ = await drive(kit.harness, kit.harness.prompt("take your time"))
    assert ok(outcome).kind == "suspended"
    ok(await kit.harness.abort(REVOKED))  # parks before its first action: nothing closed yet
    assert await records_of(kit, OperationFinished) == []
    after = await kit.reopen(drive="auto")
    [suspended] = after.suspended
    async with asyncio.timeout(10):
        resumed = ok(await after.harness.resume())
    assert (resumed.run_id, resumed.kind, resumed.error) == (suspended.id, "aborted", REVOKED)
    [finished] = await records_of(after, OperationFinished)
    assert (finished.outcome, finished.error) == ("aborted", REVOKED)


def test_an_abort_without_a_reason_encodes_as_before() -> None:
    plain = AbortRequested(id="r2", lane="main", run_id="r1")
    assert json.loads(plain.model_dump_json()) == {
        "id": "r2",
        "lane": "main",
        "type": "abort_requested",
        "run_id": "r1",
    }
    said = AbortRequested(id="r2", lane="main", run_id="r1", reason=REVOKED)
    for record in (plain, said):
        assert decode_record(encode_record(record), "test") == record
    shown: dict[str, Any] = json.loads(said.model_dump_json())
    assert shown["reason"] == {"code": "authority_revoked", "message": REVOKED.message}
