"""Authority: whether a thread's lane may still act and speak, and the revocations that end it.

a13n's rule (reference §6.4): a run whose authority is withdrawn stops, ``authority_revoked``.
Here authority is withdrawn where the product loses it (D267): a channel says the bot may no
longer speak in a space or anywhere (Slack: removed from a channel, the channel archived or
deleted, the app uninstalled, its bot token revoked: `adapters.AuthorityChange`), the settings
no longer bind a thread to its session at start (a mailbox that is not the email channel's any
more, a route moved elsewhere: `judge_bindings`, D268), or an operator revokes a lane or a whole
session. A revocation is a broker mark per scope (a lane, a session, a channel's space, a whole
channel): durable, shared by every process, in effect at once wherever it is read:

* the deliverer posts nothing into a revoked thread: the delivery is a dead letter whose reason
  begins ``authority_revoked`` (an operator may redeliver it once authority is back);
* a message for a revoked thread is kept in the inbox as rejected, ``authority_revoked``, and
  never run; a decision or an operator's action (but an abort) on its lane is refused;
* the worker holding the session aborts the thread's open run with
  ``OperationError(code="authority_revoked")``: the run ends ``aborted`` with that error,
  durably (D266), and the audit trail names the run, why, and who revoked.

A worker learns of a change at once through a wake item in the session's inbox (`wake`) and,
for sessions it already holds, by the epoch mark (`EPOCH`) every change moves; a session nobody
holds is swept when it is next taken. `EPOCH` also says whether anything was ever revoked, so a
deployment that never revoked reads one mark per check. Restoring lifts a scope's revocation
(an operator's ``unrevoke``, the bot added back to a Slack channel): new messages run again;
what was kept or ended while revoked stays as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, Final, Literal, Self

from pydantic import ValidationError, model_validator

from adapters import ThreadRef
from gateway.broker.contract import Broker, InboxItem, Marks, NewAuditEvent, NewInboxItem
from gateway.closes import note_abort
from gateway.logs import event
from gateway.operator_actions import OperatorAction, refuse
from harness_core import AgentHarness, Clock, Ok, OperationError, SessionRepo
from harness_core.frozen import Frozen

__all__ = [
    "AUTHORITY_REVOKED",
    "end_revoked_runs",
    "EPOCH",
    "judge_bindings",
    "keep",
    "keep_if_revoked",
    "read_scope",
    "restore",
    "Revocation",
    "revocation_of",
    "revoke",
    "Scope",
    "ScopeKind",
    "wake",
]

log = logging.getLogger("gateway.authority")

AUTHORITY_REVOKED: Final = "authority_revoked"
"""The error code of a run ended by a revocation, and the start of what is kept or dead."""
EPOCH: Final = "authority:epoch"
"""Moved by every revocation and restore; unset while nothing was ever revoked."""
ROUTE_REMOVED: Final = "route_removed"
"""The cause `judge_bindings` gives (and the only one it lifts)."""
_CAS_TRIES = 20

ScopeKind = Literal["lane", "session", "space", "channel"]


class Scope(Frozen):
    """What a revocation covers: one lane, a session's lanes, a channel's space, a channel."""

    kind: ScopeKind
    session: str | None = None
    lane: str | None = None
    channel: str | None = None
    space: str | None = None

    @model_validator(mode="after")
    def _fields_match_kind(self) -> Self:
        wanted = {
            "lane": ("session", "lane"),
            "session": ("session",),
            "space": ("channel", "space"),
            "channel": ("channel",),
        }[self.kind]
        for name in ("session", "lane", "channel", "space"):
            if (getattr(self, name) is not None) != (name in wanted):
                raise ValueError(f"a {self.kind} scope {'needs' if name in wanted else 'has no'} "
                                 f"{name}")  # fmt: skip
        return self

    @classmethod
    def of_lane(cls, session: str, lane: str) -> Scope:
        """One lane of one session."""
        return cls(kind="lane", session=session, lane=lane)

    @classmethod
    def of_session(cls, session: str) -> Scope:
        """Every lane of a session."""
        return cls(kind="session", session=session)

    @classmethod
    def of_space(cls, channel: str, space: str) -> Scope:
        """Every thread of a channel's space (a Slack channel, a mailbox), in any session."""
        return cls(kind="space", channel=channel, space=space)

    @classmethod
    def of_channel(cls, channel: str) -> Scope:
        """Every thread of a channel (the Slack app uninstalled)."""
        return cls(kind="channel", channel=channel)

    @property
    def mark(self) -> str:
        """The broker mark holding the scope's revocation (session ids hold no space)."""
        if self.kind == "lane":
            return f"authority:lane:{self.session} {self.lane}"
        if self.kind == "session":
            return f"authority:session:{self.session}"
        if self.kind == "space":
            return f"authority:space:{self.channel}:{self.space}"
        return f"authority:channel:{self.channel}"

    def words(self) -> str:
        """The scope as an operator reads it."""
        if self.kind == "lane":
            return f"lane {self.lane} of session {self.session}"
        if self.kind == "session":
            return f"session {self.session}"
        if self.kind == "space":
            return f"{self.channel} space {self.space}"
        return f"every {self.channel} thread"


