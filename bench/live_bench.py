"""Live latency: how soon a web thread sees progress and the first streamed words of an answer.

    python bench/live_bench.py                  # 100 messages, one after another
    python bench/live_bench.py --messages 300 --parallel 8
    python bench/live_bench.py --quick          # a smoke run

A real ``gateway serve`` (SQLite store, broker and web mailbox in a temporary directory) runs
this module as its plugin: a streaming model that writes each answer in `CHUNKS` chunks,
`PAUSE_MS` apart, the first chunk opening with the wall-clock time it was handed to the
harness. For each message the bench opens the thread's event stream (``live=1``), posts the
message, and reads the stream until the durable reply:

* message -> first progress: from just before the POST to the first ``live`` event with a
  progress phrase ("is thinking…");
* model chunk -> first token: from the model handing its first chunk to the harness (the time
  in the text) to the ``live`` event that carries it;
* message -> first token, and message -> reply, for scale.

Both ends use this machine's ``time.time``. Figures are printed (p50, p99, worst), never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/live_bench.py` as well as `-m bench....`
    sys.path.insert(0, str(ROOT))

from bench.interrupt import run_main  # noqa: E402
from harness_core import (  # noqa: E402
    AssistantMessage,
    ModelRef,
    ModelRequest,
    ScriptedModel,
    TextPart,
)
from harness_core.models.scripted import text  # noqa: E402

CHUNKS = 20
PAUSE_MS = 10
MODEL = ModelRef(provider="scripted", model_id="live-bench")


class StampedStream(ScriptedModel):
    """Streams every answer; its first chunk says when it was handed over (µs since the epoch)."""

    async def request(
        self,
        request: ModelRequest,
        on_update: Callable[[AssistantMessage], None] | None = None,
    ) -> AssistantMessage:
        self.requests.clear()  # nothing of it is read: it would only grow
        stamp = f"[{time.time_ns() // 1000}] "
        written = stamp
        if on_update is not None:
            on_update(AssistantMessage(content=(TextPart(text=written),), stop_reason="stop"))
        for n in range(1, CHUNKS):
            await asyncio.sleep(PAUSE_MS / 1000)
            written += f"word{n} "
            if on_update is not None:
                on_update(AssistantMessage(content=(TextPart(text=written),), stop_reason="stop"))
        return text(written.strip())


def model() -> tuple[ScriptedModel, ModelRef]:
    """The plugin's model (``GATEWAY_PLUGIN=bench.live_bench``)."""
    return StampedStream(), MODEL


def pct(values: list[float], q: float) -> float:
    """The q-quantile by nearest rank (NaN for none)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def one(http: Any, thread: str) -> dict[str, float]:
    """Post one message to `thread` and time what its event stream shows."""
    marks: dict[str, float] = {}
    url = f"/web/threads/{thread}/events"
    async with http.stream("GET", url, params={"live": "1", "after": "0"}) as stream:
        lines = stream.aiter_lines()
        assert (await anext(lines)).startswith("retry:")  # the stream is open: post now
        sent = time.time()
        posted = await http.post(f"/web/threads/{thread}/messages", json={"text": "hello"})
        posted.raise_for_status()
        kind = "message"
        async for line in lines:
            now = time.time()
            if line.startswith("event: "):
                kind = line[7:]
                continue
            if not line.startswith("data: "):
                kind = "message"
                continue
            data = json.loads(line[6:])
            if kind == "live":
                if data.get("status") and "progress" not in marks:
                    marks["progress"] = now - sent
                if data.get("text") and "token" not in marks:
                    marks["token"] = now - sent
                    stamp = int(data["text"].split("]", 1)[0].lstrip("["))
                    marks["chunk_to_token"] = now - stamp / 1e6
            elif data.get("kind") == "reply":
                marks["reply"] = now - sent
                return marks
    raise RuntimeError("the event stream ended before the reply")


async def measure(url: str, messages: int, parallel: int) -> dict[str, list[float]]:
    import httpx

    figures: dict[str, list[float]] = {}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        counter = iter(range(messages))

        async def sender(lane: int) -> None:
            for n in counter:
                marks = await one(http, f"live-{lane}-{n}")
                for name, seconds in marks.items():
                    figures.setdefault(name, []).append(seconds * 1000)

        await one(http, "warm-up")
        await asyncio.gather(*(sender(lane) for lane in range(parallel)))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100)
    parser.add_argument("--parallel", type=int, default=1, help="messages in flight at once")
    parser.add_argument("--quick", action="store_true", help="10 messages: a smoke run")
    args = parser.parse_args()
    messages = 10 if args.quick else args.messages
    try:
        from tests.support.gateway_process import GatewayProcess
    except ImportError as missing:
        sys.exit(f"live_bench: {missing.name} is missing: install the test extras first")
    with tempfile.TemporaryDirectory(prefix="live-bench-") as work:
        directory = Path(work)
        settings = {
            "store_url": f"sqlite:///{directory}/store.db",
            "broker_url": f"sqlite:///{directory}/broker.db",
            "web_url": f"sqlite:///{directory}/web.db",
            "plugin": "bench.live_bench",
            "log_level": "warning",
        }
        gateway = GatewayProcess("live", directory, settings).start()
        try:
            figures = asyncio.run(measure(gateway.url, messages, args.parallel))
        except BaseException:
            print(gateway.tail(), file=sys.stderr)
            raise
        finally:
            gateway.stop()
    print(
        f"live bench: {messages} messages through gateway serve (sqlite), {args.parallel} at once;"
        f" the model streams {CHUNKS} chunks {PAUSE_MS} ms apart"
    )
    print(f"{'':28} {'p50 ms':>8} {'p99 ms':>8} {'worst ms':>9}")
    for name, label in (
        ("progress", "message -> first progress"),
        ("chunk_to_token", "model chunk -> first token"),
        ("token", "message -> first token"),
        ("reply", "message -> reply"),
    ):
        values = figures.get(name, [])
        print(
            f"{label:28} {pct(values, 0.5):8.1f} {pct(values, 0.99):8.1f} "
            f"{max(values, default=float('nan')):9.1f}"
        )


if __name__ == "__main__":
    run_main(main)
