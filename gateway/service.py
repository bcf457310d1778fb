"""The service: the composition root that wires store, broker, adapters, workers and deliverer.

Only this module names concrete backends and adapters. `Service.start()` opens everything and
starts receiving, working and delivering; `Service.stop()` drains: it stops taking sessions and
claiming deliveries, gives running steps `drain_seconds` to finish, then releases leases and
closes. `gateway serve` runs one `Service` under uvicorn; tests and benchmarks run several.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from fastapi import FastAPI
from redis.exceptions import NoPermissionError

from adapters import ChannelAdapter
from config import Settings
from gateway.app import build_app
from gateway.authority import judge_bindings
from gateway.broker import open_broker
from gateway.broker.contract import Broker
from gateway.channels import ASK_CHANNEL, bindings_judge, build_channels
from gateway.deliverer import Deliverer, DelivererConfig
from gateway.errors import GatewayError
from gateway.files import blob_limits, file_limits
from gateway.guards import BodyWatch, body_limits, host_rule
from gateway.incarnation import gone, new_worker_id
from gateway.intake import Intake
from gateway.kept import KeptWatch, first_words
from gateway.live import LivePublisher, live_views
from gateway.logs import event, redact_with
from gateway.mcp.health import McpServerHealth
from gateway.mcp.settings import mcp_section
from gateway.mcp.source import McpTools, beside
from gateway.metrics import Metrics
from gateway.models import model_from_settings
from gateway.ops.api import OpsApi
from gateway.ops.api.mcp import no_servers
from gateway.ops.auth import OpsAuth, local_token, parse_tokens, token_file
from gateway.outage import Outage
from gateway.plugin import load_plugin
from gateway.profiles import LaneProfiles
from gateway.redact import Redactor, redacting
from gateway.reminders import remind
from gateway.telemetry import flush_tracing, install_tracing
from gateway.worker import Worker, WorkerConfig
from harness_core import (
    AgentHarnessOptions,
    Clock,
    ModelClient,
    ModelRef,
    RequestOptions,
    RetryPolicy,
    SessionRepo,
    SessionStorage,
    SystemClock,
    Tool,
    open_repo,
)
from harness_core.backends.redis import server_config
from harness_core.backends.urls import userinfo_password, without_password
from harness_core.texts import one_line

__all__ = ["Service", "ServiceParts", "StartRefused", "default_worker_id"]

log = logging.getLogger("gateway.service")

_RETRY_JITTER = 0.2
"""A model request's backoff is cut, and a Retry-After lengthened, by up to a fifth (D312)."""
_DELIVERY_DRAIN_MIN_S = 2.0
"""The deliverer's drain gets at least this long, so replies of steps that just ended go out."""


_CLOSE_RESERVE_S = 0.5
"""What a bounded stop keeps after the drain: cut work releases its sessions, things close."""

_PROBE_TIMEOUT_S = 5.0  # a cold Redis Cluster client loads its slots and scripts first


async def _answered(ask: Callable[[], Awaitable[object]]) -> Exception | None:
    """None when `ask` answers within the probe's time, else why not."""
    try:
        await asyncio.wait_for(ask(), _PROBE_TIMEOUT_S)
    except Exception as exc:  # TimeoutError included: its text is empty, said in _refusal
        return exc
    return None


_REMIND_SWEEP_MAX_S = 60.0
"""Reminders are looked for at least this often (a quarter of the interval when shorter)."""
_REMIND_SWEEP_MIN_S = 0.05


class StartRefused(GatewayError):
    """The store or the broker does not answer at start; the message is one line per part."""


_BROKER_TAGS = re.compile(r"audit|marks|ibx-wake|obx-wake|rdy-\d+|obx-\d+")
"""The hash tags of the broker's own Redis keys (``P:{audit}:log``...): a session's are its id."""


def _broker_keys_clash(settings: Settings) -> str | None:
    """Why a route's session would share Redis keys with the broker's own, or None.

    With one ``?prefix`` on one Redis URL, store and broker share the prefix: a session named
    ``audit`` wrote its log into the broker's audit trail, whose events were then lost and
    whose API answered 500 (an outside probe).
    """
    store, broker = settings.effective_store_url, settings.effective_broker_url
    if store != broker or not store.startswith("redis") or "prefix=" not in store:
        return None
    for route in settings.routes:
        if _BROKER_TAGS.fullmatch(route.session):
            return (
                f"the session {route.session!r} would share its Redis keys with the broker's "
                f"own (the store and the broker share the key prefix of "
                f"{without_password(store)!r}): name the session otherwise, or give the "
                "broker a URL of its own (GATEWAY_BROKER_URL with another ?prefix)"
            )
    return None


