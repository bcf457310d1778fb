"""Small pieces the gateway's tests share: a served web channel, its threads, lanes and waits."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from adapters.web import WebChannel, open_mailbox
from adapters.web.settings import web_mailbox_url
from config import Settings
from gateway.service import Service, ServiceParts
from harness_core import AgentLane, Ok, SessionRepo, Tool, UserMessage, message_text
from harness_core.models.scripted import text, tool_call
from harness_core.session.entries import MessageEntry
from tests.support.harness_kit import Kit, make_kit


@contextlib.asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """A whole `Service` with the real web channel, and an HTTP client for it (ASGI)."""
    web = WebChannel(open_mailbox(web_mailbox_url(settings)))
    service = Service(settings, ServiceParts(adapters=[web]))
    await service.start()
    assert service.app is not None
    transport = httpx.ASGITransport(app=service.app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            yield http
    finally:
        await service.stop(drain_seconds=2)


async def thread_items(
    http: httpx.AsyncClient, thread: str, kinds: Sequence[str], count: int
) -> list[dict[str, Any]]:
    """Wait until the web thread holds `count` items of `kinds`; return them, in order."""
    deadline = asyncio.get_running_loop().time() + 15
    while True:
        items = (await http.get(f"/web/threads/{thread}")).json()["items"]
        found = [item for item in items if item["kind"] in kinds]
        if len(found) >= count:
            return found
        assert asyncio.get_running_loop().time() < deadline, items
        await asyncio.sleep(0.02)


async def _deploy(args: Any, ctx: Any) -> str:
    return "deployed"


async def waiting_for_approval(tmp_path: Path, lane_name: str) -> tuple[Kit, AgentLane, str]:
    """A harness (SQLite) whose lane's run waits for approval of ``deploy``: (kit, lane, wait)."""
    tools = [Tool(name="deploy", description="d", execute=_deploy, requires_approval=True)]
    kit = await make_kit("sqlite", tmp_path, [tool_call("deploy", {}), text("done")], tools)
    created = await kit.harness.create_lane(lane_name, None)
    assert isinstance(created, Ok)
    lane = created.value
    prompted = await lane.prompt("deploy please")
    assert isinstance(prompted, Ok) and prompted.value.kind == "suspended"
    assert prompted.value.wait_id is not None
    return kit, lane, prompted.value.wait_id


async def lane_texts(
    repo: SessionRepo,
    session: str,
    lane: str,
    kind: type[Any] = UserMessage,
) -> list[str]:
    """The texts of the lane's messages of `kind` (user messages by default), without a lease."""
    storage = await repo.open(session)
    try:
        return [
            message_text(stored.entry.message)
            for stored in await storage.read_lane_entries(lane, after=None)
            if isinstance(stored.entry, MessageEntry) and isinstance(stored.entry.message, kind)
        ]
    finally:
        await storage.close()


def decision_body(approval: dict[str, Any], *, approved: bool, key: str) -> dict[str, Any]:
    """A web channel decision deciding every call of an `approval_request` item alike."""
    return {
        "run_id": approval["run_id"],
        "wait_id": approval["wait_id"],
        "decisions": [
            {
                "tool_call_id": call["tool_call_id"],
                "args_digest": call["args_digest"],
                "approved": approved,
            }
            for call in approval["calls"]
        ],
        "idempotency_key": key,
    }
