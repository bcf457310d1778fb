"""An MCP tool result as the harness's `ToolOutput`: text, images and resources, bounded.

Text blocks are kept as text; ``structuredContent`` becomes JSON text when the result has no
text (a server that sends both puts the same data in its text, as the specification asks);
images of a type the models read become image parts, told as what their bytes are, once the
bytes show an image a model takes (`adapters.image_refusal`, D287: one a provider refuses
would fail every later request of the thread); embedded resources show their text (a
binary one, its URI, type and size), resource links their name, URI and description; audio
is named, not sent. ``isError`` gives an error result the model reads. All text together is
cut at ``max_output_chars`` with a note saying how much was cut, and images at `MAX_IMAGES`
and `MAX_IMAGE_CHARS`. A result that is not a well-formed `CallToolResult` is an error
result: nothing here raises.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any

from mcp_types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

from adapters import FileLimits, image_format, image_refusal
from harness_core.messages import ImagePart, TextPart, UserContent
from harness_core.tools import ToolOutput

__all__ = ["IMAGE_TYPES", "MAX_IMAGES", "MAX_IMAGE_CHARS", "malformed", "redacted", "to_output"]

IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""The image types every supported model provider reads; others are named, not sent."""
MAX_IMAGES = 4
MAX_IMAGE_CHARS = 4_000_000
"""Base64 characters of all images of one result together (about 3 MB of images)."""
_IMAGE_LIMITS = FileLimits()
"""What one image may be (the defaults: what every supported provider takes)."""


def malformed(server: str, tool: str, reason: str) -> ToolOutput:
    """The error result of a call whose answer could not be read."""
    return ToolOutput.text(
        f"MCP server {server!r} returned a malformed result for {tool!r} ({reason}); "
        "the call may have had its effect",
        is_error=True,
    )


def to_output(result: object, *, server: str, tool: str, max_chars: int) -> ToolOutput:
    """`result` (what the SDK returned for a call) as the harness's output, bounded."""
    if not isinstance(result, CallToolResult):
        return malformed(server, tool, f"a {type(result).__name__}, not a tool result")
    content: object = result.content  # typed, but a result may be built unvalidated
    if not isinstance(content, list):
        return malformed(server, tool, "its content is not a list")
    try:
        return _output(result, max_chars)
    except Exception as exc:  # a model_construct()ed or otherwise odd result: never raise
        return malformed(server, tool, f"{type(exc).__name__}")


def redacted(output: ToolOutput, redact: Callable[[str], str]) -> ToolOutput:
    """`output` with its text through `redact` (D349).

    A server that echoes a configured secret (its own ``env`` value, a token) never gets it
    stored, shown to the model or sent.
    """
    content = tuple(
        TextPart(text=redact(part.text)) if isinstance(part, TextPart) else part
        for part in output.content
    )
    return output.model_copy(update={"content": content})


def _output(result: CallToolResult, max_chars: int) -> ToolOutput:
    pieces: list[str | ImagePart] = []
    for block in result.content:
        pieces.append(_piece(block))
    if (
        not any(isinstance(piece, str) for piece in pieces)
        and result.structured_content is not None
    ):
        pieces.append(_json(result.structured_content))
    if not pieces:
        pieces.append(
            "the tool reported an error (no details)"
            if result.is_error
            else "(the tool returned no content)"
        )
    content = _bounded(pieces, max_chars)
    return ToolOutput(content=tuple(content), is_error=bool(result.is_error))


def _piece(block: Any) -> str | ImagePart:
    if isinstance(block, TextContent):
        return block.text
    if isinstance(block, ImageContent):
        if block.mime_type in IMAGE_TYPES:
            return _image(block.mime_type, block.data, "image")
        return f"[image of type {block.mime_type}, {_size(block.data)}: not shown]"
    if isinstance(block, AudioContent):
        return f"[audio of type {block.mime_type}, {_size(block.data)}: not shown]"
    if isinstance(block, ResourceLink):
        about = f" ({block.mime_type})" if block.mime_type else ""
        said = f": {block.description}" if block.description else ""
        return f"[resource link {block.name} <{block.uri}>{about}{said}]"
    if isinstance(block, EmbeddedResource):
        resource = block.resource
        about = f" ({resource.mime_type})" if resource.mime_type else ""
        if isinstance(resource, TextResourceContents):
            return f"[resource <{resource.uri}>{about}]\n{resource.text}"
        if isinstance(resource, BlobResourceContents):
            if resource.mime_type in IMAGE_TYPES:
                return _image(resource.mime_type, resource.blob, f"resource <{resource.uri}>")
            return f"[resource <{resource.uri}>{about}, {_size(resource.blob)}: binary, not shown]"
    return f"[content of type {getattr(block, 'type', type(block).__name__)!s}: not shown]"


def _image(mime_type: str, data: str, what: str) -> str | ImagePart:
    """An image part told as what its bytes are; a note instead where a model would refuse it."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return f"[{what} of type {mime_type}: not valid base64, not shown]"
    why = image_refusal(raw, _IMAGE_LIMITS)
    media_type = image_format(raw)
    if why is not None or media_type is None:
        return f"[{what} of type {mime_type}, {_size(data)}: not shown ({why})]"
    return ImagePart(media_type=media_type, data=data)


def _bounded(pieces: list[str | ImagePart], max_chars: int) -> list[UserContent]:
    """Images within their own bounds (the rest named), then text within `max_chars`, in order."""
    image_chars = 0
    images = 0
    shown: list[str | ImagePart] = []
    for piece in pieces:
        if isinstance(piece, ImagePart):
            images += 1
            image_chars += len(piece.data)
            if images > MAX_IMAGES or image_chars > MAX_IMAGE_CHARS:
                piece = f"[image of type {piece.media_type}, {_size(piece.data)}: over the limit]"
        shown.append(piece)
    total = sum(len(piece) for piece in shown if isinstance(piece, str))
    left = max_chars
    kept: list[UserContent] = []
    for piece in shown:
        if isinstance(piece, ImagePart):
            kept.append(piece)
        elif text := piece[:left]:
            left -= len(text)
            kept.append(TextPart(text=text))
    if total > max_chars:
        kept.append(
            TextPart(
                text=f"[output cut: {total - max_chars:,} of {total:,} characters not shown "
                f"(the limit is {max_chars:,})]"
            )
        )
    return kept


def _size(data: str) -> str:
    approx = len(data) * 3 // 4  # base64
    return f"{approx:,} bytes" if approx < 10_000 else f"{approx / 1_000_000:.1f} MB"


def _json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):
        return str(value)
