"""What the operator sees of one configured MCP server: its state, tools and recent faults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["McpServerHealth", "ServerState"]

ServerState = Literal["starting", "ready", "restarting", "failed", "stopped"]
"""``starting``: connecting for the first time; ``ready``: connected, its tools listed;
``restarting``: it failed and is tried again after a backoff; ``failed``: it gave up
(a configuration that cannot work, like a command that does not exist); ``stopped``: closed."""


@dataclass(frozen=True, kw_only=True, slots=True)
class McpServerHealth:
    """One server's health, as `gateway ops mcp`, ``GET /api/v1/mcp`` and the /ops page show it.

    Never carries a secret: no environment values, headers or tokens, and `last_error` and
    `stderr` are passed through the service's redactor before they are kept.
    """

    name: str
    transport: Literal["stdio", "http"]
    target: str
    """What it runs or reaches: the command's program name, or the URL without credentials."""
    state: ServerState
    trusted: bool
    tools: tuple[str, ...]
    """The namespaced tools it offers now (``<server>.<tool>``), after the exposure filter."""
    restarts: int = 0
    calls: int = 0
    failures: int = 0
    """Calls that ended in a transport fault, a timeout or a malformed result (not `isError`)."""
    last_error: str | None = None
    stderr: str | None = None
    """The last lines a stdio server wrote to its stderr before it last went down (redacted;
    for the operator, never the model: `gateway.mcp.stderr`)."""
    since_ms: int | None = None
    """When it entered `state` (ms since the epoch)."""
    retry_at_ms: int | None = None
    """When `restarting`: when the next attempt starts."""
