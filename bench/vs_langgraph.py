"""This runtime vs LangGraph + SqliteSaver on the same agent workload, in one run: a ratio table.

    .venv/bin/python bench/vs_langgraph.py                 # defaults vs defaults (~12 min)
    .venv/bin/python bench/vs_langgraph.py --durability full   # full vs full
    .venv/bin/python bench/vs_langgraph.py --quick         # small sizes, a smoke run (< 30 s)
    .venv/bin/python bench/vs_langgraph.py --ours-only     # our column only (no peer venv needed)
    .venv/bin/python bench/vs_langgraph.py --json-out vs.json --reps 5

The peer runs in its own venv (LangGraph and this project do not share one):

    python3 -m venv bench/.peer-venv
    bench/.peer-venv/bin/pip install -r bench/vs_langgraph.requirements.txt

One turn of the workload, on both sides: a user message of 64 characters -> the model calls the
one tool, ``lookup``, with ``{"item": "item-%06d"}`` -> the tool returns 32 characters -> the
model answers with 200 characters. The model is a deterministic fake that reads the turn number
from the last message only (O(1): its cost never grows with the history). Peer: a
``StateGraph(MessagesState)`` with a model node, a prebuilt ``ToolNode`` and ``tools_condition``
on ``SqliteSaver`` (``AsyncSqliteSaver`` for the concurrent run). Ours: ``AgentHarness`` over
``open_repo("sqlite:////...")`` with a ``ScriptedModel`` responder, one ``Tool`` with a pydantic
args model (``replay="never"``), compaction off (the peer never compacts), one lane per thread.
Both stores are SQLite in WAL mode. ``--durability defaults`` (the default) runs each side as
shipped: ours ``synchronous=effects`` (an fsync at each durability point: the ``never`` tool's
intent and the turn's end, D233), the peer ``durability="async"`` (a step's checkpoint written
while the next step runs) on ``synchronous=FULL``; ``--durability full`` runs ours
``synchronous=full`` and the peer ``durability="sync"``: every commit fsynced on both sides.

Every measurement is a child process of this driver (a fresh interpreter under the side's own
python; this same file), one repetition each, the two sides interleaved (who goes first
alternates) so machine noise hits both alike. Figures are medians over ``--reps``; read the
peer/ours ratios, not the absolute figures (a shared VM moves by tens of percent between runs).

* wall per turn at H: one thread grown turn by turn to max(H), every turn timed (``invoke`` /
  ``lane.prompt``, both return once the turn is durable); per turn the median over repetitions,
  then the median over turns H-9..H.
* write(2) bytes per turn: growth of ``wchar`` in /proc/self/io over the turn (every thread of
  the child: WAL frames and checkpoints), same window.
* turns/s: ``--threads`` threads x ``--turns`` turns on a fresh database; "one after another" =
  turn 1 of every thread, then turn 2, ... (peer: ``invoke``; ours: lanes of one session); "at
  once" = every thread's turns in its own coroutine, all started together (peer: ``ainvoke`` on
  one ``AsyncSqliteSaver``; ours: lanes of one session).
* resume with the messages loaded: from a closed database, time to a thread's full message list
  (peer: connect + ``SqliteSaver`` + ``compile`` + ``get_state``; ours: ``open_repo`` +
  ``acquire_lease`` (a durable write) + ``repo.open`` + ``AgentHarness.create`` +
  ``export_state``), checked to hold 4H messages.
* first turn after a restore: the store reopened (untimed), then the time of turn H+1; the
  peer's is its steady turn, ours loads the lane's context (cached from then on). The flatness
  row divides the figure at the largest H by the one at the smallest, per side. The peer's added
  checkpoint rows are deleted afterwards and ours runs on a copy, so each repetition sees H.
  Before each of these timed operations both sides collect garbage, untimed (`settle`): a
  full collection owed to the previous one must not land in the next.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import json
import os
import platform
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import import_module, metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness_core import (
        AgentHarness,
        AgentLane,
        ScriptedModel,
        SessionRepo,
        Tool,
        WriterLease,
    )

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve()
PEER_VENV = "bench/.peer-venv"
REQUIREMENTS = "bench/vs_langgraph.requirements.txt"
LEASE_TTL_MS = 6 * 3_600_000
perf = time.perf_counter

# -- the workload (both venvs: standard library only) --------------------------------------------

USER_CHARS, RESULT_CHARS, ANSWER_CHARS = 64, 32, 200
TOOL_NAME = "lookup"
TOOL_DESCRIPTION = "Look up an inventory item by its id and return its stock line."
_FILLER = (
    *("the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "while", "an"),
    *("agent", "checks", "the", "inventory", "ledger", "and", "reports", "a", "concise"),
    *("answer", "with", "the", "item", "status"),
)


def _fill(prefix: str, size: int, k: int) -> str:
    """Exactly `size` ASCII characters: `prefix`, then filler words starting at word `k`."""
    parts, length, i = [prefix], len(prefix), k
    while length < size:
        word = " " + _FILLER[i % len(_FILLER)]
        parts.append(word)
        length += len(word)
        i += 1
    return "".join(parts)[:size]


def user_text(k: int) -> str:
    return _fill(f"Turn {k:06d}: please check item-{k:06d} for me.", USER_CHARS, k)


def turn_of_user_text(text: str) -> int:
    return int(text[5:11])  # "Turn 000123: ..."


def tool_args(k: int) -> dict[str, str]:
    return {"item": f"item-{k:06d}"}


def call_id(k: int) -> str:
    return f"call-{k:06d}"


def turn_of_call_id(cid: str) -> int:
    return int(cid[5:])


def tool_result(item: str) -> str:
    k = int(item[5:])
    return _fill(f"{item}: in stock, qty {k % 97:02d}", RESULT_CHARS, k)


def answer_text(k: int) -> str:
    prefix = f"Answer for turn {k:06d}: item-{k:06d} is in stock (qty {k % 97:02d})."
    return _fill(prefix, ANSWER_CHARS, k)


def thread_of(h: int, hmax: int) -> str:
    """The thread (peer) / session (ours) holding H turns: the grown one for the largest H."""
    return "growth" if h == hmax else f"h{h}"


# -- measuring (both venvs) -----------------------------------------------------------------------


def io_counters() -> tuple[int, int]:
    """(bytes passed to write(2) and friends, write syscalls) by every thread of this process."""
    fields: dict[str, int] = {}
    with open("/proc/self/io") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = int(value)
    return fields["wchar"], fields["syscw"]


def settle() -> None:
    """Collect garbage before a timed section (untimed), as `timeit` keeps the collector out.

    The resume sections time several one-off operations in a row in one process; without this,
    a full collection owed to the previous (larger) one lands in whichever is timed next, on
    either side.
    """
    gc.collect()


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def percentile(xs: Sequence[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def rm_db(path: str) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + suffix)


def db_bytes(path: str) -> int:
    """The database with its WAL, as the closed store left them."""
    return sum(os.path.getsize(path + s) for s in ("", "-wal") if os.path.exists(path + s))


def copy_db(source: str, target: str) -> None:
    rm_db(target)
    for suffix in ("", "-wal"):
        if os.path.exists(source + suffix):
            shutil.copyfile(source + suffix, target + suffix)


def env_of(side: str) -> dict[str, Any]:
    names = (
        ("langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite", "langchain-core")
        if side == "peer"
        else ("durable-gateway", "pydantic")
    )
    packages: dict[str, str | None] = {}
    for name in names:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    return {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version, **packages}


# -- the peer: LangGraph + SqliteSaver (runs in the peer venv) ------------------------------------


class Peer:
    """LangGraph's names, imported by name: they exist only in the peer venv."""

    def __init__(self) -> None:
        for key in ("LANGCHAIN_TRACING_V2", "LANGSMITH_TRACING", "LANGCHAIN_TRACING"):
            os.environ[key] = "false"  # never talk to LangSmith
        messages = import_module("langchain_core.messages")
        self.AIMessage = messages.AIMessage
        self.HumanMessage = messages.HumanMessage
        self.ToolMessage = messages.ToolMessage
        self.SqliteSaver = import_module("langgraph.checkpoint.sqlite").SqliteSaver
        self.AsyncSqliteSaver = import_module("langgraph.checkpoint.sqlite.aio").AsyncSqliteSaver
        self.aiosqlite = import_module("aiosqlite")
        self.builder = self._graph()

    def _graph(self) -> Any:
        graph = import_module("langgraph.graph")
        prebuilt = import_module("langgraph.prebuilt")
        tool = import_module("langchain_core.tools").tool

        def lookup(item: str) -> str:
            return tool_result(item)

        def model(state: dict[str, Any]) -> dict[str, Any]:
            last = state["messages"][-1]
            if isinstance(last, self.HumanMessage):
                k = turn_of_user_text(last.content)
                call = {"name": TOOL_NAME, "args": tool_args(k), "id": call_id(k)}
                return {"messages": [self.AIMessage(content="", tool_calls=[call])]}
            if isinstance(last, self.ToolMessage):
                k = turn_of_call_id(last.tool_call_id)
                return {"messages": [self.AIMessage(content=answer_text(k))]}
            raise RuntimeError(f"unexpected last message {type(last).__name__}")

        builder = graph.StateGraph(graph.MessagesState)
        builder.add_node("model", model)
        builder.add_node(
            "tools", prebuilt.ToolNode([tool(TOOL_NAME, description=TOOL_DESCRIPTION)(lookup)])
        )
        builder.add_edge(graph.START, "model")
        builder.add_conditional_edges("model", prebuilt.tools_condition)
        builder.add_edge("tools", "model")
        return builder

    @staticmethod
    def connect(path: str) -> sqlite3.Connection:
        """What `SqliteSaver.from_conn_string` opens, with synchronous=FULL said out loud."""
        conn = sqlite3.connect(path, check_same_thread=False)
        conn.execute("PRAGMA synchronous=FULL")  # SQLite's default; the saver sets WAL itself
        return conn

    def app(self, conn: sqlite3.Connection) -> Any:
        return self.builder.compile(checkpointer=self.SqliteSaver(conn))

    def turn_input(self, k: int) -> dict[str, Any]:
        return {"messages": [self.HumanMessage(content=user_text(k))]}

    @staticmethod
    def check(out: dict[str, Any], k: int) -> None:
        messages = out["messages"]
        if len(messages) != 4 * k or messages[-1].content != answer_text(k):
            raise AssertionError(f"peer turn {k}: {len(messages)} messages, {messages[-1]!r}")


def cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def peer_growth(p: dict[str, Any]) -> dict[str, Any]:
    peer, path = Peer(), p["db"]
    rm_db(path)
    conn = peer.connect(path)
    app = peer.app(conn)
    wall, wchar, syscw = [], [], []
    for k in range(1, p["hmax"] + 1):
        turn = peer.turn_input(k)
        w0, s0 = io_counters()
        t0 = perf()
        out = app.invoke(turn, cfg("growth"), durability=p.get("durability", "async"))
        elapsed = perf() - t0
        w1, s1 = io_counters()
        peer.check(out, k)
        wall.append(elapsed)
        wchar.append(w1 - w0)
        syscw.append(s1 - s0)
    pragmas = [
        conn.execute(f"PRAGMA {name}").fetchone()[0] for name in ("journal_mode", "synchronous")
    ]
    conn.close()
    if pragmas != ["wal", 2]:
        raise AssertionError(f"peer store is not WAL + synchronous=FULL: {pragmas}")
    size = db_bytes(path)
    if not p["keep"]:
        rm_db(path)
    return {"wall_s": wall, "wchar": wchar, "syscw": syscw, "db_bytes": size}


def peer_resume(p: dict[str, Any]) -> dict[str, Any]:
    peer, path, hist, hmax = Peer(), p["db"], p["hist"], max(p["hist"])
    conn = peer.connect(path)
    app = peer.app(conn)
    for h in hist:  # the smaller threads are grown by the first repetition (untimed)
        if app.get_state(cfg(thread_of(h, hmax))).values.get("messages") is None:
            for k in range(1, h + 1):
                peer.check(
                    app.invoke(
                        peer.turn_input(k),
                        cfg(thread_of(h, hmax)),
                        durability=p.get("durability", "async"),
                    ),
                    k,
                )
    conn.close()

    def restore(h: int) -> float:
        settle()
        t0 = perf()
        conn = peer.connect(path)
        snapshot = peer.app(conn).get_state(cfg(thread_of(h, hmax)))
        elapsed = perf() - t0
        messages = snapshot.values["messages"]
        conn.close()
        if len(messages) != 4 * h or messages[-1].content != answer_text(h):
            raise AssertionError(f"peer resume H={h}: {len(messages)} messages")
        return elapsed

    restore(min(hist))  # warm-up: first-call costs of this interpreter are not a resume's
    loaded = {h: restore(h) for h in hist}
    first, second = {}, {}
    for h in p["first_turn_hist"]:
        marks = last_rowids(path)
        conn = peer.connect(path)
        app = peer.app(conn)
        settle()
        t0 = perf()
        peer.check(
            app.invoke(
                peer.turn_input(h + 1),
                cfg(thread_of(h, hmax)),
                durability=p.get("durability", "async"),
            ),
            h + 1,
        )
        t1 = perf()
        peer.check(
            app.invoke(
                peer.turn_input(h + 2),
                cfg(thread_of(h, hmax)),
                durability=p.get("durability", "async"),
            ),
            h + 2,
        )
        t2 = perf()
        conn.close()
        first[h], second[h] = t1 - t0, t2 - t1
        forget_after(path, marks)  # back to H turns for the next repetition
    return {"loaded_s": loaded, "first_turn_s": first, "second_turn_s": second}


