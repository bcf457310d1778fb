"""A Slack the channel cannot use is said in words, against real sockets (D172).

A refused token stops the start with one line (the bot token, and now the app token in Socket
Mode, which slack-sdk would otherwise retry forever in the background). A Web API that cannot
be reached is not fatal (the channel starts and asks again later), but the log line says why,
naming the host and port: a name that does not resolve, a port nobody listens on, a port that
never answers, TLS spoken to a plain HTTP port, a URL that is not Slack's API. A delivery's
failure reason (what ``gateway ops`` shows) says the same.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from aiohttp import web
from fastapi import FastAPI

from adapters.channel import DeliveryError, Outbound, ThreadRef
from adapters.slack import SlackChannel
from gateway.channels import gateway_settings
from gateway.serve import serve
from tests.adapters.kit import TestSink
from tests.support.fake_slack import FakeSlack, event_envelope, signed_headers
from tests.support.redis_server import free_port


@dataclass(frozen=True)
class Places:
    """Where each kind of failure is found on this machine."""

    fake: FakeSlack
    closed: int
    """A port nothing listens on."""
    silent: int
    """A port that accepts and never answers."""
    not_slack: str
    """An HTTP server answering every path with an HTML 404 page."""


@pytest.fixture
async def places() -> AsyncIterator[Places]:
    held: list[asyncio.StreamWriter] = []

    async def accept_and_wait(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    silent = await asyncio.start_server(accept_and_wait, "127.0.0.1", 0)
    app = web.Application()

    async def not_found(_request: web.Request) -> web.Response:
        return web.Response(status=404, text="<html>Not Found</html>", content_type="text/html")

    app.router.add_route("*", "/{tail:.*}", not_found)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", free_port())
    await site.start()
    async with FakeSlack() as fake:
        yield Places(fake, free_port(), silent.sockets[0].getsockname()[1], f"{site.name}/api/")
    for writer in held:
        writer.close()
    silent.close()
    await runner.cleanup()


# (case, the API URL, the reason logged)
UNREACHABLE: list[tuple[str, Callable[[Places], str], str]] = [
    ("unresolvable", lambda p: "https://nonexistent.invalid/api/",
     r"cannot resolve the Slack API host 'nonexistent\.invalid' \(.+\): check the host name"),
    ("nothing-listens", lambda p: f"http://127.0.0.1:{p.closed}/api/",
     r"connection refused by 127\.0\.0\.1:{closed}: nothing listens there \(check the Slack "
     r"API host and port\)"),
    ("silent", lambda p: f"http://127.0.0.1:{p.silent}/api/",
     r"no answer from Slack API server 127\.0\.0\.1:{silent} within 1 s \(auth\.test\)"),
    ("tls-to-a-plain-port", lambda p: p.fake.api_url.replace("http://", "https://"),
     r"TLS handshake with Slack API server 127\.0\.0\.1:\d+ failed: wrong version number \(the "
     r"server does not speak TLS on this port: check the port and its security setting\)"),
    ("not-slacks-api", lambda p: p.not_slack,
     r"http://127\.0\.0\.1:\d+/api/ did not answer as the Slack Web API does \(HTTP 404, not "
     r"Slack's JSON\): check the API URL"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("url", "reason"), [c[1:] for c in UNREACHABLE], ids=[c[0] for c in UNREACHABLE]
)
async def test_an_unreachable_slack_is_said_in_words_and_the_channel_starts(
    places: Places,
    url: Callable[[Places], str],
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("WARNING", logger="adapters.slack")
    channel = SlackChannel(
        bot_token="xoxb-test-secretpart",
        signing_secret="test-signing-secret",
        api_url=url(places),
        call_timeout_s=1,
        backfill_hours=0,
    )
    await asyncio.wait_for(channel.start(TestSink()), timeout=10)
    await channel.close()
    said = [str(getattr(r, "reason", "")) for r in caplog.records if r.name == "adapters.slack"]
    expected = reason.replace("{closed}", str(places.closed))
    expected = expected.replace("{silent}", str(places.silent))
    assert said and re.fullmatch(expected, said[0]), said
    assert all("secretpart" not in line for line in said)


def _reply(text: str) -> Outbound:
    return Outbound(
        delivery_id="reply:s:run-1",
        thread=ThreadRef(channel="slack", space="C1", thread="C1:1.000001"),
        kind="reply",
        text=text,
    )


async def test_a_post_to_an_unreachable_slack_says_why_in_the_deliverys_reason(
    places: Places,
) -> None:
    channel = SlackChannel(
        bot_token="xoxb-test",
        signing_secret="test-signing-secret",
        api_url=f"http://127.0.0.1:{places.closed}/api/",
    )
    outbound = _reply("an answer")
    with pytest.raises(DeliveryError) as raised:
        await channel.deliver(outbound)
    assert raised.value.reason == (
        f"connection refused by 127.0.0.1:{places.closed}: nothing listens there (check the "
        "Slack API host and port)"
    )  # before: "Slack unreachable"
    assert not raised.value.unknown_outcome


async def test_an_app_token_slack_refuses_stops_serve_with_one_line(
    places: Places, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"sqlite:///{tmp_path}/web.db",
        slack_bot_token=places.fake.bot_token,
        slack_app_token="xapp-revoked-secretpart",
        slack_api_url=places.fake.api_url,
    )
    assert await serve(settings.replace(port=free_port())) == 1  # before: served, retrying
    err = capsys.readouterr().err
    assert "gateway: Slack refuses the app token (invalid_auth)" in err.splitlines()
    assert "Traceback" not in err and "secretpart" not in err


async def test_a_post_with_a_refused_token_is_kept_for_retries_and_warned_of(
    places: Places, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="adapters.slack")
    fake = places.fake
    channel = SlackChannel(
        bot_token=fake.bot_token, signing_secret="test-signing-secret", api_url=fake.api_url
    )
    fake.fail("chat.postMessage", error="invalid_auth")
    outbound = _reply("an answer")
    with pytest.raises(DeliveryError) as raised:
        await channel.deliver(outbound)
    assert not raised.value.permanent  # a token put right delivers it
    warned = [r for r in caplog.records if r.levelname == "WARNING"]
    assert [(r.getMessage(), getattr(r, "reason", None)) for r in warned] == [
        ("slack refuses the bot token: replies wait until it is put right", "invalid_auth")
    ]  # before: only the deliverer's "delivery failed", at info


async def test_the_sdk_s_debug_lines_never_reach_the_log_with_a_message_s_text(
    places: Places, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")  # GATEWAY_LOG_LEVEL=debug
    fake = places.fake
    channel = SlackChannel(
        bot_token=fake.bot_token, signing_secret="test-signing-secret", api_url=fake.api_url
    )
    outbound = _reply("the secret plan")
    await channel.deliver(outbound)
    assert fake.calls_to("chat.postMessage")
    assert not [r for r in caplog.records if "secret plan" in r.getMessage()]


async def test_an_event_while_slack_cannot_say_who_the_bot_is_is_refused_to_come_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Bolt's own auth.test check answered a Slack 5xx with a 200 saying "please reinstall this
    app": Slack never sends an answered event again, and the mention was lost (an outside
    probe). Refused with a 503, it comes again, and is taken once Slack answers."""
    async with FakeSlack() as fake:
        fake.fail("auth.test", error="internal_error", status=500, times=3)
        sink = TestSink(routes={"C1": "s1"})
        channel = SlackChannel(bot_token=fake.bot_token, signing_secret="s", api_url=fake.api_url)
        await channel.start(sink)  # the first failure: said, and the channel starts
        app = FastAPI()
        assert channel.router is not None
        app.include_router(channel.router)
        mention = {
            "type": "app_mention",
            "channel": "C1",
            "user": "U1",
            "ts": "1.01",
            "text": f"<@{fake.bot_user_id}> hi",
        }
        raw = json.dumps(event_envelope(mention, event_id="Ev1"))

        async def send(http: httpx.AsyncClient) -> httpx.Response:
            headers = {**signed_headers(raw, "s"), "content-type": "application/json"}
            return await http.post("/slack/events", content=raw, headers=headers)

        transport = httpx.ASGITransport(app=app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                with caplog.at_level(logging.WARNING, logger="adapters.slack"):
                    first, second = await send(http), await send(http)  # Slack's retries
                assert (first.status_code, second.status_code) == (503, 503), first.text
                assert sink.inbound == []
                said = [
                    r for r in caplog.records if r.getMessage() == "slack events refused for now"
                ]
                assert len(said) == 1  # once a minute, not once an event
                assert "internal_error" in str(getattr(said[0], "reason", ""))
                assert "reinstall" not in caplog.text
                third = await send(http)  # Slack answers auth.test again
                assert third.status_code == 200, third.text
        finally:
            await channel.close()
        assert [m.text for m in sink.inbound] == ["hi"]
        assert len(fake.calls_to("auth.test")) == 4


def test_a_signing_secret_beside_an_app_token_is_said_to_be_unused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Both set, the channel runs in Socket Mode and serves no /slack/events, without a word:
    an operator moving to HTTP mode who left the app token set saw Slack's URL check fail."""
    with caplog.at_level(logging.WARNING, logger="adapters.slack"):
        both = SlackChannel(bot_token="xoxb-1", signing_secret="s", app_token="xapp-1")
        SlackChannel(bot_token="xoxb-1", signing_secret="s")
    assert both.socket_mode and both.router is None
    [said] = [r for r in caplog.records if r.getMessage() == "slack signing secret unused"]
    assert "unset the app token for HTTP mode" in str(getattr(said, "note", ""))
