"""Telemetry: OpenTelemetry spans for operations, steps, provider requests and tool calls.

Parents are passed explicitly (a span's parent is given when it starts; nothing is attached to
the ambient context, and the ambient context is never read): a span with neither a parent span
nor a configured `trace_parent` is a root, even when the caller has an active span, so
concurrent lanes never mix their traces. Attributes carry identifiers, kinds, counts and
outcomes only: never a prompt, a completion, tool arguments or output, or a credential.
Without a tracer every call is a no-op on a non-recording span.

The vocabulary is `harness_core.telemetry_schema`: a span or attribute it does not name, or of
another type, is refused with `ValueError` (a programming error, caught by the tests that run
every trajectory under a recording tracer). `current` makes a span the ambient one while an
effect runs, so a model client's or a tool's own spans nest under the runtime's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from harness_core.telemetry_schema import unknown

__all__ = ["Attributes", "Telemetry"]

Attributes = Mapping[str, str | int | float | bool]


class Telemetry:
    """Starts spans under explicit parents (the options' `trace_parent` for operations)."""

    def __init__(self, tracer: Tracer | None, parent: Context | None = None) -> None:
        self._tracer = tracer
        # OpenTelemetry reads `context=None` as "the current context": an empty one is a root.
        self._parent = parent if parent is not None else Context()

    def start(self, name: str, parent: Span | None, attributes: Attributes) -> Span:
        """A started span: a child of `parent`, else of the configured parent context, else a root.

        Args:
            name: the span name.
            parent: the parent span (an operation for steps and tools, a step for requests).
            attributes: identifiers, kinds and counts only (see the module doc).
        """
        if self._tracer is None:
            return trace.INVALID_SPAN
        if (why := unknown(name, dict(attributes))) is not None:
            raise ValueError(why)
        context = (
            # on an empty context too: the ambient one's other values (baggage) stay out
            trace.set_span_in_context(parent, Context()) if parent is not None else self._parent
        )
        return self._tracer.start_span(name, context=context, attributes=dict(attributes))

    @staticmethod
    @contextlib.contextmanager
    def current(span: Span) -> Iterator[None]:
        """Make `span` the ambient span while an effect runs (its own spans nest under it).

        Only a recording span: without a tracer the caller's ambient context stays as it was.
        The span is neither ended nor marked by an exception here (`end` does that).
        """
        if not span.is_recording():
            yield
            return
        with trace.use_span(span, record_exception=False, set_status_on_exception=False):
            yield

    @staticmethod
    def end(span: Span, attributes: Attributes, *, error: str | None = None) -> None:
        """Record the outcome and end the span (`error` is a kind, never a message)."""
        if span is trace.INVALID_SPAN:
            return  # no tracer: nothing to record (six spans a prompt)
        name = getattr(span, "name", None) if span.is_recording() else None
        if name is not None and (why := unknown(name, dict(attributes))) is not None:
            raise ValueError(why)
        for key, value in attributes.items():
            span.set_attribute(key, value)
        if error is not None:
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR))
        span.end()
