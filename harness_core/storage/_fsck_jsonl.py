"""fsck's reading of a JSONL store: every line of a session file, checksum verified, in full.

A JSONL store keeps no projections (opening replays the file), so its check is the lines: each
checksum, each item decoded with full validation, then the replay `fsck` does for every store.
A final line without its newline was never acknowledged (a writer's open cuts it): not a problem.
"""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path

from harness_core.session.codec import checksum, log_item_adapter
from harness_core.storage.fsck import Problem, Scan, checked
from harness_core.storage.jsonl import (
    _SEAL,
    _SEALED_AT,
    JsonlSessionRepo,
    _LeftOut,
    _session_header,
)

__all__ = ["directory_problems", "scan_jsonl"]


async def directory_problems(repo: JsonlSessionRepo) -> list[Problem]:
    """The session files no session is read from: a bad header, none, or another session's.

    The store lists and opens ``<id>.jsonl`` only, so such a file was left out of the listing
    in silence (a copy had been listed twice, a bad header failed the whole listing).
    """
    return await asyncio.to_thread(_directory, repo.directory)


def _directory(directory: Path) -> list[Problem]:
    problems: list[Problem] = []
    for path in sorted(directory.glob("*.jsonl")) if directory.is_dir() else ():
        try:
            with open(path, "rb") as handle:
                first = handle.readline()
        except OSError as exc:
            problems.append(Problem(str(path), f"cannot be read: {exc.strerror or exc}"))
            continue
        found = _session_header(first, path)
        if isinstance(found, _LeftOut):
            problems.append(Problem(found.location, found.why))
        elif found is None:  # `ask` and `serve` refuse the store for it; it checked clean
            problems.append(
                Problem(
                    f"{path}:1",
                    "no complete header line: the file was emptied or cut short (its session "
                    "is lost), unless a session is being created this moment",
                )
            )
    return problems


async def scan_jsonl(repo: JsonlSessionRepo, session_id: str) -> Scan:
    """Read and check a session's file (off the event loop)."""
    path = repo.directory / f"{session_id}.jsonl"
    return await asyncio.to_thread(_scan, path)


def _scan(path: Path) -> Scan:
    scan = Scan()
    try:
        raw = path.read_bytes()
    except OSError as exc:
        scan.problems.append(Problem(str(path), f"cannot be read: {exc.strerror or exc}"))
        return scan
    lines = raw.split(b"\n")
    lines.pop()  # b"" after the last newline, or a torn tail
    for number, line in enumerate(lines[1:], start=2):
        location = f"{path}:{number}"
        stored: int | None = None
        encoded = line
        if line.startswith(_SEAL):
            digits = line[len(_SEAL) : _SEALED_AT - 2]
            try:
                stored = int(digits, 16)
            except ValueError:
                scan.problems.append(Problem(location, f"malformed checksum {digits!r}"))
            encoded = b"{" + line[_SEALED_AT:]
        item = checked(
            location,
            stored,
            checksum(encoded),
            partial(log_item_adapter.validate_json, encoded),
            scan.problems,
            order=number,
        )
        if item is not None:
            scan.items.append(item)
    return scan
