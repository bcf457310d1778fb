"""Replies: what a lane's finished operations and approval waits send back into its thread.

After each operation the worker scans the lane's records after its *replied-through* mark (kept
per lane by the broker) for runs that finished, approval waits that began and waits that were
decided, and enqueues an outbound message for each under a delivery id derived from what caused
it (a wait that ended, by a decision or with its run, gets its close: `gateway.closes`).
Enqueueing is idempotent by that id and the mark only moves after the enqueue, so a crash
anywhere in between repeats the scan and loses no reply, and never sends one twice; the scan
reads only the records after the mark (bounded by what happened since the last reply).

A worker that takes a session first enqueues what its previous holder left unsent. The session's
*replies watermark* (a broker mark, `replies_mark`) bounds that look: a worker that let the
session go cleanly (every reply of its work enqueued, its lease still its own) set it to the
store's last seq, so the next one looks only at the lanes with a finished run or an approval
wait after it (`lanes_to_reply`), not at every thread the session ever had.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from adapters import ApprovalView, Attachment, Outbound, OutboundKind, PendingCall, ThreadRef
from gateway.broker.contract import BlobRefused, Broker, ThreadState
from gateway.closes import close_outbound, closure, request_delivery_id
from harness_core import (
    AssistantMessage,
    OperationError,
    SessionStorage,
    ToolResultMessage,
    message_text,
)
from harness_core.models.conversion import MODEL_DECLINED
from harness_core.session.entries import MessageEntry
from harness_core.session.records import (
    ApprovalDecided,
    ApprovalRequested,
    OperationFinished,
    OperationStarted,
    QueueEnqueued,
    RecordType,
    RunIntent,
    ToolStarted,
)
from harness_core.session.types import RecordQuery, StoredRecord
from harness_core.texts import one_line

__all__ = [
    "CUT_OFF_BEFORE_ANSWER",
    "CUT_OFF_NOTE",
    "LATE_DECISION_TEXT",
    "MISMATCHED_DECISION_TEXT",
    "NO_WAIT_DECISION_TEXT",
    "REFUSED_TEXT",
    "RUN_CONTEXT",
    "STUCK_TEXT",
    "Reply",
    "answer_text",
    "approval_outbound",
    "born_mark",
    "delivery_id",
    "enqueue_decision_notice",
    "enqueue_refusal_notice",
    "enqueue_replies",
    "enqueue_stop_notice",
    "enqueue_stuck_notice",
    "entry_id_of",
    "failure_text",
    "lanes_to_reply",
    "never_repeated",
    "replies_mark",
    "watermark_of",
]

NO_ANSWER = "(The run ended without a text answer.)"
CUT_OFF_NOTE = "(The answer was cut off at the model's output limit.)"
"""Closes an answer that stopped at an output limit, on its own line, in every channel (D133)."""
CUT_OFF_BEFORE_ANSWER = "(The model reached its output limit before it wrote an answer.)"
REFUSED_TEXT = "Sorry, I could not take that message. Please send it again in other words."
STUCK_TEXT = (
    "Sorry, this conversation is stuck: my work on it was interrupted too many times. "
    "An operator has to look at it before I continue."
)


LATE_DECISION_TEXT = (
    "That decision changed nothing: the request it answers is no longer waiting (it was "
    "stopped, or already decided). Nothing was run."
)
MISMATCHED_DECISION_TEXT = (
    "That decision changed nothing: it does not name exactly the calls that wait for one. "
    "Nothing was run."
)
NO_WAIT_DECISION_TEXT = (
    "That decision changed nothing: nothing in this thread waits for a decision under the "
    "request it names. Nothing was run."
)


def delivery_id(session: str, kind: OutboundKind, cause: str) -> str:
    """The delivery id of a reply: stable for what caused it, whoever enqueues it, however often."""
    return f"{kind}:{session}:{cause}"


_INBOUND = "in-"
"""The prefix of a user-message entry a thread's message became (`entry_id_of`)."""