class Revocation(Frozen):
    """A scope's authority withdrawn: why, by whom, when; and whether and how it came back."""

    scope: Scope
    cause: str
    """What withdrew it: ``operator``, ``route_removed``, or the channel's event."""
    why: str
    """In words (an operator's reason, what the channel said)."""
    by: str
    """Who: ``operator:<name>``, ``slack:<user>``, ``gateway:<worker>``."""
    at_ms: int
    restored_by: str | None = None
    restored_at_ms: int | None = None
    restored_why: str | None = None

    @property
    def active(self) -> bool:
        """Whether the authority is still withdrawn (not restored since)."""
        return self.restored_at_ms is None

    def error(self) -> OperationError:
        """What a run it ends carries (its `OperationFinished.error`)."""
        return OperationError(code=AUTHORITY_REVOKED, message=self.why)

    def reason(self) -> str:
        """One line for what it keeps from running or posting (a rejection, a dead letter)."""
        return f"{AUTHORITY_REVOKED}: {self.why} ({self.scope.words()}, by {self.by})"

    def details(self) -> dict[str, Any]:
        """What the audit trail keeps of it."""
        return {
            "scope": self.scope.kind,
            "scope_name": self.scope.words(),
            "cause": self.cause,
            "why": self.why,
            "by": self.by,
            "at_ms": self.at_ms,
        }


async def read_scope(marks: Marks, scope: Scope) -> tuple[Revocation | None, str | None]:
    """The scope's revocation (active or restored) and the mark's raw value, None if never set.

    A value that cannot be read counts as a revocation (authority is not assumed back).
    """
    raw = await marks.get(scope.mark)
    if raw is None:
        return None, None
    try:
        return Revocation.model_validate_json(raw), raw
    except ValidationError:
        unreadable = Revocation(
            scope=scope, cause="unreadable", why="its revocation cannot be read", by="?", at_ms=0
        )
        return unreadable, raw


ThreadOf = Callable[[str], Awaitable[ThreadRef | None]]
"""The thread a lane of the session answers (None: unknown)."""


_UNREAD: Final = object()


async def revocation_of(
    marks: Marks,
    session: str,
    lane: str,
    thread: ThreadRef | ThreadOf | None = None,
    *,
    epoch: str | object | None = _UNREAD,
) -> Revocation | None:
    """The active revocation of a lane, its session, its thread's space or channel; None if none.

    One read while nothing was ever revoked (`EPOCH` unset); the narrowest scope wins. `thread`
    may be the session's `ThreadOf`, asked only once something was ever revoked. `epoch`: the
    `EPOCH` mark as read already (with an inbox append, ``read_mark=EPOCH``), read no earlier
    than the moment this answer must be as of.
    """
    if (await marks.get(EPOCH) if epoch is _UNREAD else epoch) is None:
        return None
    if callable(thread):
        thread = await thread(lane)
    scopes = [Scope.of_lane(session, lane), Scope.of_session(session)]
    if thread is not None:
        scopes += [Scope.of_space(thread.channel, thread.space), Scope.of_channel(thread.channel)]
    for scope in scopes:
        found, _ = await read_scope(marks, scope)
        if found is not None and found.active:
            return found
    return None


