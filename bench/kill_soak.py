"""Kill soak: SIGKILL a running agent process many times and check every recovery.

    python bench/kill_soak.py                       # 200 kills on SQLite and on Redis
    python bench/kill_soak.py --kills 1000 --backends sqlite --seed 7

The CI test (`tests/harness_core/test_kill_soak.py`) runs 20 kills per backend; this runs the
same agent and checks with as many kills as you like and prints what happened: kills, how many
landed mid-operation, recoveries checked, charges made (none may happen twice), and the time.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/kill_soak.py` as well as `-m bench.kill_soak`
    sys.path.insert(0, str(ROOT))

from bench.interrupt import run_main  # noqa: E402
from bench.store_bench import redis_url  # noqa: E402 (after the path fix above)
from tests.support.kill_soak import soak  # noqa: E402


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", default="sqlite,redis")
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--redis-url", default="")
    parser.add_argument("--appendfsync", default="everysec", choices=["everysec", "always"])
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kill-soak-"))
    server_url, stop = redis_url(args, str(workdir))
    print("backend | kills | mid-operation | recoveries checked | charges | seconds")
    try:
        for backend in args.backends.split(","):
            url = (
                f"sqlite:///{workdir}/soak.db"
                if backend == "sqlite"
                else server_url + "?prefix=soak"
            )
            started = time.perf_counter()
            report = await soak(
                url, workdir / f"effects-{backend}.log", kills=args.kills, seed=args.seed, cwd=ROOT
            )
            print(
                f"{backend} | {report.kills} | {report.open_at_kill} | {len(report.checks)} | "
                f"{report.charges} | {time.perf_counter() - started:.0f}",
                flush=True,
            )
    finally:
        stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    run_main(lambda: asyncio.run(main()))
