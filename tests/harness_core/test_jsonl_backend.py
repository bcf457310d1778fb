"""JSONL-only behaviour: torn tails, corrupt lines, the OS writer lock across processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness_core.errors import LeaseHeld, StoreCorrupted
from harness_core.storage.jsonl import JsonlSessionRepo
from harness_core.testing import ManualClock
from harness_core.testing.builders import operation_started, user_entry

ROOT = Path(__file__).resolve().parents[2]


async def _session_with_three_entries(directory: Path) -> Path:
    repo = JsonlSessionRepo(directory, clock=ManualClock())
    await repo.create("s1")
    lease = await repo.acquire_lease("s1", owner="w", ttl_ms=1000)
    storage = await repo.open("s1", lease=lease)
    for name in ("a", "b", "c"):
        await storage.append_entry(user_entry(name), "main")
    await repo.close()
    return directory / "s1.jsonl"


async def _ids(directory: Path) -> list[str]:
    repo = JsonlSessionRepo(directory)
    try:
        storage = await repo.open("s1")
        return [item.id for item in await storage.find_entries() if item.kind == "entry"][::-1]
    finally:
        await repo.close()


@pytest.mark.parametrize(
    "tail",
    [
        b'{"kind":"entry","seq":4,"timestamp":1,"la',  # died mid-line
        b'{"kind":"fact","seq":4,"timestamp":1,"fact":{"fact":"name","name":"x"}}',  # no newline
        b"\x00\x00\x00\x00",  # zeroed blocks after power loss, no newline
    ],
    ids=["half line", "complete but unterminated", "zeroed tail"],
)
async def test_a_torn_final_line_is_ignored_and_truncated_by_a_writer(tmp_path, tail) -> None:
    path = await _session_with_three_entries(tmp_path)
    intact = path.read_bytes()
    path.write_bytes(intact + tail)

    assert await _ids(tmp_path) == ["a", "b", "c"]
    assert path.read_bytes() == intact + tail, "a read-only open must never rewrite the file"

    repo = JsonlSessionRepo(tmp_path)
    lease = await repo.acquire_lease("s1", owner="w2", ttl_ms=1000)
    storage = await repo.open("s1", lease=lease)
    assert path.read_bytes() == intact, "a writer open truncates the unacknowledged tail"
    stored = await storage.append_entry(user_entry("d"), "main")
    assert (stored.seq, stored.parent_id) == (4, "c")
    await repo.close()
    assert await _ids(tmp_path) == ["a", "b", "c", "d"]


@pytest.mark.parametrize("writer", [False, True], ids=["reader", "writer"])
@pytest.mark.parametrize(
    "tail",
    [
        b"\x00\x00\x00\x00\n",
        b'{"kind":"entry","seq":4,"timestamp":1,"la\n',
        b"\n",
        b'{"kind":"fact","seq":4,"timestamp":1,"fact":{"fact":"name","name":1}}\n',
    ],
    ids=["garbage", "cut then terminated", "empty line", "undecodable item"],
)
async def test_a_complete_malformed_final_line_refuses_to_open(tmp_path, writer, tail) -> None:
    # A newline-terminated line was a whole write: it may have been acknowledged, so dropping it
    # could lose an acknowledged write. Only a tail without its newline was never acknowledged.
    path = await _session_with_three_entries(tmp_path)
    path.write_bytes(path.read_bytes() + tail)
    before = path.read_bytes()
    repo = JsonlSessionRepo(tmp_path)
    lease = await repo.acquire_lease("s1", owner="w", ttl_ms=1000) if writer else None
    with pytest.raises(StoreCorrupted) as caught:
        await repo.open("s1", lease=lease)
    assert caught.value.location == f"{path}:5"
    assert f"{path}:5" in str(caught.value)
    assert path.read_bytes() == before, "corruption is never repaired silently"
    await repo.close()


async def test_a_listing_ignores_an_unterminated_name_fact(tmp_path) -> None:
    path = await _session_with_three_entries(tmp_path)
    fact = b'{"kind":"fact","seq":4,"timestamp":1,"fact":{"fact":"name","name":"torn"}}'
    path.write_bytes(path.read_bytes() + fact)
    repo = JsonlSessionRepo(tmp_path)
    assert [m.name for m in await repo.list()] == [None], "the name was never acknowledged"
    path.write_bytes(path.read_bytes() + b"\n")
    assert [m.name for m in await repo.list()] == ["torn"]
    await repo.close()


@pytest.mark.parametrize("writer", [False, True], ids=["reader", "writer"])
async def test_a_malformed_interior_line_refuses_to_open_naming_the_line(tmp_path, writer) -> None:
    path = await _session_with_three_entries(tmp_path)
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2][:-5] + b"#####"
    path.write_bytes(b"\n".join(lines))
    before = path.read_bytes()
    repo = JsonlSessionRepo(tmp_path)
    lease = await repo.acquire_lease("s1", owner="w", ttl_ms=1000) if writer else None
    with pytest.raises(StoreCorrupted) as caught:
        await repo.open("s1", lease=lease)
    assert caught.value.code == "corrupt"
    assert caught.value.location == f"{path}:3"
    assert f"{path}:3" in str(caught.value)
    assert path.read_bytes() == before, "corruption is never repaired silently"
    await repo.close()


async def test_a_decodable_but_inconsistent_line_is_corruption(tmp_path) -> None:
    path = await _session_with_three_entries(tmp_path)
    lines = path.read_bytes().rstrip(b"\n").split(b"\n")
    item = json.loads(lines[2])
    item["parent_id"] = "nope"  # not the lane's leaf at that point
    lines[2] = json.dumps(item).encode()
    path.write_bytes(b"\n".join(lines) + b"\n")
    repo = JsonlSessionRepo(tmp_path)
    with pytest.raises(StoreCorrupted) as caught:
        await repo.open("s1")
    assert caught.value.location == f"{path}:3"
    await repo.close()


async def test_a_replayed_file_with_two_open_operations_reports_both(tmp_path) -> None:
    path = await _session_with_three_entries(tmp_path)
    first = operation_started("run1").model_dump(mode="json")
    second = operation_started("run2").model_dump(mode="json")
    with path.open("a") as handle:
        for seq, record in ((4, first), (5, second)):
            handle.write(
                json.dumps({"kind": "record", "seq": seq, "timestamp": 1, "record": record}) + "\n"
            )
    repo = JsonlSessionRepo(tmp_path)
    storage = await repo.open("s1")
    assert [r.id for r in await storage.find_open_operations("main", limit=2)] == ["run2", "run1"]
    await repo.close()


_OTHER_PROCESS = """
import asyncio, sys
from harness_core.errors import LeaseHeld
from harness_core.storage.jsonl import JsonlSessionRepo

