"""Harness benchmark: prompt throughput per backend, per-turn cost vs history, restore time.

    python bench/harness_bench.py                  # every backend, starts its own redis-server
    python bench/harness_bench.py --quick          # smaller sizes, for a smoke run
    python bench/harness_bench.py --backends memory,sqlite
    python bench/harness_bench.py --collector gateway   # Python's GC as `gateway serve` tunes it

Every prompt is one run of two turns with `ScriptedModel`: the model calls one tool, the tool
answers, the model replies with ~200 characters. That is 11 writes (operation_started, the user
message, two step_attempt + usage pairs, the tool call, tool_started, the tool result, the
answer, operation_finished) in 4 commits (the writes no effect separates commit together) and
the fixed-point self-check.
"prompts/s" runs one lane; "16 lanes" runs 16 lanes of the same session at once. "CPU ms/prompt"
is this process's CPU time (every thread; not redis-server's) per prompt with 16 lanes: where it
is well below 1000 / (prompts/s), the process was waiting (on fsync, on Redis), not computing.

Per-turn cost is the median time of a prompt on lanes that already hold 10, 100 or 1,000
prompts of history (one session, the lanes taking turns so noise hits each alike); the ratio
1000/10 shows whether a turn's cost depends on history (it must not: the context is cached per
lane and writes never read the history).

``--collector gateway`` tunes Python's cyclic garbage collector as `gateway serve`, the host of
the runtime in production, does once it has started (D122, D383: the start-up heap frozen, the
young generation collected every `GATEWAY_GC_YOUNG_THRESHOLD` allocations, 5,000); the default keeps Python's own, as a library
host that changes nothing would.

Restore builds a session of 50 lanes x 200 prompts with 5 lanes suspended mid-tool (on the
memory backend, then imported into each backend), and times `AgentHarness.create()`: its reads
are bounded per lane, so it grows with lanes, not with history.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/harness_bench.py` as well as `-m bench....`
    sys.path.insert(0, str(ROOT))

from bench.interrupt import run_main  # noqa: E402
from bench.store_bench import backends  # noqa: E402
from config.settings import Settings  # noqa: E402
from gateway.collector import tune_collector  # noqa: E402
from harness_core import ScriptedModel, SessionRepo  # noqa: E402
from harness_core.harness import AgentHarness  # noqa: E402
from harness_core.ids import SequentialIds  # noqa: E402
from harness_core.messages import AssistantMessage, ToolResultMessage  # noqa: E402
from harness_core.models import ModelRef, ModelRequest  # noqa: E402
from harness_core.models.scripted import text, tool_call  # noqa: E402
from harness_core.options import AgentHarnessOptions  # noqa: E402
from harness_core.result import Ok  # noqa: E402
from harness_core.session.contract import SessionStorage  # noqa: E402
from harness_core.session.types import LogItem, SessionMetadata  # noqa: E402
from harness_core.storage.memory import MemorySessionRepo  # noqa: E402
from harness_core.tools import Tool, ToolContext  # noqa: E402

MODEL = ModelRef(provider="scripted", model_id="bench")
ANSWER = ("The change is in place and the tests pass; " * 5)[:200]


def respond(request: ModelRequest) -> AssistantMessage:
    """Call the tool after a user message; answer after its result."""
    if isinstance(request.messages[-1], ToolResultMessage):
        return text(ANSWER)
    return tool_call("lookup", {"query": "status"})


class BenchModel(ScriptedModel):
    """`ScriptedModel` that forgets requests (a long bench would otherwise hold them all)."""

    async def request(self, request: ModelRequest, *args: Any, **kwargs: Any) -> AssistantMessage:
        reply = await super().request(request, *args, **kwargs)
        self.requests.clear()
        return reply


async def lookup(args: Any, ctx: ToolContext) -> str:
    return "all green"


class Hang:
    """A tool that never returns (leaves its lane suspended mid-tool); counts who got there."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.entered = 0
        self.all_entered = asyncio.Event()

    async def __call__(self, args: Any, ctx: ToolContext) -> str:
        self.entered += 1
        if self.entered == self.expected:
            self.all_entered.set()
        await asyncio.Event().wait()
        return "unreachable"


