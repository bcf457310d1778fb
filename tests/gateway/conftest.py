"""Fixtures the gateway's tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.broker import open_broker
from gateway.broker.contract import Broker


@pytest.fixture
async def sqlite_broker(tmp_path: Path) -> AsyncIterator[Broker]:
    """A real SQLite broker of the test's own."""
    opened = open_broker(f"sqlite:///{tmp_path}/broker.db")
    yield opened
    await opened.close()