PEER_TABLES = ("checkpoints", "writes")


def last_rowids(path: str) -> list[int]:
    raw = sqlite3.connect(path)
    try:
        return [
            raw.execute(f"SELECT coalesce(max(rowid), 0) FROM {t}").fetchone()[0]
            for t in PEER_TABLES
        ]
    finally:
        raw.close()


def forget_after(path: str, marks: list[int]) -> None:
    """Delete the peer's rows written since `marks`: the thread's latest is the old one again."""
    raw = sqlite3.connect(path)
    try:
        with raw:
            for table, mark in zip(PEER_TABLES, marks, strict=True):
                raw.execute(f"DELETE FROM {table} WHERE rowid > ?", (mark,))
    finally:
        raw.close()


def peer_tp(p: dict[str, Any]) -> dict[str, Any]:
    peer, path, threads, turns = Peer(), p["db"], p["threads"], p["turns"]
    rm_db(path)
    latencies: list[float] = []
    if p["mode"] == "seq":
        conn = peer.connect(path)
        app = peer.app(conn)
        app.checkpointer.setup()
        t0 = perf()
        for k in range(1, turns + 1):
            for i in range(threads):
                started = perf()
                out = app.invoke(
                    peer.turn_input(k), cfg(f"t{i:04d}"), durability=p.get("durability", "async")
                )
                latencies.append(perf() - started)
                peer.check(out, k)
        wall = perf() - t0
        conn.close()
    else:

        async def run() -> float:
            conn = await peer.aiosqlite.connect(path)
            await conn.execute("PRAGMA synchronous=FULL")
            saver = peer.AsyncSqliteSaver(conn)
            await saver.setup()
            app = peer.builder.compile(checkpointer=saver)

            async def thread(i: int) -> None:
                for k in range(1, turns + 1):
                    started = perf()
                    out = await app.ainvoke(
                        peer.turn_input(k),
                        cfg(f"t{i:04d}"),
                        durability=p.get("durability", "async"),
                    )
                    latencies.append(perf() - started)
                    peer.check(out, k)

            t0 = perf()
            await asyncio.gather(*(thread(i) for i in range(threads)))
            wall = perf() - t0
            await conn.close()
            return wall

        wall = asyncio.run(run())
    rm_db(path)
    return tp_result(threads * turns, wall, latencies)


