"""OTLP export: with ``OTEL_EXPORTER_OTLP_ENDPOINT`` set, a service's spans reach the collector.

The export installs a process-global tracer provider (once per process), so the service runs
in a child process (this module's `child`); the collector is an HTTP server in the test's
process that keeps every POST. The spans carry identifiers and counts, never what was said.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from gateway import telemetry
from gateway.channels import gateway_settings
from gateway.service import Service

ROOT = Path(__file__).resolve().parents[2]
SAID = "SECRET-WORDS-tango-4711"


class Collector:
    """A local OTLP/HTTP endpoint that keeps what is posted to it."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, str], bytes]] = []
        received = self.posts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                received.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)


@pytest.fixture
def collector() -> Iterator[Collector]:
    found = Collector()
    found.thread.start()
    yield found
    found.server.shutdown()
    found.server.server_close()


async def child(folder: str) -> None:
    """Run one message through a service (the export on, from the env), then stop it."""
    settings = gateway_settings(
        store_url=f"sqlite:///{folder}/store.db",
        broker_url=f"sqlite:///{folder}/broker.db",
        web_url=f"sqlite:///{folder}/web.db",
        plugin="tests.support.gateway_agent",
    )
    service = Service(settings)
    await service.start()
    provider = trace.get_tracer_provider()
    assert not isinstance(provider, trace.ProxyTracerProvider)  # installed by start()
    assert telemetry.install_tracing() is not None
    assert trace.get_tracer_provider() is provider  # once per process
    assert service.app is not None
    transport = httpx.ASGITransport(app=service.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        posted = await http.post("/web/threads/t1/messages", json={"text": SAID})
        assert posted.status_code == 202, posted.text
        deadline = asyncio.get_running_loop().time() + 15
        while True:
            items = (await http.get("/web/threads/t1")).json()["items"]
            if any(item["kind"] != "message" for item in items):
                break
            assert asyncio.get_running_loop().time() < deadline, items
            await asyncio.sleep(0.02)
    await service.stop(drain_seconds=2)  # flushes the spans


def test_spans_of_a_message_reach_the_collector_without_its_text(
    collector: Collector, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.url
    code = (
        "import asyncio; from tests.gateway.test_otlp_export import child;"
        f" asyncio.run(child({str(tmp_path)!r}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    traces = [(headers, body) for path, headers, body in collector.posts if path == "/v1/traces"]
    assert traces, collector.posts
    assert all(body for _, body in traces)
    assert {headers["content-type"] for headers, _ in traces} == {"application/x-protobuf"}
    names = set()
    services = set()
    for _, body in traces:
        assert SAID.encode() not in body  # neither the message nor the reply that echoes it
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            services |= {
                a.value.string_value
                for a in resource_spans.resource.attributes
                if a.key == "service.name"
            }
            for scope_spans in resource_spans.scope_spans:
                names |= {span.name for span in scope_spans.spans}
    assert {"harness.operation", "harness.step", "harness.model_request"} <= names
    assert services == {"durable-gateway"}


def test_without_the_endpoint_nothing_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in telemetry.ENDPOINT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    assert telemetry.install_tracing() is None
    assert telemetry.flush_tracing() is True


def test_a_missing_exporter_is_said_once_with_the_extra_to_install(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    monkeypatch.setattr(telemetry, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="gateway.telemetry"):
        assert telemetry.install_tracing() is None
        assert telemetry.install_tracing() is None
    [record] = [r for r in caplog.records if r.name == "gateway.telemetry"]
    assert "durable-gateway[otlp]" in record.getMessage()
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
