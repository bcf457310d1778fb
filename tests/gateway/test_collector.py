"""`tune_collector`: the serving process freezes its start-up heap, collects young objects rarer."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from gateway.collector import tune_collector


@pytest.fixture
def collector_restored() -> Iterator[None]:
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("collector_restored")
def test_it_freezes_the_heap_and_raises_only_the_young_threshold() -> None:
    _, middle, old = gc.get_threshold()
    gc.unfreeze()
    tuned = tune_collector(20_000)
    assert tuned is not None
    assert gc.get_threshold() == tuned.thresholds == (20_000, middle, old)
    assert tuned.frozen == gc.get_freeze_count() > 10_000  # the modules this test process loaded


@pytest.mark.usefixtures("collector_restored")
def test_it_frees_the_start_up_garbage_before_freezing() -> None:
    gc.unfreeze()

    class Cycle:
        def __init__(self) -> None:
            self.me = self

    Cycle()  # unreachable, kept alive only by its own reference until a collection
    found: list[int] = []
    gc.callbacks.append(callback := lambda phase, info: found.append(info["collected"]))
    try:
        tune_collector(20_000)
    finally:
        gc.callbacks.remove(callback)
    assert not any(isinstance(o, Cycle) for o in gc.get_objects())
    assert sum(found) >= 1


@pytest.mark.usefixtures("collector_restored")
def test_zero_leaves_the_collector_as_it_is() -> None:
    gc.unfreeze()
    before = gc.get_threshold()
    assert tune_collector(0) is None
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