def tp_result(turns: int, wall: float, latencies: list[float]) -> dict[str, Any]:
    return {
        "turns": turns,
        "wall_s": wall,
        "turns_per_s": turns / wall,
        "p50_s": percentile(latencies, 50),
        "p95_s": percentile(latencies, 95),
    }


# -- ours: AgentHarness on the SQLite store (runs in this project's venv) -------------------------


def ours_url(path: str, p: dict[str, Any] | None = None) -> str:
    """The store's URL: `effects` (our default) or `full` (every commit fsynced)."""
    synchronous = "full" if (p or {}).get("durability") == "sync" else "effects"
    return f"sqlite:///{path}?synchronous={synchronous}"  # an absolute path: four slashes in all


def ours_model() -> ScriptedModel:
    import harness_core as hc

    def respond(request: hc.ModelRequest) -> hc.AssistantMessage:
        model.requests.clear()  # it records every request: a long thread would keep them all
        last = request.messages[-1]
        if isinstance(last, hc.ToolResultMessage):
            return hc.scripted.text(answer_text(turn_of_call_id(last.tool_call_id)))
        if isinstance(last, hc.UserMessage):
            k = turn_of_user_text(hc.message_text(last))
            return hc.scripted.tool_call(TOOL_NAME, tool_args(k), call_id=call_id(k))
        raise RuntimeError(f"unexpected last message {type(last).__name__}")

    # a window no history here reaches: compaction is off anyway, as the peer has none
    info = hc.ModelInfo(context_window=100_000_000, max_output_tokens=8_192)
    model = hc.ScriptedModel(responder=respond, info=info)
    return model


