"""A model that polls a tool in a loop: the shape the run limits (turns, tokens) are for."""

from __future__ import annotations

from typing import Any

from harness_core.messages import AssistantMessage
from harness_core.models.scripted import tool_call
from harness_core.tools import Tool, ToolContext


def poll_tool(ran: list[str], result: str = "still pending") -> Tool:
    """``poll``: records each call's id in `ran` and answers `result`."""

    async def poll(args: Any, ctx: ToolContext) -> str:
        ran.append(ctx.tool_call_id)
        return result

    return Tool(name="poll", description="Poll a job", execute=poll)


def polling(turns: int) -> list[AssistantMessage]:
    """`turns` scripted answers, each calling ``poll`` once (call ids c0, c1, ...)."""
    return [tool_call("poll", {}, call_id=f"c{n}") for n in range(turns)]
