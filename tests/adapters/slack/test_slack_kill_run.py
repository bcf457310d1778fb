"""The kill run with Slack as the channel: signed events in, posts out, processes SIGKILLed.

Three `gateway serve` processes on one Redis take Slack events (each thread's first message a
mention that arrives twice, the rest replies in its thread; every event retried until some
process answers 200, as Slack retries) while one of them is SIGKILLed every few seconds and
restarted. At the end every accepted message is one user entry, every run's reply is in its
Slack thread exactly once (counted at the fake Slack, by the delivery id in each post's
metadata), no stream message is left beside a reply (each is finished as the reply or deleted),
and no ``replay="never"`` tool ran twice.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.fake_slack import FakeSlack, Message
from tests.support.kill_run import kill_run
from tests.support.redis_server import RedisServer

# kill rates and deadlines are part of what these measure: scripts/test runs them by themselves
pytestmark = pytest.mark.alone


@pytest.mark.timeout(600)
async def test_three_processes_on_redis_with_slack_killed_every_few_seconds(
    tmp_path: Path, redis_server: RedisServer, redis_prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    urls = {
        "store_url": f"{redis_server.url}?prefix={redis_prefix}s",
        "broker_url": f"{redis_server.url}?prefix={redis_prefix}b",
        "web_url": f"{redis_server.url}?prefix={redis_prefix}w",
    }
    spaces = 10
    async with FakeSlack(channels=[f"C{n}" for n in range(spaces)]) as slack:
        counts = await kill_run(
            tmp_path,
            urls,
            processes=3,
            threads=100,
            messages=800,
            spaces=spaces,
            send_seconds=25,
            min_kills=3,
            slack=slack,
        )
        threads = _lost_threads(slack, counts.problems)
        # a stream message nobody finished or deleted: a second, partial answer in its thread
        strays = [m for m in slack.bot_messages() if not m.metadata]
        streams = len(slack.calls_to("chat.startStream"))
    with capsys.disabled():
        print(f"\nkill run, 3 processes on Redis, Slack channel: {counts.line()}")
        print(f"{streams} streams started, {len(strays)} left unfinished")
        print(threads, end="")
    assert counts.kills >= 3
    assert counts.clean, counts.line() + "\n" + "\n".join(counts.problems[:20])
    assert counts.operations > 0 and counts.replies_delivered == counts.operations
    assert counts.charges > 0
    assert streams > 0  # the replies were streamed, so a stray stream could be left
    assert strays == [], _strays(slack, strays)


def _lost_threads(slack: FakeSlack, problems: list[str]) -> str:
    """The Slack threads of the runs with no reply, message by message (to read a failure)."""
    lines = []
    for problem in problems:
        lane = problem.split(" ")[1].rstrip(":") if " no reply to " in problem else ""
        if not lane.startswith("slack:"):
            continue
        _, channel, ts = lane.split(":", 2)
        lines += _thread(slack, channel, ts)
    return "".join(f"{line}\n" for line in lines)


def _strays(slack: FakeSlack, strays: list[Message]) -> str:
    """The threads holding stream messages left unfinished, and every call about each stray."""
    lines = []
    for stray in strays:
        root = stray.thread_ts or stray.ts
        lines += _thread(slack, stray.channel, root)
        began = slack.calls[0].time if slack.calls else 0.0
        for call in slack.calls:
            params = call.params
            if params.get("channel") != stray.channel:
                continue
            about = params.get("ts") == stray.ts or (
                call.method == "chat.startStream" and params.get("thread_ts") == root
            )
            if about:
                answer = call.response or {}
                lines.append(
                    f"    {call.time - began:8.3f} {call.method} ts={params.get('ts')} "
                    f"-> {answer.get('ts') or answer.get('error') or answer.get('ok')}"
                )
    return "".join(f"{line}\n" for line in lines)


def _thread(slack: FakeSlack, channel: str, ts: str) -> list[str]:
    lines = [f"thread slack:{channel}:{ts}:"]
    for message in slack.thread(channel, ts):
        payload = (message.metadata or {}).get("event_payload")
        lines.append(
            f"  {message.ts} {'bot' if message.bot_id else message.user} "
            f"{message.text[:50]!r} streaming={message.streaming} "
            f"edited={bool(message.edited)} metadata={payload}"
        )
    return lines
