"""A lane's token budget as an operator set it: a broker mark over its profile's (D295).

A thread that has spent its budget (D294) is told to ask an operator; `gateway ops budget`
sets that one lane's budget (more, or less) without touching its profile, and `--reset` gives
it its profile's again. The setting is a broker mark, so every process reads the same one;
the worker reads it when a message or an operator's action starts a run on a lane whose
thread has a budget at all (a lane without one never reads it), and the operator API shows
the budget in force. Setting it is idempotent (a value, not an increment): a repeated call
changes nothing.
"""

from __future__ import annotations

import json

from pydantic import Field, ValidationError

from config.profiles import MAX_TOKEN_BUDGET
from gateway.broker.contract import Broker, Marks, NewAuditEvent
from harness_core.frozen import Frozen

__all__ = [
    "MAX_BUDGET",
    "BudgetSetting",
    "budget_mark",
    "lane_budget",
    "read_budget",
    "set_budget",
]

MAX_BUDGET = MAX_TOKEN_BUDGET
"""The most tokens a budget may be: the settings' bound."""


class BudgetSetting(Frozen):
    """An operator's budget for one lane: who set it, when and why."""

    tokens: int | None = Field(default=None, ge=1, le=MAX_BUDGET)
    """The lane's budget; None: its profile's (the setting was reset)."""
    by: str
    at_ms: int
    reason: str | None = None


def budget_mark(session: str, lane: str) -> str:
    """The broker mark that holds a lane's budget setting."""
    return f"ops:budget:{session}:{lane}"


async def read_budget(marks: Marks, session: str, lane: str) -> BudgetSetting | None:
    """The lane's budget setting in force (None: none, or reset to the profile's).

    A mark that does not parse counts as none: the profile's budget holds.
    """
    return _parsed(await marks.get(budget_mark(session, lane)))


async def set_budget(
    broker: Broker,
    session: str,
    lane: str,
    tokens: int | None,
    *,
    by: str,
    now_ms: int,
    reason: str | None = None,
) -> tuple[BudgetSetting | None, bool]:
    """Set the lane's budget to `tokens` (None: back to its profile's), audited.

    Returns the setting in force and whether the call changed it. A compare-and-set loop, so
    two operators setting it at once leave one of their values, never a mix.
    """
    name = budget_mark(session, lane)
    setting = BudgetSetting(tokens=tokens, by=by, at_ms=now_ms, reason=reason)
    while True:
        raw = await broker.marks.get(name)
        current = _parsed(raw)
        if (current.tokens if current else None) == tokens:
            return current, False
        if await broker.marks.put(name, setting.model_dump_json(), expect=raw):
            break
    await broker.audit.record(
        NewAuditEvent(
            actor=by,
            action="budget set" if tokens is not None else "budget reset",
            session=session,
            lane=lane,
            outcome="changed",
            details={"tokens": tokens, "reason": reason},
        )
    )
    return (setting if tokens is not None else None), True


def _parsed(raw: str | None) -> BudgetSetting | None:
    if not raw:
        return None
    try:
        found = BudgetSetting.model_validate(json.loads(raw))
    except (ValueError, ValidationError):
        return None
    return found if found.tokens is not None else None


async def lane_budget(marks: Marks, base: int | None, session: str, lane: str) -> int | None:
    """The lane's budget in force: an operator's setting over `base`, its profile's.

    None when its thread has no budget: a setting applies only where a budget does.
    """
    if base is None:
        return None
    found = await read_budget(marks, session, lane)
    return found.tokens if found is not None and found.tokens is not None else base
