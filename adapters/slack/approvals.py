"""Approve, Deny and Done it myself in Slack: who may decide, the dialogs, the decision held.

A clicker is told, privately, when nothing was recorded (not an approver, a button that cannot
be read, a request no longer waiting) or when someone else decided first.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError

from adapters.channel import (
    Acceptance,
    ApprovalClosed,
    Author,
    DecisionInbound,
    DecisionItem,
    DecisionRefused,
    NotRouted,
)
from adapters.slack.events import slack_thread
from adapters.slack.link import SlackLink
from adapters.slack.render import (
    FAILED_BLOCK_ID,
    RESULT_BLOCK_ID,
    SUPPLY_RESULT_LIMIT,
    DecisionTarget,
    decode_decision_value,
    deny_reason_modal,
    mention,
    supply_result_modal,
)
from harness_core import SuppliedResult

log = logging.getLogger("adapters.slack")

_GROUP_TTL_MS = 60_000
"""How long a user group's members are trusted before they are asked for again."""
_GROUP_STALE_MS = 15 * 60_000
"""How long a user group's membership, read before Slack stopped answering, still decides."""


class SlackApprovals:
    """The listeners of the Approve and Deny buttons and of the Deny dialog."""

    def __init__(self, link: SlackLink, approvers: dict[str, tuple[str, ...]]) -> None:
        self.link = link
        self.approvers = approvers
        """Per channel id (or ``*``), the users and user groups (``S...``) who may decide."""
        self._groups: dict[str, tuple[int, frozenset[str]]] = {}

    async def on_approve(
        self, ack: Callable[..., Awaitable[Any]], body: dict[str, Any], action: dict[str, Any]
    ) -> None:
        """Approve: record the decision, then acknowledge (bolt's listener)."""
        click = _Click.of(body)
        if click is None:
            await ack()
            return
        target = await self._target(click, str(action.get("value", "")))
        if target is None or not await self._may_decide(click):
            await ack()
            return
        acceptance = await self._decide(click, target, approved=True, reason=None)
        await ack()
        if acceptance is not None:
            self.link.spawn(self._after_decision(click, acceptance, mine="approved"))

    async def on_deny(
        self,
        ack: Callable[..., Awaitable[Any]],
        body: dict[str, Any],
        action: dict[str, Any],
    ) -> None:
        """Deny: acknowledge, then open the dialog asking for a reason (bolt's listener)."""
        await self._open_dialog(ack, body, action, deny_reason_modal, "Deny")

    async def on_supply(
        self,
        ack: Callable[..., Awaitable[Any]],
        body: dict[str, Any],
        action: dict[str, Any],
    ) -> None:
        """Done it myself: acknowledge, then open the dialog asking for the result (D263)."""
        await self._open_dialog(ack, body, action, supply_result_modal, "Done it myself")

    async def _open_dialog(
        self,
        ack: Callable[..., Awaitable[Any]],
        body: dict[str, Any],
        action: dict[str, Any],
        modal: Callable[[str], dict[str, Any]],
        name: str,
    ) -> None:
        click = _Click.of(body)
        await ack()
        if click is None:
            return
        value = str(action.get("value", ""))
        if await self._target(click, value) is None or not await self._may_decide(click):
            return
        metadata = json.dumps(
            {"v": value, "c": click.channel, "m": click.message_ts, "t": click.thread_ts},
            separators=(",", ":"),
            ensure_ascii=False,
        )
        try:
            await self.link.client.views_open(
                trigger_id=str(body.get("trigger_id", "")), view=modal(metadata)
            )
        except (SlackApiError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("slack dialog failed", extra={"error": type(exc).__name__})
            await self._tell(click, f"Sorry, the {name} dialog could not open. Please try again.")

    async def on_deny_reason(
        self, ack: Callable[..., Awaitable[Any]], body: dict[str, Any], view: dict[str, Any]
    ) -> None:
        """The Deny dialog's submission: record the denial with its reason (bolt's listener)."""
        await self._submitted(ack, body, view, approved=False, reason=_reason_of(view))

    async def on_supply_result(
        self, ack: Callable[..., Awaitable[Any]], body: dict[str, Any], view: dict[str, Any]
    ) -> None:
        """The Done-it-myself dialog's submission: record the result given (bolt's listener).

        An empty result is answered in the dialog (Slack shows the error under the input), so
        the person writes one; nothing is recorded until then.
        """
        result = _result_of(view)
        if result is None:
            await ack(
                response_action="errors",
                errors={RESULT_BLOCK_ID: "Say what the action did: the agent reads it."},
            )
            return
        await self._submitted(ack, body, view, approved=True, reason=None, supplied=result)

    async def _submitted(
        self,
        ack: Callable[..., Awaitable[Any]],
        body: dict[str, Any],
        view: dict[str, Any],
        *,
        approved: bool,
        reason: str | None,
        supplied: SuppliedResult | None = None,
    ) -> None:
        try:
            metadata = json.loads(str(view.get("private_metadata", "")))
            value = str(metadata["v"])
            user = body["user"]
            click = _Click(
                user=str(user["id"]),
                user_name=user.get("name"),
                channel=str(metadata["c"]),
                message_ts=str(metadata["m"]),
                thread_ts=None if metadata.get("t") is None else str(metadata["t"]),
            )
        except (ValueError, KeyError, TypeError):
            await ack()
            log.warning("slack dialog malformed")
            return
        target = await self._target(click, value)
        if target is None or not await self._may_decide(click):
            await ack()
            return
        acceptance = await self._decide(
            click, target, approved=approved, reason=reason, supplied=supplied
        )
        await ack()
        if acceptance is not None:
            mine = "supplied the result for" if supplied else "approved" if approved else "denied"
            self.link.spawn(self._after_decision(click, acceptance, mine=mine))

    async def _target(self, click: _Click, value: str) -> DecisionTarget | None:
        try:
            return decode_decision_value(value)
        except ValueError as exc:
            log.warning("slack decision malformed", extra={"reason": str(exc)[:200]})
            await self._tell(click, "Sorry, this button cannot be read. Nothing was recorded.")
            return None

    async def _may_decide(self, click: _Click) -> bool:
        """Whether the clicker is an approver here; if not, they are told so, privately."""
        allowed = tuple(  # a person in the channel's list and in "*" is named once
            dict.fromkeys(self.approvers.get(click.channel, ()) + self.approvers.get("*", ()))
        )
        if click.user in allowed:
            return True
        for group in (who for who in allowed if who.startswith("S")):
            if click.user in await self._group_members(group):
                return True
        log.info("slack decision refused", extra={"user": click.user, "channel": click.channel})
        if allowed:
            people = ", ".join(
                f"<!subteam^{w}>" if w.startswith("S") else f"<@{w}>" for w in allowed
            )
            await self._tell(
                click, f"Only approvers can decide this ({people}). Nothing was recorded."
            )
        else:
            await self._tell(
                click,
                "Nobody may approve in this channel yet: an operator has to name the approvers "
                "(GATEWAY_SLACK_APPROVERS). Nothing was recorded.",
            )
        return False

    async def _group_members(self, group: str) -> frozenset[str]:
        now = self.link.clock.now_ms()
        cached = self._groups.get(group)
        if cached is not None and now - cached[0] < _GROUP_TTL_MS:
            return cached[1]
        try:
            answer = await self.link.client.usergroups_users_list(usergroup=group)
            members = frozenset(str(u) for u in answer.get("users") or [])
        except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
            log.warning(
                "slack user group unavailable", extra={"group": group, "error": type(exc).__name__}
            )
            # a membership read a while ago vouches for nobody: someone taken out of the group
            # since would approve for as long as Slack failed to answer
            if cached is not None and now - cached[0] < _GROUP_STALE_MS:
                return cached[1]
            return frozenset()
        self._groups[group] = (now, members)
        return members

    async def _decide(
        self,
        click: _Click,
        target: DecisionTarget,
        *,
        approved: bool,
        reason: str | None,
        supplied: SuppliedResult | None = None,
    ) -> Acceptance | None:
        """Hold the decision durably (raises Unavailable: Slack then shows the click failed)."""
        decision = DecisionInbound(
            thread=slack_thread(click.channel, click.thread_ts),
            run_id=target.run_id,
            wait_id=target.wait_id,
            decisions=tuple(
                DecisionItem(
                    tool_call_id=call_id,
                    args_digest=digest,
                    approved=approved,
                    reason=reason,
                    supplied=supplied,
                )
                for call_id, digest in target.calls
            ),
            decided_by=Author(id=click.user, name=click.user_name),
            idempotency_key=f"slack:{target.wait_id}",
            received_at_ms=self.link.clock.now_ms(),
            session=target.session,
            identified=True,  # the click came signed by Slack, with its user id
        )
        try:
            return await self.link.sink_or_fail().decide(decision)
        except DecisionRefused as refused:
            log.info("slack decision refused", extra={"reason": refused.code})
            closed = refused.closed
            # told after the ack (Slack wants one within 3 s): nothing was recorded either way
            self.link.spawn(
                self._tell(click, refused.message if closed is None else _closed_tell(closed))
            )
            return None
        except NotRouted as exc:
            log.warning("slack decision not routed", extra={"reason": str(exc)})
            await self._tell(
                click, "Sorry, this thread is not served any more. Nothing was recorded."
            )
            return None

    async def _after_decision(self, click: _Click, acceptance: Acceptance, *, mine: str) -> None:
        """Tell a second clicker who took the decision (and a first one who clicked otherwise).

        The request's copies are rewritten by its close once the decision is applied: never
        here, where it is not applied yet (it may still lose to another one).
        """
        first = acceptance.first if acceptance.duplicate else None
        if first is None:
            return
        verb = _verb(first.decisions)
        if first.decided_by.id != click.user:
            await self._tell(
                click, f"<@{first.decided_by.id}> already {verb} this. Nothing was changed."
            )
        elif verb != mine:  # the same person, the other button: a double click says nothing
            await self._tell(click, f"You already {verb} this. Nothing was changed.")

    async def _tell(self, click: _Click, text: str) -> None:
        """A private note to the clicker in the thread (best effort)."""
        try:
            await self.link.client.chat_postEphemeral(
                channel=click.channel,
                user=click.user,
                text=text,
                thread_ts=click.thread_ts,
            )
        except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
            log.warning("slack ephemeral failed", extra={"error": type(exc).__name__})


class _Click:
    """Who clicked which approval message, where."""

    def __init__(
        self,
        *,
        user: str,
        user_name: str | None,
        channel: str,
        message_ts: str,
        thread_ts: str | None,
    ) -> None:
        self.user = user
        self.user_name = user_name
        self.channel = channel
        self.message_ts = message_ts
        self.thread_ts = thread_ts

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> _Click | None:
        """The click of a ``block_actions`` payload (None when a part is missing)."""
        try:
            user = body["user"]
            message = body.get("message") or {}
            container = body.get("container") or {}
            channel = (body.get("channel") or {}).get("id") or container.get("channel_id")
            ts = message.get("ts") or container.get("message_ts")
            if not channel or not ts:
                return None
            thread_ts = message.get("thread_ts") or container.get("thread_ts")
            return cls(
                user=str(user["id"]),
                user_name=user.get("name") or user.get("username"),
                channel=str(channel),
                message_ts=str(ts),
                thread_ts=None if thread_ts is None else str(thread_ts),
            )
        except (KeyError, TypeError, AttributeError):
            return None


def _reason_of(view: Mapping[str, Any]) -> str | None:
    try:
        value = view["state"]["values"]["reason"]["reason"].get("value")
    except (KeyError, TypeError, AttributeError):
        return None
    return value.strip()[:500] or None if isinstance(value, str) else None


def _result_of(view: Mapping[str, Any]) -> SuppliedResult | None:
    """The dialog's result (None: empty), and whether the person ticked that it failed."""
    try:
        values = view["state"]["values"]
        text = values[RESULT_BLOCK_ID][RESULT_BLOCK_ID].get("value")
        ticked = (values.get(FAILED_BLOCK_ID) or {}).get(FAILED_BLOCK_ID) or {}
        failed = bool(ticked.get("selected_options"))
    except (KeyError, TypeError, AttributeError):
        return None
    if not isinstance(text, str) or not text.strip():
        return None
    return SuppliedResult(text=text[:SUPPLY_RESULT_LIMIT], is_error=failed)


def _closed_tell(closed: ApprovalClosed) -> str:
    """What a clicker is told, privately, about a request that closed before their click."""
    who = mention(closed.by) if closed.by else "someone"
    if closed.outcome in ("approved", "denied"):
        return f"{who} already {closed.outcome} this. Nothing was changed."
    if closed.outcome == "supplied":
        return f"{who} already supplied the result for this. Nothing was changed."
    if closed.outcome == "decided":
        return f"{who} already decided this. Nothing was changed."
    if closed.outcome == "stopped":
        return f"This request was stopped{' by ' + who if closed.by else ''}. Nothing was changed."
    return "This request is no longer waiting: its run ended. Nothing was changed."


def _verb(decisions: Sequence[DecisionItem]) -> str:
    """What a decision did, as the note to a later clicker says it."""
    if all(item.supplied is not None for item in decisions):
        return "supplied the result for"
    return "approved" if all(item.approved for item in decisions) else "denied"
