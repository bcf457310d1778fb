"""What files people send the agent reads, and how much of them (shared by channels and gateway).

A file is read by its kind (`file_kind`): an image (png, jpeg, gif, webp) goes to the model as
an image, once its bytes show it is one a model takes (`image_refusal`: one a provider refuses
would fail every later request of its thread, D287); a text-like file (``text/*``, JSON, CSV,
logs, code) as text; a PDF as its extracted text; anything else is named to the agent but not
read, and never stored (D223). `FileLimits` bounds what one file and one message may bring in.
"""

from __future__ import annotations

import io
import posixpath
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal

import imagesize  # type: ignore[import-untyped]  # no stubs; get() -> (width, height)
from pydantic import Field

from adapters.channel import Attachment, FileRefused, IncomingFile, Unavailable
from harness_core.frozen import Frozen

__all__ = ["FileKind", "FileLimits", "file_kind", "image_format", "image_refusal", "take_in"]

FileKind = Literal["image", "text", "pdf"]

IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
_IMAGE_EXTENSIONS = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
}
_TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/xml",
        "application/x-yaml",
        "application/yaml",
        "application/toml",
        "application/javascript",
        "application/x-sh",
        "application/sql",
        "application/x-ndjson",
    }
)
_TEXT_EXTENSIONS = frozenset(
    (
        ".txt",
        ".md",
        ".markdown",
        ".rst",
        ".csv",
        ".tsv",
        ".json",
        ".jsonl",
        ".ndjson",
        ".log",
        ".xml",
        ".yaml",
        ".yml",
        ".toml",
        ".ini",
        ".cfg",
        ".conf",
        ".env",
        ".py",
        ".pyi",
        ".js",
        ".mjs",
        ".ts",
        ".tsx",
        ".jsx",
        ".java",
        ".kt",
        ".go",
        ".rs",
        ".c",
        ".h",
        ".cc",
        ".cpp",
        ".hpp",
        ".cs",
        ".rb",
        ".php",
        ".swift",
        ".scala",
        ".sh",
        ".bash",
        ".zsh",
        ".ps1",
        ".sql",
        ".html",
        ".htm",
        ".css",
        ".scss",
        ".vue",
        ".svelte",
        ".lua",
        ".pl",
        ".r",
        ".m",
        ".tf",
        ".proto",
        ".graphql",
        ".diff",
        ".patch",
        ".dockerfile",
        ".gradle",
        ".properties",
    )
)


def _extension(name: str) -> str:
    return posixpath.splitext(name.lower())[1]


def file_kind(name: str, media_type: str) -> FileKind | None:
    """How the agent reads a file named `name` of `media_type` (None: it does not)."""
    kind = media_type.lower().split(";", 1)[0].strip()
    extension = _extension(name)
    if kind in IMAGE_TYPES or (
        kind in ("", "application/octet-stream") and extension in _IMAGE_EXTENSIONS
    ):
        return "image"
    if kind == "application/pdf" or extension == ".pdf":
        return "pdf"
    if kind.startswith("text/") or kind in _TEXT_TYPES or kind.endswith(("+json", "+xml")):
        return "text"
    if extension in _TEXT_EXTENSIONS or posixpath.basename(name.lower()) in (
        "dockerfile",
        "makefile",
    ):
        return "text"
    return None


def image_format(data: bytes) -> str | None:
    """The media type `data` is by its first bytes: PNG, JPEG, GIF or WebP (None: none of them).

    What a model is told is what the bytes are, not what their sender declared: a provider
    refuses an image whose declared type does not match it.
    """
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def image_refusal(data: bytes, limits: FileLimits) -> str | None:
    """Why a model would refuse `data` as an image, in one short sentence (None: it takes it).

    An image the provider refuses fails the request, and every later request of its thread
    carries it again (D287), so it is refused on the way in: not one of the four formats, over
    `max_image_bytes`, of a size its header does not give (a damaged file), or wider or taller
    than `max_image_side` pixels.
    """
    if image_format(data) is None:
        return "it is not a PNG, JPEG, GIF or WebP image"
    if len(data) > limits.max_image_bytes:
        size, limit = _over(len(data), limits.max_image_bytes)
        return f"it is {size}, over the {limit} a model takes for an image"
    try:
        width, height = imagesize.get(io.BytesIO(data))
    except Exception:  # a header cut short or garbled: the library's errors are not typed
        width = height = -1
    if width <= 0 or height <= 0:
        return "its size in pixels cannot be read (a damaged image)"
    if max(width, height) > limits.max_image_side:
        return (
            f"it is {width}x{height} pixels, over the {limits.max_image_side} "
            "a model takes on a side"
        )
    return None


