"""Checking a session store (fsck): every stored item in full, checksums, projections vs the log.

`check_store` reads every session of a repository the slow, thorough way, whatever a normal
read would trust: each stored item's checksum is verified and the item is decoded with full
validation (`codec.decode`, never the trusted decoders); the columns or fields a backend keeps
beside a payload (an entry's type, a record's lane and run) must agree with it; the items must
make one log, seq 1, 2, 3, ... in which every item is legal where it stands (the import checks,
`SessionState.check_replay`); and every projection the backend keeps (lane leaves, open
operations, usage sums per lane and per entry, the session's counters, its name and labels, and
the backend's own indexes) must equal what replaying the log computes. Each disagreement is one
`Problem` naming where it is; checking never writes.

The backends' own reads live beside them (`_fsck_sqlite`, `_fsck_redis`, `_fsck_jsonl`); a
memory store has nothing stored, so only its log is checked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from pydantic import ValidationError

from harness_core.errors import SessionError
from harness_core.messages import TokenUsage
from harness_core.session.contract import SessionRepo
from harness_core.session.types import LogItem, SessionMetadata, SessionStats
from harness_core.storage._projections import SessionState

__all__ = [
    "CheckReport",
    "Findings",
    "Problem",
    "Projections",
    "Scan",
    "check_store",
    "checked",
]

_T = TypeVar("_T")


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a store: where (a session and a seq, a key, a file line) and what."""

    location: str
    message: str

    def __str__(self) -> str:
        return f"{self.location}: {self.message}"


@dataclass
class Projections:
    """What a backend keeps beside the log, read as stored (compared with the log's own)."""

    lanes: dict[str, str | None]
    open_operations: dict[str, list[tuple[int, str]]]
    """Per lane, its open operations as (seq of the start, run id), oldest first."""
    lane_usage: dict[str, TokenUsage]
    entry_usage: dict[str, TokenUsage]
    stats: SessionStats
    name: str | None
    labels: dict[str, str]


class Findings(list[Problem]):
    """A session's problems, and which of its items carried a checksum (`unsealed`)."""

    def __init__(self) -> None:
        super().__init__()
        self.first_sealed: int | None = None
        """The order (seq, or file line) of the first item that carried a checksum."""
        self.unsealed: list[tuple[int, str]] = []
        """(order, location) of each item that carried none."""

    def sealed(self, order: int, location: str, stored: int | None) -> None:
        """Note whether the item at `order` carried a checksum."""
        if stored is None:
            self.unsealed.append((order, location))
        elif self.first_sealed is None or order < self.first_sealed:
            self.first_sealed = order

    def unsealed_problems(self) -> list[Problem]:
        """An item without a checksum after one with: its checksum was removed or lost.

        Items written before checksums existed have none, and come first; one among or after
        sealed items was edited with its checksum taken away, or lost it with a deleted key
        (an outside probe: such an edit checked clean).
        """
        first = self.first_sealed
        if first is None:
            return []
        return [
            Problem(
                location,
                "has no checksum, though items written before it have one: its checksum was "
                "removed or lost, so what it holds cannot be trusted",
            )
            for order, location in sorted(self.unsealed)
            if order > first
        ]


@dataclass
class Scan:
    """One session as a backend holds it: its items decoded in full, and what it keeps beside."""

    items: list[LogItem] = field(default_factory=list)
    """Every item that decoded, in seq order."""
    problems: Findings = field(default_factory=Findings)
    """What the backend's own reading found (checksums, undecodable items, index disagreements)."""
    stored: Projections | None = None
    """None: the backend keeps no projections (it rebuilds them from the log on open)."""
    check_projections: Callable[[SessionState], list[Problem]] | None = None
    """The backend's own indexes, compared with the replayed log (None: it keeps none)."""


@dataclass
class CheckReport:
    """What `check_store` found."""

    sessions: int = 0
    items: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """Whether nothing was found."""
        return not self.problems


async def check_store(
    repo: SessionRepo,
    session_ids: Sequence[str] | None = None,
    *,
    found: Callable[[Problem], None] | None = None,
) -> CheckReport:
    """Check every session of `repo` (or `session_ids`); `found` is told of each problem.

    Raises `SessionError` when the store itself cannot be read (unreachable, not a store).
    """
    report = CheckReport()

    def add(problems: Sequence[Problem]) -> None:
        for problem in problems:
            report.problems.append(problem)
            if found is not None:
                found(problem)

    add(await _store_problems(repo))
    listed = {meta.id: meta for meta in await repo.list()}
    if session_ids is None:
        add(await _unlisted(repo, set(listed)))
    for session_id in session_ids if session_ids is not None else sorted(listed):
        meta = listed.get(session_id)
        if meta is None:
            add([Problem(f"session {session_id!r}", "no such session")])
            continue
        report.sessions += 1
        scan = await _scan(repo, meta)
        report.items += len(scan.items)
        add(scan.problems)
        add(scan.problems.unsealed_problems())
        add(_replayed(meta, scan))
    return report


