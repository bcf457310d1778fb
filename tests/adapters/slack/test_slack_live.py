"""The Slack channel's live view against the fake Slack: status, streams, the reply that ends them.

A run is driven as the gateway drives it (a sequence of `LiveUpdate`s, then the durable reply
through `deliver`); a crash is a second channel instance (a new process) over the same broker
marks. Every test ends by reading the thread as a person would: exactly one bot answer, complete,
and no message still streaming.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

import pytest
from slack_bolt.request.async_request import AsyncBoltRequest

from adapters.channel import DeliveryError, Outbound, ThreadRef
from adapters.live import LiveUpdate, LiveView
from adapters.slack import SlackChannel
from adapters.slack.live import StreamMark
from tests.adapters.kit import TestSink
from tests.support.fake_slack import FakeSlack, Message, event_envelope, signed_headers

SECRET = "s"
RUN = "r1"
REPLY = f"reply:s1:{RUN}"
ANSWER = "Ticket **T-1** is open; ticket T-2 is closed."
STREAM_CALLS = ("chat.startStream", "chat.appendStream", "chat.stopStream")
WATCHED = ("assistant.threads.setStatus", *STREAM_CALLS, "chat.update", "chat.postMessage")


@asynccontextmanager
async def slack_channel(fake: FakeSlack, sink: TestSink) -> AsyncIterator[SlackChannel]:
    channel = SlackChannel(bot_token=fake.bot_token, signing_secret=SECRET, api_url=fake.api_url)
    await channel.start(sink)
    try:
        yield channel
    finally:
        await channel.close()


async def ask(
    fake: FakeSlack, channel: SlackChannel, sink: TestSink, text: str, thread_ts: str | None = None
) -> ThreadRef:
    """A person mentions the bot at the top of C1 (a new thread), or in thread `thread_ts`; the
    channel takes it in."""
    event = fake.mention_event("C1", text, thread_ts=thread_ts)
    raw = json.dumps(event_envelope(event))
    headers: dict[str, str | Sequence[str]] = {
        k.lower(): v for k, v in signed_headers(raw, SECRET).items()
    }
    headers["content-type"] = "application/json"
    response = await channel.app.async_dispatch(AsyncBoltRequest(body=raw, headers=headers))
    assert response.status == 200, response.body
    return sink.inbound[-1].thread


def progress(thread: ThreadRef, status: str, run: str = RUN) -> LiveUpdate:
    return LiveUpdate(thread=thread, run_id=run, kind="progress", status=status)


def text(thread: ThreadRef, chunk: str, offset: int, step: int = 0, run: str = RUN) -> LiveUpdate:
    return LiveUpdate(thread=thread, run_id=run, kind="text", text=chunk, offset=offset, step=step)


def done(thread: ThreadRef, run: str = RUN) -> LiveUpdate:
    return LiveUpdate(thread=thread, run_id=run, kind="done")


def reply(sink: TestSink, thread: ThreadRef, words: str = ANSWER, run: str = RUN) -> Outbound:
    return Outbound(
        delivery_id=f"reply:s1:{run}",
        thread=thread,
        kind="reply",
        text=words,
        reply_context=sink.inbound[-1].reply_context,
    )


def answers(fake: FakeSlack, thread: ThreadRef) -> list[Message]:
    """The bot's messages in the thread (what a person reads there)."""
    _, root = thread.thread.split(":")
    return [m for m in fake.thread("C1", root) if m.bot_id == fake.bot_id]


def assert_one_complete_answer(fake: FakeSlack, thread: ThreadRef) -> None:
    [answer] = answers(fake, thread)
    assert not answer.streaming, "the answer is still streaming"
    assert answer.text == ANSWER.replace("**", "*")  # Slack's mrkdwn of the reply
    assert answer.metadata is not None
    assert answer.metadata["event_payload"]["delivery_id"] == REPLY
    assert fake.streams() == []


async def streamed_answer(fake: FakeSlack, channel: SlackChannel, sink: TestSink) -> ThreadRef:
    """A person asks; the run streams its whole answer and stops (its reply is yet to come)."""
    thread = await ask(fake, channel, sink, "how are my tickets?")
    await channel.show(text(thread, ANSWER, 0))
    await channel.show(done(thread))
    return thread


