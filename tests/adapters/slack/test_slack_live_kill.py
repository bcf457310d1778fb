"""A streamed Slack answer cut by SIGKILL: after the restart, one complete answer, no open stream.

A real `gateway serve` (SQLite) with Slack in HTTP mode against the local fake Slack: a signed
mention asks for a streamed answer (`tests.support.gateway_agent`'s ``/stream``: about 4 s of
chunks). The process is killed once the stream has started and grown; the next incarnation
resumes the run (its model request is sent again), which streams again and finishes with the
durable reply. The thread must end with exactly one bot message holding the whole answer, and
no message may be left streaming (started and never stopped).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest

from tests.support.fake_slack import FakeSlack, event_envelope, signed_headers
from tests.support.gateway_agent import STREAMED_ANSWER
from tests.support.gateway_process import GatewayProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

SECRET = "test-signing-secret"


async def _until(check: object, seconds: float, gateway: GatewayProcess) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, gateway.tail()
        await asyncio.sleep(0.05)


async def test_sigkill_mid_stream_ends_with_one_complete_answer(tmp_path: Path) -> None:
    async with FakeSlack() as fake:
        settings = {
            "store_url": f"sqlite:///{tmp_path}/store.db",
            "broker_url": f"sqlite:///{tmp_path}/broker.db",
            "web_url": f"sqlite:///{tmp_path}/web.db",
            "plugin": "tests.support.gateway_agent",
            "lease_seconds": "3",
            "renew_seconds": "0.5",
            "slack_bot_token": fake.bot_token,
            "slack_signing_secret": SECRET,
            "slack_api_url": fake.api_url,
        }
        gateway = GatewayProcess("gw", tmp_path, settings).start()
        try:
            event = fake.mention_event("C1", "/stream")
            raw = json.dumps(event_envelope(event))
            headers = {"content-type": "application/json", **signed_headers(raw, SECRET)}
            async with httpx.AsyncClient() as http:
                answered = await http.post(
                    f"{gateway.url}/slack/events", content=raw.encode(), headers=headers
                )
            assert answered.status_code == 200, answered.text
            await _until(lambda: len(fake.calls_to("chat.appendStream")) >= 3, 20, gateway)
            assert fake.streams("C1")  # a message is streaming right now
            gateway.kill()
            gateway.restart()

            def bot() -> list[str]:
                return [m.text for m in fake.thread("C1", event["ts"]) if m.bot_id]

            await _until(lambda: STREAMED_ANSWER in bot() and not fake.streams("C1"), 40, gateway)
            await asyncio.sleep(1.0)  # a second answer or a stray stream would show by now
            assert bot() == [STREAMED_ANSWER]
            assert fake.streams("C1") == []
        finally:
            gateway.stop()
