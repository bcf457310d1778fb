"""The runtime's own cost per prompt on the memory backend: CPU time, instructions, a profile.

    python bench/prompt_instructions.py                    # CPU ms per prompt, 16 lanes
    python bench/prompt_instructions.py --instructions     # also instructions (valgrind)
    python bench/prompt_instructions.py --profile 25       # cProfile's top 25 by own time
    python bench/prompt_instructions.py --collector gateway  # as `gateway serve` runs it

The workload is `bench/harness_bench.py`'s prompt (a tool call, its result, a 200-character
answer; 11 writes in 4 commits and the self-check) on the memory backend, `--lanes` lanes of one
session taking `--prompts` prompts in all, after `--warmup` prompts that are not counted. No
storage cost is in any figure: this is the runtime's Python.

``--collector gateway`` tunes Python's cyclic garbage collector as `gateway serve` does once it
has started (D122, D383: the start-up heap frozen, the young generation collected every 5,000
allocations); the default leaves Python's own (700), as any other host of the library would.

CPU time moves by tens of percent between runs of a shared machine; instructions do not.
``--instructions`` runs the workload twice under ``valgrind --tool=callgrind`` (with the
prompts, and with none: the same start, imports and setup) and prints the difference per
prompt, which only a change of the code moves.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/prompt_instructions.py` as well as `-m bench....`
    sys.path.insert(0, str(ROOT))

from bench import callgrind  # noqa: E402
from bench.harness_bench import COLLECTORS, open_harness, prompt, tune, with_lanes  # noqa: E402
from bench.interrupt import run_main  # noqa: E402
from harness_core.storage.memory import MemorySessionRepo  # noqa: E402


async def run(
    prompts: int,
    lanes: int,
    warmup: int,
    profile: cProfile.Profile | None,
    collector: str = "python",
) -> float:
    """CPU milliseconds per counted prompt (0 prompts: the setup alone, 0.0)."""
    harness, _, _ = await open_harness(MemorySessionRepo(), "cpu", create=True)
    handles = await with_lanes(harness, lanes)
    tune(collector)

    async def drive(lane: Any, count: int) -> None:
        for _ in range(count):
            await prompt(lane)

    await asyncio.gather(*(drive(lane, warmup // lanes) for lane in handles))
    per_lane = prompts // lanes
    cpu = time.process_time()
    if profile is not None:
        profile.enable()
    await asyncio.gather(*(drive(lane, per_lane) for lane in handles))
    if profile is not None:
        profile.disable()
    cpu = time.process_time() - cpu
    await harness.close()
    done = per_lane * lanes
    return 1000 * cpu / done if done else 0.0


def instructions(prompts: int, lanes: int, warmup: int, collector: str) -> int:
    """Instructions callgrind counted for a child run of `prompts` prompts."""
    args = ["--child", "--prompts", str(prompts), "--lanes", str(lanes), "--warmup", str(warmup)]
    args += ["--collector", collector]
    return callgrind.instructions(__file__, args, "prompt_instructions")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=800, help="counted prompts (800)")
    parser.add_argument("--lanes", type=int, default=16, help="lanes taking them (16)")
    parser.add_argument("--warmup", type=int, default=160, help="uncounted prompts first (160)")
    parser.add_argument("--instructions", action="store_true", help="count them (valgrind)")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile's top N")
    parser.add_argument(
        "--collector",
        choices=COLLECTORS,
        default="python",
        help="Python's GC, or as serve tunes it",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # under valgrind: the workload only
        asyncio.run(run(args.prompts, args.lanes, args.warmup, None, args.collector))
        return
    profile = cProfile.Profile() if args.profile else None
    cpu = asyncio.run(run(args.prompts, args.lanes, args.warmup, profile, args.collector))
    print(
        f"memory backend, {args.lanes} lanes, {args.prompts} prompts after {args.warmup}, "
        f"{args.collector}'s collector: {cpu:.3f} ms of CPU a prompt"
        + (" (under cProfile)" if profile else "")
    )
    if args.instructions:
        callgrind.require_valgrind("prompt_instructions")
        small = max(args.prompts // 10, args.lanes)
        counted = instructions(args.prompts, args.lanes, args.warmup, args.collector)
        base = instructions(small, args.lanes, args.warmup, args.collector)
        per = (counted - base) / (
            args.prompts // args.lanes * args.lanes - small // args.lanes * args.lanes
        )
        print(
            f"instructions a prompt (callgrind, {args.prompts} less {small} prompts): {per / 1e6:.2f} M"
        )
    if profile is not None:
        stats = pstats.Stats(profile)
        stats.sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    run_main(main)