async def ask_again(
    fake: FakeSlack, channel: SlackChannel, sink: TestSink, thread: ThreadRef, text: str
) -> None:
    """The person mentions the bot again in `thread` (the thread's next run)."""
    _, root = thread.thread.split(":")
    await ask(fake, channel, sink, text, thread_ts=root)


async def a_reply_whose_rewrite_failed(
    fake: FakeSlack, sink: TestSink, one: SlackChannel, two: SlackChannel
) -> tuple[ThreadRef, Outbound]:
    """Run r1 streams its answer in process one; process two's delivery takes the stream and
    fails to rewrite it (retryable). The thread, and the reply to retry."""
    thread = await ask(fake, one, sink, "how are my tickets?")
    await one.show(text(thread, ANSWER, 0))
    await one.show(done(thread))
    first = reply(sink, thread)
    fake.fail("chat.update")
    with pytest.raises(DeliveryError):
        await two.deliver(first)
    return thread, first


def said(fake: FakeSlack, thread: ThreadRef) -> list[tuple[str, str | None]]:
    """The bot's messages in the thread: (text, the delivery id its metadata names)."""
    return [
        (m.text, (m.metadata or {}).get("event_payload", {}).get("delivery_id"))
        for m in answers(fake, thread)
    ]


def metadata_reads(fake: FakeSlack) -> int:
    """How often the thread was read for its delivery metadata (as a take checks streams)."""
    return len(
        [c for c in fake.calls_to("conversations.replies") if c.params.get("include_all_metadata")]
    )


def sequence(fake: FakeSlack) -> list[tuple[str, str]]:
    """The status and stream calls in order: (method, status or text)."""
    seen = []
    for call in fake.calls:
        if call.method not in WATCHED:
            continue
        said = call.params.get("status")
        if said is None:
            chunks = call.params.get("chunks") or []
            said = "".join(c.get("text", "") for c in chunks) or call.params.get("text", "")
        seen.append((call.method, str(said)))
    return seen


async def test_a_run_with_two_tools_shows_status_then_streams_and_its_reply_finishes_it() -> None:
    async with FakeSlack() as fake:
        sink = TestSink(routes={"C1": "s1"})
        async with slack_channel(fake, sink) as channel:
            assert isinstance(channel, LiveView) and channel.capabilities.streaming
            thread = await ask(fake, channel, sink, "how are my tickets?")
            _, root = thread.thread.split(":")
            for update in [
                progress(thread, "is thinking…"),
                progress(thread, "is running tickets.get…"),
                text(thread, "Ticket **T-1**", 0),
                text(thread, " is open;", 14),
                progress(thread, "is running tickets.status…"),
                text(thread, " ticket T-2", 23),
                text(thread, " is closed.", 34),
                done(thread),
            ]:
                await channel.show(update)
            [streamed] = answers(fake, thread)
            assert streamed.text == ANSWER and not streamed.streaming  # done stopped it
            receipt = await channel.deliver(reply(sink, thread))

        assert receipt.channel_message_ids == (f"C1:{streamed.ts}",)  # the stream, finished
        assert_one_complete_answer(fake, thread)
        assert sequence(fake) == [
            ("assistant.threads.setStatus", "is thinking…"),
            ("assistant.threads.setStatus", "is running tickets.get…"),
            ("chat.startStream", "Ticket **T-1**"),
            ("chat.appendStream", " is open;"),
            ("assistant.threads.setStatus", "is running tickets.status…"),
            ("chat.appendStream", " ticket T-2"),
            ("chat.appendStream", " is closed."),
            ("assistant.threads.setStatus", ""),
            ("chat.stopStream", ""),  # the reply need not stop it again
            ("chat.update", ANSWER.replace("**", "*")),
        ]
        assert [c.params.get("recipient_user_id") for c in fake.calls_to("chat.startStream")] == [
            "U1"
        ]
        assert fake.statuses == {}  # nothing left saying the bot works
        assert ("C1", root, "is running tickets.status…") in fake.status_log
        assert [c.error for c in fake.calls_to("chat.stopStream")] == [None]