@functools.cache
def ours_tool() -> Tool:
    """The workload's tool, with a pydantic args model (built once per process)."""
    from pydantic import BaseModel

    import harness_core as hc

    class LookupArgs(BaseModel):
        item: str

    async def lookup(args: LookupArgs, ctx: hc.ToolContext) -> str:
        return tool_result(args.item)

    return hc.Tool(
        name=TOOL_NAME,
        description=TOOL_DESCRIPTION,
        execute=lookup,
        args_model=LookupArgs,
        replay="never",
    )


async def ours_open(
    url: str, session: str, *, create: bool, owner: str = "bench"
) -> tuple[SessionRepo, WriterLease, AgentHarness]:
    import harness_core as hc

    repo = hc.open_repo(url)
    if create:
        await repo.create(session)
    lease = await repo.acquire_lease(session, owner=owner, ttl_ms=LEASE_TTL_MS)
    storage = await repo.open(session, lease=lease)
    options = hc.AgentHarnessOptions(
        storage=storage,
        model_client=ours_model(),
        model=hc.ModelRef(provider="scripted", model_id="workload"),
        tools=[ours_tool()],
        compaction=hc.CompactionSettings(enabled=False),
    )
    harness, suspended = await hc.AgentHarness.create(options)
    assert not suspended, suspended
    return repo, lease, harness


async def ours_close(repo: SessionRepo, lease: WriterLease, harness: AgentHarness) -> None:
    await harness.close()
    await repo.release_lease(lease)
    await repo.close()


async def ours_turn(lane: AgentLane, k: int) -> None:
    import harness_core as hc

    result = await lane.prompt(user_text(k))
    if not (isinstance(result, hc.Ok) and result.value.kind == "completed"):
        raise AssertionError(f"our turn {k}: {result!r}")
    final = result.value.final_message
    if final is None or hc.message_text(final) != answer_text(k):
        raise AssertionError(f"our turn {k} answered {final!r}")


async def ours_messages(lane: AgentLane, h: int) -> int:
    import harness_core as hc

    messages = (await lane.export_state()).messages
    last = messages[-1] if messages else None
    if len(messages) != 4 * h or last is None or hc.message_text(last) != answer_text(h):
        raise AssertionError(f"our lane holds {len(messages)} messages, expected {4 * h}")
    return len(messages)


async def ours_growth(p: dict[str, Any]) -> dict[str, Any]:
    import harness_core as hc

    path = p["db"]
    rm_db(path)
    repo, lease, harness = await ours_open(ours_url(path, p), "growth", create=True)
    wall, wchar, syscw = [], [], []
    for k in range(1, p["hmax"] + 1):
        text = user_text(k)
        w0, s0 = io_counters()
        t0 = perf()
        result = await harness.prompt(text)
        elapsed = perf() - t0
        w1, s1 = io_counters()
        if not (isinstance(result, hc.Ok) and result.value.kind == "completed"):
            raise AssertionError(f"our turn {k}: {result!r}")
        wall.append(elapsed)
        wchar.append(w1 - w0)
        syscw.append(s1 - s0)
    await ours_messages(harness, p["hmax"])
    await ours_close(repo, lease, harness)
    size = db_bytes(path)
    if not p["keep"]:
        rm_db(path)
    return {"wall_s": wall, "wchar": wchar, "syscw": syscw, "db_bytes": size}


async def ours_resume(p: dict[str, Any]) -> dict[str, Any]:
    import harness_core as hc

    path, hist, hmax = p["db"], p["hist"], max(p["hist"])
    url = ours_url(path, p)
    repo = hc.open_repo(url)
    have = {meta.id for meta in await repo.list()}
    await repo.close()
    for h in hist:  # the smaller sessions are grown by the first repetition (untimed)
        if thread_of(h, hmax) not in have:
            repo, lease, harness = await ours_open(url, thread_of(h, hmax), create=True)
            for k in range(1, h + 1):
                await ours_turn(harness, k)
            await ours_close(repo, lease, harness)

    async def restore(h: int) -> tuple[float, float, float]:
        settle()
        t0 = perf()
        repo, lease, harness = await ours_open(url, thread_of(h, hmax), create=False)
        t1 = perf()
        await harness.export_state()
        t2 = perf()
        await ours_messages(harness, h)  # checked outside the timer
        await ours_close(repo, lease, harness)
        return t2 - t0, t1 - t0, t2 - t1

    await restore(min(hist))  # warm-up: first-call costs of this interpreter are not a resume's
    loaded, opened, exported = {}, {}, {}
    for h in hist:
        loaded[h], opened[h], exported[h] = await restore(h)
    first, second = {}, {}
    scratch = p["scratch"]
    for h in p["first_turn_hist"]:
        copy_db(path, scratch)  # the next repetition sees H turns again
        repo, lease, harness = await ours_open(
            ours_url(scratch, p), thread_of(h, hmax), create=False
        )
        settle()
        t0 = perf()
        await ours_turn(harness, h + 1)
        t1 = perf()
        await ours_turn(harness, h + 2)
        t2 = perf()
        await ours_close(repo, lease, harness)
        first[h], second[h] = t1 - t0, t2 - t1
    rm_db(scratch)
    return {
        "loaded_s": loaded,
        "open_create_s": opened,
        "export_s": exported,
        "first_turn_s": first,
        "second_turn_s": second,
    }