def entry_id_of(dedupe_key: str) -> str:
    """The lane's user-message entry id for an inbound message (the same message, the same id)."""
    return _INBOUND + hashlib.sha256(dedupe_key.encode()).hexdigest()[:40]


def failure_text(error: OperationError | None) -> str:
    """A short failure notice: what kind of failure, never provider or tool internals."""
    code = error.code if error is not None else "failed"
    if code == "turn_limit":  # asking again the same way would loop again
        return (
            "Sorry, I stopped before finishing: this took more steps than one request may "
            "(turn_limit). You can ask again, perhaps in smaller parts."
        )
    if code == "token_budget":  # asking again would fail the same way, at once
        return (
            "Sorry, I stopped: this thread has used the tokens it may spend (token_budget). "
            "Start a new thread to go on, or ask an operator to raise its budget."
        )
    if code == "content_filter" and error is not None and error.message.startswith(MODEL_DECLINED):
        # the model's own words for declining are written for the person who asked
        said = one_line(error.message.removeprefix(MODEL_DECLINED), _DECLINED_CHARS)
        return f'Sorry, the model declined to answer this: "{said}" ({code}).'
    if code in _LASTING:  # asking again fails the same way until someone changes something
        return f"Sorry, I could not finish this: {_LASTING[code]} ({code})."
    return f"Sorry, I could not finish this ({code}). You can ask again; an operator can retry it."


_DECLINED_CHARS = 500
"""The most of a model's words for declining a thread is shown (they are a sentence or two)."""

_LASTING = {
    "auth": "the model provider refused the gateway's key, so an operator has to put it right "
    "before asking again can help",
    "invalid_request": "the model provider refused the request as it was; an operator can see "
    "why in this thread's timeline",
    "rate_limit": "the model provider's quota is used up; an operator can retry this once it "
    "is raised",
    "context_overflow": "this conversation no longer fits the model's context window; start a "
    "new thread to go on",
    "content_filter": "the model provider declined to answer this",
}
"""Failures that asking again does not mend (a retryable one ends `retries_exhausted`), each
said in words (a person read "You can ask again" after a revoked key)."""


_REPLIED_TYPES: tuple[RecordType, ...] = (
    "operation_finished",
    "approval_requested",
    "approval_decided",
)
"""The records a reply answers (a decided wait: its close)."""


def replies_mark(session: str) -> str:
    """The broker mark holding the session's replies watermark (a store seq, as text)."""
    return f"replies:{session}"


def born_mark(session: str) -> str:
    """The broker mark holding when the store's session was created, as its marks last saw it.

    Another value means the session's store history was replaced (D352).
    """
    return f"replies-born:{session}"


def watermark_of(raw: str | None) -> int | None:
    """The seq a replies watermark holds; None when unset or not a seq (look at every lane)."""
    # ASCII digits only (str.isdigit also takes "²", which int() refuses); at most 18 of
    # them: a seq, never a number too large for the backends' counters
    if raw is None or not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        return None
    return int(raw)


async def lanes_to_reply(storage: SessionStorage, after_seq: int) -> list[str]:
    """The lanes with a finished run, an approval wait or a decision after `after_seq`, by name.

    Session-wide reads of one record type each, bounded by what happened since.
    """
    lanes: set[str] = set()
    for record_type in _REPLIED_TYPES:
        found = await storage.find_records(
            RecordQuery(type=record_type, after_seq=after_seq, order="oldest_first")
        )
        lanes.update(stored.record.lane for stored in found)
    return sorted(lanes)


@dataclass(frozen=True, slots=True)
class Reply:
    """One reply found by a scan: its seq (for the mark) and the outbound message."""

    seq: int
    outbound: Outbound


RUN_CONTEXT = "gateway.reply_context"
"""The `before_run` hook id under which a ``next_run`` run keeps its message's reply context."""


