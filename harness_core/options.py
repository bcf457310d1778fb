"""The harness's options and policies (runtime capabilities: rebuilt on every `create()`)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from opentelemetry.context import Context
from opentelemetry.trace import Tracer

from harness_core.clock import Clock
from harness_core.hooks import RequestOptions
from harness_core.ids import IdGenerator
from harness_core.messages import AgentMessage
from harness_core.models import ModelClient, ModelRef
from harness_core.session.contract import SessionStorage
from harness_core.session.entries import CustomEntry
from harness_core.tools import Tool

__all__ = [
    "AgentHarnessOptions",
    "CompactionSettings",
    "EntryProjector",
    "QueueMode",
    "RetryPolicy",
]

EntryProjector = Callable[[CustomEntry], Sequence[AgentMessage]]
"""Turns a custom entry of one type into the messages the model sees for it (none: unseen)."""

QueueMode = Literal["all", "one_at_a_time"]
"""How many queued items a checkpoint consumes."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """Step attempts and backoff. The attempt count is durable: restarts never reset it."""

    max_attempts: int = 3
    """Attempts per step, the first included."""
    initial_delay_ms: int = 1_000
    multiplier: float = 2.0
    max_delay_ms: int = 60_000
    jitter: float = 0.0
    """Spread: the backoff is cut by up to this fraction, a provider's hint lengthened by up to
    it, by an amount fixed per `spread` key and attempt. Lanes refused together (a provider's
    outage, one 429 with one Retry-After) then do not all come back in the same instant."""

    def delay_ms(self, attempt: int, retry_after_ms: int | None = None, *, spread: str = "") -> int:
        """Backoff after failed attempt `attempt` (1-based); a provider hint wins if larger."""
        delay = min(
            self.max_delay_ms, int(self.initial_delay_ms * self.multiplier ** (attempt - 1))
        )
        hinted = min(retry_after_ms or 0, self.max_delay_ms)
        if self.jitter > 0:
            share = self.jitter * _fraction(f"{spread}\x00{attempt}")
            delay = int(delay * (1 - share))
            hinted = min(int(hinted * (1 + share)), self.max_delay_ms)
        return max(delay, hinted)


def _fraction(key: str) -> float:
    """A number in [0, 1) fixed by `key` (the same on every replay: no randomness to record)."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass(frozen=True, kw_only=True, slots=True)
