"""Which Redis calls a gateway reply costs: every top-level command by name, scripts by name.

Starts a private ``redis-server`` and one `gateway serve` on it (store, broker and web mailbox
all on Redis, the scripted echo model), answers one message in every thread to warm the lanes,
then posts ``--messages`` messages at ``--rate`` a second round robin over the threads while
``MONITOR`` records what reaches the server. Prints, per reply, each top-level call (a script
call by the script's name, from the sha1 of its source) and the commands the scripts ran.

    .venv/bin/python bench/redis_calls.py                 # 300 messages at 20/s, 60 threads
    .venv/bin/python bench/redis_calls.py --rate 0        # one message at a time

The bench's own reads (whether the replies are in) go over one connection that is left out
of the counts. ``MONITOR`` slows the server; the counts are what it is for, not time.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import math
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import cast

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/redis_calls.py` as well as `-m bench....`
    sys.path.insert(0, str(ROOT))

import redis.asyncio as aioredis  # noqa: E402

from adapters.web import redis as web_redis  # noqa: E402
from bench.gateway_bench import Http  # noqa: E402
from bench.interrupt import run_main  # noqa: E402
from gateway.broker.redis import SCRIPTS as BROKER_SCRIPTS  # noqa: E402
from harness_core.storage import redis_streams  # noqa: E402
from tests.support.gateway_process import GatewayProcess  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402


def script_names() -> dict[str, str]:
    """sha1 of each script's source -> ``<owner>:<name>``."""
    owners = {
        "broker": BROKER_SCRIPTS,
        "store": redis_streams._SCRIPTS,
        "mailbox": {"append": web_redis._APPEND},
    }
    return {
        hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest(): f"{owner}:{name}"
        for owner, scripts in owners.items()
        for name, source in scripts.items()
    }


def call_name(words: list[str], shas: dict[str, str]) -> str:
    name = words[0].upper() if words else "?"
    if name in ("EVALSHA", "EVALSHA_RO") and len(words) > 1:
        return f"{name} {shas.get(words[1], words[1][:12])}"
    if name in ("XREAD", "XREADGROUP") and "BLOCK" in (w.upper() for w in words):
        return f"{name} BLOCK"
    return name


async def replies(box: aioredis.Redis, threads: Sequence[tuple[str, str]]) -> int:
    """Reply items in the threads' mailbox streams (the bench's excluded connection)."""
    total = 0
    for space, thread in threads:
        entries = cast(
            list[tuple[bytes, dict[bytes, bytes]]],
            await box.xrange(f"gww:{{{space}:{thread}}}:items"),
        )
        total += sum(b'"kind":"reply"' in fields[b"b"] for _, fields in entries)
    return total


