"""One session fed by two channels: a Slack channel and a mailbox routed to the same session.

The whole service runs in the test's process behind a real HTTP server (uvicorn): Slack events
arrive as signed requests at ``/slack/events`` and replies go to the fake Slack Web API
(`tests.support.fake_slack`); mail is delivered into the bot's real Dovecot mailbox and answered
through aiosmtpd, which delivers into the sender's mailbox (`tests.support.mail_servers`). Both
routes name the session ``shared``, so the Slack thread and the mail thread are two lanes of one
session: the Slack thread names the session (a session fact), the mail thread reads the name
back, the store holds both lanes in one tree, and an operator sees both, through the API and
through ``gateway ops``.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from config import Route, Settings
from gateway.channels import gateway_settings
from gateway.ops.cli import main as gateway_ops
from gateway.service import Service, ServiceParts
from harness_core import (
    AssistantMessage,
    BranchQuery,
    ModelRef,
    ModelRequest,
    ScriptedModel,
    SessionTree,
    StoredEntry,
    Tool,
    ToolContext,
    ToolResultMessage,
    UserMessage,
    message_text,
    open_repo,
)
from harness_core.models.scripted import text, tool_call
from harness_core.session.entries import MessageEntry
from tests.adapters.kit import serve
from tests.support.fake_slack import FakeSlack, Message, event_envelope, signed_headers
from tests.support.mail_servers import Dovecot, MailUser, SmtpServer
from tests.support.ops_rig import backend_urls

SESSION = "shared"
CHANNEL = "C0SHARED"
SECRET = "test-signing-secret"
OPERATOR = "operator-secret-abcdefghijklmnop"
NAME = "Release train 42"
MODEL = ModelRef(provider="scripted", model_id="shared-session")


def _settings(
    urls: dict[str, str], slack: FakeSlack, smtp: SmtpServer, dovecot: Dovecot, bot: MailUser
) -> Settings:
    """The service's settings: Slack (HTTP mode) and email on, both routed to `SESSION`."""
    assert smtp.tls_cert is not None
    return gateway_settings(
        **urls,
        lease_seconds=6,
        renew_seconds=1,
        # `ops` reads the CLI's whole stderr while the service runs in this process: a session
        # whose linger ends meanwhile would log into it
        linger_seconds=0,
        slack_bot_token=slack.bot_token,
        slack_signing_secret=SECRET,
        slack_api_url=slack.api_url,
        email_address=bot.address,
        email_imap_host="127.0.0.1",
        email_imap_port=dovecot.port,
        email_imap_security="none",
        email_smtp_host="127.0.0.1",
        email_smtp_port=smtp.port,
        email_password=bot.password,
        email_ca_file=str(smtp.cert_path),
        routes=(
            Route(channel="slack", space=CHANNEL, session=SESSION),
            Route(channel="email", space=bot.address, session=SESSION),
        ),
        ops_tokens=(f"alice:operator:{OPERATOR}",),
    )


# -- the agent: a scripted model and two tools over the session's name fact --------------------


class NewName(BaseModel):
    """The arguments of ``name_session``."""

    name: str


class SessionFacts:
    """Tools that set and read the session's name through the lane that runs them.

    The store's session facts are the session's name and the labels of entries; the name is
    the one an operator sees. A tool is handed its session and lane by id only (`ToolContext`
    has no handle on the session), so these find the lane in the worker that holds the session
    (the tool runs there); its `SessionTree` writes the fact on the lane's line like any other
    write of the lane, and reads it from the session's store.
    """

    def __init__(self) -> None:
        self.service: Service | None = None

    async def _tree(self, ctx: ToolContext) -> SessionTree:
        assert self.service is not None and self.service.worker is not None
        held = self.service.worker.active[ctx.session_id]
        lane = await held.harness.lane(ctx.lane)
        assert lane is not None
        return lane.session

    async def name_session(self, args: NewName, ctx: ToolContext) -> str:
        await (await self._tree(ctx)).set_name(args.name)
        return f"this session is now called {args.name}"

    async def session_name(self, args: Any, ctx: ToolContext) -> str:
        name = await (await self._tree(ctx)).get_name()
        return f"this session is called {name}"

    def tools(self) -> Sequence[Tool]:
        return [
            Tool(
                name="name_session",
                description="Name the session.",
                execute=self.name_session,
                args_model=NewName,
                replay="safe",  # the same name again changes nothing
            ),
            Tool(
                name="session_name",
                description="The session's name.",
                execute=self.session_name,
                replay="safe",
            ),
        ]