def default_worker_id() -> str:
    """A worker id that is new per process incarnation and names it (`gateway.incarnation`)."""
    return new_worker_id()


@dataclass(kw_only=True)
class ServiceParts:
    """What a service is made of; every field may be given (tests, benchmarks) or built."""

    repo: SessionRepo | None = None
    broker: Broker | None = None
    adapters: Sequence[ChannelAdapter] | None = None
    model_client: ModelClient | None = None
    model: ModelRef | None = None
    tools: Sequence[Tool] = ()
    clock: Clock = field(default_factory=SystemClock)
    rng: random.Random | None = None
    worker_id: str | None = None


class Service:
    """One gateway process: intake, workers and a deliverer over one store and one broker."""

    def __init__(self, settings: Settings, parts: ServiceParts | None = None) -> None:
        self.settings = settings
        self.parts = parts or ServiceParts()
        self.worker_id = self.parts.worker_id or default_worker_id()
        self.repo: SessionRepo | None = None
        self.broker: Broker | None = None
        self.adapters: dict[str, ChannelAdapter] = {}
        self.intake: Intake | None = None
        self.worker: Worker | None = None
        self.deliverer: Deliverer | None = None
        self.live: LivePublisher | None = None
        """Shows runs' progress and streamed text in the channels that can (once started)."""
        self.metrics: Metrics | None = None
        """The service's Prometheus metrics (``/metrics``), once started."""
        self.app: FastAPI | None = None
        self.ops_sign_in: str | None = None
        self.ops_token_file: Path | None = None
        """The operator token made at first start (no tokens configured), for the sign-in link."""
        self.model: ModelRef | None = None
        """The lanes' default model (from the plugin or ``GATEWAY_MODEL``), once started."""
        self.mcp: McpTools | None = None
        self._kept: KeptWatch | None = None
        """The MCP servers' tools (None: no servers configured), once started."""
        self.mcp_health: Callable[[], tuple[McpServerHealth, ...]] = no_servers
        """The MCP servers' health as the operator tools show it (``gateway ops mcp``,
        ``GET /api/v1/mcp``, the /ops page): the MCP tool source's `health` once it is set,
        none before. Read at each request, so it may be set after `start` built the app (D210)."""
        self._owned: list[Any] = []
        self._reminders: asyncio.Task[None] | None = None
        self._watching: asyncio.Task[None] | None = None
        """Looks every 10 s whether a Redis of the store or broker lost the data (D348)."""
        self._judging: asyncio.Task[None] | None = None
        """The start's judgement of every thread's binding (`gateway.authority`, D268)."""
        self.redactor = Redactor.from_settings(settings)
        """Cleans every text this service stores, logs or answers of the configured secrets."""
        self.bodies = BodyWatch()
        """The request bodies being read (each at a pace; answered 503 when the drain begins)."""
        self._unredact: Callable[[], None] | None = None

    async def start(self) -> None:
        """Open the store and broker, start the adapters, the workers and the deliverer."""
        settings = self.settings
        parts = self.parts
        clock = parts.clock
        if (clash := _broker_keys_clash(settings)) is not None:
            raise StartRefused(clash)
        if self._unredact is None:
            self._unredact = redact_with(self.redactor.redact)
        self.repo = parts.repo or self._own(open_repo(settings.effective_store_url, clock=clock))
        self.broker = parts.broker or self._own(
            open_broker(
                settings.effective_broker_url,
                clock=clock,
                visibility_timeout_ms=int(settings.lease_seconds * 1000),
                dedupe_ttl_ms=int(settings.inbox_dedupe_seconds * 1000),
                blob_limits=blob_limits(settings),
            )
        )
        failed = {part: why for part, why in (await self.probe()).items() if why is not None}
        if failed:  # before any adapter or worker starts: nothing to drain, nothing half-begun
            await self._close_owned()
            raise StartRefused(self._refusals(await self._in_its_words(failed)))
        await self._check_redis()
        kept = KeptWatch.of(
            # the store's and the broker's default key prefixes
            [(settings.effective_store_url, "gw"), (settings.effective_broker_url, "gwb")],
            parts.rng or random.Random(),
        )
        if kept is not None:
            await self._own(kept).check()  # the marks' tokens, before anything is taken
            self._kept = kept
            refused = await kept.writable()
            if isinstance(refused, NoPermissionError):  # no retry can fix it: said, not served
                await self._close_owned()
                raise StartRefused(
                    "the Redis user cannot run the gateway's scripts, which every write is "
                    f"made of ({one_line(str(refused))[:200]}): allow it EVAL and EVALSHA"
                )
            if refused is not None:
                log.warning(event("redis refuses writes", error=type(refused).__name__))
        plugin = load_plugin(settings.plugin, settings)
        if parts.model_client is not None:
            client = parts.model_client
            model = parts.model or ModelRef(provider="scripted", model_id="echo")
        elif plugin.model is not None:
            client, model = plugin.model
        else:
            client, model = model_from_settings(settings)
            self._own(client)  # its providers' HTTP connections are closed when this stops
        client = redacting(client, self.redactor)  # a provider error may quote the key
        self.model = model
        plugin_tools = tuple(parts.tools) or tuple(plugin.tools)
        servers = mcp_section(settings).servers
        if parts.adapters is not None:
            adapters = list(parts.adapters)
        else:
            extra = list(plugin.adapters(settings, clock)) if plugin.adapters else []
            named = {adapter.name for adapter in extra}
            adapters = [a for a in build_channels(settings, clock) if a.name not in named] + extra
        self.adapters = {adapter.name: adapter for adapter in adapters}
        for index, route in enumerate(settings.routes):
            if route.channel not in self.adapters and route.channel != ASK_CHANNEL:
                # a registry name, its channel not set up (`cli` is `gateway ask`'s)
                log.warning(
                    event(
                        "route of a channel not configured",
                        route=index,
                        channel=route.channel,
                        note="this route takes nothing until the channel is configured",
                    )
                )
        profiles = LaneProfiles(settings, model)
        self.intake = Intake(
            self.broker,
            settings.route_for,
            self.repo,
            approvers=profiles.approvers,
            tool_approvers=self.tool_approvers,
            file_limits=file_limits(settings),
        )
        self.metrics = Metrics(
            self.repo,
            self.broker,
            clock,
            limits=profiles,
            channels=self.adapters,
            mcp_servers=(server.name for server in servers),
        )
        if servers and self.mcp is None:
            # spawned and listed before any worker takes a session: a lane resumed after a
            # crash finds its MCP tools (and their declarations) registered
            self.mcp = self._own(
                McpTools(
                    servers,
                    clock=clock,
                    redact=self.redactor.redact,
                    observer=self.metrics,
                )
            )
            await self.mcp.start()
            self.mcp_health = self.mcp.health
        mcp = self.mcp

        clashes: set[str] = set()

        def tools() -> tuple[Tool, ...]:
            # read per session taken; a session in hand is taken again when the list changes
            return beside(plugin_tools, mcp.tools() if mcp is not None else (), clashes)

        _say_unmatched_patterns(settings, tools())

        tracer = install_tracing()

        def options(storage: SessionStorage) -> AgentHarnessOptions:
            return AgentHarnessOptions(
                storage=storage,
                model_client=client,
                model=model,
                tools=tools(),
                system_prompt=profiles.default_prompt(),  # a lane no profile was given yet
                clock=clock,
                max_attempts=settings.max_attempts,  # per lane: the worker's profiles
                max_turns=settings.max_turns,
                token_budget=settings.token_budget,
                lease_renew_ms=int(settings.renew_seconds * 1000),
                request_options=RequestOptions(max_output_tokens=settings.model_max_output_tokens),
                # lanes a provider refused together come back spread out, not in one burst
                retry=RetryPolicy(jitter=_RETRY_JITTER),
                tracer=tracer,
            )

        self.live = LivePublisher(live_views(self.adapters), clock)
        # the takes and the claims say a broker outage once between them (D347)
        outage = Outage("broker", clock, logging.getLogger("gateway.broker"))
        self.worker = Worker(
            WorkerConfig(
                worker_id=self.worker_id,
                slots=settings.worker_slots,
                lease_ms=int(settings.lease_seconds * 1000),
                busy_policy=settings.busy_policy,
                linger_ms=int(settings.linger_seconds * 1000),
            ),
            self.repo,
            self.broker,
            options,
            clock,
            self.metrics,
            profiles,
            live=self.live if self.live.active else None,
            file_limits=file_limits(settings),
            # a channel's section may ask for one "working on it" reply (email's, D214)
            working_after={
                name: float(getattr(section, "working_after_seconds", 0) or 0)
                for name, section in settings.channels.items()
            },
            # a server's list change reaches sessions already in hand, busy ones too
            tools_version=(lambda: mcp.version) if mcp is not None else (lambda: 0),
            # a tool no server will offer again: a resume waiting for it would wait for ever
            tool_gone=mcp.gone if mcp is not None else (lambda name: True),
            outage=outage,
            writable=self._kept.writable if self._kept is not None else None,
        )
        self.deliverer = Deliverer(
            DelivererConfig(
                deliverer_id=self.worker_id,
                max_attempts=settings.outbox_max_attempts,
                lease_ms=int(settings.outbox_lease_seconds * 1000),
                timeout_ms=int(settings.delivery_timeout_seconds * 1000),
                max_delay_ms=int(settings.outbox_max_delay_seconds * 1000),
            ),
            self.broker,
            self.adapters,
            clock,
            parts.rng,
            self.metrics,
            redact=self.redactor.redact,
            outage=outage,
        )
        # An adapter with HTTP routes has `router`, and may say how large its bodies are
        # (`body_limits`: path prefix -> bytes; otherwise the edge's small default applies).
        routers = [r for a in adapters if (r := getattr(a, "router", None)) is not None]
        declared = [b for a in adapters if (b := getattr(a, "body_limits", None)) is not None]
        ops = OpsApi(
            self.repo,
            self.broker,
            self._ops_auth(),
            clock,
            limits=profiles,
            mcp_health=lambda: self.mcp_health(),
        )
        self.app = build_app(
            [*ops.routers, self.metrics.router, *routers],
            self.readiness,
            hosts=host_rule(settings),
            body_limits=body_limits(declared),
            redactor=self.redactor,
            bodies=self.bodies,
        )
        try:
            for adapter in adapters:
                await adapter.start(self.intake)
        except BaseException:
            await self.stop(drain_seconds=0.1)
            raise
        await self._hand_back_gone()
        await self._release_gone_deliveries()
        self._judging = asyncio.create_task(self._judge_bindings(), name="authority-bindings")
        self.worker.start()
        self.deliverer.start()
        if settings.approval_remind_seconds > 0:
            self._reminders = asyncio.create_task(self._remind(), name="approval-reminders")
        if kept is not None:
            self._watching = asyncio.create_task(kept.run(), name="redis-kept")
        log.info(event("service started", worker=self.worker_id, adapters=sorted(self.adapters)))

    def tool_approvers(self, tool: str) -> frozenset[str] | None:
        """The approvers a tool's own configuration names (None: it names none).

        Plugin tools name none; an MCP server's per-tool override may (the MCP source answers).
        """
        return self.mcp.approvers_for(tool) if self.mcp is not None else None

    def _ops_auth(self) -> OpsAuth:
        """The configured tokens; with none (loopback only), the local token made at first start."""
        settings = self.settings
        if settings.ops_tokens:
            return OpsAuth(parse_tokens([t.get_secret_value() for t in settings.ops_tokens]))
        path = token_file(settings.effective_store_url)
        token, kept = local_token(path)
        self.redactor.add(token)
        self.ops_sign_in = token
        self.ops_token_file = path if kept else None
        return OpsAuth([("local", "operator", token)])

    async def _hand_back_gone(self) -> None:
        """Hand back the tickets of workers whose process is gone; say who else holds some.

        A process that died (SIGKILL, a crash, a second Ctrl-C that could not release) left
        its tickets taken and its leases held until they run out (`GATEWAY_LEASE_SECONDS`).
        One of this machine and pid namespace whose process no longer runs is known gone
        (`gateway.incarnation`): its sessions are handed back now, and the worker that takes
        each takes over its lease at once (D159). Any other holder is alive, or unknown: its
        sessions wait until its tickets lapse, which the log says.
        """
        assert self.broker is not None
        try:
            held = await self.broker.inbox.held()
        except Exception as exc:  # the broker answered the probe: a later take retries anyway
            log.warning(event("ticket holders unread", error=type(exc).__name__))
            return
        now_ms = self.parts.clock.now_ms()
        by_worker: dict[str, list[int]] = {}
        for ticket in held:
            by_worker.setdefault(ticket.worker, []).append(ticket.expires_at_ms)
        for worker, expiries in sorted(by_worker.items()):
            if worker == self.worker_id:
                continue
            if gone(worker):
                with contextlib.suppress(Exception):
                    released = await self.broker.inbox.release(worker)
                    log.warning(
                        event(
                            "sessions of a stopped process taken over",
                            holder=worker,
                            sessions=len(released),
                            why="its process no longer runs on this machine",
                        )
                    )
                continue
            log.info(
                event(
                    "sessions held by another process",
                    holder=worker,
                    sessions=len(expiries),
                    wait_s=round(max(max(expiries) - now_ms, 0) / 1000, 1),
                    why="it may still work on them; if it stopped without releasing them, "
                    "they are taken when its tickets run out",
                )
            )

    async def _release_gone_deliveries(self) -> None:
        """Release the deliveries a gone process held in flight (D397).

        Its replies waited out the outbox lease (`GATEWAY_OUTBOX_LEASE_SECONDS`, a minute),
        while its sessions, taken over at once, answered the thread's next messages first.
        """
        assert self.broker is not None
        outbox = self.broker.outbox
        try:
            holders = await outbox.holders(now_ms=self.parts.clock.now_ms())
        except Exception as exc:  # a later claim takes them when their leases lapse
            log.warning(event("delivery holders unread", error=type(exc).__name__))
            return
        for worker in holders:
            if worker == self.worker_id or not gone(worker):
                continue
            with contextlib.suppress(Exception):
                released = await outbox.release(worker, now_ms=self.parts.clock.now_ms())
                log.warning(
                    event(
                        "deliveries of a stopped process taken over",
                        holder=worker,
                        deliveries=len(released),
                        why="its process no longer runs on this machine",
                    )
                )

    async def _judge_bindings(self) -> None:
        """Revoke the lanes the settings no longer bind to their session, in the background.

        A thread of a mailbox the email channel no longer has, or whose space the routes send
        to another session now, has lost its authority: its open run ends, nothing more is
        posted there (D268). One whose binding is back gets it back. A failure is logged: the
        next start judges again.
        """
        assert self.repo is not None
        assert self.broker is not None
        judge = bindings_judge(self.settings, self.adapters)
        try:
            revoked, restored = await judge_bindings(
                self.repo,
                self.broker,
                judge,
                by=f"gateway:{self.worker_id}",
                now_ms=self.parts.clock.now_ms(),
            )
        except Exception as exc:
            log.warning(event("bindings not judged", error=type(exc).__name__))
            return
        if revoked or restored:
            log.warning(event("bindings judged", revoked=revoked, restored=restored))

    async def _remind(self) -> None:
        """Sweep for approval requests that waited long (`gateway.reminders`) until stopped."""
        assert self.repo is not None
        assert self.broker is not None
        every_s = self.settings.approval_remind_seconds
        pause_s = min(_REMIND_SWEEP_MAX_S, max(every_s / 4, _REMIND_SWEEP_MIN_S))
        while True:
            await asyncio.sleep(pause_s)
            try:
                await remind(
                    self.repo,
                    self.broker,
                    now_ms=self.parts.clock.now_ms(),
                    interval_ms=int(every_s * 1000),
                    max_attempts=self.settings.max_attempts,
                )
            except Exception as exc:  # the next sweep tries again; nothing is lost meanwhile
                log.warning(event("approval reminders failed", error=type(exc).__name__))

    async def _close_owned(self) -> None:
        for thing in reversed(self._owned):
            close = getattr(thing, "close", None) or getattr(thing, "aclose", None)
            if close is not None:  # a scripted model has nothing to close
                with contextlib.suppress(Exception):
                    await close()
        self._owned.clear()

    def _own(self, thing: Any) -> Any:
        self._owned.append(thing)
        return thing

    async def readiness(self) -> dict[str, str]:
        """``ok`` or the error's type name for each part ``/readyz`` reports.

        The broker, the store, and a channel's own store (the web mailbox). Only the type:
        ``/readyz`` answers anyone who can reach the port, and an error's text may name hosts
        and paths.
        """
        readies = {  # a channel with a store of its own (web)
            name: ready
            for name, adapter in self.adapters.items()
            if (ready := getattr(adapter, "ready", None)) is not None
        }
        kept = self._kept
        if kept is not None:  # a Redis that answers reads may refuse every write

            async def written() -> None:
                refused = await kept.writable()
                if refused is not None:
                    raise refused

            readies["redis_write"] = written
        # every part at once: one after another, a stalled Redis took 3 x 5 s to say so, past
        # a load balancer's health-check timeout
        probed, answers = await asyncio.gather(
            self.probe(), asyncio.gather(*(_answered(ready) for ready in readies.values()))
        )
        checks = {**probed, **dict(zip(readies, answers, strict=True))}
        return {part: "ok" if exc is None else type(exc).__name__ for part, exc in checks.items()}

    async def _check_redis(self) -> None:
        """Warn when a Redis the gateway keeps its state in may lose it (D309)."""
        urls = {self.settings.effective_store_url, self.settings.effective_broker_url}
        for url in sorted(u for u in urls if u.startswith(("redis", "rediss", "unix"))):
            found = await server_config(
                urlunsplit(urlsplit(url)._replace(query="")), "maxmemory-policy", "appendonly"
            )
            shown = without_password(url)
            policy = found.get("maxmemory-policy")
            if policy is not None and policy != "noeviction":
                log.warning(
                    event(
                        "redis may evict the gateway's keys",
                        url=shown,
                        maxmemory_policy=policy,
                        fix="set maxmemory-policy noeviction (accepted messages, sessions and "
                        "replies are lost when Redis evicts them under memory pressure)",
                    )
                )
            if found.get("appendonly") == "no":
                log.warning(
                    event(
                        "redis keeps no log of its writes",
                        url=shown,
                        appendonly="no",
                        fix="set appendonly yes (without it, what Redis acknowledged since its "
                        "last snapshot, accepted messages included, is lost when it restarts)",
                    )
                )

    async def probe(self) -> dict[str, Exception | None]:
        """Ask the broker and the store one cheap question each: None, or why one did not answer."""
        assert self.broker is not None
        assert self.repo is not None
        broker, repo, now_ms = self.broker, self.repo, self.parts.clock.now_ms()
        broker_said, store_said = await asyncio.gather(
            _answered(lambda: broker.outbox.backlog(now_ms=now_ms)), _answered(repo.list)
        )
        return {"broker": broker_said, "store": store_said}

    async def _in_its_words(self, failed: Mapping[str, Exception]) -> dict[str, Exception]:
        """`failed`, where a Redis closed the connection having said why, with what it said."""
        said = {}
        for part, why in failed.items():
            url = self._url(part)
            words = await first_words(url) if url.startswith("redis") else None
            said[part] = ConnectionRefusedError(f"the server said: {words}") if words else why
        return said

    def _url(self, part: str) -> str:
        settings = self.settings
        return settings.effective_store_url if part == "store" else settings.effective_broker_url

    def _refusals(self, failed: Mapping[str, Exception]) -> str:
        """One line a part; the store and the broker on one Redis, failing alike, in one."""
        lines = {part: self._refusal(part, why) for part, why in sorted(failed.items())}
        if len(lines) == 2 and (
            self.settings.effective_store_url == self.settings.effective_broker_url
            and str(failed["broker"]).split(": ")[-1] == str(failed["store"]).split(": ")[-1]
        ):
            return lines["broker"].replace("the broker at", "the broker and the store at", 1)
        return "\n".join(lines.values())

    def _refusal(self, part: str, why: Exception) -> str:
        url = self._url(part)
        shown = without_password(url)
        detail = str(why) or (
            f"no answer in {_PROBE_TIMEOUT_S:g} s" if isinstance(why, TimeoutError) else ""
        )
        password = userinfo_password(url)
        if password:  # an error's text may quote the URL it was given
            detail = detail.replace(password, "***")
        detail = " ".join(detail.split())[:300]
        reason = f"{type(why).__name__}: {detail}" if detail else type(why).__name__
        if isinstance(why, TimeoutError) and url.startswith("rediss"):
            # a plain Redis takes the connection and waits for a command, never for a TLS hello
            reason += "; rediss:// speaks TLS: is the server set up for it (else redis://)?"
        return f"the {part} at {shown} cannot be used ({reason})"

    async def stop(
        self,
        drain_seconds: float | None = None,
        *,
        cut: asyncio.Event | None = None,
        within: float | None = None,
    ) -> None:
        """Drain and close: no new sessions or deliveries; running work gets `drain_seconds`.

        Setting `cut` (a second signal) ends the drain at once. Work still running then is cut:
        its operations stay open, and its sessions' leases and tickets are released, so the
        next process resumes them at once. `within`: the seconds the whole stop may take (the
        drain is shortened to leave time to release and close).
        """
        began = time.monotonic()
        drain = self.settings.drain_seconds if drain_seconds is None else drain_seconds
        end = began + within if within is not None else None
        if end is not None:
            drain = max(min(drain, end - began - _CLOSE_RESERVE_S), 0.0)
        log.info(event("draining", worker=self.worker_id, seconds=drain))
        self.bodies.stop()  # a post still arriving is told to send it again, not cut unanswered
        for task in (self._reminders, self._judging, self._watching):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._reminders = self._judging = self._watching = None
        for adapter in self.adapters.values():  # the web channel's event streams end here
            with contextlib.suppress(Exception):
                await adapter.stop()
        # Workers first: what their last steps reply is then delivered by the deliverer's drain.
        deadline = began + drain
        if self.worker is not None:
            with contextlib.suppress(Exception):
                await self.worker.drain(drain, cut=cut)
        # No run calls a tool now: the MCP servers stop beside the deliverer's drain, each
        # within what is left of the budget (one deaf to its input and to SIGTERM held the
        # stop past it).
        closing_mcp = None
        if self.mcp is not None:
            left = None if end is None else max(end - time.monotonic() - _CLOSE_RESERVE_S / 2, 0.1)
            closing_mcp = asyncio.ensure_future(self.mcp.close(left))
        if self.live is not None:
            await self.live.close()
        if self.deliverer is not None:
            seconds = max(deadline - time.monotonic(), _DELIVERY_DRAIN_MIN_S)
            if end is not None:
                seconds = min(seconds, max(end - time.monotonic() - _CLOSE_RESERVE_S / 2, 0.1))
            with contextlib.suppress(Exception):
                await self.deliverer.stop(seconds, cut=cut)
        if closing_mcp is not None:
            with contextlib.suppress(Exception):
                await closing_mcp
        for adapter in self.adapters.values():
            close = getattr(adapter, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()
        await self._close_owned()
        with contextlib.suppress(Exception):  # the spans of the last steps reach the collector
            await asyncio.to_thread(flush_tracing)
        log.info(event("stopped", worker=self.worker_id))
        if self._unredact is not None:
            self._unredact()
            self._unredact = None


def _say_unmatched_patterns(settings: Settings, offered: Sequence[Tool]) -> None:
    """Warn, once at start, of each profile pattern naming no tool offered, and empty approvers.

    A `deny_tools` typo (``tickets.delete`` for ``tickets.delete_ticket``) took nothing away
    without a word, as an MCP override naming no tool once skipped its approval. A server that
    is down now may offer the tool later: the note says so.
    """
    names = [tool.name for tool in offered]
    for profile in settings.profiles:
        if profile.approvers == ():  # written as `approvers = []`: unset was probably meant
            log.warning(
                event(
                    "profile names no approvers",
                    profile=profile.name,
                    note="no one in a thread can approve or deny its tool calls, only an "
                    "operator (gateway ops approve); leave approvers unset for the channel's own "
                    "approvers",
                )
            )
        for setting, patterns in (
            ("allow_tools", profile.allow_tools or ()),
            ("deny_tools", profile.deny_tools),
        ):
            for pattern in patterns:
                if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
                    log.warning(
                        event(
                            "profile pattern matches no tool",
                            profile=profile.name,
                            field=setting,
                            pattern=pattern,
                            note="no tool offered now has such a name (an MCP server that is "
                            "down may offer one later): `ops mcp --tools` lists them",
                        )
                    )
