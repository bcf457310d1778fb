"""The JSON the webhook channel takes and sends: request models in, the reply payload out.

In (``POST /webhook/events``, one JSON object; unknown fields are refused, so a typo is not
silently dropped):

* a message: ``{"type": "message"?, "thread", "space"?, "message_id"?, "author"?: {"id",
  "name"?}, "text", "reply_context"?: {...}}``; ``message_id`` defaults to the request's
  ``webhook-id`` (a sender's redelivery is then the same message);
* a decision: ``{"type": "decision", "thread", "space"?, "run_id", "wait_id", "session"?,
  "decisions": [{"tool_call_id", "args_digest", "approved", "reason"?, "result"?,
  "is_error"?}], "author": {"id", "name"?}, "idempotency_key"?}``; the key defaults to one
  derived from what it decides (`adapters.webhook.channel.decision_key`): the same decision sent
  twice is one. A ``result`` (with ``approved: true``) answers the call with its result: the
  sender did the action itself and the tool does not run (``is_error``: it failed).

Out (what `deliver` POSTs): ``{"kind", "delivery_id", "space", "thread", "text", "answers",
"reply_context", "approval"?, "closed"?}``; ``text`` is Markdown, ``approval`` is the request's
wait and calls (with the digests a decision must carry back), ``closed`` how a request ended.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from adapters.channel import Outbound

__all__ = [
    "ID_PATTERN",
    "MAX_REPLY_CONTEXT_BYTES",
    "AuthorIn",
    "DecisionIn",
    "DecisionItemIn",
    "MessageIn",
    "outbound_body",
]

ID_PATTERN = r"^[A-Za-z0-9._:@+=/-]{1,200}$"
"""Ids a sender chooses (threads, message ids, keys): printable ASCII without spaces."""
SPACE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@+=-]{0,63}$"
"""A space: it names a session (``webhook-<space>`` unless a route binds it)."""
THREAD_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@+=/-]{0,199}$"
MAX_REPLY_CONTEXT_BYTES = 4096


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class AuthorIn(_Strict):
    """Who wrote a message or decided, as the sender identifies them."""

    id: str = Field(min_length=1, max_length=100)
    name: str | None = Field(default=None, max_length=100)


class MessageIn(_Strict):
    """A message in a thread."""

    type: Literal["message"] = "message"
    thread: str = Field(pattern=THREAD_PATTERN)
    space: str = Field(default="default", pattern=SPACE_PATTERN)
    message_id: str | None = Field(default=None, pattern=ID_PATTERN)
    author: AuthorIn | None = None
    text: str
    reply_context: dict[str, Any] = Field(default_factory=dict)
    """Anything the sender wants back with the replies of this thread (a chat id...)."""


class DecisionItemIn(_Strict):
    """One call's decision."""

    tool_call_id: str = Field(min_length=1, max_length=200)
    args_digest: str = Field(min_length=1, max_length=200)
    approved: bool
    reason: str | None = Field(default=None, max_length=1000)
    result: str | None = None
    """The call's result when the sender did the action itself (approved: the tool does not
    run; D263); at most `MAX_SUPPLIED_CHARS` characters."""
    is_error: bool = False
    """With ``result``: the action failed."""

    def keyed(self) -> dict[str, Any]:
        """What a derived key covers: as before D263 for a decision without a result."""
        data = self.model_dump()
        if self.result is None and not self.is_error:
            del data["result"], data["is_error"]
        return data


class DecisionIn(_Strict):
    """An approval request decided (approve or deny each of its calls, or give its result)."""

    type: Literal["decision"]
    thread: str = Field(pattern=THREAD_PATTERN)
    space: str = Field(default="default", pattern=SPACE_PATTERN)
    run_id: str = Field(min_length=1, max_length=200)
    wait_id: str = Field(min_length=1, max_length=200)
    session: str | None = Field(default=None, min_length=1, max_length=200)
    decisions: list[DecisionItemIn] = Field(min_length=1, max_length=100)
    author: AuthorIn
    idempotency_key: str | None = Field(default=None, pattern=ID_PATTERN)


def outbound_body(outbound: Outbound) -> bytes:
    """The exact bytes `deliver` POSTs (and signs) for `outbound`: compact UTF-8 JSON."""
    thread = outbound.thread
    payload: dict[str, Any] = {
        "kind": outbound.kind,
        "delivery_id": outbound.delivery_id,
        "space": thread.space,
        "thread": thread.thread,
        "text": outbound.text,
        "answers": outbound.answers,
        "reply_context": outbound.reply_context,
    }
    if outbound.approval is not None:
        payload["approval"] = outbound.approval.model_dump(mode="json")
    if outbound.closed is not None:
        payload["closed"] = outbound.closed.model_dump(mode="json")
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
