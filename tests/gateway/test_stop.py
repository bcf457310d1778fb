"""In-thread stop: ``stop`` aborts the lane's open operation, once, even when redelivered.

A real harness (SQLite store) and a real SQLite broker; the lane's open operation is a run
waiting for approval, which stays open as long as the test needs. The service-level behaviour
(a running tool, steered messages, the thread's answer) is in `test_service_e2e.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from adapters.channel import Author, Inbound, ThreadRef
from gateway.broker.contract import Broker, InboxItem, NewInboxItem
from gateway.channels import gateway_settings
from gateway.stop import NOTHING_TO_STOP_TEXT, STOPPED_TEXT, is_stop, stop
from harness_core import (
    AgentLane,
    DecisionsRequired,
    Err,
    Ok,
    approve,
)
from harness_core._runtime import lane_effects
from tests.support.gateway_rig import lane_texts, waiting_for_approval
from tests.support.harness_kit import Kit, make_kit
from tests.support.service_rig import serving

THREAD = ThreadRef(channel="web", space="default", thread="t1")


@pytest.mark.parametrize(
    ("said", "stops"),
    [
        ("stop", True),
        ("Stop!", True),
        ("  STOP.  ", True),
        ("/stop", True),
        ("cancel", True),
        ("/cancel", True),
        ("stop it", False),
        ("please stop", False),
        ("stopping", False),
        ("", False),
    ],
)
def test_only_a_message_that_is_a_stop_word_is_a_stop(said: str, stops: bool) -> None:
    assert is_stop(said) is stops


@pytest.fixture
def broker(sqlite_broker: Broker) -> Broker:
    return sqlite_broker


async def _waiting_lane(tmp_path: Path) -> tuple[Kit, AgentLane]:
    """A lane whose run waits for approval of `deploy`: an open operation."""
    kit, lane, _ = await waiting_for_approval(tmp_path, THREAD.lane)
    assert (await lane.info()).operation_id is not None
    return kit, lane


async def _stop_item(broker: Broker, message_id: str = "m-stop") -> tuple[InboxItem, Inbound]:
    inbound = Inbound(
        thread=THREAD,
        message_id=message_id,
        author=Author(id="U1"),
        text="stop",
        received_at_ms=0,
    )
    await broker.threads.remember("s", THREAD.lane, THREAD.model_dump(mode="json"), {})
    appended = await broker.inbox.append(
        NewInboxItem(
            session="s",
            lane=THREAD.lane,
            dedupe_key=inbound.dedupe_key,
            kind="message",
            payload=inbound.model_dump(mode="json"),
        )
    )
    return appended.item, inbound


async def _notices(broker: Broker) -> list[str]:
    return [str(d.outbound["text"]) for d in await broker.outbox.list("pending")]


async def test_a_stop_aborts_the_open_operation_and_answers_the_thread(
    tmp_path: Path, broker: Broker
) -> None:
    kit, lane = await _waiting_lane(tmp_path)
    item, inbound = await _stop_item(broker)
    assert await stop(broker, item, inbound, lane, now_ms=1) is True
    await lane.wait_for_idle()
    assert (await lane.info()).operation_id is None
    assert await _notices(broker) == [STOPPED_TEXT]
    assert await broker.inbox.pending("s") == ()  # acknowledged
    [audited] = await broker.audit.list(session="s")
    assert (audited.actor, audited.action, audited.outcome) == (
        "web:U1",
        "stop requested",
        "stopped",
    )
    assert await _user_texts(kit) == ["deploy please"]  # "stop" never reached the model


async def test_a_stop_to_an_idle_lane_is_an_ordinary_message(
    tmp_path: Path, broker: Broker
) -> None:
    kit = await make_kit("sqlite", tmp_path)
    created = await kit.harness.create_lane("web:t1", None)
    assert isinstance(created, Ok)
    item, inbound = await _stop_item(broker)
    assert await stop(broker, item, inbound, created.value, now_ms=1) is False
    assert await _notices(broker) == []
    assert [i.id for i in await broker.inbox.pending("s")] == [item.id]  # still the worker's
    assert await broker.marks.get(f"stop:s:{item.id}") is None


async def test_a_stop_redelivered_after_a_crash_mid_abort_is_still_a_stop(
    tmp_path: Path, broker: Broker
) -> None:
    # the process died after remembering the stop and after its abort was durable: the lane is
    # idle now, and the redelivered "stop" must not become a message to the model
    _kit, lane = await _waiting_lane(tmp_path)
    item, inbound = await _stop_item(broker)
    assert await broker.marks.put(f"stop:s:{item.id}", "stopping", expect=None)
    assert isinstance(await lane.abort(), Ok)
    await lane.wait_for_idle()
    assert await stop(broker, item, inbound, lane, now_ms=1) is True
    assert await _notices(broker) == [STOPPED_TEXT]
    assert await broker.inbox.pending("s") == ()


async def test_a_stop_redelivered_after_its_notice_sends_it_once(
    tmp_path: Path, broker: Broker
) -> None:
    _kit, lane = await _waiting_lane(tmp_path)
    item, inbound = await _stop_item(broker)
    assert await stop(broker, item, inbound, lane, now_ms=1) is True
    assert await stop(broker, item, inbound, lane, now_ms=2) is True  # redelivered before the ack
    assert await _notices(broker) == [STOPPED_TEXT]


class _EndsFirst:
    """A lane whose operation ends between the stop's look and its abort (the race's one order)."""

    def __init__(self, lane: AgentLane) -> None:
        self._lane = lane
        self.name = lane.name

    async def info(self) -> Any:
        return await self._lane.info()

    async def abort(self) -> Any:
        required = await self._lane.resume()  # no decisions: says what the wait needs
        assert isinstance(required, Err) and isinstance(required.error, DecisionsRequired)
        [pending] = required.error.pending
        decided = await self._lane.resume([approve(pending)], wait_id=required.error.wait_id)
        assert isinstance(decided, Ok) and decided.value.kind == "completed"
        return await self._lane.abort()


async def test_a_run_that_ends_before_the_abort_is_not_called_stopped(
    tmp_path: Path, broker: Broker
) -> None:
    _kit, lane = await _waiting_lane(tmp_path)
    item, inbound = await _stop_item(broker)
    ends_first: Any = _EndsFirst(lane)
    assert await stop(broker, item, inbound, ends_first, now_ms=1) is True
    assert await _notices(broker) == [NOTHING_TO_STOP_TEXT]
    [audited] = await broker.audit.list(session="s")
    assert audited.outcome == "nothing to stop"


async def _user_texts(kit: Kit) -> list[str]:
    return await lane_texts(kit.repo, "s", "web:t1")


async def test_a_stop_that_came_while_an_effect_ran_says_the_effect_happened(
    tmp_path: Path,
) -> None:
    """A `stop` sent as an Approve landed: the deploy ran to its end, and the thread said only
    "Stopped.", so the person believed nothing happened (D311)."""
    async with _stopped_mid_charge(tmp_path, 1500) as rig:  # the charge ignores the abort
        answers = await rig.answers("t1", 2)
    texts = [a["text"] for a in answers]
    assert texts[0] == STOPPED_TEXT
    assert texts[1] == "Before it stopped, this had already run:\ncharge: charged 5"


async def test_a_stop_cuts_off_a_tool_that_goes_on_past_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """D407: a charge that never looks at the abort held the lane ``aborting`` for as long as it
    ran; the thread heard nothing. Cut off after the grace, the thread is answered, and told
    the charge may have happened."""
    monkeypatch.setattr(lane_effects, "TOOL_ABORT_GRACE_S", 0.5)
    async with _stopped_mid_charge(tmp_path, 600_000) as rig:  # ten minutes, deaf to it
        answers = await rig.answers("t1", 2)
    texts = [a["text"] for a in answers]
    assert texts[0] == STOPPED_TEXT
    assert "charge" in texts[1] and "may" in texts[1], texts


@contextlib.asynccontextmanager
async def _stopped_mid_charge(tmp_path: Path, ms: int) -> AsyncIterator[Any]:
    """A gateway whose thread ``t1`` was told ``stop`` while a charge of `ms` ran."""
    settings = gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"sqlite:///{tmp_path}/web.db",
        plugin="tests.support.gateway_agent",
    )
    async with serving(settings) as rig:
        await rig.post("t1", f"/slowcharge {ms}")
        await asyncio.sleep(0.5)  # the charge is running
        await rig.post("t1", "stop")
        yield rig
