"""Email end to end: the whole service against a real Dovecot and an aiosmtpd SMTP server.

Mail is delivered into the bot's mailbox with ``dovecot-lda`` (as an MTA would); the gateway
reads it over IMAP (IDLE), answers through SMTP (STARTTLS + AUTH), and the SMTP server delivers
the reply into the sender's Dovecot mailbox, where the tests read it (and thread it with
Dovecot's ``UID THREAD REFERENCES``).
"""

from __future__ import annotations

import asyncio
import base64
import email.policy
import re
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from typing import Any

import httpx
import pytest

from adapters.channel import Outbound
from adapters.email.compose import reply_message_id
from adapters.email.message import email_thread
from config import Settings
from gateway.channels import gateway_settings
from gateway.replies import CUT_OFF_NOTE
from gateway.service import Service, ServiceParts
from harness_core.clock import SystemClock
from tests.support.gateway_agent import CUT_OFF_ANSWER
from tests.support.gateway_rig import lane_texts
from tests.support.mail_servers import Dovecot, MailUser, SmtpServer

AGENT = "tests.support.gateway_agent"


class Mail:
    """A running service with email on, its bot's mailbox and a person writing to it."""

    def __init__(
        self, service: Service, dovecot: Dovecot, smtp: SmtpServer, bot: MailUser, person: MailUser
    ) -> None:
        self.service = service
        self.dovecot = dovecot
        self.smtp = smtp
        self.bot = bot
        self.person = person

    def write(
        self,
        text: str,
        *,
        subject: str = "Deploy window",
        reply_to: EmailMessage | None = None,
        headers: dict[str, str] | None = None,
    ) -> EmailMessage:
        """A mail from the person to the bot, delivered into the bot's INBOX."""
        message = EmailMessage()
        message["From"] = f"Person <{self.person.address}>"
        message["To"] = self.bot.address
        message["Date"] = format_datetime(datetime.now(UTC))
        message["Message-ID"] = make_msgid(domain="example.test")
        if reply_to is not None:
            message["Subject"] = "Re: " + str(reply_to["Subject"]).removeprefix("Re: ")
            message["In-Reply-To"] = str(reply_to["Message-ID"])
            references = str(reply_to.get("References", "")).split()
            message["References"] = " ".join([*references, str(reply_to["Message-ID"])])
        else:
            message["Subject"] = subject
        for name, value in (headers or {}).items():
            message[name] = value
        message.set_content(text)
        self.dovecot.deliver(self.bot, bytes(message), sender=self.person.address)
        return message

    async def replies(self, count: int, timeout_s: float = 15.0) -> list[EmailMessage]:
        """Wait until the person's INBOX holds `count` mails from the bot; return them."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = [
                m
                for m in self.dovecot.parsed_messages(self.person)
                if self.bot.address in str(m.get("From", ""))
            ]
            if len(found) >= count:
                return found
            assert time.monotonic() < deadline, [str(m["Subject"]) for m in found]
            await asyncio.sleep(0.1)

    async def user_texts(self, lane: str) -> list[str]:
        assert self.service.repo is not None
        session = f"email-{self.bot.address}"
        return await lane_texts(self.service.repo, session, lane)


def _settings(tmp_path: Any, dovecot: Dovecot, smtp: SmtpServer, bot: MailUser) -> Settings:
    assert smtp.tls_cert is not None
    return gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"sqlite:///{tmp_path}/web.db",
        plugin=AGENT,
        lease_seconds=6,
        renew_seconds=1,
        email_address=bot.address,
        email_imap_host="127.0.0.1",
        email_imap_port=dovecot.port,
        email_imap_security="none",
        email_smtp_host="127.0.0.1",
        email_smtp_port=smtp.port,
        email_password=bot.password,
        email_ca_file=str(smtp.cert_path),
        routes=({"channel": "email", "space": bot.address, "session": f"email-{bot.address}"},),
    )


@pytest.fixture
async def mail(tmp_path: Any, dovecot: Dovecot) -> AsyncIterator[Mail]:
    bot = dovecot.fresh_user("bot")
    person = dovecot.fresh_user("person")
    with SmtpServer(dovecot, username=bot.address, password=bot.password) as smtp:
        service = Service(_settings(tmp_path, dovecot, smtp, bot))
        await service.start()
        mail = Mail(service, dovecot, smtp, bot, person)
        try:
            yield mail
        finally:
            # a test may have restarted the service: the one running now is stopped too
            for started in dict.fromkeys((service, mail.service)):
                await started.stop(drain_seconds=2)


def _text(message: EmailMessage) -> str:
    body = message.get_body(("plain",))
    assert body is not None
    return str(body.get_content())


def _adapter(mail: Mail) -> Any:
    return mail.service.adapters["email"]


async def _until(check: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


async def test_a_mail_is_answered_in_its_thread(mail: Mail) -> None:
    asked = mail.write("what is our deploy window?")
    [reply] = await mail.replies(1)
    assert str(reply["Subject"]) == "Re: Deploy window"
    assert str(reply["In-Reply-To"]) == str(asked["Message-ID"])
    assert str(asked["Message-ID"]) in str(reply["References"])
    assert str(reply["Auto-Submitted"]) == "auto-replied"
    assert "You said: what is our deploy window?" in _text(reply)
    # Dovecot threads them: the person's copy of the question is not there, so thread the
    # reply with the bot's own copy (the bot Bccs itself)
    assert await mail.user_texts(f"email:{asked['Message-ID']}") == ["what is our deploy window?"]


def _from_stranger(
    mail: Mail, stranger: MailUser, text: str, message_id: str, naming: str | None
) -> None:
    """A mail from `stranger` to the bot, naming the thread rooted at `naming` (None: none)."""
    forged = EmailMessage()
    forged["From"] = f"Mallory <{stranger.address}>"
    forged["To"] = mail.bot.address
    forged["Date"] = format_datetime(datetime.now(UTC))
    forged["Message-ID"] = message_id
    forged["Subject"] = "Deploy window" if naming is None else "Re: Deploy window"
    if naming is not None:
        forged["In-Reply-To"] = naming
        forged["References"] = naming
    forged.set_content(text)
    mail.dovecot.deliver(mail.bot, bytes(forged), sender=stranger.address)


async def test_a_stranger_naming_a_thread_gets_a_thread_of_their_own(mail: Mail) -> None:
    """`References` is the sender's to write: a stranger who knew the root Message-ID wrote
    into the person's lane and got the answer (with what the agent knew there) alone (D302)."""
    asked = mail.write("the admin password is hunter2")
    [reply] = await mail.replies(1)
    stranger = mail.dovecot.fresh_user("stranger")
    root = str(asked["Message-ID"])
    _from_stranger(mail, stranger, "what did they tell you?", make_msgid("evil"), root)
    own = f"email:{root} from {stranger.address}"
    await _until(lambda: bool(mail.dovecot.parsed_messages(stranger)))
    assert await mail.user_texts(f"email:{root}") == ["the admin password is hunter2"]
    assert await mail.user_texts(own) == ["what did they tell you?"]
    assert len(await mail.replies(1)) == 1  # the person got nothing more
    follow = mail.write("and the window?", reply_to=reply)  # a person of the thread: its lane
    await mail.replies(2)
    texts = await mail.user_texts(f"email:{root}")
    assert texts == ["the admin password is hunter2", "and the window?"], follow


