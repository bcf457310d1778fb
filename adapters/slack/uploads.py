"""A reply's files into its Slack thread with files upload v2, each found again after a crash.

Per file: ``files.getUploadURLExternal`` names the file id before anything is visible; the id is
recorded in a durable mark of the delivery (`upload_mark`, through the sink) *before* the
bytes are completed into the thread with ``files.completeUploadExternal``; reconcile reads the
mark and looks in the thread for a message sharing that id. An upload whose id was recorded
but is not in the thread never completed: it is uploaded again under a new id (Slack drops an
upload nobody completes). The reply's text messages carry the delivery id in their metadata as
before; the files follow them, so a thread never shows files without their answer (D230).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

import aiohttp
from slack_sdk.errors import SlackApiError

from adapters.channel import DeliveryError, InboundSink, Unavailable
from adapters.reply_files import ReplyFile
from adapters.slack.link import SlackLink

__all__ = ["SlackUploads", "upload_mark"]

log = logging.getLogger("adapters.slack")

_MARK_TRIES = 5


def upload_mark(delivery_id: str) -> str:
    """The sink mark holding a delivery's uploaded file ids (``{"<index>": "<file id>"}``)."""
    return f"slack:uploads:{delivery_id}"


class SlackUploads:
    """Uploads a reply's files into its thread, recording each file id first."""

    def __init__(self, link: SlackLink) -> None:
        self.link = link

    async def recorded(self, delivery_id: str) -> dict[int, str]:
        """The file ids recorded for a delivery, by the file's place in the reply.

        Raises:
            Unavailable: the mark cannot be read now.
        """
        sink = self._sink()
        return _ids(await sink.get_mark(upload_mark(delivery_id)))

    async def upload(
        self,
        channel: str,
        thread_ts: str | None,
        delivery_id: str,
        index: int,
        file: ReplyFile,
    ) -> str:
        """Upload `file` into the thread as the reply's file number `index`; its file id.

        Raises:
            DeliveryError: with ``unknown_outcome`` (callers post files after the text, so a
                failure here always leaves something to reconcile).
        """
        name = file.attachment.name
        try:
            answer = await self.link.client.files_getUploadURLExternal(
                filename=name, length=len(file.content)
            )
            file_id = str(answer["file_id"])
            await self._put(str(answer["upload_url"]), file.content)
            await self._record(delivery_id, index, file_id)
            await self.link.client.files_completeUploadExternal(
                files=[{"id": file_id, "title": name}], channel_id=channel, thread_ts=thread_ts
            )
        except SlackApiError as exc:
            reason = self.link.api_said(exc)
            raise DeliveryError(f"Slack file upload: {reason}", unknown_outcome=True) from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            reason = self.link.unreachable(exc, "files upload")
            raise DeliveryError(reason, unknown_outcome=True) from None
        except Unavailable as exc:
            raise DeliveryError(f"cannot record the upload ({exc})", unknown_outcome=True) from None
        log.info("slack file uploaded", extra={"delivery_id": delivery_id, "file": index})
        return file_id

    async def _put(self, url: str, content: bytes) -> None:
        """POST the bytes to Slack's upload URL (signed by Slack: no token goes with them)."""
        timeout = aiohttp.ClientTimeout(total=self.link.call_timeout_s)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(url, data=content) as response,
        ):
            if response.status != 200:
                raise aiohttp.ClientResponseError(
                    response.request_info, (), status=response.status, message="upload refused"
                )

    async def _record(self, delivery_id: str, index: int, file_id: str) -> None:
        sink = self._sink()
        name = upload_mark(delivery_id)
        for _ in range(_MARK_TRIES):
            raw = await sink.get_mark(name)
            ids = _ids(raw)
            ids[index] = file_id
            value = json.dumps({str(k): v for k, v in sorted(ids.items())})
            if await sink.put_mark(name, value, expect=raw):
                return
        raise Unavailable("the upload mark kept changing")

    def _sink(self) -> InboundSink:
        if self.link.sink is None:
            raise Unavailable("the Slack channel is not started")
        return self.link.sink


def _ids(raw: str | None) -> dict[int, str]:
    if not raw:
        return {}
    try:
        found = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(found, Mapping):
        return {}
    return {
        int(k): str(v)
        for k, v in found.items()
        if str(k).isascii() and str(k).isdigit() and isinstance(v, str)
    }
