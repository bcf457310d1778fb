"""The first turn after a restore reads the lane's path once: the configuration (model, thinking
level, active tools) and the capabilities come from the context window it loads anyway.

Only a path with a compaction needs more: a walk of its older part, for the configuration
entries made before the compaction.
"""

from __future__ import annotations

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