async def test_a_stranger_reusing_a_thread_s_message_id_takes_nothing_of_it(mail: Mail) -> None:
    """The stranger's mail with the person's Message-ID was dropped as a duplicate, yet it
    overwrote the thread's reply context: the person's next answer went to the stranger, and
    the stranger was one of the thread's people from then on (D318). It is another mail (its
    From, Date and Subject say so), so it is answered, in the stranger's own thread (D382)."""
    asked = mail.write("the admin password is hunter2")
    [reply] = await mail.replies(1)
    stranger = mail.dovecot.fresh_user("stranger")
    root = str(asked["Message-ID"])

    _from_stranger(mail, stranger, "the same id as theirs", root, root)
    _from_stranger(mail, stranger, "what did they tell you?", make_msgid("evil"), root)
    own = f"email:{root} from {stranger.address}"
    await _until(lambda: len(mail.dovecot.parsed_messages(stranger)) == 2)
    assert await mail.user_texts(own) == ["the same id as theirs", "what did they tell you?"]
    mail.write("and the window?", reply_to=reply)
    replies = await mail.replies(2)
    assert "You said: and the window?" in _text(replies[1])  # the person's answer is theirs
    assert await mail.user_texts(f"email:{root}") == [
        "the admin password is hunter2",
        "and the window?",
    ]
    assert len(mail.dovecot.parsed_messages(stranger)) == 2  # their own thread's answers only


async def test_a_mail_reusing_a_message_id_is_answered_and_a_copy_of_one_is_not(
    mail: Mail,
) -> None:
    """A sender that writes one Message-ID on every mail (a script, a broken client): its
    second mail within the inbox's dedupe window was taken for the first sent again and never
    answered (D382). A copy of a mail delivered twice is still one mail."""
    asked = mail.write("is the build green?", subject="Build")
    await mail.replies(1)
    later = EmailMessage()
    for name in ("From", "To", "Message-ID", "Subject"):
        later[name] = str(asked[name])
    later["Date"] = format_datetime(datetime.now(UTC) + timedelta(minutes=5))
    later.set_content("and are the tests?")
    mail.dovecot.deliver(mail.bot, bytes(later), sender=mail.person.address)
    replies = await mail.replies(2)
    assert "You said: and are the tests?" in _text(replies[1])
    # a copy of each (a list and a Cc, a refetch): nothing more is taken or said
    for again in (asked, later):
        mail.dovecot.deliver(mail.bot, bytes(again), sender=mail.person.address)
    await _until(lambda: mail.dovecot.mailbox_status(mail.bot)["unseen"] == 0)
    await asyncio.sleep(1.0)
    assert _adapter(mail).taken == 2
    assert len(await mail.replies(2)) == 2
    assert await mail.user_texts(f"email:{asked['Message-ID']}") == [
        "is the build green?",
        "and are the tests?",
    ]


