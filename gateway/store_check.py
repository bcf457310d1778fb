"""``gateway store check``: the session store's fsck, one line per problem and a summary.

Every session (or the ones named) is read the thorough way (`harness_core.storage.fsck`):
each stored item's checksum verified and the item validated in full, the columns kept beside
it compared with it, the log replayed, and every projection the backend keeps compared with
what the log gives. Nothing is written. Exit status: 0 when clean, 4 when a problem was found
(as fsck's "errors left uncorrected"), a SQLite file whose pages SQLite itself finds damaged
included; a store that cannot be opened at all (no such file, not a SQLite file, a file it may
not read) is the usual one-line error and status 1.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness_core import SessionRepo
from harness_core.storage.fsck import Problem, check_store

__all__ = ["PROBLEMS_FOUND", "store_check"]

PROBLEMS_FOUND = 4


async def store_check(repo: SessionRepo, session_ids: Sequence[str], out: list[str]) -> int:
    """Check the store (every session, or `session_ids`); lines go to `out`; the exit status."""

    def found(problem: Problem) -> None:
        out.append(f"problem: {problem}")

    report = await check_store(repo, session_ids or None, found=found)
    sessions = f"{report.sessions} session{'' if report.sessions == 1 else 's'}"
    items = f"{report.items} item{'' if report.items == 1 else 's'}"
    if report.clean:
        out.append(f"checked {sessions}, {items}: clean")
        return 0
    count = len(report.problems)
    out.append(f"checked {sessions}, {items}: {count} problem{'' if count == 1 else 's'}")
    return PROBLEMS_FOUND
