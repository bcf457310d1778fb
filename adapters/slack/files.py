"""Slack file shares taken in: each file's ``url_private``, fetched with the bot token, once.

The bot token goes only to Slack's file host (``file_host``, by default
``https://files.slack.com``): a URL on any other origin is refused without a request, and a
redirect is never followed (it could lead the token elsewhere). A file Slack does not hand over
(deleted, hidden by the workspace's plan, an app without ``files:read``) is refused with the
reason; a server error or a timeout may pass, so the event is not acknowledged and Slack
retries it, and what was held meanwhile is not fetched again (D226). On Slack's last try
(``X-Slack-Retry-Num: 3``) such a file is refused with its reason instead: the message is
taken without it and the thread told, where refusing the event again would lose the message,
its text included (D395).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx

from adapters.channel import Attachment, FileRefused, IncomingFile

__all__ = ["SlackFiles"]

_GONE = frozenset({401, 403, 404, 410})


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}"


class SlackFiles:
    """Fetches the files of message events for `InboundSink.take_files`."""

    def __init__(self, bot_token: str, *, file_host: str, timeout_s: float) -> None:
        self._token = bot_token
        self._origin = _origin(file_host)
        self._timeout_s = timeout_s
        self.fetched = 0
        """Files fetched (for tests and logs)."""

    def incoming(
        self, event: Mapping[str, Any], attachments: Sequence[Attachment], *, last_try: bool = False
    ) -> list[IncomingFile]:
        """The event's files as `IncomingFile`s, by the attachments `classify` listed.

        `last_try`: Slack will not send the event again, so a fetch that might pass later is
        refused now (`FileRefused`) rather than failed.
        """
        files = event.get("files")
        by_id = {
            str(item.get("id")): item
            for item in (files if isinstance(files, list) else [])
            if isinstance(item, Mapping) and item.get("id")
        }
        found = []
        for number, attachment in enumerate(attachments):
            item = by_id.get(attachment.ref or "", {})
            url = item.get("url_private")
            key = attachment.ref or f"{event.get('channel')}:{event.get('ts')}:{number}"
            found.append(IncomingFile(attachment, key, self._fetcher(url, last_try)))
        return found

    def _fetcher(self, url: Any, last_try: bool) -> Any:
        async def fetch(limit: int) -> bytes:
            if not isinstance(url, str) or not url:
                raise FileRefused("Slack did not share its content with the app")
            try:
                return await self._fetch(url, limit)
            except (httpx.HTTPStatusError, httpx.TransportError) as exc:
                if not last_try:
                    raise  # may pass: the event is not acknowledged, and Slack tries again
                raise FileRefused(
                    f"Slack's file host failed on Slack's last try ({_failure(exc)}); "
                    "share it again"
                ) from None

        return fetch

    async def _fetch(self, url: str, limit: int) -> bytes:
        if _origin(url) != self._origin:
            raise FileRefused("it is not on Slack's file host")
        headers = {"Authorization": f"Bearer {self._token}"}
        async with (
            httpx.AsyncClient(timeout=self._timeout_s, follow_redirects=False) as client,
            client.stream("GET", url, headers=headers) as response,
        ):
            if response.status_code in _GONE or response.is_redirect:
                raise FileRefused(f"Slack did not hand it over (HTTP {response.status_code})")
            response.raise_for_status()  # 429, 5xx: may pass; the event is retried
            self.fetched += 1
            data = bytearray()
            async for chunk in response.aiter_bytes():
                data += chunk
                if len(data) > limit:
                    break  # over the limit: refused by its size, the rest never read
            return bytes(data)


def _failure(exc: httpx.HTTPStatusError | httpx.TransportError) -> str:
    """What went wrong with a fetch, in a few words (no URL: it carries the file's path)."""
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    return "no answer in time" if isinstance(exc, httpx.TimeoutException) else "no connection"
