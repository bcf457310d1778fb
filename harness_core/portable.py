"""Portable state: a lane's conversation and capability data as one versioned, JSON-safe value.

`HarnessState` restores data, never authority: it carries the messages of a thread and each
capability's namespaced, versioned data (kept on the lane as custom entries named
``capability:<namespace>``), and never credentials, grants, approvals, queues or the ledger.
`AgentLane.export_state()` takes it from a lane; `AgentHarness.import_state()` starts a new lane
from it; `fork()` gives it a new identity. Its messages convert to pydantic-ai's
`ModelMessagesTypeAdapter` JSON and back. A failed run's `Outcome.state` is one too: the state
it reached, to inspect or fork.

No environment state: the reference's ``environment_states`` observe host-provided environment
mounts (sandboxes, workspaces), which this runtime has none of; an envelope that carries an empty
``environment`` (written before D235) still reads, a non-empty one is refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, Self

from pydantic import Field, StringConstraints, model_validator

from harness_core.frozen import Frozen, FrozenDict, FrozenJson
from harness_core.messages import AgentMessage
from harness_core.session.entries import CustomEntry, Entry

__all__ = [
    "CAPABILITY_PREFIX",
    "CapabilityState",
    "HarnessState",
    "capabilities_of",
    "capability_entry",
]

CAPABILITY_PREFIX = "capability:"
"""Custom entries named ``capability:<namespace>`` hold a capability's versioned data."""

Namespace = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=r"^\S+$")]
ThreadId = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=r"^\S+$")]


class CapabilityState(Frozen):
    """One capability's data: only its owner interprets it, checking `version` exactly."""

    version: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    data: FrozenJson = None


class HarnessState(Frozen):
    """The portable continuation of one thread (schema version ``"1"``)."""

    schema_version: Literal["1"] = "1"
    thread_id: ThreadId
    messages: tuple[AgentMessage, ...] = ()
    capabilities: Mapping[Namespace, CapabilityState] = Field(default_factory=dict)
    """Namespaced capability data; unknown namespaces are kept, opaque."""

    @model_validator(mode="before")
    @classmethod
    def _no_environment(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "environment" in data:
            if data["environment"]:
                raise ValueError(
                    "environment state is not supported: this runtime has no environment mounts"
                )
            data = {key: value for key, value in data.items() if key != "environment"}
        return data

    @model_validator(mode="after")
    def _frozen_maps(self) -> Self:
        object.__setattr__(self, "capabilities", FrozenDict(self.capabilities))
        return self

    def fork(self, thread_id: str) -> HarnessState:
        """The same messages and capability data under a new thread id."""
        if thread_id == self.thread_id:
            raise ValueError("a fork needs a new thread id")
        return self.model_copy(update={"thread_id": thread_id})

    def to_json(self) -> str:
        """The whole envelope as JSON (persist this, never a hand-edited copy)."""
        return self.model_dump_json()

    @classmethod
    def from_json(cls, data: str | bytes) -> HarnessState:
        """Validate an envelope; a wrong `schema_version` is refused, never upgraded."""
        return cls.model_validate_json(data)

    def model_messages_json(self) -> bytes:
        """The messages as pydantic-ai `ModelMessagesTypeAdapter` JSON."""
        from harness_core.models.conversion import message_json

        return message_json(self.messages)

    @classmethod
    def from_model_messages_json(
        cls,
        thread_id: str,
        data: str | bytes,
        capabilities: Mapping[str, CapabilityState] | None = None,
    ) -> HarnessState:
        """A state whose messages come from pydantic-ai JSON.

        System prompts are dropped: the importing harness's own system prompt applies.
        """
        from harness_core.models.conversion import messages_from_json

        _, messages = messages_from_json(data)
        return cls(thread_id=thread_id, messages=messages, capabilities=capabilities or {})


def capability_entry(entry_id: str, namespace: str, state: CapabilityState) -> CustomEntry:
    """The custom entry that records a capability's data on a lane."""
    return CustomEntry(
        id=entry_id,
        custom_type=CAPABILITY_PREFIX + namespace,
        data={"version": state.version, "data": state.data},
    )


def capabilities_of(path: Sequence[Entry]) -> dict[str, CapabilityState]:
    """The newest data per capability namespace along a path (oldest entry first)."""
    found: dict[str, CapabilityState] = {}
    for entry in path:
        if isinstance(entry, CustomEntry) and entry.custom_type.startswith(CAPABILITY_PREFIX):
            data: Any = entry.data
            if isinstance(data, Mapping) and isinstance(data.get("version"), str):
                found[entry.custom_type[len(CAPABILITY_PREFIX) :]] = CapabilityState(
                    version=data["version"], data=data.get("data")
                )
    return found
