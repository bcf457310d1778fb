"""The kill run: gateway processes SIGKILLed and restarted while messages pour in; then counts.

`kill_run` starts `processes` real `gateway serve` processes on one store and broker (Redis, or
SQLite for one process), posts `messages` messages over `threads` web threads (spread over
several spaces, so over several sessions) through their HTTP API - a client that retries with
the same message id on any error, as a channel would - and SIGKILLs one process every few
seconds, restarting it. When everything has settled it counts, from the store, the channel's
sink (a ledger every process appends its deliveries to; with ``channel="slack"``, the local fake
Slack's threads, the messages being signed events posted to ``/slack/events`` as Slack would,
retried on any failure) and the effects ledger of the ``replay="never"`` tool. One message in
ten charges, one sleeps in a tool (long enough for a kill to land mid-run), one writes text
before its tool call and again after it (a live view replaces its first stream), the rest echo:

* lost / duplicated messages: an accepted message with no user entry, or more than one;
* lost / duplicate replies: a finished run with no delivery at the sink, or delivered twice;
* repeated effects: a ``charge`` call that ran twice.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.utils import make_msgid
from pathlib import Path
from typing import Any

import httpx

from adapters.channel import OutboundKind
from adapters.email.compose import delivery_mark, reply_message_id
from config.settings import default_session
from gateway.broker import open_broker
from gateway.replies import delivery_id, replies_mark
from harness_core import UserMessage, message_text, open_repo
from harness_core.session.entries import MessageEntry
from harness_core.session.records import OperationFinished, OperationStarted, RunIntent
from harness_core.session.types import RecordQuery
from tests.support.fake_slack import FakeSlack, event_envelope, signed_headers
from tests.support.gateway_process import GatewayProcess
from tests.support.mail_servers import Dovecot, MailUser, SmtpServer

AGENT = "tests.support.gateway_agent"
SLACK_SECRET = "kill-run-signing-secret"


@dataclass
class KillRunCounts:
    """What a kill run found (all the "lost", "duplicate" and "repeated" counts must be 0)."""

    processes: int = 0
    threads: int = 0
    sessions: int = 0
    messages: int = 0
    accepted: int = 0
    kills: int = 0
    operations: int = 0
    resumed: int = 0
    """Operations a kill interrupted and another incarnation resumed (``operation_resumed``)."""
    replies_delivered: int = 0
    charges: int = 0
    lost_messages: int = 0
    duplicate_messages: int = 0
    lost_replies: int = 0
    duplicate_replies: int = 0
    repeated_effects: int = 0
    open_operations: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        """The counts on one line."""
        return (
            f"{self.processes} processes, {self.threads} threads in {self.sessions} sessions, "
            f"{self.messages} messages ({self.accepted} accepted), {self.kills} SIGKILLs, "
            f"{self.seconds:.0f} s: {self.operations} runs ({self.resumed} resumed after a kill), "
            f"{self.replies_delivered} replies, "
            f"{self.charges} charges; lost messages {self.lost_messages}, duplicate messages "
            f"{self.duplicate_messages}, lost replies {self.lost_replies}, duplicate replies "
            f"{self.duplicate_replies}, repeated never-effects {self.repeated_effects}, "
            f"open operations {self.open_operations}"
        )

    @property
    def clean(self) -> bool:
        """Nothing lost, duplicated, repeated or left open."""
        return not (
            self.lost_messages
            or self.duplicate_messages
            or self.lost_replies
            or self.duplicate_replies
            or self.repeated_effects
            or self.open_operations
            or self.accepted != self.messages
        )


@dataclass(frozen=True)
class _Message:
    number: int
    space: str
    thread: str
    text: str

    @property
    def client_id(self) -> str:
        return f"c{self.number}"


def _messages(count: int, threads: int, spaces: int) -> list[_Message]:
    made = []
    for number in range(count):
        thread = number % threads
        if number % 10 == 3:
            text = f"/charge {number}"  # a replay="never" effect, counted
        elif number % 10 == 6:
            text = f"/slow {number % 7 * 100 + 200}"  # a run long enough for a kill to hit
        elif number % 10 == 8:
            text = f"/lookup {number % 5 * 100 + 100}"  # two steps that both write text
        else:
            text = f"m{number}"
        made.append(_Message(number, f"s{thread % spaces}", f"t{thread}", text))
    return made


async def kill_run(
    directory: Path,
    urls: Mapping[str, str],
    *,
    processes: int,
    threads: int,
    messages: int,
    spaces: int = 20,
    kill_every_s: tuple[float, float] = (2.0, 4.0),
    min_kills: int = 0,
    send_seconds: float = 40.0,
    send_concurrency: int = 24,
    settle_timeout_s: float = 180.0,
    seed: int = 1,
    slack: FakeSlack | None = None,
    email: EmailRig | None = None,
) -> KillRunCounts:
    """Run it (see the module docstring); the counts. With `slack` (a started fake whose
    channels are ``C0``... one per space) the messages come in as Slack events. The killer
    goes on after the last message is sent until it has killed `min_kills` times (a restart
    takes longer on a busy machine, and the sending may be over before the kills are)."""
    rng = random.Random(seed)
    ledger = directory / "deliveries.jsonl"
    effects = directory / "effects.jsonl"
    settings = {
        **urls,
        "plugin": AGENT,
        "lease_seconds": "3",
        "renew_seconds": "0.5",
        "max_attempts": "20",
        "outbox_lease_seconds": "4",
        "delivery_timeout_seconds": "1.5",
        "worker_slots": "8",
        "log_level": "warning",
    }
    env = {"AGENT_TEST_EFFECTS": str(effects)}
    if email is not None:
        settings |= email.settings()
    elif slack is None:
        env["AGENT_TEST_LEDGER"] = str(ledger)
    else:
        settings |= {
            "slack_bot_token": slack.bot_token,
            "slack_signing_secret": SLACK_SECRET,
            "slack_api_url": slack.api_url,
        }
    gateways = [
        GatewayProcess(f"gw{n}", directory, settings, extra_env=env) for n in range(processes)
    ]
    counts = KillRunCounts(processes=processes, threads=threads, messages=messages)
    began = time.monotonic()
    for gateway in gateways:
        gateway.start(wait_ready_s=0)
    for gateway in gateways:
        await asyncio.to_thread(gateway.wait_ready, 30.0)
    plan = _messages(messages, threads, min(spaces, threads))
    accepted: dict[str, dict[str, Any]] = {}
    sending = asyncio.Event()
    try:
        async with httpx.AsyncClient(timeout=10.0) as http:
            killer = asyncio.ensure_future(
                _killer(gateways, rng, kill_every_s, sending, counts, min_kills)
            )
            send: _WebSender | _SlackSender | _EmailSender
            if email is not None:
                send = _EmailSender(http, gateways, rng, email)
            elif slack is not None:
                send = _SlackSender(http, gateways, rng, slack)
            else:
                send = _WebSender(http, gateways, rng)
            await _send_all(send, plan, accepted, send_concurrency, send_seconds)
            sending.set()
            await killer
        for gateway in gateways:
            if not gateway.alive:
                await asyncio.to_thread(gateway.restart)
        await _settle(urls, settle_timeout_s, gateways, email)
    finally:
        for gateway in gateways:
            await asyncio.to_thread(gateway.stop)
    counts.accepted = len(accepted)
    key: Callable[[str], str] = str
    if email is not None:
        delivered = await asyncio.to_thread(email.replies)
        key = email.message_id_of
    elif slack is None:
        delivered = [(str(line["delivery_id"]), 0) for line in _jsonl(ledger)]
    else:
        delivered = [
            (str(m.metadata["event_payload"]["delivery_id"]), m.metadata["event_payload"]["part"])
            for m in slack.bot_messages()
            if m.metadata
        ]
    await _count(urls, plan, accepted, delivered, effects, counts, key)
    counts.seconds = time.monotonic() - began
    return counts


async def _send_all(
    send: _WebSender | _SlackSender,
    plan: list[_Message],
    accepted: dict[str, dict[str, Any]],
    concurrency: int,
    seconds: float,
) -> None:
    """Send every message, spread evenly over `seconds` (so the killer hits a busy system)."""
    slots = asyncio.Semaphore(concurrency)
    loop = asyncio.get_running_loop()
    began = loop.time()
    interval = seconds / max(len(plan), 1)
    # messages of one thread go in order; threads go side by side
    by_thread: dict[str, list[_Message]] = {}
    for message in plan:
        by_thread.setdefault(f"{message.space}/{message.thread}", []).append(message)

    async def thread_worker(queue: list[_Message]) -> None:
        for message in queue:
            await asyncio.sleep(max(0.0, began + message.number * interval - loop.time()))
            async with slots:
                accepted[message.client_id] = await send(message)

    await asyncio.gather(*(thread_worker(queue) for queue in by_thread.values()))


class _WebSender:
    """Posts a message to the web channel of some live process until one accepts it."""

    def __init__(
        self, http: httpx.AsyncClient, gateways: list[GatewayProcess], rng: random.Random
    ) -> None:
        self.http = http
        self.gateways = gateways
        self.rng = rng

    async def __call__(self, message: _Message) -> dict[str, Any]:
        """Post until accepted (a retry repeats the message id: a duplicate); the acceptance."""
        body = {
            "text": message.text,
            "client_message_id": message.client_id,
            "space": message.space,
        }
        deadline = time.monotonic() + 120
        while True:
            gateway = self.rng.choice([g for g in self.gateways if g.alive] or self.gateways)
            try:
                response = await self.http.post(
                    f"{gateway.url}/web/threads/{message.thread}/messages", json=body
                )
                if response.status_code == 202:
                    answer: dict[str, Any] = response.json()
                    return answer
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"message {message.client_id} was never accepted")
            await asyncio.sleep(0.05)


class _SlackSender(_WebSender):
    """Posts a message as Slack does: into the fake workspace, then a signed event, retried.

    A thread's first message mentions the bot at the top of channel ``C<space>`` and arrives
    twice (``app_mention`` and ``message``, as Slack sends both); the others are replies in
    its thread. Each event is retried with its own ``event_id`` until some process answers 200.
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        gateways: list[GatewayProcess],
        rng: random.Random,
        slack: FakeSlack,
    ) -> None:
        super().__init__(http, gateways, rng)
        self.slack = slack
        self.roots: dict[str, str] = {}

    async def __call__(self, message: _Message) -> dict[str, Any]:
        channel = "C" + message.space.removeprefix("s")
        key = f"{message.space}/{message.thread}"
        if key not in self.roots:
            mention = self.slack.mention_event(channel, message.text)
            self.roots[key] = mention["ts"]
            events = [mention, self.slack.message_event(channel, mention["ts"])]
        else:
            events = [
                self.slack.post_user_message(channel, message.text, thread_ts=self.roots[key])
            ]
        for event in events:
            await self._post(event, message)
        return {
            "session": default_session("slack", channel),
            "lane": f"slack:{channel}:{self.roots[key]}",
        }

    async def _post(self, event: dict[str, Any], message: _Message) -> None:
        raw = json.dumps(event_envelope(event))
        deadline = time.monotonic() + 120
        while True:
            gateway = self.rng.choice([g for g in self.gateways if g.alive] or self.gateways)
            headers = {"content-type": "application/json", **signed_headers(raw, SLACK_SECRET)}
            try:
                response = await self.http.post(
                    f"{gateway.url}/slack/events", content=raw.encode(), headers=headers
                )
                if response.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"message {message.client_id} was never accepted")
            await asyncio.sleep(0.05)