def respond(request: ModelRequest) -> AssistantMessage:
    """``/name <name>`` names the session, ``/name?`` reads its name, anything else is echoed."""
    last = request.messages[-1]
    if isinstance(last, ToolResultMessage):
        return text(f"Done: {message_text(last)}")
    users = [m for m in request.messages if isinstance(m, UserMessage)]
    said = message_text(users[-1]).strip() if users else ""
    if said == "/name?":
        return tool_call("session_name", {})
    if said.startswith("/name "):
        return tool_call("name_session", {"name": said.removeprefix("/name ").strip()})
    return text(f"You said: {said}")


# -- the rig -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dovecot() -> Iterator[Dovecot]:
    """A real Dovecot for this module; each test has users of its own."""
    with Dovecot() as server:
        yield server


@dataclass
class Shared:
    """The running service, its two peers, the people on them and its URL."""

    service: Service
    settings: Settings
    slack: FakeSlack
    dovecot: Dovecot
    smtp: SmtpServer
    bot: MailUser
    person: MailUser
    http: httpx.AsyncClient
    url: str

    async def mention(self, said: str) -> dict[str, Any]:
        """A person mentions the bot in the channel (a signed event); returns the event."""
        event = self.slack.mention_event(CHANNEL, said)
        raw = json.dumps(event_envelope(event))
        headers = {"content-type": "application/json", **signed_headers(raw, SECRET)}
        response = await self.http.post("/slack/events", content=raw.encode(), headers=headers)
        assert response.status_code == 200, response.text
        return event

    async def slack_replies(self, root: str, count: int) -> list[Message]:
        """Wait until the thread under `root` holds `count` bot messages; return them."""
        deadline = time.monotonic() + 15
        while True:
            found = [m for m in self.slack.thread(CHANNEL, root) if m.bot_id]
            if len(found) >= count:
                return found
            assert time.monotonic() < deadline, [m.text for m in found]
            await asyncio.sleep(0.02)

    def write(self, said: str) -> EmailMessage:
        """A mail from the person to the bot, delivered into the bot's INBOX."""
        message = EmailMessage()
        message["From"] = f"Person <{self.person.address}>"
        message["To"] = self.bot.address
        message["Date"] = format_datetime(datetime.now(UTC))
        message["Message-ID"] = make_msgid(domain="example.test")
        message["Subject"] = "What is this session called?"
        message.set_content(said)
        self.dovecot.deliver(self.bot, bytes(message), sender=self.person.address)
        return message

    def mail_replies(self) -> list[EmailMessage]:
        """The mails from the bot in the person's INBOX."""
        return [
            m
            for m in self.dovecot.parsed_messages(self.person)
            if self.bot.address in str(m.get("From", ""))
        ]

    async def wait_mail_replies(self, count: int) -> list[EmailMessage]:
        deadline = time.monotonic() + 15
        while len(found := self.mail_replies()) < count:
            assert time.monotonic() < deadline, [str(m["Subject"]) for m in found]
            await asyncio.sleep(0.05)
        return found

    async def ops(self, capsys: pytest.CaptureFixture[str], *words: str) -> str:
        """``gateway ops WORDS`` in-process against the service: what it prints (it succeeds)."""
        capsys.readouterr()
        argv = ["--url", self.url, "--token", OPERATOR, *words]
        # the command is synchronous: it runs on a thread while this loop serves its requests
        code = await asyncio.to_thread(gateway_ops, argv, None)
        out, err = capsys.readouterr()
        assert (code, err) == (0, ""), (words, err)
        return out


@pytest.fixture(params=["sqlite", "redis"])
async def shared(
    request: pytest.FixtureRequest, tmp_path: Any, dovecot: Dovecot
) -> AsyncIterator[Shared]:
    bot = dovecot.fresh_user("bot")
    person = dovecot.fresh_user("person")
    urls = backend_urls(request.param, request, tmp_path)
    facts = SessionFacts()
    parts = ServiceParts(
        model_client=ScriptedModel(responder=respond), model=MODEL, tools=facts.tools()
    )
    async with FakeSlack(channels=(CHANNEL,)) as slack:
        with SmtpServer(dovecot, username=bot.address, password=bot.password) as smtp:
            settings = _settings(urls, slack, smtp, dovecot, bot)
            service = Service(settings, parts)
            facts.service = service
            await service.start()
            try:
                assert service.app is not None
                async with (
                    serve(service.app) as server,
                    httpx.AsyncClient(base_url=server.url) as http,
                ):
                    yield Shared(
                        service, settings, slack, dovecot, smtp, bot, person, http, server.url
                    )
            finally:
                await service.stop(drain_seconds=2)


