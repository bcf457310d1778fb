"""fsck's reading of a Redis store: a session's keys as stored, decoded in full, and its indexes.

The session stream (``:log``) is the log's order; each of its items is resolved where the
backend keeps it (an entry's payload, node and checksum in ``:ep``/``:en``/``:ek``, a record in
its lane's stream), checked against the stream (seq, timestamp, lane) and decoded in full.
Besides the projections every store keeps, the backend's own indexes are compared with the
replayed log: ``:rid``, ``:eseq``, ``:ec:<custom type>``, ``:runs``, ``:opens`` and the per-lane
type streams (``:lt:...``).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, cast

from redis.exceptions import RedisError

from harness_core.errors import SessionError
from harness_core.session.codec import checksum, entry_adapter, fact_adapter, record_adapter
from harness_core.session.entries import CustomEntry
from harness_core.session.records import OperationStarted
from harness_core.session.types import FactSet, LaneMove, LogItem, StoredEntry, StoredRecord
from harness_core.storage._projections import SessionState, record_run_id
from harness_core.storage._rules import stats_from_counters, usage_from_values
from harness_core.storage.fsck import Findings, Problem, Projections, Scan, checked
from harness_core.storage.redis_streams import _STAT_FIELDS, _TYPE_INDEXES, RedisSessionRepo

__all__ = ["scan_redis"]


async def scan_redis(repo: RedisSessionRepo, session_id: str) -> Scan:
    """Read and check one session's keys."""
    try:
        return await _scan(repo, session_id)
    except RedisError as exc:
        raise SessionError("storage", f"redis read failed: {exc}") from exc


async def unlisted_sessions(repo: RedisSessionRepo, listed: set[str]) -> list[Problem]:
    """Sessions whose log is kept but that the store does not list: problems.

    A :meta key or an entry in :sessions gone read "checked 0 sessions: clean" while the
    gateway faulted on such a session at every take (an outside probe). A stream of another
    kind sharing the prefix (a broker's) is not one.
    """
    c = cast(Any, repo.reader())
    prefix = repo.keys.prefix
    escaped = "".join(f"\\{ch}" if ch in "*?[]\\" else ch for ch in prefix)
    found: set[str] = set()
    try:
        async for key in c.scan_iter(match=f"{escaped}:{{*}}:log", count=1000):
            name = key.decode() if isinstance(key, bytes) else str(key)
            session_id = name[len(prefix) + 2 : -len("}:log")]
            if session_id in listed or session_id in found:
                continue
            first = await c.xrange(name, "-", "+", count=1)
            if first and first[0][1].get("k") in ("e", "r", "l", "f"):
                found.add(session_id)
    except RedisError as exc:
        raise SessionError("storage", f"redis read failed: {exc}") from exc
    return [
        Problem(
            f"redis session {session_id!r}",
            "its log is kept but the store does not list it (its :meta key or its entry in "
            ":sessions is gone): nothing can read it as it is",
        )
        for session_id in sorted(found)
    ]


async def _stream(c: Any, key: str) -> list[tuple[str, dict[str, str]]]:
    rows: list[tuple[str, dict[str, str]]] = []
    low = "-"
    while True:
        batch = await c.xrange(key, low, "+", count=1000)
        rows += batch
        if len(batch) < 1000:
            return rows
        low = f"({batch[-1][0]}"


def _seq(stream_id: str) -> int:
    return int(stream_id.split("-", 1)[0])


