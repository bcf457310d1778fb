"""The operator API in a running service (SQLite and Redis): auth, envelope, reads and actions.

Each test runs a whole `Service` with the test agent (tests/support/gateway_agent.py) and talks
to it over ASGI: messages in through the web channel, the operator API under /api/v1.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from gateway.channels import gateway_settings
from gateway.ops.errors import MAX_BODY_BYTES
from gateway.ops.views import encode_cursor
from gateway.service import Service
from tests.support.ops_rig import AS_OPERATOR, AS_VIEWER, OPERATOR, Ops, deployed
from tests.support.redis_server import RedisServer

JSON = {"Content-Type": "application/json"}


@pytest.fixture(params=["sqlite", "redis"])
async def ops(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[Ops]:
    async with deployed(request, tmp_path) as running:
        yield running


async def test_whoami_names_the_token_and_what_it_may_do(ops: Ops) -> None:
    """The /ops page showed a viewer every action button, each refused with 403 when clicked."""
    viewer = await ops.http.get("/api/v1/whoami", headers=AS_VIEWER)
    assert viewer.json() == {"name": "bob", "role": "viewer"}
    operator = await ops.http.get("/api/v1/whoami", headers=AS_OPERATOR)
    assert operator.json() == {"name": "alice", "role": "operator"}
    assert (await ops.http.get("/api/v1/whoami")).status_code == 401


async def test_every_route_needs_a_token_and_errors_have_one_envelope(ops: Ops) -> None:
    schema = (await ops.http.get("/api/v1/openapi.json")).json()
    routes = [
        (method, path)
        for path, methods in schema["paths"].items()
        if path.startswith("/api/v1/")
        for method in methods
    ]
    assert len(routes) >= 17
    for method, path in routes:
        concrete = path.replace("{lane_id}", "ln_x").replace("{action_id}", "a")
        concrete = concrete.replace("{delivery_id}", "d")
        for headers in ({}, {"Authorization": "Bearer not-a-token"}, {"Authorization": "Basic x"}):
            response = await ops.http.request(method, concrete, headers=headers, json={})
            assert response.status_code == 401, (method, path, response.text)
            error = response.json()["error"]
            assert error["code"] == "unauthenticated"
            assert error["request_id"] == response.headers["x-request-id"]
    missing = await ops.http.get("/api/v1/nowhere", headers=AS_VIEWER)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    named = await ops.http.get("/api/v1/lanes/web:ship", headers=AS_VIEWER)  # a name, not an id
    assert named.status_code == 404 and "names a lane by its id (ln_..." in named.text
    wrong = await ops.http.delete("/api/v1/lanes", headers=AS_VIEWER)
    assert wrong.status_code == 404 and wrong.json()["error"]["code"] == "not_found"
    mine = await ops.http.get(
        "/api/v1/lanes", headers={**AS_VIEWER, "X-Request-Id": "trace-123456"}
    )
    assert mine.headers["x-request-id"] == "trace-123456"
    assert mine.headers["cache-control"] == "no-store"  # threads' contents: no cache keeps them
    bad = await ops.http.get("/api/v1/lanes?limit=0", headers=AS_VIEWER)
    assert bad.status_code == 400 and bad.json()["error"]["details"]["fields"][0]["field"]
    for nan in ("nan", "NaN", "inf"):  # read as "not >= 0" before: a finite number, said so
        waits = await ops.http.post(f"/api/v1/lanes/ln_x/resume?wait={nan}", headers=AS_OPERATOR)
        assert waits.status_code == 400, waits.text
        assert "finite" in waits.text, waits.text
    cursor = await ops.http.get("/api/v1/lanes?cursor=%%%", headers=AS_VIEWER)
    assert cursor.status_code == 400 and cursor.json()["error"]["code"] == "invalid_cursor"
    status = await ops.http.get("/api/v1/lanes?status=sleeping", headers=AS_VIEWER)
    assert status.status_code == 400 and "sleeping" in status.json()["error"]["message"]
    unknown = await ops.http.get("/api/v1/lanes/ln_bm9wZQ", headers=AS_VIEWER)
    assert unknown.status_code == 404, unknown.text
    health = await ops.http.get("/healthz")  # outside the API: no token, a request id still
    assert health.status_code == 200 and health.headers["x-request-id"]
    nowhere = await ops.http.get("/web/threads/a%2Fb/messages")  # outside: the channels' shape
    assert nowhere.status_code == 404
    assert nowhere.json() == {"error": {"code": "not_found", "message": "no such route"}}
    wrong = await ops.http.delete("/healthz")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "GET"
    assert wrong.json()["error"] == {
        "code": "method_not_allowed",
        "message": "DELETE is not allowed here",
    }


async def test_lanes_sessions_timeline_usage_and_backlog(ops: Ops) -> None:
    first = await ops.post("one", "hello")
    await ops.post("two", "/fail")
    await ops.answers("one", 1)
    await ops.answers("two", 1)
    session = first["session"]
    [listed] = (await ops.get("/sessions"))["items"]
    assert listed["id"] == session and listed["lanes"] == 2
    lanes = (await ops.get("/lanes"))["items"]
    assert [(v["lane"], v["status"]) for v in lanes] == [("web:one", "idle"), ("web:two", "failed")]
    assert lanes[1]["error"]["code"] and "retry" in lanes[1]["actions"]
    assert lanes[0]["thread"]["channel"] == "web"
    failed = (await ops.get("/lanes?status=failed"))["items"]
    assert [v["lane"] for v in failed] == ["web:two"]
    named = (await ops.get("/lanes?lane=web:one"))["items"]
    assert [v["lane"] for v in named] == ["web:one"]
    page = await ops.get("/lanes?limit=1")
    assert len(page["items"]) == 1 and page["next_cursor"]
    rest = await ops.get(f"/lanes?limit=1&cursor={page['next_cursor']}")
    assert [v["lane"] for v in rest["items"]] == ["web:two"] and rest["next_cursor"] is None
    lane_id = lanes[0]["id"]
    assert (await ops.get(f"/lanes/{lane_id}"))["lane"] == "web:one"
    timeline = (await ops.get(f"/lanes/{lane_id}/timeline"))["items"]
    summaries = [item["summary"] for item in timeline]
    assert "user: hello" in summaries and "assistant: You said: hello" in summaries
    assert [i["seq"] for i in timeline] == sorted(i["seq"] for i in timeline)
    short = await ops.get(f"/lanes/{lane_id}/timeline?limit=2")
    more = await ops.get(f"/lanes/{lane_id}/timeline?cursor={short['next_cursor']}")
    assert short["items"] + more["items"] == timeline
    # not ASCII digits, or past a 64-bit seq: a cursor this API never made
    for seq in ("\u00b2", "\u0663", "9" * 30):
        odd = encode_cursor(seq)
        for page in ("timeline", "usage"):
            refused = await ops.http.get(
                f"/api/v1/lanes/{lane_id}/{page}?cursor={odd}", headers=AS_VIEWER
            )
            assert refused.status_code == 400, refused.text
            assert refused.json()["error"]["code"] == "invalid_cursor"
    usage = await ops.get(f"/lanes/{lanes[1]['id']}/usage")
    assert usage["items"] and usage["items"][0]["cause"] == "assistant"
    assert usage["items"][0]["stop_reason"] == "error"  # the failed attempt is in the ledger
    backlog = await ops.get("/backlog")
    assert backlog["inbox_pending"] == 0 and backlog["dead_letters"] == 0


async def test_a_look_alike_lane_name_is_spelled_out(ops: Ops) -> None:
    """``pay`` and ``p\u0430y`` (a Cyrillic a) read the same on /ops (an outside probe): a
    name whose letters come from two scripts is also given spelled out."""
    await ops.post("pay", "hello")
    await ops.post("p\u0430y", "hello")
    await ops.post("\u043f\u0440\u0438\u0432\u0435\u0442", "hello")  # one script: as it is
    await ops.answers("pay", 1)
    lanes = {v["lane"]: v["lane_spelled"] for v in (await ops.get("/lanes"))["items"]}
    assert lanes == {
        "web:pay": None,
        "web:p\u0430y": "web:p\\u0430y",
        "web:\u043f\u0440\u0438\u0432\u0435\u0442": None,
    }


async def test_decisions_sent_at_once_one_wins_the_others_read_the_documented_reason(
    ops: Ops,
) -> None:
    """The losers' 409 said ``DecisionsMismatch`` (the engine's class name), where the API
    documents ``not_idle_waiting_head`` for a wait decided or superseded (an outside probe)."""
    await ops.post("race", "/deploy prod")
    view = await ops.until_status("web:race", "suspended")
    [call] = view["pending_approvals"]
    path = f"/lanes/{view['id']}/decisions"
    body = {"wait_id": view["wait_id"], "approvals": {call["tool_call_id"]: {"action": "approve"}}}
    sent = await asyncio.gather(*(ops.act(path, body, key=f"race-{n}") for n in range(3)))
    codes = sorted(r.status_code for r in sent)
    assert codes[0] == 200 and codes.count(200) == 1, [r.text for r in sent]
    for lost in (r for r in sent if r.status_code == 409):
        assert lost.json()["error"]["details"]["reason"] == "not_idle_waiting_head", lost.text


async def test_approve_from_the_api_with_exact_coverage_and_idempotency(ops: Ops) -> None:
    accepted = await ops.post("ship", "/deploy prod")
    view = await ops.until_status("web:ship", "suspended")
    assert view["suspended"] == "approval" and view["actions"] == ["decide", "abort"]
    [call] = view["pending_approvals"]
    assert (call["tool_name"], call["arguments"]) == ("deploy", {"target": "prod"})
    path = f"/lanes/{view['id']}/decisions"
    right = {"wait_id": view["wait_id"], "approvals": {call["tool_call_id"]: {"action": "approve"}}}
    before = await ops.log_size(accepted["session"])

    no_key = await ops.act(path, right)
    assert no_key.status_code == 428, no_key.text
    viewer = await ops.act(path, right, key="k-viewer", as_=AS_VIEWER)
    assert viewer.status_code == 403 and viewer.json()["error"]["code"] == "forbidden"
    # a viewer never acts, whatever its body: it got 400 and the body's fields first
    malformed: Any
    for malformed in ({"wait_id": 7}, [], None):
        refused = await ops.act(path, malformed, key="k-viewer-2", as_=AS_VIEWER)
        assert refused.status_code == 403, refused.text
    budget = await ops.http.put(
        f"/api/v1/lanes/{view['id']}/budget", json={"tokens": "lots"}, headers=AS_VIEWER
    )
    assert budget.status_code == 403, budget.text
    wrong = {"wait_id": view["wait_id"], "approvals": {"call-x": {"action": "approve"}}}
    coverage = await ops.act(path, wrong, key="k-wrong")
    assert coverage.status_code == 400, coverage.text
    details = coverage.json()["error"]["details"]
    assert details["reason"] == "pending_coverage_mismatch"
    assert (details["missing"], details["unexpected"]) == ([call["tool_call_id"]], ["call-x"])
    stale = await ops.act(path, {**right, "wait_id": "an-old-wait"}, key="k-stale")
    assert stale.status_code == 409
    assert stale.json()["error"]["details"]["reason"] == "not_idle_waiting_head"
    # "deny" then "approve" for one call in one body: the last was read, and it approved
    twice = (
        f'{{"wait_id": "{view["wait_id"]}", "approvals": {{"{call["tool_call_id"]}": '
        f'{{"action": "deny"}}, "{call["tool_call_id"]}": {{"action": "approve"}}}}}}'
    )
    doubled = await ops.http.post(
        f"/api/v1{path}",
        content=twice,
        headers={**AS_OPERATOR, "Idempotency-Key": "k-twice", "content-type": "application/json"},
    )
    assert doubled.status_code == 400, doubled.text
    assert doubled.json()["error"]["message"] == "the request body gives a key twice in one object"
    plain = await ops.http.post(  # a JSON object, sent as text: it read "a valid dictionary"
        f"/api/v1{path}",
        content=json.dumps(right),
        headers={**AS_OPERATOR, "Idempotency-Key": "k-plain", "content-type": "text/plain"},
    )
    assert plain.status_code == 400, plain.text
    assert "send it with content-type: application/json (not text/plain)" in plain.text
    assert await ops.log_size(accepted["session"]) == before  # refusals stored nothing

    decided = await ops.act(path, right, key="k-1")
    assert decided.status_code == 200, decided.text
    result = decided.json()
    assert (result["status"], result["kind"], result["outcome"]) == ("done", "decide", "completed")
    replay = await ops.act(path, right, key="k-1")
    assert replay.status_code == 200 and replay.json() == result
    reused = await ops.act(
        path, {**right, "approvals": {call["tool_call_id"]: {"action": "deny"}}}, key="k-1"
    )
    assert reused.status_code == 409
    assert reused.json()["error"]["details"]["reason"] == "idempotency_key_reused"
    answers = await ops.answers("ship", 2)
    assert answers[-1]["text"] == "Done: deployed prod"
    polled = await ops.get(f"/actions/{result['id']}")
    assert polled == result
    [event] = [
        e for e in (await ops.get("/audit?lane=web:ship"))["items"] if e["action"] == "decide"
    ]
    # by its id too, as every lane route takes it (read as a name, it found nothing)
    by_id = (await ops.get(f"/audit?lane={view['id']}"))["items"]
    assert [e for e in by_id if e["action"] == "decide"] == [event]
    assert event["actor"] == "operator:alice" and event["outcome"] == "completed"
    # the trail says what was decided: it read only "decide ... completed"
    assert (event["details"]["approved"], event["details"]["denied"]) == (
        [call["tool_call_id"]],
        [],
    )


async def test_an_approve_and_a_deny_sent_together_under_one_key_are_not_both_done(
    ops: Ops, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both callers got 200 "done", and the one who sent Deny was told so while the deploy
    ran: the request that lost the key's race took the winner's result as its own."""
    await ops.post("twin", "/deploy prod")
    view = await ops.until_status("web:twin", "suspended")
    [call] = view["pending_approvals"]
    path = f"/lanes/{view['id']}/decisions"

    def body(action: str) -> dict[str, Any]:
        return {"wait_id": view["wait_id"], "approvals": {call["tool_call_id"]: {"action": action}}}

    approve, deny = await asyncio.gather(
        ops.act(path, body("approve"), key="same-key"),
        ops.act(path, body("deny"), key="same-key"),
    )
    assert sorted([approve.status_code, deny.status_code]) == [200, 409], (approve, deny)

    # the losing order, made certain: another request puts the key between this one's look
    # and its own put (the twin's result is not this request's)
    await ops.post("twin-2", "/deploy prod")
    view = await ops.until_status("web:twin-2", "suspended")
    [call] = view["pending_approvals"]
    path = f"/lanes/{view['id']}/decisions"
    marks = ops.broker.marks
    real_get = marks.get

    async def late_look(name: str) -> str | None:
        found = await real_get(name)
        if name.startswith("ops:request:") and found is None:
            await marks.put(name, "the digest of a Deny sent with this key", expect=None)
        return found

    monkeypatch.setattr(marks, "get", late_look)
    late = await ops.act(path, body("approve"), key="same-key-2")
    monkeypatch.setattr(marks, "get", real_get)
    assert late.status_code == 409, late.text
    assert late.json()["error"]["details"]["reason"] == "idempotency_key_reused"
    assert (await ops.lane("web:twin-2"))["status"] == "suspended"  # nothing was decided


