"""Files people sent, as the agent gets them: the user message's content parts, and refusals.

A channel took each file in before the message entered the inbox (`InboundSink.take_files`):
its content is a blob of the session. When a worker places the message in its lane, the user
message is built from those blobs (`user_content`): the text first (which names every file),
then one part per file read — an image as an `ImagePart`, a text-like file as its text, a PDF
as the text of its first pages (pypdf) — each bounded by `FileLimits`, with a note where cut
(D223, D224). From then on the lane's entry holds the content: the blob only had to outlive
the inbox item. A file refused on the way in is named with the reason, and its thread is told
once, when the message is accepted (`enqueue_file_notice`), like a cut text (D169).
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Mapping, Sequence

from adapters import Attachment, FileLimits, Inbound, file_kind, image_format, image_refusal
from config import Settings
from gateway.broker.contract import Blobs, Broker
from gateway.broker.limits import BlobLimits
from gateway.cuts import enqueue_arrival_notice
from gateway.file_text import PdfNotRead, cut, read_pdf
from gateway.logs import event
from harness_core.messages import ImagePart, TextPart, UserContent

__all__ = [
    "attachment_line",
    "blob_limits",
    "enqueue_file_notice",
    "file_limits",
    "file_notice_text",
    "read_slow",
    "slow_files",
    "user_content",
]

log = logging.getLogger("gateway.files")


_MB = 1_000_000


def file_limits(settings: Settings) -> FileLimits:
    """What one message may bring in, from the settings."""
    return FileLimits(
        max_file_bytes=int(settings.file_max_mb * _MB),
        max_files=settings.files_per_message,
        max_message_bytes=int(settings.files_per_message_mb * _MB),
        max_text_chars=settings.file_text_chars,
        max_pdf_pages=settings.file_pdf_pages,
        max_image_bytes=int(settings.image_max_mb * _MB),
        max_image_side=settings.image_max_side,
    )


def blob_limits(settings: Settings) -> BlobLimits:
    """The broker's blob area, from the settings: a blob is at most a file's limit."""
    return BlobLimits(
        max_blob_bytes=int(settings.file_max_mb * _MB),
        max_session_bytes=int(settings.files_per_session_mb * _MB),
        retention_ms=int(settings.file_retention_days * 86_400_000),
    )


def _size(count: int) -> str:
    if count < 1000:
        return f"{count} bytes"
    return f"{count / 1_000_000:.1f} MB" if count >= 1_000_000 else f"{count / 1000:.1f} KB"


def attachment_line(attachment: Attachment) -> str:
    """The line naming a file in the agent's text: what it is, and whether it follows."""
    what = f"{attachment.name} ({attachment.media_type}, {_size(attachment.size)})"
    if attachment.refused is not None:
        return f"[attachment: {what}, not read: {attachment.refused}. The sender has been told.]"
    if attachment.blob is None:
        return f"[attachment: {what}, not read]"
    return f"[attachment: {what}, its content follows]"


def file_notice_text(refused: list[Attachment]) -> str:
    """The thread's notice: which files were not read, and why."""
    if len(refused) == 1:
        return f"I could not read the file {refused[0].name}: {refused[0].refused}."
    by_reason: dict[str, list[str]] = {}  # one reason said once: "the first 10 files" twenty times
    for attachment in refused:
        by_reason.setdefault(str(attachment.refused), []).append(attachment.name)
    return (
        "I could not read these files: "
        + "; ".join(f"{', '.join(names)}: {why}" for why, names in by_reason.items())
        + "."
    )


async def enqueue_file_notice(broker: Broker, inbound: Inbound, session: str, item_id: str) -> None:
    """Tell `inbound`'s thread which of its files were refused (once per inbox item)."""
    refused = [a for a in inbound.attachments if a.refused is not None]
    if not refused:
        return
    await enqueue_arrival_notice(
        broker, inbound, session, f"files:{item_id}", file_notice_text(refused)
    )


