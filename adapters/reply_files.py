"""The files a reply sends, as a channel reads them for one delivery (D228).

A reply's files are blobs of its session (`Outbound.files`); a channel reads each one through
the sink just before it sends them, every attempt. A file no longer held (past the blob area's
retention) can never be sent: the delivery fails permanently, saying so, rather than posting a
reply that silently lacks what its text promises.
"""

from __future__ import annotations

from dataclasses import dataclass

from adapters.channel import Attachment, DeliveryError, InboundSink, Outbound, Unavailable

__all__ = ["ReplyFile", "read_reply_files"]


@dataclass(frozen=True, slots=True)
class ReplyFile:
    """One file of a reply, with its content."""

    attachment: Attachment
    content: bytes


async def read_reply_files(sink: InboundSink | None, outbound: Outbound) -> tuple[ReplyFile, ...]:
    """The content of `outbound`'s files (none: an empty tuple, the sink untouched).

    Raises:
        DeliveryError: the channel is not started or the blob area is unavailable (a retry
            may succeed), or a file is no longer held (permanent).
    """
    if not outbound.files:
        return ()
    if sink is None:
        raise DeliveryError("the channel is not started; its reply's files cannot be read")
    thread = outbound.thread
    read: list[ReplyFile] = []
    for attachment in outbound.files:
        if attachment.blob is None:
            continue
        try:
            content = await sink.read_file(thread.channel, thread.space, attachment.blob)
        except Unavailable as exc:
            raise DeliveryError(f"a file of the reply cannot be read now ({exc})") from None
        if content is None:
            raise DeliveryError(
                f"the file {attachment.name} is no longer held (past its retention)",
                permanent=True,
            )
        read.append(ReplyFile(attachment, content))
    return tuple(read)
