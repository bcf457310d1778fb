"""A message that waits behind an approval request is said to wait, once, and answered after.

It was held without a word until someone decided, and often nobody in the thread can decide
(named approvers, a Slack channel without any): the thread looked wedged (an outside probe).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.channels import gateway_settings
from gateway.replies import HELD_TEXT
from tests.support.gateway_rig import decision_body
from tests.support.service_rig import serving


@pytest.mark.parametrize("policy", ["steer", "follow_up", "next_run"])
async def test_a_message_behind_an_approval_is_told_it_waits(tmp_path: Path, policy: str) -> None:
    settings = gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"sqlite:///{tmp_path}/web.db",
        plugin="tests.support.gateway_agent",
        busy_policy=policy,
    )
    async with serving(settings) as rig:
        await rig.post("ship", "/deploy prod")
        [asked] = await rig.answers("ship", 1)
        assert asked["kind"] == "approval_request"
        await rig.post("ship", "hello, are you there?")
        [_, held] = await rig.answers("ship", 2)
        assert (held["kind"], held["text"]) == ("reply", HELD_TEXT)
        body = decision_body(asked["approval"], approved=True, key="k1")
        decided = await rig.http.post("/web/threads/ship/decisions", json=body)
        assert decided.status_code == 202, decided.text
        # answered once decided: in the run's reply (steer, follow_up) or the next run's
        later = await rig.answers("ship", 4 if policy == "next_run" else 3)
        # (one process sends a thread's replies in order, D379; two processes need not)
        assert any("You said: hello, are you there?" in i["text"] for i in later[2:]), later
        assert [i["text"] for i in later].count(HELD_TEXT) == 1  # said once
