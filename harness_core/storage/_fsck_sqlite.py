"""fsck's reading of a SQLite store: every row as stored, decoded in full, and its projections."""

from __future__ import annotations

import sqlite3
from functools import partial
from typing import Any

from harness_core.messages import TokenUsage
from harness_core.session.codec import checksum, entry_adapter, fact_adapter, record_adapter
from harness_core.session.entries import CustomEntry
from harness_core.session.records import OperationStarted
from harness_core.session.types import FactSet, LaneMove, LogItem, StoredEntry, StoredRecord
from harness_core.storage._projections import record_run_id
from harness_core.storage._rules import stats_from_counters, usage_from_values
from harness_core.storage.fsck import Findings, Problem, Projections, Scan, checked
from harness_core.storage.sqlite import SqliteSessionRepo

__all__ = ["database_problems", "scan_sqlite"]

_USAGE = (
    "u_input, u_output, u_cache_read, u_cache_write, u_total_tokens, "
    "c_input, c_output, c_cache_read, c_cache_write, c_total"
)
# payloads are read as bytes: a checksum is of the stored bytes, and bytes that are not UTF-8
# are a problem to report, not an error that stops the check
_QUERIES = {
    "entries": "SELECT seq, timestamp, lane, parent_id, CAST(payload AS BLOB), checksum, id, "
    "type, custom_type FROM entries WHERE session_id=? ORDER BY seq",
    "records": "SELECT seq, timestamp, CAST(payload AS BLOB), checksum, id, lane, run_id, type, "
    "op_kind FROM records WHERE session_id=? ORDER BY seq",
    "moves": "SELECT seq, timestamp, lane, leaf_id, created, checksum FROM lane_moves "
    "WHERE session_id=? ORDER BY seq",
    "facts": "SELECT seq, timestamp, CAST(payload AS BLOB), checksum FROM facts "
    "WHERE session_id=? ORDER BY seq",
    "session": "SELECT last_seq, n_entries, n_messages, n_records, "
    f"{_USAGE}, name FROM sessions WHERE session_id=?",
    "lanes": "SELECT lane, leaf_id FROM lanes WHERE session_id=?",
    "open": "SELECT lane, seq, run_id FROM open_operations WHERE session_id=? ORDER BY seq",
    "sums": f"SELECT scope, key, {_USAGE} FROM usage_sums WHERE session_id=?",
    "labels": "SELECT target_id, label FROM labels WHERE session_id=?",
}


async def database_problems(repo: SqliteSessionRepo) -> list[Problem]:
    """SQLite's own check of the file (``PRAGMA quick_check``: pages, records, indexes)."""
    rows = await repo.read(lambda c: c.execute("PRAGMA quick_check").fetchall(), inline=False)
    if rows == [("ok",)]:
        return []
    return [Problem(str(repo.path), f"SQLite quick_check: {row[0]}") for row in rows]


async def scan_sqlite(repo: SqliteSessionRepo, session_id: str) -> Scan:
    """Every row of a session in one snapshot: its items checked and decoded, its projections."""

    def read(c: sqlite3.Connection) -> dict[str, list[Any]]:
        return {name: c.execute(sql, (session_id,)).fetchall() for name, sql in _QUERIES.items()}

    rows = await repo.read(read, inline=False)
    where = f"sqlite session {session_id!r}"
    scan = Scan()
    items: list[LogItem] = []
    for row in rows["entries"]:
        item = _entry(where, row, scan.problems)
        if item is not None:
            items.append(item)
    for row in rows["records"]:
        record = _record(where, row, scan.problems)
        if record is not None:
            items.append(record)
    for seq, ts, lane, leaf, created, crc in rows["moves"]:
        location = f"{where} lane move seq {seq}"
        computed = checksum("", seq, ts, lane, leaf, created)
        move = checked(
            location,
            crc,
            computed,
            partial(LaneMove, seq=seq, timestamp=ts, lane=lane, leaf_id=leaf, created=created),
            scan.problems,
            order=seq,
        )
        if move is not None:
            items.append(move)
    for seq, ts, payload, crc in rows["facts"]:
        location = f"{where} fact seq {seq}"
        fact = checked(
            location,
            crc,
            checksum(payload, seq, ts),
            partial(_fact_set, seq, ts, payload),
            scan.problems,
            order=seq,
        )
        if fact is not None:
            items.append(fact)
    scan.items = sorted(items, key=lambda item: item.seq)
    scan.stored = _projections(rows)
    return scan


def _fact_set(seq: int, timestamp: int, payload: bytes) -> FactSet:
    return FactSet(seq=seq, timestamp=timestamp, fact=fact_adapter.validate_json(payload))


def _entry(where: str, row: tuple[Any, ...], problems: Findings) -> StoredEntry | None:
    seq, ts, lane, parent, payload, crc, entry_id, type_, custom = row
    location = f"{where} entry seq {seq}"
    stored = checked(
        location,
        crc,
        checksum(payload, seq, ts, lane, parent),
        lambda: StoredEntry(
            seq=seq,
            timestamp=ts,
            lane=lane,
            parent_id=parent,
            entry=entry_adapter.validate_json(payload),
        ),
        problems,
        order=seq,
    )
    if stored is None:
        return None
    entry = stored.entry
    columns = (entry_id, type_, custom)
    payload_says = (
        entry.id,
        entry.type,
        entry.custom_type if isinstance(entry, CustomEntry) else None,
    )
    if columns != payload_says:
        problems.append(
            Problem(
                location,
                f"columns (id, type, custom_type) {columns} disagree with the payload "
                f"{payload_says}",
            )
        )
    return stored


def _record(where: str, row: tuple[Any, ...], problems: Findings) -> StoredRecord | None:
    seq, ts, payload, crc, record_id, lane, run_id, type_, kind = row
    location = f"{where} record seq {seq}"
    stored = checked(
        location,
        crc,
        checksum(payload, seq, ts),
        lambda: StoredRecord(seq=seq, timestamp=ts, record=record_adapter.validate_json(payload)),
        problems,
        order=seq,
    )
    if stored is None:
        return None
    record = stored.record
    columns = (record_id, lane, run_id, type_, kind)
    payload_says = (
        record.id,
        record.lane,
        record_run_id(record),
        record.type,
        record.intent.kind if isinstance(record, OperationStarted) else None,
    )
    if columns != payload_says:
        problems.append(
            Problem(
                location,
                f"columns (id, lane, run_id, type, op_kind) {columns} disagree with the payload "
                f"{payload_says}",
            )
        )
    return stored


def _projections(rows: dict[str, list[Any]]) -> Projections | None:
    if not rows["session"]:
        return None
    *counters, name = rows["session"][0]
    open_operations: dict[str, list[tuple[int, str]]] = {}
    for lane, seq, run_id in rows["open"]:
        open_operations.setdefault(lane, []).append((seq, run_id))
    sums: dict[str, dict[str, TokenUsage]] = {"lane": {}, "entry": {}}
    for scope, key, *values in rows["sums"]:
        sums.setdefault(scope, {})[key] = usage_from_values(values)
    return Projections(
        lanes=dict(rows["lanes"]),
        open_operations=open_operations,
        lane_usage=sums["lane"],
        entry_usage=sums["entry"],
        stats=stats_from_counters(counters),
        name=name,
        labels=dict(rows["labels"]),
    )
