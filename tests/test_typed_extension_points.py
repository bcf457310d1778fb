"""Hooks and event listeners are typed per hook / per event type: a type checker catches a
handler written for the wrong one (checked with mypy on a user's program)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mypy import api

ROOT = Path(__file__).resolve().parent.parent

PROGRAM = """
from harness_core import (
    AfterToolEvent, AgentHarness, BeforeToolEvent, BeforeToolResult, ToolEnd, ToolStart,
)


async def policy(event: BeforeToolEvent) -> BeforeToolResult | None:
    return None


async def wrong_hook(event: BeforeToolEvent) -> BeforeToolResult | None:
    return None


def on_tool_end(event: ToolEnd) -> None:
    print(event.result)


def register(harness: AgentHarness) -> None:
    harness.hooks.on("before_tool", policy)
    harness.hooks.on("after_tool", wrong_hook)  # WRONG: after_tool takes an AfterToolEvent
    harness.events.on("tool_end", on_tool_end)
    harness.events.on("tool_start", on_tool_end)  # WRONG: a ToolStart is not a ToolEnd
    harness.events.on("tool_end", lambda event: print(event.no_such_field))  # WRONG
    harness.events.on(None, lambda event: print(event.type))
    harness.hooks.on_any("after_tool", wrong_hook)  # computed names: deliberately unchecked
"""


# mypy in the test's process: seconds with the suite's warm cache, over a minute on a loaded machine
@pytest.mark.timeout(300)
def test_a_wrong_handler_is_a_type_error_and_a_right_one_is_not(tmp_path: Path) -> None:
    program = tmp_path / "user_program.py"
    program.write_text(PROGRAM)
    # the project's configuration (strict) and its cache: harness_core is already checked there
    report, errors, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), str(program)])
    assert status == 1, report + errors
    flagged = sorted(int(line.split(":")[1]) for line in report.splitlines() if ": error:" in line)
    wrong = [n for n, text in enumerate(PROGRAM.splitlines(), start=1) if "# WRONG" in text]
    assert flagged == wrong, report
