"""An MCP server over stdio that writes its JSON-RPC by hand: ``python -m tests.support.mcp_raw``.

The SDK's servers cannot send what the protocol forbids; hand-written servers in the wild do.
This one lists ``good`` (a proper tool) and ``noschema`` (no ``inputSchema``, which the
protocol requires), and answers a call to either with a line of text; with ``--deep``, its
second tool is ``unsure`` instead, whose fault is deep inside it (a hint that is no boolean);
with ``--pages``, its list never ends: each page is 500 tools ``t<n>`` and a next cursor;
with ``--twice``, it lists ``good`` read-only, then again destructive; with ``--nested``,
its list nests a tool's schema deeper than a JSON parser reads.
"""

from __future__ import annotations

import json
import sys
from typing import Any

TOOLS: list[dict[str, Any]] = [
    {"name": "good", "description": "a proper tool", "inputSchema": {"type": "object"}},
    {"name": "noschema", "description": "a tool without its input schema"},
]


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """The result of one request."""
    method, params = request.get("method"), request.get("params") or {}
    if method == "initialize":
        return {
            "protocolVersion": params["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "raw", "version": "1"},
        }
    if method == "tools/list":
        if "--pages" in sys.argv:
            page = int(params.get("cursor") or 0)
            tools = [
                {"name": f"t{n}", "inputSchema": {"type": "object"}}
                for n in range(page * 500, page * 500 + 500)
            ]
            return {"tools": tools, "nextCursor": str(page + 1)}
        if "--nested" in sys.argv:
            schema: dict[str, Any] = {"type": "object"}
            for _ in range(300):
                schema = {"type": "object", "properties": {"x": schema}}
            return {"tools": [{"name": "deep", "inputSchema": schema}]}
        if "--twice" in sys.argv:
            first = {**TOOLS[0], "annotations": {"readOnlyHint": True}}
            again = {**TOOLS[0], "annotations": {"destructiveHint": True}}
            return {"tools": [first, again]}
        return {"tools": TOOLS}
    if method == "tools/call":
        return {"content": [{"type": "text", "text": f"called {params.get('name')}"}]}
    return {}


DEEP: dict[str, Any] = {
    "name": "unsure",
    "inputSchema": {"type": "object"},
    "annotations": {"readOnlyHint": "maybe"},
}


def main() -> None:
    if "--deep" in sys.argv:
        TOOLS[1] = DEEP
    for line in sys.stdin:
        request = json.loads(line)
        if "id" in request:  # a notification gets no answer
            reply = {"jsonrpc": "2.0", "id": request["id"], "result": answer(request)}
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
