"""A file store's files are its owner's alone (D343)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness_core.storage import open_repo
from harness_core.testing.builders import user_entry


@pytest.mark.parametrize("scheme", ["sqlite", "jsonl"])
async def test_a_file_store_is_its_owner_s_alone(tmp_path: Path, scheme: str) -> None:
    """A session holds every conversation, tool argument and supplied result: the files were
    the umask's 0644 (any local user could read them), the directory 0755 (D343)."""
    where = tmp_path / "store"
    repo = open_repo(f"{scheme}:///{where}/s.db" if scheme == "sqlite" else f"jsonl:///{where}")
    await repo.create("s1")
    lease = await repo.acquire_lease("s1", owner="w", ttl_ms=60_000)
    storage = await repo.open("s1", lease=lease)
    await storage.append_entry(user_entry("u1"), "main")
    await storage.close()
    await repo.close()
    modes = {p.name: p.stat().st_mode & 0o777 for p in where.iterdir()}
    assert modes and set(modes.values()) == {0o600}, modes
    assert where.stat().st_mode & 0o777 == 0o700
