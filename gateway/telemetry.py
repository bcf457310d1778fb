"""OpenTelemetry export: the harness's spans to an OTLP/HTTP collector, configured by the env.

The harness makes spans (operations, steps, provider requests, tool calls) with the tracer its
options give it; their attributes are identifiers, kinds, counts and outcomes, never content.
`install_tracing` decides that tracer, once per process:

* ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) set, and the
  ``otlp`` extra installed (``pip install 'durable-gateway[otlp]'``): an SDK `TracerProvider`
  with a `BatchSpanProcessor` over an `OTLPSpanExporter` becomes the global provider, set up by
  the standard ``OTEL_*`` variables (endpoint, headers, timeout, compression, service name:
  ``durable-gateway`` unless ``OTEL_SERVICE_NAME`` or ``OTEL_RESOURCE_ATTRIBUTES`` names one).
  Installed once however many services start; later calls return a tracer of it.
* The variable set but the extra missing: one warning naming the extra; no spans.
* A provider someone else installed (``opentelemetry-instrument``, a host application): used as
  it is, never replaced.
* Otherwise: no tracer (the harness skips its spans).

`flush_tracing` pushes what is buffered (a service calls it when it stops).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.trace import Tracer

from gateway.logs import event

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

__all__ = ["ENDPOINT_VARIABLES", "OTLP_EXTRA", "flush_tracing", "install_tracing"]

log = logging.getLogger("gateway.telemetry")

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
"""Either one turns the export on (the exporter reads them, with the other ``OTEL_*``)."""
OTLP_EXTRA = "durable-gateway[otlp]"
"""What to install for the export."""
_SCOPE = "durable-gateway"
_SERVICE_NAME = "durable-gateway"

_lock = threading.Lock()
_installed: TracerProvider | None = None
"""The SDK provider this module installed (once per process)."""
_warned = False


def install_tracing() -> Tracer | None:
    """The tracer for the harness's spans (see the module doc); installs the export once."""
    global _installed, _warned
    with _lock:
        if _installed is not None:
            return trace.get_tracer(_SCOPE)
        if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            return trace.get_tracer(_SCOPE)  # someone else's provider: theirs to configure
        if not any(os.environ.get(name) for name in ENDPOINT_VARIABLES):
            return None
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import SERVICE_NAME, Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            if not _warned:
                _warned = True
                log.warning(
                    event(
                        f"OTEL_EXPORTER_OTLP_ENDPOINT is set but spans are not exported:"
                        f" install the otlp extra (pip install '{OTLP_EXTRA}')",
                        missing=exc.name,
                    )
                )
            return None
        resource = Resource.create()
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: _SERVICE_NAME}))
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
        _installed = provider
        log.info(event("tracing exported", protocol="otlp/http"))
        return provider.get_tracer(_SCOPE)


def flush_tracing(timeout_s: float = 5.0) -> bool:
    """Export the spans buffered so far (blocks up to `timeout_s`); False if some were not."""
    provider = _installed
    if provider is None:
        return True
    return provider.force_flush(int(timeout_s * 1000))
