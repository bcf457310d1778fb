"""Tree entries: the conversation, shared by every lane of a session and never changed once written.

An entry model holds what its writer decides: the provisioned `id` and the payload. What the
storage decides at append (`seq`, `timestamp`, `parent_id` = the appending lane's leaf) lives in
the `StoredEntry` envelope the storage returns, so a caller can never pass a stale parent.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self, TypeAlias

from pydantic import Field, StringConstraints, model_validator

from harness_core.frozen import Frozen, FrozenJson
from harness_core.messages import AgentMessage, TokenUsage, ToolResultMessage

__all__ = [
    "ActiveToolsChangeEntry",
    "BranchSummaryEntry",
    "CompactionEntry",
    "CustomEntry",
    "Entry",
    "EntryType",
    "Id",
    "MessageEntry",
    "ModelChangeEntry",
    "ThinkingLevelChangeEntry",
]

Id: TypeAlias = Annotated[
    str, StringConstraints(min_length=1, max_length=256, pattern=r"^[^\s\x00-\x1f\x7f]+$")
]
"""An entry, record or session-scoped id: 1-256 characters, no whitespace or control characters."""

EntryType = Literal[
    "message",
    "model_change",
    "thinking_level_change",
    "active_tools_change",
    "compaction",
    "branch_summary",
    "custom",
]


class _EntryBase(Frozen):
    id: Id
    """Provisioned by the session's id generator before the entry is written."""


class MessageEntry(_EntryBase):
    """A conversation message."""

    type: Literal["message"] = "message"
    message: AgentMessage
    terminate: bool = False
    """The finalized batch-control decision of a tool result; never model context."""

    @model_validator(mode="after")
    def _terminate_only_on_tool_results(self) -> Self:
        if self.terminate and not isinstance(self.message, ToolResultMessage):
            raise ValueError("terminate is only persisted on tool-result entries")
        return self


class ModelChangeEntry(_EntryBase):
    """The lane's model from here on."""

    type: Literal["model_change"] = "model_change"
    provider: str
    model_id: str


class ThinkingLevelChangeEntry(_EntryBase):
    """The lane's thinking level from here on."""

    type: Literal["thinking_level_change"] = "thinking_level_change"
    thinking_level: str


class ActiveToolsChangeEntry(_EntryBase):
    """The lane's active tool names from here on."""

    type: Literal["active_tools_change"] = "active_tools_change"
    active_tool_names: tuple[str, ...]


class CompactionEntry(_EntryBase):
    """A self-contained checkpoint: context builds never read past it."""

    type: Literal["compaction"] = "compaction"
    summary: str
    retained_tail: tuple[AgentMessage, ...]
    """Messages kept verbatim after the summary; always present, empty when none."""
    tokens_before: int
    details: FrozenJson = None
    usage: TokenUsage | None = None


class BranchSummaryEntry(_EntryBase):
    """A summary of a branch the lane navigated away from."""

    type: Literal["branch_summary"] = "branch_summary"
    from_id: Id
    summary: str
    details: FrozenJson = None
    usage: TokenUsage | None = None


class CustomEntry(_EntryBase):
    """Application or extension data; it reaches model context only through a projector."""

    type: Literal["custom"] = "custom"
    custom_type: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    data: FrozenJson = None


Entry = Annotated[
    MessageEntry
    | ModelChangeEntry
    | ThinkingLevelChangeEntry
    | ActiveToolsChangeEntry
    | CompactionEntry
    | BranchSummaryEntry
    | CustomEntry,
    Field(discriminator="type"),
]
"""Any tree entry, as provisioned by its writer (`id` plus payload)."""
