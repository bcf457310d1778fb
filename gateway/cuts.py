"""What the agent and the thread are told when a channel took only part of a message.

A channel keeps a message within its limits (`Inbound.cut`: the text beyond its limit;
`Inbound.unlisted_attachments`: files beyond those it lists). Nothing of it goes unsaid
(decision D169): the agent's user message ends with a line saying what it does not hold
(`agent_notes`), and a cut text is answered at once, in its thread, by a short notice
(`enqueue_cut_notice`) under a delivery id derived from the inbox item, so a retried or
duplicated event and a crash between the inbox and the outbox still send it once.
"""

from __future__ import annotations

from adapters import Inbound, Outbound, TextCut
from gateway.broker.contract import Broker
from gateway.replies import delivery_id

__all__ = ["agent_notes", "cut_notice_text", "enqueue_arrival_notice", "enqueue_cut_notice"]


def _counted(cut: TextCut) -> str:
    if cut.total is None:
        return f"its first {cut.kept:,} characters (it was too long to count)"
    return f"its first {cut.kept:,} of {cut.total:,} characters"


def _size(count: int) -> str:
    return f"{count / 1_000_000:.1f} MB" if count >= 1_000_000 else f"{count / 1000:.1f} KB"


def _unread(cut: TextCut) -> str | None:
    """How large a message too large to read was, against the limit (None: it was read)."""
    if cut.message_bytes is None:
        return None
    limit = f"; at most {_size(cut.limit_bytes)} is read" if cut.limit_bytes is not None else ""
    return f"{_size(cut.message_bytes)}{limit}"


def cut_notice_text(cut: TextCut) -> str:
    """The thread's notice: how much of the message was read, and what to do about the rest."""
    unread = _unread(cut)
    if unread is not None:
        return (
            f"Your message was too large for me to read ({unread}), so I did not read it. "
            "Please send it again without the large attachments."
        )
    return (
        f"Your message was longer than I can take: I read only {_counted(cut)}. "
        "If the rest matters, send it in another message."
    )


def agent_notes(inbound: Inbound) -> list[str]:
    """The lines that close the agent's user message when the channel took part of it only."""
    notes = []
    cut = inbound.cut
    unread = None if cut is None else _unread(cut)
    if unread is not None:
        have = "its subject only" if inbound.text else "nothing of it"
        notes.append(
            f"[This message was too large to read ({unread}): you have {have}. "
            "The sender has been told.]"
        )
    elif cut is not None:
        notes.append(f"[This message was cut: you have {_counted(cut)}. The sender has been told.]")
    if inbound.unlisted_attachments:
        count = inbound.unlisted_attachments
        notes.append(f"[{count:,} more attachment{'' if count == 1 else 's'}, not listed]")
    return notes


async def enqueue_cut_notice(broker: Broker, inbound: Inbound, session: str, item_id: str) -> None:
    """Tell `inbound`'s thread its text was cut (once per inbox item; no-op when it was not).

    Due when the message arrived. The notice replies to this message (its own reply context)
    and does not answer it: the agent's reply does (`Outbound.answers`; Slack's working
    reaction stays meanwhile).
    """
    if inbound.cut is None:
        return
    await enqueue_arrival_notice(
        broker, inbound, session, f"cut:{item_id}", cut_notice_text(inbound.cut)
    )


async def enqueue_arrival_notice(
    broker: Broker, inbound: Inbound, session: str, cause: str, text: str
) -> None:
    """Enqueue a notice about `inbound` as it arrives (once per `cause`), due at its arrival.

    It replies to this message (its own reply context) and does not answer it: the agent's
    reply does (`Outbound.answers`).
    """
    outbound = Outbound(
        delivery_id=delivery_id(session, "failure_notice", cause),
        thread=inbound.thread,
        kind="failure_notice",
        text=text,
        reply_context=inbound.reply_context,
        answers=False,
    )
    await broker.outbox.enqueue(
        outbound.delivery_id,
        session,
        inbound.thread.lane,
        outbound.model_dump(mode="json"),
        now_ms=inbound.received_at_ms,
    )