async def _as_its_run_answers(
    since: _Since, state: ThreadState, stored: StoredRecord
) -> ThreadState:
    """`state` with the reply context its run keeps, when it keeps one (a ``next_run`` run).

    Else the thread's newest message's: the run took every message of its thread so far
    (``steer``, ``follow_up``), so its replies answer the newest it took.
    """
    run_id = getattr(stored.record, "run_id", None)
    if not isinstance(run_id, str):
        return state
    started = await since.record(run_id)
    if started is None or not isinstance(started.record, OperationStarted):
        return state
    intent = started.record.intent
    kept = intent.resume_data if isinstance(intent, RunIntent) else None
    context = kept.get(RUN_CONTEXT) if kept is not None else None
    if not isinstance(context, Mapping):
        return state
    return state.model_copy(update={"reply_context": context})


class _Since:
    """A lane's records after its replied-through mark, read in one range (the reply scan's).

    What a scan needs about a run whose start is in the range (its start, its tools, its waits)
    is in the range too; a run that began before the mark (one that waited for an approval, or
    ran on after one) is looked up in the store.
    """

    def __init__(self, storage: SessionStorage, found: tuple[StoredRecord, ...]) -> None:
        self.storage = storage
        self.found = found
        self._by_id = {stored.record.id: stored for stored in found}

    def replied(self) -> list[StoredRecord]:
        """The records a reply answers, in order."""
        return [stored for stored in self.found if stored.record.type in _REPLIED_TYPES]

    async def record(self, record_id: str) -> StoredRecord | None:
        known = self._by_id.get(record_id)
        return known if known is not None else await self.storage.get_record(record_id)

    async def of_run(self, lane: str, record_type: RecordType, run_id: str) -> list[StoredRecord]:
        """The run's records of one type, oldest first."""
        if run_id in self._by_id:  # its start is in the range: so is everything after it
            return [
                stored
                for stored in self.found
                if stored.record.type == record_type
                and getattr(stored.record, "run_id", None) == run_id
            ]
        return list(
            await self.storage.find_records(
                RecordQuery(lane=lane, type=record_type, run_id=run_id, order="oldest_first")
            )
        )


async def enqueue_replies(
    broker: Broker,
    storage: SessionStorage,
    state: ThreadState,
    *,
    now_ms: int,
    known: Mapping[str, AssistantMessage] | None = None,
) -> list[Reply]:
    """Enqueue the replies of `state`'s lane after its mark; returns what was found (in order).

    Runs only: compactions and navigations answer nobody. A completed run replies with its final
    text (after any answer it gave before it took another message of the thread), a failed one
    with a short notice (likewise), an aborted one with nothing; an approval wait sends
    an approval request; a wait that ended (decided, or its run aborted or failed) its close.
    `known`: final messages the caller has in hand, by entry id (not read again).
    """
    lane = state.lane
    since = _Since(
        storage,
        await storage.find_records(
            RecordQuery(lane=lane, after_seq=state.replied_through, order="oldest_first")
        ),
    )
    found = since.replied()
    replies: list[Reply] = []
    thread = ThreadRef.model_validate(dict(state.thread))
    for stored in found:
        answering = await _as_its_run_answers(since, state, stored)
        outbound = await _outbound(broker, since, answering, thread, stored, known or {})
        if outbound is not None:
            replies.append(Reply(stored.seq, outbound))
        for closed in await _closes(storage, since, broker, answering, thread, stored):
            replies.append(Reply(stored.seq, closed))
    for reply in replies:
        await broker.outbox.enqueue(
            reply.outbound.delivery_id,
            state.session,
            lane,
            reply.outbound.model_dump(mode="json"),
            now_ms=now_ms,
        )
    if found:
        await broker.threads.mark_replied(state.session, lane, max(s.seq for s in found))
    return replies


