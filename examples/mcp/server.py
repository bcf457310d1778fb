"""An example MCP server, written with the official SDK: a small ticket desk with four tools.

Each tool's annotations say what kind of effect it has, and the gateway takes its crash and
approval policy from them (docs/mcp.md has the table):

* ``find_tickets`` reads only (``readOnlyHint``): safe to run again after a crash, no approval;
* ``create_ticket`` adds a ticket each time it runs (not idempotent, not destructive): never run
  again after a crash; a call cut by one is reported to the agent as "may have happened";
* ``set_priority`` sets a field (idempotent, not destructive): run again after a crash;
* ``delete_ticket`` deletes (destructive, idempotent): waits for a person to approve it.

Run it over stdio (how the gateway starts it: ``python examples/mcp/server.py``) or over
Streamable HTTP (``python examples/mcp/server.py --http 8931``, endpoint ``/mcp``). The tickets
live in ``TICKETS_FILE`` (default ``tickets.json`` in the current directory). With
``TICKETS_LEDGER`` set, every call that changes something appends one JSON line there (the tool,
its arguments and the idempotency key the gateway sent), so a test can count what happened; with
``TICKETS_SLOW_SECONDS`` set, a changing call waits that long after its change is made (a slow
backend: time to kill the gateway in the middle of a call).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

IDEMPOTENCY_META = "durable-gateway/idempotency-key"
"""Where the gateway puts a call's idempotency key in the request's ``_meta``."""

server = MCPServer("tickets")


def _path() -> Path:
    return Path(os.environ.get("TICKETS_FILE", "tickets.json"))


def _load() -> dict[str, Any]:
    try:
        loaded: dict[str, Any] = json.loads(_path().read_text())
    except FileNotFoundError:
        return {"next": 1, "tickets": {}}
    return loaded


def _save(desk: dict[str, Any]) -> None:
    path = _path()
    path.parent.mkdir(parents=True, exist_ok=True)  # `.gateway/` before the gateway made it
    spare = path.with_name(path.name + ".new")
    spare.write_text(json.dumps(desk, indent=2))
    spare.replace(path)  # a reader never sees half a file


def _append(path: Path, line: str) -> None:
    with path.open("a") as out:  # one short line: the write is atomic for a reader
        out.write(line + "\n")


async def _changed(tool: str, args: dict[str, Any], ctx: Context) -> None:
    """Note a change in the ledger (for tests), then take as long as a slow backend would."""
    ledger = os.environ.get("TICKETS_LEDGER")
    if ledger:
        meta = ctx.request_context.meta or {}
        key = meta.get(IDEMPOTENCY_META) if isinstance(meta, dict) else None
        line = json.dumps({"tool": tool, "args": args, "key": key, "pid": os.getpid()})
        _append(Path(ledger), line)
    slow = float(os.environ.get("TICKETS_SLOW_SECONDS", "0") or 0)
    if slow > 0:
        await asyncio.sleep(slow)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def find_tickets(query: str = "") -> str:
    """List the open tickets whose title contains `query` (all of them when it is empty)."""
    tickets = _load()["tickets"]
    found = [
        f"#{number} [{ticket['priority']}] {ticket['title']}"
        for number, ticket in tickets.items()
        if query.lower() in ticket["title"].lower()
    ]
    return "\n".join(found) or "No tickets match."


@server.tool(
    annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False)
)
async def create_ticket(title: str, ctx: Context) -> str:
    """Open a new ticket with this title; returns its number."""
    desk = _load()
    number = str(desk["next"])
    desk["next"] += 1
    desk["tickets"][number] = {"title": title, "priority": "normal"}
    _save(desk)
    await _changed("create_ticket", {"title": title}, ctx)
    return f"Created ticket #{number}: {title}"


@server.tool(
    annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True)
)
async def set_priority(number: int, priority: str, ctx: Context) -> str:
    """Set a ticket's priority (low, normal, high); setting it twice changes nothing more."""
    desk = _load()
    ticket = desk["tickets"].get(str(number))
    if ticket is None:
        raise ToolError(f"There is no ticket #{number}.")
    ticket["priority"] = priority
    _save(desk)
    await _changed("set_priority", {"number": number, "priority": priority}, ctx)
    return f"Ticket #{number} is now {priority} priority."


@server.tool(
    annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True)
)
async def delete_ticket(number: int, ctx: Context) -> str:
    """Delete a ticket for good; deleting one that is gone already changes nothing."""
    desk = _load()
    gone = desk["tickets"].pop(str(number), None)
    _save(desk)
    await _changed("delete_ticket", {"number": number}, ctx)
    if gone is None:
        return f"Ticket #{number} was already deleted."
    return f"Deleted ticket #{number}: {gone['title']}"


def main() -> None:
    """Serve over stdio, or over Streamable HTTP with ``--http PORT``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", type=int, metavar="PORT", help="serve Streamable HTTP on PORT")
    args = parser.parse_args()
    if args.http is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.http)


if __name__ == "__main__":
    main()
