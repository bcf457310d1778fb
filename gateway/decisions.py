"""Judging a channel's decision against the request it names, before anything is stored.

A click (Slack's button, the web page, an email link) names a wait, its run, the calls and the
digests of the arguments the decider saw, and sometimes the session. Every one of them is
checked against the store (read without the lease, like the operator API's checks) before the
decision reaches the inbox: a decision for a wait this thread never had, for another run,
session, calls or arguments, or for a request that no longer waits, is refused at once with the
reason (and who closed the request), and stores nothing: no inbox item, no lane, no thread. So
a decision that can change nothing never takes the slot of one that can (the first *valid*
decision wins), and the decider learns why in their own response.

The worker judges again under the lease (the lane's admission rules): a decision valid here can
still lose a race with another one, and D129's notice tells the thread.
"""

from __future__ import annotations

import contextlib

from adapters import ApprovalClosed, DecisionInbound, DecisionRefused, Unavailable
from gateway.broker.contract import Broker
from gateway.closes import closure, decided_of, described
from harness_core import SessionError, SessionRepo, SessionStorage
from harness_core.session.records import ApprovalRequested

__all__ = ["MISMATCH_TEXT", "NO_WAIT_TEXT", "closed_refusal", "judge"]

NO_WAIT_TEXT = (
    "Nothing waits for a decision here: this thread has no such approval request. "
    "Nothing was recorded."
)
MISMATCH_TEXT = (
    "This decision does not match the request it names (its run, session, calls or "
    "arguments differ). Nothing was recorded."
)


async def judge(repo: SessionRepo, broker: Broker, session: str, decision: DecisionInbound) -> None:
    """Refuse `decision` unless it names exactly an open wait of its thread.

    Raises:
        DecisionRefused: no such wait in this thread, another run/session/batch, or closed.
        Unavailable: the store cannot be read now (the channel retries; nothing was stored).
    """
    try:
        storage = await repo.open(session)  # read-only: no lease taken
    except SessionError as exc:
        if exc.code == "not_found":
            raise DecisionRefused("no_wait", NO_WAIT_TEXT) from None
        raise Unavailable(f"the store is unavailable ({exc.code})") from exc
    except Exception as exc:
        raise Unavailable(f"the store is unavailable ({type(exc).__name__})") from exc
    try:
        await _judge(storage, broker, session, decision)
    except (DecisionRefused, Unavailable):
        raise
    except Exception as exc:
        raise Unavailable(f"the store is unavailable ({type(exc).__name__})") from exc
    finally:
        with contextlib.suppress(Exception):  # a read-only handle: nothing to lose
            await storage.close()


async def _judge(
    storage: SessionStorage, broker: Broker, session: str, decision: DecisionInbound
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
    decided = await decided_of(storage, wait)
    if decided is not None and getattr(decided.record, "idempotency_key", None) == decision.slot:
        return  # this very decision, again (a retry, a double click): the inbox says duplicate
    closed = await closure(storage, broker, session, requested)
    if closed is not None:
        raise closed_refusal(closed)


def closed_refusal(closed: ApprovalClosed) -> DecisionRefused:
    """The refusal of a decision for a request that no longer waits (naming who closed it)."""
    return DecisionRefused(
        "closed",
        f"This request is no longer waiting: {described(closed)}. Nothing was changed.",
        closed,
    )