async def _closes(
    storage: SessionStorage,
    since: _Since,
    broker: Broker,
    state: ThreadState,
    thread: ThreadRef,
    stored: StoredRecord,
) -> list[Outbound]:
    """The closes a record causes: its wait's (a decision), or its run's open waits' (an end).

    A completed run decided all its waits (each closed by its decision): only an aborted or
    failed one can leave a wait open, so only those cost a read of the run's waits.
    """
    record = stored.record
    if isinstance(record, ApprovalDecided):
        waits = [found] if (found := await since.record(record.wait_id)) else []
    elif isinstance(record, OperationFinished) and record.outcome != "completed":
        waits = await since.of_run(state.lane, "approval_requested", record.run_id)
    else:
        return []
    closes = []
    for wait in waits:
        if not isinstance(wait.record, ApprovalRequested):
            continue
        closed = await closure(storage, broker, state.session, wait)
        if closed is not None:
            closes.append(close_outbound(state, thread, wait.record, closed))
    return closes


async def _outbound(
    broker: Broker,
    since: _Since,
    state: ThreadState,
    thread: ThreadRef,
    stored: StoredRecord,
    known: Mapping[str, AssistantMessage],
) -> Outbound | None:
    record = stored.record
    session = state.session
    context = state.reply_context
    if isinstance(record, ApprovalRequested):
        return approval_outbound(state, thread, record)
    if not isinstance(record, OperationFinished):
        return None
    started = await since.record(record.run_id)
    if started is None or not isinstance(started.record, OperationStarted):
        return None
    if not isinstance(started.record.intent, RunIntent):
        return None  # compaction and navigation answer nobody
    if record.outcome == "aborted":  # whoever aborted it knows; of its effects, maybe not
        return await _ran_before_the_stop(since, state, thread, record.run_id)
    if record.outcome not in ("completed", "failed"):
        return None
    earlier = await _earlier_answers(since, state.lane, record.run_id)
    if record.outcome == "failed":
        # after answers the thread has not seen, a reply that ends with the notice: a notice is
        # rendered short (a Slack block, 2,000 characters of a mail) and an answer may not be
        return Outbound(
            delivery_id=delivery_id(session, "failure_notice", record.run_id),
            thread=thread,
            kind="reply" if earlier else "failure_notice",
            text="\n\n".join((*earlier, failure_text(record.error))),
            reply_context=context,
        )
    reply_id = delivery_id(session, "reply", record.run_id)
    files, unsent = await _run_files(broker, since, state, record.run_id, reply_id)
    final = known.get(record.final_entry_id) if record.final_entry_id is not None else None
    text = answer_text(final) if final is not None else await _final_text(since, record)
    text = "\n\n".join((*earlier, text))
    if unsent:
        text += "\n\n" + "\n".join(unsent)
    return Outbound(
        delivery_id=reply_id,
        thread=thread,
        kind="reply",
        text=text,
        reply_context=context,
        files=files,
    )


async def _run_files(
    broker: Broker, since: _Since, state: ThreadState, run_id: str, reply_id: str
) -> tuple[tuple[Attachment, ...], list[str]]:
    """The files the run's tools returned, held as the session's blobs for its reply (D228).

    Only this run's results (its `ToolStarted` records name them). Each file is put under a key
    naming the reply and its place, so a rescan after a crash puts the same bytes again (a
    renewal) and enqueues the same reply; one the blob area refuses is named in the text.
    """
    started = await since.of_run(state.lane, "tool_started", run_id)
    storage = since.storage
    files: list[Attachment] = []
    unsent: list[str] = []
    for found in started:
        if not isinstance(found.record, ToolStarted):
            continue
        result = await storage.get_entry(found.record.result_entry_id)
        if result is None or not isinstance(result.entry, MessageEntry):
            continue
        message = result.entry.message
        if not isinstance(message, ToolResultMessage):
            continue
        for file in message.files:
            key = f"reply:{reply_id}:{len(files) + len(unsent)}"
            try:
                info = await broker.blobs.put(state.session, file.content, key=key)
            except BlobRefused as refused:
                unsent.append(f"(The file {file.name} could not be sent: {refused}.)")
                continue
            files.append(
                Attachment(name=file.name, media_type=file.media_type, size=info.size, blob=info.id)
            )
    return tuple(files), unsent