async def _scan(repo: RedisSessionRepo, sid: str) -> Scan:
    c = cast(Any, repo.reader())

    def key(name: str) -> str:
        return repo.key(sid, name)

    where = f"redis session {sid!r}"
    scan = Scan()
    log = await _stream(c, key("log"))
    payloads: dict[str, str] = await c.hgetall(key("ep"))
    nodes: dict[str, str] = await c.hgetall(key("en"))
    sums: dict[str, str] = await c.hgetall(key("ek"))
    lanes: dict[str, str] = await c.hgetall(key("lanes"))
    record_lanes = set(lanes) | {fields["lane"] for _, fields in log if fields.get("k") == "r"}
    records: dict[tuple[str, int], dict[str, str]] = {}
    for lane in record_lanes:
        for stream_id, fields in await _stream(c, key("lr:" + lane)):
            records[(lane, _seq(stream_id))] = fields
    for stream_id, fields in log:
        seq, kind = _seq(stream_id), fields.get("k")
        item: LogItem | None = None
        if kind == "e":
            item = _entry(where, seq, fields, payloads, nodes, sums, scan.problems)
        elif kind == "r":
            found = records.pop((fields.get("lane", ""), seq), None)
            if found is None:
                scan.problems.append(
                    Problem(f"{where} record seq {seq}", "missing from its lane's stream")
                )
            else:
                item = _record(where, seq, fields, found, scan.problems)
        elif kind == "l":
            item = _lane_move(where, seq, fields, scan.problems)
        elif kind == "f":
            item = _fact(where, seq, fields, scan.problems)
        else:
            scan.problems.append(Problem(f"{where} seq {seq}", f"unknown item kind {kind!r}"))
        if item is not None:
            scan.items.append(item)
    for lane, seq in sorted(records, key=lambda pair: pair[1]):
        scan.problems.append(
            Problem(f"{where} record seq {seq}", f"in lane {lane!r}'s stream but not in the log")
        )
    scan.stored = await _projections(c, key, lanes)
    indexes = await _indexes(c, key, lanes)
    scan.check_projections = lambda state: _compare_indexes(where, state, indexes)
    return scan


def _entry(
    where: str,
    seq: int,
    fields: dict[str, str],
    payloads: dict[str, str],
    nodes: dict[str, str],
    sums: dict[str, str],
    problems: Findings,
) -> StoredEntry | None:
    location = f"{where} entry seq {seq}"
    entry_id = fields.get("id", "")
    payload, node = payloads.get(entry_id), nodes.get(entry_id)
    if payload is None or node is None:
        problems.append(Problem(location, f"entry {entry_id!r} has no payload or node"))
        return None
    parts = node.split("\t")
    if len(parts) != 6 or parts[0] != str(seq) or parts[1] != fields.get("t"):
        problems.append(Problem(location, f"node {node!r} disagrees with the log"))
        return None
    _, ts, parent, lane, type_, custom = parts
    crc = sums.get(entry_id)
    stored = checked(
        location,
        None if crc is None else int(crc),
        checksum(payload),
        lambda: StoredEntry(
            seq=seq,
            timestamp=int(ts),
            lane=lane or None,
            parent_id=parent or None,
            entry=entry_adapter.validate_json(payload),
        ),
        problems,
        order=seq,
    )
    if stored is not None:
        entry = stored.entry
        said = (entry.id, entry.type, entry.custom_type if isinstance(entry, CustomEntry) else "")
        if said != (entry_id, type_, custom):
            problems.append(
                Problem(location, f"node (id, type, custom) disagrees with the payload {said}")
            )
    return stored


def _record(
    where: str, seq: int, fields: dict[str, str], found: dict[str, str], problems: Findings
) -> StoredRecord | None:
    location = f"{where} record seq {seq}"
    payload, crc = found.get("d", ""), found.get("crc")
    if found.get("t") != fields.get("t"):
        problems.append(Problem(location, "its timestamp disagrees with the log's"))
    stored = checked(
        location,
        None if crc is None else int(crc),
        checksum(payload),
        lambda: StoredRecord(
            seq=seq, timestamp=int(found["t"]), record=record_adapter.validate_json(payload)
        ),
        problems,
        order=seq,
    )
    if stored is not None and stored.record.lane != fields.get("lane"):
        problems.append(Problem(location, "stored in another lane's stream than its own"))
    return stored


def _lane_move(where: str, seq: int, fields: dict[str, str], problems: Findings) -> LaneMove | None:
    lane, leaf, created, crc = (fields.get(k, "") for k in ("lane", "leaf", "c", "crc"))
    return checked(
        f"{where} lane move seq {seq}",
        int(crc) if crc else None,
        checksum("", lane, leaf, created),
        lambda: LaneMove(
            seq=seq,
            timestamp=int(fields["t"]),
            lane=lane,
            leaf_id=leaf or None,
            created=created == "1",
        ),
        problems,
        order=seq,
    )


