"""The stand-in model of the MCP walkthrough: it calls the ticket desk's tools on keywords.

With ``GATEWAY_MODEL`` left at ``scripted:echo`` (no key needed) `model` answers from the words
of the last message, so the walkthrough in the README runs anywhere:

* ``find <words>`` calls ``tickets.find_tickets``;
* ``create <title>`` calls ``tickets.create_ticket``;
* ``priority <number> <low|normal|high>`` calls ``tickets.set_priority``;
* ``delete <number>`` calls ``tickets.delete_ticket`` (it waits for an approval);
* anything else is echoed.

After a tool's result it answers with that result. With a real model configured
(``GATEWAY_MODEL=anthropic:...``), `model` returns None: that model reads the tools'
descriptions and decides for itself. The tools themselves come from the MCP server the
configuration names (``examples/mcp/gateway.toml``), not from this file.
"""

from __future__ import annotations

from config import Settings
from harness_core import (
    AssistantMessage,
    ModelClient,
    ModelRef,
    ModelRequest,
    ScriptedModel,
    ToolResultMessage,
    UserMessage,
    message_text,
)
from harness_core.models.scripted import results_of_this_run, text, tool_call

__all__ = ["model", "respond"]

SERVER = "tickets"
"""The server's name in the configuration: its tools are ``tickets.<tool>``."""


def model(settings: Settings) -> tuple[ModelClient, ModelRef] | None:
    """Without a real model configured, the keyword stand-in below; else None: that model."""
    if settings.model != "scripted:echo":
        return None
    return ScriptedModel(responder=respond), ModelRef(provider="scripted", model_id="tickets")


def respond(request: ModelRequest) -> AssistantMessage:
    """Call a ticket tool on its keyword; after its result, say what it returned."""
    if request.step != "assistant":  # asked to summarize a long conversation
        return text(f"(summary of {len(request.messages)} messages)")
    last = request.messages[-1]
    if isinstance(last, ToolResultMessage):
        return text(results_of_this_run(request.messages))
    users = [m for m in request.messages if isinstance(m, UserMessage)]
    said = message_text(users[-1]).strip() if users else ""
    said = said.splitlines()[-1].strip() if said else ""  # after any "who wrote" line
    word, _, rest = said.partition(" ")
    rest = rest.strip()
    words = rest.split()
    match word.lower():
        case "find":
            return tool_call(f"{SERVER}.find_tickets", {"query": rest})
        case "create" if rest:
            return tool_call(f"{SERVER}.create_ticket", {"title": rest})
        case "priority" if len(words) == 2 and words[0].isdigit():
            return tool_call(
                f"{SERVER}.set_priority", {"number": int(words[0]), "priority": words[1]}
            )
        case "delete" if len(words) == 1 and words[0].isdigit():
            return tool_call(f"{SERVER}.delete_ticket", {"number": int(words[0])})
    return text(f"You said: {said}" if said else "Hello.")