class FileLimits(Frozen):
    """What one message may bring in (the gateway's settings set them; D225)."""

    max_file_bytes: int = Field(default=10_000_000, gt=0)
    """The largest file taken in."""
    max_files: int = Field(default=10, ge=0)
    """Files read per message (the rest are named, not read)."""
    max_message_bytes: int = Field(default=25_000_000, gt=0)
    """What a message's files may bring in together."""
    max_text_chars: int = Field(default=100_000, gt=0)
    """Characters of one text file or PDF the agent gets (the rest is cut, with a note)."""
    max_pdf_pages: int = Field(default=50, gt=0)
    """Pages of one PDF read."""
    max_image_bytes: int = Field(default=3_750_000, gt=0)
    """The largest image sent to a model (Anthropic refuses an image whose base64 is over
    5 MiB: 3.75 MB of bytes is 5,000,000 characters)."""
    max_image_side: int = Field(default=8_000, gt=0)
    """The most pixels an image may have on a side (Anthropic's limit for one image)."""


def _size(count: int, digits: int = 1) -> str:
    if count < 1000:
        return f"{count} bytes"
    if count >= 1_000_000:
        return f"{count / 1_000_000:.{digits}f} MB"
    return f"{count / 1000:.{digits}f} KB"


def _over(size: int, limit: int) -> tuple[str, str]:
    """`size` and the `limit` it is over, with the decimals it takes to tell them apart."""
    for digits in (1, 2, 3):
        shown = _size(size, digits), _size(limit, digits)
        if shown[0] != shown[1]:
            return shown
    return f"{size:,} bytes", f"{limit:,} bytes"


Find = Callable[[str], Awaitable[tuple[str, int] | None]]
"""A file's key -> its blob id and size, if a blob is held under it."""
Put = Callable[[str, bytes], Awaitable[str]]
"""Hold a file's content under its key -> the blob id (`FileRefused` if the area refuses it)."""


_ENCRYPTED = frozenset(
    {"application/pkcs7-mime", "application/x-pkcs7-mime", "application/pgp-encrypted"}
)
"""Media types of encrypted content (an S/MIME ``smime.p7m``, OpenPGP/MIME's parts)."""


def _declared_refusal(
    attachment: Attachment, limits: FileLimits, taken: int, taken_bytes: int
) -> str | None:
    """Why a file is refused from what its channel declares, before anything is fetched."""
    if file_kind(attachment.name, attachment.media_type) is None:
        if (attachment.media_type or "").lower() in _ENCRYPTED:
            return (  # an encrypted mail arrives as this one file: its sender can act on this
                "it is encrypted, and I hold no key to read it (send it again unencrypted)"
            )
        return (
            f"I do not read {attachment.media_type or 'files of this type'} files "
            "(only images, text files and PDFs)"
        )
    if taken >= limits.max_files:
        return f"I read only the first {limits.max_files} files of a message"
    return _size_refusal(attachment.size, limits, taken_bytes)


def _size_refusal(size: int, limits: FileLimits, taken_bytes: int) -> str | None:
    if size > limits.max_file_bytes:
        shown, limit = _over(size, limits.max_file_bytes)
        return f"it is {shown}, over the {limit} limit for one file"
    if taken_bytes + size > limits.max_message_bytes:
        return (
            f"a message's files may bring in {_size(limits.max_message_bytes)} together, "
            "and the files before it took that"
        )
    return None


async def take_in(
    files: Sequence[IncomingFile], limits: FileLimits, *, find: Find, put: Put
) -> tuple[Attachment, ...]:
    """The attachments of a message once its files are taken in (see `InboundSink.take_files`).

    In order: a file is refused by its kind, the message's count, its declared size and the
    message's total; else the blob held under its key is used, or it is fetched (once) and
    held. A fetch that can never succeed, a content over the limits, an image a model would
    refuse (`image_refusal`) or a full blob area refuses that file; any other failure raises
    `Unavailable` (nothing acknowledged).
    """
    taken = taken_bytes = 0
    out: list[Attachment] = []
    for incoming in files:
        attachment = incoming.attachment
        why = _declared_refusal(attachment, limits, taken, taken_bytes)
        if why is None:
            try:
                held = await _held(incoming, limits, taken_bytes, find, put)
            except FileRefused as refused:
                why = str(refused)
            except Unavailable:
                raise
            except Exception as exc:  # a fetch that may succeed later: the channel retries
                raise Unavailable(f"a file could not be taken in ({type(exc).__name__})") from exc
        if why is not None:
            out.append(attachment.model_copy(update={"refused": why, "blob": None}))
            continue
        blob, size = held
        taken += 1
        taken_bytes += size
        out.append(attachment.model_copy(update={"blob": blob, "size": size, "refused": None}))
    return tuple(out)


async def _held(
    incoming: IncomingFile, limits: FileLimits, taken_bytes: int, find: Find, put: Put
) -> tuple[str, int]:
    found = await find(incoming.key)
    if found is not None:
        return found
    data = await incoming.fetch(limits.max_file_bytes)
    why = _size_refusal(len(data), limits, taken_bytes)
    declared = incoming.attachment
    if why is None and file_kind(declared.name, declared.media_type) == "image":
        why = image_refusal(data, limits)
    if why is not None:
        raise FileRefused(why)
    return await put(incoming.key, data), len(data)
