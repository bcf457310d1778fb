"""The working reaction a reply takes off: each message once, not once per reply listing it."""

from __future__ import annotations

import asyncio

from adapters.channel import Outbound, ThreadRef
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