async def ours_tp(p: dict[str, Any]) -> dict[str, Any]:
    import harness_core as hc

    path, threads, turns = p["db"], p["threads"], p["turns"]
    rm_db(path)
    repo, lease, harness = await ours_open(ours_url(path, p), "tp", create=True)
    lanes = []
    for i in range(threads):
        created = await harness.create_lane(f"t{i:04d}", None)
        assert isinstance(created, hc.Ok), created
        lanes.append(created.value)
    latencies: list[float] = []

    async def timed(lane: AgentLane, k: int) -> None:
        started = perf()
        await ours_turn(lane, k)
        latencies.append(perf() - started)

    async def thread(lane: AgentLane) -> None:
        for k in range(1, turns + 1):
            await timed(lane, k)

    t0 = perf()
    if p["mode"] == "seq":
        for k in range(1, turns + 1):
            for lane in lanes:
                await timed(lane, k)
    else:
        await asyncio.gather(*(thread(lane) for lane in lanes))
    wall = perf() - t0
    await ours_messages(lanes[-1], turns)
    await ours_close(repo, lease, harness)
    rm_db(path)
    return tp_result(threads * turns, wall, latencies)


SECTIONS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "peer:growth": peer_growth,
    "peer:resume": peer_resume,
    "peer:tp": peer_tp,
    "ours:growth": ours_growth,
    "ours:resume": ours_resume,
    "ours:tp": ours_tp,
}


