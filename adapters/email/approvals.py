"""Approval links in email: a confirmation page on GET, the decision on POST.

A link names one pending batch, one approver and approve or deny, signed (`compose.approval_token`),
and its lane is bound to the token by a second signature. GET only shows what would be decided
(mail scanners open every link in a message: a GET must never decide); the page's button POSTs.
The decision's idempotency key is the wait: the first decision for a batch wins, and the same
link (or another approver's) used again is answered 409 with who decided; so is a link whose
request no longer waits (decided elsewhere, stopped), and one whose batch or session the gateway
does not hold is answered 409 saying so (`DecisionRefused`): nothing is recorded.
"""

from __future__ import annotations

import hmac
import html
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from adapters.channel import (
    Author,
    DecisionInbound,
    DecisionItem,
    DecisionRefused,
    NotRouted,
    ThreadRef,
    Unavailable,
)
from adapters.email.compose import ApprovalClaims, verify_approval_token

if TYPE_CHECKING:
    from adapters.email.channel import EmailChannel

__all__ = ["approval_router"]

_MAX_LANE = 1_000
log = logging.getLogger("adapters.email")

_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; form-action 'self'; frame-ancestors 'none'",
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}


def approval_router(channel: EmailChannel) -> APIRouter:
    """The routes behind the links of `channel`'s approval emails."""
    router = APIRouter()

    @router.get("/email/approvals/{token}", include_in_schema=False)
    async def confirm(token: str, lane: str = "", sig: str = "") -> HTMLResponse:
        checked = _check(channel, token, lane, sig)
        if isinstance(checked, HTMLResponse):
            return checked
        verb = "Approve" if checked.decision == "approve" else "Deny"
        calls = "".join(f"<li><code>{html.escape(call)}</code></li>" for call, _ in checked.calls)
        return _page(
            200,
            f"{verb}?",
            f"<p>{verb} the pending request of run <code>{html.escape(checked.run_id)}</code> "
            f"({len(checked.calls)} call(s)) as {html.escape(checked.approver)}?</p>"
            f"<ul>{calls}</ul>"
            f'<form method="post"><button type="submit">{verb}</button></form>',
        )

    @router.post("/email/approvals/{token}", include_in_schema=False)
    async def decide(token: str, lane: str = "", sig: str = "") -> HTMLResponse:
        checked = _check(channel, token, lane, sig)
        if isinstance(checked, HTMLResponse):
            return checked
        approved = checked.decision == "approve"
        decision = DecisionInbound(
            thread=ThreadRef(channel="email", space=channel.address, thread=lane[len("email:") :]),
            run_id=checked.run_id,
            wait_id=checked.wait_id,
            decisions=tuple(
                DecisionItem(tool_call_id=call, args_digest=digest, approved=approved)
                for call, digest in checked.calls
            ),
            decided_by=Author(id=checked.approver),
            idempotency_key=f"email:{checked.wait_id}",
            received_at_ms=channel.clock.now_ms(),
            session=checked.session,
            identified=True,  # the link was signed for this approver
        )
        sink = channel.sink
        if sink is None:
            return _page(503, "Try again", "<p>The gateway is starting or stopping.</p>")
        try:
            acceptance = await sink.decide(decision)
        except DecisionRefused as refused:
            if refused.code == "not_allowed":
                return _page(403, "Not an approver", f"<p>{html.escape(refused.message)}</p>")
            title = "Already decided" if refused.code == "closed" else "Nothing to decide"
            return _page(409, title, f"<p>{html.escape(refused.message)}</p>")
        except NotRouted:
            return _page(404, "Not found", "<p>This conversation is not served here.</p>")
        except Unavailable:
            return _page(503, "Try again", "<p>The decision could not be recorded now.</p>")
        first = acceptance.first if acceptance.duplicate else None
        if first is not None:
            verb = "approved" if all(item.approved for item in first.decisions) else "denied"
            when = datetime.fromtimestamp(first.received_at_ms / 1000, tz=UTC)
            return _page(
                409,
                "Already decided",
                f"<p>{html.escape(first.decided_by.id)} already {verb} this request "
                f"({when:%Y-%m-%d %H:%M} UTC). Nothing was changed.</p>",
            )
        verb = "Approved" if approved else "Denied"
        return _page(200, verb, f"<p>{verb}. The answer comes by email.</p>")

    return router


def _check(channel: EmailChannel, token: str, lane: str, sig: str) -> ApprovalClaims | HTMLResponse:
    """The link's claims, or the page that says why it does not work."""
    key = channel.link_key
    if key is None:
        return _page(404, "Not found", "<p>Approval links are off.</p>")
    if (
        not lane.startswith("email:")
        or len(lane) > _MAX_LANE
        or not _signed(channel, token, lane, sig)
    ):
        # a forged or altered link wrote no line at all: an operator could not see attempts
        log.warning("email approval link refused", extra={"reason": "signature"})
        return _page(400, "Invalid link", "<p>This link is not valid (it was changed).</p>")
    now = datetime.fromtimestamp(channel.clock.now_ms() / 1000, tz=UTC)
    try:
        claims = verify_approval_token(token, key=key, now=now)
    except ValueError as exc:
        expired = str(exc) == "expired"
        log.warning(
            "email approval link refused", extra={"reason": "expired" if expired else "token"}
        )
        why = "it has expired" if expired else "it was changed"
        return _page(400, "Invalid link", f"<p>This link is not valid ({why}).</p>")
    if claims.approver not in channel.approvers:
        log.warning(
            "email approval link refused",
            extra={"reason": "not_approver", "approver": claims.approver},
        )
        return _page(403, "Not an approver", "<p>This address may not decide approvals.</p>")
    return claims


def _signed(channel: EmailChannel, token: str, lane: str, sig: str) -> bool:
    try:
        expected = channel.lane_signature(token, lane)
    except (ValueError, UnicodeError):
        return False
    # bytes: compare_digest refuses str with non-ASCII characters (a hostile query string)
    return hmac.compare_digest(expected.encode(), sig.encode("utf-8", "replace"))


def _page(status: int, title: str, body: str) -> HTMLResponse:
    text = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title></head><body><h1>{html.escape(title)}</h1>"
        f"{body}</body></html>"
    )
    return HTMLResponse(text, status_code=status, headers=_HEADERS)