async def _store_problems(repo: SessionRepo) -> list[Problem]:
    from harness_core.storage.jsonl import JsonlSessionRepo
    from harness_core.storage.sqlite import SqliteSessionRepo

    if isinstance(repo, SqliteSessionRepo):
        from harness_core.storage._fsck_sqlite import database_problems

        return await database_problems(repo)
    if isinstance(repo, JsonlSessionRepo):
        from harness_core.storage._fsck_jsonl import directory_problems

        return await directory_problems(repo)
    return []


async def _unlisted(repo: SessionRepo, listed: set[str]) -> list[Problem]:
    from harness_core.storage.redis_streams import RedisSessionRepo

    if isinstance(repo, RedisSessionRepo):
        from harness_core.storage._fsck_redis import unlisted_sessions

        return await unlisted_sessions(repo, listed)
    return []


async def _scan(repo: SessionRepo, meta: SessionMetadata) -> Scan:
    from harness_core.storage.jsonl import JsonlSessionRepo
    from harness_core.storage.redis_streams import RedisSessionRepo
    from harness_core.storage.sqlite import SqliteSessionRepo

    if isinstance(repo, SqliteSessionRepo):
        from harness_core.storage._fsck_sqlite import scan_sqlite

        return await scan_sqlite(repo, meta.id)
    if isinstance(repo, RedisSessionRepo):
        from harness_core.storage._fsck_redis import scan_redis

        return await scan_redis(repo, meta.id)
    if isinstance(repo, JsonlSessionRepo):
        from harness_core.storage._fsck_jsonl import scan_jsonl

        return await scan_jsonl(repo, meta.id)
    storage = await repo.open(meta.id)
    try:
        return Scan(items=list(await storage.get_log()))
    finally:
        await storage.close()


def _replayed(meta: SessionMetadata, scan: Scan) -> list[Problem]:
    """Replay the items as an import would; compare what it computes with what is stored."""
    where = f"session {meta.id!r}"
    state = SessionState(meta.model_copy(update={"name": None}))
    problems: list[Problem] = []
    for item in scan.items:
        try:
            state.check_replay(item)
        except SessionError as exc:
            problems.append(Problem(f"{where} seq {item.seq}", f"not legal in the log: {exc}"))
            return problems  # what follows is measured against a log that already went wrong
        state.apply(item)
    if scan.stored is not None:
        problems += _compare(where, state, scan.stored)
    if scan.check_projections is not None:
        problems += scan.check_projections(state)
    return problems


def _compare(where: str, state: SessionState, stored: Projections) -> list[Problem]:
    problems: list[Problem] = []

    def differ(what: str, kept: object, computed: object) -> None:
        if kept != computed:
            problems.append(Problem(where, f"{what}: stored {kept!r}, the log gives {computed!r}"))

    for lane in sorted(set(stored.lanes) | set(state.lanes)):
        differ(
            f"lane {lane!r} leaf",
            stored.lanes.get(lane, "(no lane)"),
            state.lanes.get(lane, "(no lane)"),
        )
    computed_open = {
        lane: [(op.seq, op.id) for op in ops] for lane, ops in state.open_ops.items() if ops
    }
    for lane in sorted(set(stored.open_operations) | set(computed_open)):
        differ(
            f"lane {lane!r} open operations",
            stored.open_operations.get(lane, []),
            computed_open.get(lane, []),
        )
    for scope, kept, computed in (
        ("lane", stored.lane_usage, state.lane_usage),
        ("entry", stored.entry_usage, state.entry_usage),
    ):
        for key in sorted(set(kept) | set(computed)):
            differ(
                f"usage sum of {scope} {key!r}",
                kept.get(key, TokenUsage()),
                computed.get(key, TokenUsage()),
            )
    differ("counters", stored.stats, state.stats)
    differ("name", stored.name, state.name)
    for target in sorted(set(stored.labels) | set(state.labels)):
        differ(f"label of {target!r}", stored.labels.get(target), state.labels.get(target))
    return problems


def checked(
    location: str,
    stored: int | None,
    computed: int,
    decode: Callable[[], _T],
    problems: Findings,
    *,
    order: int,
) -> _T | None:
    """Verify a stored checksum (None: written before checksums) and decode in full.

    Returns the value, or None with the problem noted when it does not decode; a checksum that
    does not match is noted too, and the value is still returned (the log goes on checking).
    `order`: the item's place in the log (its seq, or its file line), by which `problems`
    tells an item written before checksums from one whose checksum was taken away.
    """
    problems.sealed(order, location, stored)
    if stored is not None and stored != computed:
        problems.append(
            Problem(
                location,
                f"checksum mismatch (stored {stored:08x}, computed {computed:08x}): "
                "the bytes changed after they were written",
            )
        )
    try:
        return decode()
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "value"
        problems.append(Problem(location, f"does not decode: {where}: {first['msg']}"))
    except ValueError as exc:  # not JSON at all
        problems.append(Problem(location, f"does not decode: {exc}"))
    return None