async def test_abort_rewind_and_retry(ops: Ops) -> None:
    await ops.post("work", "/slow 3000")
    view = await ops.until_status("web:work", "running")
    idle_refusal = None
    aborted = await ops.act(f"/lanes/{view['id']}/abort", key="abort-1")
    assert aborted.status_code == 200, aborted.text
    assert aborted.json()["outcome"] == "aborted"
    # the thread hears it, as it hears a `stop` (it heard nothing)
    [notice] = await ops.answers("work", 1)
    assert notice["text"] == "Stopped by operator:alice."
    view = await ops.until_status("web:work", "idle", "failed")
    idle_refusal = await ops.act(f"/lanes/{view['id']}/abort")
    assert idle_refusal.status_code == 409, idle_refusal.text

    await ops.post("again", "first question")
    await ops.answers("again", 1)
    await ops.post("again", "second question")
    await ops.answers("again", 2)
    view = await ops.lane("web:again")
    timeline = (await ops.get(f"/lanes/{view['id']}/timeline"))["items"]
    [first] = [i for i in timeline if i["summary"] == "user: first question"]
    rewound = await ops.act(f"/lanes/{view['id']}/rewind", {"entry_id": first["id"]}, key="rw-1")
    assert rewound.status_code == 200, rewound.text
    assert rewound.json()["outcome"] == "completed"
    answers = await ops.answers("again", 3)
    assert answers[-1]["text"] == "You said: first question"
    bad = await ops.act(f"/lanes/{view['id']}/rewind", {"entry_id": "no-such"}, key="rw-2")
    assert bad.status_code == 409, bad.text
    assert "no entry 'no-such'" in bad.json()["error"]["message"]
    # another thread's message: its conversation was moved into this one and answered here
    await ops.post("other", "a secret of another thread")
    await ops.answers("other", 1)
    other = (await ops.get(f"/lanes/{(await ops.lane('web:other'))['id']}/timeline"))["items"]
    [secret] = [i for i in other if i["summary"] == "user: a secret of another thread"]
    taken = await ops.act(f"/lanes/{view['id']}/rewind", {"entry_id": secret["id"]}, key="rw-3")
    assert taken.status_code == 409, taken.text
    assert taken.json()["error"]["details"]["reason"] == "not_this_lane"
    assert len(await ops.answers("again", 3)) == 3  # nothing more was answered here
    assert bad.json()["error"]["request_id"] == bad.headers["x-request-id"]  # a worker's refusal
    audited = len((await ops.get("/audit"))["items"])
    for odd in ("\u0000", "a\u0000b"):  # was 409, with the NUL in the audit trail
        nul = await ops.act(f"/lanes/{view['id']}/rewind", {"entry_id": odd}, key=f"rw-{odd!r}")
        assert nul.status_code == 400, nul.text
        assert "NUL" in nul.json()["error"]["details"]["fields"][0]["reason"]
    reason = {"wait_id": "w", "approvals": {"c\u0000": {"action": "approve"}}}
    nul = await ops.act(f"/lanes/{view['id']}/decisions", reason, key="d-nul")
    assert nul.status_code == 400, nul.text
    assert len((await ops.get("/audit"))["items"]) == audited  # nothing recorded

    await ops.post("broken", "/fail")
    failed = await ops.until_status("web:broken", "failed")
    retried = await ops.act(f"/lanes/{failed['id']}/retry", key="retry-1")
    assert retried.status_code == 200, retried.text
    assert retried.json()["outcome"] == "failed"  # it fails again: the model still refuses
    not_failed = await ops.act(f"/lanes/{(await ops.lane('web:again'))['id']}/retry")
    assert not_failed.status_code == 409


