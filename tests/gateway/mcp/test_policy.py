"""Annotations -> declarations: the D199 table over every combination of hints, trust, override."""

from __future__ import annotations

import itertools

import pytest
from mcp_types import ToolAnnotations

from gateway.mcp.policy import Declarations, declarations
from gateway.mcp.settings import McpToolOverride
from harness_core.tools import Replay

HINT = (None, False, True)
COMBINATIONS = list(itertools.product(HINT, HINT, HINT))


def _expected(
    read_only: bool | None, idempotent: bool | None, destructive: bool | None
) -> tuple[Replay, bool]:
    """The table of docs/mcp.md, row by row (written out, not computed the same way)."""
    if read_only:
        return ("safe", False)
    if idempotent and destructive is False:
        return ("safe", False)
    if idempotent:
        return ("safe", True)
    if destructive is False:
        return ("never", False)
    return ("never", True)


@pytest.mark.parametrize(("read_only", "idempotent", "destructive"), COMBINATIONS)
@pytest.mark.parametrize("trusted", [True, False])
def test_the_table(
    read_only: bool | None, idempotent: bool | None, destructive: bool | None, trusted: bool
) -> None:
    hints = ToolAnnotations(
        read_only_hint=read_only, idempotent_hint=idempotent, destructive_hint=destructive
    )
    replay, approval = _expected(read_only, idempotent, destructive)
    if not trusted:
        replay = "never"  # an untrusted server cannot grant a replay; its approvals stand
    assert declarations(hints, trusted=trusted) == Declarations(replay, approval)


@pytest.mark.parametrize("trusted", [True, False])
def test_no_annotations_is_never_replayed_and_asks(trusted: bool) -> None:
    assert declarations(None, trusted=trusted) == Declarations("never", True)


@pytest.mark.parametrize(("read_only", "idempotent", "destructive"), COMBINATIONS)
@pytest.mark.parametrize("trusted", [True, False])
@pytest.mark.parametrize("replay", [None, "never", "safe"])
@pytest.mark.parametrize("approval", [None, False, True])
def test_an_override_always_wins(
    read_only: bool | None,
    idempotent: bool | None,
    destructive: bool | None,
    trusted: bool,
    replay: str | None,
    approval: bool | None,
) -> None:
    hints = ToolAnnotations(
        read_only_hint=read_only, idempotent_hint=idempotent, destructive_hint=destructive
    )
    plain = declarations(hints, trusted=trusted)
    override = McpToolOverride.model_validate({"replay": replay, "approval": approval})
    got = declarations(hints, trusted=trusted, override=override)
    assert got.replay == (replay or plain.replay)
    assert got.requires_approval == (plain.requires_approval if approval is None else approval)


def test_an_untrusted_read_only_hint_removes_no_care_a_trusted_one_does() -> None:
    hints = ToolAnnotations(read_only_hint=True)
    assert declarations(hints, trusted=True) == Declarations("safe", False)
    assert declarations(hints, trusted=False) == Declarations("never", False)
