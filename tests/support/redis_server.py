"""A real redis-server for tests: own port, own data directory, optional AOF, killable."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One redis-server process (start, SIGKILL, restart on the same data directory)."""

    def __init__(
        self,
        directory: Path,
        *,
        appendonly: bool = False,
        appendfsync: str = "everysec",
        options: tuple[str, ...] = (),
    ) -> None:
        """`options`: more of redis-server's own (``--rename-command CONFIG ""``)."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install -y redis-server)")
        self.binary = binary
        self.directory = directory
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.options = options
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.directory), "--save", "",
            "--appendonly", "yes" if self.appendonly else "no", "--appendfsync", self.appendfsync,
            "--daemonize", "no", "--logfile", str(self.directory / "redis.log"), *self.options,
        ]  # fmt: skip
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        try:
            while True:
                try:
                    if client.ping():
                        return self
                except redis.exceptions.BusyLoadingError:
                    pass
                except redis.exceptions.ConnectionError:
                    if self.process.poll() is not None:
                        raise RuntimeError(f"redis-server exited: {self.log_tail()}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start: {self.log_tail()}")
                time.sleep(0.02)
        finally:
            client.close()

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.directory / "redis.log").read_text()[-2000:]
        return ""

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final fsync."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None
