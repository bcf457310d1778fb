"""The MCP servers in the operator tools: ``GET /api/v1/mcp`` and ``gateway ops mcp`` (D210).

A whole `Service` runs in the test's process; what its MCP tool source would say is injected
through the service's seam (`Service.mcp_health`), which the route reads at each request. The
API is reached over ASGI; the command runs in-process against the service behind a real HTTP
server (uvicorn on a free port), in a thread so the service keeps serving.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.channels import gateway_settings
from gateway.mcp.health import McpServerHealth
from gateway.ops.cli import main
from gateway.service import Service
from tests.adapters.kit import serve

AGENT = "tests.support.gateway_agent"
OPERATOR = "mcp-operator-secret-0123456789ab"
VIEWER = "mcp-viewer-secret-0123456789abcd"
AS_VIEWER = {"Authorization": f"Bearer {VIEWER}"}
AT_MS = 1_767_225_600_000  # 2026-01-01 00:00:00 UTC

TICKETS = McpServerHealth(
    name="tickets",
    transport="stdio",
    target="tickets-server",
    state="ready",
    trusted=False,
    tools=("tickets.create", "tickets.list", "tickets.close"),
    calls=12,
    failures=1,
    last_error="tickets.create: no answer in 30 s",
    since_ms=AT_MS,
)
DEPLOYS = McpServerHealth(
    name="deploys",
    transport="http",
    target="https://deploys.example/mcp",
    state="restarting",
    trusted=True,
    tools=(),
    restarts=3,
    calls=4,
    failures=4,
    last_error=f"connection refused (token {OPERATOR})",  # a secret a fault might quote
    since_ms=AT_MS,
    retry_at_ms=AT_MS + 90_000,
)

BROKEN = McpServerHealth(
    name="crm",
    transport="stdio",
    target="python",
    state="restarting",
    trusted=False,
    tools=(),
    restarts=5,
    last_error="the connection closed (the server exited or closed its output)",
    stderr="ModuleNotFoundError: No module named 'crm_mcp'",
    since_ms=AT_MS,
    retry_at_ms=AT_MS + 60_000,
)


@dataclass
class Rig:
    service: Service
    http: httpx.AsyncClient
    servers: list[McpServerHealth]


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    settings = gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"sqlite:///{tmp_path}/web.db",
        plugin=AGENT,
        ops_tokens=(f"alice:operator:{OPERATOR}", f"bob:viewer:{VIEWER}"),
    )
    service = Service(settings)
    await service.start()
    servers: list[McpServerHealth] = []
    service.mcp_health = lambda: tuple(servers)  # set after start: read at each request
    assert service.app is not None
    transport = httpx.ASGITransport(app=service.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        yield Rig(service, http, servers)
    await service.stop(drain_seconds=1)


async def test_the_route_needs_a_token(rig: Rig) -> None:
    rig.servers.append(TICKETS)
    for headers in ({}, {"Authorization": "Bearer not-a-token"}):
        refused = await rig.http.get("/api/v1/mcp", headers=headers)
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "unauthenticated"
        assert "tickets" not in refused.text


async def test_a_viewer_reads_each_server_as_the_service_says_now(rig: Rig) -> None:
    empty = await rig.http.get("/api/v1/mcp", headers=AS_VIEWER)
    assert empty.status_code == 200 and empty.json() == {"servers": []}

    rig.servers.extend([TICKETS, DEPLOYS])
    answer = await rig.http.get("/api/v1/mcp", headers=AS_VIEWER)
    assert answer.status_code == 200
    tickets, deploys = answer.json()["servers"]
    assert tickets == {
        "name": "tickets",
        "transport": "stdio",
        "target": "tickets-server",
        "state": "ready",
        "trusted": False,
        "tools": ["tickets.create", "tickets.list", "tickets.close"],
        "restarts": 0,
        "calls": 12,
        "failures": 1,
        "last_error": "tickets.create: no answer in 30 s",
        "stderr": None,
        "since_ms": AT_MS,
        "retry_at_ms": None,
    }
    assert (deploys["state"], deploys["trusted"], deploys["restarts"]) == ("restarting", True, 3)
    assert deploys["retry_at_ms"] == AT_MS + 90_000
    assert OPERATOR not in answer.text  # the service's redactor cleans every answer
    assert deploys["last_error"].startswith("connection refused")

    schema = (await rig.http.get("/api/v1/openapi.json")).json()
    assert "/api/v1/mcp" in schema["paths"]  # documented with the rest of the API


@dataclass
class Ran:
    code: int
    out: str
    err: str


async def ops(url: str, capsys: pytest.CaptureFixture[str], *words: str) -> Ran:
    # in a thread: the command's client is synchronous, and the service answers on this loop
    code = await asyncio.to_thread(main, ["--url", url, "--token", VIEWER, *words], None)
    out, err = capsys.readouterr()
    return Ran(code, out, err)


async def test_gateway_ops_mcp_prints_a_table_json_and_tools(
    rig: Rig, capsys: pytest.CaptureFixture[str]
) -> None:
    assert rig.service.app is not None
    async with serve(rig.service.app) as server:
        none = await ops(server.url, capsys, "mcp")
        assert none.code == 0 and none.out == ""
        assert none.err == "no MCP servers configured\n"

        rig.servers.extend([TICKETS, DEPLOYS])
        table = await ops(server.url, capsys, "mcp")
        assert table.code == 0, table.err
        header, first, second = table.out.splitlines()
        assert header.split() == [
            "NAME",
            "TRANSPORT",
            "TARGET",
            "STATE",
            "TRUSTED",
            "TOOLS",
            "RESTARTS",
            "CALLS/FAILURES",
            "LAST",
            "ERROR",
        ]
        assert first.split()[:8] == [
            "tickets",
            "stdio",
            "tickets-server",
            "ready",
            "no",
            "3",
            "0",
            "12/1",
        ]
        assert first.endswith("tickets.create: no answer in 30 s")
        assert second.split()[:5] == [
            "deploys",
            "http",
            "https://deploys.example/mcp",
            "restarting",
            "(next",
        ]
        assert "restarting (next 00:01:30)" in second
        assert second.split()[6:10] == ["yes", "0", "3", "4/4"]
        assert OPERATOR not in table.out

        as_json = await ops(server.url, capsys, "mcp", "--json")
        assert as_json.code == 0
        data: dict[str, Any] = json.loads(as_json.out)
        assert [s["name"] for s in data["servers"]] == ["tickets", "deploys"]
        assert data["servers"][0]["tools"] == ["tickets.create", "tickets.list", "tickets.close"]

        tools = await ops(server.url, capsys, "mcp", "--tools")
        assert tools.out.splitlines()[-2:] == [
            "tickets: tickets.create, tickets.list, tickets.close",
            "deploys: (none)",
        ]

        # what a server printed as it stopped is said under the table (often the only "why")
        rig.servers.append(BROKEN)
        broken = await ops(server.url, capsys, "mcp")
        assert broken.out.splitlines()[-1] == (
            "crm's stderr ended with: ModuleNotFoundError: No module named 'crm_mcp'"
        )
        assert "ended with" not in "".join(broken.out.splitlines()[:-1])  # not for a ready one

        refused = await asyncio.to_thread(
            main, ["--url", server.url, "--token", "wrong-token", "mcp"], None
        )
        out, err = capsys.readouterr()
        assert refused == 1 and out == "" and err.count("\n") == 1 and "Traceback" not in err
