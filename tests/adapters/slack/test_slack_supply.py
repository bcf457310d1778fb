"""Slack's "Done it myself": an approver gives a call's result instead of approving it (D263).

The whole service against the local fake Slack (`tests.adapters.slack.test_slack_service`'s
rig): the third button opens a dialog, its submission is a decision like Approve's (same key,
same approvers), the tool never runs, the agent reads the result, and the request's message
says who supplied it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.adapters.slack.test_slack_service import (
    APPROVER,
    Rig,
    _approval,
    _buttons,
    _running,
    _until,
)


@pytest.fixture
async def rig(tmp_path: Any) -> AsyncIterator[Rig]:
    async with _running(tmp_path / "http", socket_mode=False) as running:
        yield running


def _result(text: str, *, failed: bool = False) -> dict[str, dict[str, Any]]:
    """The dialog's ``state.values``: the result typed, the failed box ticked or not."""
    ticked = [{"value": "failed", "text": {"type": "plain_text", "text": "failed"}}]
    return {
        "result": {"result": {"type": "plain_text_input", "value": text}},
        "failed": {"failed": {"type": "checkboxes", "selected_options": ticked if failed else []}},
    }


async def _dialog(rig: Rig, asked: Any, user: str = APPROVER) -> str:
    """Click Done it myself; the id of the dialog it opened."""
    before = set(rig.fake.views)
    click = rig.fake.block_actions_payload("C1", asked.ts, "supply", user=user)
    assert (await rig.click(click)).status_code == 200
    await rig.fake.wait_for_call("views.open", count=len(before) + 1)
    [opened] = set(rig.fake.views) - before
    view = rig.fake.views[opened]
    assert view["callback_id"] == "supply_result"
    return opened


async def _decided(rig: Rig) -> list[Any]:
    broker = rig.service.broker
    assert broker is not None
    events = await broker.audit.list(session="slack-C1")
    return [e for e in events if e.action == "approval decided"]


async def test_an_approver_supplies_the_result_and_the_tool_never_runs(rig: Rig) -> None:
    event, asked = await _approval(rig)
    assert _buttons(asked) == ["approve", "deny", "supply"]
    view_id = await _dialog(rig, asked)

    empty = rig.fake.view_submission_payload(view_id, values=_result("  \n "), user=APPROVER)
    answer = await rig.click(empty)  # Slack shows the error under the input: nothing recorded
    assert answer.status_code == 200
    assert answer.json() == {
        "response_action": "errors",
        "errors": {"result": "Say what the action did: the agent reads it."},
    }
    await asyncio.sleep(0.3)
    assert await _decided(rig) == []

    given = "deployed build 42 by hand\nfrom the release console"
    submit = rig.fake.view_submission_payload(view_id, values=_result(given), user=APPROVER)
    assert (await rig.click(submit)).status_code == 200
    assert (await rig.click(submit)).status_code == 200  # submitted twice: one decision
    replies = await rig.bot_replies("C1", event["ts"], 2)
    assert replies[1].text == f"Done: {given}"  # the agent read the result; deploy never ran
    await _until(lambda: _buttons(rig.fake.message("C1", asked.ts)) == [])
    note = json.dumps(rig.fake.message("C1", asked.ts).blocks, ensure_ascii=False)
    assert f"<@{APPROVER}> supplied the result at " in note
    assert "UTC: deployed build 42 by hand…" in note
    [decided] = await _decided(rig)
    assert decided.outcome == "applied" and decided.details["decided_by"] == APPROVER
    # where it came from, and that Slack vouched for the name (a web click names itself)
    assert (decided.details["channel"], decided.details["identified"]) == ("slack", True)
    await asyncio.sleep(0.3)
    assert len([m for m in rig.fake.thread("C1", event["ts"]) if m.bot_id]) == 2


async def test_a_failed_action_is_said_and_a_late_approval_changes_nothing(rig: Rig) -> None:
    event, asked = await _approval(rig)
    value = _value(asked)  # what a client that has not refreshed still shows
    view_id = await _dialog(rig, asked)
    submit = rig.fake.view_submission_payload(
        view_id, values=_result("the deploy failed: disk full", failed=True), user=APPROVER
    )
    assert (await rig.click(submit)).status_code == 200
    replies = await rig.bot_replies("C1", event["ts"], 2)
    assert replies[1].text == "Done: the deploy failed: disk full"
    await _until(lambda: _buttons(rig.fake.message("C1", asked.ts)) == [])
    note = json.dumps(rig.fake.message("C1", asked.ts).blocks, ensure_ascii=False)
    assert "supplied the result (the action failed) at " in note

    late = rig.fake.block_actions_payload("C1", asked.ts, "approve", user=APPROVER, value=value)
    assert (await rig.click(late)).status_code == 200  # the same key: the first decision stands
    await asyncio.sleep(0.3)
    assert len(await _decided(rig)) == 1
    assert len([m for m in rig.fake.thread("C1", event["ts"]) if m.bot_id]) == 2


async def test_someone_not_an_approver_gets_no_dialog_and_records_nothing(rig: Rig) -> None:
    event, asked = await _approval(rig)
    click = rig.fake.block_actions_payload("C1", asked.ts, "supply", user="U0AAA7")
    assert (await rig.click(click)).status_code == 200
    await _until(lambda: any(e.user == "U0AAA7" for e in rig.fake.ephemerals))
    [told] = [e for e in rig.fake.ephemerals if e.user == "U0AAA7"]
    assert "Only approvers" in told.text
    assert rig.fake.calls_to("views.open") == []
    # a dialog submitted by someone who is not an approver (made up, or opened before their
    # rights went) is refused the same way
    forged = rig.fake.view_submission_payload(
        callback_id="supply_result",
        private_metadata=json.dumps(
            {"v": _value(asked), "c": "C1", "m": asked.ts, "t": event["ts"]}
        ),
        values=_result("done"),
        user="U0AAA7",
    )
    assert (await rig.click(forged)).status_code == 200
    await asyncio.sleep(0.3)
    assert await _decided(rig) == []
    assert _buttons(rig.fake.message("C1", asked.ts)) == ["approve", "deny", "supply"]


def _value(message: Any) -> str:
    for block in message.blocks or []:
        for element in block.get("elements", []):
            if element.get("action_id") == "supply":
                return str(element["value"])
    raise AssertionError("no Done it myself button")