class CompactionSettings:
    """When and how much to compact."""

    enabled: bool = True
    """Compact automatically when the next request would not fit."""
    reserve_tokens: int = 16_384
    """Room kept free in the context window for the answer."""
    keep_recent_tokens: int = 20_000
    """Roughly how much recent context survives verbatim."""

    def within(self, context_window: int) -> tuple[int, int]:
        """(reserve, keep recent) for a model of `context_window` tokens.

        The settings as given, each at most a quarter of the window: with an 8,192-token window
        the defaults would reserve more than the window holds (every request "over the limit")
        and keep all of it verbatim (a compaction that shrinks nothing), D310.
        """
        quarter = max(context_window // 4, 1)
        return min(self.reserve_tokens, quarter), min(self.keep_recent_tokens, quarter)


SystemPrompt = str | Callable[[str], str] | None
"""A fixed system prompt, or a function of the lane name evaluated per request."""

TurnCap = int | Callable[[str], int | None] | None
"""A number of model turns a run may take for one input, for every lane or as a function of the
lane name (asked at each checkpoint), or None: no limit."""

TokenCap = int | Callable[[str], int | None] | None
"""A number of tokens a lane may spend in all, for every lane or as a function of the lane name
(asked at each checkpoint), or None: no budget."""

AttemptCap = int | Callable[[str], int]
"""A number of attempts for every lane, or a function of the lane name (asked whenever a lane's
attempts are judged: at restore, at each resume, in a lane's status)."""


@dataclass(kw_only=True)
class AgentHarnessOptions:
    """Everything `AgentHarness.create()` needs.

    Args:
        storage: the session, opened with a writer lease.
        model_client: sends model requests.
        model: the model of lanes whose path never set one.
        tools: the tool registry (code; rebuilt each time, never persisted).
        active_tools: tool names lanes may use unless their path says otherwise (None: all).
    """

    storage: SessionStorage
    model_client: ModelClient
    model: ModelRef
    thinking_level: str = "off"
    active_tools: tuple[str, ...] | None = None
    tools: Sequence[Tool] = ()
    system_prompt: SystemPrompt = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    lease_renew_ms: int | None = None
    """While lanes work, renew the writer lease this long after the last confirmed renewal
    (None: at half-life). A service sets it below a third of the lease (a13n §6.4)."""
    max_attempts: AttemptCap = 3
    """Executions of one operation (its first, plus each resume after a crash) before its lane
    is parked stuck, for every lane or per lane (a function of the lane's name: a service whose
    lanes serve different agents); per-request retries are `retry.max_attempts`."""

    def max_attempts_of(self, lane: str) -> int:
        """Lane `lane`'s attempt cap (`max_attempts`, asked of the lane when a function)."""
        cap = self.max_attempts
        return cap(lane) if callable(cap) else cap

    max_idle_lanes: int = 256
    """Idle lanes kept in memory, least recently used dropped first (at least 0). A session can
    hold many thousands of lanes (a Slack channel's threads): only lanes with an open operation
    are restored at `create()`, any other lane is read on its first use, and an idle lane (no
    open operation, nothing executing, no call in flight) is dropped beyond this many and read
    again when next used. Reloading costs a lane's bounded restore reads (a few queries); the
    default keeps a busy channel's recent threads warm in ~4 MiB."""
    compaction: CompactionSettings = field(default_factory=CompactionSettings)
    max_turns: TurnCap = None
    """Assistant turns (a model step and its tool batch) a run may take for one input: the
    prompt, a steer or a follow-up each start the count again. At the limit the run fails
    ``turn_limit`` instead of asking the model once more, so a model calling tools in a loop
    stops instead of running, and billing, until someone aborts it. For every lane or per lane
    (a function of the lane's name, like `max_attempts`); None: no limit."""

    def max_turns_of(self, lane: str) -> int | None:
        """Lane `lane`'s turn limit (`max_turns`, asked of the lane when a function)."""
        cap = self.max_turns
        return cap(lane) if callable(cap) else cap

    token_budget: TokenCap = None
    """Tokens a lane may spend in all: its ledger's ``total_tokens`` (`AgentLane.get_usage`:
    every request's, failed attempts and summaries included). At a checkpoint that would ask the
    model once more, a lane whose ledger has reached it fails its run ``token_budget``; a new
    input on that lane fails at its first checkpoint, so nothing more is spent. The check sits
    between requests, so a run may pass the budget by the one request that crossed it. For every
    lane or per lane (a function of the lane's name); None: no budget (and no ledger read)."""

    def token_budget_of(self, lane: str) -> int | None:
        """Lane `lane`'s token budget (`token_budget`, asked of the lane when a function)."""
        cap = self.token_budget
        return cap(lane) if callable(cap) else cap

    def __post_init__(self) -> None:
        for name in ("max_turns", "token_budget"):
            value = getattr(self, name)
            if isinstance(value, int) and value < 1:
                raise ValueError(f"{name} must be at least 1 (or None: no limit), not {value}")

    steering_mode: QueueMode = "all"
    follow_up_mode: QueueMode = "all"
    tool_execution: Literal["parallel", "sequential"] = "parallel"
    request_options: RequestOptions = field(default_factory=RequestOptions)
    entry_projectors: Mapping[str, EntryProjector] = field(default_factory=dict)
    ids: IdGenerator | None = None
    clock: Clock | None = None
    self_check: bool = True
    """Recompute a lane's state from storage after every operation and compare (drift faults)."""
    drive: Literal["automatic", "manual"] = "automatic"
    tracer: Tracer | None = None
    """OpenTelemetry tracer for operation, step, request and tool spans (None: no telemetry)."""
    trace_parent: Context | None = None
    """The parent context of operation spans (for example the span of the incoming message)."""