async def test_a_thread_keeps_its_people_when_a_copied_colleague_answers_the_bot_alone(
    mail: Mail,
) -> None:
    """A thread's people were its newest message's alone: after the colleague in Cc answered
    the bot without the author, the author's next reply was moved out of the thread they had
    started, and the agent lost the conversation (an outside probe)."""
    colleague = mail.dovecot.fresh_user("colleague")
    asked = mail.write("the budget is 5000 EUR", headers={"Cc": colleague.address})
    [reply] = await mail.replies(1)
    root = str(asked["Message-ID"])
    answer = EmailMessage()  # the colleague's answer to the bot, to the bot alone
    answer["From"] = f"Carol <{colleague.address}>"
    answer["To"] = mail.bot.address
    answer["Date"] = format_datetime(datetime.now(UTC))
    answer["Message-ID"] = make_msgid(domain="example.test")
    answer["Subject"] = "Re: Deploy window"
    answer["In-Reply-To"] = str(reply["Message-ID"])
    answer["References"] = f"{root} {reply['Message-ID']}"
    answer.set_content("and mine is 3000")
    mail.dovecot.deliver(mail.bot, bytes(answer), sender=colleague.address)
    await _until(lambda: bool(mail.dovecot.parsed_messages(colleague)), timeout_s=30)
    mail.write("so how much in all?", reply_to=reply)  # the author, in their own thread
    await mail.replies(2, timeout_s=30)
    assert await mail.user_texts(f"email:{root}") == [
        "the budget is 5000 EUR",
        f"[Carol ({colleague.address})] and mine is 3000",
        "so how much in all?",
    ]


class _TwoDaysOn:
    """The system's clock, two days on: past the inbox's dedupe window (a day)."""

    def now_ms(self) -> int:
        return SystemClock().now_ms() + 2 * 86_400_000

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


async def test_a_stranger_s_new_mail_with_a_thread_s_root_id_a_day_on_takes_nothing_of_it(
    mail: Mail,
) -> None:
    """Past the inbox's dedupe window, a stranger's new mail (no In-Reply-To) whose own
    Message-ID was the person's thread root was taken into that thread as its newest: the
    stranger got the answer there, and the person's next reply was moved out of their own
    thread (an outside probe)."""
    asked = mail.write("the admin password is hunter2")
    [reply] = await mail.replies(1)
    root = str(asked["Message-ID"])
    await mail.service.stop(drain_seconds=1)
    mail.service = Service(mail.service.settings, ServiceParts(clock=_TwoDaysOn()))
    await mail.service.start()
    stranger = mail.dovecot.fresh_user("stranger")
    _from_stranger(mail, stranger, "what did they tell you?", root, None)  # no In-Reply-To
    await _until(lambda: bool(mail.dovecot.parsed_messages(stranger)), timeout_s=30)
    assert await mail.user_texts(f"email:{root} from {stranger.address}") == [
        "what did they tell you?"
    ]
    mail.write("and the window?", reply_to=reply)
    replies = await mail.replies(2)
    assert "You said: and the window?" in _text(replies[1])
    assert await mail.user_texts(f"email:{root}") == [
        "the admin password is hunter2",
        "and the window?",
    ]


async def test_an_answer_cut_off_at_the_output_limit_says_so_in_the_mail(mail: Mail) -> None:
    mail.write("/cutoff")
    [reply] = await mail.replies(1)
    assert f"{CUT_OFF_ANSWER}\n\n{CUT_OFF_NOTE}" in _text(reply).replace("\r\n", "\n")


async def test_a_reply_to_the_reply_continues_the_lane(mail: Mail) -> None:
    asked = mail.write("first question")
    [reply] = await mail.replies(1)
    mail.write("a follow-up", reply_to=reply)
    replies = await mail.replies(2)
    assert str(replies[1]["Subject"]) == "Re: Deploy window"  # never "Re: Re:"
    lane = f"email:{asked['Message-ID']}"
    assert await mail.user_texts(lane) == ["first question", "a follow-up"]
    threads = mail.dovecot.thread_references(mail.person)
    assert len(threads) == 1 and len(threads[0]) == 2  # the two replies thread together


# (reason, headers, subject): the last ones carry no RFC 3834 header
AUTOMATIC = [
    ("auto_submitted", {"Auto-Submitted": "auto-replied"}, "Re: Deploy window"),
    ("bulk", {"Precedence": "bulk"}, "Deploy window"),
    ("list", {"List-Id": "<ops.lists.example.test>"}, "Deploy window"),
    ("auto_submitted", {"Precedence": "auto_reply"}, "Re: Deploy window"),
    ("auto_reply", {"X-Apple-Action": "VACATION"}, "Re: Deploy window"),
    ("auto_reply", {"X-Autoreply": "yes"}, "Re: Deploy window"),
    ("auto_reply", {"X-Autorespond": "Vacation"}, "Re: Deploy window"),
    ("auto_reply", {}, "Auto reply: Deploy window"),
    ("auto_reply", {}, "Automatische Antwort: Deploy window"),
]


@pytest.mark.parametrize(
    ("kind", "headers", "subject"),
    AUTOMATIC,
    ids=[next(iter(c[1]), c[2].split(":")[0]) for c in AUTOMATIC],
)
async def test_automatic_mail_is_not_answered(
    mail: Mail, kind: str, headers: dict[str, str], subject: str
) -> None:
    mail.write("I am out of office", subject=subject, headers=headers)
    await _until(lambda: _adapter(mail).skipped[kind] == 1)
    await asyncio.sleep(0.5)
    assert mail.dovecot.parsed_messages(mail.person) == []


