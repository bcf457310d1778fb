"""An MCP tool's crash and approval declarations, from its annotations and the operator's word.

The table (D199): a server's hints as the MCP specification defines them (``readOnlyHint``
false, ``destructiveHint`` true, ``idempotentHint`` false when absent; the last two mean
something only when the tool is not read-only) give the *declared* pair:

====================  =================  ==================  ==========  ================
readOnlyHint          idempotentHint     destructiveHint     replay      requires_approval
====================  =================  ==================  ==========  ================
true                  (any)              (any)               safe        no
false / absent        true               false               safe        no
false / absent        true               true / absent       safe        yes
false / absent        false / absent     false               never       no
false / absent        false / absent     true / absent       never       yes
====================  =================  ==================  ==========  ================

A ``trusted`` server's tools get the declared pair. An untrusted server's hints may only make
the agent more careful than a tool that declares nothing (the harness's defaults: replay
``never``, no approval): a hint that asks for approval is taken, a hint that would allow a
replay is not, so an untrusted tool is ``never`` replayed and requires approval exactly when
the declared pair does. ``openWorldHint`` and ``title`` change nothing. A per-tool override's
``replay`` and ``approval`` replace the result whatever the server or its trust.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcp_types import ToolAnnotations

from gateway.mcp.settings import McpToolOverride
from harness_core.tools import Replay

__all__ = ["Declarations", "declarations", "declared"]


@dataclass(frozen=True, slots=True)
class Declarations:
    """What the harness is told about a tool: whether a cut call may run again, and approval."""

    replay: Replay
    requires_approval: bool


def declared(annotations: ToolAnnotations | None) -> Declarations:
    """The pair the hints declare, read with the specification's defaults (the table above)."""
    hints = annotations or ToolAnnotations()
    if hints.read_only_hint is True:
        return Declarations(replay="safe", requires_approval=False)
    replay: Replay = "safe" if hints.idempotent_hint is True else "never"
    destructive = hints.destructive_hint is not False  # true unless said otherwise
    return Declarations(replay=replay, requires_approval=destructive)


def declarations(
    annotations: ToolAnnotations | None,
    *,
    trusted: bool,
    override: McpToolOverride | None = None,
) -> Declarations:
    """The tool's declarations: the hints as far as trust takes them, then the override."""
    said = declared(annotations)
    if not trusted:
        # never less careful than a tool that declares nothing: no replay the server grants
        said = Declarations(replay="never", requires_approval=said.requires_approval)
    if override is None:
        return said
    return Declarations(
        replay=override.replay if override.replay is not None else said.replay,
        requires_approval=(
            override.approval if override.approval is not None else said.requires_approval
        ),
    )
