"""Agent profiles: what an agent is told, which model and tools it has, who approves, per route.

A `Profile` is defined once (``[[profiles]]`` in TOML, ``GATEWAY_PROFILES`` JSON) and named by
routes (``profile = "oncall"`` in a ``[[routes]]`` table); a thread whose route names none gets
the default profile. A field a profile leaves unset is the top-level setting's (``model``,
``busy_policy``, ``max_attempts``, ``max_turns``, ``token_budget``, ``instructions``); unset
tools mean every tool, unset approvers the channel's own rule.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

__all__ = [
    "DEFAULT_PROFILE",
    "MODEL_NAME",
    "PROFILE_NAME_RULE",
    "BusyPolicy",
    "Profile",
    "allowed_tools",
]

BusyPolicy = Literal["steer", "follow_up", "next_run"]
"""What a message does to a busy lane (see `Settings.busy_policy`)."""
DEFAULT_PROFILE = "default"
"""The name of the profile a thread gets when its route names none."""
PROFILE_NAME_RULE = "1-64 of a-z, 0-9, _ and -, from a letter"
_NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}")
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*:\S+")
"""``provider:model_id``: what a model setting looks like (which providers exist, the gateway
knows when it builds them)."""
_PATTERN = re.compile(r"[A-Za-z0-9_.*?\[\]!:/-]{1,200}")
"""A tool-name pattern: fnmatch over tool names (``tickets.*``), no spaces or controls."""
_APPROVER = re.compile(r"[^\s\x00-\x1f\x7f,]{1,256}")
MAX_INSTRUCTIONS = 100_000
"""Characters of a profile's instructions (they are sent with every model request)."""
MAX_TOKEN_BUDGET = 1_000_000_000
"""The most tokens a thread's budget may be (a profile's, the top level's, an operator's)."""


class Profile(BaseModel):
    """One agent profile (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = Field(description=f"What routes call it: {PROFILE_NAME_RULE}.")
    instructions: str | None = Field(
        default=None,
        max_length=MAX_INSTRUCTIONS,
        description="The agent's instructions (its system prompt); unset: the top-level "
        "instructions.",
    )
    model: str | None = Field(
        default=None, description="provider:model_id; unset: the top-level model."
    )
    allow_tools: tuple[str, ...] | None = Field(
        default=None,
        description="Tool-name patterns (fnmatch: tickets.*, search_docs) the agent may call; "
        "unset: every tool.",
    )
    deny_tools: tuple[str, ...] = Field(
        default=(), description="Tool-name patterns taken away from what allow_tools allows."
    )
    approvers: tuple[str, ...] | None = Field(
        default=None,
        description="Who may approve or deny this agent's tool calls (ids as the channel names "
        "people); unset: whoever the channel allows.",
    )
    busy_policy: BusyPolicy | None = Field(
        default=None, description="What a message does to a busy lane; unset: the top-level one."
    )
    max_attempts: int | None = Field(
        default=None,
        ge=1,
        le=20,
        description="Interrupted executions of one operation before the lane is parked stuck; "
        "unset: the top-level one.",
    )
    max_turns: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="Model turns a run may take for one message before it stops (turn_limit); "
        "unset: the top-level one.",
    )
    token_budget: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TOKEN_BUDGET,
        description="Tokens one of this profile's threads may spend in all before its runs stop "
        "(token_budget); unset: the top-level one.",
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool):
            raise ValueError(f"expected {info.field_name} to be a value, not true or false")
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError(f"expected a profile name: {PROFILE_NAME_RULE}")
        return value

    @field_validator("model")
    @classmethod
    def _model(cls, value: str | None) -> str | None:
        if value is not None and not MODEL_NAME.fullmatch(value):
            raise ValueError("expected provider:model_id, e.g. anthropic:claude-sonnet-5-5")
        return value

    @field_validator("allow_tools", "deny_tools")
    @classmethod
    def _patterns(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for pattern in value or ():
            if not _PATTERN.fullmatch(pattern):
                raise ValueError(
                    f"{pattern!r} is not a tool-name pattern (letters, digits, _ . - : / and the "
                    "wildcards * ? [ ], no spaces)"
                )
        return value

    @field_validator("approvers")
    @classmethod
    def _approvers(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for approver in value or ():
            if not _APPROVER.fullmatch(approver):
                raise ValueError(f"{approver!r} is not an approver id (no spaces or commas)")
        return value

    def digest(self) -> str:
        """A short hash of everything the profile sets (its name included): equal iff unchanged."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:16]

    def allows(self, tool: str) -> bool:
        """Whether a tool named `tool` is this profile's (allowed, and not denied)."""
        allowed = self.allow_tools is None or _matches(tool, self.allow_tools)
        return allowed and not _matches(tool, self.deny_tools)


def allowed_tools(profile: Profile, names: Iterable[str]) -> tuple[str, ...]:
    """The tool names of `names` that `profile` allows, in their order."""
    return tuple(name for name in names if profile.allows(name))


def _matches(name: str, patterns: Iterable[str]) -> bool:
    # fnmatchcase: the same answer on every platform (fnmatch folds case on Windows)
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