def approval_outbound(state: ThreadState, thread: ThreadRef, record: ApprovalRequested) -> Outbound:
    """The approval request a wait sends its thread (with the calls and their digests)."""
    session = state.session
    calls = tuple(
        PendingCall(
            tool_call_id=call.tool_call_id,
            tool_name=call.tool_name,
            args=call.args,
            args_digest=call.args_digest,
        )
        for call in record.calls
    )
    names = ", ".join(sorted({call.tool_name for call in calls}))
    return Outbound(
        delivery_id=request_delivery_id(session, record.id),
        thread=thread,
        kind="approval_request",
        text=f"Approval needed before I run {names}.",
        approval=ApprovalView(
            session=session, run_id=record.run_id, wait_id=record.id, calls=calls
        ),
        reply_context=state.reply_context,
    )


async def never_repeated(
    storage: SessionStorage, started: Iterable[StoredRecord]
) -> list[tuple[ToolStarted, ToolResultMessage | None]]:
    """The calls among the `started` records that are never run again, each with its result.

    None for a call whose result is no stored tool result (the run was cut mid-call). What a
    stop notice and an interrupted `ask` name: such a call ran, or may have (D353).
    """
    found = []
    for stored in started:
        call = stored.record
        if not isinstance(call, ToolStarted) or call.replay != "never":
            continue
        result = await storage.get_entry(call.result_entry_id)
        message = (
            result.entry.message if result and isinstance(result.entry, MessageEntry) else None
        )
        found.append((call, message if isinstance(message, ToolResultMessage) else None))
    return found


async def _ran_before_the_stop(
    since: _Since, state: ThreadState, thread: ThreadRef, run_id: str
) -> Outbound | None:
    """What an aborted run's never-replayed tools did before the abort took hold, if anything.

    A `stop` sent as an Approve landed was answered "Stopped." while the deploy it approved ran
    to the end: the person believed nothing happened. A tool that is safe to repeat (a read) is
    not named; one whose result says it was refused is not either; one cut off mid-call by the
    stop's grace (D407) is named as one that may have happened.
    """
    started = await since.of_run(state.lane, "tool_started", run_id)
    ran, maybe = [], []
    for call, result in await never_repeated(since.storage, started):
        if result is not None and result.outcome == "ok":
            ran.append(f"{call.tool_name}: {one_line(message_text(result))}")
        elif result is not None and result.outcome == "interrupted":  # cut off (D407)
            maybe.append(call.tool_name)
    said = []
    if ran:
        said.append("Before it stopped, this had already run:\n" + "\n".join(ran))
    if maybe:
        said.append(
            "This may or may not have happened (cut off mid-call when the run stopped; check "
            "before repeating it): " + ", ".join(maybe)
        )
    if not said:
        return None
    return Outbound(
        delivery_id=delivery_id(state.session, "reply", f"{run_id}:ran"),
        thread=thread,
        kind="reply",
        text="\n".join(said),
        reply_context=state.reply_context,
    )


async def _earlier_answers(since: _Since, lane: str, run_id: str) -> list[str]:
    """The answers a run gave before it took another message of its thread, oldest first.

    A message that reaches a busy lane joins its run (a steer, or a follow-up when the run would
    stop); when the model had just answered, with no tool call, that answer is the run's as
    much as its final one, and the thread must get it too. A run that took no message of its
    thread reads nothing more; one that did, two entries a message.
    """
    answers: dict[str, tuple[int, str]] = {}
    for stored in await since.of_run(lane, "queue_enqueued", run_id):
        queued = stored.record
        if not isinstance(queued, QueueEnqueued) or not queued.target.id.startswith(_INBOUND):
            continue  # an input of the thread's own (a hook's is not the thread's)
        taken = await since.storage.get_entry(queued.target.id)
        if taken is None or taken.parent_id is None:
            continue  # not taken (the run ended first: it starts the next run)
        before = await since.storage.get_entry(taken.parent_id)
        if before is None or not isinstance(before.entry, MessageEntry):
            continue
        message = before.entry.message
        if isinstance(message, AssistantMessage) and message.stop_reason in ("stop", "length"):
            answers[before.id] = (before.seq, answer_text(message))
    return [text for _, text in sorted(answers.values())]


