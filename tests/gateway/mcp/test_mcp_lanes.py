"""MCP faults through the whole service: the lane answers, the other lanes keep working.

A whole `Service` runs in the test's process (SQLite store, broker and web mailbox) with a
scripted model and the test MCP server (`tests.support.mcp_servers`) spawned over stdio. A
message ``/call <tool>`` makes the model call ``demo.<tool>``; once the call's result is back
the model answers ``Done: <what the tool said>``. Each fault of the server (a crash mid-call, a
hang past the call timeout, a malformed result, a flood of output, a tool dropped by a list
change) reaches the model as a tool result it can read, and the thread gets its answer. The
``/metrics`` page counts the calls by outcome, the restarts and whether the server is up.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.channels import gateway_settings
from gateway.ops.views import lane_id
from gateway.service import Service, ServiceParts
from harness_core import (
    AssistantMessage,
    ModelRef,
    ModelRequest,
    ScriptedModel,
    ToolResultMessage,
    UserMessage,
    message_text,
)
from harness_core.models.scripted import text, tool_call
from tests.support.gateway_rig import decision_body
from tests.support.service_rig import ServiceRig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

ROOT = str(Path(__file__).resolve().parents[3])
ANSWERLESS = ("message", "decision", "approval_closed")
"""The thread items that are not the agent's (as `ServiceRig.answers` counts)."""
CALL_TIMEOUT_S = 5.0
"""The hang's bound: long enough for another lane's whole turn while the call hangs."""


def respond(request: ModelRequest) -> AssistantMessage:
    """``/call <tool>`` calls ``demo.<tool>``; a tool's result is answered ``Done: ...``."""
    last = request.messages[-1]
    if isinstance(last, ToolResultMessage):
        said = message_text(last)
        return text(f"Done ({'error' if last.is_error else 'ok'}): {said[:300]}")
    users = [m for m in request.messages if isinstance(m, UserMessage)]
    words = message_text(users[-1]).split() if users else []
    if len(words) >= 2 and words[0] == "/call":
        arguments = {"text": " ".join(words[2:])} if words[1] == "echo" else {}
        return tool_call(f"demo.{words[1]}", arguments)
    return text(f"You said: {' '.join(words)}")


class Rig(ServiceRig):
    """The service, its scripted model and the MCP server's marks (what reached it)."""

    def __init__(
        self, service: Service, http: httpx.AsyncClient, model: ScriptedModel, marks: Path
    ) -> None:
        super().__init__(service, http)
        self.model = model
        self.marks = marks

    async def ask(self, thread: str, said: str) -> str:
        """Post `said` to `thread`; the agent's answer to it (its next reply)."""
        items = (await self.http.get(f"/web/threads/{thread}")).json()["items"]
        before = sum(1 for item in items if item["kind"] not in ANSWERLESS)
        await self.post(thread, said)
        return str((await self.answers(thread, before + 1))[-1]["text"])

    def result_of(self, tool: str) -> ToolResultMessage:
        """The tool result of `tool` the model was handed (the last one)."""
        found = [
            last
            for request in self.model.requests
            if isinstance(last := request.messages[-1], ToolResultMessage)
            and last.tool_name == tool
        ]
        assert found, f"the model was never handed a result of {tool}"
        return found[-1]

    def started(self, tool: str) -> bool:
        return any(p.name.startswith(f"call-{tool}-") for p in self.marks.iterdir())

    async def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        response = await self.http.get("/metrics")
        assert response.status_code == 200, response.text
        return {
            (sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(response.text)
            for sample in family.samples
        }

    async def metric(self, name: str, **labels: str) -> float:
        return (await self.metrics()).get((name, frozenset(labels.items())), -1.0)


async def until(check: Any, what: str) -> None:
    for _ in range(800):
        if await check():
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"never: {what}")


