"""Portable state: export a lane, JSON round trip, fork, import, pydantic-ai JSON."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

from harness_core import texts
from harness_core.messages import message_text
from harness_core.models.scripted import error, text, tool_call
from harness_core.portable import CapabilityState, HarnessState
from harness_core.result import Ok
from harness_core.tools import Tool, ToolContext
from tests.support.harness_kit import Kit, make_kit


async def lookup(args: object, ctx: ToolContext) -> str:
    return "green"


async def conversation_kit(backend: str, tmp_path: Path) -> Kit:
    kit = await make_kit(
        backend,
        tmp_path,
        [tool_call("lookup", call_id="c1"), text("all green"), text("second answer")],
        tools=[Tool(name="lookup", description="look", execute=lookup, replay="safe")],
    )
    assert isinstance(await kit.harness.prompt("status?"), Ok)
    await kit.harness.set_capability("acme.counter", CapabilityState(version="1", data={"n": 2}))
    await kit.harness.set_capability("acme.counter", CapabilityState(version="1", data={"n": 3}))
    await kit.harness.set_capability("other.plugin", CapabilityState(version="7", data="opaque"))
    return kit


async def test_export_round_trip_and_import(backend: str, tmp_path: Path) -> None:
    kit = await conversation_kit(backend, tmp_path)
    state = await kit.harness.export_state("thread-1")
    assert [m.role for m in state.messages] == ["user", "assistant", "tool_result", "assistant"]
    assert {k: (v.version, v.data) for k, v in state.capabilities.items()} == {
        "acme.counter": ("1", {"n": 3}),  # the newest data per namespace
        "other.plugin": ("7", "opaque"),  # unknown namespaces survive
    }
    again = HarnessState.from_json(state.to_json())
    assert again == state
    imported = await kit.harness.import_state("copy", again)
    assert isinstance(imported, Ok)
    copy = imported.value
    exported = await copy.export_state("thread-1")
    assert exported == state
    # the imported lane continues the conversation with its own history
    assert isinstance(await copy.prompt("and now?"), Ok)
    request = kit.model.requests[-1]
    assert [m.role for m in request.messages][:4] == [
        "user",
        "assistant",
        "tool_result",
        "assistant",
    ]


async def test_fork_needs_a_new_identity(backend: str, tmp_path: Path) -> None:
    state = HarnessState(thread_id="t-1")
    with pytest.raises(ValueError, match="new thread id"):
        state.fork("t-1")
    forked = state.fork("t-2")
    assert forked.thread_id == "t-2" and forked.messages == state.messages


async def test_environment_state_is_not_a_field(backend: str, tmp_path: Path) -> None:
    """D235: no environment mounts here, so no environment state; an envelope written with the
    old empty field still reads, one that carries environment data is refused."""
    assert "environment" not in HarnessState.model_fields
    old = (
        '{"schema_version":"1","thread_id":"t-1","messages":[],"capabilities":{},"environment":{}}'
    )
    assert HarnessState.from_json(old) == HarnessState(thread_id="t-1")
    with pytest.raises(ValidationError, match="environment state is not supported"):
        HarnessState.from_json(old.replace('"environment":{}', '"environment":{"sandbox":{}}'))


async def test_a_failed_run_carries_the_state_it_reached(backend: str, tmp_path: Path) -> None:
    """a13n C6: the failed outcome holds the normalized state the run reached (messages and the
    tool results so far), and a host can fork it and continue on a new lane."""
    kit = await make_kit(
        backend,
        tmp_path,
        [
            tool_call("lookup", call_id="c1"),
            error("invalid_request", retryable=False, message="refused"),
        ],
        tools=[Tool(name="lookup", description="look", execute=lookup, replay="safe")],
    )
    failed = await kit.harness.prompt("status?")
    assert isinstance(failed, Ok) and failed.value.kind == "failed", failed
    state = failed.value.state
    assert state is not None and state.thread_id == "main"
    assert [m.role for m in state.messages][:3] == ["user", "assistant", "tool_result"]
    assert state.messages == (await kit.harness.export_state()).messages
    kit.model.script.extend([text("recovered elsewhere"), text("yes")])
    imported = await kit.harness.import_state("fork", state.fork("fork"))
    assert isinstance(imported, Ok)
    again = await imported.value.prompt("try again")
    assert isinstance(again, Ok) and again.value.kind == "completed"
    assert [m.role for m in kit.model.requests[-1].messages][:3] == [
        "user",
        "assistant",
        "tool_result",
    ]
    completed = await kit.harness.prompt("fine now?")  # other kinds carry no state
    assert isinstance(completed, Ok) and completed.value.state is None


async def test_invalid_state_is_refused(backend: str, tmp_path: Path) -> None:
    good = HarnessState(thread_id="t-1").to_json()
    with pytest.raises(ValidationError):
        HarnessState.from_json(good.replace('"schema_version":"1"', '"schema_version":"2"'))
    with pytest.raises(ValidationError):
        HarnessState(thread_id="")
    with pytest.raises(ValidationError):
        HarnessState(thread_id="t", capabilities={"": CapabilityState(version="1")})


async def test_messages_as_pydantic_ai_json_and_back(backend: str, tmp_path: Path) -> None:
    kit = await conversation_kit(backend, tmp_path)
    state = await kit.harness.export_state("thread-1")
    blob = state.model_messages_json()
    back = HarnessState.from_model_messages_json("thread-1", blob, capabilities=state.capabilities)
    assert [(m.role, m.content) for m in back.messages] == [
        (m.role, m.content) for m in state.messages
    ]


async def test_an_exported_state_cannot_be_changed(backend: str, tmp_path: Path) -> None:
    """S1-01: the continuation value is immutable, its maps and message tuples included."""
    kit = await conversation_kit(backend, tmp_path)
    state = await kit.harness.export_state("thread-1")
    with pytest.raises(ValidationError, match="frozen"):
        state.thread_id = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        state.capabilities["acme.counter"] = CapabilityState(version="9")  # type: ignore[index]
    with pytest.raises(AttributeError):
        state.messages.append(state.messages[0])  # type: ignore[attr-defined]
    assert await kit.harness.export_state("thread-1") == state


def test_only_messages_and_capabilities_travel() -> None:
    """S1-05: nothing else is part of the portable state (model, tools, credentials, approvals,
    queues, leases...), and an envelope that tries to carry more is refused."""
    assert set(HarnessState.model_fields) == {
        "schema_version",
        "thread_id",
        "messages",
        "capabilities",
    }
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        HarnessState.model_validate({"thread_id": "t", "approvals": []})


async def test_export_during_a_run_reads_the_safe_boundary_and_writes_nothing(
    backend: str, tmp_path: Path
) -> None:
    """S1-12: exporting while a run is open (here: a tool is running) returns what is
    committed so far and persists nothing."""
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(args: object, ctx: ToolContext) -> str:
        started.set()
        await release.wait()
        return "done"

    kit = await make_kit(
        backend,
        tmp_path,
        [tool_call("slow", call_id="c1"), text("finished")],
        tools=[Tool(name="slow", description="slow", execute=slow)],
    )
    running = asyncio.ensure_future(kit.harness.prompt("go"))
    await started.wait()
    before = await kit.storage.get_log()
    state = await kit.harness.export_state()
    # the safe boundary: the call is answered by the "no result recorded" placeholder, so the
    # state is a valid conversation; the real result is not in it (it does not exist yet)
    assert [m.role for m in state.messages] == ["user", "assistant", "tool_result"]
    assert message_text(state.messages[-1]) == texts.NO_RESULT
    assert await kit.storage.get_log() == before  # nothing written
    release.set()
    assert isinstance(await running, Ok)
    after = await kit.harness.export_state()
    assert [m.role for m in after.messages] == ["user", "assistant", "tool_result", "assistant"]