def child(name: str, params: str, out: str) -> None:
    result = SECTIONS[name](json.loads(params))
    if asyncio.iscoroutine(result):
        result = asyncio.run(result)
    result["env"] = env_of(name.split(":")[0])
    result["peak_rss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with open(out, "w") as f:
        json.dump(result, f)


# -- the driver -----------------------------------------------------------------------------------


@dataclass
class Run:
    """The driver's settings and what its children returned."""

    args: argparse.Namespace
    workdir: str
    results: dict[str, list[dict[str, Any]]]
    log: list[dict[str, Any]]


def run_child(run: Run, side: str, section: str, rep: int, params: dict[str, Any]) -> None:
    params = {**params, "durability": run.args.durability}
    python = run.args.peer_python if side == "peer" else run.args.ours_python
    out = os.path.join(run.workdir, f"{side}-{section}-{rep}.json")
    tag = f"{side} {section}" + (f" {params['mode']}" if "mode" in params else "") + f" #{rep}"
    command = [python, str(HERE), "--child", f"{side}:{section}", "--params", json.dumps(params)]
    print(f"[vs_langgraph] {tag} ...", file=sys.stderr, flush=True)
    load1 = os.getloadavg()[0]
    started = perf()
    done = subprocess.run([*command, "--result", out], cwd=ROOT, stdout=sys.stderr)
    seconds = perf() - started
    if done.returncode != 0:
        raise SystemExit(f"vs_langgraph: child {tag} failed (exit {done.returncode})")
    with open(out) as f:
        result: dict[str, Any] = json.load(f)
    key = f"{side}:{section}" + (f":{params['mode']}" if "mode" in params else "")
    run.results.setdefault(key, []).append(result)
    run.log.append({"step": tag, "seconds": round(seconds, 2), "load1": load1})
    print(f"[vs_langgraph] {tag} done in {seconds:.1f} s", file=sys.stderr, flush=True)


def drive(run: Run) -> None:
    a, hmax = run.args, max(run.args.hist)
    sides = ["ours"] if a.ours_only else ["ours", "peer"]

    def pair(rep: int) -> list[str]:  # who goes first alternates
        return sides if rep % 2 == 0 else sides[::-1]

    def db(name: str) -> str:
        return os.path.join(run.workdir, name)

    for rep in range(a.reps):
        for side in pair(rep):
            keep = rep == a.reps - 1
            params = {"hmax": hmax, "db": db(f"{side}-growth-{rep}.db"), "keep": keep}
            run_child(run, side, "growth", rep, params)
    extremes = sorted({min(a.hist), hmax})
    for rep in range(a.reps):
        for side in pair(rep):
            params = {
                "db": db(f"{side}-growth-{a.reps - 1}.db"),
                "hist": a.hist,
                "first_turn_hist": extremes,
                "scratch": db(f"{side}-scratch.db"),
            }
            run_child(run, side, "resume", rep, params)
    for side in sides:
        rm_db(db(f"{side}-growth-{a.reps - 1}.db"))
    for rep in range(a.reps):
        for mode in ("seq", "concurrent"):
            for side in pair(rep):
                params = {
                    "db": db(f"{side}-tp-{mode}-{rep}.db"),
                    "threads": a.threads,
                    "turns": a.turns,
                    "mode": mode,
                }
                run_child(run, side, "tp", rep, params)


@dataclass
class Row:
    figure: str
    unit: str
    peer: float | None
    ours: float | None
    higher_is_better: bool


def window(reps: list[dict[str, Any]], field: str, h: int) -> float:
    """Per turn the median over repetitions, then the median over turns H-9..H."""
    per_turn = [median([r[field][i] for r in reps]) for i in range(max(0, h - 10), h)]
    return median(per_turn)


def rows_of(run: Run) -> list[Row]:
    a, res = run.args, run.results
    hmin, hmax = min(a.hist), max(a.hist)
    sides = ("peer", "ours") if "peer:growth" in res else ("ours",)

    def growth(side: str, field: str, h: int) -> float:
        return window(res[f"{side}:growth"], field, h)

    def resume(side: str, key: str, h: int) -> float:
        return median([r[key][str(h)] for r in res[f"{side}:resume"]])

    def tp(side: str, mode: str) -> float:
        return median([r["turns_per_s"] for r in res[f"{side}:tp:{mode}"]])

    def flatness(side: str) -> float:
        return resume(side, "first_turn_s", hmax) / resume(side, "first_turn_s", hmin)

    def row(figure: str, unit: str, fn: Callable[..., float], *args: Any) -> Row:
        peer = fn("peer", *args) if "peer" in sides else None
        return Row(figure, unit, peer, fn("ours", *args), higher_is_better=unit == "turns/s")

    shape = f"{a.threads} threads x {a.turns} turns"
    rows = [
        row(f"wall per turn, H={h} (turns {max(1, h - 9)}..{h})", "ms", growth, "wall_s", h)
        for h in a.hist
    ]
    rows.append(
        row(
            f"bytes through write(2) per turn, H={hmin} (turns {max(1, hmin - 9)}..{hmin})",
            "KiB",
            growth,
            "wchar",
            hmin,
        )
    )
    rows.append(row(f"turns/s, one after another ({shape})", "turns/s", tp, "seq"))
    rows.append(row(f"turns/s, {a.threads} threads at once ({shape})", "turns/s", tp, "concurrent"))
    rows += [
        row(f"resume with the messages loaded, H={h}", "ms", resume, "loaded_s", h) for h in a.hist
    ]
    rows += [
        row(f"first turn after a restore, H={h}", "ms", resume, "first_turn_s", h)
        for h in sorted({hmin, hmax})
    ]
    rows.append(row(f"first turn after a restore, H={hmax} / H={hmin} (flatness)", "x", flatness))
    return rows


def shown(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "ms":
        return f"{value * 1e3:,.2f}"
    if unit == "KiB":
        return f"{value / 1024:,.1f}"
    if unit == "x":
        return f"{value:,.2f}"
    return f"{value:,.1f}"


def verdict(row: Row) -> tuple[str, str]:
    """(peer/ours, which side is ahead and by how much)."""
    if row.peer is None or row.ours is None:
        return "-", "-"
    ratio = row.peer / row.ours
    ours_ahead = ratio < 1 if row.higher_is_better else ratio > 1
    factor = max(ratio, 1 / ratio)
    return f"{ratio:,.2f}", f"{'ours' if ours_ahead else 'peer'} {factor:,.1f}x"


def machine_line(run: Run) -> str:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    ours = run.results["ours:growth"][0]["env"]
    line = (
        f"# machine: {platform.platform()}, {os.cpu_count()} CPUs ({cpu}); "
        f"ours: Python {ours['python']}, SQLite {ours['sqlite']}, harness_core at {git_head()}"
    )
    if "peer:growth" in run.results:
        peer = run.results["peer:growth"][0]["env"]
        line += (
            f"; peer: Python {peer['python']}, SQLite {peer['sqlite']}, "
            f"langgraph {peer['langgraph']}, langgraph-checkpoint-sqlite "
            f"{peer['langgraph-checkpoint-sqlite']}, langchain-core {peer['langchain-core']}"
        )
    return line


def git_head() -> str:
    """The commit of the measured code, and whether harness_core differs from it."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "?"
    changed = git("status", "--porcelain", "--", "harness_core")
    return head + (" + uncommitted harness_core changes" if changed else "")


def report(run: Run, rows: list[Row], seconds: float) -> None:
    a = run.args
    print(machine_line(run))
    print(
        f"# medians over {a.reps} rep{'s' if a.reps > 1 else ''}; "
        + (
            "defaults against defaults: ours synchronous=effects (fsync at durability points), "
            "the peer durability='async' on synchronous=FULL"
            if a.durability == "async"
            else "full against full: ours synchronous=full, the peer durability='sync' on "
            "synchronous=FULL (every commit fsynced on both sides)"
        )
        + "; one turn = 64-char user message -> one lookup tool call -> "
        "32-char result -> 200-char answer; "
        f"H = turns of history; run took {seconds:.0f} s, 1-min load average "
        f"{run.log[0]['load1']:.2f} at the start, {os.getloadavg()[0]:.2f} at the end"
    )
    header = ["figure", "unit", "peer", "ours", "peer/ours", "ahead"]
    table = [header]
    for row in rows:
        table.append(
            [
                row.figure,
                row.unit,
                shown(row.peer, row.unit),
                shown(row.ours, row.unit),
                *verdict(row),
            ]
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        cells = [
            cell.ljust(w) if i < 2 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        ]
        print(" | ".join(cells).rstrip())
    print("# peer/ours > 1: ours is cheaper (ms, KiB, flatness); for turns/s, < 1: ours is faster")


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    default_peer = ROOT / PEER_VENV / "bin" / "python"
    parser.add_argument("--peer-python", default=str(default_peer), help="the peer venv's python")
    parser.add_argument("--ours-python", default=sys.executable, help="python with this project")
    parser.add_argument("--ours-only", action="store_true", help="our column only (peer: -)")
    parser.add_argument("--hist", default="10,100,1000", help="history lengths H, in turns")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of every measurement")
    parser.add_argument("--threads", type=int, default=200, help="threads in the turns/s runs")
    parser.add_argument("--turns", type=int, default=5, help="turns per thread in those runs")
    parser.add_argument(
        "--durability",
        choices=("defaults", "full"),
        default="defaults",
        help="defaults: ours synchronous=effects vs the peer's durability='async' (both as "
        "shipped); full: ours synchronous=full vs the peer's durability='sync'",
    )
    parser.add_argument("--json-out", default="", help="also write every figure to this file")
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--params", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--result", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.durability in ("defaults", "full"):  # what the children get: the peer's word
        args.durability = "async" if args.durability == "defaults" else "sync"
    if args.quick:
        args.hist, args.reps, args.threads, args.turns = "5,20", 1, 10, 3
    args.hist = sorted({int(h) for h in str(args.hist).split(",")})
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.child:
        child(args.child, args.params, args.result)
        return 0
    if not args.ours_only and not os.path.exists(args.peer_python):
        print(
            f"vs_langgraph: no peer venv python at {args.peer_python}; create it with "
            f"`python3 -m venv {PEER_VENV} && {PEER_VENV}/bin/pip install -r {REQUIREMENTS}` "
            "(or pass --peer-python PATH, or --ours-only)",
            file=sys.stderr,
        )
        return 2
    started = perf()
    run = Run(args, tempfile.mkdtemp(prefix="vs-langgraph-"), {}, [])
    try:
        drive(run)
    finally:
        shutil.rmtree(run.workdir, ignore_errors=True)
    seconds = perf() - started
    rows = rows_of(run)
    report(run, rows, seconds)
    if args.json_out:
        summary = [
            {**row.__dict__, "peer_over_ours": verdict(row)[0], "ahead": verdict(row)[1]}
            for row in rows
        ]
        dump = {
            "settings": {
                k: v for k, v in vars(args).items() if k not in ("child", "params", "result")
            },
            "machine": machine_line(run),
            "seconds": seconds,
            "rows": summary,
            "steps": run.log,
            "results": run.results,
        }
        with open(args.json_out, "w") as f:
            json.dump(dump, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file too
    from bench.interrupt import run_main

    sys.exit(run_main(main))
