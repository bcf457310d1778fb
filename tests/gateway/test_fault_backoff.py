"""A session whose store failed for a moment is taken again after a short backoff (D313).

A fault (a write the store refused: a Redis that restarted, a disk briefly full) closed the
session's harness and left its lease to lapse: every thread of the session waited a whole
lease (30 s by default) after the store was fine again. The harness is closed before the
lease goes, so nothing of this process writes for the session once it is given up.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from gateway.channels import gateway_settings
from harness_core import SessionError
from harness_core.session.records import Record
from tests.support.service_rig import serving

pytestmark = pytest.mark.timeout(60)


async def test_a_session_that_faulted_once_is_answered_before_its_lease_would_lapse(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"sqlite:///{tmp_path}/web.db",
        lease_seconds=120,  # a lapse would outlast the test's timeout
        renew_seconds=1,
    )
    failed: list[str] = []
    with caplog.at_level(logging.INFO, logger="gateway.worker"):
        async with serving(settings) as rig:
            repo = rig.repo
            open_storage = repo.open

            async def opened(session_id: str, **kwargs: Any) -> Any:
                storage = await open_storage(session_id, **kwargs)
                append_record = storage.append_record

                async def once(record: Record) -> Any:
                    if not failed and record.type == "operation_started":
                        failed.append(record.type)  # the store refuses this one write
                        raise SessionError("storage", "database or disk is full")
                    return await append_record(record)

                storage.append_record = once  # type: ignore[method-assign]
                return storage

            repo.open = opened  # type: ignore[method-assign]
            await rig.post("t1", "hello after a hiccup")
            [answer] = await rig.answers("t1", 1)
    assert failed == ["operation_started"]
    assert answer["text"] == "You said: hello after a hiccup"
    said = [r.getMessage() for r in caplog.records]
    assert "session faulted" in said and "session released" in said
