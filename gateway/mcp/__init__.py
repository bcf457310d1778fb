"""MCP servers as tool sources: their tools, with crash and approval policy from annotations."""

from gateway.mcp.health import McpServerHealth, ServerState

__all__ = ["McpServerHealth", "ServerState"]