@dataclass
class EmailRig:
    """The mail servers of an email kill run: the bot's mailbox, a person, the SMTP sink."""

    dovecot: Dovecot
    smtp: SmtpServer
    bot: MailUser
    person: MailUser

    def settings(self) -> dict[str, str]:
        return {
            "email_address": self.bot.address,
            "email_imap_host": "127.0.0.1",
            "email_imap_port": str(self.dovecot.port),
            "email_imap_security": "none",
            "email_smtp_host": "127.0.0.1",
            "email_smtp_port": str(self.smtp.port),
            "email_password": self.bot.password,
            "email_ca_file": str(self.smtp.cert_path),
            # one person writes every thread, hundreds of mails a minute: not a loop
            "email_replies_per_address_per_hour": "100000",
            # a send is SMTP plus a local delivery per recipient (dovecot-lda): on a loaded
            # 2-core machine it takes longer than a post to a fake
            "delivery_timeout_seconds": "5",
            "outbox_lease_seconds": "12",
        }

    def replies(self) -> list[tuple[str, int]]:
        """The replies in the person's mailbox (what a person sees), by Message-ID."""
        return [
            (delivery_mark(str(m["Message-ID"])), 0)  # without the thread it carries (D345)
            for m in self.dovecot.parsed_messages(self.person)
        ]

    def message_id_of(self, delivery: str) -> str:
        return reply_message_id(delivery, self.bot.address.rsplit("@", 1)[1])

    def unread(self) -> int:
        return int(self.dovecot.mailbox_status(self.bot)["unseen"])


