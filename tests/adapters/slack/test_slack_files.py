"""Slack file shares reach the model: fetched once with the bot token from Slack's file host.

The whole service (HTTP mode) against the fake Slack, which serves the files users share at
its own address (the file host the service is configured with) and counts every request.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters.channel import Attachment, FileRefused, Unavailable
from adapters.slack.files import SlackFiles
from gateway.channels import gateway_settings
from gateway.service import Service
from harness_core import ImagePart, TextPart
from tests.support import files_agent
from tests.support.fake_slack import FakeSlack, Message, event_envelope, signed_headers
from tests.support.file_samples import pdf, png

SECRET = "test-signing-secret"
SESSION = "slack-C1"


class Rig:
    def __init__(self, service: Service, fake: FakeSlack, http: httpx.AsyncClient) -> None:
        self.service = service
        self.fake = fake
        self.http = http

    async def event(
        self, event: dict[str, Any], *, retry: int = 0, **envelope: Any
    ) -> httpx.Response:
        """Post `event` as Slack does; `retry` > 0: as its retry that many (X-Slack-Retry-Num)."""
        raw = json.dumps(event_envelope(event, **envelope))
        headers = {"content-type": "application/json", **signed_headers(raw, SECRET)}
        if retry:
            headers |= {"x-slack-retry-num": str(retry), "x-slack-retry-reason": "http_error"}
        return await self.http.post("/slack/events", content=raw.encode(), headers=headers)

    async def bot_replies(self, root: str, count: int) -> list[Message]:
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            found = [m for m in self.fake.thread("C1", root) if m.bot_id]
            if len(found) >= count:
                return found
            assert asyncio.get_running_loop().time() < deadline, [m.text for m in found]
            await asyncio.sleep(0.02)

    def with_files(self, text: str, *files: dict[str, Any]) -> dict[str, Any]:
        event = self.fake.mention_event("C1", text)
        return {**event, "files": list(files)}


@contextlib.asynccontextmanager
async def _running(
    tmp_path: Path, fake: FakeSlack | None = None, **extra: Any
) -> AsyncIterator[Rig]:
    async with contextlib.AsyncExitStack() as stack:
        if fake is None:
            fake = await stack.enter_async_context(FakeSlack())
        settings = gateway_settings(
            store_url=f"sqlite:///{tmp_path}/store.db",
            broker_url=f"sqlite:///{tmp_path}/broker.db",
            web_url=f"sqlite:///{tmp_path}/web.db",
            plugin="tests.support.files_agent",
            slack_bot_token=fake.bot_token,
            slack_signing_secret=SECRET,
            slack_api_url=fake.api_url,
            slack_file_host=fake.base_url,
            **extra,
        )
        service = Service(settings)
        await service.start()
        assert service.app is not None
        transport = httpx.ASGITransport(app=service.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            yield Rig(service, fake, http)
        await service.stop(drain_seconds=2)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with _running(tmp_path) as running:
        yield running


async def test_an_image_and_a_pdf_reach_the_model_as_an_image_and_text(rig: Rig) -> None:
    image = png()
    document = pdf(["Quarterly numbers are up", "Second page"])
    shot = rig.fake.add_file("shot.png", image, "image/png")
    report = rig.fake.add_file("report.pdf", document, "application/pdf")
    event = rig.with_files("what do these say?", shot, report)
    assert (await rig.event(event)).status_code == 200
    [reply] = await rig.bot_replies(event["ts"], 1)
    parts = files_agent.newest_user_parts()
    assert isinstance(parts[0], TextPart)
    assert "what do these say?" in parts[0].text
    assert "[attachment: shot.png (image/png" in parts[0].text
    assert isinstance(parts[2], ImagePart)
    assert parts[2].media_type == "image/png"
    assert base64.b64decode(parts[2].data) == image
    assert isinstance(parts[3], TextPart)
    assert parts[3].text.startswith("[file: report.pdf]\n--- page 1 ---\nQuarterly numbers are up")
    assert "--- page 2 ---\nSecond page" in parts[3].text
    assert "image: image/png" in reply.text
    # each fetched once, with the bot token
    assert rig.fake.file_requests == [(shot["id"], True), (report["id"], True)]


async def test_a_crash_between_fetch_and_acknowledge_does_not_fetch_again(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    intake = rig.service.intake
    assert intake is not None
    accept = intake.accept
    calls = 0

    async def down_once(inbound: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:  # the files are held; the message never reached the inbox
            raise Unavailable("the inbox is down")
        return await accept(inbound)

    monkeypatch.setattr(intake, "accept", down_once)
    shot = rig.fake.add_file("shot.png", png(), "image/png")
    event = rig.with_files("look", shot)
    assert (await rig.event(event, event_id="Ev1")).status_code == 500  # Slack retries
    assert rig.fake.file_requests == [(shot["id"], True)]
    assert (await rig.event(event, event_id="Ev1")).status_code == 200  # the retry
    assert (await rig.event({**event, "type": "message"}, event_id="Ev2")).status_code == 200
    [reply] = await rig.bot_replies(event["ts"], 1)
    assert "image: image/png" in reply.text
    assert rig.fake.file_requests == [(shot["id"], True)]  # fetched once in all


async def test_a_restart_between_fetch_and_acknowledge_does_not_fetch_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with FakeSlack() as fake:
        shot = fake.add_file("shot.png", png(), "image/png")
        async with _running(tmp_path, fake) as first:
            event = first.with_files("look after the restart", shot)

            async def gone(inbound: Any) -> Any:  # the process ends before the inbox write
                raise Unavailable("the process is going away")

            assert first.service.intake is not None
            monkeypatch.setattr(first.service.intake, "accept", gone)
            assert (await first.event(event, event_id="Ev1")).status_code == 500
        assert fake.file_requests == [(shot["id"], True)]
        async with _running(tmp_path, fake) as second:  # the same store and broker files
            assert (await second.event(event, event_id="Ev1")).status_code == 200  # the retry
            [reply] = await second.bot_replies(event["ts"], 1)
            assert "image: image/png" in reply.text
        assert fake.file_requests == [(shot["id"], True)]  # held across the restart


async def test_oversize_and_unknown_files_are_refused_with_a_reply_and_nothing_stored(
    tmp_path: Path,
) -> None:
    async with _running(tmp_path, file_max_mb=0.001) as rig:  # 1,000 bytes
        big = rig.fake.add_file("big.png", png(64, 64) + b"\0" * 2000, "image/png")
        archive = rig.fake.add_file("logs.zip", b"PK\x03\x04zip", "application/zip")
        event = rig.with_files("here you go", big, archive)
        assert (await rig.event(event)).status_code == 200
        notice, reply = await rig.bot_replies(event["ts"], 2)
        assert notice.text.startswith("I could not read these files:")
        assert "big.png: it is " in notice.text and "over the 1.0 KB limit" in notice.text
        assert "logs.zip: I do not read application/zip files" in notice.text
        assert reply.text.startswith("text: here you go")
        [part] = files_agent.newest_user_parts()  # named, not read
        assert isinstance(part, TextPart)
        assert "big.png (image/png" in part.text and "not read" in part.text
        assert rig.fake.file_requests == []  # refused before any fetch
        broker = rig.service.broker
        assert broker is not None
        for shared in (big, archive):
            assert await broker.blobs.find(SESSION, f"slack:{shared['id']}") is None


async def test_a_file_slack_s_host_keeps_failing_is_refused_on_the_last_try_not_the_message(
    rig: Rig,
) -> None:
    # every try got a 500, so after Slack's last retry the message was gone, its text too
    shot = rig.fake.add_file("shot.png", png(), "image/png")
    rig.fake.fail("files.download", error="upstream down", status=500, times=4)
    event = rig.with_files("what is in this one?", shot)
    for retry in (0, 1, 2):  # may pass later: not acknowledged, so Slack tries again
        assert (await rig.event(event, event_id="Ev1", retry=retry)).status_code == 500
    assert rig.fake.bot_messages("C1") == []
    assert (await rig.event(event, event_id="Ev1", retry=3)).status_code == 200
    notice, reply = await rig.bot_replies(event["ts"], 2)
    assert notice.text == (
        "I could not read the file shot.png: Slack's file host failed on Slack's last try "
        "(HTTP 500); share it again."
    )
    assert reply.text.startswith("text: what is in this one?")
    assert len(rig.fake.file_requests) == 4  # each try fetched; none was held


async def test_the_bot_token_goes_to_slacks_file_host_only() -> None:
    async with FakeSlack() as fake:
        shared = fake.add_file("notes.txt", b"hello", "text/plain")
        files = SlackFiles(fake.bot_token, file_host="https://files.slack.com", timeout_s=5)
        attachment = Attachment(name="notes.txt", media_type="text/plain", size=5, ref=shared["id"])
        [incoming] = files.incoming({"files": [shared]}, [attachment])
        with pytest.raises(FileRefused, match="not on Slack's file host"):
            await incoming.fetch(1_000)
        assert fake.file_requests == []  # no request, so no token, went anywhere
        local = SlackFiles(fake.bot_token, file_host=fake.base_url, timeout_s=5)
        [incoming] = local.incoming({"files": [shared]}, [attachment])
        assert await incoming.fetch(1_000) == b"hello"
        assert fake.file_requests == [(shared["id"], True)]


async def test_a_file_host_that_cannot_be_reached_is_retried_then_refused_on_the_last_try() -> None:
    with socket.socket() as unused:  # a port nothing listens on: the connection is refused
        unused.bind(("127.0.0.1", 0))
        host = f"http://127.0.0.1:{unused.getsockname()[1]}"
    files = SlackFiles("xoxb-test", file_host=host, timeout_s=5)
    attachment = Attachment(name="a.txt", media_type="text/plain", size=5, ref="F1")
    shared = {"id": "F1", "url_private": f"{host}/files-pri/T1-F1/a.txt"}
    [incoming] = files.incoming({"files": [shared]}, [attachment])
    with pytest.raises(httpx.ConnectError):  # may pass later: Slack is told to try again
        await incoming.fetch(1_000)
    [incoming] = files.incoming({"files": [shared]}, [attachment], last_try=True)
    with pytest.raises(FileRefused, match=r"failed on Slack's last try \(no connection\)"):
        await incoming.fetch(1_000)