async def test_a_message_the_server_cannot_read_is_skipped_and_its_neighbours_answered(
    mail: Mail,
) -> None:
    """Dovecot drops the connection on a FETCH it cannot serve (here: a file it may not read);
    the same UID was fetched again at every reconnect, and no later mail was ever answered."""
    mail.write("before the bad one")
    await mail.replies(1)
    local, domain = mail.bot.address.split("@")
    bad = EmailMessage()
    bad["From"] = mail.person.address
    bad["To"] = mail.bot.address
    bad["Subject"] = "Unreadable"
    bad["Message-ID"] = make_msgid(domain="example.test")
    bad.set_content("the server cannot read this")
    path = mail.dovecot.root / "mail" / domain / local / "new" / f"{int(time.time())}.bad.host"
    path.write_bytes(bytes(bad))
    path.chmod(0o000)  # Dovecot's mail process is not root: it cannot open it
    await asyncio.sleep(1)
    mail.write("after the bad one", subject="After")
    replies = await mail.replies(2, timeout_s=60)
    assert "You said: after the bad one" in _text(replies[1])
    assert _adapter(mail).skipped["unreadable"] == 1


async def test_a_mail_our_own_code_fails_on_is_skipped_after_three_tries_not_for_ever(
    mail: Mail, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault of the gateway's own on one mail (here, injected: a mail whose attachment
    could not be decoded raised one) was retried for ever, and no mail after it was answered."""
    from adapters.email import channel as module

    taken = module.EmailChannel._with_files

    async def failing(self: Any, sink: Any, inbound: Any, raw: bytes, key: str) -> Any:
        if b"Subject: Poison" in raw:
            raise ValueError("address parts cannot contain CR or LF")
        return await taken(self, sink, inbound, raw, key)

    monkeypatch.setattr(module.EmailChannel, "_with_files", failing)
    mail.write("this one fails", subject="Poison")
    await asyncio.sleep(0.5)
    mail.write("after the poison", subject="After")
    [reply] = await mail.replies(1, timeout_s=30)  # the poison's own: none
    assert "You said: after the poison" in _text(reply)
    assert _adapter(mail).skipped["unreadable"] == 1


async def test_a_dropped_idle_connection_reconnects_and_misses_nothing(mail: Mail) -> None:
    adapter = _adapter(mail)
    mail.write("before the drop")
    await mail.replies(1)
    before = adapter.connections
    assert mail.dovecot.kick(mail.bot)
    mail.write("right after the drop", subject="Second")
    await mail.replies(2)
    assert adapter.connections > before


async def test_a_restart_takes_no_mail_twice(mail: Mail, tmp_path: Any) -> None:
    mail.write("one")
    await mail.replies(1)
    await mail.service.stop(drain_seconds=1)
    mail.write("two", subject="While down")
    mail.service = Service(mail.service.settings)
    await mail.service.start()
    await mail.replies(2)
    await asyncio.sleep(1.0)
    assert len(await mail.replies(2)) == 2


async def test_an_unknown_send_outcome_is_reconciled_not_sent_twice(mail: Mail) -> None:
    mail.smtp.lose_response_after_data()
    mail.write("lost answer")
    await mail.replies(1, timeout_s=20)
    await asyncio.sleep(3.0)  # the retry reconciles (finds its Message-ID) instead of sending
    assert len(await mail.replies(1)) == 1
    assert len(mail.smtp.messages) == 1


async def test_an_attempt_sent_before_ids_carried_their_thread_is_found(mail: Mail) -> None:
    """An attempt of unknown outcome made before the upgrade (D345) went out under the id
    without its thread: the retry after the upgrade looked for the new id only, found
    nothing, and would have sent the reply a second time."""
    adapter = _adapter(mail)
    outbound = Outbound(
        delivery_id="reply:upgrade:run-1",
        thread=email_thread(mail.bot.address, "<root-before@example.test>"),
        kind="reply",
        text="answered before the upgrade",
        reply_context={"from": f"Person <{mail.person.address}>"},
    )
    assert await adapter.reconcile(outbound) in ("absent", "unknown")
    sent = EmailMessage()
    sent["From"] = mail.bot.address
    sent["To"] = mail.person.address
    sent["Subject"] = "Re: before"
    sent["Message-ID"] = reply_message_id(outbound.delivery_id, adapter.domain)  # no thread
    sent.set_content("answered before the upgrade")
    mail.dovecot.deliver(mail.bot, bytes(sent), sender=mail.bot.address)  # its Bcc copy
    assert await adapter.reconcile(outbound) == "delivered"


async def test_a_lost_answer_from_a_queueing_server_is_not_sent_twice(mail: Mail) -> None:
    """The server took the reply, lost its 250, and delivered it from its queue 5 s later:
    the retry looked twice, a second apart, found nothing, and sent it again."""
    mail.smtp.lose_response_after_data(queue_s=5.0)
    mail.write("queued answer")
    await mail.replies(1, timeout_s=30)
    await asyncio.sleep(8.0)  # room for a wrong second copy (a retry would have come by now)
    assert len(await mail.replies(1)) == 1
    assert [m.outcome for m in mail.smtp.transactions] == ["response_lost"]


async def test_a_lost_answer_is_not_sent_twice_by_the_process_after_a_restart(
    mail: Mail,
) -> None:
    """D408: the window in which a reply not found yet is "unknown" lived only in the process
    that lost the answer: the next process looked twice, a second apart, and sent the reply
    again while the first copy was still in the server's queue (an outside probe)."""
    mail.smtp.lose_response_after_data(queue_s=6.0)
    mail.write("lost, then a restart")
    await _until(lambda: [m.outcome for m in mail.smtp.transactions] == ["response_lost"])
    await mail.service.stop(drain_seconds=0.5)  # its retry is the next process's
    mail.service = Service(mail.service.settings)
    await mail.service.start()
    broker = mail.service.broker
    assert broker is not None
    deadline = time.monotonic() + 60
    while await broker.outbox.list("pending"):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.5)
    [delivery] = await broker.outbox.list("delivered")
    assert delivery.attempts >= 2  # reconciled in the new process, not sent
    assert len(await mail.replies(1)) == 1
    assert [m.outcome for m in mail.smtp.transactions] == ["response_lost"]


