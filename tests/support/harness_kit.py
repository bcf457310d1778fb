"""Builds harnesses over real backends for runtime tests, with a write-recording storage."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from harness_core import ScriptedModel, SessionRepo
from harness_core.harness import AgentHarness, SuspendedOperation
from harness_core.hooks import HookName
from harness_core.ids import SequentialIds
from harness_core.messages import AssistantMessage, ToolResultMessage
from harness_core.models.scripted import Reply
from harness_core.options import AgentHarnessOptions, RetryPolicy
from harness_core.session.contract import SessionStorage
from harness_core.session.entries import Entry, MessageEntry
from harness_core.session.records import (
    OperationFinished,
    QueueEnqueued,
    Record,
    StepAttempt,
    Usage,
)
from harness_core.session.types import StoredEntry, StoredRecord
from harness_core.testing import ManualClock
from harness_core.testing.trajectories import MODEL as MODEL  # every kit runs this model
from harness_core.tools import Tool
from tests.support.backends import new_repo

OPEN_REPOS: list[SessionRepo] = []
"""Repositories opened by kits; the test fixture closes them after each test."""


class RecordingStorage:
    """A storage that forwards everything and logs each write as (kind, detail)."""

    def __init__(self, inner: SessionStorage, log: list[tuple[str, str]]) -> None:
        self._inner = inner
        self.writes = log

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def append_entry(self, entry: Entry, lane: str) -> StoredEntry:
        stored = await self._inner.append_entry(entry, lane)
        self.writes.append(("E", _entry_detail(entry)))
        return stored

    async def append_entry_if_missing(self, entry: Entry, lane: str) -> tuple[StoredEntry, bool]:
        stored, appended = await self._inner.append_entry_if_missing(entry, lane)
        if appended:
            self.writes.append(("E", _entry_detail(entry)))
        return stored, appended

    async def append_record(self, record: Record) -> StoredRecord:
        stored = await self._inner.append_record(record)
        detail: str = record.type
        if isinstance(record, StepAttempt):
            detail += f":{record.step}:{record.attempt}"
        elif isinstance(record, OperationFinished):
            detail += f":{record.outcome}"
        elif isinstance(record, Usage):
            detail += f":{record.cause}"
        elif isinstance(record, QueueEnqueued):
            detail += f":{record.queue}"
        self.writes.append(("R", detail))
        return stored

    async def move_lane(self, lane: str, to: str | None) -> Any:
        result = await self._inner.move_lane(lane, to)
        self.writes.append(("L", lane))
        return result

    async def set_name(self, name: str) -> Any:
        result = await self._inner.set_name(name)
        self.writes.append(("G", "name"))
        return result

    async def set_label(self, target_id: str, label: str | None) -> Any:
        result = await self._inner.set_label(target_id, label)
        self.writes.append(("G", "label"))
        return result

    async def create_lane(self, lane: str, at: str | None) -> Any:
        result = await self._inner.create_lane(lane, at)
        self.writes.append(("L", f"create {lane}"))
        return result


def _entry_detail(entry: Entry) -> str:
    if isinstance(entry, MessageEntry):
        message = entry.message
        detail = f"message:{message.role}"
        if isinstance(message, AssistantMessage):
            detail += f":{message.stop_reason}"
        elif isinstance(message, ToolResultMessage):
            detail += f":{message.outcome}"
        return detail
    return entry.type


@dataclass
class Kit:
    """A harness over a real backend, its scripted model, and the write log."""

    backend: str
    repo: SessionRepo
    storage: SessionStorage
    model: ScriptedModel
    clock: ManualClock
    harness: AgentHarness
    suspended: list[SuspendedOperation]
    writes: list[tuple[str, str]] = field(default_factory=list)
    tools: Sequence[Tool] = ()
    options: dict[str, Any] = field(default_factory=dict)
    recording: RecordingStorage | None = None
    """The write-recording wrapper the harness writes through (tests may patch its methods)."""
    reopens: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    """Numbers the reopens of this session (shared by every kit reopened from this one)."""

    async def reopen(self, *, script: Sequence[Reply] | None = None, **changes: Any) -> Kit:
        """A new harness over the same session, as a restarted process would open it.

        The old harness is dropped without closing (a crash); the new one takes the lease over.
        """
        lease = await self.repo.acquire_lease("s", owner="w", ttl_ms=10**9)
        storage = await self.repo.open("s", lease=lease)
        model = self.model if script is None else ScriptedModel(script)
        options = {**self.options, **changes}
        tools = options.pop("tools", self.tools)
        writes: list[tuple[str, str]] = []
        recording = RecordingStorage(storage, writes)
        fresh_ids = {"ids": SequentialIds(f"reopen{next(self.reopens)}-")}  # no clash with the dead
        harness, suspended = await AgentHarness.create(
            _options(recording, model, self.clock, tools, {**fresh_ids, **options})
        )
        record_hooks(harness, writes)
        return Kit(
            self.backend,
            self.repo,
            storage,
            model,
            self.clock,
            harness,
            suspended,
            writes,
            tools,
            options,
            recording,
            self.reopens,
        )


def _options(
    storage: Any,
    model: ScriptedModel,
    clock: ManualClock,
    tools: Sequence[Tool],
    extra: dict[str, Any],
) -> AgentHarnessOptions:
    settings: dict[str, Any] = {
        "storage": storage,
        "model_client": model,
        "model": MODEL,
        "tools": tools,
        "clock": clock,
        "ids": SequentialIds("id-"),
        "retry": RetryPolicy(max_attempts=3, initial_delay_ms=0),
        **extra,
    }
    return AgentHarnessOptions(**settings)


HOOK_NAMES: tuple[HookName, ...] = get_args(HookName)
"""Every hook the runtime runs (``before_payload`` is refused at registration)."""


def record_hooks(harness: AgentHarness, log: list[tuple[str, str]]) -> None:
    """Log every hook invocation as ("H", name) in the same list as the writes."""
    for name in HOOK_NAMES:

        async def handler(event: Any, name: str = name) -> None:
            log.append(("H", name))

        harness.hooks.on(name, handler, id="recorder")


async def make_kit(
    backend: str,
    tmp_path: Path,
    script: Sequence[Reply] = (),
    tools: Sequence[Tool] = (),
    **options: Any,
) -> Kit:
    clock = ManualClock()
    repo = new_repo(backend, tmp_path, clock=clock)
    OPEN_REPOS.append(repo)
    await repo.create("s")
    lease = await repo.acquire_lease("s", owner="w", ttl_ms=10**9)
    storage = await repo.open("s", lease=lease)
    model = ScriptedModel(script)
    writes: list[tuple[str, str]] = []
    recording = RecordingStorage(storage, writes)
    harness, suspended = await AgentHarness.create(
        _options(recording, model, clock, tools, options)
    )
    record_hooks(harness, writes)
    return Kit(
        backend, repo, storage, model, clock, harness, suspended, writes, tools, options, recording
    )