@pytest.mark.parametrize("error", ["internal_error", "lost"])
async def test_a_stream_whose_stop_failed_is_stopped_by_its_reply(error: str) -> None:
    async with FakeSlack() as fake:
        sink = TestSink(routes={"C1": "s1"})
        async with slack_channel(fake, sink) as channel:
            thread = await ask(fake, channel, sink, "how are my tickets?")
            await channel.show(text(thread, ANSWER, 0))
            if error == "lost":
                fake.lose_response("chat.stopStream")  # stopped, but nobody heard so
            else:
                fake.fail("chat.stopStream", error, status=500)
            await channel.show(done(thread))
            assert [m.streaming for m in answers(fake, thread)] == [error != "lost"]
            await channel.deliver(reply(sink, thread))
        assert_one_complete_answer(fake, thread)
        assert len(fake.calls_to("chat.stopStream")) == 2


async def test_a_stream_a_dead_process_started_is_finished_by_the_new_process() -> None:
    async with FakeSlack() as fake:
        sink = TestSink(routes={"C1": "s1"})  # the broker: both processes share its marks
        async with slack_channel(fake, sink) as first:
            thread = await ask(fake, first, sink, "how are my tickets?")
            await first.show(progress(thread, "is thinking…"))
            await first.show(text(thread, "Ticket **T-1** is", 0))
            [orphan] = fake.streams()
            # SIGKILL: no done, no stop; the next process has only the broker and Slack
        async with slack_channel(fake, sink) as second:
            assert await second.reconcile(reply(sink, thread)) == "absent"
            receipt = await second.deliver(reply(sink, thread))

        assert receipt.channel_message_ids == (f"C1:{orphan.ts}",)
        assert_one_complete_answer(fake, thread)
        assert "slack:stream:slack:C1:" + thread.thread.split(":")[1] in sink.marks


async def test_a_crash_between_the_start_and_its_record_leaves_no_orphan() -> None:
    async with FakeSlack() as fake:
        sink = TestSink(routes={"C1": "s1"})
        async with slack_channel(fake, sink) as first:
            thread = await ask(fake, first, sink, "how are my tickets?")
            fake.lose_response("chat.startStream")  # started, and the answer never came back
            await first.show(text(thread, "Ticket", 0))
            assert len(fake.streams()) == 1
        async with slack_channel(fake, sink) as second:
            await second.deliver(reply(sink, thread))
        assert_one_complete_answer(fake, thread)


async def test_a_retried_run_in_a_new_process_restarts_its_stream() -> None:
    async with FakeSlack() as fake:
        sink = TestSink(routes={"C1": "s1"})
        async with slack_channel(fake, sink) as first:
            thread = await ask(fake, first, sink, "how are my tickets?")
            await first.show(text(thread, "Ticket T-9 is gone", 0))
        async with slack_channel(fake, sink) as second:
            await second.show(text(thread, "Ticket **T-1**", 0))  # the request again, afresh
            [stream] = fake.streams()
            assert stream.text == "Ticket **T-1**"
            await second.show(text(thread, ANSWER[14:], 14))
            await second.deliver(reply(sink, thread))
        assert_one_complete_answer(fake, thread)
        assert len(fake.calls_to("chat.delete")) == 1


async def test_a_new_model_request_of_the_run_replaces_the_earlier_steps_message() -> None:
    async with FakeSlack() as fake:
        sink = TestSink(routes={"C1": "s1"})
        async with slack_channel(fake, sink) as channel:
            thread = await ask(fake, channel, sink, "how are my tickets?")
            await channel.show(text(thread, "Let me look that up", 0, step=0))
            await channel.show(text(thread, "Ticket **T-1**", 0, step=1))
            [stream] = answers(fake, thread)
            assert stream.streaming and stream.text == "Ticket **T-1**"
            await channel.show(text(thread, "Let me look", 0, step=0))  # late: dropped
            await channel.show(text(thread, ANSWER[14:], 14, step=1))
            await channel.show(done(thread))
            await channel.deliver(reply(sink, thread))
        assert_one_complete_answer(fake, thread)


async def test_a_rate_limited_append_falls_back_to_one_final_message() -> None:
    async with FakeSlack() as fake:
        sink = TestSink(routes={"C1": "s1"})
        async with slack_channel(fake, sink) as channel:
            thread = await ask(fake, channel, sink, "how are my tickets?")
            await channel.show(text(thread, "Ticket", 0))
            fake.rate_limit("chat.appendStream", retry_after=30)
            await channel.show(text(thread, " **T-1**", 6))  # 429: streaming ends for the run
            await channel.show(text(thread, " is open;", 14))
            [stream] = answers(fake, thread)
            assert stream.text == "Ticket" and not stream.streaming  # stopped where it stood
            await channel.show(done(thread))
            await channel.deliver(reply(sink, thread))
        assert_one_complete_answer(fake, thread)
        assert [c.status for c in fake.calls_to("chat.appendStream")] == [429]


