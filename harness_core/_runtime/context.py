"""Provider context: from a lane's entries to the messages a request carries, and its size.

Context is the lane's path from its newest compaction to its leaf, projected: messages as they
are (deferred placeholders dropped), a compaction as its summary plus its retained tail, a
branch summary as a note, custom entries only through a projector. Compaction planning and
token estimates live here too; all of it is pure.
"""

from __future__ import annotations

import binascii
import io
import math
from collections.abc import Mapping, Sequence

import imagesize  # type: ignore[import-untyped]  # no stubs; get() -> (width, height)

from harness_core import texts
from harness_core.messages import (
    AgentMessage,
    AssistantMessage,
    ImagePart,
    TextPart,
    ToolCallPart,
    ToolResultMessage,
    UserMessage,
    message_text,
)
from harness_core.options import EntryProjector
from harness_core.session.entries import (
    BranchSummaryEntry,
    CompactionEntry,
    CustomEntry,
    Entry,
    MessageEntry,
)

__all__ = [
    "ContextWindow",
    "count_images",
    "estimate_tokens",
    "heal_tool_results",
    "image_tokens",
    "plan_compaction",
    "project",
    "project_entry",
    "summary_request_text",
    "without_images",
]


def project_entry(
    entry: Entry, projectors: Mapping[str, EntryProjector] | None = None
) -> Sequence[AgentMessage]:
    """The provider messages of one context entry (none for most non-message entries)."""
    if isinstance(entry, MessageEntry):
        message = entry.message
        if isinstance(message, AssistantMessage) and message.stop_reason == "deferred":
            return ()  # a placeholder for a pending request: nothing for the model
        return (message,)
    if isinstance(entry, CompactionEntry):
        summary = UserMessage(content=(TextPart(text=texts.SUMMARY_PREFIX + entry.summary),))
        return (summary, *entry.retained_tail)
    if isinstance(entry, BranchSummaryEntry):
        return (UserMessage(content=(TextPart(text=texts.BRANCH_SUMMARY_PREFIX + entry.summary),)),)
    if isinstance(entry, CustomEntry) and projectors and entry.custom_type in projectors:
        return tuple(projectors[entry.custom_type](entry))
    return ()


def project(
    entries: Sequence[Entry], projectors: Mapping[str, EntryProjector] | None = None
) -> tuple[AgentMessage, ...]:
    """Project context entries (oldest first) into provider messages."""
    window = ContextWindow(projectors)
    for entry in entries:
        window.add(entry)
    return window.messages()


def heal_tool_results(messages: Sequence[AgentMessage]) -> tuple[AgentMessage, ...]:
    """Give every tool call a result before the conversation moves on.

    Providers reject a tool call without a result; a fork or a branch cut mid-batch can leave
    one. The synthetic result says no result was recorded; it is never persisted.
    """
    window = ContextWindow()
    for message in messages:
        window.add_message(message)
    return window.messages()


def _interrupted(call: ToolCallPart) -> ToolResultMessage:
    return ToolResultMessage(
        tool_call_id=call.id,
        tool_name=call.name,
        content=(TextPart(text=texts.NO_RESULT),),
        outcome="interrupted",
    )


def count_images(messages: Sequence[AgentMessage]) -> int:
    """How many image parts `messages` carry (a person's files and tools' results)."""
    return sum(
        isinstance(part, ImagePart)
        for message in messages
        if not isinstance(message, AssistantMessage)
        for part in message.content
    )


def without_images(messages: tuple[AgentMessage, ...], count: int) -> tuple[AgentMessage, ...]:
    """`messages` with every image of the first `count` replaced by a note saying why (D289).

    The same tuple when those hold no image, so a request that needs no change costs a scan.
    """
    if count_images(messages[:count]) == 0:
        return messages
    return (*(_without_images(m) for m in messages[:count]), *messages[count:])


def _without_images(message: AgentMessage) -> AgentMessage:
    if isinstance(message, AssistantMessage) or not any(
        isinstance(part, ImagePart) for part in message.content
    ):
        return message
    content = tuple(
        TextPart(text=texts.image_withheld(part.media_type, _decoded_size(part.data)))
        if isinstance(part, ImagePart)
        else part
        for part in message.content
    )
    return message.model_copy(update={"content": content})


def _decoded_size(data: str) -> int:
    """The bytes base64 `data` holds, without decoding it."""
    return len(data) * 3 // 4 - (len(data) - len(data.rstrip("=")))


# What one image costs a request, by Anthropic's published rule: an image is scaled to fit
# 1,568 pixels a side and about 1.15 megapixels (its table: 1092 x 1092 costs about 1,590), then
# costs width x height / 750 tokens, so at most about 1,600 (OpenAI's high detail is at most
# 1,105 for one image: this is the larger).
_IMAGE_SIDE = 1568
_IMAGE_PIXELS = 1092 * 1092
_PIXELS_A_TOKEN = 750
IMAGE_MAX_TOKENS = 1600
# An image's size is in its header: a PNG, GIF or WebP's first bytes, a JPEG's frame header
# after its metadata segments (EXIF with a thumbnail is at most 64 KiB).
_HEADER_CHARS = 96 * 1024


