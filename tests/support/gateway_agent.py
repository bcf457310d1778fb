"""A gateway plugin for tests: a scripted agent with tools that count, wait, ask and kill.

The model answers by the newest user message:

* ``/charge <n>``: calls ``charge`` (``replay="never"``), which appends one line to the
  effects ledger (``AGENT_TEST_EFFECTS``, a JSONL file; the test counts repeats there);
* ``/slowcharge <ms>``: calls ``charge``, which waits that long first (and does not watch the
  abort: a ``stop`` meanwhile ends the run after the charge is done);
* ``/deploy <target>``: calls ``deploy``, which requires approval;
* ``/slow <ms>``: calls ``slow`` (safe to repeat), which sleeps, keeping the lane busy;
* ``/block <ms>``: calls ``slow``, which blocks the event loop that long (``time.sleep``);
* ``/lookup <ms>``: says `LOOKING` and calls ``slow`` in one answer, then answers ``Done: ...``:
  two model requests that both write text (a live view streams one, then replaces it);
* ``/poison``: calls ``poison`` (safe to repeat, so every resume runs it again), which kills
  the process (``os._exit``) whenever it runs;
* ``/charge-then-poison``: calls ``charge`` then ``poison`` in one (sequential) batch: the
  charge is done once, then every attempt dies until an operator resumes with
  ``tool_recovery=never``;
* ``/fail``: the model fails for good (an authentication error): the run fails;
* ``/loop``: calls ``slow`` (1 ms) after every result, never answering: a run stops only at
  its turn limit (``GATEWAY_MAX_TURNS``);
* ``/busy``: the first attempt is rate limited (retried after the policy's 1 s), then it echoes;
* ``/stream``: the answer (`STREAMED_ANSWER`) is streamed in small chunks (see there);
* ``/slowstream``: calls ``slow`` (1.5 s: its progress shows), then streams the same answer;
* ``/cutoff``: the answer stops at the provider's own output limit (``length`` after 100
  tokens, no caller cap): delivered with the line that says so;
* anything else: echoed back (``You said: ...``), after seeing every steered message.

After a tool result it answers ``Done: <result>``. With ``AGENT_TEST_LEDGER`` set, the web
channel is wrapped by a `RecordingChannel` that appends every delivery to that file, so several
processes count their deliveries at one sink.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import time
from collections.abc import Sequence
from typing import Any

from adapters.channel import ChannelAdapter
from adapters.testing import RecordingChannel
from adapters.web import WebChannel, open_mailbox
from adapters.web.settings import web_mailbox_url
from config import Settings
from harness_core import (
    AssistantMessage,
    Clock,
    ModelRef,
    ModelRequest,
    ScriptedModel,
    TextPart,
    Tool,
    ToolContext,
    ToolResultMessage,
    UserMessage,
    message_text,
)
from harness_core.models.scripted import (
    Streamed,
    error,
    length,
    streamed,
    text,
    tool_call,
    tool_calls,
)

MODEL = ModelRef(provider="scripted", model_id="gateway-test")
LOOKING = "Let me look that up."
"""What ``/lookup`` says before its tool call."""
CUT_OFF_ANSWER = "Deploys are open Tuesday to Thursday, and the next"
STREAMED_ANSWER = (
    "Deploys are open Tuesday to Thursday. The next window opens at 10:00 and closes at 16:00; "
    "ask the release desk for anything outside it."
)
"""What ``/stream`` and ``/slowstream`` answer, 4 characters every 120 ms (about 4 s)."""


def respond(request: ModelRequest) -> AssistantMessage | Streamed:
    """The scripted agent (see the module docstring)."""
    if request.step != "assistant":
        return text(f"(summary of {len(request.messages)} messages)")
    last = request.messages[-1]
    users = [m for m in request.messages if isinstance(m, UserMessage)]
    said = message_text(users[-1]) if users else ""
    word, _, rest = said.partition(" ")
    if word == "/loop":
        return tool_call("slow", {"ms": 1})
    if isinstance(last, ToolResultMessage):
        if word == "/slowstream":
            return streamed(STREAMED_ANSWER, chunk_chars=4, pause_ms=120)
        return text(f"Done: {message_text(last)}")
    if word == "/stream":
        return streamed(STREAMED_ANSWER, chunk_chars=4, pause_ms=120)
    if word == "/slowstream":
        return tool_call("slow", {"ms": 1500})
    if word == "/charge":
        return tool_call("charge", {"amount": rest.strip() or "1"})
    if word == "/slowcharge":
        return tool_call("charge", {"amount": "5", "ms": int(rest.strip() or "500")})
    if word == "/deploy":
        return tool_call("deploy", {"target": rest.strip() or "prod"})
    if word == "/slow":
        return tool_call("slow", {"ms": int(rest.strip() or "200")})
    if word == "/block":
        return tool_call("slow", {"ms": int(rest.strip() or "200"), "block": True})
    if word == "/lookup":
        call = tool_call("slow", {"ms": int(rest.strip() or "200")})
        return call.model_copy(update={"content": (TextPart(text=LOOKING), *call.content)})
    if word == "/poison":
        return tool_call("poison", {})
    if word == "/fail":
        return error("auth", retryable=False, message="the key was refused")
    if word == "/busy" and request.attempt == 1:
        return error("rate_limit", message="rate limited")  # retried after 1 s (the policy)
    if word == "/cutoff":
        return length(CUT_OFF_ANSWER, output_tokens=100)
    if word == "/charge-then-poison":
        return tool_calls(("charge", {"amount": "5"}, None), ("poison", {}, None))
    return text(f"You said: {said}")


def _append(path: str, line: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as ledger:
        fcntl.flock(ledger, fcntl.LOCK_EX)
        ledger.write(json.dumps(line) + "\n")
        ledger.flush()
        os.fsync(ledger.fileno())


async def charge(args: Any, ctx: ToolContext) -> str:
    await asyncio.sleep(int(args.get("ms", 0)) / 1000)
    path = os.environ.get("AGENT_TEST_EFFECTS")
    if path:
        _append(path, {"key": ctx.idempotency_key, "lane": ctx.lane, "call": ctx.tool_call_id})
    return f"charged {args['amount']}"


async def deploy(args: Any, ctx: ToolContext) -> str:
    return f"deployed {args['target']}"


async def slow(args: Any, ctx: ToolContext) -> str:
    if args.get("block"):
        time.sleep(int(args["ms"]) / 1000)  # noqa: ASYNC251 (a careless tool: every thread waits)
        return f"blocked {args['ms']} ms"
    await asyncio.sleep(int(args["ms"]) / 1000)
    return f"slept {args['ms']} ms"


async def poison(args: Any, ctx: ToolContext) -> str:
    os._exit(9)


def tools() -> list[Tool]:
    """The agent's tools."""
    return [
        Tool(name="charge", description="Charge a card.", execute=charge, replay="never"),
        Tool(
            name="deploy",
            description="Deploy a target.",
            execute=deploy,
            replay="never",
            requires_approval=True,
        ),
        Tool(name="slow", description="Wait a while.", execute=slow, replay="safe"),
        Tool(
            name="poison",
            description="Crash the process.",
            execute=poison,
            replay="safe",
            execution_mode="sequential",  # after the calls before it in its batch
        ),
    ]


def model() -> tuple[ScriptedModel, ModelRef]:
    """The scripted model."""
    return ScriptedModel(responder=respond), MODEL


def adapters(settings: Settings, clock: Clock) -> Sequence[ChannelAdapter]:
    """The web channel, counted at a shared ledger when ``AGENT_TEST_LEDGER`` is set."""
    ledger = os.environ.get("AGENT_TEST_LEDGER")
    if not ledger:
        return []
    web = WebChannel(open_mailbox(web_mailbox_url(settings)), clock=clock)
    return [RecordingChannel(clock=clock, ledger=ledger, inner=web)]