async def main():
    repo = JsonlSessionRepo(sys.argv[1])
    try:
        lease = await repo.acquire_lease("s1", owner="other-process", ttl_ms=1000)
        storage = await repo.open("s1", lease=lease)
        from harness_core.testing.builders import user_entry
        stored = await storage.append_entry(user_entry("from-other"), "main")
        print("WROTE", stored.seq)
    except LeaseHeld as exc:
        print("HELD", exc.owner)
    finally:
        await repo.close()

asyncio.run(main())
"""


def _other_process(directory: Path) -> str:
    result = subprocess.run(
        [sys.executable, "-c", _OTHER_PROCESS, str(directory)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return result.stdout.strip()


async def test_a_second_writer_process_is_refused_until_the_lock_is_released(tmp_path) -> None:
    await _session_with_three_entries(tmp_path)
    repo = JsonlSessionRepo(tmp_path)
    lease = await repo.acquire_lease("s1", owner="this-process", ttl_ms=1000)
    storage = await repo.open("s1", lease=lease)
    assert _other_process(tmp_path) == "HELD this-process"
    await storage.append_entry(user_entry("mine"), "main")
    assert await repo.release_lease(lease)
    assert _other_process(tmp_path) == "WROTE 5"
    assert lease.token == 2
    again = await repo.acquire_lease("s1", owner="this-process", ttl_ms=1000)
    assert again.token == 4, "fencing tokens keep growing across processes"
    await repo.close()


async def test_a_second_repository_in_one_process_is_refused_too(tmp_path) -> None:
    await _session_with_three_entries(tmp_path)
    first, second = JsonlSessionRepo(tmp_path), JsonlSessionRepo(tmp_path)
    await first.acquire_lease("s1", owner="a", ttl_ms=1000)
    with pytest.raises(LeaseHeld) as caught:
        await second.acquire_lease("s1", owner="b", ttl_ms=1000)
    assert caught.value.owner == "a"
    await first.close()
    await second.acquire_lease("s1", owner="b", ttl_ms=1000)
    await second.close()


async def test_fsync_always_writes_are_readable(tmp_path) -> None:
    repo = JsonlSessionRepo(tmp_path, fsync="always")
    await repo.create("s1")
    lease = await repo.acquire_lease("s1", owner="w", ttl_ms=1000)
    storage = await repo.open("s1", lease=lease)
    await storage.append_entry(user_entry("a"), "main")
    await repo.close()
    assert await _ids(tmp_path) == ["a"]


async def test_the_lease_holder_of_a_lock_another_repo_holds(tmp_path: Path) -> None:
    """The lock file names its holder: a second repository (another process) reads it."""
    holder_repo = JsonlSessionRepo(tmp_path, clock=ManualClock())
    other = JsonlSessionRepo(tmp_path, clock=ManualClock())
    try:
        await holder_repo.create("s1")
        assert await other.lease_holder("s1") is None
        lease = await holder_repo.acquire_lease("s1", owner="worker-a", ttl_ms=1000)
        seen = await other.lease_holder("s1")
        assert seen is not None and seen.owner == "worker-a" and seen.expires_at_ms is None
        assert await holder_repo.release_lease(lease)
        assert await other.lease_holder("s1") is None
    finally:
        await holder_repo.close()
        await other.close()
