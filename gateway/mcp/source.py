"""Every configured MCP server as one tool source: `McpTools` (the service's ``mcp``).

Each server's exposed tools become harness `Tool` objects named ``<server>.<tool>``, their
input schema handed on as the server gave it, their replay and approval from
`gateway.mcp.policy`. A tool object resolves its server and tool by name when it is called,
so a tool the server dropped since (``notifications/tools/list_changed``) gives a clear error
result, never a stale call. A server that fails to start is contained: its tools are absent,
its health says why, the others and the service carry on.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Iterable
from typing import Any

import mcp_types as types

from gateway.logs import event
from gateway.mcp.connection import PING_EVERY_S, Backoff, CallObserver, McpConnection, Sleep
from gateway.mcp.health import McpServerHealth
from gateway.mcp.policy import declarations
from gateway.mcp.settings import McpServer
from gateway.redact import MIN_SECRET_CHARS
from harness_core.clock import Clock
from harness_core.models.tool_names import wire_name
from harness_core.tools import Tool, ToolContext, ToolOutput

__all__ = ["MANY_TOOLS", "McpTools", "beside"]

log = logging.getLogger("gateway.mcp")

_MARGIN_S = 15.0
"""The harness's own timeout sits this far past the server's call timeout: a backstop only."""


class McpTools:
    """The MCP servers of a deployment: their tools, health and lifecycle."""

    def __init__(
        self,
        servers: Iterable[McpServer],
        *,
        clock: Clock,
        redact: Callable[[str], str] = lambda text: text,
        observer: CallObserver | None = None,
        backoff: Backoff | None = None,
        sleep: Sleep = asyncio.sleep,
        ping_every_s: float = PING_EVERY_S,
    ) -> None:
        self._connections = {
            server.name: McpConnection(
                server,
                clock=clock,
                redact=redact,
                observer=observer,
                backoff=backoff or Backoff(),
                sleep=sleep,
                ping_every_s=ping_every_s,
            )
            for server in servers
        }
        self._redact = redact
        self._unnamed: set[tuple[str, str]] = set()
        """The tools left out for their names (each said once)."""
        self._tools: tuple[Tool, ...] = ()
        self.version = 0
        """One more at every change of the tools offered: a session built with fewer or older
        ones is taken again with these (`gateway.worker.Worker`'s ``tools_version``)."""
        for connection in self._connections.values():
            connection.on_change = self._rebuild

    def connection(self, server: str) -> McpConnection:
        """One server's connection (for tests and the operator's view)."""
        return self._connections[server]

    async def start(self) -> None:
        """Start every server at once; returns when each is up or has failed its first try."""
        names = frozenset(name.casefold() for name in self._connections)
        for connection in self._connections.values():
            for name in connection.server.word_valued(MIN_SECRET_CHARS, names):
                # the value is a secret: the line names where it is set, never what it is
                log.warning(
                    event(
                        "mcp.word_kept_secret",
                        server=connection.name,
                        setting=name,
                        note="this value reads like a word, and it is shown as [redacted] "
                        "wherever it appears, in answers too: if it is no secret, name it "
                        "in the server's not_secret",
                    )
                )
        await asyncio.gather(*(c.start() for c in self._connections.values()))
        self._rebuild()

    async def close(self, within: float | None = None) -> None:
        """Cancel calls in flight and stop every server, within `within` seconds when given."""
        await asyncio.gather(*(c.close(within) for c in self._connections.values()))
        self._rebuild()

    def health(self) -> tuple[McpServerHealth, ...]:
        """Each configured server's health, in configuration order."""
        return tuple(c.health() for c in self._connections.values())

    def tools(self) -> tuple[Tool, ...]:
        """The tools offered now, namespaced ``<server>.<tool>`` (servers in config order)."""
        return self._tools

    def gone(self, tool_name: str) -> bool:
        """Whether `tool_name` will not be offered again by itself (a lane would wait for ever).

        Its server is up and offers no such tool (renamed, removed, filtered out, or left out
        for its name), or no configured server has its prefix. A server not up yet (starting,
        restarting, failed) may still bring it: not gone.
        """
        server, dot, _ = tool_name.partition(".")
        connection = self._connections.get(server) if dot else None
        if connection is None:
            return True
        return connection.state == "ready" and all(t.name != tool_name for t in self._tools)

    def approvers_for(self, tool_name: str) -> frozenset[str] | None:
        """The approvers a per-tool override names for `tool_name`, or None when it sets none."""
        server, dot, tool = tool_name.partition(".")
        connection = self._connections.get(server)
        if not dot or connection is None:
            return None
        override = connection.server.overrides.get(tool)
        if override is None or override.approvers is None:
            return None
        return frozenset(override.approvers)

    def _rebuild(self) -> None:
        self.version += 1
        self._tools = tuple(
            _harness_tool(connection, mcp_tool, self._redact)
            for connection in self._connections.values()
            for mcp_tool in connection.tools().values()
            if self._named(connection.name, mcp_tool.name)
        )

    def _named(self, server: str, name: str) -> bool:
        """Whether a server's tool name is one (else it is left out, and said once).

        A name is what the model calls and what an approval request shows: one with a newline
        wrote a line of its own into the request ("Approved by ops-lead: yes", an outside
        probe), an empty one was offered as ``server.``.
        """
        named = _TOOL_NAME.fullmatch(name) is not None
        secret = named and self._redact(name) != name  # sent to the model, stored in each run
        if named and not secret:
            return True
        if (server, name) not in self._unnamed:
            self._unnamed.add((server, name))
            log.warning(
                event(
                    "mcp.tool_left_out",
                    server=server,
                    tool=self._redact(ascii(name[:80])),
                    why="its name holds a configured secret"
                    if secret
                    else "a tool name is 1-128 of A-Z a-z 0-9 _ - . (the MCP specification's)",
                )
            )
        return False


def beside(own: tuple[Tool, ...], offered: tuple[Tool, ...], warned: set[str]) -> tuple[Tool, ...]:
    """The plugin's tools `own`, then the MCP tools `offered` whose names none before has.

    A name taken is said once (`warned` keeps which): the plugin's tool is kept, with its
    declarations (an approval it asks for is not lost to a server's tool of the same name),
    and the model is never sent one name twice (providers refuse such a request). So is a
    name the model would read as one before it: a name providers refuse is sent hashed
    (`wire_name`), and a server can list two long names whose short hashes match; the request
    would be refused for every thread, so the later is not offered (D350).
    """
    taken = {tool.name for tool in own}
    wires = {wire_name(tool.name): tool.name for tool in own}
    kept = []
    for tool in offered:
        wire = wire_name(tool.name)
        if tool.name not in taken and wire not in wires:
            kept.append(tool)
            taken.add(tool.name)
            wires[wire] = tool.name
        elif tool.name not in warned:
            warned.add(tool.name)
            twin = wires.get(wire) if tool.name not in taken else None
            log.warning(
                event(
                    "mcp.tool_name_taken",
                    tool=tool.name,
                    note="the plugin has a tool of this name: the plugin's is offered, the "
                    "MCP server's is not"
                    if twin is None
                    else f"the model would read it as {twin!r} (both are sent as {wire!r}): "
                    "that one is offered, this one is not",
                )
            )
    offered_now = own + tuple(kept)
    if len(offered_now) > MANY_TOOLS and _MANY not in warned:
        warned.add(_MANY)
        log.warning(
            event(
                "mcp.too_many_tools",
                tools=len(offered_now),
                servers=sorted({t.name.partition(".")[0] for t in kept}),
                note=f"every model request lists every tool offered; OpenAI refuses more than "
                f"{MANY_TOOLS}, and each tool's schema costs tokens in every request: offer "
                "fewer (a profile's tools, a server's own tool filter, fewer servers)",
            )
        )
    return offered_now


MANY_TOOLS = 128
"""More tools than OpenAI takes in one request (said once at the list that passes it)."""
_MANY = "#too-many"
"""The `warned` key of that warning (an MCP tool's name always has its server's prefix)."""


_TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
"""A tool name as the MCP specification gives it (SEP-986)."""


def _harness_tool(
    connection: McpConnection, mcp_tool: types.Tool, redact: Callable[[str], str]
) -> Tool:
    """The harness's tool for a server's, its description and schema redacted.

    The model, and the store through its answers, would hold a secret a server put there (a
    DSN in a description).
    """
    server = connection.server
    said = declarations(
        mcp_tool.annotations, trusted=server.trusted, override=server.overrides.get(mcp_tool.name)
    )
    own = mcp_tool.name

    async def execute(args: Any, ctx: ToolContext) -> ToolOutput:
        arguments = args if isinstance(args, dict) else {}
        return await connection.call(own, arguments, key=ctx.idempotency_key, abort=ctx.abort)

    return Tool(
        name=f"{server.name}.{own}",
        description=redact(mcp_tool.description or mcp_tool.title or own),
        execute=execute,
        parameters=_redacted(mcp_tool.input_schema, redact),
        replay=said.replay,
        requires_approval=said.requires_approval,
        timeout_seconds=server.call_timeout_seconds + _MARGIN_S,
    )


def _redacted(value: Any, redact: Callable[[str], str]) -> Any:
    """`value` (JSON) with every string in it, keys included, passed through `redact`."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(str(k)): _redacted(v, redact) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v, redact) for v in value]
    return value
