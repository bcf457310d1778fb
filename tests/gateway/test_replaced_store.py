"""A store replaced under a kept broker: its threads are still answered (D352).

The broker keeps each lane's replied-through mark as a store seq. With ``--store`` pointed at
another store (or the store reset) and the broker kept, the session's seqs began again under
the old marks: messages to threads the old store knew were accepted and run, and their replies
never enqueued, with no line in the log (an outside probe: a newcomer following the README).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from config import Settings
from gateway.channels import gateway_settings
from tests.support.service_rig import serving

AGENT = "tests.support.gateway_agent"


async def test_a_thread_is_answered_after_its_store_was_replaced(
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
        answers = await rig.answers("hello", 5)
        await rig.post("hello", "and again")
        again = await rig.answers("hello", 6)
    assert answers[-1]["text"] == "You said: new store"
    assert again[-1]["text"] == "You said: and again"
    assert [a["text"] for a in again].count("You said: old 3") == 1  # nothing sent twice
    [said] = [r for r in caplog.records if r.getMessage() == "session history replaced"]
    assert getattr(said.msg, "fields", {})["lanes"] == 1
    caplog.clear()
    async with serving(settings("second")) as rig:
        await rig.post("hello", "same store")
        assert (await rig.answers("hello", 7))[-1]["text"] == "You said: same store"
    assert not [r for r in caplog.records if r.getMessage() == "session history replaced"]
