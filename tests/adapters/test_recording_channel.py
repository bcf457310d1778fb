"""The recording fake: its sink counts, every failure mode, inbound injection, a shared ledger."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from adapters.channel import ChannelAdapter, DecisionItem, DeliveryError, NotRouted, Outbound
from adapters.testing import RecordingChannel
from adapters.web import MemoryMailbox, WebChannel
from harness_core.testing import ManualClock
from tests.adapters.kit import TestSink, outbound


@pytest.fixture
async def fake(sink: TestSink) -> RecordingChannel:
    channel = RecordingChannel(clock=ManualClock())
    await channel.start(sink)
    return channel


def reply(delivery_id: str = "reply:run-1", thread: str = "t1") -> Outbound:
    return outbound(thread, delivery_id, channel="fake")


def test_it_is_a_channel_adapter(fake: RecordingChannel) -> None:
    assert isinstance(fake, ChannelAdapter)
    assert fake.name == "fake"
    assert RecordingChannel("slack").name == "slack"


async def test_deliveries_are_counted_at_the_sink(fake: RecordingChannel) -> None:
    receipt = await fake.deliver(reply("reply:1"))
    assert receipt.delivery_id == "reply:1"
    assert receipt.delivered_at_ms == fake.clock.now_ms()
    await fake.deliver(reply("reply:2"))
    assert fake.count("reply:1") == 1 and fake.count("never") == 0
    assert fake.duplicates() == {}
    await fake.deliver(reply("reply:1"))
    assert fake.duplicates() == {"reply:1": 2}
    assert [o.delivery_id for o in fake.delivered] == ["reply:1", "reply:2", "reply:1"]
    assert [o.delivery_id for o in fake.replies("t1")] == ["reply:1", "reply:2", "reply:1"]
    assert fake.replies("t2") == []


async def test_fail_next_fails_n_deliveries_then_delivers(fake: RecordingChannel) -> None:
    fake.fail_next(2, reason="slack said no", retry_after_s=3)
    for _ in range(2):
        with pytest.raises(DeliveryError) as caught:
            await fake.deliver(reply())
        assert caught.value.reason == "slack said no"
        assert caught.value.retry_after_s == 3
        assert not caught.value.permanent and not caught.value.unknown_outcome
    assert fake.count("reply:run-1") == 0
    await fake.deliver(reply())
    assert fake.count("reply:run-1") == 1
    assert len(fake.attempts) == 3


async def test_a_permanent_failure(fake: RecordingChannel) -> None:
    fake.fail_next(permanent=True, reason="channel_not_found")
    with pytest.raises(DeliveryError) as caught:
        await fake.deliver(reply())
    assert caught.value.permanent


async def test_fail_always_until_healed(fake: RecordingChannel) -> None:
    fake.fail_always()
    for _ in range(5):
        with pytest.raises(DeliveryError):
            await fake.deliver(reply())
    assert fake.count("reply:run-1") == 0
    fake.heal()
    await fake.deliver(reply())
    assert fake.count("reply:run-1") == 1


async def test_programmed_faults_come_before_the_standing_one(fake: RecordingChannel) -> None:
    fake.lose_ack_always()
    fake.fail_next(1)
    with pytest.raises(DeliveryError) as first:
        await fake.deliver(reply())
    assert not first.value.unknown_outcome and fake.count("reply:run-1") == 0
    with pytest.raises(DeliveryError) as second:
        await fake.deliver(reply())
    assert second.value.unknown_outcome and fake.count("reply:run-1") == 1


async def test_a_hang_lasts_until_cancelled_and_delivers_nothing(fake: RecordingChannel) -> None:
    fake.hang_next()
    delivering = asyncio.create_task(fake.deliver(reply()))
    await fake.wait_until(lambda: fake.hanging == 1, timeout_s=5)
    await asyncio.sleep(0.05)
    assert not delivering.done()
    delivering.cancel()
    with pytest.raises(asyncio.CancelledError):
        await delivering
    assert fake.hanging == 0 and fake.count("reply:run-1") == 0
    await fake.deliver(reply())  # only the next one hung
    assert fake.count("reply:run-1") == 1


async def test_a_hang_after_sending_delivered(fake: RecordingChannel) -> None:
    """A caller's timeout around this call cannot know: it must reconcile."""
    fake.hang_next(after_send=True)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await fake.deliver(reply())
    assert fake.count("reply:run-1") == 1
    assert await fake.reconcile(reply()) == "delivered"


