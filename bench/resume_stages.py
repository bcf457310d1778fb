"""Resume with the messages loaded, stage by stage, in CPU time as well as wall time.

    .venv/bin/python bench/resume_stages.py                       # ours, H = 10, 100, 1000
    .venv/bin/python bench/resume_stages.py --peer-python bench/.peer-venv/bin/python
    .venv/bin/python bench/resume_stages.py --hist 5,20 --reps 2  # a smoke run

The resume of `bench/vs_langgraph.py` (same workload, same store settings: SQLite WAL with
``synchronous=FULL``), split into its stages: ``open_repo``, ``acquire_lease`` (a durable
write), ``repo.open``, ``AgentHarness.create``, the lane's first use, the context window read
(``entries``), its projection into messages (``project``) and ``export_state``. Each figure is
the minimum over ``--reps`` in a fresh process per H (the first resume of a process is a
warm-up, untimed), in CPU time (``time.process_time``: every thread of the process) and in wall
time. CPU time is what the code costs; on a shared machine whose other tenants keep the cores
busy, wall time mostly measures them (issue 28 was measured at a 1-minute load of 6 to 17 on
2 cores). With ``--peer-python``, the peer's ``get_state`` (LangGraph + SqliteSaver, in its own
venv, see `bench/vs_langgraph.py`) is timed the same way on its own database, grown first.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the repo's root
from bench import vs_langgraph as vs
from bench.interrupt import run_main

HERE = Path(__file__).resolve()
STAGES = ("open_repo", "acquire", "open", "create", "lane", "entries", "project", "export")


def _grow_ours(url: str, hist: Sequence[int]) -> None:
    async def run() -> None:
        for h in hist:
            repo, lease, harness = await vs.ours_open(url, vs.thread_of(h, max(hist)), create=True)
            for k in range(1, h + 1):
                await vs.ours_turn(harness, k)
            await vs.ours_close(repo, lease, harness)

    asyncio.run(run())


async def _ours_once(url: str, h: int, hmax: int) -> list[tuple[float, float]]:
    """One resume: per stage, (cpu, wall) seconds."""
    import harness_core as hc

    marks: list[tuple[float, float]] = []

    def mark() -> None:
        marks.append((time.process_time(), time.perf_counter()))

    gc.collect()
    mark()
    repo = hc.open_repo(url)
    mark()
    lease = await repo.acquire_lease(vs.thread_of(h, hmax), owner="bench", ttl_ms=vs.LEASE_TTL_MS)
    mark()
    storage = await repo.open(vs.thread_of(h, hmax), lease=lease)
    mark()
    options = hc.AgentHarnessOptions(
        storage=storage,
        model_client=vs.ours_model(),
        model=hc.ModelRef(provider="scripted", model_id="workload"),
        tools=[vs.ours_tool()],
        compaction=hc.CompactionSettings(enabled=False),
    )
    harness, _ = await hc.AgentHarness.create(options)
    mark()
    lane = await harness._lane_rt()  # the lane's first use (restore), on its own
    mark()
    await lane.context.entries()
    mark()
    await lane.context.messages()
    mark()
    state = await harness.export_state()
    mark()
    if len(state.messages) != 4 * h:
        raise AssertionError(f"our lane holds {len(state.messages)} messages, expected {4 * h}")
    await vs.ours_close(repo, lease, harness)
    return [(b[0] - a[0], b[1] - a[1]) for a, b in itertools.pairwise(marks)]


def _ours(url: str, h: int, hmax: int, reps: int) -> dict[str, Any]:
    async def run() -> list[list[tuple[float, float]]]:
        await _ours_once(url, h, hmax)  # warm-up: first-call costs are not a resume's
        return [await _ours_once(url, h, hmax) for _ in range(reps)]

    runs = asyncio.run(run())
    return {
        "cpu_ms": min(sum(c for c, _ in r) for r in runs) * 1000,
        "wall_ms": min(sum(w for _, w in r) for r in runs) * 1000,
        "stages_cpu_ms": {name: min(r[i][0] for r in runs) * 1000 for i, name in enumerate(STAGES)},
    }


def _peer(db: str, hist: Sequence[int], reps: int) -> dict[str, Any]:
    peer = vs.Peer()
    conn = peer.connect(db)
    app = peer.app(conn)
    for h in hist:  # grown once (untimed)
        if app.get_state(vs.cfg(vs.thread_of(h, max(hist)))).values.get("messages") is None:
            for k in range(1, h + 1):
                peer.check(app.invoke(peer.turn_input(k), vs.cfg(vs.thread_of(h, max(hist)))), k)
    conn.close()

    def once(h: int) -> tuple[float, float]:
        gc.collect()
        c0, w0 = time.process_time(), time.perf_counter()
        conn = peer.connect(db)
        snapshot = peer.app(conn).get_state(vs.cfg(vs.thread_of(h, max(hist))))
        c1, w1 = time.process_time(), time.perf_counter()
        if len(snapshot.values["messages"]) != 4 * h:
            raise AssertionError(f"peer H={h}: {len(snapshot.values['messages'])} messages")
        conn.close()
        return c1 - c0, w1 - w0

    once(min(hist))
    out: dict[str, Any] = {}
    for h in hist:
        runs = [once(h) for _ in range(reps)]
        out[str(h)] = {
            "cpu_ms": min(c for c, _ in runs) * 1000,
            "wall_ms": min(w for _, w in runs) * 1000,
        }
    return out


def _child(args: argparse.Namespace) -> None:
    params = json.loads(args.params)
    if args.child == "peer":
        result: Any = _peer(params["db"], params["hist"], params["reps"])
    else:
        result = _ours(params["url"], params["h"], params["hmax"], params["reps"])
    Path(args.result).write_text(json.dumps(result))


def _run_child(python: str, side: str, params: dict[str, Any], work: str) -> Any:
    out = os.path.join(work, f"{side}.json")
    command = [python, str(HERE), "--child", side, "--params", json.dumps(params), "--result", out]
    subprocess.run(command, check=True, cwd=HERE.parents[1], stdout=sys.stderr)
    return json.loads(Path(out).read_text())


def _table(rows: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(" | ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hist", default="10,100,1000", help="history lengths H, in turns")
    parser.add_argument("--reps", type=int, default=5, help="resumes per H (the minimum counts)")
    parser.add_argument(
        "--peer-python", default="", help="the peer venv's python (none: ours only)"
    )
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--params", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--result", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args)
        return 0
    hist = sorted({int(h) for h in str(args.hist).split(",")})
    if args.peer_python and not os.path.exists(args.peer_python):
        print(f"resume_stages: no peer python at {args.peer_python}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="resume-stages-") as work:
        url = vs.ours_url(os.path.join(work, "ours.db"))
        _grow_ours(url, hist)
        ours = {
            h: _run_child(
                sys.executable,
                "ours",
                {"url": url, "h": h, "hmax": max(hist), "reps": args.reps},
                work,
            )
            for h in hist
        }
        peer = None
        if args.peer_python:
            peer = _run_child(
                args.peer_python,
                "peer",
                {"db": os.path.join(work, "peer.db"), "hist": hist, "reps": args.reps},
                work,
            )
    rows = [["H", "ours cpu ms", "ours wall ms", "peer cpu ms", "peer wall ms", *STAGES]]
    for h in hist:
        mine: dict[str, Any] = ours[h]
        theirs = peer[str(h)] if peer else None
        rows.append(
            [
                str(h),
                f"{mine['cpu_ms']:.2f}",
                f"{mine['wall_ms']:.2f}",
                f"{theirs['cpu_ms']:.2f}" if theirs else "-",
                f"{theirs['wall_ms']:.2f}" if theirs else "-",
                *(f"{mine['stages_cpu_ms'][name]:.2f}" for name in STAGES),
            ]
        )
    print(f"# resume stages, minimum of {args.reps}; stage columns: ours, CPU ms")
    _table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