async def test_smtp_refusing_then_accepting_delivers_once(mail: Mail) -> None:
    mail.smtp.refuse_next(code=451, message="4.3.0 try again later")
    mail.write("temporary trouble")
    await mail.replies(1, timeout_s=20)
    await asyncio.sleep(1.0)
    assert len(await mail.replies(1)) == 1


async def test_a_greylisted_recipient_is_tried_again_not_given_up(mail: Mail) -> None:
    """A 450 for every recipient made a dead letter at once: greylisting says "later"."""
    mail.smtp.refuse_next(code=450, message="4.2.0 Greylisted, try again later", times=2, at="RCPT")
    mail.write("greylisted")
    await mail.replies(1, timeout_s=20)
    await asyncio.sleep(1.0)
    assert len(await mail.replies(1)) == 1


async def test_oversized_mail_is_said_to_be_unread_and_malformed_mail_skipped(
    mail: Mail,
) -> None:
    adapter = _adapter(mail)
    adapter.max_message_bytes = 50_000
    big = f"From: Person <{mail.person.address}>\r\nTo: {mail.bot.address}\r\n"
    big += "Message-ID: <big-1@example.test>\r\nSubject: the big log\r\n\r\n"
    mail.dovecot.deliver(mail.bot, big.encode() + b"x" * 60_000, sender=mail.person.address)
    bulk = big.replace("big-1", "big-2").replace("Subject:", "Precedence: bulk\r\nSubject:")
    mail.dovecot.deliver(mail.bot, bulk.encode() + b"x" * 60_000, sender=mail.person.address)
    mail.dovecot.deliver(mail.bot, b"\x00\xff not a mail at all \xfe")
    mail.write("still answered")
    replies = await mail.replies(3)  # the notice, the answer to the big one, the neighbour's
    await _until(lambda: adapter.skipped["bulk"] == 1)
    texts = [_text(m) for m in replies]
    [notice] = [t for t in texts if "too large for me to read" in t]
    assert re.search(r"\(6\d\.\d KB; at most 50\.0 KB is read\)", notice)  # before: no word
    assert any("still answered" in t for t in texts)
    [got] = await mail.user_texts("email:<big-1@example.test>")
    assert re.fullmatch(
        r"the big log\n\[This message was too large to read \(6\d\.\d KB; at most 50\.0 KB "
        r"is read\): you have its subject only\. The sender has been told\.\]",
        got,
    )


SECRET = "a-link-secret-of-at-least-32-characters!"
OPERATOR = "operator-secret-abcdefghijklmnop"


@pytest.fixture
async def approving(tmp_path: Any, dovecot: Dovecot) -> AsyncIterator[Mail]:
    """Email on, with the person as an approver and signed links."""
    bot = dovecot.fresh_user("bot")
    person = dovecot.fresh_user("approver")
    with SmtpServer(dovecot, username=bot.address, password=bot.password) as smtp:
        settings = _settings(tmp_path, dovecot, smtp, bot).replace(
            email_approvers=(person.address,),
            email_link_secret=SECRET,
            public_url="https://gateway.example.test",
            ops_tokens=(f"alice:operator:{OPERATOR}",),
        )
        service = Service(settings)
        await service.start()
        try:
            yield Mail(service, dovecot, smtp, bot, person)
        finally:
            await service.stop(drain_seconds=2)


def _links(message: EmailMessage) -> dict[str, str]:
    found = re.findall(r"https://gateway\.example\.test(/email/approvals/\S+)", _text(message))
    return {("approve" if n == 0 else "deny"): path for n, path in enumerate(found[:2])}


async def test_an_approver_decides_from_the_signed_link_once(
    approving: Mail, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="adapters.email")
    mail = approving
    mail.write("/deploy prod")
    [asked] = await mail.replies(1)
    assert 'Replying "approve"' in _text(asked)
    links = _links(asked)
    assert set(links) == {"approve", "deny"}
    assert mail.service.app is not None
    transport = httpx.ASGITransport(app=mail.service.app)
    async with httpx.AsyncClient(
        transport=transport, base_url="https://gateway.example.test"
    ) as http:
        page = await http.get(links["approve"])  # what a mail scanner does: decides nothing
        assert page.status_code == 200 and "<form" in page.text
        await asyncio.sleep(0.5)
        assert len(await mail.replies(1)) == 1
        decided = await http.post(links["approve"])
        assert decided.status_code == 200, decided.text
        replies = await mail.replies(2)
        assert "Done: deployed prod" in _text(replies[1])
        again = await http.post(links["deny"])  # the same batch again: refused, says who
        assert again.status_code == 409 and "already approved" in again.text
        path, _, query = links["approve"].partition("?")
        tampered = path[:-3] + ("AAA" if not path.endswith("AAA") else "BBB") + "?" + query
        assert (await http.post(tampered)).status_code == 400
        other_lane = path + "?" + query.replace("lane=email", "lane=email%3Cx%40y%3E")
        assert (await http.post(other_lane)).status_code == 400
        non_ascii = path + "?" + query.replace("sig=", "sig=%C3%A9")
        assert (await http.post(non_ascii)).status_code == 400
    # a forged link left no line at all: an operator sees each attempt now
    said = [r.getMessage() for r in caplog.records if "approval link" in r.getMessage()]
    assert said == ["email approval link refused"] * 3


