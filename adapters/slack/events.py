"""Slack events to the channel seam: which messages the bot takes, and as which thread and text.

The rules (decision D86):

* ``app_mention``: always taken. A mention at the top of a channel starts a thread under itself.
* ``message`` in a DM (``channel_type`` ``im``): taken. A DM's top-level messages are one lane
  (``<channel>:dm``) and are answered at the top level; a thread inside a DM is its own lane.
* ``message`` in a channel thread: taken when the thread is already a lane (the bot was called
  into it) or when it mentions the bot; top-level channel chatter is not taken.
* The same message arrives as ``app_mention`` and as ``message`` (different ``event_id``): both
  map to the message identity ``<channel>:<ts>``, which the inbox deduplicates.
* Edits (``message_changed``, or an ``app_mention`` again with ``edited``) and deletions
  (``message_deleted``) are acknowledged and not taken:
  the agent answers what was asked when it was asked; a correction is a new message.
* Messages from bots (the bot itself included) and service subtypes (joins, topic changes...) are
  acknowledged and not taken.
* The text is what the person typed: Slack's escapes (``&amp;``, ``&lt;``, ``&gt;``) are read
  back. Beyond `MAX_TEXT_CHARS` it is cut and the `Inbound` says so (`Inbound.cut`: the agent
  and the thread are told, decision D169); files beyond `MAX_ATTACHMENTS` are counted, not
  listed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from adapters.channel import Attachment, Author, Inbound, ThreadRef
from adapters.text_cut import keep_within

__all__ = [
    "CHANNEL",
    "DM_THREAD",
    "MAX_ATTACHMENTS",
    "MAX_TEXT_CHARS",
    "Classified",
    "classify",
    "clean_text",
    "slack_thread",
    "split_thread",
]

CHANNEL = "slack"
DM_THREAD = "dm"
"""The thread name of a DM's top-level messages (answered at the top level, not in a thread)."""

_TAKEN_SUBTYPES = frozenset({None, "file_share", "thread_broadcast"})
MAX_TEXT_CHARS = 40_000
"""The most characters of a message's text the agent gets (the rest is cut, and said)."""
MAX_ATTACHMENTS = 20
"""The most files listed per message (further ones are counted)."""

Take = Literal["take", "if_known", "ignore"]


@dataclass(frozen=True, slots=True)
class Classified:
    """What to do with one event: take it, take it if its thread is a lane, or ignore it."""

    take: Take
    reason: str
    """Why (a short tag for logs and counters: ``mention``, ``dm``, ``edit``...)."""
    inbound: Inbound | None = None
    joined_midway: bool = False
    """A mention inside a thread that began without the bot (its history may be wanted)."""


def slack_thread(channel: str, root_ts: str | None) -> ThreadRef:
    """The thread of a Slack conversation: ``<channel>:<root ts>``, or a DM's ``<channel>:dm``."""
    return ThreadRef(channel=CHANNEL, space=channel, thread=f"{channel}:{root_ts or DM_THREAD}")


def split_thread(thread: ThreadRef) -> tuple[str, str | None]:
    """The Slack channel id and the ``thread_ts`` to reply under (None: the DM's top level).

    Raises:
        ValueError: the thread is not a Slack thread this adapter made.
    """
    channel, sep, root = thread.thread.partition(":")
    if thread.channel != CHANNEL or not sep or not channel or not root:
        raise ValueError(f"not a Slack thread: {thread.thread!r}")
    return channel, None if root == DM_THREAD else root


def clean_text(text: str, bot_user_id: str) -> str:
    """The text as the person typed it, without the bot's own mention.

    Slack escapes three characters in a message's text (``&amp;``, ``&lt;``, ``&gt;``: its
    markup uses ``<...>`` for mentions and links); they are read back after the mention is
    removed, so ``a &lt; b`` reaches the agent as ``a < b``, and the limit counts what the
    person wrote. Mentions of others and links stay in Slack's ``<...>`` form.
    """
    without = _mention_of(bot_user_id).sub("", whole(text))
    without = re.sub(r"[ \t]{2,}", " ", without).strip()
    return without.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def _mention_of(user_id: str) -> re.Pattern[str]:
    """Slack's mention of `user_id`: ``<@U123>`` or ``<@U123|name>``, the whole token."""
    return re.compile(rf"<@{re.escape(user_id)}(\|[^>]*)?>")