async def test_a_workspace_without_streaming_gets_one_message_and_is_not_asked_again() -> None:
    async with FakeSlack() as fake:
        fake.unsupport("chat.startStream", "missing_scope")
        fake.unsupport("assistant.threads.setStatus", "missing_scope")
        sink = TestSink(routes={"C1": "s1"})
        async with slack_channel(fake, sink) as channel:
            for run in ("r0", RUN):
                thread = await ask(fake, channel, sink, f"question of {run}")
                await channel.show(progress(thread, "is thinking…", run=run))
                await channel.show(text(thread, "Ticket", 0, run=run))
                await channel.show(text(thread, " T-1", 6, run=run))
                await channel.show(done(thread, run=run))
                await channel.deliver(reply(sink, thread, run=run))
            assert not channel.live.status_ok and not channel.live.streaming_ok
        assert_one_complete_answer(fake, thread)
        assert len(fake.calls_to("chat.startStream")) == 1
        assert len(fake.calls_to("assistant.threads.setStatus")) == 1
        assert fake.calls_to("reactions.add")  # the working reaction is the fallback


async def test_a_failed_live_update_never_raises_and_a_reply_without_a_stream_is_posted() -> None:
    async with FakeSlack() as fake:
        sink = TestSink(routes={"C1": "s1"})
        async with slack_channel(fake, sink) as channel:
            thread = await ask(fake, channel, sink, "how are my tickets?")
            fake.fail("assistant.threads.setStatus", "internal_error", status=500)
            await channel.show(progress(thread, "is thinking…"))
            await channel.show(progress(thread, "is running a…"))  # still tried: not for good
            await channel.deliver(reply(sink, thread))
        assert_one_complete_answer(fake, thread)
        assert fake.statuses == {}
        assert len(fake.calls_to("assistant.threads.setStatus")) == 2
        assert fake.calls_to("chat.startStream") == []


@pytest.mark.parametrize("lost", [False, True])
async def test_a_finished_reply_is_never_swept_by_the_next_run(lost: bool) -> None:
    """The reply rewrote the stream; the mark may still list it (a crash before it said so)."""
    async with FakeSlack() as fake:
        sink = TestSink(routes={"C1": "s1"})
        async with slack_channel(fake, sink) as channel:
            thread = await ask(fake, channel, sink, "how are my tickets?")
            before = dict(sink.marks)
            await channel.show(text(thread, ANSWER, 0))
            listed = dict(sink.marks)
            await channel.deliver(reply(sink, thread))
            if lost:
                sink.marks = listed  # the mark's last write never happened
            assert sink.marks != before
            await channel.show(text(thread, "Next", 0, run="r2"))
            stream = fake.streams()
            assert len(stream) == 1 and stream[0].text == "Next"
        finished = [m for m in answers(fake, thread) if not m.streaming]
        assert [m.text for m in finished] == [ANSWER.replace("**", "*")]


async def test_a_streamed_reply_is_delivered_without_reading_the_thread() -> None:
    """D279: the mark says its streams are no answers, so the take reads no thread (Tier 3)."""
    async with FakeSlack() as fake:
        sink = TestSink(routes={"C1": "s1"})
        async with slack_channel(fake, sink) as channel:
            thread = await streamed_answer(fake, channel, sink)
            read_before = metadata_reads(fake)
            receipt = await channel.deliver(reply(sink, thread))
            [streamed] = answers(fake, thread)
            assert receipt.channel_message_ids == (f"C1:{streamed.ts}",)
            assert metadata_reads(fake) == read_before
        assert_one_complete_answer(fake, thread)


async def test_a_rate_limited_rewrite_of_the_stream_is_retried_as_slack_asks() -> None:
    """`chat.update` is Tier 3: a busy workspace's 429 delays the reply, never doubles it."""
    async with FakeSlack() as fake:
        sink = TestSink(routes={"C1": "s1"})
        async with slack_channel(fake, sink) as channel:
            thread = await streamed_answer(fake, channel, sink)
            fake.rate_limit("chat.update", retry_after=7)
            with pytest.raises(DeliveryError) as refused:
                await channel.deliver(reply(sink, thread))
            assert refused.value.retry_after_s == 7
            await channel.deliver(reply(sink, thread))  # the deliverer's retry, 7 s later
        assert_one_complete_answer(fake, thread)
        assert [c.status for c in fake.calls_to("chat.update")] == [429, 200]


