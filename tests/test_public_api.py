"""Each package's __all__ is sorted (case-folded) and resolves; queries are keyword-only."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

MODULES = [
    "harness_core",
    "harness_core.session",
    "harness_core.errors",
    "harness_core.messages",
    "harness_core.storage",
    "harness_core.testing",
    "config",
    "gateway",
    "adapters",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_is_sorted_and_resolves(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert exported == sorted(exported, key=str.casefold)
    assert len(set(exported)) == len(exported)
    missing = [item for item in exported if not hasattr(module, item)]
    assert missing == []


def test_query_dataclasses_are_keyword_only_and_frozen() -> None:
    session = importlib.import_module("harness_core.session")
    for name in ("EntryQuery", "BranchQuery", "RecordQuery"):
        cls = getattr(session, name)
        params = cls.__dataclass_params__
        assert params.frozen
        assert all(field.kw_only for field in dataclasses.fields(cls))
