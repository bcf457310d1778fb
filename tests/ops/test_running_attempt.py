"""A lane whose last counted attempt still runs is running, not stuck (D163).

The first test is the operator's report, end to end: `gateway serve` is SIGKILLed while a tool
runs, the next process resumes the operation as its last allowed attempt (2 of 2), and while that
attempt runs the API, `gateway ops`, the /ops page's data and ``/metrics`` say ``running`` and
offer only abort; resume and unstick are refused (409, the ops envelope). The attempt then ends
by itself.

The second keeps the other side true: an attempt that really died is stuck even while the
session's lease is held (another lane of the session works), because the worker that took the
session parked it.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import httpx
import pytest

from config import Settings
from gateway.channels import gateway_settings
from gateway.ops.cli import main as ops_main
from tests.support.gateway_process import GatewayProcess
from tests.support.service_rig import ServiceRig, serving

AGENT = "tests.support.gateway_agent"
OPERATOR = "run-operator-secret-0123456789"
VIEWER = "run-viewer-secret-0123456789abc"
AS_OPERATOR = {"Authorization": f"Bearer {OPERATOR}"}
AS_VIEWER = {"Authorization": f"Bearer {VIEWER}"}


def _lanes(url: str, query: str = "") -> dict[str, dict[str, Any]]:
    listed = httpx.get(f"{url}/api/v1/lanes{query}", headers=AS_VIEWER, timeout=10)
    assert listed.status_code == 200, listed.text
    return {v["lane"]: v for v in listed.json()["items"]}


def _until(url: str, lane: str, check: Any, gateway: GatewayProcess) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        view = _lanes(url).get(lane)
        if view is not None and check(view):
            return view
        assert time.monotonic() < deadline, (view, gateway.tail())
        time.sleep(0.05)


@pytest.mark.timeout(90)
def test_the_last_attempt_running_is_not_stuck_and_refuses_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = {
        "store_url": f"sqlite:///{tmp_path}/store.db",
        "broker_url": f"sqlite:///{tmp_path}/broker.db",
        "web_url": f"sqlite:///{tmp_path}/web.db",
        "plugin": AGENT,
        "max_attempts": "2",
        "lease_seconds": "3",
        "renew_seconds": "0.5",
        "ops_tokens": f"alice:operator:{OPERATOR},bob:viewer:{VIEWER}",
    }
    gateway = GatewayProcess("gw", tmp_path, settings).start()
    url = gateway.url
    try:
        posted = httpx.post(f"{url}/web/threads/long/messages", json={"text": "/slow 6000"})
        assert posted.status_code == 202, posted.text
        _until(url, "web:long", lambda v: v["activity"] == "running tool 'slow'", gateway)
        gateway.kill()  # attempt 1 dies mid-tool
        gateway.restart()  # waits out the lease, then resumes: attempt 2 of 2
        view = _until(url, "web:long", lambda v: v["attempts"] == 2, gateway)

        # the API (and the page, which shows exactly these views)
        assert (view["status"], view["suspended"], view["actions"]) == ("running", None, ["abort"])
        assert view["held_by"] is not None
        one = httpx.get(f"{url}/api/v1/lanes/{view['id']}", headers=AS_VIEWER, timeout=10).json()
        assert (one["status"], one["actions"]) == ("running", ["abort"])
        # the call being run again is no call "a resume would" do anything to: it read as one
        assert one["interrupted_calls"] == []
        assert _lanes(url, "?status=stuck") == {}  # the page's "stuck" filter
        for action in ("resume", "unstick"):
            refused = httpx.post(
                f"{url}/api/v1/lanes/{view['id']}/{action}",
                headers={**AS_OPERATOR, "Idempotency-Key": f"k-{action}"},
                json={},
                timeout=10,
            )
            assert refused.status_code == 409, refused.text
            error = refused.json()["error"]
            assert (error["code"], error["details"]["reason"]) == ("conflict", "lane_running")
            assert "attempt 2 of 2 runs in" in error["message"]

        # the metrics an alert reads (first scrape of this process: read now)
        scraped = httpx.get(f"{url}/metrics", timeout=10).text
        assert re.search(r"^gateway_stuck_lanes 0\.0$", scraped, re.M), scraped
        assert re.search(r'^gateway_lanes\{status="running"\} 1\.0$', scraped, re.M)

        # the CLI
        assert ops_main(["--url", url, "--token", VIEWER, "lanes"], None) == 0
        [row] = [r for r in capsys.readouterr().out.splitlines() if " web:long " in r]
        assert row.split()[1:4] == ["web:long", "running", "2/2"], row
        assert ops_main(["--url", url, "--token", VIEWER, "lanes", "--stuck"], None) == 0
        assert capsys.readouterr().err == "no lanes match\n"
        code = ops_main(["--url", url, "--token", OPERATOR, "resume", "web:long", "--yes"], None)
        out, err = capsys.readouterr()
        assert (code, out) == (1, "") and re.search(r"this one is running: attempt 2 of 2", err)

        # and it ends by itself
        done = _until(url, "web:long", lambda v: v["status"] == "idle", gateway)
        assert done["last_outcome"] == "completed"
        items = httpx.get(f"{url}/web/threads/long", timeout=10).json()["items"]
        assert items[-1]["text"] == "Done: slept 6000 ms"
    finally:
        gateway.stop()
    assert "Traceback" not in gateway.tail(400)


class _Rig(ServiceRig):
    async def lanes(self) -> dict[str, dict[str, Any]]:
        response = await self.http.get("/api/v1/lanes", headers=AS_VIEWER)
        assert response.status_code == 200, response.text
        return {v["lane"]: v for v in response.json()["items"]}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"sqlite:///{tmp_path}/web.db",
        plugin=AGENT,
        max_attempts=1,
        lease_seconds=6,
        renew_seconds=1,
        ops_tokens=(f"alice:operator:{OPERATOR}", f"bob:viewer:{VIEWER}"),
    )


async def _service(settings: Settings) -> AsyncGenerator[_Rig, None]:
    async with serving(settings, drain_seconds=0.2) as rig:
        yield _Rig(rig.service, rig.http)


async def _wait(rig: _Rig, check: Any) -> dict[str, dict[str, Any]]:
    deadline = asyncio.get_running_loop().time() + 20
    while True:
        lanes = await rig.lanes()
        if check(lanes):
            return lanes
        assert asyncio.get_running_loop().time() < deadline, lanes
        await asyncio.sleep(0.05)


async def test_a_dead_attempt_is_stuck_while_another_lane_holds_the_session(
    settings: Settings,
) -> None:
    first = _service(settings)
    rig = await anext(first)
    await rig.post("dead", "/slow 60000")
    await _wait(rig, lambda ls: ls.get("web:dead", {}).get("status") == "running")
    await first.aclose()  # the drain cuts the attempt: 1 of 1 is over

    second = _service(settings)
    rig = await anext(second)
    try:
        await rig.post("busy", "/slow 3000")  # the session is held while this one works
        lanes = await _wait(
            rig,
            lambda ls: (
                ls.get("web:busy", {}).get("status") == "running"
                and ls.get("web:dead", {}).get("status") == "stuck"
            ),
        )
        dead = lanes["web:dead"]
        assert dead["held_by"] is not None  # the lease is held, and still: stuck
        assert (dead["suspended"], dead["attempts"]) == ("crash", 1)
        assert {"resume", "unstick", "abort"} <= set(dead["actions"])
    finally:
        await second.aclose()
