"""`gateway serve`: one process runs the HTTP app, the workers and the deliverer until a signal.

The banner is printed once the socket listens. SIGTERM or SIGINT (Ctrl-C) drains: the server
stops accepting connections and the channels stop receiving (open event streams end), the
workers stop taking sessions and give running steps `drain_seconds` to finish, the deliverer
settles what is in flight, then leases and tickets are released and everything closes, all
within `shutdown_seconds`. A second signal cuts the drain: running work stops where it is, its
sessions are released (the next process resumes them at once) and the process exits with 128 +
the signal (130 for Ctrl-C). A third exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn

from adapters import AdapterStartError
from config import Settings
from gateway.broker import BrokerError
from gateway.channels import channel_lines, channel_state, served_url
from gateway.collector import tune_collector
from gateway.logs import configure, event
from gateway.loop_watch import LoopWatch
from gateway.ops.address import address_file, connect_host, forget_address, keep_address
from gateway.redact import Redactor
from gateway.service import Service, StartRefused
from gateway.slow_heads import HeadTimedProtocol
from gateway.waits import until_done
from harness_core import SessionError
from harness_core.backends.urls import without_password
from harness_core.clock import SystemClock

__all__ = ["serve"]

log = logging.getLogger("gateway.serve")


def banner(
    settings: Settings,
    model: str,
    sign_in: str | None = None,
    kept: Path | None = None,
    *,
    terminal: bool = True,
) -> str:
    """What a person needs to talk to the service right away.

    `terminal`: stderr is a person's terminal. Anywhere else (a container's or a service
    manager's log) the local operator token is not printed, only where it is kept: the logs
    hold no key.
    """
    base = served_url(settings)
    unsaid = sign_in is not None and not terminal
    if not terminal:
        sign_in = None
    return "\n".join(
        [
            f"gateway: serving on {base} (model {model}, "
            f"store {without_password(settings.effective_store_url)})",
            *_ops_line(base, sign_in, kept, unsaid=unsaid),
            *channel_lines(settings, SystemClock()),
            "  Ctrl-C drains and stops.",
        ]
    )


def _ops_line(
    base: str, sign_in: str | None, kept: Path | None, *, unsaid: bool = False
) -> list[str]:
    if sign_in is None and kept is not None:
        return [f"  operators: {base}/ops (sign in with the operator token kept in {kept})"]
    if unsaid:  # a log is read by more people than the operators: its token is no sign-in
        return [
            f"  operators: {base}/ops (no operator token could be kept beside this store, and "
            "a log gets none: set GATEWAY_OPS_TOKENS to sign in)"
        ]
    if sign_in is None:
        return [f"  operators: {base}/ops (sign in with an ops token)"]
    where = f"kept in {kept}" if kept else "new at every start: not saved"
    return [f"  operators: {base}/ops#token={sign_in}  (the operator token, {where})"]


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling, saying when its socket listens."""

    def __init__(self, config: uvicorn.Config, listening: Callable[[], None]) -> None:
        super().__init__(config)
        self._listening = listening

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # `serve` installs the handlers (uvicorn re-raises the signal when it returns)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Listen, then say so: a script that waits for the banner can connect at once."""
        try:
            await super().startup(sockets)
        except SystemExit:  # it could not listen (uvicorn logged why): `serve` stops, exits 1
            self.should_exit = True
            return
        if self.started:
            self._listening()