def _settings(tmp_path: Path, server: dict[str, Any]) -> Any:
    """The service's settings: SQLite in `tmp_path`, a short lease, the one MCP `server`."""
    return gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"sqlite:///{tmp_path}/web.db",
        lease_seconds=6,
        renew_seconds=1,
        mcp_servers=(server,),
    )


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    marks = tmp_path / "marks"
    marks.mkdir()
    server = {
        "name": "demo",
        "command": sys.executable,
        "args": ["-m", "tests.support.mcp_servers", "--stdio", "--marks", str(marks)],
        "cwd": ROOT,
        "call_timeout_seconds": CALL_TIMEOUT_S,
        "max_output_chars": 1000,
        # no approval asked (the test server declares them destructive): faults are the point
        "overrides": {"delete": {"approval": False}, "crash": {"approval": False}},
    }
    settings = _settings(tmp_path, server)
    model = ScriptedModel(responder=respond)
    parts = ServiceParts(model_client=model, model=ModelRef(provider="scripted", model_id="mcp"))
    service = Service(settings, parts)
    await service.start()
    assert service.app is not None
    transport = httpx.ASGITransport(app=service.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        yield Rig(service, http, model, marks)
    await service.stop(drain_seconds=2)


async def test_a_crash_mid_call_is_read_by_the_model_and_counted_and_the_server_comes_back(
    rig: Rig,
) -> None:
    assert await rig.metric("gateway_mcp_server_up", server="demo") == 1
    assert await rig.ask("first", "/call echo hello") == "Done (ok): echo: hello"
    assert await rig.metric("gateway_mcp_calls_total", server="demo", outcome="ok") == 1

    answer = await rig.ask("crash", "/call crash")
    assert answer.startswith("Done (error): the connection to MCP server 'demo' was lost")
    crashed = rig.result_of("demo.crash")
    assert crashed.is_error and "may have had its effect" in message_text(crashed)
    assert await rig.metric("gateway_mcp_calls_total", server="demo", outcome="crashed") == 1

    async def back() -> bool:
        return await rig.metric("gateway_mcp_restarts_total", server="demo") == 1 and (
            await rig.metric("gateway_mcp_server_up", server="demo") == 1
        )

    await until(back, "the server restarted and up again")
    assert await rig.ask("after", "/call echo again") == "Done (ok): echo: again"
    assert await rig.metric("gateway_mcp_calls_total", server="demo", outcome="ok") == 2


async def test_a_hang_times_out_into_an_answer_while_another_lane_of_the_session_works(
    rig: Rig,
) -> None:
    await rig.post("stuck", "/call hang")

    async def hanging() -> bool:
        return rig.started("hang")

    await until(hanging, "the hang reached the server")
    # another thread of the same web space: another lane of the same session
    assert await rig.ask("free", "/call echo meanwhile") == "Done (ok): echo: meanwhile"
    assert await rig.ask("chat", "hello") == "You said: hello"
    assert not (rig.marks / "cancelled-hang").exists()  # the hang is still in progress
    assert (await rig.http.get("/web/threads/stuck")).json()["items"][-1]["kind"] == "message"

    [answer] = await rig.answers("stuck", 1)
    assert str(answer["text"]).startswith("Done (error): MCP server 'demo' did not answer 'hang'")
    hung = rig.result_of("demo.hang")
    assert hung.is_error and f"within {CALL_TIMEOUT_S:g} s" in message_text(hung)
    assert (rig.marks / "cancelled-hang").exists()  # the protocol's cancel reached it
    assert await rig.metric("gateway_mcp_calls_total", server="demo", outcome="timeout") == 1
    assert await rig.ask("stuck", "/call echo still") == "Done (ok): echo: still"


async def test_a_malformed_result_is_an_error_the_model_reads(rig: Rig) -> None:
    answer = await rig.ask("bad", "/call malformed")
    assert answer.startswith("Done (error):") and "malformed" in answer
    assert rig.result_of("demo.malformed").is_error
    assert await rig.metric("gateway_mcp_calls_total", server="demo", outcome="malformed") == 1
    assert await rig.ask("bad", "/call echo fine") == "Done (ok): echo: fine"


async def test_a_flood_is_cut_to_the_bound_with_a_note(rig: Rig) -> None:
    answer = await rig.ask("flood", "/call flood")
    assert answer.startswith("Done (ok): xxx")
    flood = message_text(rig.result_of("demo.flood"))
    assert len(flood) < 1200 and "characters not shown" in flood  # of 2,000,000
    assert await rig.ask("flood", "/call echo after") == "Done (ok): echo: after"


async def _relisted(rig: Rig) -> None:
    """Wait until the server's changed list (``change``: ``extra`` added) is offered."""
    assert rig.service.mcp is not None
    mcp = rig.service.mcp

    async def relisted() -> bool:
        return "demo.extra" in {tool.name for tool in mcp.tools()}

    await until(relisted, "the new list")


async def test_a_tool_removed_by_a_list_change_is_a_clear_error(rig: Rig) -> None:
    assert await rig.ask("change", "/call change") == "Done (ok): changed"
    await _relisted(rig)
    answer = await rig.ask("change", "/call delete")
    # a session taken since offers the new list (the harness knows no such tool); one still
    # held since before has the old tool object, which finds the tool gone at the call
    assert answer in (
        "Done (error): There is no tool named 'demo.delete'.",
        "Done (error): MCP server 'demo' does not offer 'delete' any more",
    )
    assert rig.result_of("demo.delete").is_error
    offered = {tool.name for tool in rig.model.requests[-1].tools}
    assert "demo.extra" in offered or "does not offer" in answer
    assert not rig.started("delete")  # never sent to the server


async def test_a_session_in_hand_is_offered_the_new_list_at_its_next_message(rig: Rig) -> None:
    """The session kept warm (or busy) kept the tools it was taken with: a tool the server
    added was unknown to it, and one it made destructive ran without approval, until the
    session went idle past its linger."""
    assert await rig.ask("same", "/call change") == "Done (ok): changed"
    await _relisted(rig)
    answer = await rig.ask("same", "/call extra")  # at once: the session is still in hand
    assert answer.startswith("Done (ok)"), answer
    assert rig.started("extra")


_UNTIL_FLAG = (
    "import os, runpy, sys; flag = sys.argv.pop(1)\n"
    "if not os.path.exists(flag): sys.exit(3)\n"
    "sys.argv[0] = 'mcp_servers'; runpy.run_module('tests.support.mcp_servers', "
    "run_name='__main__')"
)
"""A server that fails to start until a file exists (a dependency still coming up)."""


def _started(settings: Any) -> Service:
    """A service on `settings` with the scripted model (not started yet)."""
    model = ScriptedModel(responder=respond)
    parts = ServiceParts(model_client=model, model=ModelRef(provider="scripted", model_id="m"))
    return Service(settings, parts)


@contextlib.asynccontextmanager
async def _again(settings: Any) -> AsyncIterator[ServiceRig]:
    """The service started again on `settings` (the cut lane's session resumed at its take)."""
    service = _started(settings)
    await service.start()
    assert service.app is not None
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=service.app), base_url="http://localhost"
        ) as http:
            yield ServiceRig(service, http)
    finally:
        await service.stop(drain_seconds=2)


