"""Telemetry: the span tree of a run, with explicit parents, and no content in any attribute."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from harness_core.models.scripted import error, text, tool_calls
from harness_core.result import Ok
from harness_core.tools import Tool, ToolContext
from tests.support.harness_kit import make_kit

SECRETS = [
    "SECRET-PROMPT",
    "SECRET-COMPLETION",
    "SECRET-ARG",
    "SECRET-OUTPUT",
    "SECRET-SYSTEM",
    "sk-live-SECRET-KEY",
]


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def tracer_for(exporter: InMemorySpanExporter) -> trace.Tracer:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test")


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


async def traced_run(
    backend: str, tmp_path: Path, exporter: InMemorySpanExporter
) -> tuple[tuple[ReadableSpan, ...], trace.Span]:
    """A run under an incoming span, with a retried request and a tool: its spans and parent."""

    async def secret_tool(args: Any, ctx: ToolContext) -> str:
        return "SECRET-OUTPUT with the sk-live-SECRET-KEY token"

    tracer = tracer_for(exporter)
    parent = tracer.start_span("incoming slack message")
    kit = await make_kit(
        backend,
        tmp_path,
        [
            error("server"),  # a retried attempt: two request spans in the first step
            tool_calls(("vault", {"query": "SECRET-ARG"}, "c1")),
            text("SECRET-COMPLETION"),
        ],
        tools=[Tool(name="vault", description="reads", execute=secret_tool)],
        tracer=tracer,
        trace_parent=trace.set_span_in_context(parent),
        system_prompt="SECRET-SYSTEM",
    )
    assert isinstance(await kit.harness.prompt("SECRET-PROMPT please"), Ok)
    parent.end()
    return exporter.get_finished_spans(), parent


async def test_a_run_is_one_span_tree(
    backend: str, tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    spans, parent = await traced_run(backend, tmp_path, exporter)
    (operation,) = by_name(spans, "harness.operation")
    steps = by_name(spans, "harness.step")
    requests = by_name(spans, "harness.model_request")
    (tool,) = by_name(spans, "harness.tool")
    assert len(steps) == 2 and len(requests) == 3
    # the parent chain: message -> operation -> step -> request; operation -> tool
    assert (
        operation.parent is not None
        and operation.parent.span_id == parent.get_span_context().span_id
    )
    op_id = operation.context.span_id
    assert all(s.parent is not None and s.parent.span_id == op_id for s in [*steps, tool])
    step_ids = {s.context.span_id for s in steps}
    assert all(r.parent is not None and r.parent.span_id in step_ids for r in requests)
    assert {s.context.trace_id for s in spans} == {parent.get_span_context().trace_id}
    assert operation.attributes is not None
    assert operation.attributes["harness.outcome"] == "completed"
    failed = [r for r in requests if r.attributes and r.attributes.get("error.type") == "server"]
    assert len(failed) == 1
    assert tool.attributes is not None and tool.attributes["harness.tool.name"] == "vault"


async def test_no_span_carries_content(
    backend: str, tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    # nothing a person wrote, a model said, or a tool saw or returned; no credentials
    spans, _ = await traced_run(backend, tmp_path, exporter)
    assert spans
    for span in spans:
        for key, value in (span.attributes or {}).items():
            for secret in SECRETS:
                assert secret not in str(value), f"{span.name}.{key} leaks {secret}"
        assert all(secret not in span.name for secret in SECRETS)


async def test_without_a_tracer_a_run_still_works(tmp_path: Path) -> None:
    kit = await make_kit("memory", tmp_path, [text("hi")])
    assert kit.harness._rt.options.tracer is None
    assert isinstance(await kit.harness.prompt("hello"), Ok)  # no-op spans, no errors


@pytest.mark.parametrize("explicit_parent", [False, True])
async def test_an_ambient_span_never_adopts_a_run(
    explicit_parent: bool, tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    # D46: parents are explicit. A caller's active span (a web request, a queue consumer) must
    # not adopt the run: every lane started under one ambient span would share its trace.
    # Without `trace_parent` the run is a root; with one, a child of it and only of it.
    async def probe(args: Any, ctx: ToolContext) -> str:
        return "probed"

    tracer = tracer_for(exporter)
    chosen = tracer.start_span("incoming email")
    kit = await make_kit(
        "memory",
        tmp_path,
        [tool_calls(("probe", {}, "c1")), text("done")],
        tools=[Tool(name="probe", description="probes", execute=probe)],
        tracer=tracer,
        trace_parent=trace.set_span_in_context(chosen) if explicit_parent else None,
    )
    with tracer.start_as_current_span("ambient") as ambient:
        assert isinstance(await kit.harness.prompt("hello"), Ok)
    chosen.end()
    spans = exporter.get_finished_spans()
    (operation,) = by_name(spans, "harness.operation")
    if explicit_parent:
        assert operation.parent is not None
        assert operation.parent.span_id == chosen.get_span_context().span_id
    else:
        assert operation.parent is None, "the operation attached to the ambient span"
    assert operation.context.trace_id != ambient.get_span_context().trace_id
    # the rest of the run stays one tree under the operation: two steps, two requests, one tool
    harness = [s for s in spans if s.name.startswith("harness.")]
    assert len(harness) == 6
    assert {s.context.trace_id for s in harness} == {operation.context.trace_id}
    op_id = operation.context.span_id
    children = [*by_name(spans, "harness.step"), *by_name(spans, "harness.tool")]
    assert len(children) == 3
    assert all(s.parent is not None and s.parent.span_id == op_id for s in children)