@pytest.mark.parametrize("error", ["cant_update_message", "edit_window_closed", "msg_too_long"])
async def test_a_stream_slack_will_not_rewrite_goes_and_the_reply_is_posted(error: str) -> None:
    """A refused rewrite of the finished stream was a dead letter: the thread kept the streamed
    words and a warning, never the reply (an outside probe). The stream goes; the reply posts."""
    async with FakeSlack() as fake:
        sink = TestSink(routes={"C1": "s1"})
        async with slack_channel(fake, sink) as channel:
            thread = await streamed_answer(fake, channel, sink)
            [streamed] = answers(fake, thread)
            fake.fail("chat.update", error)
            receipt = await channel.deliver(reply(sink, thread))
            [posted] = answers(fake, thread)
            assert posted.ts != streamed.ts
            assert receipt.channel_message_ids == (f"C1:{posted.ts}",)
        assert_one_complete_answer(fake, thread)
        assert [c.error for c in fake.calls_to("chat.delete")] == [None]


async def test_a_mark_an_older_process_wrote_is_checked_against_the_thread() -> None:
    """A mark without D279's flag may list a stream an older process finished as an answer
    (before D275 it rewrote a stream still listed): the take reads the thread and spares it."""
    async with FakeSlack() as fake:
        sink = TestSink(routes={"C1": "s1"})
        async with slack_channel(fake, sink) as first:
            thread = await ask(fake, first, sink, "how are my tickets?")
            await first.show(text(thread, ANSWER, 0))
            await first.deliver(reply(sink, thread))
            [answered] = answers(fake, thread)
        name = f"slack:stream:{thread.lane}"
        finished = json.loads(sink.marks[name])
        assert finished["closed"] is True and finished["streams"] == []
        del finished["closed"]  # as an older process's finish left it (D281 closes it)
        sink.marks[name] = json.dumps(finished, separators=(",", ":"))
        async with slack_channel(fake, sink) as second:  # the run's request again, elsewhere
            await second.show(text(thread, "Ticket", 0, step=1))
            [later] = fake.streams()
            mark = json.loads(sink.marks[name])
            assert mark["v"] == 2 and mark["streams"] == [later.ts]
            del mark["v"]  # as an older process wrote it: the finished answer still listed
            mark["streams"] = [answered.ts, later.ts]
            sink.marks[name] = json.dumps(mark, separators=(",", ":"))
            read_before = metadata_reads(fake)
            taken = await second.live.take(reply(sink, thread), {})
            assert taken == later.ts
            assert metadata_reads(fake) == read_before + 1
            assert "v" not in json.loads(sink.marks[name])  # its streams are still unchecked
        kept = fake.message("C1", answered.ts)
        assert kept.metadata is not None and not kept.streaming
        assert fake.calls_to("chat.delete") == []


@pytest.mark.parametrize("first", ["sweep", "delivery"])
async def test_a_next_runs_sweep_and_the_reply_racing_for_the_stream_leave_one_answer(
    first: str,
) -> None:
    """D275: process A delivers run r1's reply (finishing r1's stream), process B starts r2 in
    the same thread (sweeping r1's leftovers). The sweep's delete, or the reply's rewrite, is
    held back so the other side runs meanwhile: r1's answer survives either way, once."""
    async with FakeSlack() as fake:
        sink = TestSink(routes={"C1": "s1"})
        async with slack_channel(fake, sink) as one, slack_channel(fake, sink) as two:
            thread = await ask(fake, one, sink, "how are my tickets?")
            await one.show(text(thread, ANSWER, 0))
            outbound = reply(sink, thread)
            if first == "sweep":
                fake.delay("chat.delete", 0.5)  # the sweep decided; its delete lands late
                sweep = asyncio.ensure_future(two.show(text(thread, "Next", 0, run="r2")))
                await _until(lambda: any(c.method == "chat.delete" for c in fake.arrivals))
                receipt = await one.deliver(outbound)
                await sweep
            else:
                fake.delay("chat.update", 0.5)  # the reply took the stream; its rewrite is late
                delivering = asyncio.ensure_future(one.deliver(outbound))
                await _until(lambda: any(c.method == "chat.update" for c in fake.arrivals))
                await two.show(text(thread, "Next", 0, run="r2"))
                receipt = await delivering
        assert receipt.delivery_id == REPLY
        finished = [m for m in answers(fake, thread) if not m.streaming]
        assert [m.text for m in finished] == [ANSWER.replace("**", "*")]
        assert finished[0].metadata is not None
        assert finished[0].metadata["event_payload"]["delivery_id"] == REPLY
        assert [m.text for m in fake.streams()] == ["Next"]


