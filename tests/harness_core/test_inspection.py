"""`inspect_lane`: a lane's status read from storage alone, beside (or without) its harness."""

from __future__ import annotations

from typing import Any

import pytest

from harness_core import InterruptedCall, inspect_lane, recovery_of
from harness_core.errors import SessionError
from harness_core.models.scripted import error, text, tool_call
from harness_core.tools import ToolContext, tool
from tests.support.harness_kit import make_kit
from tests.support.surface import Waiter, bury, in_flight, ok


async def test_idle_and_failed_lanes(backend, tmp_path) -> None:
    kit = await make_kit(backend, tmp_path, [text("a1"), error("auth", retryable=False)])
    ok(await kit.harness.prompt("q1"))
    seen = await inspect_lane(kit.storage, "main", max_attempts=3)
    assert seen.info.status == "idle" and seen.info.last_outcome == "completed"
    assert seen.info.leaf_id == await kit.harness.get_leaf_id() and seen.activity is None
    ok(await kit.harness.prompt("q2"))
    failed = await inspect_lane(kit.storage, "main", max_attempts=3)
    assert failed.info.status == "failed" and failed.info.error is not None
    with pytest.raises(SessionError) as caught:
        await inspect_lane(kit.storage, "nowhere", max_attempts=3)
    assert caught.value.code == "unknown_lane"


async def test_a_crash_mid_tool_is_suspended_running_or_stuck(backend, tmp_path) -> None:
    """The same stored state reads as suspended by a crash, as running while a live worker holds
    the session, and as stuck once it used its attempts; the started call is listed with the
    declaration a resume would judge."""
    waiter = Waiter()
    kit = await make_kit(backend, tmp_path, [tool_call("wait", call_id="c1")], [waiter.tool])
    await bury(kit, await in_flight(kit, waiter))
    crashed = await inspect_lane(kit.storage, "main", max_attempts=3)
    info = crashed.info
    assert (info.status, info.suspended, info.attempts) == ("suspended", "crash", 1)
    assert info.operation_kind == "run" and info.operation_id is not None
    assert crashed.activity == "running tool 'wait'"
    assert crashed.interrupted_calls == (
        InterruptedCall(tool_call_id="c1", tool_name="wait", replay="never"),
    )
    running = await inspect_lane(kit.storage, "main", max_attempts=3, executing=True)
    assert running.info.status == "running" and running.info.suspended is None
    stuck = await inspect_lane(kit.storage, "main", max_attempts=1, executing=True)
    assert (stuck.info.status, stuck.info.suspended) == ("stuck", "crash")


async def test_an_approval_wait_lists_its_calls(backend, tmp_path) -> None:
    @tool(requires_approval=True)
    async def deploy(args: dict[str, Any], ctx: ToolContext) -> str:
        """Deploy."""
        return "deployed"

    kit = await make_kit(
        backend, tmp_path, [tool_call("deploy", {"build": 7}, call_id="d1")], [deploy]
    )
    outcome = ok(await kit.harness.prompt("ship it"))
    assert outcome.kind == "suspended"
    seen = await inspect_lane(kit.storage, "main", max_attempts=3, executing=True)
    assert (seen.info.status, seen.info.suspended) == ("suspended", "approval")
    assert [(p.tool_call_id, p.tool_name) for p in seen.pending_approvals] == [("d1", "deploy")]
    assert seen.wait_id is not None and seen.interrupted_calls == ()


async def test_a_log_that_does_not_restore_is_faulted(backend, tmp_path) -> None:
    """Another writer moved the lane off its open operation's path: it cannot be restored."""
    waiter = Waiter()
    kit = await make_kit(backend, tmp_path, [tool_call("wait", call_id="c1")], [waiter.tool])
    await bury(kit, await in_flight(kit, waiter))
    await kit.storage.move_lane("main", None)
    seen = await inspect_lane(kit.storage, "main", max_attempts=3)
    assert seen.info.status == "faulted" and seen.info.fault  # the reason, for the operator


def test_what_a_resume_does_to_an_interrupted_call() -> None:
    never = InterruptedCall(tool_call_id="c", tool_name="email", replay="never")
    safe = InterruptedCall(tool_call_id="c", tool_name="lookup", replay="safe")
    assert "interrupted" in recovery_of(never, "declared")
    assert "interrupted" in recovery_of(safe, "never")
    assert recovery_of(never, "always") == "run again"
    assert recovery_of(safe, "declared").startswith("run again if")
