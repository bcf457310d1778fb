"""Missing identities: a suspended run whose tools or model the restarted process lacks cannot
be resumed, but can be aborted.
"""

from __future__ import annotations

import asyncio

from harness_core.messages import ToolResultMessage
from harness_core.models.scripted import tool_call
from harness_core.session.records import OperationFinished
from tests.support.harness_kit import MODEL, make_kit
from tests.support.surface import (
    Waiter,
    bury,
    err,
    in_flight,
    log_size,
    messages_of,
    ok,
    records_of,
    reopen,
    transcript,
)


async def test_missing_identities_block_resume_but_not_abort(backend, tmp_path) -> None:
    waiter = Waiter()
    kit = await make_kit(backend, tmp_path, [tool_call("wait")], tools=[waiter.tool])
    task = await in_flight(kit, waiter)
    kit.model.known_models = {"scripted:another"}  # the restarted process lacks the model too
    fresh_kit = await reopen(kit, "r-", tools=[])
    [suspended] = fresh_kit.suspended
    assert suspended.missing_tools == ("wait",)
    assert suspended.missing_models == (str(MODEL),)
    before = await log_size(fresh_kit)
    missing = err(await fresh_kit.harness.resume(), "MissingIdentities")
    assert (missing.lane, missing.tools, missing.models) == ("main", ("wait",), (str(MODEL),))
    assert await log_size(fresh_kit) == before
    accepted = ok(await fresh_kit.harness.abort())
    assert accepted.run_id == suspended.id
    async with asyncio.timeout(10):
        await fresh_kit.harness.wait_for_idle()
    finished = await records_of(fresh_kit, OperationFinished)
    assert [(r.run_id, r.outcome) for r in finished] == [(suspended.id, "aborted")]
    results = [
        m for m in messages_of(await transcript(fresh_kit)) if isinstance(m, ToolResultMessage)
    ]
    assert [r.outcome for r in results] == ["interrupted"]
    assert waiter.calls == 1
    assert len(fresh_kit.model.requests) == 1  # only the crashed process's request
    await bury(kit, task)
    third = await reopen(fresh_kit, "s-")
    assert third.suspended == []
