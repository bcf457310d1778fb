"""The first turn after a restore reads the lane's path once: the configuration (model, thinking
level, active tools) and the capabilities come from the context window it loads anyway.

Only a path with a compaction needs more: a walk of its older part, for the configuration
entries made before the compaction.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from harness_core import CapabilityState, CompactionSettings, ModelRef, Ok
from harness_core.models.scripted import text
from harness_core.session.types import BranchQuery, StoredEntry
from tests.support.harness_kit import Kit, make_kit

OTHER = ModelRef(provider="scripted", model_id="other")


def count_walks(kit: Kit) -> list[BranchQuery]:
    """Record every path walk the reopened harness makes (a read: counted, nothing changed)."""
    walks: list[BranchQuery] = []
    storage: Any = kit.storage
    walk = storage.find_entries_on_branch

    async def counted(query: BranchQuery) -> tuple[StoredEntry, ...]:
        walks.append(query)
        return await walk(query)  # type: ignore[no-any-return]

    storage.find_entries_on_branch = counted
    return walks


async def configured(backend: str, tmp_path: Path) -> Kit:
    kit = await make_kit(
        backend,
        tmp_path,
        [text("one"), text("two"), text("summary")],
        compaction=CompactionSettings(keep_recent_tokens=1),
    )
    await kit.harness.set_thinking_level("high")
    assert isinstance(await kit.harness.prompt("first"), Ok)
    await kit.harness.set_model(OTHER)
    await kit.harness.set_capability("notes", _capability("kept"))
    assert isinstance(await kit.harness.prompt("second"), Ok)
    return kit


def _capability(text_: str) -> CapabilityState:
    return CapabilityState(version="1", data={"text": text_})


async def test_the_first_turn_after_a_restore_walks_the_path_once(
    backend: str, tmp_path: Path
) -> None:
    kit = await configured(backend, tmp_path)
    fresh = await kit.reopen(script=[text("three")])
    walks = count_walks(fresh)
    assert isinstance(await fresh.harness.prompt("third"), Ok)
    request = fresh.model.requests[-1]
    assert (request.model.model_id, request.thinking_level) == ("other", "high")
    state = await fresh.harness.export_state()
    assert state.capabilities["notes"].data == {"text": "kept"}
    assert len(state.messages) == 6
    assert len(walks) == 1, walks  # the context window, nothing else
    assert walks[0].stop_at_type == "compaction"


async def test_configuration_made_before_a_compaction_survives_a_restore(
    backend: str, tmp_path: Path
) -> None:
    kit = await configured(backend, tmp_path)
    assert isinstance(await kit.harness.compact(), Ok)
    fresh = await kit.reopen(script=[text("three")])
    walks = count_walks(fresh)
    assert (await fresh.harness.get_model()) == OTHER
    assert await fresh.harness.get_thinking_level() == "high"
    assert (await fresh.harness.export_state()).capabilities["notes"].data == {"text": "kept"}
    # the window (from the compaction), then the older part for each kind of setting
    assert walks[0].stop_at_type == "compaction"
    assert {w.type for w in walks[1:]} >= {"model_change", "thinking_level_change"}
    assert isinstance(await fresh.harness.prompt("third"), Ok)
    request = fresh.model.requests[-1]
    assert (request.model.model_id, request.thinking_level) == ("other", "high")


async def test_a_runs_final_message_comes_from_the_lanes_context_not_a_read(
    backend: str, tmp_path: Path
) -> None:
    kit = await make_kit(backend, tmp_path, [text("one"), text("two")])
    assert isinstance(await kit.harness.prompt("first"), Ok)  # loads the context window
    storage: Any = kit.storage
    point_reads: list[str] = []
    read = storage.get_entry

    async def counted(entry_id: str) -> StoredEntry | None:
        point_reads.append(entry_id)
        return await read(entry_id)  # type: ignore[no-any-return]

    storage.get_entry = counted
    result = await kit.harness.prompt("second")
    assert isinstance(result, Ok)
    assert result.value.final_message is not None
    assert result.value.final_message.content[0].text == "two"  # type: ignore[union-attr]
    assert point_reads == []


_FROM_LEAF = [
    BranchQuery(start="", custom_type="app.profile", limit=1),
    BranchQuery(start="", custom_type="app.absent", limit=1),
    BranchQuery(start="", type="message", limit=2),
    BranchQuery(start="", type="message", order="oldest_first"),
    BranchQuery(start="", stop_at_type="compaction"),
    BranchQuery(start=""),
]


async def test_a_path_query_from_the_leaf_is_answered_by_the_lanes_window(
    backend: str, tmp_path: Path
) -> None:
    """D274: the window the lane keeps in memory is the path back to the root here, so every
    query from the leaf is answered from it, exactly as the store answers it."""
    kit = await make_kit(backend, tmp_path, [text("one"), text("two")])
    await kit.harness.session.append_custom_entry("app.profile", {"n": 1})
    assert isinstance(await kit.harness.prompt("first"), Ok)  # loads the context window
    await kit.harness.session.append_custom_entry("app.profile", {"n": 2})
    assert isinstance(await kit.harness.prompt("second"), Ok)
    walks = count_walks(kit)
    answers = [await kit.harness.session.find_entries_on_branch(q) for q in _FROM_LEAF]
    assert walks == []
    leaf = (await kit.harness.session.find_entries_on_branch(BranchQuery(start="", limit=1)))[0]
    for query, answer in zip(_FROM_LEAF, answers, strict=True):
        stored = await kit.storage.find_entries_on_branch(dataclasses.replace(query, start=leaf.id))
        assert answer == stored, query
    assert answers[0][0].entry.data == {"n": 2}  # type: ignore[union-attr]
    assert answers[1] == ()


async def test_a_query_that_reaches_past_the_window_reads_the_store(
    backend: str, tmp_path: Path
) -> None:
    kit = await configured(backend, tmp_path)  # compacted: the window starts at the compaction
    assert isinstance(await kit.harness.compact(), Ok)
    assert isinstance(await kit.harness.prompt("third"), Ok)
    walks = count_walks(kit)
    older = await kit.harness.session.find_entries_on_branch(
        BranchQuery(start="", type="model_change", limit=1)
    )
    assert len(walks) == 1 and older and older[0].entry.type == "model_change"
    inside = await kit.harness.session.find_entries_on_branch(
        BranchQuery(start="", type="message", limit=1)
    )
    assert len(walks) == 1 and inside[0].entry.type == "message"  # the newest: in the window
