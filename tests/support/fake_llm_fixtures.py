"""The fake model provider as fixtures: `fake`, a running `FakeLLM`, and `model_requests`.

The suite forbids model requests (`tests/conftest.py`); a module that talks to the local fake
opts in for its tests with ``pytestmark = pytest.mark.usefixtures("model_requests")``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from tests.support.fake_llm import FakeLLM, allow_model_requests


@pytest.fixture
async def fake() -> AsyncIterator[FakeLLM]:
    """A `FakeLLM` server on a free port, for one test."""
    async with FakeLLM() as server:
        yield server


@pytest.fixture
def model_requests() -> Iterator[None]:
    """Model requests allowed for one test (they go to the local fake, never to a provider)."""
    with allow_model_requests():
        yield
