"""An example agent plugin: two tools, one of them behind an Approve/Deny button.

Run it from the repository's root (the plugin is found in the current directory)::

    GATEWAY_PLUGIN=examples.agent scripts/run

With ``GATEWAY_MODEL`` left at ``scripted:echo``, `model` puts a scripted stand-in in front of
the tools so they can be tried without a key: a message that mentions a deploy window calls
``deploy_window``; ``deploy <service>`` calls ``deploy``, which waits for a person to approve it;
anything else is echoed. With a real model configured (``GATEWAY_MODEL=anthropic:...``), `model`
returns None and that model decides when to call the tools from their descriptions.

To start your own agent, copy this file next to your configuration as ``agent.py`` and set
``GATEWAY_PLUGIN=agent``.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field

from config import Settings
from harness_core import (
    AssistantMessage,
    ModelClient,
    ModelRef,
    ModelRequest,
    ScriptedModel,
    Tool,
    ToolContext,
    ToolResultMessage,
    UserMessage,
    message_text,
)
from harness_core.models.scripted import results_of_this_run, text, tool_call

__all__ = ["model", "respond", "tools"]


class WindowArgs(BaseModel):
    """What ``deploy_window`` takes: the model sees this as the tool's JSON schema."""

    environment: Literal["production", "staging"] = Field(
        default="production", description="Which environment's deploy window."
    )


class DeployArgs(BaseModel):
    """What ``deploy`` takes (the arguments a person approves)."""

    service: str = Field(
        min_length=1, max_length=100, description="The service to deploy, like api or web."
    )
    environment: Literal["production", "staging"] = "production"
    note: str | None = Field(default=None, max_length=500, description="Why, for the approver.")


async def deploy_window(args: WindowArgs, ctx: ToolContext) -> str:
    """A read: running it twice is harmless, so a crash mid-call simply runs it again."""
    if args.environment == "staging":
        return "Staging deploys are open at any time."
    return "Deploys are open Tuesday to Thursday, 10:00-16:00 UTC."


async def deploy(args: DeployArgs, ctx: ToolContext) -> str:
    """An effect: it runs only after a person approved these exact arguments, and never twice.

    ``ctx.idempotency_key`` is the same for every attempt of this one call: a real deploy hands
    it to the system it calls, so that system can recognize a request it has already seen.
    """
    return f"{args.service} deployed (request {ctx.idempotency_key[:12]})"


def tools() -> list[Tool]:
    """The agent's tools, each with what a crash may do to it (`replay`) and who must agree."""
    return [
        Tool(
            name="deploy_window",
            description="When deploys to production are allowed.",
            execute=deploy_window,
            args_model=WindowArgs,
            replay="safe",
        ),
        Tool(
            name="deploy",
            description="Deploy a service to production.",
            execute=deploy,
            args_model=DeployArgs,
            replay="never",
            requires_approval=True,
        ),
    ]


def model(settings: Settings) -> tuple[ModelClient, ModelRef] | None:
    """Without a real model configured, the keyword stand-in below; else None: that model."""
    if settings.model != "scripted:echo":
        return None
    return ScriptedModel(responder=respond), ModelRef(provider="scripted", model_id="example")


def respond(request: ModelRequest) -> AssistantMessage:
    """The stand-in: calls the tools on keywords and reports what they returned."""
    if request.step != "assistant":  # asked to summarize a long conversation
        return text(f"(summary of {len(request.messages)} messages)")
    last = request.messages[-1]
    if isinstance(last, ToolResultMessage):
        return text(results_of_this_run(request.messages))
    users = [m for m in request.messages if isinstance(m, UserMessage)]
    said = message_text(users[-1]).strip() if users else ""
    # a message from someone other than the thread's starter comes as "[Bob (U2)] deploy api"
    said = re.sub(r"^\[[^\]\n]*\]\s*", "", said)
    word, _, rest = said.partition(" ")
    if word.lower() == "deploy" and rest.strip():
        return tool_call("deploy", {"service": rest.strip()})
    if "deploy" in said.lower() and "window" in said.lower():
        return tool_call("deploy_window", {})
    return text(f"You said: {said}" if said else "Hello.")
