"""Which events are this bot's install's: its workspace, its org, a Slack Connect channel."""

from __future__ import annotations

from typing import Any

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack.link import SlackLink
from harness_core.clock import SystemClock
from tests.support.fake_slack import event_envelope


def _link(team: str | None, enterprise: str | None = None, org: bool = False) -> SlackLink:
    link = SlackLink(
        client=AsyncWebClient(token="xoxb-test"),
        clock=SystemClock(),
        api_url="http://127.0.0.1:9/api/",
        call_timeout_s=5,
    )
    link.team_id, link.enterprise_id, link.enterprise_install = team, enterprise, org
    return link


def _seen_by(*installs: dict[str, Any]) -> dict[str, Any]:
    body = event_envelope({"type": "app_mention"}, team_id="T2")
    body["authorizations"] = list(installs)
    return body


WORKSPACE = {"enterprise_id": None, "team_id": "T1", "is_enterprise_install": False}
OTHER = {"enterprise_id": None, "team_id": "T2", "is_enterprise_install": False}
ORG = {"enterprise_id": "E1", "team_id": None, "is_enterprise_install": True}


@pytest.mark.parametrize(
    ("link", "body", "ours"),
    [
        # its own workspace's event, and another's (the envelope as Slack sends it)
        (_link("T1"), event_envelope({"type": "app_mention"}, team_id="T1"), True),
        (_link("T1"), event_envelope({"type": "app_uninstalled"}, team_id="T2"), False),
        # a Slack Connect channel: it happened in T2, and this install (T1) sees it
        (_link("T1"), _seen_by(OTHER, WORKSPACE), True),
        (_link("T1"), _seen_by(OTHER), False),
        # an org-wide install (Enterprise Grid): any workspace of its org
        (_link("T0", "E1", org=True), _seen_by(ORG), True),
        (_link("T0", "E1", org=True), _seen_by({**ORG, "enterprise_id": "E2"}), False),
        (_link("T0", "E1", org=True), {"team_id": "T7", "enterprise_id": "E1"}, True),
        # no authorizations: the envelope's workspace, when it names one
        (_link("T1"), {"team_id": "T2"}, False),
        (_link("T1"), {}, True),
        # auth.test has not answered yet: nothing to compare with
        (_link(None), event_envelope({"type": "app_mention"}, team_id="T2"), True),
    ],
)
def test_an_event_is_this_install_s_only_when_its_install_sees_it(
    link: SlackLink, body: dict[str, Any], ours: bool
) -> None:
    assert link.sent_here(body) is ours