async def test_redeliver_and_discard_a_dead_letter(ops: Ops) -> None:
    broker = ops.broker
    # the service's own deliverer would claim the redelivered one (and dead-letter it again, its
    # payload being no reply) between the two calls: this test is about the operator's routes
    assert ops.service.deliverer is not None
    await ops.service.deliverer.stop(0)
    now = ops.service.parts.clock.now_ms()
    await broker.outbox.enqueue("dl-1", "web-default", "web:x", {"text": "hi"}, now_ms=now)
    [claimed] = await broker.outbox.claim("t", now_ms=now, limit=1, lease_ms=60_000)
    assert await broker.outbox.settle_dead(claimed, reason="HTTP 500", now_ms=now)
    dead = (await ops.get("/deliveries"))["items"]
    assert [(d["id"], d["last_error"]) for d in dead] == [("dl-1", "HTTP 500")]
    assert (await ops.get("/backlog"))["dead_letters"] == 1
    assert (await ops.get("/deliveries/dl-1"))["status"] == "dead"
    again = await ops.act("/deliveries/dl-1/redeliver")
    assert again.status_code == 200 and again.json()["status"] == "pending"
    twice = await ops.act("/deliveries/dl-1/redeliver")
    assert twice.status_code == 409 and twice.json()["error"]["details"]["reason"] == "not_dead"
    gone = await ops.act("/deliveries/dl-1/discard")
    assert gone.status_code == 200 and gone.json()["status"] == "discarded"
    assert (await ops.act("/deliveries/nope/discard")).status_code == 404
    trail = (await ops.get("/audit"))["items"]
    assert [(e["action"], e["target"]) for e in trail if e["actor"] == "operator:alice"] == [
        ("redeliver", "dl-1"),
        ("discard", "dl-1"),
    ]


