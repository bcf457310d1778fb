"""The operator API's MCP read: the configured MCP servers and their health (``/mcp``)."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import Request

from gateway.mcp.health import McpServerHealth
from gateway.ops.api.context import OpsContext
from gateway.ops.views import McpServerView, McpView

__all__ = ["McpHealth", "McpReads", "no_servers"]

McpHealth = Callable[[], tuple[McpServerHealth, ...]]
"""What the service's MCP tool source says of its servers now (D210)."""


def no_servers() -> tuple[McpServerHealth, ...]:
    """The health of a gateway without MCP servers: nothing to show."""
    return ()


class McpReads:
    """``/mcp``: each configured MCP server, its state, tools, restarts, calls and last fault."""

    def __init__(self, ops: OpsContext, health: McpHealth) -> None:
        self.ops = ops
        self.health = health

    async def servers(self, request: Request) -> McpView:
        """The configured MCP servers (in configuration order) and their health now."""
        self.ops.who(request, "viewer")
        return McpView(servers=[_server(h) for h in self.health()])


def _server(health: McpServerHealth) -> McpServerView:
    return McpServerView(
        name=health.name,
        transport=health.transport,
        target=health.target,
        state=health.state,
        trusted=health.trusted,
        tools=list(health.tools),
        restarts=health.restarts,
        calls=health.calls,
        failures=health.failures,
        last_error=health.last_error,
        stderr=health.stderr,
        since_ms=health.since_ms,
        retry_at_ms=health.retry_at_ms,
    )