async def _part(attachment: Attachment, data: bytes, limits: FileLimits) -> UserContent:
    kind = file_kind(attachment.name, attachment.media_type)
    header = f"[file: {attachment.name}]"
    if kind == "image":
        # checked on the way in; again here for a blob held before that check existed
        why = image_refusal(data, limits)
        media_type = image_format(data)
        if why is not None or media_type is None:
            return TextPart(text=f"{header}\n[this image was not read: {why}]")
        return ImagePart(media_type=media_type, data=base64.b64encode(data).decode("ascii"))
    if kind == "pdf":
        try:  # in a process of its own: a PDF built to be slow holds no slot for long (D351)
            text = await read_pdf(data, limits.max_pdf_pages, limits.max_text_chars)
        except PdfNotRead as exc:  # broken, encrypted, or past the read's limits: named
            log.info(event("pdf not read", error=str(exc)))
            return TextPart(text=f"{header}\n[this PDF could not be read ({exc})]")
        return TextPart(text=f"{header}\n{text}")
    if _binary(data):  # named text, but no text: garbage would cost tokens and say nothing
        return TextPart(text=f"{header}\n[this file was not read: it is not text]")
    text = data.decode("utf-8-sig", errors="replace")
    return TextPart(text=f"{header}\n{cut(text, limits.max_text_chars, 'characters')}")


def _binary(data: bytes) -> bool:
    """Whether `data` is no text: a NUL byte, or mostly bytes that are not UTF-8, in its start."""
    head = data[:8192]
    if b"\x00" in head:
        return True
    decoded = head.decode("utf-8", errors="replace")
    return decoded.count("\ufffd") > max(8, len(decoded) // 10)


async def user_content(
    text: str,
    inbound: Inbound,
    blobs: Blobs,
    session: str,
    limits: FileLimits,
    *,
    read: Mapping[str, UserContent] | None = None,
) -> str | tuple[UserContent, ...]:
    """The user message for `inbound`: `text` alone, or with a part per file taken in.

    A file whose blob is gone (a message pending past the blob area's retention) is named so.
    `read`: the parts `read_slow` gave, by blob (those files are not read again).
    """
    held = [a for a in inbound.attachments if a.blob is not None]
    if not held:
        return text
    parts: list[UserContent] = [TextPart(text=text)]
    for attachment in held:
        assert attachment.blob is not None
        part = (read or {}).get(attachment.blob)
        if part is None:
            data = await blobs.get(session, attachment.blob)
            if data is None:
                parts.append(TextPart(text=f"[file: {attachment.name}: no longer held, not read]"))
                continue
            part = await _part(attachment, data, limits)
        if isinstance(part, ImagePart):
            parts.append(TextPart(text=f"[file: {attachment.name}]"))
        parts.append(part)
    return tuple(parts)


def slow_files(inbound: Inbound) -> tuple[Attachment, ...]:
    """The files of `inbound` whose reading takes a process each (its PDFs held as blobs)."""
    return tuple(
        a
        for a in inbound.attachments
        if a.blob is not None and file_kind(a.name, a.media_type) == "pdf"
    )


async def read_slow(
    slow: Sequence[Attachment],
    blobs: Blobs,
    session: str,
    limits: FileLimits,
    slots: asyncio.Semaphore,
) -> dict[str, UserContent]:
    """The parts of the `slow_files` of a message, by blob: read apart from the session's loop.

    A message's PDFs took up to 20 s each, one after another, while the worker's loop for the
    whole session waited: one post of ten slow PDFs held every other thread of its space for
    two minutes (an outside probe). A worker reads them in the background instead, `slots` at
    a time across its sessions; only its own thread's later messages wait for it (in order).
    A blob gone meanwhile is left out (`user_content` names it).
    """
    parts: dict[str, UserContent] = {}
    for attachment in slow:
        assert attachment.blob is not None
        data = await blobs.get(session, attachment.blob)
        if data is None:
            continue
        async with slots:
            parts[attachment.blob] = await _part(attachment, data, limits)
    return parts
