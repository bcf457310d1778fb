"""Pure path selection shared by every backend: what a branch query keeps, given a walk of the path.

Backends only differ in how they walk a path (a dict, SQLite point lookups, a Redis script);
the query semantics live here once, so they cannot drift between backends.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

from harness_core.errors import SessionError
from harness_core.session.types import BranchQuery, EntryQuery

__all__ = ["BranchNode", "entry_matches", "select_on_branch", "take_since"]


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


def select_on_branch(walk: Iterable[BranchNode], query: BranchQuery) -> list[BranchNode]:
    """Apply `query` to a walk of the path that yields nodes from `query.start` toward the root.

    The walk is consumed lazily for ``newest_first`` (a limit, a stop or the seq window end it
    early) and entirely for ``oldest_first``.
    """
    ordered: Iterable[BranchNode]
    ordered = walk if query.order == "newest_first" else reversed(list(walk))
    kept: list[BranchNode] = []
    for node in ordered:
        if (
            query.order == "newest_first"
            and query.after_seq is not None
            and node.seq <= query.after_seq
        ):
            break  # path order is seq order: everything further is older still
        if entry_matches(query, node.type, node.custom_type, node.seq):
            kept.append(node)
            if query.limit is not None and len(kept) >= query.limit:
                break
        if node.type == query.stop_at_type or node.id == query.stop_at_id:
            break
    return kept


def take_since(
    walk: Iterator[BranchNode], after_id: str | None, after_seq: int
) -> list[BranchNode]:
    """Collect a walk from a leaf back to `after_id` (exclusive), returned oldest first.

    `after_seq` is the seq of `after_id` (0 for the root). Because path order is seq order, the
    walk stops as soon as it passes below `after_seq`; if `after_id` was not met by then it is
    not on the path and ``SessionError("invalid_query")`` is raised.
    """
    kept: list[BranchNode] = []
    for node in walk:
        if node.id == after_id:
            break
        if node.seq <= after_seq:
            raise SessionError("invalid_query", f"entry {after_id!r} is not on the lane's path")
        kept.append(node)
    else:
        if after_id is not None:
            raise SessionError("invalid_query", f"entry {after_id!r} is not on the lane's path")
    kept.reverse()
    return kept