def _user_texts(entries: Sequence[StoredEntry]) -> set[tuple[str | None, str]]:
    """The user messages among `entries`, with the lane that wrote each."""
    return {
        (e.lane, message_text(e.entry.message))
        for e in entries
        if isinstance(e.entry, MessageEntry) and isinstance(e.entry.message, UserMessage)
    }


def _plain(message: EmailMessage) -> str:
    body = message.get_body(("plain",))
    assert body is not None
    return str(body.get_content())


# -- the test ------------------------------------------------------------------------------------


async def test_a_slack_thread_and_a_mail_thread_share_one_session(
    shared: Shared, capsys: pytest.CaptureFixture[str]
) -> None:
    # The Slack thread names the session ...
    event = await shared.mention(f"/name {NAME}")
    [named] = await shared.slack_replies(event["ts"], 1)
    assert named.text == f"Done: this session is now called {NAME}"
    assert named.thread_ts == event["ts"]
    # ... and the mail thread, another lane of the same session, reads the name back.
    asked = shared.write("/name?")
    [answer] = await shared.wait_mail_replies(1)
    assert f"Done: this session is called {NAME}" in _plain(answer)
    assert str(answer["In-Reply-To"]) == str(asked["Message-ID"])

    # Each thread is answered once, in its own channel.
    await asyncio.sleep(0.5)  # room for a wrong second answer
    assert [m.ts for m in shared.slack.bot_messages()] == [named.ts]
    assert len(shared.mail_replies()) == 1
    [sent] = shared.smtp.messages
    assert shared.person.address in sent.rcpt_tos

    # The store (opened afresh, no lease) has one session holding both lanes in one tree.
    slack_thread, root = f"{CHANNEL}:{event['ts']}", str(asked["Message-ID"])
    slack_lane, mail_lane = f"slack:{slack_thread}", f"email:{root}"
    repo = open_repo(shared.settings.effective_store_url)
    try:
        assert [meta.id for meta in await repo.list()] == [SESSION]
        storage = await repo.open(SESSION)
        try:
            assert await storage.get_name() == NAME
            lanes = {p.lane: p.leaf_id for p in await storage.get_lanes()}
            assert {slack_lane, mail_lane} <= set(lanes)
            said = _user_texts(await storage.find_entries())
            assert said == {(slack_lane, f"/name {NAME}"), (mail_lane, "/name?")}
            # two branches of the one tree: each lane's path holds its own thread only
            for lane, text_of_lane in ((slack_lane, f"/name {NAME}"), (mail_lane, "/name?")):
                leaf = lanes[lane]
                assert leaf is not None
                path = await storage.find_entries_on_branch(BranchQuery(start=leaf))
                assert _user_texts(path) == {(lane, text_of_lane)}
        finally:
            await storage.close()
    finally:
        await repo.close()

    # The operator sees the session, named, with both lanes and the channel of each.
    auth = {"Authorization": f"Bearer {OPERATOR}"}
    sessions = (await shared.http.get("/api/v1/sessions", headers=auth)).json()["items"]
    assert [(s["id"], s["name"], s["lanes"]) for s in sessions] == [(SESSION, NAME, 2)]
    listed = await shared.http.get("/api/v1/lanes", params={"session": SESSION}, headers=auth)
    assert listed.status_code == 200, listed.text
    threads = {v["lane"]: (v["status"], v["thread"]) for v in listed.json()["items"]}
    assert threads == {
        slack_lane: ("idle", {"channel": "slack", "space": CHANNEL, "thread": slack_thread}),
        mail_lane: ("idle", {"channel": "email", "space": shared.bot.address, "thread": root}),
    }
    out = await shared.ops(capsys, "sessions")
    [row] = out.splitlines()[1:]
    assert row.startswith(f"{SESSION} ") and f" {NAME} " in row, out
    out = await shared.ops(capsys, "lanes", "--session", SESSION)
    rows = {line.split()[1]: line.split() for line in out.splitlines()[1:]}
    assert set(rows) == {slack_lane, mail_lane}, out
    assert all(row[0] == SESSION and row[2] == "idle" for row in rows.values()), out
    for lane, thread in (
        (slack_lane, f"slack {CHANNEL} {slack_thread}"),
        (mail_lane, f"email {shared.bot.address} {root}"),
    ):
        out = await shared.ops(capsys, "lane", f"{SESSION}/{lane}")
        assert re.search(rf"^thread +{re.escape(thread)}$", out, re.M), out
        assert re.search(rf"^session +{SESSION}$", out, re.M), out
