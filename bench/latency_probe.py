"""The latency floor a single lane hits: an executor round trip and a loopback Redis PING.

    python bench/latency_probe.py

A lane awaits each durable write before the next, so its appends/s can never beat
1 / (thread handoff + transaction) on SQLite or 1 / (round trip + script) on Redis.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import redis

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
    with __import__("socket").socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--dir", directory, "--save", ""],
        stdout=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(port=port)
        for _ in range(200):
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                time.sleep(0.02)
        client.close()
        hop = asyncio.run(executor_round_trip_us())
        ping = asyncio.run(redis_ping_us(port))
        print(f"executor round trip: median {hop:.0f} us -> at most {1e6 / hop:,.0f} hops/s")
        print(
            f"asyncio PING to a local redis-server: median {ping:.0f} us -> at most {1e6 / ping:,.0f}/s"
        )
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
