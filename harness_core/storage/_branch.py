"""Pure path selection shared by every backend: what a branch query keeps, given a walk of the path.

Backends only differ in how they walk a path (a dict, SQLite point lookups, a Redis script in
batches); the query semantics live here once, so they cannot drift between backends. A scan is
fed nodes from the start toward the root and says when it has seen enough.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple, Protocol

from harness_core.errors import SessionError
from harness_core.session.types import BranchQuery, EntryQuery

__all__ = ["BranchNode", "BranchScan", "PathScan", "SinceScan", "drive", "entry_matches"]


class BranchNode(NamedTuple):
    """What a path walk needs of an entry."""

    id: str
    parent_id: str | None
    seq: int
    type: str
    custom_type: str | None


def entry_matches(query: EntryQuery, type_: str, custom_type: str | None, seq: int) -> bool:
    """Whether an entry passes a query's type, custom-type and seq-window filters."""
    if query.custom_type is not None:
        if type_ != "custom" or custom_type != query.custom_type:
            return False
    elif query.type is not None and type_ != query.type:
        return False
    if query.after_seq is not None and seq <= query.after_seq:
        return False
    return not (query.before_seq is not None and seq >= query.before_seq)


class PathScan(Protocol):
    """A consumer of a path walk (start toward the root)."""

    def feed(self, node: BranchNode) -> bool:
        """Take the next node; return False once no further node can change the result."""
        ...

    def result(self) -> list[BranchNode]:
        """The selected nodes, after the walk ended (at the root or when `feed` said stop)."""
        ...


class BranchScan:
    """A `BranchQuery` as a scan (see `BranchQuery` for the semantics)."""

    def __init__(self, query: BranchQuery) -> None:
        self._query = query
        self._kept: list[BranchNode] = []
        self._path: list[BranchNode] = []

    def _take(self, node: BranchNode) -> bool:
        q = self._query
        if entry_matches(q, node.type, node.custom_type, node.seq):
            self._kept.append(node)
            if q.limit is not None and len(self._kept) >= q.limit:
                return False
        return not (node.type == q.stop_at_type or node.id == q.stop_at_id)

    def feed(self, node: BranchNode) -> bool:
        """Newest-first scans decide as they go; oldest-first scans need the whole path."""
        q = self._query
        if q.order == "oldest_first":
            self._path.append(node)
            return True
        if q.after_seq is not None and node.seq <= q.after_seq:
            return False  # path order is seq order: everything further is older still
        return self._take(node)

    def result(self) -> list[BranchNode]:
        """The selected nodes in query order."""
        if self._query.order == "oldest_first":
            for node in reversed(self._path):
                if not self._take(node):
                    break
            self._path = []
        return self._kept


class SinceScan:
    """A lane's path from its leaf back to `after_id` (exclusive), returned oldest first.

    `after_seq` is the seq of `after_id` (0 for the root). Because path order is seq order, the
    scan ends as soon as it passes below `after_seq`; if `after_id` was not met by then (or by
    the root) it is not on the path and ``SessionError("invalid_query")`` is raised.
    """

    def __init__(self, after_id: str | None, after_seq: int) -> None:
        self._after_id = after_id
        self._after_seq = after_seq
        self._kept: list[BranchNode] = []
        self._met = after_id is None

    def feed(self, node: BranchNode) -> bool:
        """Keep nodes until the anchor."""
        if node.id == self._after_id:
            self._met = True
            return False
        if node.seq <= self._after_seq:
            return False
        self._kept.append(node)
        return True

    def result(self) -> list[BranchNode]:
        """The nodes after the anchor, oldest first."""
        if not self._met:
            raise SessionError(
                "invalid_query", f"entry {self._after_id!r} is not on the lane's path"
            )
        return self._kept[::-1]


def drive(scan: PathScan, walk: Iterable[BranchNode]) -> list[BranchNode]:
    """Feed a (lazy) walk to a scan until it stops wanting nodes; return its result."""
    for node in walk:
        if not scan.feed(node):
            break
    return scan.result()