async def test_a_request_closed_elsewhere_is_said_in_the_thread_and_its_links_refused(
    approving: Mail,
) -> None:
    mail = approving
    mail.write("/deploy prod")
    [asked] = await mail.replies(1)
    links = _links(asked)
    assert mail.service.app is not None
    transport = httpx.ASGITransport(app=mail.service.app)
    async with httpx.AsyncClient(
        transport=transport, base_url="https://gateway.example.test"
    ) as http:
        headers = {"Authorization": f"Bearer {OPERATOR}", "Idempotency-Key": "mail-abort"}
        lanes = (await http.get("/api/v1/lanes", headers=headers)).json()["items"]
        [lane] = [v for v in lanes if v["suspended"] == "approval"]
        aborted = await http.post(f"/api/v1/lanes/{lane['id']}/abort", headers=headers)
        assert aborted.status_code == 200, aborted.text
        replies = await mail.replies(2)  # mail cannot be edited: the close is said in the thread
        closed = replies[1]
        assert "The approval request for deploy is closed: stopped by operator:alice" in _text(
            closed
        )
        assert str(closed["In-Reply-To"]) == str(asked["In-Reply-To"])  # in the same thread
        assert not closed.get_all("Cc")  # to the person the request went to, alone
        late = await http.post(links["approve"])
        assert late.status_code == 409 and "stopped by operator:alice" in late.text
        await asyncio.sleep(0.5)
        assert len(await mail.replies(2)) == 2  # the refused click sent nothing


async def test_an_author_who_is_not_an_approver_gets_no_links(mail: Mail) -> None:
    mail.write("/deploy prod")
    [asked] = await mail.replies(1)
    assert _links(asked) == {}
    assert "deploy" in _text(asked)


async def test_a_uidvalidity_change_resyncs_by_message_id(mail: Mail) -> None:
    mail.write("before the change")
    await mail.replies(1)
    await mail.service.stop(drain_seconds=1)
    # the worst case: a taken message is unseen again (as if the \Seen never reached the
    # server), and the folder's UIDs were renumbered
    mail.dovecot.doveadm(
        "flags", "remove", "-u", mail.bot.address, "\\Seen", "mailbox", "INBOX", "all"
    )
    mail.dovecot.set_uidvalidity(mail.bot)
    mail.write("after the change", subject="New subject")
    mail.service = Service(mail.service.settings)
    await mail.service.start()
    replies = await mail.replies(2)
    await asyncio.sleep(1.5)
    assert len(await mail.replies(2)) == 2  # the first mail was recognized: not answered again
    assert "after the change" in _text(replies[1])
    adapter = _adapter(mail)
    mark = await adapter.sink.get_mark(adapter.mark_name)
    assert mark.split(":")[0] == str(mail.dovecot.mailbox_status(mail.bot)["uidvalidity"])


async def test_a_changed_uidvalidity_while_idling_reconnects(mail: Mail) -> None:
    mail.write("first")
    await mail.replies(1)
    adapter = _adapter(mail)
    before = adapter.connections
    mail.dovecot.set_uidvalidity(mail.bot)
    mail.write("second", subject="Another")
    await mail.replies(2)
    assert adapter.connections > before


async def _dead_letters(mail: Mail, count: int, timeout_s: float = 15.0) -> list[Any]:
    broker = mail.service.broker
    assert broker is not None
    deadline = time.monotonic() + timeout_s
    while True:
        dead = await broker.outbox.list(status="dead")
        if len(dead) >= count:
            return list(dead)
        assert time.monotonic() < deadline, dead
        await asyncio.sleep(0.1)


async def test_a_refused_recipient_is_a_dead_letter_with_the_reason(mail: Mail) -> None:
    mail.smtp.refuse_recipient(mail.person.address, code=550)
    mail.write("to a closed mailbox")
    [dead] = await _dead_letters(mail, 1)
    assert dead.last_error == "recipients refused (550)"
    assert dead.attempts == 1  # not retried


