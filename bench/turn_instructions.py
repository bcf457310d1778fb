"""One SQLite turn of `bench/vs_langgraph.py`'s workload: wall, CPU and instructions a turn.

    .venv/bin/python bench/turn_instructions.py                  # wall and CPU ms a turn
    .venv/bin/python bench/turn_instructions.py --instructions   # also instructions (valgrind)
    .venv/bin/python bench/turn_instructions.py --profile 30     # cProfile's top 30 (loop only)
    .venv/bin/python bench/turn_instructions.py --durability full

Our side of `vs_langgraph`'s "wall per turn" alone (the same `ours_open` / `ours_turn`: a user
message, one `lookup` tool call with a pydantic args model, its result, a 200-character answer,
on `sqlite:///...?synchronous=effects`, or `full`), one thread: `--history` turns first (not
counted), then `--turns` turns. It prints wall and CPU milliseconds a turn, CPU for the whole
process (the SQLite I/O thread included) and for the event loop's thread alone.

Wall and CPU time move by tens of percent between runs of a shared machine; instructions do
not. ``--instructions`` runs the workload twice under ``valgrind --tool=callgrind`` (every
thread, SQLite's C code included), with the turns and with none after the same history, and
prints the difference per turn, which only a change of the code moves.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/turn_instructions.py` as well as `-m bench....`
    sys.path.insert(0, str(ROOT))

from bench import callgrind  # noqa: E402
from bench import vs_langgraph as vs  # noqa: E402
from bench.interrupt import run_main  # noqa: E402


async def run(
    history: int, turns: int, durability: str, profile: cProfile.Profile | None
) -> tuple[float, float, float]:
    """Wall, process CPU and loop-thread CPU milliseconds a counted turn (0 turns: zeros)."""
    with tempfile.TemporaryDirectory(prefix="turn-instructions-") as tmp:
        url = vs.ours_url(f"{tmp}/ours.db", {"durability": durability})
        repo, lease, harness = await vs.ours_open(url, "thread", create=True)
        for k in range(1, history + 1):
            await vs.ours_turn(harness, k)
        wall, cpu, loop = time.perf_counter(), time.process_time(), time.thread_time()
        if profile is not None:
            profile.enable()
        for k in range(history + 1, history + turns + 1):
            await vs.ours_turn(harness, k)
        if profile is not None:
            profile.disable()
        wall = time.perf_counter() - wall
        cpu, loop = time.process_time() - cpu, time.thread_time() - loop
        await vs.ours_close(repo, lease, harness)
    per = 1000 / turns if turns else 0.0
    return wall * per, cpu * per, loop * per


def instructions(history: int, turns: int, durability: str) -> int:
    """Instructions callgrind counted for a child run of `history` then `turns` turns."""
    args = ["--child", "--history", str(history), "--turns", str(turns)]
    return callgrind.instructions(
        __file__, [*args, "--durability", durability], "turn_instructions"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--history", type=int, default=10, help="turns first, uncounted (10)")
    parser.add_argument("--turns", type=int, default=300, help="counted turns (300)")
    parser.add_argument(
        "--durability", choices=["effects", "full"], default="effects", help="ours (effects)"
    )
    parser.add_argument("--instructions", action="store_true", help="count them (valgrind)")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile's top N")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.turns < 1 and not args.child:
        parser.error("--turns must be at least 1")
    durability = "sync" if args.durability == "full" else "async"  # vs_langgraph's names
    if args.child:  # under valgrind: the workload only
        asyncio.run(run(args.history, args.turns, durability, None))
        return
    profile = cProfile.Profile() if args.profile else None
    wall, cpu, loop = asyncio.run(run(args.history, args.turns, durability, profile))
    print(
        f"sqlite {args.durability}, {args.turns} turns after {args.history}: {wall:.3f} ms of "
        f"wall, {cpu:.3f} ms of CPU ({loop:.3f} on the loop's thread) a turn"
        + (" (under cProfile)" if profile else "")
    )
    if args.instructions:
        callgrind.require_valgrind("turn_instructions")
        counted = instructions(args.history, args.turns, args.durability)
        base = instructions(args.history, 0, args.durability)
        per = (counted - base) / args.turns
        print(f"instructions a turn (callgrind, {args.turns} turns less none): {per / 1e6:.2f} M")
    if profile is not None:
        stats = pstats.Stats(profile)
        stats.sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    run_main(main)
