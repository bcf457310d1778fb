"""`gateway serve` as a real process, for tests and benchmarks that kill and restart it.

`GatewayProcess` starts ``python -m gateway serve`` on a free port with settings given as
``GATEWAY_*`` environment variables, waits until ``/readyz`` answers, and stops it with SIGTERM
(a drain) or SIGKILL (a crash); `restart` starts a new incarnation on the same port. The process
writes its logs to a file per incarnation, for a failing test to show.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx

from tests.support.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]


class GatewayProcess:
    """One `gateway serve` process (restartable)."""

    def __init__(
        self,
        name: str,
        directory: Path,
        settings: Mapping[str, str],
        *,
        port: int | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.directory = directory
        self._port_given = port is not None
        self.port = port or free_port()
        self.env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            **{f"GATEWAY_{key.upper()}": value for key, value in settings.items()},
            **(extra_env or {}),
        }
        self.env.pop("GATEWAY_CONFIG", None)
        self.process: subprocess.Popen[bytes] | None = None
        self.incarnation = 0
        self.exits: list[int] = []

    @property
    def url(self) -> str:
        """The process's base URL."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        """The current incarnation's log file."""
        return self.directory / f"{self.name}.{self.incarnation}.log"

    def start(self, *, wait_ready_s: float = 20.0) -> GatewayProcess:
        """Start a new incarnation and wait until it is ready (raises if it is not).

        A free port is free only when it is picked: another test's server may bind it before
        this process does. The first start of a process whose port was picked here then picks
        another (twice at most); a port given, or a restart's, is kept as it is.
        """
        picks_left = 0 if self._port_given or self.incarnation else 2
        while True:
            self._spawn()
            if wait_ready_s <= 0:
                return self
            try:
                self.wait_ready(wait_ready_s)
                return self
            except RuntimeError:
                # a process that never got ready is not left behind: the caller's `finally`
                # that stops it is not entered yet, and an orphan serving on slows every
                # later test (a loaded run's slow starts then cascaded)
                self.kill()
                if picks_left == 0 or "Address already in use" not in self.tail():
                    raise
                picks_left -= 1
                self.incarnation = 0
                self.port = free_port()

    def _spawn(self) -> None:
        self.incarnation += 1
        log = open(self.log_path, "wb")  # noqa: SIM115 - owned by the child's lifetime
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--port", str(self.port)],
            cwd=self.directory,
            env={**self.env, "PYTHONPATH": str(ROOT)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        """Wait until ``/readyz`` says ok."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited ({self.process.returncode}):\n{self.tail()}"
                )
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready after {timeout_s}s:\n{self.tail()}")
            time.sleep(0.05)

    @property
    def alive(self) -> bool:
        """Whether the current incarnation runs."""
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: the process dies at once, mid-whatever."""
        self._signal(signal.SIGKILL)
        self._reap(10.0)

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (a drain) and wait for the exit; returns the exit status."""
        self._signal(signal.SIGTERM)
        return self._reap(timeout_s)

    def restart(self, *, wait_ready_s: float = 20.0) -> None:
        """Start the next incarnation (the previous one must be gone)."""
        assert not self.alive
        self.start(wait_ready_s=wait_ready_s)

    def _signal(self, number: int) -> None:
        if self.alive:
            assert self.process is not None
            self.process.send_signal(number)

    def _reap(self, timeout_s: float) -> int:
        if self.process is None:
            return 0
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self.exits.append(code)
        return code

    def tail(self, lines: int = 40) -> str:
        """The end of the current incarnation's log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Whatever state it is in: gone afterwards."""
        if self.alive:
            self.terminate(timeout_s=20.0)


def sqlite_urls(directory: Path) -> dict[str, str]:
    """The store, the broker and the web mailbox as SQLite files in `directory`."""
    return {
        "store_url": f"sqlite:///{directory}/store.db",
        "broker_url": f"sqlite:///{directory}/broker.db",
        "web_url": f"sqlite:///{directory}/web.db",
    }


@contextlib.contextmanager
def serving(directory: Path, **settings: str) -> Iterator[GatewayProcess]:
    """`gateway serve` on SQLite files in `directory` with `settings`, stopped afterwards."""
    process = GatewayProcess("gw", directory, {**sqlite_urls(directory), **settings}).start()
    try:
        yield process
    finally:
        process.stop()


def not_json(output: str) -> list[str]:
    """The lines of a process's stderr that are neither JSON log lines nor the banner.

    The banner is ``gateway: serving on ...`` and the indented lines after it.
    """
    found: list[str] = []
    in_banner = False
    for line in output.splitlines():
        if line.startswith("gateway: serving on "):
            in_banner = True
            continue
        if in_banner and line.startswith("  ") and not line.lstrip().startswith("File "):
            continue
        in_banner = False
        try:
            parsed = json.loads(line)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict) or "event" not in parsed:
            found.append(line)
    return found
