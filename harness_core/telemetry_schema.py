"""The telemetry schema: every span and attribute the runtime emits, typed, and never content.

`Telemetry` (``harness_core._runtime.telemetry``) refuses a span or an attribute this module does
not name, so the schema is the whole vocabulary: the docs table (`docs/telemetry.md`) is
generated from it (``.venv/bin/python docs/telemetry_table.py``; a test fails while the file
is stale), and a test runs every canonical trajectory under a recording tracer and checks each
span's name, parent and attributes against it. No attribute may carry content (a prompt, a
completion, a tool's arguments or output, a credential): `Attribute.content` is ``False`` for
every one, and the schema refuses one that says otherwise. The runtime adds no span events and
no span links; errors are the span status plus `error.type`.

The provider's own spans (pydantic-ai's instrumentation, off by default: `PydanticAIModel`'s
``instrument``) and a tool's own spans are not the runtime's: they nest under
`harness.model_request` and `harness.tool`, whose context is current while the effect runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "ATTRIBUTES",
    "BEGIN",
    "END",
    "Attribute",
    "EVENTS",
    "markdown",
    "SPANS",
    "Span",
    "unknown",
]

AttributeType = Literal["string", "int", "bool"]

_PYTHON: Final[dict[AttributeType, tuple[type, ...]]] = {
    "string": (str,),
    "int": (int,),
    "bool": (bool,),
}


@dataclass(frozen=True)
class Attribute:
    """One span attribute: its name, type, meaning; `content` is never true (see the module)."""

    name: str
    type: AttributeType
    doc: str
    content: Literal[False] = False

    def __post_init__(self) -> None:
        if self.content is not False:
            raise ValueError(f"attribute {self.name!r}: no attribute may carry content")

    def accepts(self, value: object) -> bool:
        """Whether `value` has this attribute's type (a bool is not an int here)."""
        if self.type == "int" and isinstance(value, bool):
            return False
        return isinstance(value, _PYTHON[self.type])


@dataclass(frozen=True)
class Span:
    """One span the runtime starts, its parent span and the attributes set at start and end.

    `parent` None: the operation's configured parent, or a root.
    """

    name: str
    doc: str
    parent: str | None
    at_start: tuple[str, ...]
    at_end: tuple[str, ...] = ()


_ATTRIBUTES = (
    Attribute("harness.lane", "string", "The lane (a Slack or email thread, a web thread)."),
    Attribute("harness.run_id", "string", "The operation's id (a run, a compaction, ...)."),
    Attribute("harness.operation", "string", "The operation's kind: run, compaction, navigation."),
    Attribute("harness.resumed", "bool", "The operation continues after a restart or a wait."),
    Attribute("harness.outcome", "string", "How the operation ended or that it suspended."),
    Attribute("harness.step", "string", "The step's kind: assistant, compaction, branch_summary."),
    Attribute("harness.stop_reason", "string", "The assistant message's stop reason."),
    Attribute("harness.attempt", "int", "The request's attempt number within its step (1, 2...)."),
    Attribute("harness.tool.name", "string", "The tool's name (as the harness names it)."),
    Attribute("harness.tool.call_id", "string", "The model's id for the call."),
    Attribute("harness.tool.replay", "string", "The tool's declaration: never or safe."),
    Attribute("harness.tool.replayed", "bool", "The call runs again after a crash (recovery)."),
    Attribute("harness.tool.outcome", "string", "ok or error (never the output itself)."),
    Attribute("gen_ai.system", "string", "The model's provider (OpenTelemetry GenAI)."),
    Attribute("gen_ai.request.model", "string", "The model id requested."),
    Attribute(
        "gen_ai.response.finish_reasons", "string", "The provider's stop reason, normalized."
    ),
    Attribute("gen_ai.usage.input_tokens", "int", "Prompt tokens the provider reported."),
    Attribute("gen_ai.usage.output_tokens", "int", "Output tokens the provider reported."),
    Attribute("error.type", "string", "A failure's kind (an exception class, an error kind)."),
)
ATTRIBUTES: Final[dict[str, Attribute]] = {a.name: a for a in _ATTRIBUTES}
"""Every attribute a runtime span may carry, by name."""

_SPANS = (
    Span(
        "harness.operation",
        "One operation from its start or resume to its end or suspension.",
        None,
        ("harness.lane", "harness.run_id", "harness.operation", "harness.resumed"),
        ("harness.outcome", "error.type"),
    ),
    Span(
        "harness.step",
        "One step: an assistant message or a summary, with its retries.",
        "harness.operation",
        ("harness.lane", "harness.run_id", "harness.step"),
        ("harness.stop_reason", "error.type"),
    ),
    Span(
        "harness.model_request",
        "One provider request (one attempt); the provider's own spans nest under it.",
        "harness.step",
        ("gen_ai.system", "gen_ai.request.model", "harness.attempt"),
        (
            "gen_ai.response.finish_reasons",
            "gen_ai.usage.input_tokens",
            "gen_ai.usage.output_tokens",
            "error.type",
        ),
    ),
    Span(
        "harness.tool",
        "One tool run (or replay); the tool's own spans nest under it.",
        "harness.operation",
        (
            "harness.lane",
            "harness.run_id",
            "harness.tool.name",
            "harness.tool.call_id",
            "harness.tool.replay",
            "harness.tool.replayed",
        ),
        ("harness.tool.outcome", "error.type"),
    ),
)
SPANS: Final[dict[str, Span]] = {s.name: s for s in _SPANS}
"""Every span the runtime starts, by name."""

EVENTS: Final[tuple[str, ...]] = ()
"""Span events the runtime adds: none (state changes are the event bus's, not telemetry's)."""


def unknown(span: str, attributes: dict[str, object] | None = None) -> str | None:
    """Why a span name or attribute is not in the schema (None: it is, with the right types)."""
    spec = SPANS.get(span)
    if spec is None:
        return f"span {span!r} is not in the telemetry schema"
    allowed = {*spec.at_start, *spec.at_end}
    for key, value in (attributes or {}).items():
        attribute = ATTRIBUTES.get(key)
        if attribute is None or key not in allowed:
            return f"attribute {key!r} of span {span!r} is not in the telemetry schema"
        if not attribute.accepts(value):
            return f"attribute {key!r} of span {span!r} must be of type {attribute.type}"
    return None


def markdown() -> str:
    """The docs table (`docs/telemetry.md` between its markers)."""
    lines = [
        "| span | parent | attributes at start | attributes at end | what it covers |",
        "|---|---|---|---|---|",
    ]
    for span in SPANS.values():
        start = ", ".join(f"`{a}`" for a in span.at_start)
        end = ", ".join(f"`{a}`" for a in span.at_end)
        parent = f"`{span.parent}`" if span.parent else "the configured parent, or a root"
        lines.append(f"| `{span.name}` | {parent} | {start} | {end} | {span.doc} |")
    lines += [
        "",
        "| attribute | type | may carry content | meaning |",
        "|---|---|---|---|",
    ]
    for attribute in ATTRIBUTES.values():
        lines.append(f"| `{attribute.name}` | {attribute.type} | never | {attribute.doc} |")
    return "\n".join(lines) + "\n"


BEGIN: Final = "<!-- telemetry table: generated by docs/telemetry_table.py -->"
END: Final = "<!-- end of the generated table -->"