async def test_a_copy_refused_for_later_is_sent_again_to_that_recipient_only(mail: Mail) -> None:
    """A 4xx for one of the copied (greylisting, a full mailbox) was taken for delivered: the
    person had the answer, the colleague in Cc never got it, and only a count was logged (an
    outside probe)."""
    colleague = mail.dovecot.fresh_user("colleague")
    mail.smtp.refuse_recipient(colleague.address, code=450, message="4.2.1 Mailbox busy")
    mail.write("the numbers, please", headers={"Cc": colleague.address})
    await mail.replies(1)
    broker = mail.service.broker
    assert broker is not None
    await _until(lambda: bool(mail.smtp.messages))
    deadline = time.monotonic() + 30
    while True:  # the attempt is settled a moment after the server took the message
        [pending] = await broker.outbox.list(status="pending")
        if pending.last_error is not None:
            break
        assert time.monotonic() < deadline, pending
        await asyncio.sleep(0.05)
    assert "recipients refused (450)" in pending.last_error
    mail.smtp.reset_faults()  # the busy mailbox takes mail again
    deadline = time.monotonic() + 30
    while not mail.dovecot.parsed_messages(colleague):
        assert time.monotonic() < deadline, await broker.outbox.list(status="pending")
        await asyncio.sleep(0.2)
    [copy] = mail.dovecot.parsed_messages(colleague)
    assert "You said: the numbers, please" in _text(copy)
    assert len(await mail.replies(1)) == 1  # the person got it once, not again
    sent_to = [m.rcpt_tos for m in mail.smtp.messages]
    assert sent_to[-1] == (colleague.address,), sent_to  # the retry: the refused one only


async def test_a_refused_smtp_login_is_a_dead_letter_not_an_endless_retry(mail: Mail) -> None:
    mail.smtp.fail_auth()
    mail.write("while the password is wrong")
    [dead] = await _dead_letters(mail, 1)
    assert dead.last_error is not None
    assert dead.last_error.startswith(f"SMTP server 127.0.0.1:{mail.smtp.port} refused the login")
    assert dead.attempts == 1


async def test_a_thread_over_its_reply_limit_stops_being_answered(mail: Mail) -> None:
    _adapter(mail).replies_per_hour = 1
    asked = mail.write("first")
    [reply] = await mail.replies(1)
    mail.write("second", reply_to=reply)
    [dead] = await _dead_letters(mail, 1)
    assert dead.last_error.startswith("reply rate limit")
    assert len(await mail.replies(1)) == 1
    assert await mail.user_texts(f"email:{asked['Message-ID']}") == ["first", "second"]


async def test_an_unthreaded_responder_is_stopped_by_the_per_person_bound(mail: Mail) -> None:
    """A responder answering "Re: ..." without In-Reply-To starts a thread with each answer:
    the per-thread bound never stopped it (26 of 26 answered in a probe)."""
    _adapter(mail).replies_per_address = 3
    for n in range(4):
        mail.write(f"auto answer {n}", subject=f"Re: Ticket {n}")
    [dead] = await _dead_letters(mail, 1)
    assert dead.last_error == "reply rate limit: 3 replies to this address within an hour"
    assert len(await mail.replies(3)) == 3


async def test_a_server_without_idle_is_polled(mail: Mail, monkeypatch: pytest.MonkeyPatch) -> None:
    from adapters.email.imap import ImapConnection

    monkeypatch.setattr(ImapConnection, "has_idle", property(lambda self: False))
    adapter = _adapter(mail)
    adapter.poll_seconds = 0.3
    mail.dovecot.kick(mail.bot)  # the next connection polls
    await asyncio.sleep(0.5)
    mail.write("polled, not pushed")
    [reply] = await mail.replies(1)
    assert "polled, not pushed" in _text(reply)


async def test_a_display_name_that_decodes_to_a_line_break_is_answered_to_everyone(
    mail: Mail,
) -> None:
    carl = mail.dovecot.fresh_user("carl")
    evil = base64.b64encode(b"Person\r\nBcc: mallory@evil.example").decode()
    raw = (
        f"From: =?utf-8?b?{evil}?= <{mail.person.address}>\r\n"
        f"To: {mail.bot.address}\r\n"
        f"Cc: =?utf-8?q?Carl=0D=0AX-Injected:_yes?= <{carl.address}>\r\n"
        f"Subject: Deploy window\r\nMessage-ID: <display-name-1@example.test>\r\n"
        f"Date: {format_datetime(datetime.now(UTC))}\r\n\r\nwhat is our deploy window?\r\n"
    ).encode()
    mail.dovecot.deliver(mail.bot, raw, sender=mail.person.address)
    [reply] = await mail.replies(1)  # before: a dead letter ("cannot compose the reply")
    assert "You said: what is our deploy window?" in _text(reply)
    # the SMTP server records the transaction once dovecot-lda has delivered it: a moment later
    await _until(lambda: len(mail.smtp.messages) == 1)
    [sent] = mail.smtp.messages
    assert sorted(sent.rcpt_tos) == sorted([mail.bot.address, mail.person.address, carl.address])
    head = sent.data.split(b"\r\n\r\n", 1)[0]
    assert not re.search(rb"^(?:Bcc|X-Injected):", head, re.MULTILINE | re.IGNORECASE)
    assert [str(m["Message-ID"]) for m in mail.dovecot.parsed_messages(carl)] == [
        str(reply["Message-ID"])
    ]


_LIMIT = 40_000
_QUOTE = "\n\nOn Mon, 30 Nov 2026 at 14:00, Agent <bot@example.test> wrote:\n"


def _quoted(lines: int) -> str:
    return _QUOTE + "".join(f"> an earlier line of the thread, number {n}\n" for n in range(lines))


def _html_mail(html: str) -> EmailMessage:
    message = EmailMessage()
    message.set_content(html, subtype="html")
    return message