async def _final_text(since: _Since, finished: OperationFinished) -> str:
    entry_id = finished.final_entry_id
    if entry_id is None:
        return NO_ANSWER
    stored = await since.storage.get_entry(entry_id)
    if stored is None or not isinstance(stored.entry, MessageEntry):
        return NO_ANSWER
    message = stored.entry.message
    return answer_text(message) if isinstance(message, AssistantMessage) else NO_ANSWER


def answer_text(message: AssistantMessage) -> str:
    """What a person is shown of a run's final message, in every channel.

    Its text (never its thinking); an answer that stopped at an output limit is delivered as it
    came, with a line saying so (D133).
    """
    text = message_text(message).strip()
    if message.stop_reason == "length":
        return f"{text}\n\n{CUT_OFF_NOTE}" if text else CUT_OFF_BEFORE_ANSWER
    return text or NO_ANSWER


WORKING_TEXT = "I am working on your message and will reply in this thread when I am done."


async def enqueue_working_notice(
    broker: Broker, state: ThreadState, run_id: str, *, now_ms: int
) -> Outbound:
    """Tell the thread a long run is under way (once per run, D214)."""
    return await _notice(
        broker, state, f"{run_id}:working", WORKING_TEXT, now_ms=now_ms, kind="reply", answers=False
    )


HELD_TEXT = (
    "I am waiting for a decision on the approval request in this thread: I will read your "
    "message once it is decided. Say stop to cancel the request instead."
)


async def enqueue_held_notice(
    broker: Broker, state: ThreadState, item_id: str, *, now_ms: int
) -> Outbound:
    """Tell the thread a message waits behind an approval request (once per inbox item).

    It was held without a word until someone decided, and often nobody in the thread can: a
    thread that looked wedged (an outside probe).
    """
    return await _notice(
        broker, state, f"held:{item_id}", HELD_TEXT, now_ms=now_ms, kind="reply", answers=False
    )


async def enqueue_refusal_notice(
    broker: Broker, state: ThreadState, item_id: str, *, now_ms: int
) -> Outbound:
    """Tell the thread a message of it was refused (once per inbox item)."""
    return await _notice(broker, state, f"refused:{item_id}", REFUSED_TEXT, now_ms=now_ms)


async def enqueue_stuck_notice(
    broker: Broker, state: ThreadState, operation_id: str, attempts: int, *, now_ms: int
) -> Outbound:
    """Tell the thread its lane is parked stuck (once per operation and attempt count)."""
    cause = f"{operation_id}:stuck:{attempts}"
    return await _notice(broker, state, cause, STUCK_TEXT, now_ms=now_ms)


async def enqueue_decision_notice(
    broker: Broker, state: ThreadState, item_id: str, text: str, *, now_ms: int
) -> Outbound:
    """Tell the thread a decision of it could not be applied (once per inbox item)."""
    return await _notice(broker, state, f"decision:{item_id}", text, now_ms=now_ms)


async def enqueue_stop_notice(
    broker: Broker, state: ThreadState, item_id: str, text: str, *, now_ms: int
) -> Outbound:
    """Answer a thread's ``stop`` (once per inbox item), as the bot's own message."""
    return await _notice(broker, state, f"stop:{item_id}", text, now_ms=now_ms, kind="reply")


async def _notice(
    broker: Broker,
    state: ThreadState,
    cause: str,
    text: str,
    *,
    now_ms: int,
    kind: OutboundKind = "failure_notice",
    answers: bool = True,
) -> Outbound:
    outbound = Outbound(
        delivery_id=delivery_id(state.session, kind, cause),
        thread=ThreadRef.model_validate(dict(state.thread)),
        kind=kind,
        text=text,
        reply_context=state.reply_context,
        answers=answers,
    )
    await broker.outbox.enqueue(
        outbound.delivery_id,
        state.session,
        state.lane,
        outbound.model_dump(mode="json"),
        now_ms=now_ms,
    )
    return outbound
