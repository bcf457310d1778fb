"""`PUT /lanes/{id}/budget`: an operator lets a spent thread go on, or holds one back (D295).

A whole service (SQLite and Redis) with a token budget of 1 token a thread: the first answer
spends it, the next message is told so; the operator sets that lane's own budget, a retry of
the failed run is answered, and a reset gives the lane its profile's budget again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.support.ops_rig import AS_OPERATOR, AS_VIEWER, Ops, deployed

SPENT = "(token_budget)"


@pytest.fixture(params=["sqlite", "redis"])
async def ops(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[Ops]:
    async with deployed(request, tmp_path, token_budget=1) as running:
        yield running


@pytest.fixture(params=["sqlite"])
async def unbudgeted(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[Ops]:
    async with deployed(request, tmp_path) as running:
        yield running


async def _put(ops: Ops, lane_id: str, body: Any, as_: dict[str, str] = AS_OPERATOR) -> Any:
    return await ops.http.put(f"/api/v1/lanes/{lane_id}/budget", json=body, headers=as_)


async def test_an_operator_lets_a_spent_thread_go_on(ops: Ops) -> None:
    await ops.post("vip", "hello")
    await ops.answers("vip", 1)
    await ops.post("vip", "and again")
    assert SPENT in (await ops.answers("vip", 2))[1]["text"]
    view = await ops.until_status("web:vip", "failed")
    assert view["token_budget"] == 1

    refused = await _put(ops, view["id"], {"tokens": 1_000_000}, as_=AS_VIEWER)
    assert refused.status_code == 403, refused.text
    raised = await _put(ops, view["id"], {"tokens": 1_000_000, "reason": "a customer call"})
    assert raised.status_code == 200, raised.text
    shown = raised.json()
    assert shown["changed"] is True and shown["budget"] == 1_000_000
    assert shown["profile_budget"] == 1 and shown["spent"] > 1
    assert (shown["set_by"], shown["reason"]) == ("operator:alice", "a customer call")
    again = await _put(ops, view["id"], {"tokens": 1_000_000})
    assert again.status_code == 200 and again.json()["changed"] is False  # a value, not a sum
    assert (await ops.lane("web:vip"))["token_budget"] == 1_000_000
    assert (await ops.get(f"/lanes/{view['id']}/usage"))["budget"] == 1_000_000

    # the failed run, retried, is answered: the worker reads the lane's budget for the action
    retried = await ops.act(f"/lanes/{view['id']}/retry", key="retry-vip")
    assert retried.status_code == 200, retried.text
    assert retried.json()["outcome"] == "completed"
    assert (await ops.answers("vip", 3))[2]["text"] == "You said: and again"
    trail = (await ops.get("/audit?lane=web:vip"))["items"]
    assert [e["action"] for e in trail if e["action"].startswith("budget")] == ["budget set"]

    # reset: the profile's budget again, and the next message is told it is spent
    reset = await _put(ops, view["id"], {"tokens": None})
    assert reset.status_code == 200 and reset.json()["budget"] == 1
    await ops.post("vip", "one more")
    assert SPENT in (await ops.answers("vip", 4))[3]["text"]
    # other threads keep their profile's budget
    await ops.post("other", "hi")
    await ops.answers("other", 1)
    assert (await ops.lane("web:other"))["token_budget"] == 1


@pytest.mark.parametrize(
    "body",
    [
        {"tokens": 0},
        {"tokens": -5},
        {"tokens": 10**10},
        {"tokens": "5000"},
        {"tokens": 5000.0},
        {"tokens": True},
        {},
        {"tokens": 5000, "extra": 1},
        {"tokens": 5000, "reason": ""},
        [5000],
    ],
)
async def test_a_bad_budget_is_refused_and_changes_nothing(ops: Ops, body: Any) -> None:
    await ops.post("t", "hello")
    await ops.answers("t", 1)
    view = await ops.lane("web:t")
    refused = await _put(ops, view["id"], body)
    assert refused.status_code in (400, 422), refused.text
    assert refused.json()["error"]["code"] == "invalid_argument"
    assert (await ops.lane("web:t"))["token_budget"] == 1


async def test_a_thread_without_a_budget_refuses_one(unbudgeted: Ops) -> None:
    await unbudgeted.post("free", "hello")
    await unbudgeted.answers("free", 1)
    view = await unbudgeted.lane("web:free")
    assert view["token_budget"] is None
    refused = await _put(unbudgeted, view["id"], {"tokens": 5000})
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["details"]["reason"] == "no_budget" and "token_budget" in error["message"]
    assert (await unbudgeted.lane("web:free"))["token_budget"] is None
    reset = await _put(unbudgeted, view["id"], {"tokens": None})  # nothing to reset: no change
    assert reset.status_code == 200 and reset.json()["changed"] is False
    missing = await _put(unbudgeted, "ln_bm8tc3VjaAp3ZWI6bm9uZQ", {"tokens": 5})
    assert missing.status_code == 404, missing.text