async def run(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="redis-calls-"))
    server = RedisServer(workdir / "redis").start()
    gateway = GatewayProcess(
        "calls",
        workdir,
        {"redis_url": server.url, "worker_slots": str(args.slots), "log_level": "warning"},
    )
    shas = script_names()
    threads = [(f"s{i % args.spaces}", f"t{i}") for i in range(args.threads)]
    box = aioredis.Redis(port=server.port, single_connection_client=True)
    link = Http(gateway.port)
    try:
        gateway.start(wait_ready_s=30.0)
        own = (await box.client_info())["addr"]

        async def post(n: int, space: str, thread: str) -> None:
            key = f"m{n}"
            body = {"text": key, "client_message_id": key, "space": space}
            status, answer = await link.request("POST", f"/web/threads/{thread}/messages", body)
            if status != 202:
                raise SystemExit(f"POST {thread}: {status} {answer}")

        async def until(count: int, timeout_s: float) -> None:
            deadline = time.monotonic() + timeout_s
            while (seen := await replies(box, threads)) < count:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{seen} of {count} replies after {timeout_s} s")
                await asyncio.sleep(0.05)

        for n, (space, thread) in enumerate(threads):  # warm-up: every lane made
            await post(n, space, thread)
        await until(len(threads), 60.0)
        await asyncio.sleep(args.settle)

        calls: Counter[str] = Counter()
        inner: Counter[str] = Counter()
        trace: list[str] = []
        monitor_client = aioredis.Redis(port=server.port)
        async with monitor_client.monitor() as monitor:
            first = len(threads)

            async def record() -> None:
                async for seen in monitor.listen():
                    where = f"{seen['client_address']}:{seen['client_port']}"
                    words = seen["command"].split()  # unquoted by redis-py
                    if seen["client_type"] == "lua":
                        inner[call_name(words, shas)] += 1
                    elif where != own and words and words[0].upper() != "MONITOR":
                        calls[call_name(words, shas)] += 1
                        if args.trace:
                            rest = words[2:5] if words[0].upper().startswith("EVAL") else words[1:4]
                            kinds = re.findall(r'"type":"([a-z_]+)"', seen["command"])
                            trace.append(
                                f"{call_name(words, shas)} {' '.join(rest)[:70]} {' '.join(kinds)}"
                            )

            recorder = asyncio.create_task(record())
            try:
                began = time.monotonic()
                for k in range(args.messages):
                    space, thread = threads[k % len(threads)]
                    if args.rate > 0:
                        await asyncio.sleep(max(0.0, began + k / args.rate - time.monotonic()))
                    await post(first + k, space, thread)
                    if args.rate <= 0:
                        await until(first + k + 1, 30.0)
                await until(first + args.messages, 60.0)
                await asyncio.sleep(0.2)  # the last reply's settle reaches the monitor
            finally:  # also on Ctrl-C: the server stops under the monitor's read
                recorder.cancel()
                await asyncio.gather(recorder, return_exceptions=True)
        await monitor_client.aclose()
        print_counts(args, calls, inner)
        if args.trace:
            print(f"every top-level call, in order ({len(trace)}):")
            for line in trace:
                print(f"  {line}")
    finally:
        link.close()
        await box.aclose()
        gateway.stop()
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def print_counts(args: argparse.Namespace, calls: Counter[str], inner: Counter[str]) -> None:
    per = 1 / args.messages
    pace = f"{args.rate:g}/s" if args.rate > 0 else "one at a time"
    print(f"{args.messages} messages ({pace}), {args.threads} threads in {args.spaces} spaces")
    print(f"top-level calls a reply: {sum(calls.values()) * per:.1f}")
    width = max((len(name) for name in calls), default=10)
    for name, count in calls.most_common():
        print(f"  {name:<{width}}  {count * per:6.2f}")
    print(f"commands the scripts ran a reply: {sum(inner.values()) * per:.1f}")
    for name, count in inner.most_common(args.top):
        print(f"  {name:<{width}}  {count * per:6.2f}")


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--messages", type=int, default=300, help="messages counted (default 300)")
    add("--rate", type=float, default=20.0, help="msg/s; 0: one at a time (default 20)")
    add("--threads", type=int, default=60, help="web threads (default 60)")
    add("--spaces", type=int, default=5, help="spaces, i.e. sessions (default 5)")
    add("--slots", type=int, default=4, help="GATEWAY_WORKER_SLOTS (default 4)")
    add("--settle", type=float, default=1.0, help="seconds after the warm-up (default 1)")
    add("--trace", action="store_true", help="print every top-level call in order")
    add("--top", type=int, default=12, help="script commands shown (default 12)")
    args = parser.parse_args(argv)
    if args.messages <= 0 or args.threads <= 0 or args.spaces <= 0:
        parser.error("--messages, --threads and --spaces must be positive")
    if not (math.isfinite(args.rate) and args.rate >= 0):
        parser.error(f"--rate must be a number of messages a second, 0 or more (got {args.rate})")
    if not (math.isfinite(args.settle) and args.settle >= 0):
        parser.error(f"--settle must be seconds, 0 or more (got {args.settle})")
    return args


if __name__ == "__main__":
    run_main(lambda: asyncio.run(run(parse())))  # the gateway and server stop on the way out
