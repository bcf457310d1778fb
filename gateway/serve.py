"""`gateway serve`: one process runs the HTTP app, the workers and the deliverer until a signal.

SIGTERM or SIGINT (Ctrl-C) drains: the server stops accepting connections, the workers stop
taking sessions and give running steps `drain_seconds` to finish, the deliverer settles what is
in flight, then leases are released and everything closes. A second signal during the drain
stops at once (what was running stays resumable by the next process).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import uvicorn

from adapters.channel import AdapterStartError
from config import Settings
from gateway.collector import tune_collector
from gateway.logs import configure, event
from gateway.service import Service, StartRefused
from harness_core.storage.urls import without_password

__all__ = ["serve"]

log = logging.getLogger("gateway.serve")


def banner(
    settings: Settings, model: str, sign_in: str | None = None, kept: Path | None = None
) -> str:
    """What a person needs to talk to the service right away."""
    base = f"http://{settings.host}:{settings.port}"
    return "\n".join(
        [
            f"gateway: serving on {base} (model {model}, "
            f"store {without_password(settings.effective_store_url)})",
            *_ops_line(base, sign_in, kept),
            f"  open {base}/web/threads/hello/page and write, or:",
            f"  curl -s -X POST {base}/web/threads/hello/messages "
            "-H 'content-type: application/json' -d '{\"text\": \"hello\"}'",
            f"  curl -s {base}/web/threads/hello",
            *_slack_line(settings, base),
            *_email_line(settings),
            "  Ctrl-C drains and stops.",
        ]
    )


def _ops_line(base: str, sign_in: str | None, kept: Path | None) -> list[str]:
    if sign_in is None:
        return [f"  operators: {base}/ops (sign in with an ops token)"]
    where = f"kept in {kept}" if kept else "new at every start: not saved"
    return [f"  operators: {base}/ops#token={sign_in}  (the operator token, {where})"]


def _email_line(settings: Settings) -> list[str]:
    if settings.email_address is None:
        return []
    return [f"  Email: answering mail to {settings.email_address} ({settings.email_imap_host})"]


def _slack_line(settings: Settings, base: str) -> list[str]:
    if settings.slack_bot_token is None:
        return []
    if settings.slack_app_token is not None:
        return ["  Slack: Socket Mode (mention the bot in a channel it was invited to)"]
    return [f"  Slack: HTTP mode, events and buttons at {base}/slack/events"]


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the service drains, then the process exits."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # `serve` installs the handlers (uvicorn re-raises the signal when it returns)


def _listening(host: str, port: int) -> str | None:
    """Why `host:port` cannot be listened on, or None if it can."""
    try:
        with socket.create_server((host, port), reuse_port=False):
            return None
    except OSError as exc:
        return f"cannot listen on {host}:{port} ({exc.strerror or exc})"


async def serve(settings: Settings) -> int:
    """Run the service until SIGTERM/SIGINT; returns the exit status."""
    configure(settings.log_level)
    for warning in settings.warnings():
        log.warning(event("setting warning", detail=warning))
    refused = _listening(settings.host, settings.port)
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
    assert service.app is not None
    server = _Server(
        uvicorn.Config(
            service.app,
            host=settings.host,
            port=settings.port,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=int(settings.drain_seconds),
        )
    )
    signals = 0
    stopping = asyncio.current_task()

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        server.should_exit = True  # the first: drain
        if signals > 1 and stopping is not None:
            stopping.cancel()  # the second: stop now (open work stays resumable)

    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, on_signal)
    model = service.model
    shown = settings.model if model is None else f"{model.provider}:{model.model_id}"
    sign_in = service.ops_sign_in
    print(banner(settings, shown, sign_in, service.ops_token_file), file=sys.stderr, flush=True)
    tuned = tune_collector(settings.gc_young_threshold)
    if tuned is not None:
        log.info(event("collector tuned", thresholds=list(tuned.thresholds), frozen=tuned.frozen))
    try:
        await server.serve()
        await asyncio.wait_for(service.stop(), timeout=settings.shutdown_seconds)
    except (asyncio.CancelledError, TimeoutError):
        log.warning(event("stopped without draining"))
        return 1
    finally:
        for number in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(number)
    return 0 if server.started else 1