async def test_hang_always(fake: RecordingChannel) -> None:
    fake.hang_always()
    tasks = [asyncio.create_task(fake.deliver(reply(f"r{n}"))) for n in range(3)]
    await fake.wait_until(lambda: fake.hanging == 3, timeout_s=5)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert fake.counts() == {}


async def test_a_lost_acknowledgement_delivers_then_reports_unknown(
    fake: RecordingChannel,
) -> None:
    fake.lose_ack_next()
    with pytest.raises(DeliveryError) as caught:
        await fake.deliver(reply())
    assert caught.value.unknown_outcome and not caught.value.permanent
    assert fake.count("reply:run-1") == 1
    assert await fake.reconcile(reply()) == "delivered"
    assert fake.reconciled == [("reply:run-1", "delivered")]


async def test_reconcile_is_truthful_and_can_be_told_it_cannot_tell(
    fake: RecordingChannel,
) -> None:
    assert await fake.reconcile(reply()) == "absent"
    fake.reconcile_unknown_next()
    await fake.deliver(reply())
    assert await fake.reconcile(reply()) == "unknown"
    assert await fake.reconcile(reply()) == "delivered"


async def test_wait_delivered(fake: RecordingChannel) -> None:
    waiting = asyncio.create_task(fake.wait_delivered("a", "b", timeout_s=5))
    await fake.deliver(reply("a"))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    await fake.deliver(reply("b"))
    await waiting
    with pytest.raises(TimeoutError):
        await fake.wait_delivered("c", timeout_s=0.1)


# -- inbound ------------------------------------------------------------------------------------


async def test_send_injects_a_message_into_the_sink(fake: RecordingChannel, sink: TestSink) -> None:
    acceptance = await fake.send("t1", "hello", message_id="m-1", author="ann")
    assert acceptance.lane == "fake:t1" and not acceptance.duplicate
    [inbound] = sink.inbound
    assert inbound.thread.channel == "fake" and inbound.thread.space == "default"
    assert (inbound.message_id, inbound.text, inbound.author.id) == ("m-1", "hello", "ann")
    generated = await fake.send("t1", "again")
    assert generated.item_id != acceptance.item_id
    assert sink.inbound[1].message_id == "fake-msg-2"


async def test_a_channel_retry_is_the_same_message_again(
    fake: RecordingChannel, sink: TestSink
) -> None:
    first = await fake.send("t1", "hello", message_id="m-1")
    retried = await fake.resend("m-1")
    assert retried.duplicate and retried.item_id == first.item_id
    assert sink.inbound[0] == sink.inbound[1]
    with pytest.raises(KeyError):
        await fake.resend("never-sent")


async def test_the_sink_errors_reach_the_caller(fake: RecordingChannel) -> None:
    with pytest.raises(NotRouted):
        await fake.send("t1", "hello", space="nowhere")


async def test_decide_sends_a_click(fake: RecordingChannel, sink: TestSink) -> None:
    item = DecisionItem(tool_call_id="c1", args_digest="d1", approved=False, reason="no")
    first = await fake.decide("t1", run_id="run-1", wait_id="w-1", decisions=[item])
    double = await fake.decide(
        "t1",
        run_id="run-1",
        wait_id="w-1",
        decisions=[item],
        idempotency_key=sink.decisions[0].idempotency_key,
    )
    assert double.duplicate and double.item_id == first.item_id
    assert sink.decisions[0].decided_by.id == "approver"
    assert sink.decisions[0].decisions == (item,)


