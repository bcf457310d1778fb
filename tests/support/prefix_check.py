"""Checks that a store reopened after a crash is a valid prefix holding every acknowledged write."""

from __future__ import annotations

from harness_core.session.contract import SessionStorage
from harness_core.session.types import StoredEntry


async def assert_valid_prefix(storage: SessionStorage, acked: dict[str, int]) -> int:
    """Every acked id is present with its seq; seqs run 1..n; parents chain per lane. Returns n."""
    log = await storage.get_log()
    assert [item.seq for item in log] == list(range(1, len(log) + 1)), "seq has a gap or a repeat"
    by_id = {getattr(item, "id", None): item for item in log}
    missing = {i: s for i, s in acked.items() if i not in by_id or by_id[i].seq != s}
    assert not missing, f"acknowledged writes lost: {sorted(missing.items())[:5]}"
    leaves: dict[str, str | None] = {"main": None}
    for item in log:
        if isinstance(item, StoredEntry):
            assert item.lane is not None
            assert item.parent_id == leaves[item.lane], (
                f"entry {item.id} does not chain to its lane"
            )
            leaves[item.lane] = item.id
        elif item.kind == "lane":
            leaves[item.lane] = item.leaf_id
    lanes = {pointer.lane: pointer.leaf_id for pointer in await storage.get_lanes()}
    assert lanes == leaves, "lane leaves disagree with the log"
    stats = await storage.get_stats()
    assert stats.last_seq == len(log)
    return len(log)
