"""A tool's CSV reaches the Slack thread once: files upload v2, found again after a lost answer.

The whole service (HTTP mode) against the fake Slack: the reply's text is posted (with its
delivery id in the metadata), then the file is uploaded into the thread (get an upload URL,
POST the bytes without a token, complete it into the thread). When the answer to a call is
lost (it took effect) or refused (it did not), the deliverer reconciles: the thread ends with
one answer and one file either way.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from gateway.broker.contract import Delivery
from gateway.channels import gateway_settings
from gateway.service import Service
from tests.support import report_agent
from tests.support.fake_slack import FakeSlack, Message, event_envelope, signed_headers
from tests.support.service_rig import serving

SECRET = "test-signing-secret"


class Rig:
    def __init__(self, service: Service, fake: FakeSlack, http: httpx.AsyncClient) -> None:
        self.service = service
        self.fake = fake
        self.http = http

    async def delivered(self) -> Delivery:
        """The reply's delivery, once it is settled delivered."""
        assert self.service.broker is not None
        deadline = asyncio.get_running_loop().time() + 20
        while True:
            done = await self.service.broker.outbox.list("delivered")
            replies = [d for d in done if d.id.startswith("reply:")]
            if replies:
                [reply] = replies
                return reply
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)

    async def mention(self, text: str) -> str:
        event = self.fake.mention_event("C1", text)
        raw = json.dumps(event_envelope(event))
        headers = {"content-type": "application/json", **signed_headers(raw, SECRET)}
        response = await self.http.post("/slack/events", content=raw.encode(), headers=headers)
        assert response.status_code == 200
        return str(event["ts"])

    async def bot_messages(self, root: str, files: int, texts: int = 1) -> list[Message]:
        deadline = asyncio.get_running_loop().time() + 20
        while True:
            found = [m for m in self.fake.thread("C1", root) if m.bot_id]
            shared = [m for m in found if m.files]
            if len(shared) >= files and len(found) - len(shared) >= texts:
                return found
            assert asyncio.get_running_loop().time() < deadline, [m.text for m in found]
            await asyncio.sleep(0.02)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with FakeSlack() as fake:
        settings = gateway_settings(
            store_url=f"sqlite:///{tmp_path}/store.db",
            broker_url=f"sqlite:///{tmp_path}/broker.db",
            web_url=f"sqlite:///{tmp_path}/web.db",
            plugin="tests.support.report_agent",
            slack_bot_token=fake.bot_token,
            slack_signing_secret=SECRET,
            slack_api_url=fake.api_url,
            slack_file_host=fake.base_url,
        )
        async with serving(settings) as running:
            yield Rig(running.service, fake, running.http)


def _one_answer_and_one_file(rig: Rig, root: str, messages: list[Message]) -> None:
    texts = [m for m in messages if not m.files]
    shared = [m for m in messages if m.files]
    assert [m.text for m in texts] == [report_agent.ANSWER]
    assert texts[0].metadata is not None
    assert len(shared) == 1 and len(shared[0].files or []) == 1
    file_id = (shared[0].files or [])[0]["id"]
    upload = rig.fake.uploads[file_id]
    assert (upload.filename, upload.content, upload.completed) == (
        "tickets.csv",
        report_agent.CSV,
        True,
    )
    assert upload.shares == [("C1", root)]
    assert upload.upload_token is None  # the bytes go to the upload URL without the bot token
    # the answer comes first, its file after it
    assert float(texts[0].ts) < float(shared[0].ts)


async def test_a_tools_csv_is_uploaded_into_the_thread_once(rig: Rig) -> None:
    root = await rig.mention("export the tickets")
    messages = await rig.bot_messages(root, files=1)
    _one_answer_and_one_file(rig, root, messages)
    assert len(rig.fake.calls_to("files.completeUploadExternal")) == 1


@pytest.mark.parametrize(
    "method", ["files.completeUploadExternal", "chat.update"], ids=["upload", "text"]
)
async def test_a_lost_answer_is_reconciled_into_one_upload(rig: Rig, method: str) -> None:
    # it takes effect; the gateway never hears so (the answer finishes the run's stream with
    # chat.update, then the file is uploaded)
    rig.fake.lose_response(method)
    root = await rig.mention("export the tickets")
    await rig.bot_messages(root, files=1)
    delivery = await rig.delivered()
    assert delivery.attempts == 2  # the lost one, then the reconciled one
    _one_answer_and_one_file(rig, root, [m for m in rig.fake.thread("C1", root) if m.bot_id])


async def test_a_refused_completion_uploads_again_once(rig: Rig) -> None:
    rig.fake.fail("files.completeUploadExternal", "internal_error", status=500)
    root = await rig.mention("export the tickets")
    await rig.bot_messages(root, files=1)
    await rig.delivered()
    _one_answer_and_one_file(rig, root, [m for m in rig.fake.thread("C1", root) if m.bot_id])
    # the first upload never completed: a second one did, under a new file id
    assert len(rig.fake.uploads) == 2
    assert sum(1 for u in rig.fake.uploads.values() if u.completed) == 1
