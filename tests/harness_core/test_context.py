"""The incremental context window agrees with the pure projection; cached config with the path."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from harness_core._runtime.context import ContextWindow, estimate_tokens, heal_tool_results, project
from harness_core.messages import (
    AgentMessage,
    AssistantMessage,
    TextPart,
    ToolCallPart,
    ToolResultMessage,
    UserMessage,
    message_text,
)
from harness_core.models import ModelInfo, ModelRef
from harness_core.models.scripted import text
from harness_core.options import CompactionSettings
from harness_core.result import Err, Ok
from harness_core.session.entries import CompactionEntry, Entry, MessageEntry
from harness_core.session.types import StoredEntry
from tests.support.harness_kit import make_kit

CALL_IDS = ["c1", "c2", "c3"]

user = st.builds(lambda t: UserMessage(content=(TextPart(text=t),)), st.text(max_size=20))
assistant = st.builds(
    lambda t, calls: AssistantMessage(
        content=(TextPart(text=t), *(ToolCallPart(id=c, name="f", arguments={}) for c in calls)),
        stop_reason="tool_use" if calls else "stop",
    ),
    st.text(max_size=20),
    st.lists(st.sampled_from(CALL_IDS), max_size=3, unique=True),
)
result = st.builds(
    lambda c, t: ToolResultMessage(tool_call_id=c, tool_name="f", content=(TextPart(text=t),)),
    st.sampled_from(CALL_IDS),
    st.text(max_size=20),
)
messages = st.lists(st.one_of(user, assistant, result), max_size=25)


def reference_heal(sequence: list[AgentMessage]) -> tuple[AgentMessage, ...]:
    """The healing rule spelled out directly: close open calls before any non-result message."""
    healed: list[AgentMessage] = []
    open_calls: list[ToolCallPart] = []
    for message in [*sequence, None]:
        if not isinstance(message, ToolResultMessage):
            healed += [
                ToolResultMessage(
                    tool_call_id=c.id,
                    tool_name=c.name,
                    content=(TextPart(text="No result was recorded for this tool call."),),
                    outcome="interrupted",
                )
                for c in open_calls
            ]
            open_calls = []
        else:
            open_calls = [c for c in open_calls if c.id != message.tool_call_id]
        if message is None:
            break
        healed.append(message)
        if isinstance(message, AssistantMessage):
            open_calls += [p for p in message.content if isinstance(p, ToolCallPart)]
    return tuple(healed)


@settings(max_examples=200, deadline=None)
@given(messages, st.text(max_size=30))
def test_the_window_heals_and_sizes_like_the_whole_list(
    sequence: list[AgentMessage], system: str
) -> None:
    window = ContextWindow()
    for i, message in enumerate(sequence):
        window.add_message(message)
        prefix = sequence[: i + 1]
        assert window.messages() == reference_heal(prefix) == heal_tool_results(prefix)
        assert window.tokens(system) == estimate_tokens(window.messages(), system)


def test_entries_project_one_at_a_time() -> None:
    tail = (UserMessage(content=(TextPart(text="kept"),)),)
    entries: list[Entry] = [
        MessageEntry(id="u", message=UserMessage(content=(TextPart(text="hi"),))),
        MessageEntry(id="a", message=text("hello")),
        CompactionEntry(id="k", summary="s", retained_tail=tail, tokens_before=10),
    ]
    window = ContextWindow()
    for entry in entries:
        window.add(entry)
    assert window.messages() == project(entries)
    assert [m.role for m in project(entries)] == ["user", "assistant", "user", "user"]


async def test_cached_configuration_matches_a_fresh_walk(backend: str, tmp_path: Path) -> None:
    kit = await make_kit(backend, tmp_path, [text("one"), text("two"), text("three")])
    other = ModelRef(provider="scripted", model_id="other")
    await kit.harness.set_thinking_level("high")
    assert isinstance(await kit.harness.prompt("first"), Ok)
    await kit.harness.set_model(other)
    assert isinstance(await kit.harness.prompt("second"), Ok)
    cached = await kit.harness._rt.lanes["main"].context.configuration()
    reopened = await kit.reopen()  # lane main restores on its first use, like any other
    fresh = await (await reopened.harness._lane_rt()).context.configuration()
    assert cached == fresh
    assert (fresh.model_id, fresh.thinking_level) == ("other", "high")


async def test_navigation_to_the_root_refuses_a_label(tmp_path: Path) -> None:
    kit = await make_kit("memory", tmp_path, [text("one")])
    assert isinstance(await kit.harness.prompt("first"), Ok)
    before = len(await kit.storage.get_log())
    refused = await kit.harness.navigate_tree(None, label="start")
    assert isinstance(refused, Err) and refused.error.tag == "UnknownTarget"
    assert len(await kit.storage.get_log()) == before  # nothing written, nothing dropped silently
    moved = await kit.harness.navigate_tree(None)
    assert isinstance(moved, Ok) and await kit.harness.get_leaf_id() is None


async def test_a_small_window_compacts_with_the_default_settings(
    backend: str, tmp_path: Path
) -> None:
    """An 8,192-token model (a local server): the defaults reserved 16,384 tokens, more than
    the window, and kept 20,000 verbatim, so every request was over the limit and no
    compaction could shrink it. Each is at most a quarter of the window now (D310)."""
    kit = await make_kit(backend, tmp_path, [text("noted"), text("the summary"), text("both read")])
    kit.model.info = ModelInfo(context_window=8_192, max_output_tokens=4_096)
    first = await kit.harness.prompt("log one: " + "disk full on db-1. " * 800)  # ~3,800 tokens
    assert isinstance(first, Ok) and first.value.kind == "completed"
    second = await kit.harness.prompt("log two: " + "disk full on db-2. " * 500)  # ~2,400 more
    assert isinstance(second, Ok) and second.value.final_message is not None
    assert message_text(second.value.final_message) == "both read"
    log = await kit.storage.get_log()
    assert any(isinstance(i, StoredEntry) and isinstance(i.entry, CompactionEntry) for i in log)
    assert (kit.model.requests[-1].estimated_input_tokens or 0) < 8_192 - 2_048


def test_compaction_settings_fit_the_window() -> None:
    settings = CompactionSettings()
    assert settings.within(200_000) == (16_384, 20_000)
    assert settings.within(8_192) == (2_048, 2_048)