# (case, subject, body as the person wrote it (or an HTML mail), the new text the agent
# gets before any note, (kept, total) or None). Characters, not bytes, are counted, and only
# the new text: quoted history is removed before the count (D169).
MAIL_CUTS: list[tuple[str, str, str | EmailMessage, str, tuple[int | None, ...] | None]] = [
    ("just-under", "Log", "a" * (_LIMIT - 1), "a" * (_LIMIT - 1), None),
    ("at", "Log", "a" * _LIMIT, "a" * _LIMIT, None),
    ("just-over", "Log", "a" * (_LIMIT + 1), "a" * _LIMIT, (_LIMIT, _LIMIT + 1)),
    ("accented-at", "Log", "é" * _LIMIT, "é" * _LIMIT, None),
    ("emoji-over", "Log", "😀" * (_LIMIT + 1), "😀" * _LIMIT, (_LIMIT, _LIMIT + 1)),
    # the limit falls inside the quoted history, which is removed anyway: nothing is cut
    ("limit-inside-the-quote", "Re: Log", "b" * 39_990 + _quoted(40), "b" * 39_990, None),
    ("long-quote", "Re: Log", "short answer" + _quoted(2_000), "short answer", None),
    # a forward keeps its whole text (the forwarded message is what is to be read)
    ("forward-over", "Fwd: Log", "c" * (_LIMIT + 5), "c" * _LIMIT, (_LIMIT, _LIMIT + 5)),
    (
        "html-over",
        "Log",
        _html_mail(f"<p>{'d' * (_LIMIT + 2)}</p>"),
        "d" * _LIMIT,
        (_LIMIT, _LIMIT + 2),
    ),
    # an inline image's data made the HTML's end unread before: the text after it is read
    (
        "html-after-an-inline-image",
        "Log",
        _html_mail(f'<p>see</p><img src="data:image/png;base64,{"A" * 600_000}"><p>after</p>'),
        "see\n\nafter",
        None,
    ),
]


@pytest.mark.parametrize(
    ("subject", "body", "agent_text", "cut"),
    [c[1:] for c in MAIL_CUTS],
    ids=[c[0] for c in MAIL_CUTS],
)
async def test_a_mail_over_the_limit_is_cut_and_said_once_in_the_thread(
    mail: Mail,
    subject: str,
    body: str | EmailMessage,
    agent_text: str,
    cut: tuple[int, int] | None,
) -> None:
    earlier = "<earlier@example.test>" if subject.startswith("Re:") else None
    if isinstance(body, str):  # a reply answers an earlier mail: its quoted history is cut
        headers = {"In-Reply-To": earlier} if earlier else None
        asked = mail.write(body, subject=subject, headers=headers)
    else:
        asked = body
        asked["From"] = f"Person <{mail.person.address}>"
        asked["To"] = mail.bot.address
        asked["Subject"] = subject
        asked["Message-ID"] = make_msgid(domain="example.test")
        mail.dovecot.deliver(mail.bot, bytes(asked), sender=mail.person.address)
    mail.dovecot.deliver(mail.bot, bytes(asked), sender=mail.person.address)  # a second copy
    replies = await mail.replies(1 if cut is None else 2)
    await asyncio.sleep(0.5)  # room for a wrong second notice
    replies = await mail.replies(0)
    notices = [m for m in replies if "longer than I can take" in _text(m)]
    [got] = await mail.user_texts(f"email:{earlier or asked['Message-ID']}")
    if cut is None:
        assert got == agent_text
        assert notices == [] and len(replies) == 1
        return
    kept, total = cut
    note = f"[This message was cut: you have its first {kept:,} of {total:,} characters."
    assert got == f"{agent_text}\n{note} The sender has been told.]"
    assert len(replies) == 2
    [notice] = notices
    assert f"I read only its first {kept:,} of {total:,} characters" in _text(notice)
    assert str(notice["In-Reply-To"]) == str(asked["Message-ID"])


def test_a_thread_s_people_are_read_from_its_stored_context() -> None:
    """A stored context comes back frozen (tuples): To and Cc were read as one address each, so
    a colleague the bot itself had copied was moved to a thread of her own when she answered."""
    from adapters.email.channel import _people

    stored = {"from": "Alice <a@x.test>", "to": ("bot@x.test",), "cc": ("Carol <c@x.test>",)}
    assert _people(stored) == {"a@x.test", "bot@x.test", "c@x.test"}


async def test_a_sender_whose_address_is_not_ascii_is_answered(mail: Mail) -> None:
    """`jürgen@` was taken and run, then the reply died composing ("'ascii' codec can't
    encode"), a dead letter the sender never heard of."""
    asked = EmailMessage(policy=email.policy.SMTPUTF8)
    asked["From"] = "Jürgen <jürgen@example.test>"
    asked["To"] = mail.bot.address
    asked["Subject"] = "Umlaut"
    asked["Message-ID"] = make_msgid(domain="example.test")
    asked.set_content("hallo")
    mail.dovecot.deliver(mail.bot, bytes(asked), sender="x@example.test")

    def sent() -> list[Any]:
        return [m for m in mail.smtp.messages if "jürgen@example.test" in m.rcpt_tos]

    await _until(lambda: bool(sent()))
    [reply] = sent()
    assert b"You said: hallo" in reply.data.replace(b"=\r\n", b"")
