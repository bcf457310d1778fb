"""The channel conformance suite on web, Slack, email and webhook, each against its real peer.

Web over HTTP (httpx's ASGI transport), Slack with signed requests into slack-bolt and the fake
Slack Web API, email with a real Dovecot and aiosmtpd, webhook with a Standard Webhooks sender
and receiver on a real port and a status URL (`tests.support.channel_rigs`); email once more
without approval links (a channel without decisions) and webhook without a status URL (a
`reconcile` that cannot see), for the checks that gate on them. And the suite's own teeth: a
channel that breaks a promise fails the check of that promise.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any

import pytest

from adapters.channel import (
    Acceptance,
    Capabilities,
    ChannelAdapter,
    Inbound,
    InboundSink,
    Outbound,
    Reconciled,
    Unavailable,
)
from adapters.conformance import ChannelCheck, ChannelRig, channel_checks
from adapters.webhook import delivery as webhook_delivery
from tests.support.channel_rigs import EmailRig, SlackRig, WebhookRig, WebRig
from tests.support.mail_servers import Dovecot

CHECKS = channel_checks()
GATED = [c for c in CHECKS if c.group == "approvals"]
"""The checks whose expectations follow `Capabilities.decisions`."""
RECONCILING = [c for c in CHECKS if c.group == "outbound"]
"""The checks whose expectations follow `Capabilities.reconciles`."""


@pytest.fixture(params=["web", "slack", "email", "webhook"])
async def rig(request: pytest.FixtureRequest) -> AsyncIterator[ChannelRig]:
    """A fresh peer of each built-in channel."""
    kind = str(request.param)
    if kind == "web":
        async with WebRig() as web:
            yield web
    elif kind == "slack":
        async with SlackRig() as slack:
            yield slack
    elif kind == "webhook":
        async with WebhookRig() as webhook:
            yield webhook
            assert webhook.channel is not None and webhook.channel.capabilities.reconciles
            assert webhook.strays == [], "sent again although the status URL said it arrived"
    else:
        dovecot: Dovecot = request.getfixturevalue("dovecot")
        async with EmailRig(dovecot) as mail:
            yield mail


@pytest.mark.parametrize("check", CHECKS, ids=[c.id for c in CHECKS])
async def test_channel_conforms(rig: ChannelRig, check: ChannelCheck) -> None:
    await check.run(rig)


@pytest.mark.parametrize("check", GATED, ids=[c.id for c in GATED])
async def test_email_without_approval_links_conforms(dovecot: Dovecot, check: ChannelCheck) -> None:
    async with EmailRig(dovecot, links=False) as mail:
        await check.run(mail)
        assert mail.channel is not None and not mail.channel.capabilities.decisions


@pytest.mark.parametrize("check", RECONCILING, ids=[c.id for c in RECONCILING])
async def test_webhook_without_a_status_url_conforms(check: ChannelCheck) -> None:
    async with WebhookRig(status=False) as webhook:
        await check.run(webhook)
        assert webhook.channel is not None and not webhook.channel.capabilities.reconciles


def test_every_check_has_a_unique_id_and_says_its_promise() -> None:
    ids = [check.id for check in CHECKS]
    assert len(ids) == len(set(ids))
    assert {check.group for check in CHECKS} == {
        "contract",
        "inbound",
        "outbound",
        "approvals",
        "lifecycle",
    }
    assert all(check.promise for check in CHECKS)


# -- the suite catches a channel that breaks a promise -------------------------------------------


class _Lying(WebRig):
    """A web peer whose channel breaks one promise."""

    def __init__(self, flaw: str) -> None:
        super().__init__()
        self.flaw = flaw

    def build(self) -> ChannelAdapter:
        channel = super().build()
        assert self.channel is not None
        web = self.channel
        if self.flaw == "reconcile_forgets":

            async def forgets(outbound: Outbound) -> Reconciled:
                return "absent"

            web.reconcile = forgets  # type: ignore[method-assign]
        elif self.flaw == "claims_approvers":
            web.capabilities = Capabilities(decisions=True, approvers=True)
        elif self.flaw == "stop_keeps_taking":

            async def keeps_taking() -> None:
                return None

            web.stop = keeps_taking  # type: ignore[method-assign]
        elif self.flaw == "acks_while_the_sink_refuses":
            start = web.start

            async def swallowing(sink: InboundSink) -> None:
                await start(_Swallowing(sink))

            web.start = swallowing  # type: ignore[method-assign]
        return channel


class _Swallowing:
    """A sink seen through a channel that acknowledges what the inbox could not hold."""

    def __init__(self, sink: InboundSink) -> None:
        self.sink = sink

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sink, name)

    async def accept(self, inbound: Inbound) -> Acceptance:
        try:
            return await self.sink.accept(inbound)
        except Unavailable:
            return Acceptance(item_id="lost", session="s", lane=inbound.thread.lane)


FLAWS = {
    "reconcile_forgets": "outbound:a_lost_ack_is_reconciled_and_nothing_is_posted_twice",
    "claims_approvers": "approvals:an_approval_request_is_decided_by_an_approver_once",
    "stop_keeps_taking": "lifecycle:after_stop_nothing_is_taken_and_deliveries_still_go_out",
    "acks_while_the_sink_refuses": "inbound:a_message_is_acknowledged_only_once_the_sink_holds_it",
}


@pytest.mark.parametrize(("flaw", "check_id"), FLAWS.items(), ids=list(FLAWS))
async def test_a_channel_breaking_a_promise_fails_its_check(flaw: str, check_id: str) -> None:
    [check] = [c for c in CHECKS if c.id == check_id]
    async with _Lying(flaw) as lying:
        with pytest.raises(AssertionError):
            await check.run(lying)


BLIND = [c for c in RECONCILING if "reconcile" in c.name]
"""The checks that send again what a `reconcile` that cannot see says is absent."""


@pytest.mark.parametrize("check", BLIND, ids=[c.id for c in BLIND])
async def test_a_webhook_that_cannot_reconcile_and_resends_under_a_new_id_fails(
    check: ChannelCheck, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its `reconcile` says absent, as declared, but the receiver cannot drop what it resends."""
    fresh = itertools.count(1)
    monkeypatch.setattr(webhook_delivery, "webhook_id", lambda delivery_id: f"msg_{next(fresh)}")
    async with WebhookRig(status=False) as webhook:
        with pytest.raises(AssertionError):
            await check.run(webhook)