async def open_harness(
    repo: SessionRepo, session_id: str, *, create: bool, tool: Any = lookup
) -> tuple[AgentHarness, SessionStorage, float]:
    if create:
        await repo.create(session_id)
    lease = await repo.acquire_lease(session_id, owner="bench", ttl_ms=3_600_000)
    storage = await repo.open(session_id, lease=lease)
    options = AgentHarnessOptions(
        storage=storage,
        model_client=BenchModel(responder=respond),
        model=MODEL,
        tools=[Tool(name="lookup", description="look something up", execute=tool, replay="never")],
        ids=SequentialIds(f"{session_id}-"),
    )
    started = time.perf_counter()
    harness, _ = await AgentHarness.create(options)
    return harness, storage, time.perf_counter() - started


async def prompt(lane: Any) -> None:
    result = await lane.prompt("check the build")
    assert isinstance(result, Ok) and result.value.kind == "completed", result


COLLECTORS = ("python", "gateway")
"""Python's garbage collector as it starts, or as `gateway serve` tunes it (`tune`)."""


def tune(collector: str) -> None:
    """Leave Python's collector (``python``) or tune it as `gateway serve` does (``gateway``)."""
    if collector == "gateway":
        tune_collector(Settings.model_fields["gc_young_threshold"].default)


async def with_lanes(harness: AgentHarness, count: int) -> list[Any]:
    """The harness (lane ``main``) and `count - 1` more lanes."""
    handles: list[Any] = [harness]
    for i in range(1, count):
        created = await harness.create_lane(f"l{i:02d}", None)
        assert isinstance(created, Ok)
        handles.append(created.value)
    return handles