class _EmailSender(_WebSender):
    """Delivers each message into the bot's mailbox (as an MTA would) with threading headers.

    A thread's first message starts it (a new subject); the others reply to that first one.
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        gateways: list[GatewayProcess],
        rng: random.Random,
        email: EmailRig,
    ) -> None:
        super().__init__(http, gateways, rng)
        self.email = email
        self.roots: dict[str, str] = {}

    async def __call__(self, message: _Message) -> dict[str, Any]:
        key = f"{message.space}/{message.thread}"
        mail = EmailMessage()
        mail["From"] = self.email.person.address
        mail["To"] = self.email.bot.address
        mail["Message-ID"] = make_msgid(f"c{message.number}", domain="example.test")
        mail["Subject"] = f"Thread {key}"
        root = self.roots.setdefault(key, str(mail["Message-ID"]))
        if root != mail["Message-ID"]:
            mail.replace_header("Subject", f"Re: Thread {key}")
            mail["In-Reply-To"] = root
            mail["References"] = root
        mail.set_content(message.text)
        await asyncio.to_thread(self.email.dovecot.deliver, self.email.bot, bytes(mail))
        return {
            "session": default_session("email", self.email.bot.address),
            "lane": f"email:{root}",
        }


async def _killer(
    gateways: list[GatewayProcess],
    rng: random.Random,
    every_s: tuple[float, float],
    sending: asyncio.Event,
    counts: KillRunCounts,
    min_kills: int,
) -> None:
    while not sending.is_set() or counts.kills < min_kills:
        pause = rng.uniform(*every_s)
        if sending.is_set():
            await asyncio.sleep(pause)
        else:
            try:
                await asyncio.wait_for(sending.wait(), timeout=pause)
                continue  # sent: kill only while short of `min_kills`
            except TimeoutError:
                pass
        victim = rng.choice([g for g in gateways if g.alive] or gateways)
        await asyncio.to_thread(victim.kill)
        counts.kills += 1
        await asyncio.sleep(rng.uniform(0.1, 0.6))
        await asyncio.to_thread(victim.restart)


async def _settle(
    urls: Mapping[str, str],
    timeout_s: float,
    gateways: list[GatewayProcess],
    email: EmailRig | None = None,
) -> None:
    """Wait until nothing is pending in the inbox or outbox and no operation is open (and,
    with email, no mail is left unread in the bot's mailbox)."""
    broker = open_broker(urls["broker_url"])
    repo = open_repo(urls["store_url"])
    deadline = time.monotonic() + timeout_s
    try:
        quiet_since: float | None = None
        while True:
            inbox = await broker.inbox.backlog()
            outbox = await broker.outbox.backlog(now_ms=int(time.time() * 1000))
            open_ops = await _open_operations(repo)
            unread = 0 if email is None else await asyncio.to_thread(email.unread)
            if inbox.pending == 0 and outbox.pending == 0 and open_ops == 0 and unread == 0:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > 1.0:  # and stays so
                    return
            else:
                quiet_since = None
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {g.name}\n{g.tail(15)}" for g in gateways)
                raise RuntimeError(
                    f"not settled after {timeout_s}s: inbox {inbox.pending}, outbox "
                    f"{outbox.pending}, open operations {open_ops}\n{tails}"
                )
            await asyncio.sleep(0.25)
    finally:
        await broker.close()
        await repo.close()


async def _open_operations(repo: Any) -> int:
    count = 0
    for meta in await repo.list():
        storage = await repo.open(meta.id)
        try:
            for pointer in await storage.get_lanes():
                count += len(await storage.find_open_operations(pointer.lane, limit=10))
        finally:
            await storage.close()
    return count


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = []
    for raw in path.read_text().splitlines():
        try:
            lines.append(json.loads(raw))
        except ValueError:
            continue  # a torn last line of a killed process: it was not acknowledged
    return lines


async def _count(
    urls: Mapping[str, str],
    plan: list[_Message],
    accepted: dict[str, dict[str, Any]],
    delivered: list[tuple[str, int]],
    effects: Path,
    counts: KillRunCounts,
    key: Callable[[str], str] = str,
) -> None:
    parts = Counter(delivered)
    counts.duplicate_replies = sum(n - 1 for n in parts.values() if n > 1)
    deliveries = Counter(delivery for delivery, _ in parts)
    charged = Counter(str(line["key"]) for line in _jsonl(effects))
    counts.charges = len(charged)
    counts.repeated_effects = sum(n - 1 for n in charged.values() if n > 1)
    expected: dict[tuple[str, str], Counter[str]] = {}
    for message in plan:
        acceptance = accepted.get(message.client_id)
        if acceptance is not None:
            session, lane = str(acceptance["session"]), str(acceptance["lane"])
            expected.setdefault((session, lane), Counter())[message.text] += 1
    counts.sessions = len({session for session, _ in expected})
    broker = open_broker(urls["broker_url"])
    try:  # a reply that went to the dead letters says why here
        for dead in await broker.outbox.list("dead", limit=20):
            counts.problems.append(f"dead letter {dead.id}: {dead.last_error}")
    except BaseException:
        await broker.close()
        raise
    repo = open_repo(urls["store_url"])
    try:
        counts.open_operations = await _open_operations(repo)
        for (session, lane), texts in sorted(expected.items()):
            storage = await repo.open(session)
            try:
                found = Counter(
                    message_text(stored.entry.message)
                    for stored in await storage.read_lane_entries(lane, after=None)
                    if isinstance(stored.entry, MessageEntry)
                    and isinstance(stored.entry.message, UserMessage)
                )
                for text, wanted in texts.items():
                    got = found.get(text, 0)
                    if got < wanted:
                        counts.lost_messages += wanted - got
                        counts.problems.append(f"{session} {lane}: {text!r} missing")
                    elif got > wanted:
                        counts.duplicate_messages += got - wanted
                        counts.problems.append(f"{session} {lane}: {text!r} x{got}")
                counts.resumed += len(
                    await storage.find_records(RecordQuery(lane=lane, type="operation_resumed"))
                )
                for stored in await storage.find_records(
                    RecordQuery(lane=lane, type="operation_finished")
                ):
                    finished = stored.record
                    assert isinstance(finished, OperationFinished)
                    started = await storage.get_record(finished.run_id)
                    if started is None or not isinstance(started.record, OperationStarted):
                        continue
                    if not isinstance(started.record.intent, RunIntent):
                        continue
                    counts.operations += 1
                    kind: OutboundKind = (
                        "reply" if finished.outcome == "completed" else "failure_notice"
                    )
                    if deliveries[key(delivery_id(session, kind, finished.run_id))] == 0:
                        counts.lost_replies += 1
                        why = await _lost(broker, session, lane, kind, finished.run_id, stored.seq)
                        counts.problems.append(
                            f"{session} {lane}: no reply to {finished.run_id} ({why})"
                        )
                    else:
                        counts.replies_delivered += 1
            finally:
                await storage.close()
    finally:
        await repo.close()
        await broker.close()


async def _lost(
    broker: Any, session: str, lane: str, kind: OutboundKind, run_id: str, seq: int
) -> str:
    """Where a reply that never reached the channel stands: its delivery, the thread's mark,
    the session's replies watermark (what a failure needs to be read)."""
    delivery = await broker.outbox.get(delivery_id(session, kind, run_id))
    state = await broker.threads.get(session, lane)
    watermark = await broker.marks.get(replies_mark(session))
    sent = (
        "no delivery"
        if delivery is None
        else (
            f"delivery {delivery.status}, {delivery.attempts} attempts, unknown outcome "
            f"{delivery.unknown_outcome}, last error {delivery.last_error}"
        )
    )
    mark = None if state is None else state.replied_through
    return f"finished at seq {seq}; {sent}; thread mark {mark}; replies watermark {watermark}"