async def test_redeliver_and_discard_race_and_retry_honestly(ops: Ops) -> None:
    """Concurrent actions on one dead letter all answered 200, with audit events for those
    that did nothing; a script's retry with its Idempotency-Key was told it failed; a reply
    discarded mid-attempt reached its thread while the record said "discarded"."""
    broker = ops.broker
    assert ops.service.deliverer is not None
    await ops.service.deliverer.stop(0)
    now = ops.service.parts.clock.now_ms()
    for delivery_id in ("dl-2", "dl-3"):
        await broker.outbox.enqueue(delivery_id, "web-default", "web:x", {"text": "hi"}, now_ms=now)
    for taken in await broker.outbox.claim("t", now_ms=now, limit=2, lease_ms=60_000):
        assert await broker.outbox.settle_dead(taken, reason="HTTP 500", now_ms=now)
    answers = await asyncio.gather(
        *(ops.act("/deliveries/dl-2/redeliver", key=f"race-{n}") for n in range(3)),
        ops.act("/deliveries/dl-2/discard", key="race-d"),
    )
    statuses = sorted(a.status_code for a in answers)
    assert statuses.count(200) in (1, 2), statuses  # one redeliver, and maybe the discard
    assert sum(1 for a in answers[:3] if a.status_code == 200) <= 1
    assert set(statuses) <= {200, 409}
    trail = (await ops.get("/audit"))["items"]
    acted = [e["action"] for e in trail if e["target"] == "dl-2"]
    assert len(acted) == statuses.count(200)  # a refusal records nothing
    # the same key again: the first result, not a failure
    first = await ops.act("/deliveries/dl-3/redeliver", key="script-1")
    assert first.status_code == 200 and first.json()["status"] == "pending"
    again = await ops.act("/deliveries/dl-3/redeliver", key="script-1")
    assert again.status_code == 200 and again.json()["status"] == "pending"
    reused = await ops.act("/deliveries/dl-3/discard", key="script-1")
    assert reused.status_code == 409
    assert reused.json()["error"]["details"]["reason"] == "idempotency_key_reused"
    # being sent: not discarded while the attempt lasts
    now = ops.service.parts.clock.now_ms()
    claimed = await broker.outbox.claim("t", now_ms=now, limit=5, lease_ms=60_000)
    [held] = [c for c in claimed if c.delivery.id == "dl-3"]  # dl-2 too, if it is pending
    sending = await ops.act("/deliveries/dl-3/discard", key="while-sent")
    assert sending.status_code == 409, sending.text
    assert sending.json()["error"]["details"]["reason"] == "being_sent"
    assert await broker.outbox.settle_delivered(held, now_ms=now + 1)
    assert (await ops.get("/deliveries/dl-3"))["status"] == "delivered"