async def test_sending_before_start_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="not started"):
        await RecordingChannel().send("t1", "hello")


# -- a ledger shared by processes ---------------------------------------------------------------


_OTHER_PROCESS = """
import asyncio, sys
from adapters.channel import Outbound, ThreadRef
from adapters.testing import RecordingChannel
from adapters.web import MemoryMailbox, WebChannel

async def run() -> None:
    channel = RecordingChannel(ledger=sys.argv[1])
    thread = ThreadRef(channel="fake", space="default", thread="t1")
    for delivery_id in sys.argv[2:]:
        await channel.deliver(
            Outbound(delivery_id=delivery_id, thread=thread, kind="reply", text="hi")
        )

asyncio.run(run())
"""


async def test_a_ledger_counts_what_every_process_delivered(tmp_path: Path) -> None:
    ledger = tmp_path / "sink" / "deliveries.jsonl"
    here = RecordingChannel(ledger=ledger)
    await here.deliver(reply("mine"))
    workers = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _OTHER_PROCESS,
            str(ledger),
            *[f"p{n}-{k}" for k in range(20)],
            "shared",
        )
        for n in range(3)
    ]
    for worker in workers:
        assert await worker.wait() == 0
    counts = here.counts()
    assert sum(counts.values()) == 1 + 3 * 21
    assert here.duplicates() == {"shared": 3}
    assert await here.reconcile(reply("p2-19")) == "delivered"  # delivered by another process
    lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert {line["lane"] for line in lines} == {"fake:t1"}


async def test_a_torn_last_ledger_line_is_ignored(tmp_path: Path) -> None:
    ledger = tmp_path / "deliveries.jsonl"
    channel = RecordingChannel(ledger=ledger)
    await channel.deliver(reply("a"))
    with ledger.open("a") as file:
        file.write('{"delivery_id": "b", "la')  # a process killed mid-write
    assert channel.counts() == {"a": 1}


# -- wrapping a real adapter --------------------------------------------------------------------


async def test_wrapping_the_web_channel_counts_what_it_delivered(sink: TestSink) -> None:
    web = WebChannel(MemoryMailbox(), clock=ManualClock())
    wrapped = RecordingChannel(inner=web)
    assert wrapped.name == "web"
    await wrapped.start(sink)
    app = FastAPI()
    app.include_router(web.router)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
        posted = await client.post("/web/threads/t1/messages", json={"text": "hi"})
        assert posted.status_code == 202  # inbound through the real channel, started by the fake
        sent = outbound("t1", "reply:run-1")
        receipt = await wrapped.deliver(sent)
        assert receipt.channel_message_ids == ("default/t1#2",)  # the web channel's receipt
        wrapped.lose_ack_next()
        with pytest.raises(DeliveryError) as caught:
            await wrapped.deliver(sent)
        assert caught.value.unknown_outcome
        assert wrapped.duplicates() == {"reply:run-1": 2}  # the gateway sent it twice
        thread = (await client.get("/web/threads/t1")).json()["items"]
        assert [i["kind"] for i in thread] == ["message", "reply"]  # the web kept it once
        wrapped.fail_next()
        with pytest.raises(DeliveryError):
            await wrapped.deliver(outbound("t1", "reply:run-2"))
        assert await web.reconcile(outbound("t1", "reply:run-2")) == "absent"
        await wrapped.stop()  # stops the web channel too
        refused = await client.post("/web/threads/t1/messages", json={"text": "hi"})
        assert refused.status_code == 503


async def test_an_inner_delivery_error_is_not_recorded() -> None:
    inner = RecordingChannel("web")
    inner.fail_next(reason="inner failed")
    wrapped = RecordingChannel(inner=inner)
    with pytest.raises(DeliveryError, match="inner failed"):
        await wrapped.deliver(outbound("t1", "reply:1"))
    assert wrapped.counts() == {} and inner.counts() == {}
