"""A Slack user group among the approvers: its members, as Slack said lately.

Membership is read again after a minute; while Slack does not answer, the last read still
decides for a while, then vouches for nobody (someone taken out of the group meanwhile would
otherwise approve for as long as the failures last: an outside probe).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack.approvals import SlackApprovals
from adapters.slack.link import SlackLink
from harness_core.testing.clock import ManualClock
from tests.support.fake_slack import FakeSlack


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as running:
        yield running


async def test_a_group_read_long_ago_vouches_for_nobody_while_slack_fails(fake: FakeSlack) -> None:
    clock = ManualClock(1_767_225_600_000)
    client = AsyncWebClient(token=fake.bot_token, base_url=fake.api_url)
    link = SlackLink(client=client, clock=clock, api_url=fake.api_url, call_timeout_s=5)
    approvals = SlackApprovals(link, {"C1": ("S1",)})
    fake.usergroups["S1"] = ["U0AAA8"]
    assert await approvals._group_members("S1") == {"U0AAA8"}
    fake.fail("usergroups.users.list", "internal_error", times=10)
    clock.advance(61_000)  # past the minute: read again, and Slack fails
    assert await approvals._group_members("S1") == {"U0AAA8"}  # a read a minute old still holds
    clock.advance(15 * 60_000)
    assert await approvals._group_members("S1") == frozenset()  # too old to vouch for anyone
