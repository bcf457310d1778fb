"""harness_core: the durable agent runtime. So far: the session model and its store.

The harness runtime (`AgentHarness`, lanes, operations, restore) is built on this next.
"""

from harness_core.clock import Clock, SystemClock
from harness_core.errors import (
    HarnessClosed,
    HarnessError,
    HarnessFault,
    HarnessNotImplemented,
    LeaseHeld,
    LeaseLost,
    SessionError,
    StoreCorrupted,
)
from harness_core.ids import IdGenerator, SequentialIds, Uuid7Ids
from harness_core.messages import (
    AgentMessage,
    AssistantMessage,
    Cost,
    DeferredHandle,
    ImagePart,
    TextPart,
    ThinkingPart,
    TokenUsage,
    ToolCallPart,
    ToolResultMessage,
    UserMessage,
    user_message,
)
from harness_core.storage import open_repo

__all__ = [
    "AgentMessage",
    "AssistantMessage",
    "Clock",
    "Cost",
    "DeferredHandle",
    "HarnessClosed",
    "HarnessError",
    "HarnessFault",
    "HarnessNotImplemented",
    "IdGenerator",
    "ImagePart",
    "LeaseHeld",
    "LeaseLost",
    "open_repo",
    "SequentialIds",
    "SessionError",
    "StoreCorrupted",
    "SystemClock",
    "TextPart",
    "ThinkingPart",
    "TokenUsage",
    "ToolCallPart",
    "ToolResultMessage",
    "user_message",
    "UserMessage",
    "Uuid7Ids",
]
