"""Gateway service benchmark: web messages in, delivered replies out, over real `gateway serve`.

    python bench/gateway_bench.py                    # sqlite, redis1, redis2, then takeover
    python bench/gateway_bench.py --quick            # small sizes: a smoke run
    python bench/gateway_bench.py --only redis2 --messages 20000 --slots 16
    python bench/gateway_bench.py --only takeover --lease 3 --kills 5
    python bench/gateway_bench.py --only drain --drain-leases 30,60
    python bench/gateway_bench.py --only sqlite --profile /tmp/prof   # cProfile every process

Setups: ``sqlite`` (one process; store, broker and web mailbox each a SQLite file), ``redis1``
(one process; all three in one private redis-server, AOF everysec) and ``redis2`` (two
processes on that server, posts spread over both). The model is ``scripted:echo`` ("You said:
<text>", no model time), so what is measured is the gateway itself: HTTP intake, inbox,
workers, store, reply scan, outbox, deliverer and web mailbox. `--threads` web threads (lanes;
1,000) are spread over `--spaces` spaces (sessions ``web-<space>``; 50): one session is worked
by one process at a time, so the spaces are what runs in parallel.

Phases of a setup (every message has a unique text, and its reply repeats it):

1. warm-up: one message per thread (creates every lane); its rate is shown, not judged.
2. saturated: `--messages` messages round robin over the threads, posted by closed-loop
   senders that keep at most `--window` messages unanswered: the system always has work, yet
   no thread gets a second message before its first is answered (no steering merges).
   Throughput = replies per second between the 10% and 90% marks of the phase's replies.
3. latency: an open-loop schedule at `--rate` messages/s (default: half the saturated
   throughput) for `--seconds`; p50/p99 of accept -> reply.
4. breakdown: for a sample of the latency phase, where the time went, from the timestamps the
   service wrote itself: server receipt -> run started (inbox append, 202, worker pickup, lane
   start); run (the started -> finished records); reply scan (finished -> outbox enqueue);
   delivery (enqueue -> the reply in the mailbox).

Accept -> reply is the reply item's ``at_ms`` (the deliverer's clock as it writes the reply into
the web mailbox; readers see it one mailbox write later) minus the client's clock when the
POST's 202 arrived: both are this machine's ``time.time``, so no event stream is needed (a
thousand open streams would load the service being measured). While a phase runs, replies are
counted from the mailbox backend directly (one SQL sum, or one Lua call summing the threads'
counters) every `--poll-ms`.

Cost accounting per phase: CPU seconds of every process (/proc), of this load generator, and of
the whole machine ("others": whatever else runs on it, which skews wall-clock figures on a
shared machine); Redis commands per reply (``INFO commandstats``, counting the commands Lua
scripts run, minus the bench's own); session takes per reply (each process's
``gateway_session_takes_total`` on ``/metrics``: a take acquires the session's writer lease and
restores it; the store's fence counter, read before, is a clock on Redis since D339).

Drain (Redis, one process, then the next; for each lease length in `--drain-leases`): one
`/slow` step (the test agent's tool, `--drain-step-ms`) in each of `--slots` sessions, so the
process holds every one of them mid-step; SIGTERM with a drain shorter than the step (the
drain cuts it), then start the next process and time each session's reply from that start and
from its readiness. The step runs again after the resume, so a reply comes at least a step
after the session was taken; the lease is what a hand-over that releases nothing would wait.

Takeover (Redis, two processes, lease `--lease` s, renew `--renew` s): under a background load
through the survivor, SIGKILL the other process, read from the store which sessions it held
(their writer lease names its pid), post one probe to every session through the survivor at
once, and time each probe's reply from the kill; compared with the lease TTL (goal: <= TTL +
1 s) and with how much of each lease was left at the kill.

Figures are printed, never asserted. `--keep` keeps the work directory (the processes' logs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pstats
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/gateway_bench.py` as well as `-m bench....`
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import redis.asyncio as aioredis  # noqa: E402

from adapters.web import open_mailbox  # noqa: E402
from adapters.web.mailbox import WebItem, WebMailbox  # noqa: E402
from bench.interrupt import run_main  # noqa: E402
from gateway.broker import open_broker  # noqa: E402
from harness_core import open_repo  # noqa: E402
from harness_core.session.types import RecordQuery  # noqa: E402
from tests.support.gateway_process import GatewayProcess  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402

SETUPS = ("sqlite", "redis1", "redis2", "takeover", "drain")
STORE_PREFIX = "gw"
"""The store's default Redis key prefix (``gw:{<session>}:meta``, ``...:lease``)."""
_SUM_COUNTERS = """
local total = 0
for i = 1, #KEYS do
  local n = redis.call('HGET', KEYS[i], '#')
  if n then total = total + tonumber(n) end
end
return total
"""
_T = TypeVar("_T")


def wall_ms() -> float:
    return time.time() * 1000.0


