"""The telemetry schema is the whole vocabulary: what every trajectory emits is in it, typed.

Every canonical trajectory runs under a recording tracer; each span's name, parent and
attributes (names and types) must be in `harness_core.telemetry_schema`, which no attribute
that may carry content can enter. The docs table is generated from it and must be current. A
model client's and a tool's own spans nest under the runtime's request and tool spans, and
pydantic-ai's own provider spans (off by default) nest under the request span when enabled.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from harness_core import telemetry_schema as schema
from harness_core._runtime.telemetry import Telemetry
from harness_core.messages import AssistantMessage
from harness_core.models import ModelRef, ModelRequest
from harness_core.models.pydantic_ai import PydanticAIModel
from harness_core.models.scripted import ScriptedModel, text, tool_calls
from harness_core.result import Ok
from harness_core.storage.memory import MemorySessionRepo
from harness_core.testing import ManualClock
from harness_core.testing.trajectories import SCENARIOS, Scenario, open_run, prompt
from harness_core.tools import Tool, ToolContext
from tests.support.harness_kit import make_kit

ROOT = Path(__file__).resolve().parents[2]


def recording() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def parents(spans: tuple[ReadableSpan, ...]) -> dict[str, str | None]:
    """Each span's name -> its parent's name (None: a root), checked to be one parent per name."""
    names = {span.context.span_id: span.name for span in spans}
    found: dict[str, str | None] = {}
    for span in spans:
        parent = names.get(span.parent.span_id) if span.parent is not None else None
        assert found.setdefault(span.name, parent) == parent, span.name
    return found


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_every_span_of_every_trajectory_is_in_the_schema(scenario: Scenario) -> None:
    provider, exporter = recording()
    traced = dataclasses.replace(
        scenario, options={**scenario.options, "tracer": provider.get_tracer("t")}
    )
    run = await open_run(traced, MemorySessionRepo(clock=ManualClock()), "t-", create=True)
    await (traced.drive(run.harness) if traced.drive else prompt(run.harness))
    await run.harness.close()
    spans = exporter.get_finished_spans()
    assert spans, "the trajectory made no span"
    for span in spans:
        assert schema.unknown(span.name, dict(span.attributes or {})) is None
        assert not span.events and not span.links
    for name, parent in parents(spans).items():
        assert parent == schema.SPANS[name].parent, (name, parent)


def test_no_attribute_may_carry_content_and_every_one_is_used() -> None:
    assert all(attribute.content is False for attribute in schema.ATTRIBUTES.values())
    with pytest.raises(ValueError, match="no attribute may carry content"):
        schema.Attribute("gen_ai.prompt", "string", "the prompt", content=True)  # type: ignore[arg-type]
    used = {a for span in schema.SPANS.values() for a in (*span.at_start, *span.at_end)}
    assert used == set(schema.ATTRIBUTES)
    assert schema.EVENTS == ()


def test_the_runtime_refuses_a_name_the_schema_lacks() -> None:
    provider, _ = recording()
    telemetry = Telemetry(provider.get_tracer("t"))
    with pytest.raises(ValueError, match=r"span 'harness\.surprise' is not in the telemetry"):
        telemetry.start("harness.surprise", None, {})
    with pytest.raises(ValueError, match=r"attribute 'gen_ai\.prompt' of span"):
        telemetry.start("harness.step", None, {"gen_ai.prompt": "hello"})
    with pytest.raises(ValueError, match=r"'harness\.attempt' of span .* must be of type int"):
        telemetry.start("harness.model_request", None, {"harness.attempt": "1"})
    span = telemetry.start("harness.tool", None, {"harness.tool.name": "t"})
    with pytest.raises(ValueError, match=r"'harness\.tool\.output' of span"):
        Telemetry.end(span, {"harness.tool.output": "the secret"})


def test_the_docs_table_is_generated_from_the_schema() -> None:
    text = (ROOT / "docs" / "telemetry.md").read_text()
    assert f"{schema.BEGIN}\n\n{schema.markdown()}\n{schema.END}" in text, (
        "docs/telemetry.md is stale: run .venv/bin/python docs/telemetry_table.py"
    )


async def test_a_tools_and_a_model_clients_own_spans_nest_under_the_runtimes(
    backend: str, tmp_path: Path
) -> None:
    provider, exporter = recording()
    own = provider.get_tracer("their code")

    async def lookup(args: object, ctx: ToolContext) -> str:
        with own.start_as_current_span("tool's own work"):
            return "found"

    class TracedModel(ScriptedModel):
        async def request(self, request: ModelRequest, on_update: Any = None) -> AssistantMessage:
            with own.start_as_current_span("client's own request"):
                return await super().request(request, on_update)

    kit = await make_kit(
        backend,
        tmp_path,
        tools=[Tool(name="lookup", description="d", execute=lookup)],
        tracer=provider.get_tracer("harness"),
        model_client=TracedModel([tool_calls(("lookup", {}, "c1")), text("done")]),
    )
    assert isinstance(await kit.harness.prompt("go"), Ok)
    found = parents(exporter.get_finished_spans())
    assert found["tool's own work"] == "harness.tool"
    assert found["client's own request"] == "harness.model_request"
    outside = trace.get_current_span()  # nothing leaked into the caller's context
    assert not outside.get_span_context().is_valid


@pytest.mark.parametrize("enabled", [True, False])
async def test_pydantic_ais_provider_spans_nest_under_the_request_span_when_enabled(
    enabled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, exporter = recording()
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)  # pydantic-ai uses the global one

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart(content="SECRET-COMPLETION")])

    client = PydanticAIModel(lambda ref: FunctionModel(answer), provider_spans=enabled)
    kit = await make_kit(
        "memory",
        Path("/nonexistent"),
        tracer=provider.get_tracer("harness"),
        model_client=client,
        model=ModelRef(provider="test", model_id="function"),
    )
    assert isinstance(await kit.harness.prompt("SECRET-PROMPT"), Ok)
    spans = exporter.get_finished_spans()
    theirs = [s for s in spans if not s.name.startswith("harness.")]
    if not enabled:
        assert theirs == []
        return
    assert theirs and {parents(spans)[s.name] for s in theirs} == {"harness.model_request"}
    for span in theirs:  # content stays out of their attributes too
        assert "SECRET" not in repr(dict(span.attributes or {}))