def _cannot_listen(host: str, port: int) -> str | None:
    """Why `host:port` cannot be listened on, or None if it can."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # ::1 and :: too
    try:
        with socket.create_server((host, port), family=family, reuse_port=False):
            return None
    except OSError as exc:
        return f"cannot listen on {host}:{port} ({exc.strerror or exc})"


@dataclass
class _Signals:
    """SIGTERM and SIGINT: the first drains, the second cuts the drain, a third exits at once."""

    settings: Settings
    drain: asyncio.Event = field(default_factory=asyncio.Event)
    cut: asyncio.Event = field(default_factory=asyncio.Event)
    received: list[int] = field(default_factory=list)

    def on(self, number: int) -> None:
        self.received.append(number)
        if len(self.received) == 1:
            self.drain.set()
        elif len(self.received) == 2:
            self.cut.set()
        else:  # the stop does not end (a store that does not answer): leave now
            print(
                f"gateway: stopped at once ({_name(number)} a third time): "
                f"{_unreleased(self.settings)}",
                file=sys.stderr,
                flush=True,
            )
            os._exit(128 + number)


def _unreleased(settings: Settings) -> str:
    """What happens to sessions this process stops holding without releasing them."""
    return (
        "a start on this machine takes the sessions still held at once (this process is gone); "
        f"one elsewhere waits up to {settings.lease_seconds:g} s (GATEWAY_LEASE_SECONDS) for "
        "their leases to run out"
    )


_CUT_GRACE_S = 2.0
"""After a second signal: how long the cut stop may take to release leases and tickets."""


def _name(number: int) -> str:
    return "Ctrl-C" if number == signal.SIGINT else signal.Signals(number).name


async def serve(settings: Settings) -> int:
    """Run the service until SIGTERM/SIGINT; returns the exit status.

    0 after a drain; 128 + the signal's number after a second signal cut the drain (130 for a
    second Ctrl-C); 1 if the stop did not end within ``GATEWAY_SHUTDOWN_SECONDS``.
    """
    configure(settings.log_level)
    for warning in settings.warnings(channel_state(settings, SystemClock())):
        log.warning(event("setting warning", detail=warning))
    refused = _cannot_listen(settings.host, settings.port)
    if refused is not None:
        print(f"gateway: {refused}", file=sys.stderr)
        return 2
    service = Service(settings)
    try:
        await service.start()
    except (AdapterStartError, StartRefused) as exc:  # fail fast: a supervisor restarts us
        for line in str(exc).splitlines():
            print(f"gateway: {line}", file=sys.stderr)
        return 1
    except (SessionError, BrokerError) as exc:
        if exc.code not in ("invalid_query", "invalid_url"):
            raise
        # a store or broker URL that is malformed is a setting that is wrong: 2, as `store
        # --store` and `ask --store` say of the same URL (D301)
        print(f"gateway: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    assert service.app is not None
    model = service.model
    shown = settings.model if model is None else f"{model.provider}:{model.model_id}"

    address = address_file(settings.effective_store_url)
    connect_url = served_url(settings, connect_host(settings.host))

    def listening() -> None:
        text = banner(
            settings,
            shown,
            service.ops_sign_in,
            service.ops_token_file,
            terminal=sys.stderr.isatty(),
        )
        print(text, file=sys.stderr, flush=True)
        keep_address(address, connect_url)
        loop = type(asyncio.get_running_loop())
        log.info(event("event loop", loop=f"{loop.__module__}.{loop.__qualname__}"))
        tuned = tune_collector(settings.gc_young_threshold)
        if tuned is not None:
            log.info(
                event("collector tuned", thresholds=list(tuned.thresholds), frozen=tuned.frozen)
            )

    server = _Server(
        uvicorn.Config(
            service.app,
            host=settings.host,
            port=settings.port,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=int(settings.drain_seconds),
            http=HeadTimedProtocol,  # a request head that never ends holds no connection
        ),
        listening,
    )
    signals = _Signals(settings)
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, signals.on, number)
    watch = LoopWatch()  # a blocking call in a tool or hook is named, not only felt
    watch.start()
    try:
        return await _run(settings, service, server, signals)
    finally:
        forget_address(address, connect_url)
        await watch.stop()
        for number in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(number)


async def _run(settings: Settings, service: Service, server: _Server, signals: _Signals) -> int:
    """Serve until the first signal, then stop within ``GATEWAY_SHUTDOWN_SECONDS``.

    The stop begins at once, beside uvicorn's: the adapters stop receiving (the web channel's
    event streams end, so no open page holds the server), workers drain, replies go out.
    """
    serving = asyncio.ensure_future(server.serve())
    draining = asyncio.ensure_future(signals.drain.wait())
    await asyncio.wait({serving, draining}, return_when=asyncio.FIRST_COMPLETED)
    draining.cancel()
    budget = settings.shutdown_seconds
    server.should_exit = True
    stopping = asyncio.ensure_future(service.stop(cut=signals.cut, within=budget))
    forcing = asyncio.ensure_future(_force_after(signals.cut, server))
    began = asyncio.get_running_loop().time()
    ended = await until_done([serving, stopping], budget, signals.cut)
    if not ended and signals.cut.is_set():
        # a second signal: the cut stop gets a moment to release what it holds, not the whole
        # budget (a store that stopped answering held it to the end, and exit 1)
        left = budget - (asyncio.get_running_loop().time() - began)
        ended = await until_done([serving, stopping], min(_CUT_GRACE_S, max(left, 0.0)))
    forcing.cancel()
    if not ended:
        for task in (serving, stopping):
            task.cancel()
        await until_done([serving, stopping], 1.0)
        if len(signals.received) > 1:
            log.warning(event("stopped without releasing", signal=_name(signals.received[1])))
            print(
                f"gateway: stopped at once (second {_name(signals.received[1])}) before "
                f"everything was released: {_unreleased(settings)}",
                file=sys.stderr,
                flush=True,
            )
            return 128 + signals.received[1]
        log.warning(event("stopped without draining", seconds=budget))
        print(
            f"gateway: stopped after {budget:g} s (GATEWAY_SHUTDOWN_SECONDS) before everything "
            f"was released: {_unreleased(settings)}",
            file=sys.stderr,
            flush=True,
        )
        return 1
    failure = None if serving.cancelled() else serving.exception()
    if failure is not None:  # the server ended by itself: it was a clean exit 0, without a word
        log.error(event("server failed", error=type(failure).__name__))
        said = Redactor.from_settings(settings).redact(str(failure)) or "no detail"
        print(
            f"gateway: stopped: the server failed ({type(failure).__name__}: {said})",
            file=sys.stderr,
            flush=True,
        )
        return 1
    if not server.started:
        print(f"gateway: cannot listen on {settings.host}:{settings.port}", file=sys.stderr)
        return 1
    if len(signals.received) > 1:
        print(
            f"gateway: stopped at once (second {_name(signals.received[1])}): running work was "
            "cut and released; the next start resumes it at once",
            file=sys.stderr,
            flush=True,
        )
        return 128 + signals.received[1]
    return 0


async def _force_after(cut: asyncio.Event, server: _Server) -> None:
    """A second signal: uvicorn stops waiting for open connections."""
    await cut.wait()
    server.force_exit = True
