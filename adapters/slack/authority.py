"""Slack events that take the bot's authority away (or give it back) as `AuthorityChange`s.

Lost in one channel (`space` the channel id): the bot left or was removed from it
(``member_left_channel`` naming the bot's user, ``channel_left``, ``group_left``), it was
archived (``channel_archive``, ``group_archive``) or deleted (``channel_deleted``,
``group_deleted``). Lost everywhere (`space` None): the app was uninstalled
(``app_uninstalled``) or the bot's token revoked (``tokens_revoked`` listing the bot; one that
lists only users' tokens changes nothing: the gateway posts with the bot's). Back in one channel:
the bot joined it again (``member_joined_channel`` naming the bot) or it was unarchived; each
lifts only a revocation of the matching kind, never an operator's (D267). Another member
leaving or joining changes nothing. Payload shapes: Slack's Events API reference.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from adapters.channel import AuthorityChange
from adapters.slack.events import CHANNEL

__all__ = ["AUTHORITY_EVENTS", "authority_change"]

_LEFT: Final = ("member_left_channel", "channel_left", "group_left")
_ARCHIVED: Final = ("channel_archive", "group_archive")
_DELETED: Final = ("channel_deleted", "group_deleted")
_EVERYWHERE: Final = ("app_uninstalled", "tokens_revoked")
_BACK: Final = ("member_joined_channel", "channel_unarchive", "group_unarchive")
AUTHORITY_EVENTS: Final = _LEFT + _ARCHIVED + _DELETED + _EVERYWHERE + _BACK
"""The event types this module reads (each is subscribed in the app manifests)."""


def authority_change(
    event: Mapping[str, Any], *, bot_user_id: str | None, now_ms: int
) -> AuthorityChange | None:
    """The change an event means for the bot, or None (it concerns someone else, or is bad)."""
    kind = event.get("type")
    channel = event.get("channel")
    if kind in _EVERYWHERE:
        return _everywhere(kind, event, bot_user_id, now_ms)
    if not isinstance(channel, str) or not channel or kind not in AUTHORITY_EVENTS:
        return None
    user = event.get("user")
    if kind in ("member_left_channel", "member_joined_channel") and (
        bot_user_id is None or user != bot_user_id
    ):
        return None  # another member (or an unknown bot identity: never guess)
    by = _who(event.get("actor_id") or event.get("inviter") or user, bot_user_id)
    if kind in _BACK:
        joined = kind == "member_joined_channel"
        return AuthorityChange(
            channel=CHANNEL,
            space=channel,
            revoked=False,
            cause=str(kind),
            why="the bot was added to the channel again"
            if joined
            else "the channel was unarchived",
            by=by,
            lifts=_LEFT if joined else _ARCHIVED,
            at_ms=now_ms,
        )
    why = (
        "the bot was removed from the channel"
        if kind in _LEFT
        else "the channel was archived"
        if kind in _ARCHIVED
        else "the channel was deleted"
    )
    return AuthorityChange(
        channel=CHANNEL, space=channel, cause=str(kind), why=why, by=by, at_ms=now_ms
    )


def _everywhere(
    kind: str, event: Mapping[str, Any], bot_user_id: str | None, now_ms: int
) -> AuthorityChange | None:
    if kind == "app_uninstalled":
        why = "the Slack app was uninstalled from the workspace"
    else:
        tokens = event.get("tokens")
        bots = tokens.get("bot") if isinstance(tokens, Mapping) else None
        if not isinstance(bots, list) or not bots:
            return None  # users' tokens only: the bot posts with its own
        if bot_user_id is not None and bot_user_id not in bots:
            return None  # another bot's (an app installed twice)
        why = "the bot's Slack token was revoked"
    return AuthorityChange(channel=CHANNEL, space=None, cause=kind, why=why, at_ms=now_ms)


def _who(user: Any, bot_user_id: str | None) -> str | None:
    """Who did it, as Slack names them (not the bot itself: it left because it was removed)."""
    if isinstance(user, str) and user and user != bot_user_id:
        return user[:200]
    return None
