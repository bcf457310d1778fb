"""The latency floor a single lane hits: an executor round trip and a loopback Redis PING.

    python bench/latency_probe.py

A lane awaits each durable write before the next, so its appends/s can never beat
1 / (thread handoff + transaction) on SQLite or 1 / (round trip + script) on Redis.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from bench.interrupt import run_main
from bench.store_bench import redis_url

N = 3000


async def executor_round_trip_us() -> float:
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(max_workers=1) as pool:
        samples = []
        for _ in range(N):
            start = time.perf_counter()
            await loop.run_in_executor(pool, int)
            samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


async def redis_ping_us(port: int) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    samples = []
    for _ in range(N):
        start = time.perf_counter()
        writer.write(b"*1\r\n$4\r\nPING\r\n")
        await writer.drain()
        await reader.readline()
        samples.append(time.perf_counter() - start)
    writer.close()
    return statistics.median(samples) * 1e6


def main() -> None:
    directory = tempfile.mkdtemp(prefix="latency-")
    url, stop = redis_url(argparse.Namespace(redis_url="", appendfsync="everysec"), directory)
    try:
        hop = asyncio.run(executor_round_trip_us())
        ping = asyncio.run(redis_ping_us(int(url.rsplit(":", 1)[1].split("/")[0])))
        print(f"executor round trip: median {hop:.0f} us -> at most {1e6 / hop:,.0f} hops/s")
        print(
            f"asyncio PING to a local redis-server: median {ping:.0f} us -> at most {1e6 / ping:,.0f}/s"
        )
    finally:
        stop()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    run_main(main)
