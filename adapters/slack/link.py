"""What the Slack channel's parts share: the client, the clock, the bot's identity, the sink.

Also the background follow-ups they start, and Slack's timestamps as numbers.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Mapping
from typing import Any
from urllib.parse import urlsplit

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from adapters.channel import InboundSink, Unavailable
from adapters.failures import connection_failure
from harness_core import Clock

METADATA_TYPE = "gateway_delivery"
"""The Slack message metadata event type of everything the bot delivers."""
SCAN_PAGES = 10
"""The most pages of 200 messages a read of a thread or a channel turns."""
REFUSED_TOKEN = frozenset(
    {"invalid_auth", "not_authed", "account_inactive", "token_revoked", "not_allowed_token_type"}
)
"""Slack's errors for a token it refuses: an operator's to put right, never a retry's."""
_PING = re.compile(r"<!(?!date\^)([^<>|\n]*)(?:\|[^<>\n]*)?>", re.IGNORECASE)
"""Every special mention but a date: ``<!here>``, ``<!Channel>``, ``<!group>``, ``<!here >``,
``<!subteam^S1|@team>`` (Slack reads more spellings than its documentation lists)."""


class SlackLink:
    """The client and state the channel, its history reader, approvals and deliveries share."""

    def __init__(
        self, *, client: AsyncWebClient, clock: Clock, api_url: str, call_timeout_s: int
    ) -> None:
        self.client = client
        self.clock = clock
        self.api_url = api_url
        self.call_timeout_s = call_timeout_s
        self.bot_user_id: str | None = None
        """The bot's user id (auth.test at start, or bolt's own when that failed)."""
        self.bot_id: str | None = None
        self.team_id: str | None = None
        """The workspace's id (auth.test): whom a stream in a channel is for (with the user)."""
        self.enterprise_id: str | None = None
        """The Enterprise Grid org's id (auth.test), when the bot's install is org-wide."""
        self.enterprise_install = False
        """Whether the bot is installed across an org (its events come from many workspaces)."""
        self.sink: InboundSink | None = None
        """Set between `start` and `close` (deliveries keep their marks while draining)."""
        self.receiving = False
        """Between `start` and `stop`: events and clicks are handed to the sink."""
        self.tasks: set[asyncio.Task[Any]] = set()
        """Best-effort follow-ups (reactions, private notes, backfills) still running."""

    def sent_here(self, body: Mapping[str, Any]) -> bool:
        """Whether an event was sent for this bot's install, not another workspace's.

        An app installed in several workspaces gets every one's events at the same URL, with
        the same signature: one workspace's ``app_uninstalled`` cut the bot off in all. The
        envelope's ``authorizations`` name the installs that see the event (a Slack Connect
        channel's messages are seen by both sides' installs); without them, its ``team_id`` (or,
        for an org-wide install, ``enterprise_id``) names where it happened. Taken while the
        install is not known yet (auth.test has not answered).
        """
        if self.team_id is None and self.enterprise_id is None:
            return True
        seen = body.get("authorizations")
        if isinstance(seen, list) and seen:
            return any(isinstance(a, dict) and self._is_us(a) for a in seen)
        if self.enterprise_install:
            return body.get("enterprise_id") == self.enterprise_id
        return body.get("team_id") in (None, self.team_id)

    def _is_us(self, authorization: Mapping[str, Any]) -> bool:
        if self.enterprise_install:
            return bool(authorization.get("is_enterprise_install")) and (
                authorization.get("enterprise_id") == self.enterprise_id
            )
        return self.team_id is not None and authorization.get("team_id") == self.team_id

    def spawn(self, work: Awaitable[Any]) -> asyncio.Task[Any]:
        """Run `work` in the background (the channel's close waits for it, briefly)."""
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def sink_or_fail(self) -> InboundSink:
        """The sink to hand events and clicks to; Unavailable unless the channel receives.

        After `stop` nothing is taken: the request is answered with an error, so Slack sends
        it again (to this process once it is back, or to another one).
        """
        if self.sink is None or not self.receiving:
            raise Unavailable("the Slack channel is not receiving")
        return self.sink

    def unreachable(self, error: BaseException, method: str) -> str:
        """Why the Web API could not be reached, in words naming its host and port."""
        url = urlsplit(self.api_url)
        try:
            port = url.port or (80 if url.scheme == "http" else 443)
        except ValueError:  # not a port: the host's words still help
            port = 0
        return connection_failure(
            error,
            protocol="Slack API",
            host=url.hostname or self.api_url,
            port=port,
            timeout_s=self.call_timeout_s,
            phase=method,
        )

    def api_said(self, error: SlackApiError) -> str:
        """What the Web API answered instead of ``ok``, in words (a URL that is not Slack's)."""
        said = error.response.get("error") if isinstance(error.response.data, dict) else None
        status = error.response.status_code
        if said:
            return f"Slack answered {said} (HTTP {status})"
        return (
            f"{self.api_url} did not answer as the Slack Web API does (HTTP {status}, "
            "not Slack's JSON): check the API URL"
        )


def retry_after_s(exc: SlackApiError) -> float | None:
    """The seconds Slack's 429 asks to wait; None when it is no 429.

    As Slack wrote them (``inf`` and ``-5`` too: each caller bounds them); 1 when it names none
    or no number.
    """
    response = exc.response
    if getattr(response, "status_code", 200) != 429:
        return None
    headers = getattr(response, "headers", None) or {}
    said = headers.get("Retry-After") or headers.get("retry-after")
    try:
        return float(said) if said is not None else 1.0
    except ValueError:
        return 1.0


def defused(text: str) -> str:
    """`text` without pings of a room or a user group (a model must not page people)."""
    return _PING.sub(lambda found: "@" + _ping_name(found.group(1)), text)


def _ping_name(name: str) -> str:
    """``here``, ``S1`` of ``subteam^S1``: what a defused special mention reads as."""
    name = name.strip()
    return name[len("subteam^") :] if name.lower().startswith("subteam^") else name


def ts_seconds(ts: str) -> float:
    """A Slack ``ts`` as seconds since the epoch (0 for anything that is not one)."""
    try:
        return float(ts) if re.fullmatch(r"\d{1,12}\.\d{1,9}", ts) else 0.0
    except ValueError:
        return 0.0


def ts_key(ts: str) -> tuple[int, int]:
    """A Slack ts (``1700000000.000100``) as a sortable pair; anything else sorts first."""
    seconds, _, fraction = ts.partition(".")
    try:
        return int(seconds), int(fraction.ljust(6, "0")[:6] or "0")
    except ValueError:
        return (-1, 0)