async def revoke(
    broker: Broker, scope: Scope, *, cause: str, why: str, by: str, now_ms: int
) -> tuple[Revocation, bool]:
    """Withdraw `scope`'s authority (durable on return); the revocation, and whether it changed.

    Idempotent: a scope revoked already keeps its first revocation (a repeated event, a second
    operator) and nothing is audited again. The epoch moves before the mark is written (so a
    check never skips a written revocation) and after (so holders of sessions look again).
    """
    for _ in range(_CAS_TRIES):
        found, raw = await read_scope(broker.marks, scope)
        if found is not None and found.active:
            return found, False
        revocation = Revocation(scope=scope, cause=cause, why=why, by=by, at_ms=now_ms)
        await _move_epoch(broker.marks)
        if await broker.marks.put(scope.mark, revocation.model_dump_json(), expect=raw):
            await _move_epoch(broker.marks)
            await _audit(broker, by, "authority revoked", revocation, "revoked")
            log.warning(event("authority revoked", scope=scope.words(), cause=cause, by=by))
            return revocation, True
    raise RuntimeError(f"the revocation of {scope.words()} kept changing under us")


async def restore(
    broker: Broker,
    scope: Scope,
    *,
    by: str,
    now_ms: int,
    why: str | None = None,
    lifts: Collection[str] | None = None,
    closes: bool = True,
) -> tuple[Revocation | None, bool]:
    """Give `scope` its authority back; its (restored) revocation, and whether it changed.

    `lifts`: only a revocation with one of these causes is lifted (a channel's own event never
    lifts an operator's revocation); None lifts any. A scope not revoked changes nothing.
    `closes`: send again the closes held back meanwhile (`close_again`); False for a caller
    that restores many scopes and sends them once, after.
    """
    for _ in range(_CAS_TRIES):
        found, raw = await read_scope(broker.marks, scope)
        if found is None or not found.active:
            return found, False
        if lifts is not None and found.cause not in lifts:
            return found, False
        restored = found.model_copy(
            update={"restored_by": by, "restored_at_ms": now_ms, "restored_why": why}
        )
        if await broker.marks.put(scope.mark, restored.model_dump_json(), expect=raw):
            await _move_epoch(broker.marks)
            await _audit(broker, by, "authority restored", restored, "restored")
            log.warning(event("authority restored", scope=scope.words(), by=by))
            if closes:
                await close_again(broker, (scope,), now_ms=now_ms)
            return restored, True
    raise RuntimeError(f"the revocation of {scope.words()} kept changing under us")


_CLOSES_SCANNED = 1_000
"""The most dead letters a restore looks through for closes to send again."""


