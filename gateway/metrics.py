"""Prometheus metrics: ``GET /metrics`` in the text format, over the service's own registry.

Each `Metrics` has its own `CollectorRegistry` (never the process-global one: tests and
benchmarks run several services in one process). Three kinds of numbers:

* **Read at scrape time**, cached so a scrape storm reads the backends at most once per period:
  the broker's backlogs (every `broker_ttl_s`, 5 s) and the lanes' statuses from the store
  (every `lanes_ttl_s`, 15 s; each lane folded by `inspect_own`, read-only and without a lease,
  like the operator API, under its own attempt cap, so a running last attempt is not counted
  stuck, nor a lane whose profile allows more attempts than the top level; at most `max_lanes`
  lanes, then ``gateway_lanes_truncated`` is 1).
  These are the shared state of every process over the store and broker.
* **Counted in this process** as it works: takeovers, accepted messages, operations and their
  durations (from the harness's events), model tokens and cost (from its usage events, failed
  attempts included), model requests sent again by what failed, delivery attempts and their
  durations, and the MCP servers' calls by outcome, restarts and whether each is up (`Metrics`
  is their connections' `CallObserver`).
* ``gateway_metrics_read_errors_total``: scrape-time reads that failed (the previous values
  are kept and served).

``/metrics`` takes no token, the convention for Prometheus scrapers: the service binds loopback
unless operator tokens are configured, and what it serves is safe to expose. The page holds
counts, ages and durations only, labelled by bounded vocabularies (status, kind, outcome, the
configured channel and MCP server names): no message content, no secrets, no session, lane or
thread names, no user ids. A label value that is not one of the vocabulary (a channel no
adapter serves) is counted as ``other``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Final, get_args

from fastapi import APIRouter, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from gateway.broker.contract import Broker
from gateway.lane_status import LaneLimits, inspect_own, unused_main
from gateway.logs import event
from harness_core import (
    AgentHarness,
    Clock,
    CompactionEnd,
    CompactionStart,
    LaneStatus,
    ModelErrorKind,
    NavigationEnd,
    NavigationStart,
    RetryScheduled,
    RunEnd,
    RunStart,
    RunSuspend,
    SessionError,
    SessionRepo,
    UsageEvent,
)

__all__ = ["LANE_STATUSES", "MCP_OUTCOMES", "MODEL_ERROR_KINDS", "RUN_LIMITS", "Metrics"]

log = logging.getLogger("gateway.metrics")

READ_BOUND_S = 4.0
"""The longest a scrape's read of the broker or the store may take (well inside the 10 s
Prometheus gives a scrape by default)."""

LANE_STATUSES: Final = get_args(LaneStatus)
"""Every value of ``gateway_lanes{status}`` (each is served, 0 when no lane has it)."""
MODEL_ERROR_KINDS: Final = get_args(ModelErrorKind)
"""Every value of ``gateway_model_retries_total{kind}``."""
RUN_LIMITS: Final = ("turn_limit", "token_budget")
"""Every value of ``gateway_runs_stopped_total{limit}``: the codes of a run stopped by a limit."""
_OUTCOMES: Final = {
    "run": ("completed", "aborted", "failed"),
    "compaction": ("completed", "declined", "aborted", "failed"),
    "navigation": ("completed", "declined", "aborted", "failed"),
}
_DELIVERY_OUTCOMES: Final = ("delivered", "reconciled", "retry", "dead")
_TOKEN_KINDS: Final = ("input", "output", "cache_read", "cache_write")
_OTHER: Final = "other"
MCP_OUTCOMES: Final = (
    "ok",
    "error",
    "timeout",
    "aborted",
    "stopped",
    "down",
    "crashed",
    "malformed",
    "unknown",
)
"""Every value of ``gateway_mcp_calls_total{outcome}``: how an MCP tool call ended (``error``:
the server answered with ``isError`` or refused the request; ``unknown``: the tool is no longer
offered; ``down``: the server was not connected; ``stopped``: the service was closing)."""
_OPERATION_BUCKETS: Final = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
_DELIVERY_BUCKETS: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    """The service's metrics: one registry, its counters, and the scrape-time reads."""

    def __init__(
        self,
        repo: SessionRepo,
        broker: Broker,
        clock: Clock,
        *,
        limits: LaneLimits,
        channels: Iterable[str] = (),
        mcp_servers: Iterable[str] = (),
        broker_ttl_s: float = 5.0,
        lanes_ttl_s: float = 15.0,
        max_lanes: int = 10_000,
    ) -> None:
        self._repo = repo
        self._broker = broker
        self._clock = clock
        self._limits = limits
        self.channels = frozenset(channels)
        """The label values ``channel`` takes (the adapters' names); any other is ``other``."""
        self.mcp_servers = frozenset(mcp_servers)
        """The label values ``server`` takes (the configured MCP servers); others: ``other``."""
        self.broker_ttl_s = broker_ttl_s
        self.lanes_ttl_s = lanes_ttl_s
        self.max_lanes = max_lanes
        self._broker_read_at: float | None = None
        self._lanes_read_at: float | None = None
        self._reading = asyncio.Lock()
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        # the process's CPU, memory and garbage collections (D122 tunes the collector)
        ProcessCollector(registry=registry)
        GCCollector(registry=registry)

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, labels, registry=registry)

        self.inbox_backlog = gauge("gateway_inbox_backlog", "Inbox items waiting for a lane.")
        self.inbox_oldest_age = gauge(
            "gateway_inbox_oldest_age_seconds", "Age of the oldest inbox item waiting."
        )
        self.inbox_rejected = gauge(
            "gateway_inbox_rejected", "Inbox items rejected (never acceptable), kept."
        )
        self.outbox_backlog = gauge("gateway_outbox_backlog", "Deliveries pending.")
        self.outbox_oldest_age = gauge(
            "gateway_outbox_oldest_age_seconds", "Age of the oldest due delivery pending."
        )
        self.dead_letters = gauge("gateway_dead_letters", "Dead letters kept in the outbox.")
        self.lanes = gauge("gateway_lanes", "Lanes by status (read from the store).", ("status",))
        self.stuck_lanes = gauge(
            "gateway_stuck_lanes", "Lanes interrupted too often: waiting for an operator."
        )
        self.lanes_truncated = gauge(
            "gateway_lanes_truncated", "1 when the lane count stopped at the limit (partial)."
        )
        self.approvals_waiting = gauge(
            "gateway_approvals_waiting", "Runs waiting for a person's approval (from the store)."
        )
        self.approval_oldest_wait = gauge(
            "gateway_approval_oldest_wait_seconds",
            "How long the longest-waiting approval request has waited (0: none waits).",
        )
        self.read_errors = Counter(
            "gateway_metrics_read_errors",
            "Scrape-time reads that failed (the previous values are served).",
            ("source",),
            registry=registry,
        )
        self.takeovers = Counter(
            "gateway_takeovers",
            "Lane operations this process resumed after a crash.",
            registry=registry,
        )
        self.session_takes = Counter(
            "gateway_session_takes",
            "Sessions this process took: the store's writer lease acquired and the session "
            "restored (a session kept warm serves its next messages without one).",
            registry=registry,
        )
        self.messages_accepted = Counter(
            "gateway_messages_accepted",
            "Inbound messages accepted into their lanes by this process.",
            ("channel",),
            registry=registry,
        )
        self.deliveries = Counter(
            "gateway_deliveries",
            "Delivery attempts by outcome (reconciled: an earlier attempt had arrived).",
            ("channel", "outcome"),
            registry=registry,
        )
        self.delivery_seconds = Histogram(
            "gateway_delivery_seconds",
            "Duration of one delivery attempt (reconciling and sending).",
            buckets=_DELIVERY_BUCKETS,
            registry=registry,
        )
        self.tokens = Counter(
            "gateway_model_tokens",
            "Model tokens used (every request, failed attempts included).",
            ("kind",),
            registry=registry,
        )
        self.cost = Counter(
            "gateway_model_cost",
            "Model cost in US dollars (every request, failed attempts included).",
            registry=registry,
        )
        self.model_retries = Counter(
            "gateway_model_retries",
            "Model requests sent again after a failed attempt, by what failed (invalid_request: "
            "sent without the thread's images, D289).",
            ("kind",),
            registry=registry,
        )
        self.operations = Counter(
            "gateway_operations",
            "Lane operations that ended in this process, by kind and outcome.",
            ("kind", "outcome"),
            registry=registry,
        )
        self.runs_stopped = Counter(
            "gateway_runs_stopped",
            "Runs stopped by a limit before they finished (counted among the failed runs too): "
            "turn_limit (the model kept calling tools), token_budget (the thread had spent its "
            "tokens).",
            ("limit",),
            registry=registry,
        )
        self.suspensions = Counter(
            "gateway_suspensions",
            "Runs that parked (an approval, a background model request).",
            ("reason",),
            registry=registry,
        )
        self.operation_seconds = Histogram(
            "gateway_operation_seconds",
            "Execution of an operation in this process: start or resume to end or suspension.",
            ("kind",),
            buckets=_OPERATION_BUCKETS,
            registry=registry,
        )
        self.mcp_calls = Counter(
            "gateway_mcp_calls",
            "MCP tool calls that ended in this process, by server and outcome.",
            ("server", "outcome"),
            registry=registry,
        )
        self.mcp_restarts = Counter(
            "gateway_mcp_restarts",
            "MCP server connection attempts after a failure (a crash, a lost connection).",
            ("server",),
            registry=registry,
        )
        self.mcp_up = gauge(
            "gateway_mcp_server_up",
            "1 while the MCP server is connected with its tools listed, else 0.",
            ("server",),
        )
        # every bounded label value is served from the first scrape on (stable series)
        for status in LANE_STATUSES:
            self.lanes.labels(status)
        for kind, outcomes in _OUTCOMES.items():
            self.operation_seconds.labels(kind)
            for outcome in outcomes:
                self.operations.labels(kind, outcome)
        for token_kind in _TOKEN_KINDS:
            self.tokens.labels(token_kind)
        for error_kind in MODEL_ERROR_KINDS:
            self.model_retries.labels(error_kind)
        for limit in RUN_LIMITS:
            self.runs_stopped.labels(limit)
        for reason in ("approval", "deferred"):
            self.suspensions.labels(reason)
        for source in ("broker", "store"):
            self.read_errors.labels(source)
        for channel in sorted(self.channels):
            self.messages_accepted.labels(channel)
            for outcome in _DELIVERY_OUTCOMES:
                self.deliveries.labels(channel, outcome)
        for server in sorted(self.mcp_servers):
            self.mcp_restarts.labels(server)
            self.mcp_up.labels(server)
            for outcome in MCP_OUTCOMES:
                self.mcp_calls.labels(server, outcome)
        self.router = self._build()

    # -- counted as it happens -------------------------------------------------------------

    def channel(self, name: object) -> str:
        """The ``channel`` label of a channel name (``other`` unless an adapter serves it)."""
        return name if isinstance(name, str) and name in self.channels else _OTHER

    def takeover(self) -> None:
        """A lane operation interrupted by a crash is resumed by this process."""
        self.takeovers.inc()

    def session_taken(self) -> None:
        """A worker of this process took a session (its lease, then its restore)."""
        self.session_takes.inc()

    def message_accepted(self, channel: str) -> None:
        """An inbound message was accepted into its lane."""
        self.messages_accepted.labels(self.channel(channel)).inc()

    def delivery(self, channel: object, outcome: str) -> None:
        """A delivery attempt settled: delivered, reconciled, skipped, retry or dead."""
        self.deliveries.labels(self.channel(channel), outcome).inc()

    def delivery_time(self, seconds: float) -> None:
        """A delivery attempt took `seconds` (settling included)."""
        self.delivery_seconds.observe(seconds)

    def mcp_call(self, server: str, outcome: str) -> None:
        """An MCP tool call ended with `outcome` (one of `MCP_OUTCOMES`, else ``other``)."""
        label = outcome if outcome in MCP_OUTCOMES else _OTHER
        self.mcp_calls.labels(self._mcp_server(server), label).inc()

    def mcp_restart(self, server: str) -> None:
        """An MCP server is connected again after a failure."""
        self.mcp_restarts.labels(self._mcp_server(server)).inc()

    def mcp_state(self, server: str, up: bool) -> None:
        """An MCP server came up (connected, tools listed) or went down."""
        self.mcp_up.labels(self._mcp_server(server)).set(1 if up else 0)

    def _mcp_server(self, name: str) -> str:
        return name if name in self.mcp_servers else _OTHER

    def watch(self, harness: AgentHarness) -> Callable[[], None]:
        """Count a session's operations, durations and usage from its harness's events.

        Returns the function that stops watching (call it before the harness closes). The
        durations are those of this process: from a run's start (or resume) to its end (or
        suspension); a run that another process resumes is timed there from its resume.
        """
        started: dict[str, float] = {}

        def begin(event: Any) -> None:
            if isinstance(event, CompactionStart) and event.reason != "manual":
                return  # compacting inside a run: part of the run
            if isinstance(event, (RunStart, NavigationStart)):
                started[event.run_id] = time.monotonic()
            else:
                started.setdefault(event.run_id, time.monotonic())

        def end(event: Any) -> None:
            kind: str
            if isinstance(event, (RunEnd, RunSuspend)):
                kind = "run"
            elif isinstance(event, NavigationEnd):
                kind = "navigation"
            elif isinstance(event, CompactionEnd) and event.reason == "manual":
                kind = "compaction"
            else:
                return  # compacting inside a run
            began = started.pop(event.run_id, None)
            if began is not None:
                self.operation_seconds.labels(kind).observe(time.monotonic() - began)
            if isinstance(event, RunSuspend):
                self.suspensions.labels(event.reason).inc()
            elif event.outcome in _OUTCOMES[kind]:
                self.operations.labels(kind, event.outcome).inc()
                code = event.error.code if isinstance(event, RunEnd) and event.error else None
                if code in RUN_LIMITS:
                    self.runs_stopped.labels(code).inc()

        def usage(event: UsageEvent) -> None:
            used = event.record.usage
            for token_kind in _TOKEN_KINDS:
                count = getattr(used, token_kind)
                if count > 0:  # adjustments may be negative: a counter only rises
                    self.tokens.labels(token_kind).inc(count)
            cost = used.cost
            total = cost.total or (cost.input + cost.output + cost.cache_read + cost.cache_write)
            if total > 0:
                self.cost.inc(total)

        def retry(event: RetryScheduled) -> None:
            self.model_retries.labels(event.error_kind or "unknown").inc()

        events = harness.events
        offs = [
            events.on_any("retry_scheduled", retry),
            *(
                events.on_any(name, begin)
                for name in ("run_start", "run_resume", "compaction_start", "navigation_start")
            ),
            *(
                events.on_any(name, end)
                for name in ("run_end", "run_suspend", "compaction_end", "navigation_end")
            ),
            events.on_any("usage", usage),
        ]

        def off() -> None:
            for stop in offs:
                stop()
            started.clear()

        return off

    # -- read at scrape time ---------------------------------------------------------------

    async def refresh(self) -> None:
        """Read the broker and the store again where their cached values are too old.

        Both at once, each within `READ_BOUND_S`: one after the other, a Redis that hung held a
        scrape 20 s, past Prometheus' 10 s scrape timeout, so every scrape failed and no alert
        could fire (an outside probe). A read cut off counts as a read error; the values read
        before stay served.
        """
        async with self._reading:  # a scrape storm waits for one read
            now = time.monotonic()
            reads = []
            if self._broker_read_at is None or now - self._broker_read_at >= self.broker_ttl_s:
                reads.append(self._read_broker())
                self._broker_read_at = now
            if self._lanes_read_at is None or now - self._lanes_read_at >= self.lanes_ttl_s:
                reads.append(self._read_lanes())
                self._lanes_read_at = now
            await asyncio.gather(*reads)

    async def _read_broker(self) -> None:
        try:
            async with asyncio.timeout(READ_BOUND_S):
                inbox = await self._broker.inbox.backlog()
                outbox = await self._broker.outbox.backlog(now_ms=self._clock.now_ms())
        except Exception as exc:
            self.read_errors.labels("broker").inc()
            log.warning(event("metrics read failed", source="broker", error=type(exc).__name__))
            return
        self.inbox_backlog.set(inbox.pending)
        self.inbox_oldest_age.set(inbox.oldest_age_ms / 1000)
        self.inbox_rejected.set(inbox.dead)
        self.outbox_backlog.set(outbox.pending)
        self.outbox_oldest_age.set(outbox.oldest_age_ms / 1000)
        self.dead_letters.set(outbox.dead)

    async def _read_lanes(self) -> None:
        try:
            async with asyncio.timeout(READ_BOUND_S):
                counts, truncated, asked_at = await self._count_lanes()
        except Exception as exc:
            self.read_errors.labels("store").inc()
            log.warning(event("metrics read failed", source="store", error=type(exc).__name__))
            return
        for status in LANE_STATUSES:
            self.lanes.labels(status).set(counts.get(status, 0))
        self.stuck_lanes.set(counts.get("stuck", 0))
        self.lanes_truncated.set(1 if truncated else 0)
        self.approvals_waiting.set(len(asked_at))
        oldest_ms = self._clock.now_ms() - min(asked_at) if asked_at else 0
        self.approval_oldest_wait.set(max(0, oldest_ms) / 1000)

    async def _count_lanes(self) -> tuple[dict[str, int], bool, list[int]]:
        """Lanes by status over every session, and when each waiting approval request was made.

        At most `max_lanes` lanes are looked at; the flag is True if it stopped there.
        """
        counts: dict[str, int] = {}
        asked_at: list[int] = []
        seen = 0
        for meta in await self._repo.list():
            holder = await self._repo.lease_holder(meta.id)
            try:
                storage = await self._repo.open(meta.id)  # read-only: no lease taken
            except SessionError as exc:
                if exc.code == "not_found":
                    continue  # deleted since the listing
                raise
            try:
                for pointer in await storage.get_lanes():
                    if seen >= self.max_lanes:
                        return counts, True, asked_at
                    seen += 1
                    seen_lane = await inspect_own(
                        storage,
                        self._broker,
                        meta.id,
                        pointer.lane,
                        limits=self._limits,
                        held=holder is not None,
                    )
                    info = seen_lane.info
                    if unused_main(info.name, info.status, info.leaf_id):
                        continue
                    counts[info.status] = counts.get(info.status, 0) + 1
                    if info.suspended == "approval" and seen_lane.wait_id is not None:
                        request = await storage.get_record(seen_lane.wait_id)
                        if request is not None:
                            asked_at.append(request.timestamp)
            finally:
                with contextlib.suppress(Exception):
                    await storage.close()
        return counts, False, asked_at

    async def text(self) -> bytes:
        """The Prometheus text exposition, read again where it is due."""
        await self.refresh()
        return generate_latest(self.registry)

    def _build(self) -> APIRouter:
        router = APIRouter()

        @router.get("/metrics", include_in_schema=False)
        async def metrics() -> Response:
            return Response(await self.text(), media_type=CONTENT_TYPE_LATEST)

        return router
