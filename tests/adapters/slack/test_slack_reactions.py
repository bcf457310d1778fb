"""The working reaction a reply takes off: each message once, not once per reply listing it."""

from __future__ import annotations

import asyncio

from adapters.channel import Author, Inbound, KnownThread, Outbound, ThreadRef
from adapters.slack import SlackChannel
from tests.adapters.kit import TestSink
from tests.support.fake_slack import FakeSlack


async def test_a_reply_takes_off_only_what_no_earlier_reply_of_its_thread_took_off() -> None:
    """A burst's lists of what wears the reaction are made as its messages come in, before any
    answer moves the thread's answered mark: each reply asked Slack to take off its whole list
    again, what an earlier reply had taken off included (45,800 useless calls for 1,000
    messages, Slack allowing about 50 a minute: an outside probe)."""
    async with FakeSlack() as fake:
        sink = TestSink(routes={"C1": "s1"})
        channel = SlackChannel(bot_token=fake.bot_token, signing_secret="s", api_url=fake.api_url)
        await channel.start(sink)
        try:
            root = fake.post_user_message("C1", "first")["ts"]
            said = [
                root,
                *(fake.post_user_message("C1", f"and {n}", thread_ts=root)["ts"] for n in range(3)),
            ]
            thread = ThreadRef(channel="slack", space="C1", thread=f"C1:{root}")
            for number, (newest, listed) in enumerate(((said[1], said[:2]), (said[3], said))):
                await channel.deliver(
                    Outbound(
                        delivery_id=f"reply:s1:run-{number}",
                        thread=thread,
                        kind="reply",
                        text=f"answer {number}",
                        reply_context={"ts": newest, "working": listed},
                    )
                )
                await asyncio.sleep(0.3)  # its reactions come off in the background
        finally:
            await channel.close()
        asked = [c.params["timestamp"] for c in fake.calls_to("reactions.remove")]
        assert asked == said  # before: said[0] and said[1] twice


async def test_a_burst_longer_than_the_list_loses_every_working_reaction() -> None:
    """A reply's list names a thread's newest 200 messages wearing the reaction: the older ones
    of a longer burst kept it for good (an outside probe). The newest one past the bound
    travels beside the list, and the reply finds those in the thread."""
    async with FakeSlack() as fake:
        sink = TestSink(routes={"C1": "s1"})
        channel = SlackChannel(bot_token=fake.bot_token, signing_secret="s", api_url=fake.api_url)
        await channel.start(sink)
        delivery = channel.delivery
        try:
            root = fake.post_user_message("C1", "first")["ts"]
            said = [
                root,
                *(
                    fake.post_user_message("C1", f"and {n}", thread_ts=root)["ts"]
                    for n in range(205)
                ),
            ]
            thread = ThreadRef(channel="slack", space="C1", thread=f"C1:{root}")
            known: KnownThread | None = None
            for ts in said:  # each taken in as it comes, wearing the reaction
                await delivery.react("C1", ts, add=True)
                inbound = Inbound(
                    thread=thread,
                    message_id=ts,
                    author=Author(id="U1"),
                    text="x",
                    received_at_ms=0,
                    reply_context={"ts": ts},
                )
                inbound = await delivery.with_working(sink, inbound, known)
                known = KnownThread(
                    thread=thread, session="s1", reply_context=inbound.reply_context
                )
            assert known is not None
            context = dict(known.reply_context)
            listed = context["working"]
            assert isinstance(listed, list | tuple) and len(listed) == 200
            assert context["working_cut"] == said[5]  # the newest the list could not hold
            await channel.deliver(
                Outbound(
                    delivery_id="reply:s1:run-1",
                    thread=thread,
                    kind="reply",
                    text="answer",
                    reply_context=context,
                )
            )
            await asyncio.sleep(0.5)  # its reactions come off in the background
        finally:
            await channel.close()
        wearing = [ts for ts in said if fake.message("C1", ts).reactions]
        assert wearing == []  # before: the six oldest kept it