async def close_again(broker: Broker, scopes: Collection[Scope], *, now_ms: int) -> int:
    """Send again the closes of approval requests that died while one of `scopes` was revoked.

    A close into a revoked thread is a dead letter (D267), and its request, already posted,
    kept its buttons: a card that looked open for a request nobody could decide any more (an
    outside probe, switching the README's examples). Once the thread may be written to again,
    those closes (and only those: a reply or a request held back stays for an operator) go
    back to the outbox. One pass over the dead letters, whatever the number of scopes.
    Returns how many.
    """
    if not scopes:
        return 0
    sent = 0
    after: str | None = None
    for _ in range(_CLOSES_SCANNED // 100):
        page = await broker.outbox.list("dead", after=after, limit=100)
        for delivery in page:
            outbound = delivery.outbound
            if (
                outbound.get("kind") == "approval_closed"
                and (delivery.last_error or "").startswith(AUTHORITY_REVOKED)
                and any(
                    _within(scope, delivery.session, delivery.lane, outbound.get("thread"))
                    for scope in scopes
                )
                and await revocation_of(
                    broker.marks, delivery.session, delivery.lane, _thread(outbound)
                )
                is None
            ):
                await broker.outbox.redeliver(delivery.id, now_ms=now_ms)
                sent += 1
        if len(page) < 100:
            break
        after = page[-1].id
    if sent:
        said = "; ".join(scope.words() for scope in scopes)
        log.info(event("closes sent again", scopes=said[:500], closes=sent))
    return sent


def _within(scope: Scope, session: str, lane: str, thread: Any) -> bool:
    if scope.kind == "lane":
        return (session, lane) == (scope.session, scope.lane)
    if scope.kind == "session":
        return session == scope.session
    if not isinstance(thread, Mapping) or thread.get("channel") != scope.channel:
        return False
    return scope.kind == "channel" or thread.get("space") == scope.space


def _thread(outbound: Mapping[str, Any]) -> ThreadRef | None:
    try:
        return ThreadRef.model_validate(outbound.get("thread"))
    except ValidationError:
        return None


async def wake(broker: Broker, session: str, revocation: Revocation) -> None:
    """Ask the worker of `session` (any that takes it) to end its revoked runs now.

    One inbox item per revocation (its dedupe key names it), so a repeated event or a retried
    request wakes the session once.
    """
    await broker.inbox.append(
        NewInboxItem(
            session=session,
            lane=revocation.scope.lane or "*",
            dedupe_key=f"authority:{revocation.scope.mark}:{revocation.at_ms}",
            kind="authority",
            payload=revocation.model_dump(mode="json"),
        )
    )


async def keep(broker: Broker, item: InboxItem, revocation: Revocation, *, actor: str) -> None:
    """Keep a message (or a decision) of a revoked thread: rejected with why, never run."""
    await broker.inbox.reject(item.session, item.id, revocation.reason())
    with contextlib.suppress(Exception):  # the item keeps its reason; the trail is for people
        await broker.audit.record(
            NewAuditEvent(
                actor=actor,
                action=f"revoked {item.kind} kept",
                session=item.session,
                lane=item.lane,
                target=item.id,
                outcome=AUTHORITY_REVOKED,
                details=revocation.details(),
            )
        )


async def keep_if_revoked(
    broker: Broker,
    item: InboxItem,
    thread: ThreadRef | ThreadOf | None,
    *,
    actor: str,
    clock: Clock,
) -> bool:
    """Settle an inbox item whose lane's authority is revoked (True), or leave it (False).

    A message or a decision is kept (`keep`); an operator's action is refused, except an abort,
    which needs no authority.
    """
    revocation = await revocation_of(broker.marks, item.session, item.lane, thread)
    if revocation is None:
        return False
    if item.kind == "operator":
        try:
            action = OperatorAction.model_validate(dict(item.payload))
        except ValidationError:
            return False  # refused as malformed, as ever
        if action.kind == "abort":
            return False
        await refuse(action, broker, clock, AUTHORITY_REVOKED, revocation.reason())
        await broker.inbox.ack(item.session, item.id)
        return True
    await keep(broker, item, revocation, actor=actor)
    return True


async def end_revoked_runs(
    harness: AgentHarness,
    broker: Broker,
    session: str,
    thread_of: ThreadOf,
    *,
    actor: str,
    before_abort: Callable[[str], None] = lambda run_id: None,
) -> list[tuple[str, str]]:
    """Abort every open operation of the session whose lane's authority is revoked.

    Each ends ``aborted`` with the revocation's error; who revoked is noted as who stopped it
    (an approval request it leaves is closed naming them), and the audit trail says which run
    ended, why, and how many queued messages went unrun with it. `before_abort(run_id)` runs
    first (the worker silences the run's live updates). Returns (lane, run id) of each.
    """
    ended: list[tuple[str, str]] = []
    for info in await harness.lanes(open_only=True):  # in memory: no reads
        if info.operation_id is None:
            continue
        revocation = await revocation_of(broker.marks, session, info.name, thread_of)
        lane = await harness.lane(info.name) if revocation is not None else None
        if revocation is None or lane is None:
            continue
        before_abort(info.operation_id)
        await note_abort(broker, session, lane, revocation.by)
        aborted = await lane.abort(revocation.error())
        if not isinstance(aborted, Ok):
            continue  # it ended meanwhile
        accepted = aborted.value
        unrun = len(accepted.steer) + len(accepted.follow_up)
        ended.append((info.name, accepted.run_id))
        with contextlib.suppress(Exception):  # the store has the end; the trail is for people
            await broker.audit.record(
                NewAuditEvent(
                    actor=actor,
                    action="revoked run aborted",
                    session=session,
                    lane=info.name,
                    target=accepted.run_id,
                    outcome=AUTHORITY_REVOKED,
                    details={**revocation.details(), "queued_not_run": unrun},
                )
            )
        log.warning(
            event("revoked run aborted", session=session, lane=info.name, run=accepted.run_id)
        )
    return ended


Judgement = tuple[bool, str] | None
"""How the settings bind a thread to its session: None (not judged: its channel does not run
here), (True, "") bound, or (False, why) no longer bound."""


async def judge_bindings(
    repo: SessionRepo,
    broker: Broker,
    judge: Callable[[str, ThreadRef], Judgement],
    *,
    by: str,
    now_ms: int,
) -> tuple[int, int]:
    """Revoke the lanes the settings no longer bind to their session; restore the rebound (D268).

    Every thread the broker remembers, of every session, is judged once (a start's background
    pass). A lane that lost its binding is revoked (``route_removed``) and its session woken;
    one revoked so whose binding is back is restored (nothing else lifts that cause, nor does
    this lift any other). Returns (revoked, restored).
    """
    revoked = restored = 0
    lifted: list[Scope] = []
    for meta in await repo.list():
        woken = False
        for state in await broker.threads.list(meta.id):
            try:
                thread = ThreadRef.model_validate(dict(state.thread))
            except ValidationError:
                continue
            verdict = judge(meta.id, thread)
            if verdict is None:
                continue
            bound, why = verdict
            scope = Scope.of_lane(meta.id, state.lane)
            if bound:
                _, changed = await restore(
                    broker,
                    scope,
                    by=by,
                    now_ms=now_ms,
                    why="the settings bind the thread to its session again",
                    lifts=(ROUTE_REMOVED,),
                    closes=False,  # once for every lane restored, below
                )
                restored += changed
                if changed:
                    lifted.append(scope)
                continue
            revocation, changed = await revoke(
                broker, scope, cause=ROUTE_REMOVED, why=why, by=by, now_ms=now_ms
            )
            revoked += changed
            if revocation.active and not woken:
                await wake(broker, meta.id, revocation)
                woken = True
        await asyncio.sleep(0)  # a long pass never holds the loop
    await close_again(broker, lifted, now_ms=now_ms)
    return revoked, restored


async def _move_epoch(marks: Marks) -> None:
    for _ in range(_CAS_TRIES):
        raw = await marks.get(EPOCH)
        current = int(raw) if raw is not None and raw.isascii() and raw.isdigit() else 0
        if await marks.put(EPOCH, str(current + 1), expect=raw):
            return
    raise RuntimeError("the authority epoch kept changing under us")


async def _audit(
    broker: Broker, actor: str, action: str, revocation: Revocation, outcome: str
) -> None:
    scope = revocation.scope
    details = revocation.details()
    if revocation.restored_by is not None:
        details.update(restored_by=revocation.restored_by, restored_why=revocation.restored_why)
    with contextlib.suppress(Exception):  # the mark is the state; the trail is for people
        await broker.audit.record(
            NewAuditEvent(
                actor=actor,
                action=action,
                session=scope.session,
                lane=scope.lane,
                target=scope.mark,
                outcome=outcome,
                details=details,
            )
        )