async def _until(done: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not done():  # noqa: ASYNC110
            await asyncio.sleep(0.005)


@pytest.mark.parametrize("first", ["delivery", "restart", "unstreamed"])
async def test_a_late_step_of_a_run_another_process_answered_leaves_its_answer_alone(
    first: str,
) -> None:
    """D281: process A streams run r1's first step; r1's reply is delivered by process B (any
    deliverer takes it). A's feed shows r1's next step late: its restart would delete the step's
    stream, which B has just rewritten as the answer, and stream the text anew. Either order
    (B's delivery before A's late step, or A's delete held back while B delivers), or a run
    whose feed showed nothing before B posted its reply, leaves r1's answer once, and no
    stream."""
    async with FakeSlack() as fake:
        sink = TestSink(routes={"C1": "s1"})
        async with slack_channel(fake, sink) as one, slack_channel(fake, sink) as two:
            thread = await ask(fake, one, sink, "how are my tickets?")
            if first != "unstreamed":
                await one.show(text(thread, "Let me look that up", 0, step=0))
            if first != "restart":
                await two.deliver(reply(sink, thread))
                await one.show(text(thread, ANSWER, 0, step=1))
            else:
                fake.delay("chat.delete", 0.5)  # the restart decided; its delete lands late
                late = asyncio.ensure_future(one.show(text(thread, ANSWER, 0, step=1)))
                await _until(lambda: any(c.method == "chat.delete" for c in fake.arrivals))
                await two.deliver(reply(sink, thread))
                await late
            await one.show(done(thread))
        assert_one_complete_answer(fake, thread)


async def test_an_earlier_steps_message_that_could_not_be_deleted_is_deleted_by_the_reply() -> None:
    """A restart takes the earlier step's message out of the mark before deleting it (D281);
    a delete that fails puts it back, so the reply's take deletes it (no read of the thread)."""
    async with FakeSlack() as fake:
        sink = TestSink(routes={"C1": "s1"})
        async with slack_channel(fake, sink) as channel:
            thread = await ask(fake, channel, sink, "how are my tickets?")
            await channel.show(text(thread, "Let me look that up", 0, step=0))
            [earlier] = fake.streams()
            fake.fail("chat.delete")
            await channel.show(text(thread, ANSWER, 0, step=1))
            assert len(fake.streams()) == 2
            mark = json.loads(sink.marks[f"slack:stream:{thread.lane}"])
            assert mark["streams"][0] == earlier.ts and not mark["starting"]
            await channel.show(done(thread))
            await channel.deliver(reply(sink, thread))
        assert_one_complete_answer(fake, thread)
        assert metadata_reads(fake) == 0
        assert [c.params["ts"] for c in fake.calls_to("chat.delete")] == [earlier.ts] * 2


async def test_a_stream_that_starts_as_another_process_delivers_the_reply_is_deleted() -> None:
    """The run's first text starts a stream while process B delivers the run's reply: B finds
    no stream to take (only the mark's word that one may be starting) and posts the reply; the
    stream, never listed, is deleted by the process that started it once it sees the run's
    mark closed (D281)."""
    async with FakeSlack() as fake:
        sink = TestSink(routes={"C1": "s1"})
        async with slack_channel(fake, sink) as one, slack_channel(fake, sink) as two:
            thread = await ask(fake, one, sink, "how are my tickets?")
            fake.delay("chat.startStream", 0.5)  # the start is on its way
            late = asyncio.ensure_future(one.show(text(thread, ANSWER, 0)))
            await _until(lambda: any(c.method == "chat.startStream" for c in fake.arrivals))
            await two.deliver(reply(sink, thread))
            await late
            await one.show(done(thread))
            mark = json.loads(sink.marks[f"slack:stream:{thread.lane}"])
            assert mark["closed"] and not mark["starting"]  # no sweep left for the next reply
        assert_one_complete_answer(fake, thread)
        assert len(fake.calls_to("chat.delete")) == 1


async def test_a_step_shown_after_the_threads_next_run_began_leaves_that_run_alone() -> None:
    """Run r1's process shows a step so late that r1's reply is out and the thread's next run,
    r2, streams in another process: r1's step takes nothing over from r2 (whose mark answers a
    newer message), so each run ends as one complete answer (D281)."""
    async with FakeSlack() as fake:
        sink = TestSink(routes={"C1": "s1"})
        async with slack_channel(fake, sink) as one, slack_channel(fake, sink) as two:
            thread = await ask(fake, one, sink, "how are my tickets?")
            await one.show(text(thread, "Let me look that up", 0, step=0))
            await two.deliver(reply(sink, thread))
            await ask_again(fake, two, sink, thread, "and T-3?")
            await two.show(text(thread, "T-3 is open.", 0, run="r2"))
            await one.show(text(thread, ANSWER, 0, step=1))  # r1's, late
            await one.show(done(thread))
            await two.show(done(thread, run="r2"))
            await two.deliver(reply(sink, thread, "T-3 is open.", run="r2"))
        assert said(fake, thread) == [
            (ANSWER.replace("**", "*"), REPLY),
            ("T-3 is open.", "reply:s1:r2"),
        ]
        assert fake.streams() == []


async def test_a_reply_closes_the_mark_of_an_earlier_run_that_still_owes_a_sweep() -> None:
    """The thread's mark is an earlier run's that may have an unrecorded stream (`starting`):
    a reply of the next run, which streamed nothing yet, still closes the mark, carrying the
    sweep on; the next run's text shown late then starts nothing beside the reply (D281)."""
    async with FakeSlack() as fake:
        sink = TestSink(routes={"C1": "s1"})
        async with slack_channel(fake, sink) as one, slack_channel(fake, sink) as two:
            thread = await ask(fake, one, sink, "how are my tickets?")
            await one.show(text(thread, ANSWER, 0))
            await one.deliver(reply(sink, thread))
            name = f"slack:stream:{thread.lane}"
            owed = json.loads(sink.marks[name]) | {"starting": True}
            sink.marks[name] = json.dumps(owed, separators=(",", ":"))
            await ask_again(fake, two, sink, thread, "and T-3?")
            await two.deliver(reply(sink, thread, "T-3 is open.", run="r2"))
            closed = json.loads(sink.marks[name])
            assert (closed["run"], closed["closed"], closed["starting"]) == ("r2", True, True)
            assert closed["sweep"] == owed["since"]  # the sweep goes on from r1's question
            assert closed["since"] != owed["since"]  # while the mark stays r2's (D281)
            await one.show(text(thread, "T-3 is open.", 0, run="r2"))  # late
            await one.show(done(thread, run="r2"))
        assert said(fake, thread) == [
            (ANSWER.replace("**", "*"), REPLY),
            ("T-3 is open.", "reply:s1:r2"),
        ]
        assert fake.streams() == []


async def test_a_reply_retried_after_the_threads_next_run_took_the_mark_finishes_its_stream() -> (
    None
):
    """Run r1's reply took r1's stream, but its rewrite failed (a 429, a crash); before the retry
    the thread's next run, r2, took the mark over. The mark carries r1's answer on (`owed`), so
    the retry finishes that stream instead of posting beside it (D281)."""
    async with FakeSlack() as fake:
        sink = TestSink(routes={"C1": "s1"})
        async with slack_channel(fake, sink) as one, slack_channel(fake, sink) as two:
            thread, first = await a_reply_whose_rewrite_failed(fake, sink, one, two)
            await ask_again(fake, one, sink, thread, "and T-3?")
            await one.show(text(thread, "T-3 is open.", 0, run="r2"))
            name = f"slack:stream:{thread.lane}"
            assert json.loads(sink.marks[name])["run"] == "r2"
            await two.deliver(first)  # the retry
            assert "owed" not in json.loads(sink.marks[name])
            await one.show(done(thread, run="r2"))
            await one.deliver(reply(sink, thread, "T-3 is open.", run="r2"))
        assert said(fake, thread) == [
            (ANSWER.replace("**", "*"), REPLY),
            ("T-3 is open.", "reply:s1:r2"),
        ]
        assert fake.streams() == []
        assert fake.calls_to("chat.delete") == []


async def test_a_sweep_for_unrecorded_streams_spares_an_answer_a_retry_still_owes() -> None:
    """A later run's sweep for unrecorded streams (from an earlier run's question on) does not
    take an owed answer, still without metadata, for a leftover: the retry finishes it (D281)."""
    async with FakeSlack() as fake:
        sink = TestSink(routes={"C1": "s1"})
        async with slack_channel(fake, sink) as one, slack_channel(fake, sink) as two:
            thread, first = await a_reply_whose_rewrite_failed(fake, sink, one, two)
            name = f"slack:stream:{thread.lane}"
            taken = json.loads(sink.marks[name])
            owing = StreamMark(
                "r2",
                since=taken["since"],
                starting=True,
                closed=True,
                owed=(("r1", taken["answer"]),),
            )
            sink.marks[name] = owing.dump()  # r2's, owing a sweep from r1's question on
            await ask_again(fake, one, sink, thread, "and T-3?")
            await one.show(text(thread, "T-3 is open.", 0, run="r3"))  # sweeps from r1's question
            await two.deliver(first)
            await one.show(done(thread, run="r3"))
            await one.deliver(reply(sink, thread, "T-3 is open.", run="r3"))
        assert said(fake, thread) == [
            (ANSWER.replace("**", "*"), REPLY),
            ("T-3 is open.", "reply:s1:r3"),
        ]
        assert fake.calls_to("chat.delete") == []


async def test_a_ping_that_comes_in_pieces_is_defused_in_the_stream_too() -> None:
    """Each piece was defused alone, and `<!c` + `hann` + `el>` is none: the streamed message
    held `<!channel>` whole (the finished reply was defused)."""
    async with FakeSlack() as fake:
        sink = TestSink(routes={"C1": "s1"})
        async with slack_channel(fake, sink) as channel:
            thread = await ask(fake, channel, sink, "page everyone")
            pieces = ["Hello <!c", "hann", "el> and <", "!here|here>", " and a < b, <!", "x"]
            offset = 0
            for piece in pieces:
                await channel.show(text(thread, piece, offset))
                offset += len(piece)
            [streamed] = answers(fake, thread)
            sent = "".join(said for method, said in sequence(fake) if method in STREAM_CALLS)
            assert "<!" not in sent and "<!" not in streamed.text, sent
            assert sent == "Hello @channel and @here and a < b, "  # `<!x`: not finished yet


@pytest.mark.parametrize("left", ["answer", "stream"])
async def test_a_reply_closes_the_mark_of_an_earlier_run_that_left_a_stream_or_an_answer(
    left: str,
) -> None:
    """The thread's mark is still r1's: its reply's rewrite failed and waits for its retry
    (`answer`), or r1's reply has not taken r1's stream yet (`stream`: it posts afresh). r2's reply,
    delivered by process two before r2's process showed any text, still closes the mark (r1's
    leftovers carried on); r2's text shown late then starts no stream beside r2's reply. Seen in
    the Slack kill run: a second "You said" without metadata after the plain reply."""
    async with FakeSlack() as fake:
        sink = TestSink(routes={"C1": "s1"})
        async with slack_channel(fake, sink) as one, slack_channel(fake, sink) as two:
            if left == "answer":
                thread, first = await a_reply_whose_rewrite_failed(fake, sink, one, two)
            else:
                thread = await ask(fake, one, sink, "how are my tickets?")
                first = reply(sink, thread)
                await one.show(text(thread, "Let me look that up", 0, step=0))
            name = f"slack:stream:{thread.lane}"
            earlier = json.loads(sink.marks[name])
            await ask_again(fake, two, sink, thread, "and T-3?")
            await two.deliver(reply(sink, thread, "T-3 is open.", run="r2"))
            closed = json.loads(sink.marks[name])
            assert (closed["run"], closed["closed"]) == ("r2", True)
            if left == "answer":
                assert closed["owed"] == [["r1", earlier["answer"]]]  # the retry finishes it
            else:
                assert fake.streams() == []  # r1's stream: deleted, its reply posts afresh
            await one.show(text(thread, "T-3 is open.", 0, run="r2"))  # late
            await one.show(done(thread, run="r2"))
            await two.deliver(first)  # r1's reply (the retry, or its first attempt)
        assert sorted(said(fake, thread), key=repr) == sorted(
            [(ANSWER.replace("**", "*"), REPLY), ("T-3 is open.", "reply:s1:r2")], key=repr
        )
        assert fake.streams() == []
