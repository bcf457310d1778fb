"""Records never shape the tree: strip every record from a session and it reads the same.

The op log (records) says what an operation was doing; the tree (entries, lane moves) is the
conversation. A lane's context must come from the tree alone, so a session whose records are
all removed and which is imported again holds the same context on every lane, every lane is
idle (nothing is open without records), and a new prompt runs on it. Checked on the final log of
every canonical trajectory (tool batches, retries, steering, aborts, compaction, navigation,
approvals, deferred requests).
"""

from __future__ import annotations

import pytest

from harness_core.harness import AgentHarness
from harness_core.ids import SequentialIds
from harness_core.models.scripted import ScriptedModel, text
from harness_core.options import AgentHarnessOptions
from harness_core.result import Ok
from harness_core.session.types import LogItem, SessionMetadata, StoredRecord
from harness_core.storage.memory import MemorySessionRepo
from harness_core.testing import ManualClock
from harness_core.testing.trajectories import MODEL, SCENARIOS, Scenario, trajectory


def without_records(log: tuple[LogItem, ...]) -> list[LogItem]:
    """The log with every record dropped and the rest renumbered (seq has no gaps)."""
    kept = [item for item in log if not isinstance(item, StoredRecord)]
    return [item.model_copy(update={"seq": n}) for n, item in enumerate(kept, start=1)]


async def opened(items: list[LogItem] | tuple[LogItem, ...], answer: str) -> AgentHarness:
    repo = MemorySessionRepo(clock=ManualClock())
    await repo.import_session(SessionMetadata(id="s", created_at=1), items)
    lease = await repo.acquire_lease("s", owner="t", ttl_ms=10**9)
    harness, _ = await AgentHarness.create(
        AgentHarnessOptions(
            storage=await repo.open("s", lease=lease),
            model_client=ScriptedModel(script=[text(answer)]),
            model=MODEL,
            clock=ManualClock(),
            ids=SequentialIds("t-"),
        )
    )
    return harness


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_a_session_without_its_records_has_the_same_context_and_idle_lanes(
    scenario: Scenario,
) -> None:
    log = await trajectory(scenario)
    assert any(isinstance(item, StoredRecord) for item in log)
    original = await opened(log, "unused")
    stripped = await opened(without_records(log), "after the strip")
    names = [info.name for info in await original.lanes()]
    assert names == [info.name for info in await stripped.lanes()]
    for info in await stripped.lanes():
        assert info.status == "idle", info
    compared = 0
    for name in names:
        lane = await original.lane(name)
        assert lane is not None
        if (await lane.info()).status not in ("idle", "failed"):  # "failed": idle, its last failed
            continue  # an open operation's lane: its context is mid-operation by design
        again = await stripped.lane(name)
        assert again is not None
        before, after = await lane.export_state(), await again.export_state()
        assert after.messages == before.messages, name
        compared += 1
    for name in names:
        lane = await stripped.lane(name)
        assert lane is not None
        result = await lane.prompt("and now?")
        assert isinstance(result, Ok) and result.value.kind == "completed", result
        break  # one lane answers (the model scripts one answer); the others are idle
    await original.close()
    await stripped.close()
    if scenario.decide is None and not scenario.interrupted:
        assert compared, "no idle lane compared"
