"""A local Redis Cluster for tests: three masters, no replicas, own ports and data directories.

Each node is ``redis-server --cluster-enabled yes`` on a port whose cluster-bus port (port +
10000) is free too; ``redis-cli --cluster create`` assigns the 16384 slots, and `start` returns
once every node reports ``cluster_state:ok``. The cluster is started once per test session (the
``redis_cluster`` fixture in ``tests/conftest.py``); tests isolate themselves with key prefixes.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, cast

import redis

from tests.support.redis_server import RedisServer

__all__ = ["LocalRedisCluster"]


def _port_pair_free(port: int) -> bool:
    """Whether `port` and its cluster-bus port (port + 10000) can both be bound."""
    with contextlib.ExitStack() as stack:
        for candidate in (port, port + 10_000):
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind(("127.0.0.1", candidate))
            except OSError:
                return False
    return True


def _cluster_ports(count: int, taken: set[int]) -> list[int]:
    rng = random.Random()
    ports: list[int] = []
    while len(ports) < count:
        port = rng.randrange(20_000, 50_000)
        if port in taken or port in ports or not _port_pair_free(port):
            continue
        ports.append(port)
    return ports


class _Node(RedisServer):
    """One cluster node: a `RedisServer` started with cluster mode on."""

    def __init__(self, directory: Path, port: int) -> None:
        super().__init__(directory)
        self.port = port

    def start(self) -> _Node:
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", "5000", "--dir", str(self.directory), "--save", "",
            "--appendonly", "no", "--daemonize", "no",
            "--logfile", str(self.directory / "redis.log"),
        ]  # fmt: skip
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        try:
            while True:
                try:
                    if client.ping():
                        return self
                except redis.exceptions.ConnectionError:
                    if self.process.poll() is not None:
                        raise RuntimeError(f"redis-server exited: {self.log_tail()}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start: {self.log_tail()}")
                time.sleep(0.02)
        finally:
            client.close()

    def cluster_info(self) -> dict[str, str]:
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5, decode_responses=True)
        try:
            text = cast(Any, client).execute_command("CLUSTER", "INFO")
        finally:
            client.close()
        if isinstance(text, dict):
            return {str(k): str(v) for k, v in text.items()}
        return dict(
            line.split(":", 1) for line in str(text).splitlines() if ":" in line
        )  # pragma: no cover - redis-py parses CLUSTER INFO into a dict


class LocalRedisCluster:
    """Three (or `masters`) cluster nodes on 127.0.0.1, created as one cluster."""

    def __init__(self, directory: Path, *, masters: int = 3) -> None:
        if shutil.which("redis-cli") is None:
            raise RuntimeError("redis-cli is not installed (apt-get install -y redis-tools)")
        self.directory = directory
        self.nodes = [
            _Node(directory / f"node-{port}", port) for port in _cluster_ports(masters, set())
        ]

    @property
    def url(self) -> str:
        """The broker URL: the cluster scheme and one startup node."""
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    @property
    def startup_url(self) -> str:
        """A plain redis URL of one node (for redis-py's `RedisCluster.from_url`)."""
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    def start(self, timeout_s: float = 30.0) -> LocalRedisCluster:
        try:
            for node in self.nodes:
                node.start()
            create = [
                "redis-cli", "--cluster", "create",
                *(f"127.0.0.1:{node.port}" for node in self.nodes),
                "--cluster-replicas", "0", "--cluster-yes",
            ]  # fmt: skip
            done = subprocess.run(create, capture_output=True, text=True, timeout=timeout_s)
            if done.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout}{done.stderr}")
            deadline = time.monotonic() + timeout_s
            while not all(self._ok(node) for node in self.nodes):
                if time.monotonic() > deadline:
                    raise RuntimeError("the cluster did not reach cluster_state:ok")
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _ok(node: _Node) -> bool:
        try:
            info = node.cluster_info()
        except redis.exceptions.RedisError:
            return False
        return info.get("cluster_state") == "ok" and info.get("cluster_slots_ok") == "16384"

    def stop(self) -> None:
        """SIGKILL every node (the data is throwaway; a graceful cluster shutdown takes ~5 s)."""
        for node in self.nodes:
            node.kill()
