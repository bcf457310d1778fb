"""What the model reads from the harness itself: synthetic tool results, summary framing, closures.

These words are part of the contract: a model (and the person reading the thread) learns from
them what happened to a call it made. `INTERRUPTED` in particular is the harness's one way of
saying "this may or may not have happened": it is what a `replay="never"` call that a crash
interrupted returns, and the README quotes it.
"""

from __future__ import annotations

__all__ = [
    "ABORTED_CALL",
    "ABORTED_CLOSURE",
    "BRANCH_SUMMARY_PREFIX",
    "CHANGED_AFTER_APPROVAL",
    "INTERRUPTED",
    "NO_RESULT",
    "NOT_RUN_ABORTED",
    "SUMMARY_PREFIX",
    "SUMMARY_SYSTEM",
    "TRUNCATED_CALL",
    "denied",
    "file_sent",
    "image_withheld",
    "invalid_result",
    "no_such_tool",
    "one_line",
    "supplied_note",
    "tool_cut_by_abort",
    "tool_failed",
    "tool_timed_out",
]

INTERRUPTED = (
    "This tool call was interrupted before its result was recorded. It may or may not have "
    "happened; check before repeating it."
)
"""A started call whose outcome a crash made unknown (never replayed unless safe)."""

ABORTED_CALL = "This tool call did not run: the run was aborted."
"""A call of an aborted run that never started."""

NOT_RUN_ABORTED = "This tool call did not run: the run was aborted before it started."
"""A call released after its run's abort landed (it is not started)."""

TRUNCATED_CALL = "This tool call did not run: the response was truncated before completion."
"""A call of a response cut off by ``length`` (its arguments may be incomplete)."""

CHANGED_AFTER_APPROVAL = "A hook changed the arguments after approval."
"""An approved call whose `before_tool` hook changed the approved arguments (blocked)."""

NO_RESULT = "No result was recorded for this tool call."
"""Shown for a call without any result in a context (healing a log from another writer)."""

ABORTED_CLOSURE = "(aborted)"
"""The assistant message that closes an aborted run."""

SUMMARY_SYSTEM = "You write faithful, compact summaries of conversations for an AI assistant."
"""The system prompt of summary requests (compaction and branch summaries)."""

SUMMARY_PREFIX = "Summary of the earlier conversation:\n"
"""How a compaction's summary opens the context that replaces what it summarized."""

BRANCH_SUMMARY_PREFIX = "Summary of a branch this conversation left:\n"
"""How a branch summary appears in the context after a navigation."""


def image_withheld(media_type: str, size: int) -> str:
    """An image the provider refused a request for, in its place from then on (D289)."""
    if size < 1000:
        shown = f"{size} bytes"
    else:
        shown = f"{size / 1_000_000:.1f} MB" if size >= 1_000_000 else f"{size // 1000} KB"
    return (
        f"[An image ({media_type}, {shown}) was here. It is not shown: the model provider "
        "refused a request that carried it.]"
    )


def no_such_tool(name: str) -> str:
    """A call of a tool the lane may not (or cannot) call."""
    return f"There is no tool named {name!r}."


def supplied_note(decided_by: str | None) -> str:
    """Who supplied a call's result instead of letting the tool run (never sent to the model)."""
    return f"supplied by {decided_by}" if decided_by else "supplied by the decider"


def denied(decided_by: str | None, reason: str | None) -> str:
    """A call an approver denied, with who and why when known."""
    by = f" by {decided_by}" if decided_by else ""
    return f"This tool call was denied{by}{f': {reason}' if reason else '.'}"


def tool_failed(tool: str, error: BaseException) -> str:
    """A tool that raised (an error whose text cannot be read is named by its type alone)."""
    try:
        said = str(error)
    except Exception:  # its __str__ raised: foreign code
        said = ""
    return (
        f"{tool} failed: {type(error).__name__}: {said}"
        if said
        else f"{tool} failed: {type(error).__name__}"
    )


def tool_cut_by_abort(tool: str, seconds: float) -> str:
    """A tool that went on past the grace its run's abort gave it."""
    return (
        f"{tool} was cut off {seconds:g} s after the run was stopped; it may or may not have "
        "had its effect: check before repeating it"
    )


def tool_timed_out(tool: str, seconds: float) -> str:
    """A tool that outlived its `timeout_seconds`."""
    return f"{tool} timed out after {seconds} s"


def invalid_result(tool: str, reason: str) -> str:
    """A tool whose output is not valid durable data (a NaN usage, say)."""
    return f"{tool} returned an invalid result ({reason})"


def file_sent(name: str, media_type: str, size: int) -> str:
    """A file a tool returned, as the model reads of it: named, sent with the reply, unread."""
    return f"[file {name} ({media_type}, {size} bytes) is sent with your reply to the user]"


def one_line(text: str, limit: int = 300) -> str:
    """`text` on one line, cut to `limit` characters with ``...`` saying so.

    Its whitespace runs become one space: someone's words quoted in a log line or a message.
    """
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def tool_output_cut(total: int, kept: int) -> str:
    """The note after a tool result's text cut to `kept` of its `total` characters."""
    return (
        f"[output cut: {total - kept:,} of {total:,} characters not shown (the limit is {kept:,})]"
    )
