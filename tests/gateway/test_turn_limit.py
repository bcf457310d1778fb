"""A run that loops on tools stops at `GATEWAY_MAX_TURNS` and its thread is told why (D293)."""

from __future__ import annotations

from pathlib import Path

from gateway.channels import gateway_settings
from harness_core.session import RecordQuery
from harness_core.session.records import OperationFinished
from tests.support.service_rig import serving

AGENT = "tests.support.gateway_agent"


async def test_a_tool_loop_stops_at_the_limit_and_the_thread_is_told(tmp_path: Path) -> None:
    settings = gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"sqlite:///{tmp_path}/web.db",
        plugin=AGENT,
        max_turns=4,
    )
    async with serving(settings) as gw:
        accepted = await gw.post("poller", "/loop")
        [notice] = await gw.answers("poller", 1)
        assert notice["text"] == (
            "Sorry, I stopped before finishing: this took more steps than one request may "
            "(turn_limit). You can ask again, perhaps in smaller parts."
        )
        # the same thread still answers: the limit ended one run, not the lane
        await gw.post("poller", "hello")
        answers = await gw.answers("poller", 2)
        assert answers[-1]["text"] == "You said: hello"
        scrape = (await gw.http.get("/metrics")).text
        assert 'gateway_runs_stopped_total{limit="turn_limit"} 1.0' in scrape
        storage = await gw.repo.open(accepted["session"])
        try:
            finished = await storage.find_records(RecordQuery(type="operation_finished"))
            calls = await storage.find_records(RecordQuery(type="tool_started"))
        finally:
            await storage.close()
    outcomes = [
        (record.outcome, record.error.code if record.error else None)
        for record in (item.record for item in sorted(finished, key=lambda item: item.seq))
        if isinstance(record, OperationFinished)
    ]
    assert outcomes == [("failed", "turn_limit"), ("completed", None)]
    assert len(calls) == 4  # four turns, each one tool call, then no fifth request
