"""A store replaced under a kept broker: its threads are still answered, none twice (D352).

The broker keeps each lane's replied-through mark as a store seq. With ``--store`` pointed at
another store (or the store reset) and the broker kept, the session's seqs began again under
the old marks: messages to threads the old store knew were accepted and run, and their replies
never enqueued, with no line in the log (an outside probe: a newcomer following the README).
Back on the older store, marks from zero would send its old replies again once the outbox had
let their deliveries go (a day on): the marks move to the store's last seq instead.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from config import Settings
from gateway.broker.sqlite import SqliteBroker
from gateway.channels import gateway_settings
from tests.support.service_rig import serving

AGENT = "tests.support.gateway_agent"
DAY_MS = 86_400_000


def _said(answers: list[dict[str, Any]]) -> list[str]:
    return [a["text"] for a in answers]


async def test_a_thread_is_answered_once_whichever_store_it_is_served_from(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def settings(store: str) -> Settings:
        return gateway_settings(
            store_url=f"sqlite:///{tmp_path}/{store}.db",
            broker_url=f"sqlite:///{tmp_path}/broker.db",
            web_url=f"sqlite:///{tmp_path}/web.db",
            plugin=AGENT,
        )

    async with serving(settings("first")) as rig:
        for n in range(4):  # the old history's marks run ahead of the new one's seqs
            await rig.post("hello", f"old {n}")
            await rig.answers("hello", n + 1)
    caplog.set_level(logging.WARNING, logger="gateway.worker")
    async with serving(settings("second")) as rig:
        await rig.post("hello", "new store")
        assert _said(await rig.answers("hello", 5))[-1] == "You said: new store"
    [said] = [r for r in caplog.records if r.getMessage() == "session history replaced"]
    assert getattr(said.msg, "fields", {})["lanes"] == 1
    async with serving(settings("second")) as rig:  # the same store again: nothing to do
        await rig.post("hello", "same store")
        assert _said(await rig.answers("hello", 6))[-1] == "You said: same store"
        broker = rig.broker
        assert isinstance(broker, SqliteBroker)
        await broker.purge(now_ms=rig.service.parts.clock.now_ms() + 2 * DAY_MS)
    assert len([r for r in caplog.records if r.getMessage() == "session history replaced"]) == 1
    async with serving(settings("first")) as rig:  # the older store, its deliveries gone
        await rig.post("hello", "first again")
        answers = _said(await rig.answers("hello", 7))
        await rig.post("hello", "and on")
        answers = _said(await rig.answers("hello", 8))
        # the web thread shows a delivery id once whatever comes: the outbox tells what went
        sent = await rig.broker.outbox.list("delivered", limit=100)
    assert answers[-2:] == ["You said: first again", "You said: and on"]
    assert len(sent) == 2, [d.outbound.get("text") for d in sent]  # no old reply sent again
