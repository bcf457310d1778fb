"""The local token file's token goes to no port: `gateway ops` sends a proof bound to the port
it calls, checked against the port the request came in on (D381), against `gateway serve`."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import httpx
import pytest

from gateway.channels import gateway_settings
from gateway.ops.cli import main
from tests.support.gateway_process import serving, sqlite_urls
from tests.support.redis_server import free_port

AGENT = "tests.support.gateway_agent"


class _Listener(http.server.BaseHTTPRequestHandler):
    """Whatever else listens on a loopback port: keeps the Authorization it is sent."""

    heard: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.heard.append(self.headers.get("Authorization", ""))
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"error": {"code": "unauthenticated", "message": "no"}}')

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def listener() -> Iterator[tuple[int, list[str]]]:
    heard: list[str] = []
    handler = type("Heard", (_Listener,), {"heard": heard})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], heard
    finally:
        server.shutdown()
        server.server_close()


def test_another_loopback_port_learns_nothing_it_could_use(
    tmp_path: Path,
    listener: tuple[int, list[str]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GATEWAY_OPS_URL", raising=False)
    monkeypatch.delenv("GATEWAY_OPS_TOKEN", raising=False)
    urls = sqlite_urls(tmp_path)
    with serving(tmp_path, plugin=AGENT) as process:
        token = (tmp_path / "ops-token").read_text().strip()
        settings = gateway_settings(**urls, host="127.0.0.1", port=process.port)
        other, heard = listener
        # a typo in --url: another program's port gets a proof for its own port only
        assert main(["lanes", "--url", f"http://127.0.0.1:{other}"], settings) == 1
        capsys.readouterr()
        [sent] = heard
        assert sent.startswith("Bearer port-bound-v1:") and token not in sent
        replayed = httpx.get(f"{process.url}/api/v1/lanes", headers={"Authorization": sent})
        assert replayed.status_code == 401
        # the gateway's own port takes the proof made for it, and the token as ever
        assert main(["lanes"], settings) == 0, capsys.readouterr()
        assert main(["lanes", "--url", process.url], settings) == 0
        mine = httpx.get(
            f"{process.url}/api/v1/lanes", headers={"Authorization": f"Bearer {token}"}
        )
        assert mine.status_code == 200


def test_gateway_ops_calls_the_port_the_serve_of_its_store_listens_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`serve --port N` (or GATEWAY_PORT in one shell) and then `ops` from the same directory
    called the settings' port and could not reach it (an outside probe)."""
    monkeypatch.delenv("GATEWAY_OPS_URL", raising=False)
    monkeypatch.delenv("GATEWAY_OPS_TOKEN", raising=False)
    urls = sqlite_urls(tmp_path)
    settings = gateway_settings(**urls, host="127.0.0.1", port=free_port())  # not the served one
    kept = tmp_path / "ops-address"
    with serving(tmp_path, plugin=AGENT) as process:
        assert kept.read_text() == f"{process.url}\n"
        assert main(["lanes"], settings) == 0, capsys.readouterr()
        capsys.readouterr()
        # a file others may write is no address: a planted one would carry a token elsewhere
        kept.chmod(0o666)
        assert main(["lanes"], settings) == 3
        said = capsys.readouterr().err
        assert f"cannot reach the gateway at http://127.0.0.1:{settings.port}" in said
        kept.chmod(0o644)
    assert not kept.exists()  # a drained stop forgets it: the next `ops` asks the settings
