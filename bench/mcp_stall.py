"""How long one MCP answer of many small content blocks holds the gateway's event loop.

Starts the tests' MCP server (``tests.support.mcp_servers``) over stdio or Streamable HTTP (an
event stream, a JSON body, a gzipped JSON body), calls its ``flood`` tool for ``--blocks``
one-letter content blocks through `McpTools` (as a thread's run does), and meanwhile measures
the longest gap between the ticks of a 10 ms timer on the same loop: what every other thread,
the operator API and the replies wait while that one answer is read.

    .venv/bin/python bench/mcp_stall.py                       # 450,000 blocks, every transport
    .venv/bin/python bench/mcp_stall.py --blocks 100000 --runs 3

``--sdk`` reads HTTP answers as the SDK does (the gateway's bounded transport left out), for
the figure before D399.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.mcp import connection  # noqa: E402
from gateway.mcp.settings import McpServer  # noqa: E402
from gateway.mcp.source import McpTools  # noqa: E402
from harness_core.clock import SystemClock  # noqa: E402
from harness_core.tools import ToolContext  # noqa: E402
from tests.support.mcp_servers import HttpServer  # noqa: E402
from tests.support.redis_server import free_port  # noqa: E402

TRANSPORTS = ("stdio", "events", "json", "gzip")


async def _stall(transport: str, blocks: int) -> tuple[float, float]:
    """(the longest loop stall, the call's time), in seconds, for one call."""
    server: HttpServer | None = None
    if transport == "stdio":
        settings = McpServer.model_validate(
            {
                "name": "bench",
                "command": sys.executable,
                "args": ["-m", "tests.support.mcp_servers", "--stdio"],
                "cwd": str(ROOT),
                "call_timeout_seconds": 300,
            }
        )
    else:
        server = await HttpServer(
            free_port(), json_response=transport != "events", gzip=transport == "gzip"
        ).start()
        settings = McpServer.model_validate(
            {"name": "bench", "url": server.url, "call_timeout_seconds": 300}
        )
    source = McpTools([settings], clock=SystemClock())
    await source.start()
    worst = 0.0
    done = False

    async def ticking() -> None:
        nonlocal worst
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            worst = max(worst, now - last - 0.01)
            last = now

    ticker = asyncio.create_task(ticking())
    flood = {t.name: t for t in source.tools()}["bench.flood"]
    context = ToolContext(
        session_id="s", lane="l", run_id="r", tool_call_id="c", tool_name="bench.flood",
        idempotency_key="k",
    )  # fmt: skip
    began = time.perf_counter()
    try:
        output: Any = await flood.execute({"blocks": blocks}, context)
        if output.is_error:
            raise RuntimeError(f"{transport}: {output.content[0].text[:200]}")
    finally:
        took = time.perf_counter() - began
        done = True
        await ticker
        await source.close()
        if server is not None:
            await server.kill()
    return worst, took


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=450_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--only", help="comma-separated: " + ",".join(TRANSPORTS))
    parser.add_argument("--sdk", action="store_true", help="HTTP answers read as the SDK does")
    args = parser.parse_args()
    if args.blocks < 1 or args.runs < 1:
        parser.error(f"--blocks and --runs must be at least 1 (got {args.blocks}, {args.runs})")
    unknown = sorted(set(args.only.split(",")) - set(TRANSPORTS)) if args.only else []
    if unknown:
        parser.error(f"--only: unknown {', '.join(unknown)} (known: {', '.join(TRANSPORTS)})")
    if args.sdk:
        setattr(connection, "BoundedBodies", lambda inner: inner)  # noqa: B010 (a bench's switch)
    chosen = args.only.split(",") if args.only else list(TRANSPORTS)
    print(
        f"{args.blocks:,} one-letter blocks, {args.runs} runs each ({'SDK' if args.sdk else 'gateway'})"
    )
    for transport in chosen:
        stalls, calls = [], []
        for _ in range(args.runs):
            try:
                stall, took = await _stall(transport, args.blocks)
            except Exception as exc:  # the SDK's 1 MiB event limit fails the call itself
                print(f"  {transport:7} failed: {' '.join(str(exc).split())[:160]}")
                break
            stalls.append(stall)
            calls.append(took)
        else:
            print(
                f"  {transport:7} longest stall {max(stalls):.2f} s (median {statistics.median(stalls):.2f}), "
                f"call {statistics.median(calls):.2f} s"
            )


if __name__ == "__main__":
    asyncio.run(main())
