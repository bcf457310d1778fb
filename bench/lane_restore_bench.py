"""Lane restore benchmark: `AgentHarness.create()` on sessions of many idle lanes, few open.

    python bench/lane_restore_bench.py                       # 1k / 10k / 100k lanes, SQLite
    python bench/lane_restore_bench.py --lanes 1000,10000 --backends sqlite,memory
    python bench/lane_restore_bench.py --quick               # 200 / 2,000 lanes, one trial

Each session holds `lanes` lanes (``main`` included), each with one finished prompt (a user
message, a ~200-character answer: operation_started, the two entries, a step attempt, usage,
operation_finished), and `--open` of them left with an open run (a crash after the model
request was attempted). The log is built once per size on the memory backend and imported into
each backend (`SessionRepo.import_session`), so building does not dominate the run.

Printed: the median time of `AgentHarness.create()` over `--trials` opens, the operations it
reported, and the ratio of each size's time to the smallest size's. Restore proportional to what
is open keeps the ratio near 1 however many idle lanes the session holds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pickle
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/lane_restore_bench.py` as well as `-m bench....`
    sys.path.insert(0, str(ROOT))

from bench.interrupt import run_main  # noqa: E402
from bench.store_bench import backends  # noqa: E402
from harness_core import ScriptedModel, SessionRepo  # noqa: E402
from harness_core.harness import AgentHarness  # noqa: E402
from harness_core.ids import SequentialIds  # noqa: E402
from harness_core.messages import AssistantMessage  # noqa: E402
from harness_core.models import ModelRef, ModelRequest  # noqa: E402
from harness_core.models.scripted import text  # noqa: E402
from harness_core.options import AgentHarnessOptions  # noqa: E402
from harness_core.result import Ok  # noqa: E402
from harness_core.session.types import LogItem, SessionMetadata  # noqa: E402
from harness_core.storage.memory import MemorySessionRepo  # noqa: E402

MODEL = ModelRef(provider="scripted", model_id="bench")
ANSWER = ("The change is in place and the tests pass; " * 5)[:200]


class _Model(ScriptedModel):
    """Answers at once, or never for a request whose prompt says ``STALL`` (an open run)."""

    def __init__(self) -> None:
        super().__init__(responder=lambda request: text(ANSWER))
        self.hanging = 0
        self.hung = asyncio.Event()
        self.release = asyncio.Event()
        self.expected = 0

    async def request(self, request: ModelRequest, *args: Any, **kwargs: Any) -> AssistantMessage:
        last = request.messages[-1]
        if "STALL" in str(getattr(last, "content", "")):
            self.hanging += 1
            if self.hanging == self.expected:
                self.hung.set()
            await self.release.wait()  # set once the log is taken
        reply = await super().request(request, *args, **kwargs)
        self.requests.clear()
        return reply


def _options(storage: Any, model: ScriptedModel, tag: str, self_check: bool) -> AgentHarnessOptions:
    return AgentHarnessOptions(
        storage=storage,
        model_client=model,
        model=MODEL,
        ids=SequentialIds(f"{tag}-"),
        self_check=self_check,
    )


async def build_log(lanes: int, opened: int) -> tuple[LogItem, ...]:
    """A session of `lanes` lanes with one finished prompt each and `opened` open runs."""
    repo = MemorySessionRepo()
    await repo.create("build")
    lease = await repo.acquire_lease("build", owner="bench", ttl_ms=3_600_000)
    storage = await repo.open("build", lease=lease)
    model = _Model()
    model.expected = opened
    harness, _ = await AgentHarness.create(_options(storage, model, "b", self_check=False))
    names = [f"t{i:06d}" for i in range(1, lanes)]

    async def one(name: str) -> None:
        created = await harness.create_lane(name, None)
        assert isinstance(created, Ok), created
        result = await created.value.prompt("what changed?")
        assert isinstance(result, Ok) and result.value.kind == "completed", result

    result = await harness.prompt("what changed?")
    assert isinstance(result, Ok)
    for start in range(0, len(names), 256):
        await asyncio.gather(*(one(name) for name in names[start : start + 256]))
    hanging = [
        asyncio.create_task(lane.prompt("STALL here"))
        for lane in [await _lane(harness, name) for name in names[-opened:]]
    ]
    await model.hung.wait()  # each open run's step attempt is durable
    log = await storage.get_log()
    await harness.close()
    model.release.set()
    for task in hanging:
        task.cancel()
    await asyncio.gather(*hanging, return_exceptions=True)
    await repo.close()
    return log


async def _lane(harness: AgentHarness, name: str) -> Any:
    found = harness.lane(name)  # sync before lazy lanes, a coroutine after
    return await found if asyncio.iscoroutine(found) else found


async def create_ms(repo: SessionRepo, session_id: str, trials: int) -> tuple[float, int]:
    """The median wall time of `AgentHarness.create()` and the open operations it reported."""
    samples = []
    found = 0
    for _ in range(trials):
        lease = await repo.acquire_lease(session_id, owner="bench", ttl_ms=3_600_000)
        storage = await repo.open(session_id, lease=lease)
        options = _options(storage, _Model(), session_id, self_check=True)
        started = time.perf_counter()
        harness, suspended = await AgentHarness.create(options)
        samples.append(time.perf_counter() - started)
        found = len(suspended)
        await harness.close()
        await storage.close()
        await repo.release_lease(lease)
    return statistics.median(samples) * 1000, found


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", default="sqlite")
    parser.add_argument("--lanes", default="1000,10000,100000")
    parser.add_argument("--open", type=int, default=10)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--redis-url", default="")
    parser.add_argument("--appendfsync", default="everysec", choices=["everysec", "always"])
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument(
        "--log-cache",
        default="",
        help="directory keeping each size's built log (pickled) for later runs, e.g. to time "
        "another checkout on the same sessions",
    )
    args = parser.parse_args()
    if args.quick:
        args.lanes, args.trials = "200,2000", 1
    sizes = [int(n) for n in args.lanes.split(",")]
    workdir = tempfile.mkdtemp(prefix="lane-restore-bench-")
    chosen, stop = backends(args, workdir)
    try:  # the redis-server started above stops however this ends (Ctrl-C too)
        print(
            f"# lane_restore_bench on {platform.platform()}, {os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}; {args.open} open runs per session, "
            f"median of {args.trials} creates"
        )
        logs: dict[int, tuple[LogItem, ...]] = {}
        for size in sizes:
            started = time.perf_counter()
            cached = (
                Path(args.log_cache) / f"lanes-{size}-{args.open}.pickle"
                if args.log_cache
                else None
            )
            if cached is not None and cached.exists():
                logs[size] = pickle.loads(cached.read_bytes())
            else:
                logs[size] = await build_log(size, args.open)
                if cached is not None:
                    cached.parent.mkdir(parents=True, exist_ok=True)
                    cached.write_bytes(pickle.dumps(logs[size]))
            print(
                f"# {size:,} lanes: {len(logs[size]):,} log items, "
                f"ready in {time.perf_counter() - started:.1f} s",
                flush=True,
            )
        print(" | ".join(["backend", "lanes", "create ms", "open found", f"ratio to {sizes[0]:,}"]))
        for index, backend in enumerate(chosen):
            repo = backend.make(workdir)
            first: float | None = None
            for size in sizes:
                session_id = f"lanes-{index}-{size}"
                await repo.import_session(SessionMetadata(id=session_id, created_at=1), logs[size])
                elapsed, found = await create_ms(repo, session_id, args.trials)
                first = elapsed if first is None else first
                row = [backend.name, f"{size:,}", f"{elapsed:,.1f}", f"{found}"]
                print(" | ".join([*row, f"{elapsed / first:.2f}"]), flush=True)
            await repo.close()
    finally:
        stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    run_main(lambda: asyncio.run(main()))
