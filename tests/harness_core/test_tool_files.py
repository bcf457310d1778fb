"""Files a tool returns: stored with its result on every backend, named to the model, bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness_core.messages import TextPart, ToolFile, ToolResultMessage, message_text
from harness_core.models.scripted import text, tool_call
from harness_core.result import Ok
from harness_core.session.entries import MessageEntry
from harness_core.session.records import ToolStarted
from harness_core.session.types import RecordQuery
from harness_core.tools import MAX_TOOL_FILES_BYTES, Tool, ToolContext, ToolOutput, tool
from tests.support.harness_kit import make_kit

CSV = b"ticket,status\n1,open\n2,closed\n"


def report_tool(size: int | None = None) -> Tool:
    @tool(requires_approval=False)
    async def report(args: dict[str, object], ctx: ToolContext) -> ToolOutput:
        """Export the tickets."""
        if size is None:
            files = (ToolFile.of("tickets.csv", "text/csv", CSV),)
            return ToolOutput(content=(TextPart(text="exported 2 tickets"),), files=files)
        # a tool that skipped validation: the harness checks the output again
        big = (ToolFile.of("tickets.csv", "text/csv", b"x" * size),)
        return ToolOutput.text("exported").model_copy(update={"files": big})

    return report


@pytest.mark.backends("memory", "jsonl", "sqlite")
async def test_a_returned_file_is_stored_with_the_result_and_named_to_the_model(
    backend: str, tmp_path: Path
) -> None:
    kit = await make_kit(
        backend, tmp_path, [tool_call("report", {}), text("here it is")], tools=[report_tool()]
    )
    assert isinstance(await kit.harness.prompt("export"), Ok)
    seen = kit.model.requests[-1].messages[-1]
    assert isinstance(seen, ToolResultMessage)
    assert message_text(seen).startswith("exported 2 tickets")
    assert "tickets.csv (text/csv, 30 bytes) is sent with your reply" in message_text(seen)
    (started,) = await kit.storage.find_records(RecordQuery(type="tool_started"))
    assert isinstance(started.record, ToolStarted)
    stored = await kit.storage.get_entry(started.record.result_entry_id)
    assert stored is not None and isinstance(stored.entry, MessageEntry)
    message = stored.entry.message
    assert isinstance(message, ToolResultMessage)
    assert [(f.name, f.media_type, f.content, f.size) for f in message.files] == [
        ("tickets.csv", "text/csv", CSV, len(CSV))
    ]


async def test_files_over_the_bound_make_an_error_result_and_store_nothing(
    backend: str, tmp_path: Path
) -> None:
    kit = await make_kit(
        backend,
        tmp_path,
        [tool_call("report", {}), text("sorry")],
        tools=[report_tool(MAX_TOOL_FILES_BYTES + 1)],
    )
    assert isinstance(await kit.harness.prompt("export"), Ok)
    seen = kit.model.requests[-1].messages[-1]
    assert isinstance(seen, ToolResultMessage) and seen.outcome == "error"
    assert seen.files == ()
    assert "report returned an invalid result" in message_text(seen)


def test_a_file_name_is_one_plain_name_and_its_data_base64() -> None:
    with pytest.raises(ValueError, match="plain name"):
        ToolFile.of("../etc/passwd", "text/plain", b"x")
    with pytest.raises(ValueError, match="base64"):
        ToolFile(name="a.csv", media_type="text/csv", data="not base64!")
    assert [ToolFile.of("a", "text/plain", b"x" * n).size for n in (0, 1, 2, 3)] == [0, 1, 2, 3]