async def _cut_in_a_hang(
    settings: Any, marks: Path, then: Callable[[], None] = lambda: None
) -> None:
    """A service whose lane ``cut`` is stopped in a call of ``demo.hang``: its run left open.

    `then` runs once the call reached the server, before the stop.
    """
    first = _started(settings)
    await first.start()
    assert first.app is not None
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=first.app), base_url="http://localhost"
    ) as http:
        await ServiceRig(first, http).post("cut", "/call hang")
        for _ in range(400):
            if any(name.startswith("call-hang-") for name in os.listdir(marks)):
                break
            await asyncio.sleep(0.025)
        then()
        await first.stop(drain_seconds=0.1)


async def test_a_lane_cut_mid_call_resumes_once_its_server_comes_up(tmp_path: Path) -> None:
    """The lane, cut in a call of a server not up at the restart, had its resume refused
    (`MissingIdentities`, logged at info) and stayed suspended, its thread silent, until
    someone wrote in it or an operator resumed it."""
    marks = tmp_path / "marks"
    marks.mkdir()
    flag = tmp_path / "up"
    flag.write_text("")
    server = {
        "name": "demo",
        "command": sys.executable,
        "args": ["-c", _UNTIL_FLAG, str(flag), "--stdio", "--marks", str(marks)],
        "cwd": ROOT,
    }
    settings = _settings(tmp_path, server)
    await _cut_in_a_hang(settings, marks, then=flag.unlink)  # it will not come back at the start
    async with _again(settings) as rig:
        await asyncio.sleep(1.5)  # resumed once, refused: the tool is not offered
        flag.write_text("")  # the server comes up; nobody writes in the thread
        [answer] = [a for a in await rig.answers("cut", 1) if a["kind"] == "reply"]
        assert answer["text"].startswith("Done (error)"), answer


