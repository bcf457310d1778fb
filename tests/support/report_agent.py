"""A gateway plugin for the files-out tests: a tool that returns a CSV, and a model that calls it.

A message holding ``export`` makes the model call ``export_tickets`` (which returns `CSV` as
``tickets.csv``) and then answer ``Here is the export.``; any other message is answered
``ok`` with no tool, so a later run's reply carries no file.
"""

from __future__ import annotations

from harness_core import (
    AssistantMessage,
    ModelRef,
    ModelRequest,
    ScriptedModel,
    TextPart,
    Tool,
    ToolContext,
    ToolFile,
    ToolOutput,
    ToolResultMessage,
    UserMessage,
    message_text,
    tool,
)
from harness_core.models.scripted import text, tool_call

MODEL = ModelRef(provider="scripted", model_id="report-test")
CSV = b"ticket,status\n1,open\n2,closed\n"
ANSWER = "Here is the export."
calls: list[str] = []
"""The idempotency key of every export this process ran."""


@tool(requires_approval=False)
async def export_tickets(args: dict[str, object], ctx: ToolContext) -> ToolOutput:
    """Export the tickets as a CSV file."""
    calls.append(ctx.idempotency_key)
    return ToolOutput(
        content=(TextPart(text="exported 2 tickets"),),
        files=(ToolFile.of("tickets.csv", "text/csv", CSV),),
    )


def respond(request: ModelRequest) -> AssistantMessage:
    """Call the export for an ``export`` message, then answer; ``ok`` to anything else."""
    last = request.messages[-1]
    if isinstance(last, ToolResultMessage):
        return text(ANSWER)
    if isinstance(last, UserMessage) and "export" in message_text(last):
        return tool_call("export_tickets", {})
    return text("ok")


def tools() -> list[Tool]:
    """The export tool."""
    return [export_tickets]


def model() -> tuple[ScriptedModel, ModelRef]:
    """The scripted model."""
    return ScriptedModel(responder=respond), MODEL
