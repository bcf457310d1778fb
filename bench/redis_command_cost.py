"""What one Redis command costs this process in CPU: sent alone, by concurrent callers, pipelined.

    .venv/bin/python bench/redis_command_cost.py            # 20,000 HGETs each way
    .venv/bin/python bench/redis_command_cost.py --commands 100000

The client is the one every backend uses (`harness_core.backends.redis.connect`: redis-py with
hiredis and the sends timed without a task, D272), against a private `redis-server` this starts.
Each way runs `--commands` ``HGET`` calls: one after another (a caller that awaits each reply,
as a lane's read does), 50 callers at a time (``asyncio.gather``: the pool's connections), and
50 to a pipeline. CPU microseconds a command, this process only: what a gateway reply's 34-55
top-level calls cost it (`bench/redis_calls.py`), and what batching them could save (D284).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/redis_command_cost.py` as well as `-m bench....`
    sys.path.insert(0, str(ROOT))

from bench.interrupt import run_main  # noqa: E402
from bench.store_bench import redis_url  # noqa: E402
from harness_core.backends.redis import connect  # noqa: E402

BATCH = 50


async def cpu_us(commands: int, batch: Callable[[int], Awaitable[Any]], size: int) -> float:
    """CPU microseconds a command over `commands` commands sent `size` at a time by `batch`."""
    await batch(size)  # connections made, replies parsed once: not what a command costs
    started = time.process_time()
    for _ in range(commands // size):
        await batch(size)
    return (time.process_time() - started) * 1e6 / (commands // size * size)


async def measure(url: str, commands: int) -> list[tuple[str, float]]:
    client: Any = connect(url, cluster=False)
    try:
        await client.hset("bench:h", "f", "v")

        async def alone(n: int) -> None:
            for _ in range(n):
                await client.hget("bench:h", "f")

        async def together(n: int) -> None:
            await asyncio.gather(*(client.hget("bench:h", "f") for _ in range(n)))

        async def pipelined(n: int) -> None:
            pipe = client.pipeline(transaction=False)
            for _ in range(n):
                pipe.hget("bench:h", "f")
            await pipe.execute()

        return [
            ("one after another", await cpu_us(commands, alone, 1)),
            (f"{BATCH} callers at a time", await cpu_us(commands, together, BATCH)),
            (f"{BATCH} to a pipeline", await cpu_us(commands, pipelined, BATCH)),
        ]
    finally:
        await client.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--commands", type=int, default=20_000, help="HGETs each way (20,000)")
    parser.add_argument("--redis-url", default="", help="a server to use (none: start one)")
    args = parser.parse_args(argv)
    if args.commands < BATCH:
        parser.error(f"--commands must be at least {BATCH} (got {args.commands})")
    args.appendfsync = "everysec"
    workdir = tempfile.mkdtemp(prefix="redis-command-cost-")
    try:
        url, stop = redis_url(args, workdir)
        try:
            rows = asyncio.run(measure(url, args.commands))
        finally:
            stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"# CPU us a Redis HGET (this process), {args.commands:,} each way")
    for name, us in rows:
        print(f"{name} | {us:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