async def test_a_lane_cut_in_a_call_of_a_tool_gone_at_the_restart_is_answered(
    tmp_path: Path,
) -> None:
    """Killed mid-call, the gateway came back with the tool removed (a new server version, an
    override): the resume waited for the tool for ever, the thread was never answered, nor
    its next message (an outside probe). A tool its server, up, no longer offers is stood in
    for: the call is reported interrupted, and the lane goes on."""
    marks = tmp_path / "marks"
    marks.mkdir()
    server: dict[str, Any] = {
        "name": "demo",
        "command": sys.executable,
        "args": ["-m", "tests.support.mcp_servers", "--stdio", "--marks", str(marks)],
        "cwd": ROOT,
    }
    await _cut_in_a_hang(_settings(tmp_path, server), marks)
    removed = {**server, "overrides": {"hang": {"disabled": True}}}
    async with _again(_settings(tmp_path, removed)) as rig:
        [answer] = [a for a in await rig.answers("cut", 1) if a["kind"] == "reply"]
        assert answer["text"].startswith("Done (error)"), answer
        assert "interrupted" in answer["text"], answer
        await rig.post("cut", "and now?")
        later = await rig.answers("cut", 2)
        assert later[-1]["text"] == "You said: and now?", later
    hangs = [name for name in os.listdir(marks) if name.startswith("call-hang-")]
    assert len(hangs) == 1  # never run again


def _test_server(marks: Path) -> dict[str, Any]:
    """The test MCP server over stdio, marking the calls that reach it in `marks`."""
    marks.mkdir()
    return {
        "name": "demo",
        "command": sys.executable,
        "args": ["-m", "tests.support.mcp_servers", "--stdio", "--marks", str(marks)],
        "cwd": ROOT,
    }


async def _waiting_on_a_dropped_tool(rig: ServiceRig) -> dict[str, Any]:
    """Thread ``wait`` waits for approval of ``demo.delete``, which the server then drops.

    Returns the approval request's item.
    """
    await rig.post("wait", "/call delete")
    [asked] = await rig.answers("wait", 1)
    assert asked["kind"] == "approval_request", asked
    await rig.post("other", "/call change")  # drops `delete` and lists the change
    await rig.answers("other", 1)
    mcp = rig.service.mcp
    assert mcp is not None

    async def dropped() -> bool:
        return "demo.delete" not in {tool.name for tool in mcp.tools()}

    await until(dropped, "the list without delete")
    return asked


@pytest.mark.parametrize("approved", [False, True])
async def test_a_decision_on_a_tool_its_server_dropped_meanwhile_applies(
    tmp_path: Path, approved: bool
) -> None:
    """A call waited for approval; its server then dropped the tool (a list change). The Deny
    was taken (202), acked unapplied, and the thread told nothing: the lane waited for good,
    an operator's approve or deny refused as "missing_identities" (an outside probe). The
    decision now waits for the session's next take, which stands in for the tool (D396)."""
    marks = tmp_path / "marks"
    async with _again(_settings(tmp_path, _test_server(marks))) as rig:
        asked = await _waiting_on_a_dropped_tool(rig)
        body = decision_body(asked["approval"], approved=approved, key="k1")
        decided = await rig.http.post("/web/threads/wait/decisions", json=body)
        assert decided.status_code == 202, decided.text
        replies = [a for a in await rig.answers("wait", 2) if a["kind"] == "reply"]
        said = replies[-1]["text"]
        if approved:  # the stand-in ran: the model reads the tool is gone, nothing was sent
            assert said.startswith("Done (error): the tool 'demo.delete' is no longer offered")
        else:
            assert said.startswith("Done (error)") and "denied" in said.lower(), said
    assert not any(name.startswith("call-delete-") for name in os.listdir(marks))


async def test_an_operator_s_deny_on_a_tool_its_server_dropped_is_done_at_the_next_take(
    tmp_path: Path,
) -> None:
    """`ops deny` of such a wait was refused "missing_identities", as `ops approve` was: the
    lane could only be aborted. It is pending now, and done when the session is taken again
    with a stand-in for the tool (D396)."""
    marks = tmp_path / "marks"
    token = "operator-secret-abcdefghijklmnop"
    settings = _settings(tmp_path, _test_server(marks)).replace(
        ops_tokens=(f"alice:operator:{token}",)
    )
    async with _again(settings) as rig:
        asked = await _waiting_on_a_dropped_tool(rig)
        approval = asked["approval"]
        [call] = approval["calls"]
        body = {
            "wait_id": approval["wait_id"],
            "approvals": {call["tool_call_id"]: {"action": "deny", "reason": "not today"}},
        }
        headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": "deny-1"}
        path = f"/api/v1/lanes/{lane_id(approval['session'], 'web:wait')}/decisions"
        first = await rig.http.post(path, json=body, headers=headers, params={"wait": 30})
        assert first.status_code == 200, first.text  # pending, then done at the next take
        assert first.json()["status"] == "done"
        replies = [a for a in await rig.answers("wait", 2) if a["kind"] == "reply"]
        assert "not today" in replies[-1]["text"], replies
    assert not any(name.startswith("call-delete-") for name in os.listdir(marks))