async def test_a_body_that_is_no_json_says_so_and_names_no_field(ops: Ops) -> None:
    # the character's offset was given as the field's name: {"field": "17", ...}
    broken = await ops.http.post(
        "/api/v1/lanes/ln_eA/rewind",
        content=b'{"entry_id": ',
        headers={**AS_OPERATOR, **JSON, "Idempotency-Key": "k-broken"},
    )
    assert broken.status_code == 400, broken.text
    [field] = broken.json()["error"]["details"]["fields"]
    assert field["field"] == "" and field["reason"].startswith("the body is not valid JSON at")


async def test_a_body_over_the_cap_or_of_unknown_length_is_refused_unread(ops: Ops) -> None:
    path = "/api/v1/lanes/ln_eA/abort"
    huge = await ops.http.post(
        path, content=b"{" + b" " * MAX_BODY_BYTES + b"}", headers={**AS_OPERATOR, **JSON}
    )
    assert huge.status_code == 413, huge.text
    error = huge.json()["error"]
    assert error["code"] == "payload_too_large"
    assert error["details"]["limit_bytes"] == MAX_BODY_BYTES
    assert error["request_id"] == huge.headers["x-request-id"]

    async def chunks() -> AsyncIterator[bytes]:
        yield b"{}"

    unsized = await ops.http.post(path, content=chunks(), headers={**AS_OPERATOR, **JSON})
    assert unsized.status_code == 411 and unsized.json()["error"]["code"] == "length_required"
    # under the cap the request goes on to the usual checks (here: no token)
    small = await ops.http.post(path, content=b"{}", headers=JSON)
    assert small.status_code == 401


async def test_a_store_that_does_not_answer_is_503_not_an_internal_error(tmp_path: Any) -> None:
    """An operator paged because Redis stopped answering was told "internal error" (500), as
    if the gateway had a bug."""
    server = RedisServer(tmp_path / "redis").start()
    url = f"{server.url}?prefix=down"
    service = Service(
        gateway_settings(
            store_url=url,
            broker_url=f"sqlite:///{tmp_path}/broker.db",
            web_url=f"sqlite:///{tmp_path}/web.db",
            ops_tokens=(f"alice:operator:{OPERATOR}",),
        )
    )
    await service.start()
    assert service.app is not None
    try:
        transport = httpx.ASGITransport(app=service.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            assert (await http.get("/api/v1/sessions", headers=AS_OPERATOR)).status_code == 200
            server.kill()
            down = await http.get("/api/v1/sessions", headers=AS_OPERATOR)
            assert down.status_code == 503, down.text
            error = down.json()["error"]
            assert error["code"] == "unavailable" and "does not answer" in error["message"]
            assert down.headers["retry-after"] == "5"
    finally:
        server.start()
        await service.stop(drain_seconds=1)
        server.stop()
