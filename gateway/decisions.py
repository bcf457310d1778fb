"""Judging a channel's decision against the request it names, before anything is stored.

A click (Slack's button, the web page, an email link) names a wait, its run, the calls and the
digests of the arguments the decider saw, and sometimes the session. Every one of them is
checked against the store (read without the lease, like the operator API's checks) before the
decision reaches the inbox: a decision for a wait this thread never had, for another run,
session, calls or arguments, or for a request that no longer waits, is refused at once with the
reason (and who closed the request), and stores nothing: no inbox item, no lane, no thread. So
a decision that can change nothing never takes the slot of one that can (the first *valid*
decision wins), and the decider learns why in their own response.

A decision must also come from an approver: someone the channel allows (the channel checks),
and, when the thread's profile names approvers, one of them, and, when a decided call's tool
names approvers of its own (an MCP server's per-tool override), one of those too. A decision
from anyone else is refused the same way: nothing stored, and the decider told why.

The worker judges again under the lease (the lane's admission rules): a decision valid here can
still lose a race with another one, and D129's notice tells the thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection

from adapters import ApprovalClosed, DecisionInbound, DecisionRefused, ThreadRef, Unavailable
from gateway.broker.contract import Broker
from gateway.closes import closure, decided_of, described
from harness_core import SessionError, SessionRepo, SessionStorage
from harness_core.session.records import ApprovalRequested

__all__ = [
    "MISMATCH_TEXT",
    "NOT_AN_APPROVER_TEXT",
    "NO_WAIT_TEXT",
    "UNIDENTIFIED_TEXT",
    "Approvers",
    "ToolApprovers",
    "closed_refusal",
    "judge",
]

Approvers = Callable[[ThreadRef], frozenset[str] | None]
"""Who may decide a thread's requests beyond the channel's own rule (None: no one more)."""
ToolApprovers = Callable[[str], frozenset[str] | None]
"""A tool's own approvers by the tool's name (None: the tool names none)."""

NO_WAIT_TEXT = (
    "Nothing waits for a decision here: this thread has no such approval request. "
    "Nothing was recorded."
)
MISMATCH_TEXT = (
    "This decision does not match the request it names (its run, session, calls or "
    "arguments differ). Nothing was recorded."
)
UNIDENTIFIED_TEXT = (
    "This request is for its named approvers, and this channel cannot tell who you are, so "
    "your decision was not taken. Nothing was recorded; an operator can decide it "
    "(gateway ops approve or deny)."
)
NOT_AN_APPROVER_TEXT = (
    "You are not among the approvers of this request{what}, so your decision was not taken. "
    "Nothing was recorded."
)


def _anyone(_: object) -> frozenset[str] | None:
    return None


async def judge(
    repo: SessionRepo,
    broker: Broker,
    session: str,
    decision: DecisionInbound,
    *,
    approvers: Approvers = _anyone,
    tool_approvers: ToolApprovers = _anyone,
) -> None:
    """Refuse `decision` unless it names exactly an open wait of its thread, from an approver.

    Its thread is the lane's as the lane began (`Threads.remember`): a decision naming the
    lane from another space (a web thread id used in two spaces of one session) is refused,
    so the approvers of the space it claims never stand in for the lane's own (D332).

    `approvers`: the thread's profile's approvers (None: whoever the channel allows);
    `tool_approvers`: a tool's own (None: the tool names none). The decider's id must be in
    each set that is given.

    Raises:
        DecisionRefused: no such wait in this thread, another run/session/batch, closed, or
            the decider is not an approver (``not_allowed``).
        Unavailable: the store cannot be read now (the channel retries; nothing was stored).
    """
    decider = decision.decided_by.id
    try:  # the thread the lane began with: another space naming its lane decides nothing
        state = await broker.threads.get(session, decision.thread.lane)
    except Exception as exc:
        raise Unavailable(f"the broker is unavailable ({type(exc).__name__})") from exc
    if state is not None and state.thread.get("space") != decision.thread.space:
        raise DecisionRefused("no_wait", NO_WAIT_TEXT)  # D332
    allowed = approvers(decision.thread)
    if allowed is not None and not decision.identified:
        raise DecisionRefused("not_allowed", UNIDENTIFIED_TEXT)
    if allowed is not None and not _among(decider, allowed):
        raise DecisionRefused("not_allowed", NOT_AN_APPROVER_TEXT.format(what=""))
    try:
        storage = await repo.open(session)  # read-only: no lease taken
    except SessionError as exc:
        if exc.code == "not_found":
            raise DecisionRefused("no_wait", NO_WAIT_TEXT) from None
        raise Unavailable(f"the store is unavailable ({exc.code})") from exc
    except Exception as exc:
        raise Unavailable(f"the store is unavailable ({type(exc).__name__})") from exc
    try:
        await _judge(storage, broker, session, decision, tool_approvers)
    except (DecisionRefused, Unavailable):
        raise
    except Exception as exc:
        raise Unavailable(f"the store is unavailable ({type(exc).__name__})") from exc
    finally:
        with contextlib.suppress(Exception):  # a read-only handle: nothing to lose
            await storage.close()


async def _judge(
    storage: SessionStorage,
    broker: Broker,
    session: str,
    decision: DecisionInbound,
    tool_approvers: ToolApprovers,
) -> None:
    requested = await storage.get_record(decision.wait_id)
    if requested is None:
        raise DecisionRefused("no_wait", NO_WAIT_TEXT)
    wait = requested.record
    if not isinstance(wait, ApprovalRequested) or wait.lane != decision.thread.lane:
        raise DecisionRefused("no_wait", NO_WAIT_TEXT)
    given = sorted((d.tool_call_id, d.args_digest) for d in decision.decisions)
    wanted = sorted((p.tool_call_id, p.args_digest) for p in wait.calls)
    if decision.session not in (None, session) or decision.run_id != wait.run_id or given != wanted:
        raise DecisionRefused("mismatch", MISMATCH_TEXT)
    for tool in sorted({call.tool_name for call in wait.calls}):
        allowed = tool_approvers(tool)
        if allowed is not None and not decision.identified:
            raise DecisionRefused("not_allowed", UNIDENTIFIED_TEXT)
        if allowed is not None and not _among(decision.decided_by.id, allowed):
            what = f" (calls of {tool} need one of its own approvers)"
            raise DecisionRefused("not_allowed", NOT_AN_APPROVER_TEXT.format(what=what))
    closed = await closure(storage, broker, session, requested)
    if closed is None:
        return
    # read after the closure: a worker may apply the decision between two reads
    decided = await decided_of(storage, wait)
    if decided is not None and getattr(decided.record, "idempotency_key", None) == decision.slot:
        return  # this very decision, again (a retry, a double click): the inbox says duplicate
    raise closed_refusal(closed)


def _among(decider: str, approvers: Collection[str]) -> bool:
    """Whether `decider` is one of `approvers`: an email address without regard to case.

    The email channel lowercases the addresses it vouches for; a profile's
    ``approver@EXAMPLE.com`` refused the very person its link was mailed to.
    """
    if decider in approvers:
        return True
    return "@" in decider and decider.casefold() in {a.casefold() for a in approvers if "@" in a}


def closed_refusal(closed: ApprovalClosed) -> DecisionRefused:
    """The refusal of a decision for a request that no longer waits (naming who closed it)."""
    return DecisionRefused(
        "closed",
        f"This request is no longer waiting: {described(closed)}. Nothing was changed.",
        closed,
    )
