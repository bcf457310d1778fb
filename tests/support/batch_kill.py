"""A process that dies inside a batch of deferred writes (for test_write_batches.py).

    python -m tests.support.batch_kill STORE.db MARKS

It prompts a lane whose model calls the tool ``mark``; when the assistant's tool call has been
written (deferred, not yet committed: the tool's barrier comes next) it prints ``KILLING`` and
SIGKILLs itself. The tool appends a line to MARKS each time it runs.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from pydantic import BaseModel

import harness_core as hc
from harness_core.session.contract import SessionStorage
from harness_core.storage.sqlite import SqliteSessionRepo

LEASE_TTL_MS = 1_500
"""Short: the recovering test takes the dead process's lease over once it lapses."""


class MarkArgs(BaseModel):
    note: str


async def open_harness(
    storage: SessionStorage, marks: Path
) -> tuple[hc.AgentHarness, list[hc.SuspendedOperation]]:
    """The harness both the dying process and the recovering test open."""

    async def mark(args: MarkArgs, ctx: hc.ToolContext) -> str:
        with marks.open("a") as out:
            out.write("ran\n")
        return "marked " + args.note

    def respond(request: hc.ModelRequest) -> hc.AssistantMessage:
        if isinstance(request.messages[-1], hc.ToolResultMessage):
            return hc.scripted.text("done")
        return hc.scripted.tool_call("mark", {"note": "x"}, call_id="c1")

    options = hc.AgentHarnessOptions(
        storage=storage,
        model_client=hc.ScriptedModel(responder=respond),
        model=hc.ModelRef(provider="scripted", model_id="m"),
        tools=[
            hc.Tool(name="mark", description="d", execute=mark, args_model=MarkArgs, replay="never")
        ],
    )
    return await hc.AgentHarness.create(options)


async def main(path: Path, marks: Path) -> None:
    repo = SqliteSessionRepo(path)  # the default, `effects` (D233)
    await repo.create("s")
    lease = await repo.acquire_lease("s", owner="doomed", ttl_ms=LEASE_TTL_MS)
    harness, _ = await open_harness(await repo.open("s", lease=lease), marks)

    def die(event: hc.MessageEnd) -> None:
        if (
            isinstance(event.message, hc.AssistantMessage)
            and event.message.stop_reason == "tool_use"
        ):
            print("KILLING", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    harness.events.on("message_end", die)
    await harness.prompt("go")
    print("NOT KILLED", flush=True)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2])))
