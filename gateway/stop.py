"""In-thread stop: a message that says only ``stop`` aborts the thread's running operation.

People expect to call a bot off from the thread they are talking in, not from an operator page.
A message whose whole text is one of `STOP_WORDS` (any case, trailing ``.`` or ``!`` ignored),
sent while its lane has an open operation (a run working, retrying, or waiting for approval),
aborts that operation instead of reaching the model; the thread is answered `STOPPED_TEXT`,
naming the messages sent meanwhile that were dropped with it. Sent to an idle lane, the same
word is an ordinary message: "cancel" may well answer the model's question.

Crash safety: the stop is remembered in a broker mark (``stop:<session>:<item>``) before the
abort, so a stop redelivered after a crash is never mistaken for an ordinary message because
the lane it stopped is idle now; its notice has a delivery id of its own item, so it is sent
once. Anyone who may post in the thread may stop it, as they may steer it; the audit trail
records who did.
"""

from __future__ import annotations

from adapters import Inbound
from gateway.broker.contract import Broker, InboxItem, NewAuditEvent
from gateway.closes import note_abort
from gateway.replies import enqueue_stop_notice
from harness_core import AgentLane, Ok

__all__ = [
    "NOTHING_TO_STOP_TEXT",
    "STOPPED_TEXT",
    "STOP_WORDS",
    "is_stop",
    "stop",
    "stopped_text",
]

STOP_WORDS = frozenset({"stop", "/stop", "cancel", "/cancel"})
STOPPED_TEXT = "Stopped."
NOTHING_TO_STOP_TEXT = "Nothing left to stop: it had just finished."
_STOPPING = "stopping"


def is_stop(text: str) -> bool:
    """Whether `text` is only a stop word (``Stop!``, ``/stop``, ``cancel.``)."""
    return text.strip().rstrip(".!").strip().lower() in STOP_WORDS


def _mark(item: InboxItem) -> str:
    return f"stop:{item.session}:{item.id}"


async def stop(
    broker: Broker, item: InboxItem, inbound: Inbound, lane: AgentLane, *, now_ms: int
) -> bool:
    """Stop `lane` for the stop message `item`; False: nothing is open, it is a message.

    Acknowledges `item` when it returns True. Call it only for a message `is_stop` accepts.
    """
    marks = broker.marks
    name = _mark(item)
    said = await marks.get(name)
    if said is None:
        if (await lane.info()).operation_id is None:
            return False
        if not await marks.put(name, _STOPPING, expect=None):
            said = await marks.get(name)  # a process that took the session before us was here
    if said is None or said == _STOPPING:
        redelivered = said == _STOPPING
        await note_abort(broker, item.session, lane, inbound.author.id)  # who closed a request
        aborted = await lane.abort()
        if isinstance(aborted, Ok):
            dropped = len(aborted.value.steer) + len(aborted.value.follow_up)
            said = stopped_text(dropped)
        else:  # it ended meanwhile, or a stop before a crash already ended it
            said = STOPPED_TEXT if redelivered else NOTHING_TO_STOP_TEXT
        await marks.put(name, said, expect=_STOPPING)
    state = await broker.threads.get(item.session, item.lane)
    if state is not None:
        await enqueue_stop_notice(broker, state, item.id, said, now_ms=now_ms)
    await broker.audit.record(
        NewAuditEvent(
            actor=f"{inbound.thread.channel}:{inbound.author.id}",
            action="stop requested",
            session=item.session,
            lane=item.lane,
            target=item.id,
            outcome="stopped" if said.startswith(STOPPED_TEXT) else "nothing to stop",
            details={},
        )
    )
    await broker.inbox.ack(item.session, item.id)
    return True


def stopped_text(dropped: int, *, by: str | None = None) -> str:
    """What the thread is told of a stop.

    `STOPPED_TEXT`, or by whom (an operator's abort), and how many of its messages went with
    the run.
    """
    said = STOPPED_TEXT if by is None else f"Stopped by {by}."
    if dropped == 0:
        return said
    messages = "message" if dropped == 1 else "messages"
    return f"{said} The {dropped} {messages} sent while I was working went with it."
