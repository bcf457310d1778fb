"""A thread that has spent `GATEWAY_TOKEN_BUDGET` stops asking the model and is told (D294)."""

from __future__ import annotations

from pathlib import Path

from gateway.channels import gateway_settings
from harness_core.session import RecordQuery
from harness_core.session.records import OperationFinished
from tests.support.service_rig import serving

AGENT = "tests.support.gateway_agent"
SPENT = (
    "Sorry, I stopped: this thread has used the tokens it may spend (token_budget). "
    "Start a new thread to go on, or ask an operator to raise its budget."
)


async def test_a_spent_thread_is_told_and_others_answer(tmp_path: Path) -> None:
    settings = gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"sqlite:///{tmp_path}/web.db",
        plugin=AGENT,
        token_budget=1,  # the first answer spends it
    )
    async with serving(settings) as gw:
        accepted = await gw.post("spender", "hello")
        assert (await gw.answers("spender", 1))[0]["text"] == "You said: hello"
        await gw.post("spender", "hello again")
        notice = (await gw.answers("spender", 2))[1]
        assert notice["text"] == SPENT
        # the budget is each thread's: another thread of the same session is answered
        await gw.post("other", "hi")
        assert (await gw.answers("other", 1))[0]["text"] == "You said: hi"
        storage = await gw.repo.open(accepted["session"])
        try:
            finished = await storage.find_records(RecordQuery(type="operation_finished"))
            asked = await storage.find_records(RecordQuery(type="step_attempt"))
            spent = await storage.get_usage(lane="web:spender")
        finally:
            await storage.close()
    outcomes = sorted(
        (record.lane, record.outcome, record.error.code if record.error else None)
        for record in (item.record for item in finished)
        if isinstance(record, OperationFinished)
    )
    assert outcomes == [
        ("web:other", "completed", None),
        ("web:spender", "completed", None),
        ("web:spender", "failed", "token_budget"),
    ]
    assert len(asked) == 2  # one request a thread: the spent thread's second asked nothing
    assert spent.total_tokens > 1