def _fact(where: str, seq: int, fields: dict[str, str], problems: Findings) -> FactSet | None:
    payload, crc = fields.get("d", ""), fields.get("crc")
    return checked(
        f"{where} fact seq {seq}",
        None if crc is None else int(crc),
        checksum(payload),
        lambda: FactSet(
            seq=seq, timestamp=int(fields["t"]), fact=fact_adapter.validate_json(payload)
        ),
        problems,
        order=seq,
    )


async def _projections(c: Any, key: Any, lanes: dict[str, str]) -> Projections:
    meta = await c.hmget(key("meta"), [*_STAT_FIELDS, "name"])
    open_operations: dict[str, list[tuple[int, str]]] = {}
    for lane in lanes:
        opened = await c.zrange(key("open:" + lane), 0, -1, withscores=True)
        if opened:
            open_operations[lane] = [(int(score), run) for run, score in opened]
    lane_sums, entry_sums = await c.hgetall(key("ul")), await c.hgetall(key("ue"))
    return Projections(
        lanes={lane: leaf or None for lane, leaf in lanes.items()},
        open_operations=open_operations,
        lane_usage={k: usage_from_values(v.split(" ")) for k, v in lane_sums.items()},
        entry_usage={k: usage_from_values(v.split(" ")) for k, v in entry_sums.items()},
        stats=stats_from_counters([v or 0 for v in meta[:-1]]),
        name=meta[-1],
        labels=await c.hgetall(key("labels")),
    )


async def _indexes(c: Any, key: Any, lanes: dict[str, str]) -> dict[str, Any]:
    types: dict[str, list[int]] = {}
    for lane in lanes:
        for index in _TYPE_INDEXES:
            seqs = [_seq(stream_id) for stream_id, _ in await _stream(c, key(f"lt:{index}:{lane}"))]
            if seqs:
                types[f"{index}:{lane}"] = seqs
    customs = {
        custom: await c.zrange(key("ec:" + custom), 0, -1, withscores=True)
        for custom in await c.smembers(key("ctypes"))
    }
    return {
        "rid": await c.hgetall(key("rid")),
        "eseq": dict(await c.zrange(key("eseq"), 0, -1, withscores=True)),
        "runs": set(await c.zrange(key("runs"), 0, -1)),
        "opens": dict(await c.zrange(key("opens"), 0, -1, withscores=True)),
        "types": types,
        "customs": {name: dict(members) for name, members in customs.items() if members},
    }


def _compare_indexes(where: str, state: SessionState, stored: dict[str, Any]) -> list[Problem]:
    records = state.records
    expected: dict[str, Any] = {
        "rid": {r.id: f"{r.seq}\t{r.type}\t{r.lane}" for r in records},
        "eseq": {e.id: float(e.seq) for e in state.entry_list},
        "runs": {
            f"{run}\t{r.seq:016d}\t{r.lane}"
            for r in records
            if (run := record_run_id(r.record)) is not None
        },
        "opens": {op.id: float(op.seq) for ops in state.open_ops.values() for op in ops},
    }
    types: dict[str, list[int]] = defaultdict(list)
    customs: dict[str, dict[str, float]] = defaultdict(dict)
    for r in records:
        types[f"{r.type}:{r.lane}"].append(r.seq)
        if isinstance(r.record, OperationStarted):
            types[f"{r.type}.{r.record.intent.kind}:{r.lane}"].append(r.seq)
    for e in state.entry_list:
        if isinstance(e.entry, CustomEntry):
            customs[e.entry.custom_type][e.id] = float(e.seq)
    expected["types"], expected["customs"] = dict(types), dict(customs)
    problems: list[Problem] = []
    for name, value in expected.items():
        if stored[name] != value:
            problems.append(Problem(where, f"index :{name} disagrees with the log"))
    return problems