def image_tokens(part: ImagePart) -> int:
    """What `part` is estimated to cost a request in tokens, from its width and height.

    An image whose size cannot be read from its first bytes counts as the most one can cost.
    """
    head = part.data[:_HEADER_CHARS]
    try:
        size = imagesize.get(io.BytesIO(binascii.a2b_base64(head[: len(head) // 4 * 4])))
        width, height = int(size[0]), int(size[1])
    except Exception:  # a cut or garbled header: the library's errors are not typed
        return IMAGE_MAX_TOKENS
    if width <= 0 or height <= 0:
        return IMAGE_MAX_TOKENS
    scale = min(1.0, _IMAGE_SIDE / max(width, height), math.sqrt(_IMAGE_PIXELS / (width * height)))
    return max(1, min(IMAGE_MAX_TOKENS, round(width * scale * height * scale / _PIXELS_A_TOKEN)))


def _chars(message: AgentMessage) -> int:
    chars = len(message_text(message)) + 16
    if not isinstance(message, AssistantMessage):
        for part in message.content:
            if isinstance(part, ImagePart):
                chars += 4 * image_tokens(part)  # estimates are in characters, four a token
    return chars


class ContextWindow:
    """A lane's projected, healed context, maintained one entry at a time.

    Appending costs the size of the entry and the size estimate is a running sum, so a turn's
    cost does not grow with the lane's history (only `messages()` copies the list, once per
    change).
    """

    def __init__(self, projectors: Mapping[str, EntryProjector] | None = None) -> None:
        self._projectors = projectors
        self._messages: list[AgentMessage] = []
        self._open: list[ToolCallPart] = []
        self._chars = 0
        self._view: tuple[AgentMessage, ...] | None = None

    def add(self, entry: Entry) -> None:
        """Append one context entry (oldest first)."""
        for message in project_entry(entry, self._projectors):
            self.add_message(message)

    def add_message(self, message: AgentMessage) -> None:
        """Append one provider message, closing tool calls the conversation moved past."""
        if isinstance(message, ToolResultMessage):
            self._open = [call for call in self._open if call.id != message.tool_call_id]
        else:
            for call in self._open:
                self._append(_interrupted(call))
            self._open = []
        self._append(message)
        if isinstance(message, AssistantMessage):
            self._open.extend(p for p in message.content if isinstance(p, ToolCallPart))

    def _append(self, message: AgentMessage) -> None:
        self._messages.append(message)
        self._chars += _chars(message)
        self._view = None

    def messages(self) -> tuple[AgentMessage, ...]:
        """The messages a request carries (calls still open get an interrupted result)."""
        if self._view is None:
            closing = [_interrupted(call) for call in self._open]
            self._view = (*self._messages, *closing)
        return self._view

    def tokens(self, system_prompt: str | None = None) -> int:
        """`estimate_tokens(self.messages(), system_prompt)`, without walking the messages."""
        closing = sum(_chars(_interrupted(call)) for call in self._open)
        return (len(system_prompt or "") + self._chars + closing) // 4 + 1


def estimate_tokens(messages: Sequence[AgentMessage], system_prompt: str | None = None) -> int:
    """A deterministic size estimate: four characters a token plus a small per-message overhead.

    An image counts by its pixels (`image_tokens`), not by the length of its base64.
    """
    chars = len(system_prompt or "")
    for message in messages:
        chars += _chars(message)
    return chars // 4 + 1


def plan_compaction(
    messages: Sequence[AgentMessage], keep_recent_tokens: int
) -> tuple[tuple[AgentMessage, ...], tuple[AgentMessage, ...]]:
    """Split context into (to summarize, retained tail).

    The tail keeps the newest messages within `keep_recent_tokens`, and always starts at a user
    message so a tool call is never separated from its result. Nothing to summarize means the
    first part is empty.
    """
    cut = len(messages)
    budget = keep_recent_tokens
    for index in range(len(messages) - 1, -1, -1):
        budget -= estimate_tokens([messages[index]])
        if budget < 0:
            break
        if isinstance(messages[index], UserMessage):
            cut = index
    if cut == len(messages):
        # even the newest turn does not fit: keep from its last user message anyway
        cut = next(
            (i for i in range(len(messages) - 1, -1, -1) if isinstance(messages[i], UserMessage)), 0
        )
    return tuple(messages[:cut]), tuple(messages[cut:])


def summary_request_text(to_summarize: Sequence[AgentMessage], instructions: str | None) -> str:
    """The user message asking a model to summarize a transcript."""
    lines = [f"{message.role}: {message_text(message)}" for message in to_summarize]
    ask = (
        "Summarize the conversation below so that it can replace it: keep decisions, facts, open "
        "questions, names and numbers; drop pleasantries."
    )
    if instructions:
        ask += f"\nAdditional instructions: {instructions}"
    return ask + "\n\n<conversation>\n" + "\n".join(lines) + "\n</conversation>"