def pct(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def fmt(value: float, digits: int = 0) -> str:
    return "-" if value != value else f"{value:,.{digits}f}"


class Cpu:
    """CPU seconds used by some processes, by this one and by the whole machine."""

    TICK = os.sysconf("SC_CLK_TCK")

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.began = time.monotonic()
        self.start = self.sample()

    def sample(self) -> dict[str, float]:
        used: dict[str, float] = {}
        for name, pid in self.pids.items():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                used[name] = (int(fields[11]) + int(fields[12])) / self.TICK
            except (OSError, IndexError, ValueError):
                used[name] = float("nan")
        times = os.times()
        used["bench"] = times.user + times.system
        try:
            cpu = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
            used["machine"] = (sum(cpu) - cpu[3] - cpu[4]) / self.TICK  # all but idle, iowait
        except (OSError, ValueError, IndexError):
            used["machine"] = float("nan")
        return used

    def stop(self) -> tuple[float, dict[str, float]]:
        """Wall seconds since the start, and the CPU seconds each used meanwhile."""
        end = self.sample()
        return time.monotonic() - self.began, {k: end[k] - self.start[k] for k in end}


# -- a minimal HTTP/1.1 keep-alive client (cheap on CPU: the load generator shares the cores) --


class Http:
    """One keep-alive connection to one gateway (one request at a time)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """The status and the JSON body; ConnectionError when the link broke.

        A kept-alive connection the server closed meanwhile (uvicorn closes idle ones after
        5 s) is reopened and the request sent again.
        """
        data = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        try:
            reader, status_line = await self._send(head.encode() + b"\r\n" + data)
            if not status_line:
                raise ConnectionResetError("the server closed the connection")
            status = int(status_line.split()[1])
            length, close = 0, False
            while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    length = int(value)
                elif name == "connection" and value.strip().lower() == "close":
                    close = True
            payload = await reader.readexactly(length) if length else b""
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
            self.close()
            raise ConnectionError(f"{method} {path}: {type(exc).__name__}") from exc
        if close:
            self.close()
        return status, json.loads(payload) if payload else None

    async def _send(self, request: bytes) -> tuple[asyncio.StreamReader, bytes]:
        """Send `request`; the reader and the response's status line (empty: closed)."""
        for attempt in range(2):
            reused = self._writer is not None
            if self._reader is None or self._writer is None:
                self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
            reader, writer = self._reader, self._writer
            try:
                writer.write(request)
                status_line = await reader.readline()
            except ConnectionResetError:
                status_line = b""
            if status_line or not reused or attempt:
                return reader, status_line
            self.close()  # the server closed it while idle and read nothing: send it again
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


# -- messages, threads and what the bench reads back ---------------------------------------------


@dataclass
class Msg:
    key: str
    """Unique: the client message id and the text (the reply repeats it)."""
    space: str
    thread: str
    order: int
    """Posting order within its thread."""
    scheduled_ms: float = 0.0
    sent_ms: float = 0.0
    accepted_ms: float = 0.0
    """The client's clock when the 202 arrived (0: never accepted)."""
    received_ms: int = 0
    """The server's clock when it received the POST (the message item's at_ms)."""
    seq: int = 0
    """Its message item's place in the thread: the order the lane took it in, which may differ
    from `order` when two of a thread's messages were posted at once (0: not read yet)."""
    answered_ms: float = 0.0
    """The reply's at_ms (the deliverer's clock)."""
    reply_id: str = ""
    """Its own reply's delivery id (``reply:<session>:<run id>``)."""
    merged: bool = False
    """Answered by the reply to a later message of its thread (it was steered)."""


def attribute(items: Sequence[WebItem], msgs: list[Msg]) -> None:
    """Read a thread's new `items`: each message's place, and the replies that answer `msgs`.

    A reply holds every answer of its run, one a message it took after an answer (D296); each
    echo names the newest message the run had seen, and answers it and every message the lane
    took before it. The lane's order is the inbox's, which two messages posted at once may hold
    the other way round from the thread's: a reply answers every message up to the latest in
    the thread it names.
    """
    msgs.sort(key=lambda m: m.order)
    by_key = {m.key: m for m in msgs}
    for item in items:
        if item.kind == "message" and item.id in by_key:
            by_key[item.id].received_ms = item.at_ms
            by_key[item.id].seq = item.seq
            continue
        named = [by_key.get(part.strip()) for part in item.text.split("You said: ")[1:]]
        found = [m for m in named if m is not None]
        if item.kind not in ("reply", "failure_notice") or not found:
            continue
        target = max(found, key=lambda m: (m.seq, m.order))
        for msg in msgs:
            later = msg.seq > target.seq if msg.seq and target.seq else msg.order > target.order
            if not later and not msg.answered_ms and msg.accepted_ms:
                msg.answered_ms = float(item.at_ms)
                msg.reply_id = item.id if msg is target else ""
                msg.merged = msg is not target


@dataclass
class Layout:
    threads: list[tuple[str, str]]
    """(space, thread) per thread; thread i lives in space i % spaces."""
    probes: list[tuple[str, str]]
    """One probe thread per space (the takeover's probes)."""

    @classmethod
    def make(cls, threads: int, spaces: int) -> Layout:
        return cls(
            threads=[(f"s{i % spaces}", f"t{i}") for i in range(threads)],
            probes=[(f"s{s}", f"p{s}") for s in range(spaces)],
        )

    @property
    def sessions(self) -> list[str]:
        return [f"web-{space}" for space, _ in self.probes]


@dataclass
class Backends:
    """Where a setup's store, broker and web mailbox live."""

    settings: dict[str, str]
    store_url: str
    broker_url: str
    web_url: str
    redis: RedisServer | None = None
    directory: Path | None = None
    """The SQLite files' directory."""


def backends(kind: str, workdir: Path, server: RedisServer | None) -> Backends:
    if kind == "sqlite":
        urls = {name: f"sqlite:///{workdir}/{name[:-4]}.db" for name in ("store_url", "broker_url", "web_url")}  # fmt: skip
        return Backends(urls, urls["store_url"], urls["broker_url"], urls["web_url"], None, workdir)
    assert server is not None
    return Backends({"redis_url": server.url}, server.url, server.url, server.url, server)


class Cluster:
    """The gateway processes of one setup and the bench's read-only view of their backends."""

    def __init__(self, gateways: list[GatewayProcess], where: Backends, layout: Layout) -> None:
        self.gateways = gateways
        self.where = where
        self.layout = layout
        self.mailbox: WebMailbox = open_mailbox(where.web_url)
        self.redis: aioredis.Redis | None = None
        self.cursors: dict[tuple[str, str], int] = {}
        self.recorded = 0
        """Message items the channel recorded (202s with a seq): subtracted from item counts."""
        self.own: Counter[str] = Counter()
        """Redis commands the bench itself ran (subtracted from the service's)."""
        self._counters: list[str] = []
        self._sum: Any = None
        if where.redis is not None:
            self.redis = aioredis.Redis(port=where.redis.port, decode_responses=True)
            box: Any = self.mailbox
            self._counters = [
                box.thread_key(space, thread, "keys")
                for space, thread in layout.threads + layout.probes
            ]
            self._sum = self.redis.register_script(_SUM_COUNTERS)

    def pids(self) -> dict[str, int]:
        found = {g.name: g.process.pid for g in self.gateways if g.process is not None}
        if self.where.redis is not None and self.where.redis.process is not None:
            found["redis-server"] = self.where.redis.process.pid
        return found

    async def _sqlite(self, name: str, sql: str) -> int:
        assert self.where.directory is not None
        path = self.where.directory / name

        def query() -> int:
            if not path.exists():
                return 0
            with contextlib.closing(sqlite3.connect(path, timeout=5.0)) as conn:
                try:
                    return int(conn.execute(sql).fetchone()[0])
                except sqlite3.OperationalError:  # not created yet
                    return 0

        return await asyncio.to_thread(query)

    async def total_items(self) -> int:
        """Items in every thread's mailbox (messages and replies), read from the backend."""
        if self._sum is not None:
            self.own["evalsha"] += 1
            self.own["hget"] += len(self._counters)
            return int(await self._sum(keys=self._counters, args=[]))
        return await self._sqlite("web.db", "SELECT coalesce(sum(last_seq), 0) FROM web_threads")

    async def takes(self) -> int:
        """Sessions the running processes took so far (their ``/metrics`` counters)."""
        total = 0
        async with httpx.AsyncClient(timeout=10.0) as client:
            for gateway in self.gateways:
                scrape = (await client.get(f"{gateway.url}/metrics")).text
                for line in scrape.splitlines():
                    if line.startswith("gateway_session_takes_total "):
                        total += int(float(line.split()[1]))
        return total

    async def commands(self) -> dict[str, tuple[int, int]]:
        """``INFO commandstats``: calls and server microseconds by command (none: SQLite)."""
        if self.redis is None:
            return {}
        info = await self.redis.info("commandstats")
        return {
            name.removeprefix("cmdstat_"): (int(value["calls"]), int(value["usec"]))
            for name, value in info.items()
        }

    async def collect(self, messages: Iterable[Msg]) -> None:
        """Read the threads' new items; attribute each reply to the messages it answers."""
        by_thread: dict[tuple[str, str], list[Msg]] = {}
        for msg in messages:
            by_thread.setdefault((msg.space, msg.thread), []).append(msg)
        slots = asyncio.Semaphore(32)  # redis-py 8's pools refuse more than 100 at once

        async def one(where: tuple[str, str], msgs: list[Msg]) -> None:
            items: list[WebItem] = []
            after = self.cursors.get(where, 0)
            while True:
                async with slots:
                    page = await self.mailbox.read(*where, after=after, limit=500)
                self.own["xrange"] += 1
                items += page
                if len(page) < 500:
                    break
                after = page[-1].seq
            if items:
                self.cursors[where] = items[-1].seq
            attribute(items, msgs)

        await asyncio.gather(*(one(where, msgs) for where, msgs in by_thread.items()))

    async def close(self) -> None:
        for gateway in self.gateways:
            await asyncio.to_thread(gateway.stop)
        await self.mailbox.close()
        if self.redis is not None:
            await self.redis.aclose()


class ProfiledGateway(GatewayProcess):
    """`gateway serve` under cProfile (the stats are written when SIGTERM stops it)."""

    def __init__(self, *args: Any, profile: Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.profile = profile

    def start(self, *, wait_ready_s: float = 20.0) -> GatewayProcess:
        self.incarnation += 1
        out = self.profile / f"{self.name}.{self.incarnation}.prof"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cProfile", "-o", str(out), "-m", "gateway", "serve",
                 "--port", str(self.port)],
                cwd=self.directory,
                env={**self.env, "PYTHONPATH": str(ROOT)},
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        if wait_ready_s > 0:
            self.wait_ready(wait_ready_s)
        return self


async def start_cluster(
    name: str,
    count: int,
    workdir: Path,
    where: Backends,
    settings: dict[str, str],
    layout: Layout,
    profile: Path | None = None,
) -> Cluster:
    gateways: list[GatewayProcess] = []
    for n in range(count):
        if profile is not None:
            gateways.append(ProfiledGateway(f"{name}-gw{n}", workdir, settings, profile=profile))
        else:
            gateways.append(GatewayProcess(f"{name}-gw{n}", workdir, settings))
    for gateway in gateways:
        gateway.start(wait_ready_s=0)
    for gateway in gateways:
        await asyncio.to_thread(gateway.wait_ready, 30.0)
    return Cluster(gateways, where, layout)


# -- load ----------------------------------------------------------------------------------------


class Senders:
    """Posts messages over keep-alive connections, spread round robin over `targets`."""

    def __init__(self, cluster: Cluster, per_gateway: int, targets: list[GatewayProcess]) -> None:
        self.cluster = cluster
        self.links = [Http(g.port) for _ in range(per_gateway) for g in targets]
        self.errors: Counter[str] = Counter()
        """Refused or failed POSTs (each retried) by status, code and message."""

    async def post(self, link: Http, msg: Msg) -> None:
        """Post until a 202 (a retry repeats the message id: deduplicated)."""
        body = {"text": msg.key, "client_message_id": msg.key, "space": msg.space}
        for _ in range(20):
            msg.sent_ms = msg.sent_ms or wall_ms()
            try:
                status, answer = await link.request(
                    "POST", f"/web/threads/{msg.thread}/messages", body
                )
            except ConnectionError as exc:
                status, answer = 0, {"error": {"code": str(exc).rsplit(": ", 1)[-1]}}
            if status == 202:
                msg.accepted_ms = wall_ms()
                if answer.get("seq") is not None and not answer.get("duplicate"):
                    self.cluster.recorded += 1
                return
            error = (answer or {}).get("error", {})
            self.errors[f"{status} {error.get('code', '')}: {error.get('message', '')}"] += 1
            await asyncio.sleep(0.05)

    def close(self) -> None:
        for link in self.links:
            link.close()


async def replies_seen(cluster: Cluster, base: int) -> int:
    return await cluster.total_items() - base - cluster.recorded


async def wait_answered(
    cluster: Cluster, base: int, accepted: int, poll_s: float, stall_s: float = 10.0
) -> None:
    """Until `accepted` replies are in the mailboxes (or nothing moved for `stall_s`)."""
    last, moved = -1, time.monotonic()
    while (seen := await replies_seen(cluster, base)) < accepted:
        if seen != last:
            last, moved = seen, time.monotonic()
        elif time.monotonic() - moved > stall_s:
            return
        await asyncio.sleep(poll_s)


async def closed_loop(
    cluster: Cluster, senders: Senders, plan: list[Msg], window: int, poll_s: float
) -> None:
    """Post `plan` in order keeping at most `window` messages unanswered; wait for the replies."""
    base = await cluster.total_items() - cluster.recorded
    seen = started = 0
    pending = iter(plan)
    done = asyncio.Event()
    progress = asyncio.Event()

    async def poller() -> None:
        nonlocal seen
        while not done.is_set():
            seen = await replies_seen(cluster, base)
            progress.set()  # wakes the waiting senders
            progress.clear()
            await asyncio.sleep(poll_s)

    async def sender(link: Http) -> None:
        nonlocal started
        for msg in pending:
            while started - seen >= window:
                await progress.wait()
            started += 1
            await senders.post(link, msg)

    watch = asyncio.ensure_future(poller())
    try:
        await asyncio.gather(*(sender(link) for link in senders.links))
        await wait_answered(cluster, base, sum(1 for m in plan if m.accepted_ms), poll_s)
    finally:
        done.set()
        await watch
    await cluster.collect(plan)


async def open_loop(
    cluster: Cluster, senders: Senders, plan: list[Msg], rate: float, poll_s: float
) -> None:
    """Post `plan` on a fixed schedule (`rate` per second) whatever the answers; wait for them."""
    base = await cluster.total_items() - cluster.recorded
    queue: asyncio.Queue[Msg | None] = asyncio.Queue()
    began = wall_ms() + 50

    async def ticker() -> None:
        for n, msg in enumerate(plan):
            msg.scheduled_ms = began + n * 1000.0 / rate
            delay = (msg.scheduled_ms - wall_ms()) / 1000
            if delay > 0:
                await asyncio.sleep(delay)
            queue.put_nowait(msg)
        for _ in senders.links:
            queue.put_nowait(None)

    async def sender(link: Http) -> None:
        while (msg := await queue.get()) is not None:
            await senders.post(link, msg)

    await asyncio.gather(ticker(), *(sender(link) for link in senders.links))
    await wait_answered(cluster, base, sum(1 for m in plan if m.accepted_ms), poll_s)
    await cluster.collect(plan)


def round_robin(layout: Layout, prefix: str, count: int, first_order: int) -> list[Msg]:
    """`count` messages over every thread in turn (a thread's next one comes a round later)."""
    n = len(layout.threads)
    return [
        Msg(f"{prefix}{k}", *layout.threads[k % n], order=first_order + k // n)
        for k in range(count)
    ]


def warm_up_plan(layout: Layout) -> list[Msg]:
    """One message per thread and per probe thread (every lane exists afterwards)."""
    where = layout.threads + layout.probes
    return [Msg(f"w{k}", space, thread, 0) for k, (space, thread) in enumerate(where)]


# -- one setup ------------------------------------------------------------------------------------


@dataclass
class Usage:
    """What a phase cost: CPU by process, Redis commands, session takes."""

    phase: str
    replies: int = 0
    wall: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    commands: dict[str, tuple[int, int]] = field(default_factory=dict)
    takes: int = 0


async def measured(cluster: Cluster, usage: Usage, work: Awaitable[_T]) -> _T:
    """Run `work`, filling `usage` with what it cost (all but `replies`)."""
    meter = Cpu(cluster.pids())
    before, takes = await cluster.commands(), await cluster.takes()
    own = Counter(cluster.own)
    result = await work
    usage.wall, usage.cpu = meter.stop()
    usage.takes = await cluster.takes() - takes
    ours = cluster.own - own
    for name, (calls, usec) in (await cluster.commands()).items():
        was_calls, was_usec = before.get(name, (0, 0))
        if name not in ("info", "config|resetstat"):
            usage.commands[name] = (calls - was_calls - ours.get(name, 0), usec - was_usec)
    return result


@dataclass
class Result:
    setup: str
    processes: int
    warmup_rate: float = 0.0
    saturated: float = 0.0
    merged: int = 0
    unanswered: int = 0
    left: list[str] = field(default_factory=list)
    """The unanswered messages: where, which, and the thread place the lane took it at."""
    left_after: list[str] = field(default_factory=list)
    """What each unanswered message's thread held from it on, read at the setup's end."""
    rate: float = 0.0
    achieved_rate: float = 0.0
    lat: list[float] = field(default_factory=list)
    post: list[float] = field(default_factory=list)
    send_lag: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    phases: dict[str, list[float]] = field(default_factory=dict)
    usage: list[Usage] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def throughput(msgs: Sequence[Msg]) -> float:
    """Replies/s between the 10% and 90% marks of the answers (ramp-up and tail left out)."""
    times = sorted(m.answered_ms for m in msgs if m.answered_ms)
    if len(times) < 10:
        return float("nan")
    low, high = len(times) // 10, (len(times) * 9) // 10
    span = (times[high] - times[low]) / 1000
    return (high - low) / span if span > 0 else float("nan")


async def breakdown(cluster: Cluster, msgs: Sequence[Msg], sample: int) -> dict[str, list[float]]:
    """Where the time of (a sample of) answered messages went, from the service's timestamps."""
    own = [m for m in msgs if m.reply_id.startswith("reply:") and m.received_ms]
    chosen = own[:: max(1, len(own) // max(sample, 1))][:sample]
    repo = open_repo(cluster.where.store_url)
    broker = open_broker(cluster.where.broker_url)
    names = (
        "POST round trip (client)",
        "receipt -> run started",
        "run (started -> finished)",
        "reply scan (finished -> enqueued)",
        "delivery (enqueued -> in mailbox)",
        "receipt -> in mailbox",
    )
    phases: dict[str, list[float]] = {name: [] for name in names}
    storages: dict[str, Any] = {}
    try:
        for msg in chosen:
            session, run_id = msg.reply_id.split(":", 2)[1:]
            if session not in storages:
                storages[session] = await repo.open(session)
            query = RecordQuery(run_id=run_id, order="oldest_first")
            records = await storages[session].find_records(query)
            started = [r.timestamp for r in records if r.type == "operation_started"]
            finished = [r.timestamp for r in records if r.type == "operation_finished"]
            delivery = await broker.outbox.get(msg.reply_id)
            if not started or not finished or delivery is None:
                continue
            spans = (
                msg.accepted_ms - msg.sent_ms,
                started[0] - msg.received_ms,
                finished[-1] - started[0],
                delivery.created_at_ms - finished[-1],
                msg.answered_ms - delivery.created_at_ms,
                msg.answered_ms - msg.received_ms,
            )
            for name, span in zip(names, spans, strict=True):
                phases[name].append(span)
    finally:
        for storage in storages.values():
            await storage.close()
        await repo.close()
        await broker.close()
    return phases


def gateway_settings(args: argparse.Namespace, base: dict[str, str], **more: str) -> dict[str, str]:
    return {**base, "worker_slots": str(args.slots), "log_level": args.log_level, **more}


async def items_after(cluster: Cluster, msg: Msg) -> str:
    """The kinds and texts of `msg`'s thread from it on (a late reply, a notice, nothing)."""
    items = await cluster.mailbox.read(msg.space, msg.thread, after=max(msg.seq - 1, 0), limit=8)
    return "; ".join(f"{i.seq} {i.kind} {i.text[:60]!r} at {i.at_ms}" for i in items) or "none"


async def run_setup(
    args: argparse.Namespace, setup: str, workdir: Path, server: RedisServer | None, layout: Layout
) -> Result:
    where = backends("sqlite" if setup == "sqlite" else "redis", workdir, server)
    result = Result(setup, processes=2 if setup == "redis2" else 1)
    profile = Path(args.profile) / setup if args.profile else None
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
    cluster = await start_cluster(
        setup, result.processes, workdir, where, gateway_settings(args, where.settings), layout,
        profile,
    )  # fmt: skip
    poll_s = args.poll_ms / 1000
    senders = Senders(cluster, args.connections, cluster.gateways)
    try:
        # 1. warm-up: every lane created
        warm = warm_up_plan(layout)
        began = wall_ms()
        await closed_loop(cluster, senders, warm, args.window, poll_s)
        answered = [m.answered_ms for m in warm if m.answered_ms]
        if answered:
            result.warmup_rate = len(answered) / max((max(answered) - began) / 1000, 1e-3)
        # 2. saturated
        plan = round_robin(layout, "s", args.messages, first_order=1)
        usage = Usage("saturated")
        await measured(cluster, usage, closed_loop(cluster, senders, plan, args.window, poll_s))
        usage.replies = sum(1 for m in plan if m.answered_ms)
        result.usage.append(usage)
        result.saturated = throughput(plan)
        # 3. latency at a fixed rate
        result.rate = args.rate or (result.saturated / 2 if result.saturated > 0 else 50.0)
        count = max(1, int(result.rate * args.seconds))
        first = 1 + -(-args.messages // len(layout.threads))
        lat_plan = round_robin(layout, "l", count, first_order=first)
        usage = Usage("latency")
        await measured(cluster, usage, open_loop(cluster, senders, lat_plan, result.rate, poll_s))
        usage.replies = sum(1 for m in lat_plan if m.answered_ms)
        result.usage.append(usage)
        sent = sorted(m.sent_ms for m in lat_plan if m.sent_ms)
        if len(sent) > 1:
            result.achieved_rate = (len(sent) - 1) / max((sent[-1] - sent[0]) / 1000, 1e-3)
        result.lat = [m.answered_ms - m.accepted_ms for m in lat_plan if m.answered_ms]
        result.post = [m.accepted_ms - m.sent_ms for m in lat_plan if m.accepted_ms]
        result.send_lag = [m.sent_ms - m.scheduled_ms for m in lat_plan if m.sent_ms]
        for msg in plan + lat_plan:
            result.merged += msg.merged
            if msg.accepted_ms and not msg.answered_ms:
                result.unanswered += 1
                result.left.append(f"{msg.space}/{msg.thread} {msg.key} (item {msg.seq})")
                result.left_after.append(await items_after(cluster, msg))
        result.errors = senders.errors
        # 4. breakdown
        result.phases = await breakdown(cluster, lat_plan, args.sample)
    finally:
        senders.close()
        await cluster.close()
    if profile is not None:
        result.notes += profile_summary(profile, args.profile_top)
    return result


AREAS = (
    ("waiting (epoll)", ("select.epoll",)),
    ("redis-py (commands, RESP parsing)", ("site-packages/redis/",)),
    ("HTTP (uvicorn, h11, starlette, fastapi)", ("uvicorn/", "h11/", "starlette/", "fastapi/")),
    ("pydantic (validation, dumps)", ("pydantic", "SchemaValidator", "SchemaSerializer")),
    ("asyncio (event loop, tasks, streams)", ("asyncio/", "_contextvars", "selectors.py")),
    ("harness_core storage", ("harness_core/storage/",)),
    ("harness_core (harness, lanes, restore)", ("harness_core/",)),
    ("gateway broker", ("gateway/broker/",)),
    ("gateway (worker, deliverer, replies, intake)", ("gateway/",)),
    ("adapters (web channel, mailbox)", ("adapters/",)),
    ("json, logging, telemetry", ("json/", "logging/", "opentelemetry", "_json")),
)


def area_of(file: str, func: str) -> str:
    where = f"{file}:{func}"
    return next((name for name, marks in AREAS if any(m in where for m in marks)), "other")


def profile_summary(directory: Path, top: int) -> list[str]:
    """Own time by area and the top functions, from each process's cProfile stats."""
    lines = []
    for path in sorted(directory.glob("*.prof")):
        raw: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = getattr(
            pstats.Stats(str(path)), "stats", {}
        )
        rows: list[tuple[float, int, str]] = []
        areas: Counter[str] = Counter()
        for (file, line, func), (_, calls, own, _, _) in raw.items():
            rows.append((own, calls, f"{Path(file).name}:{line}({func})"))
            areas[area_of(file, func)] += own  # type: ignore[assignment]
        waiting = areas.pop("waiting (epoll)", 0.0)
        busy = max(sum(areas.values()), 1e-9)
        lines.append(
            f"profile {path.name}: main thread busy {busy:.1f} s, waiting in epoll "
            f"{waiting:.1f} s; own time by area (cProfile inflates Python-heavy areas):"
        )
        for area, own in areas.most_common():
            lines.append(f"  {own:7.2f} s {100 * own / busy:5.1f}%  {area}")
        lines.append("    own s     calls  function (top by own time)")
        for own, calls, where in sorted(rows, reverse=True)[:top]:
            lines.append(f"  {own:7.2f}  {calls:8d}  {where}")
    return lines


# -- takeover ----------------------------------------------------------------------------------


@dataclass
class Takeover:
    trial: int
    victim_sessions: int
    takeover_ms: list[float]
    lease_left_ms: list[float]
    others_ms: list[float]
    unanswered: int


async def held_by(cluster: Cluster, pid: int, now_ms: float) -> dict[str, float]:
    """The sessions whose store writer lease `pid`'s worker holds, and each lease's expiry."""
    assert cluster.redis is not None
    owner_prefix = f"{socket.gethostname()}-{pid}-"  # gateway.service.default_worker_id
    pipe = cluster.redis.pipeline(transaction=False)
    for session in cluster.layout.sessions:
        pipe.hmget(f"{STORE_PREFIX}:{{{session}}}:lease", ["owner", "expires"])
    held = {}
    for session, (owner, expires) in zip(
        cluster.layout.sessions, await pipe.execute(), strict=True
    ):
        if owner and expires and str(owner).startswith(owner_prefix) and int(expires) > now_ms:
            held[session] = float(expires)
    return held


async def run_takeover(
    args: argparse.Namespace, workdir: Path, server: RedisServer, layout: Layout
) -> list[Takeover]:
    where = backends("redis", workdir, server)
    settings = gateway_settings(
        args, where.settings, lease_seconds=str(args.lease), renew_seconds=str(args.renew)
    )
    cluster = await start_cluster("takeover", 2, workdir, where, settings, layout)
    victim, survivor = cluster.gateways
    poll_s = args.poll_ms / 1000
    results: list[Takeover] = []
    try:
        everyone = Senders(cluster, args.connections, cluster.gateways)
        await closed_loop(cluster, everyone, warm_up_plan(layout), args.window, poll_s)
        everyone.close()
        for trial in range(1, args.kills + 1):
            load = Senders(cluster, args.connections, [survivor])
            plan = round_robin(layout, f"b{trial}-", int(args.takeover_rate * 600), trial * 1000)
            background = asyncio.ensure_future(
                open_loop(cluster, load, plan, args.takeover_rate, poll_s)
            )
            await asyncio.sleep(args.takeover_warm)
            assert victim.process is not None
            pid = victim.process.pid
            for _ in range(500):  # kill while it holds a session (up to 10 s more)
                if await held_by(cluster, pid, wall_ms()):
                    break
                await asyncio.sleep(0.02)
            killed_ms = wall_ms()
            await asyncio.to_thread(victim.kill)
            held = await held_by(cluster, pid, killed_ms)
            probes = [Msg(f"k{trial}-{s}", s, t, trial) for s, t in layout.probes]
            posting = Senders(cluster, 1, [survivor])
            links = [Http(survivor.port) for _ in probes]
            await asyncio.gather(
                *(posting.post(ln, m) for ln, m in zip(links, probes, strict=True))
            )
            for link in links:
                link.close()
            deadline = time.monotonic() + args.lease * 3 + 15
            while time.monotonic() < deadline:
                await cluster.collect(probes)
                if all(m.answered_ms for m in probes if m.accepted_ms):
                    break
                await asyncio.sleep(0.05)
            background.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await background
            load.close()
            victims = [m for m in probes if f"web-{m.space}" in held and m.answered_ms]
            others = [m for m in probes if f"web-{m.space}" not in held and m.answered_ms]
            results.append(
                Takeover(
                    trial=trial,
                    victim_sessions=len(held),
                    takeover_ms=[m.answered_ms - killed_ms for m in victims],
                    lease_left_ms=[held[f"web-{m.space}"] - killed_ms for m in victims],
                    others_ms=[m.answered_ms - killed_ms for m in others],
                    unanswered=sum(1 for m in probes if not m.answered_ms),
                )
            )
            await asyncio.to_thread(victim.restart)
            await asyncio.sleep(1.0)
    finally:
        await cluster.close()
    return results


# -- drain ---------------------------------------------------------------------------------------


@dataclass
class Drain:
    lease_s: float
    sessions: int
    """Sessions the drained process held mid-step at the SIGTERM."""
    stop_s: float
    """SIGTERM -> the drained process exited."""
    ready_s: float
    """The next process's start -> its /readyz."""
    from_start_s: list[float]
    """Each held session's reply, from the next process's start."""
    unanswered: int


async def run_drain(
    args: argparse.Namespace, workdir: Path, server: RedisServer, layout: Layout, lease_s: float
) -> Drain:
    where = backends("redis", workdir, server)
    settings = gateway_settings(
        args,
        where.settings,
        plugin="tests.support.gateway_agent",
        lease_seconds=f"{lease_s:g}",
        renew_seconds=f"{min(5.0, lease_s / 4):g}",
        drain_seconds=f"{args.drain_seconds:g}",
    )
    cluster = await start_cluster(f"drain{lease_s:g}", 1, workdir, where, settings, layout)
    [drained] = cluster.gateways
    probes = layout.probes[: args.slots]  # one step per slot: every one is held at once
    try:
        assert drained.process is not None
        pid = drained.process.pid
        link = Http(drained.port)
        for space, thread in probes:
            body = {"text": f"/slow {args.drain_step_ms}", "space": space}
            status, answer = await link.request("POST", f"/web/threads/{thread}/messages", body)
            if status != 202:
                raise RuntimeError(f"POST refused: {status} {answer}")
        link.close()
        deadline = time.monotonic() + 30
        while len(await held_by(cluster, pid, wall_ms())) < len(probes):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the steps did not start:\n{drained.tail()}")
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # the tools run
        held = await held_by(cluster, pid, wall_ms())
        began = time.monotonic()
        status = await asyncio.to_thread(drained.terminate)
        stop_s = time.monotonic() - began
        if status != 0:
            raise RuntimeError(f"the drain exited {status}:\n{drained.tail()}")
        started_ms = wall_ms()
        drained.start(wait_ready_s=0)  # the next process (same port, a new incarnation)
        await asyncio.to_thread(drained.wait_ready, 60.0)
        ready_s = (wall_ms() - started_ms) / 1000
        answered: dict[tuple[str, str], float] = {}
        limit = time.monotonic() + lease_s + args.drain_step_ms / 1000 + 30
        while len(answered) < len(probes) and time.monotonic() < limit:
            for space, thread in probes:
                if (space, thread) in answered:
                    continue
                items = await cluster.mailbox.read(space, thread, after=0, limit=50)
                replies = [i for i in items if i.kind in ("reply", "failure_notice")]
                if replies:
                    answered[(space, thread)] = (replies[0].at_ms - started_ms) / 1000
            await asyncio.sleep(0.05)
        mine = [answered[p] for p in probes if f"web-{p[0]}" in held and p in answered]
        return Drain(
            lease_s=lease_s,
            sessions=len(held),
            stop_s=stop_s,
            ready_s=ready_s,
            from_start_s=mine,
            unanswered=len(probes) - len(answered),
        )
    finally:
        await cluster.close()


# -- the report ------------------------------------------------------------------------------------


def print_results(results: list[Result]) -> None:
    if not results:
        return
    print()
    print(
        "setup   | procs | warm-up msg/s | saturated replies/s | latency rate (achieved) "
        "| accept->reply p50 / p99 ms | POST p50 / p99 ms | merged | unanswered | POST errors"
    )
    for r in results:
        print(
            f"{r.setup:<7} | {r.processes:>5} | {fmt(r.warmup_rate):>13} | "
            f"{fmt(r.saturated):>19} | {fmt(r.rate):>6} ({fmt(r.achieved_rate):>6})        | "
            f"{fmt(pct(r.lat, 0.5), 1):>12} / {fmt(pct(r.lat, 0.99), 1):>7}   | "
            f"{fmt(pct(r.post, 0.5), 1):>7} / {fmt(pct(r.post, 0.99), 1):>5}   | "
            f"{r.merged:>6} | {r.unanswered:>10} | {sum(r.errors.values()):>11}"
        )
    for r in results:
        if r.left:  # to read a failure by: the thread's items say what happened to each
            print(f"{r.setup} unanswered: {', '.join(r.left[:20])}")
            for where, after in zip(r.left[:5], r.left_after, strict=False):
                print(f"  {where}: {after}")
    print()
    print("where the time goes at the latency rate (ms, p50 / p99 over a sample):")
    print(f"{'phase':<33} | " + " | ".join(f"{r.setup:>15}" for r in results))
    for name in results[0].phases:
        cells = [
            f"{fmt(pct(r.phases.get(name, []), 0.5), 1):>6} / "
            f"{fmt(pct(r.phases.get(name, []), 0.99), 1):>6}"
            for r in results
        ]
        print(f"{name:<33} | " + " | ".join(cells))
    print()
    print(
        "cost per reply (CPU ms by process; % = share of one core over the phase; others = "
        "the rest of the machine):"
    )
    for r in results:
        for u in r.usage:
            per = 1000 / max(u.replies, 1)
            mine = {k: v for k, v in u.cpu.items() if k != "machine"}
            others = max(0.0, u.cpu.get("machine", 0.0) - sum(mine.values()))
            cpu = ", ".join(
                f"{k.removeprefix(r.setup + '-')} {v * per:.2f} ms ({100 * v / u.wall:.0f}%)"
                for k, v in mine.items()
            )
            print(
                f"  {r.setup:<7} {u.phase:<9} {u.replies:>6} replies in {u.wall:5.1f} s: {cpu}, "
                f"others {100 * others / u.wall:.0f}%; takes {u.takes * per / 1000:.2f}/reply"
            )
            if u.commands:
                calls = sum(c for c, _ in u.commands.values())
                usec = sum(us for _, us in u.commands.values())
                top = sorted(u.commands.items(), key=lambda kv: -kv[1][0])[:7]
                print(
                    f"  {'':<17} redis: {calls * per / 1000:.0f} commands/reply incl. those "
                    f"scripts run, {usec * per / 1000:.0f} us/reply; "
                    + ", ".join(f"{n} {c * per / 1000:.1f}" for n, (c, _) in top)
                )
    for r in results:
        for reason, count in r.errors.most_common(3):
            print(f"note {r.setup}: {count} POSTs failed (then retried): {reason[:150]}")
        if r.send_lag and pct(r.send_lag, 0.99) > 5:
            print(
                f"note {r.setup}: the load generator fell behind its schedule (send lag "
                f"p50 {pct(r.send_lag, 0.5):.1f} ms, p99 {pct(r.send_lag, 0.99):.1f} ms)"
            )
        for line in r.notes:
            print(line)


def print_takeover(results: list[Takeover], lease_s: float) -> None:
    if not results:
        return
    nan = float("nan")
    print()
    print(f"takeover (redis, 2 processes, lease {lease_s:g} s; ms from the SIGKILL):")
    print(
        "trial | victim's sessions | their lease left at kill (max) | their probe reply p50 / "
        "max | max minus lease left | other sessions' probe p50 / max | unanswered"
    )
    for t in results:
        beyond = [a - b for a, b in zip(t.takeover_ms, t.lease_left_ms, strict=True)]
        print(
            f"{t.trial:>5} | {t.victim_sessions:>17} | {fmt(max(t.lease_left_ms, default=nan)):>30}"
            f" | {fmt(pct(t.takeover_ms, 0.5)):>11} / {fmt(max(t.takeover_ms, default=nan)):>6}"
            f" | {fmt(max(beyond, default=nan)):>20} | {fmt(pct(t.others_ms, 0.5)):>23} / "
            f"{fmt(max(t.others_ms, default=nan)):>6} | {t.unanswered:>10}"
        )
    worst = max((max(t.takeover_ms, default=0.0) for t in results), default=0.0)
    print(
        f"worst takeover {worst / 1000:.2f} s = {worst / 1000 / lease_s:.2f} x the lease TTL "
        f"(goal: <= TTL + 1 s = {lease_s + 1:g} s)"
    )


def print_drain(results: list[Drain], args: argparse.Namespace) -> None:
    if not results:
        return
    nan = float("nan")
    step_s = args.drain_step_ms / 1000
    print()
    print(
        f"drain (redis; SIGTERM, GATEWAY_DRAIN_SECONDS={args.drain_seconds:g} cuts a "
        f"{step_s:g} s step in each held session, then the next process starts; s):"
    )
    print(
        "lease | sessions held | stop took | next ready after its start | their replies from "
        "its start: p50 / max | from its readiness: max | max minus the step | unanswered"
    )
    for d in results:
        worst = max(d.from_start_s, default=nan)
        print(
            f"{d.lease_s:>5g} | {d.sessions:>13} | {d.stop_s:>9.2f} | {d.ready_s:>26.2f} | "
            f"{pct(d.from_start_s, 0.5):>29.2f} / {worst:>5.2f} | {worst - d.ready_s:>24.2f} | "
            f"{worst - d.ready_s - step_s:>18.2f} | {d.unanswered:>10}"
        )
    worst = max((max(d.from_start_s, default=0.0) for d in results), default=0.0)
    print(
        f"worst: answered {worst:.2f} s after the next process started (goal: <= 5 s), "
        "whatever the lease"
    )


def print_settings(args: argparse.Namespace, layout: Layout) -> None:
    rate = f"{args.rate:g}/s" if args.rate else "half the saturated rate"
    aof = f"yes, appendfsync {args.appendfsync}" if args.aof else "no"
    print(
        f"gateway bench: {len(layout.threads)} threads in {len(layout.sessions)} spaces "
        f"(sessions) + 1 probe thread per space, model scripted:echo; saturated: "
        f"{args.messages} messages, window {args.window}; latency: {args.seconds:g} s at "
        f"{rate}; {args.connections} client connections per process"
    )
    print(
        f"settings: GATEWAY_WORKER_SLOTS={args.slots} GATEWAY_LOG_LEVEL={args.log_level}, the "
        "rest default (lease 30 s, renew 5 s, busy_policy steer); sqlite: GATEWAY_STORE_URL, "
        "_BROKER_URL, _WEB_URL three files; redis: GATEWAY_REDIS_URL on a private redis-server "
        f"(appendonly {aof}); takeover: GATEWAY_LEASE_SECONDS={args.lease:g} "
        f"GATEWAY_RENEW_SECONDS={args.renew:g}, background {args.takeover_rate:g} msg/s"
    )
    print(
        f"machine: {os.cpu_count()} CPUs, python {sys.version.split()[0]}; the load generator "
        "shares the cores"
    )


# -- main ------------------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--quick", action="store_true", help="small sizes (a smoke run)")
    add("--only", default="", help=f"comma-separated among {', '.join(SETUPS)}")
    add("--threads", type=int, help="web threads (lanes); 1000 (--quick: 100)")
    add("--spaces", type=int, help="spaces (sessions); 50 (--quick: 10)")
    add("--messages", type=int, help="saturated phase; 5000 (--quick: 600)")
    add("--window", type=int, help="unanswered at most; 400 (--quick: 100)")
    add("--rate", type=float, default=0.0, help="latency phase msg/s (default: half)")
    add("--seconds", type=float, help="latency phase; 10 (--quick: 1.5)")
    add("--slots", type=int, default=4, help="GATEWAY_WORKER_SLOTS (default 4, as shipped)")
    add("--connections", type=int, default=16, help="client connections per process")
    add("--log-level", default="warning", help="GATEWAY_LOG_LEVEL")
    add("--sample", type=int, default=300, help="messages in the breakdown")
    add("--poll-ms", type=float, default=100.0, help="reply counting interval")
    add("--aof", action=argparse.BooleanOptionalAction, default=True, help="redis appendonly")
    add("--appendfsync", default="everysec", choices=["everysec", "always"])
    add("--lease", type=float, default=3.0, help="takeover: GATEWAY_LEASE_SECONDS")
    add("--renew", type=float, default=0.5, help="takeover: GATEWAY_RENEW_SECONDS")
    add("--kills", type=int, help="takeover trials; 3 (--quick: 1)")
    add("--takeover-rate", type=float, default=40.0, help="takeover: background msg/s")
    add("--takeover-warm", type=float, default=2.0, help="takeover: load before the kill, s")
    add("--drain-leases", default="30,60", help="drain: GATEWAY_LEASE_SECONDS values, s")
    add("--drain-seconds", type=float, default=0.5, help="drain: GATEWAY_DRAIN_SECONDS")
    add("--drain-step-ms", type=int, default=1500, help="drain: the step the drain cuts")
    add("--profile", default="", help="a directory: run the processes under cProfile")
    add("--profile-top", type=int, default=25, help="functions shown per profile")
    add("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args(argv)
    defaults = {
        "threads": (1000, 100),
        "spaces": (50, 10),
        "messages": (5000, 600),
        "window": (400, 100),
        "seconds": (10.0, 1.5),
        "kills": (3, 1),
    }
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    unknown = sorted(set(filter(None, args.only.split(","))) - set(SETUPS))
    if unknown:
        parser.error(f"--only: unknown {unknown}; known: {', '.join(SETUPS)}")
    return args


async def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    chosen = [s for s in SETUPS if not args.only or s in args.only.split(",")]
    layout = Layout.make(args.threads, args.spaces)
    workdir = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    print_settings(args, layout)
    print(f"work directory: {workdir}", flush=True)
    server: RedisServer | None = None
    results: list[Result] = []
    takeovers: list[Takeover] = []
    drains: list[Drain] = []
    try:
        if any(s != "sqlite" for s in chosen):
            server = RedisServer(
                workdir / "redis", appendonly=args.aof, appendfsync=args.appendfsync
            )
            server.start()
        for setup in chosen:
            began = time.monotonic()
            directory = workdir / setup
            directory.mkdir()
            if server is not None:
                client = aioredis.Redis(port=server.port)
                await client.flushall()
                await client.aclose()
            if setup == "takeover":
                assert server is not None
                takeovers = await run_takeover(args, directory, server, layout)
            elif setup == "drain":
                assert server is not None
                for lease in (float(x) for x in args.drain_leases.split(",") if x):
                    where = directory / f"lease{lease:g}"
                    where.mkdir()
                    client = aioredis.Redis(port=server.port)
                    await client.flushall()
                    await client.aclose()
                    drains.append(await run_drain(args, where, server, layout, lease))
            else:
                results.append(await run_setup(args, setup, directory, server, layout))
            print(f"{setup}: done in {time.monotonic() - began:.1f} s", flush=True)
        print_results(results)
        print_takeover(takeovers, args.lease)
        print_drain(drains, args)
    finally:
        if server is not None:
            server.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    run_main(lambda: asyncio.run(main()))