_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")


def whole(text: str) -> str:
    r"""`text` with each unpaired surrogate (JSON's ``"\\ud800"``) as U+FFFD.

    No store can hold one (it is no UTF-8), so a message that carried one failed at the inbox
    on every retry Slack made, and was lost.
    """
    return _LONE_SURROGATE.sub("\ufffd", text)


def classify(
    kind: Literal["app_mention", "message"],
    event: Mapping[str, Any],
    *,
    bot_user_id: str,
    bot_id: str | None,
    now_ms: int,
) -> Classified:
    """Decide about one ``app_mention`` or ``message`` event (see the module docstring)."""
    subtype = event.get("subtype")
    if subtype == "message_changed" or (kind == "app_mention" and "edited" in event):
        # an edited mention comes again as `app_mention`, with its first ts and `edited` (a
        # thread read back lists an edited message with `edited` too: that one is taken)
        return Classified("ignore", "edit")
    if subtype == "message_deleted":
        return Classified("ignore", "deletion")
    if subtype not in _TAKEN_SUBTYPES:
        return Classified("ignore", f"subtype {subtype}")
    user = event.get("user")
    if event.get("bot_id") or (bot_id and event.get("bot_id") == bot_id) or user == bot_user_id:
        return Classified("ignore", "bot")
    channel, ts = event.get("channel"), event.get("ts")
    if not _is_id(user) or not _is_id(channel) or not _is_ts(ts):
        return Classified("ignore", "malformed")
    thread_ts = event.get("thread_ts")
    if thread_ts is not None and not _is_ts(thread_ts):
        return Classified("ignore", "malformed")
    text = event.get("text")
    text = text if isinstance(text, str) else ""
    # the whole token: `<@UBOT2>`, another member whose id starts with the bot's, is not the bot
    mentioned = _mention_of(bot_user_id).search(text) is not None
    in_thread = thread_ts is not None and thread_ts != ts
    direct = event.get("channel_type") == "im"
    if direct:
        root = thread_ts if in_thread else None
        take: Take = "take"
        reason = "dm"
    elif kind == "app_mention" or mentioned:
        root = thread_ts or ts
        take, reason = "take", "mention"
    elif in_thread:
        root = thread_ts
        take, reason = "if_known", "thread"
    else:
        return Classified("ignore", "not for the bot")
    kept, cut = keep_within(clean_text(text, bot_user_id), MAX_TEXT_CHARS)
    files = event.get("files")
    attachments = _attachments(files)
    inbound = Inbound(
        thread=slack_thread(str(channel), root),
        message_id=f"{channel}:{ts}",
        author=Author(id=str(user), name=_display_name(event)),
        text=kept,
        attachments=attachments,
        received_at_ms=now_ms,
        reply_context={"ts": str(ts), "user": str(user)},
        cut=cut,
        unlisted_attachments=max(0, len(files) - MAX_ATTACHMENTS) if isinstance(files, list) else 0,
    )
    return Classified(take, reason, inbound, joined_midway=reason == "mention" and in_thread)


def _display_name(event: Mapping[str, Any]) -> str | None:
    profile = event.get("user_profile")
    if isinstance(profile, Mapping):
        for key in ("display_name", "real_name", "name"):
            value = profile.get(key)
            if isinstance(value, str) and value.strip():
                return whole(value.strip()[:200])
    return None


def _attachments(files: Any) -> tuple[Attachment, ...]:
    if not isinstance(files, list):
        return ()
    found = []
    for item in files[:MAX_ATTACHMENTS]:
        if not isinstance(item, Mapping):
            continue
        size = item.get("size")
        found.append(
            Attachment(
                name=whole(str(item.get("name") or item.get("title") or "file")[:300]),
                media_type=whole(str(item.get("mimetype") or "application/octet-stream")[:200]),
                size=size if isinstance(size, int) and size >= 0 else 0,
                ref=str(item["id"])[:100] if item.get("id") else None,
            )
        )
    return tuple(found)


def _is_id(value: Any) -> bool:
    return isinstance(value, str) and re.fullmatch(r"[A-Z0-9]{2,40}", value) is not None


def _is_ts(value: Any) -> bool:
    return isinstance(value, str) and re.fullmatch(r"\d{1,12}\.\d{1,9}", value) is not None