async def prompts_per_second(
    repo: SessionRepo, tag: str, n: int, lanes: int
) -> tuple[float, float]:
    """Prompts per second, and this process's CPU milliseconds per prompt (every thread)."""
    harness, _, _ = await open_harness(repo, f"rate-{tag}-{lanes}", create=True)
    handles = await with_lanes(harness, lanes)

    async def drive(lane: Any) -> None:
        for _ in range(n // lanes):
            await prompt(lane)

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(drive(lane) for lane in handles))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    await harness.close()
    done = (n // lanes) * lanes
    return done / elapsed, 1000 * cpu / done


async def per_turn_ms(
    repo: SessionRepo, tag: str, histories: list[int], sample: int
) -> list[float]:
    """Median prompt time on lanes holding each history size, measured round-robin.

    The lanes share one session and take turns, so machine noise hits every size alike.
    """
    harness, _, _ = await open_harness(repo, f"growth-{tag}", create=True)
    lanes: list[Any] = []
    for size in histories:
        created = await harness.create_lane(f"h{size}", None)
        assert isinstance(created, Ok)
        lanes.append(created.value)

    async def fill(lane: Any, size: int) -> None:
        for _ in range(size):
            await prompt(lane)

    await asyncio.gather(*(fill(lane, size) for lane, size in zip(lanes, histories, strict=True)))
    samples: list[list[float]] = [[] for _ in histories]
    for _ in range(sample):
        for index, lane in enumerate(lanes):
            started = time.perf_counter()
            await prompt(lane)
            samples[index].append(time.perf_counter() - started)
    await harness.close()
    return [statistics.median(times) * 1000 for times in samples]


async def build_restore_log(lanes: int, prompts: int, suspended: int) -> tuple[LogItem, ...]:
    repo = MemorySessionRepo()
    hang = Hang(suspended)

    async def tool(args: Any, ctx: ToolContext) -> str:
        if args.get("query") == "hang":
            return await hang(args, ctx)
        return "all green"

    harness, storage, _ = await open_harness(repo, "restore", create=True, tool=tool)
    handles = await with_lanes(harness, lanes)

    async def drive(lane: Any) -> None:
        for _ in range(prompts):
            await prompt(lane)

    await asyncio.gather(*(drive(lane) for lane in handles))
    model = harness._rt.model
    assert isinstance(model, ScriptedModel)
    model.responder = lambda request: (
        text(ANSWER)
        if isinstance(request.messages[-1], ToolResultMessage)
        else tool_call("lookup", {"query": "hang"})
    )
    stuck = [asyncio.create_task(handles[i].prompt("and one more")) for i in range(suspended)]
    await hang.all_entered.wait()  # each stuck lane's tool_started is durable
    log = await storage.get_log()
    await harness.close()
    for task in stuck:
        task.cancel()
    await asyncio.gather(*stuck, return_exceptions=True)
    return log


async def restore_ms(
    repo: SessionRepo, tag: str, log: tuple[LogItem, ...], trials: int
) -> tuple[float, int]:
    session_id = f"restored-{tag}"
    await repo.import_session(SessionMetadata(id=session_id, created_at=1), log)
    samples = []
    suspended = 0
    for _ in range(trials):
        harness, _, elapsed = await open_harness(repo, session_id, create=False)
        samples.append(elapsed)
        suspended = len([lane for lane in await harness.lanes() if lane.status == "suspended"])
        await harness.close()
    return statistics.median(samples) * 1000, suspended


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", default="memory,jsonl,sqlite,redis")
    parser.add_argument("--prompts", type=int, default=400)
    parser.add_argument("--histories", default="10,100,1000")
    parser.add_argument("--sample", type=int, default=30)
    parser.add_argument("--restore", default="50x200x5", help="lanes x prompts x suspended")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--redis-url", default="")
    parser.add_argument("--appendfsync", default="everysec", choices=["everysec", "always"])
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument(
        "--collector",
        choices=COLLECTORS,
        default="python",
        help="Python's GC, or as serve tunes it",
    )
    args = parser.parse_args()
    if args.quick:
        args.prompts, args.histories, args.sample, args.restore, args.trials = (
            64, "10,100", 10, "10x20x2", 1,
        )  # fmt: skip
    histories = [int(h) for h in args.histories.split(",")]
    lanes, prompts, stuck = (int(x) for x in args.restore.split("x"))
    workdir = tempfile.mkdtemp(prefix="harness-bench-")
    chosen, stop = backends(args, workdir)
    try:  # the redis-server started above stops however this ends (Ctrl-C too)
        print(
            f"# harness_bench on {platform.platform()}, {os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}, redis AOF appendfsync={args.appendfsync}, "
            f"{args.collector}'s garbage collector"
        )
        print(
            f"# {args.prompts} prompts (2 turns each); per-turn cost: median of {args.sample} prompts "
            f"at each history; restore: {lanes} lanes x {prompts} prompts, {stuck} suspended mid-tool, "
            f"median of {args.trials}"
        )
        started = time.perf_counter()
        tune(args.collector)
        log = await build_restore_log(lanes, prompts, stuck)
        print(
            f"# restore session: {len(log):,} log items, built in {time.perf_counter() - started:.1f} s"
        )
        header = ["backend", "prompts/s 1 lane", "prompts/s 16 lanes", "CPU ms/prompt 16 lanes"]
        header += [f"ms/prompt @{h:,}" for h in histories]
        header += [f"ratio {histories[-1]:,}/{histories[0]:,}", "restore ms", "suspended found"]
        print(" | ".join(header))
        for index, backend in enumerate(chosen):
            repo = backend.make(workdir)
            tag = f"{index}"
            one, _ = await prompts_per_second(repo, tag, args.prompts, 1)
            many, cpu = await prompts_per_second(repo, tag, args.prompts, 16)
            growth = await per_turn_ms(repo, tag, histories, args.sample)
            restored, found = await restore_ms(repo, tag, log, args.trials)
            await repo.close()
            row = [
                backend.name,
                f"{one:,.0f}",
                f"{many:,.0f}",
                f"{cpu:.2f}",
                *(f"{ms:.2f}" for ms in growth),
                f"{growth[-1] / growth[0]:.2f}",
                f"{restored:,.0f}",
                f"{found}",
            ]
            print(" | ".join(row), flush=True)
    finally:
        stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    run_main(lambda: asyncio.run(main()))
