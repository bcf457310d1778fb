"""Intake: the gateway's side of the channel seam (messages and clicks into the durable inbox).

An adapter calls `accept` (or `decide`); the thread is routed to its session, the lane's reply
context is remembered, and the item is appended to the session's inbox, deduplicated by the
message's identity (a message the channel cut is also answered with a notice saying so, in the
outbox, before the call returns). A decision is first judged against the request it names
(`gateway.decisions`): one that can change nothing is refused and stores nothing. Only then
does the call return, and only then may the adapter acknowledge its channel: nothing it
acknowledged can be lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from adapters import (
    STORE_FULL,
    Acceptance,
    Attachment,
    AuthorityChange,
    DecisionInbound,
    DecisionRefused,
    FileLimits,
    FileRefused,
    Inbound,
    IncomingFile,
    KnownThread,
    NotRouted,
    ThreadRef,
    Unavailable,
    store_full,
    take_in,
)
from gateway.authority import (
    EPOCH,
    Revocation,
    Scope,
    keep,
    restore,
    revocation_of,
    revoke,
    wake,
)
from gateway.broker.contract import BlobRefused, Broker, LaneTaken, NewInboxItem, ThreadState
from gateway.cuts import enqueue_cut_notice
from gateway.decisions import Approvers, ToolApprovers, judge
from gateway.files import enqueue_file_notice
from gateway.logs import event
from harness_core import SessionRepo
from harness_core.session.names import check_lane_name, check_session_id

__all__ = ["Intake"]

log = logging.getLogger("gateway.intake")

_ACTOR = "intake"
REVOKED_DECISION_TEXT = (
    "This thread's authority was revoked: decisions here change nothing. Nothing was recorded."
)


class Intake:
    """Routes inbound messages to sessions and holds them in the inbox (an `InboundSink`)."""

    def __init__(
        self,
        broker: Broker,
        route: Callable[[str, str], str | None],
        repo: SessionRepo | None = None,
        *,
        approvers: Approvers | None = None,
        tool_approvers: ToolApprovers | None = None,
        file_limits: FileLimits | None = None,
    ) -> None:
        self._broker = broker
        self._file_limits = file_limits or FileLimits()
        self._route = route
        """(channel, space) -> the session id, or None when nothing is bound."""
        self._repo = repo
        """Where decisions are judged before they are held (None: held unjudged, for tests)."""
        self._approvers = approvers
        """A thread's profile's approvers (None: whoever the channel allows)."""
        self._tool_approvers = tool_approvers
        """A tool's own approvers (None: no tool names its own)."""
        self._tasks: set[asyncio.Future[None]] = set()
        """Background wakes of every session (a channel-wide revocation)."""

    def _session_of(self, thread: ThreadRef) -> str:
        session = self._route(thread.channel, thread.space)
        if session is None:
            raise NotRouted(f"no session is bound to {thread.channel} space {thread.space!r}")
        try:
            check_session_id(session)
            check_lane_name(thread.lane)
        except ValueError as exc:
            raise NotRouted(str(exc)) from exc
        return session

    async def accept(self, inbound: Inbound) -> Acceptance:
        """See `InboundSink.accept`."""
        session = self._session_of(inbound.thread)
        lane = inbound.thread.lane
        reused = False
        try:
            appended = await self._broker.inbox.append(
                NewInboxItem(
                    session=session,
                    lane=lane,
                    dedupe_key=inbound.dedupe_key,
                    kind="message",
                    payload=inbound.model_dump(mode="json"),
                ),
                thread=inbound.thread.model_dump(mode="json"),
                reply_context=dict(inbound.reply_context),
                read_mark=EPOCH,
            )
            reused = appended.duplicate and _reused(appended.item.payload, inbound)
            revocation = await revocation_of(
                self._broker.marks, session, lane, inbound.thread, epoch=appended.mark
            )
            if revocation is not None:  # kept, never run, nothing said in the thread (D267)
                if appended.item.status == "pending":
                    await keep(self._broker, appended.item, revocation, actor=_ACTOR)
            elif not reused:
                # a duplicate too: the first accept may have ended between the two writes
                await enqueue_cut_notice(self._broker, inbound, session, appended.item.id)
                await enqueue_file_notice(self._broker, inbound, session, appended.item.id)
        except LaneTaken as taken:  # another space's thread id: never its conversation (D332)
            log.warning(
                event(
                    "lane of another space",
                    session=session,
                    lane=lane,
                    space=inbound.thread.space,
                    its_space=taken.space,
                )
            )
            raise NotRouted(str(taken)) from None
        except Exception as exc:  # the inbox could not hold it: the channel must retry
            full = store_full(exc)
            log.warning(event("inbox unavailable", error=type(exc).__name__, full=full))
            if full:  # "retry" alone sent the sender into the same wall, unexplained
                raise Unavailable(f"the inbox's {STORE_FULL}") from exc
            raise Unavailable(f"the inbox is unavailable ({type(exc).__name__})") from exc
        elsewhere = appended.item.lane != lane  # its id names another thread's message
        log.info(
            event(
                "message id of another thread" if elsewhere else "message accepted",
                session=session,
                lane=lane,
                item=appended.item.id,
                duplicate=appended.duplicate,
                reused=reused,
                its_lane=appended.item.lane if elsewhere else None,
            )
        )
        return Acceptance(
            item_id=appended.item.id,
            session=appended.item.session,  # a duplicate's own: a channel can see a reused id
            lane=appended.item.lane,
            duplicate=appended.duplicate,
            revoked=revocation is not None,
            reused=reused,
        )

    async def take_files(
        self, thread: ThreadRef, files: Sequence[IncomingFile]
    ) -> tuple[Attachment, ...]:
        """See `InboundSink.take_files` (the blobs are the session's, keyed by channel)."""
        session = self._session_of(thread)
        blobs = self._broker.blobs

        async def find(key: str) -> tuple[str, int] | None:
            info = await blobs.find(session, f"{thread.channel}:{key}")
            return None if info is None else (info.id, info.size)

        async def put(key: str, data: bytes) -> str:
            try:
                return (await blobs.put(session, data, key=f"{thread.channel}:{key}")).id
            except BlobRefused as refused:
                raise FileRefused(str(refused)) from None

        try:
            taken = await take_in(files, self._file_limits, find=find, put=put)
        except Unavailable as exc:
            log.warning(event("files unavailable", session=session, error=str(exc)))
            raise
        except Exception as exc:  # the blob area could not be read or written
            log.warning(event("blob area unavailable", error=type(exc).__name__))
            raise Unavailable(f"the blob area is unavailable ({type(exc).__name__})") from exc
        log.info(
            event(
                "files taken in",
                session=session,
                lane=thread.lane,
                held=sum(1 for a in taken if a.blob is not None),
                refused=sum(1 for a in taken if a.refused is not None),
            )
        )
        return taken

    async def decide(self, decision: DecisionInbound) -> Acceptance:
        """See `InboundSink.decide`."""
        session = self._session_of(decision.thread)
        lane = decision.thread.lane
        try:
            revocation = await revocation_of(self._broker.marks, session, lane, decision.thread)
        except Exception as exc:
            raise Unavailable(f"the broker is unavailable ({type(exc).__name__})") from exc
        if revocation is not None:
            raise DecisionRefused("closed", REVOKED_DECISION_TEXT)
        if self._repo is not None:
            try:
                await judge(
                    self._repo,
                    self._broker,
                    session,
                    decision,
                    approvers=self._approvers or _nobody_more,
                    tool_approvers=self._tool_approvers or _nobody_more,
                )
            except DecisionRefused as refused:
                # who tried, and from where: an operator can see attempts (nothing is stored)
                log.warning(
                    event(
                        "decision refused",
                        session=session,
                        lane=lane,
                        wait=decision.wait_id,
                        reason=refused.code,
                        channel=decision.thread.channel,
                        space=decision.thread.space,
                        decided_by=decision.decided_by.id,
                        identified=decision.identified,
                    )
                )
                raise
        try:
            appended = await self._broker.inbox.append(
                NewInboxItem(
                    session=session,
                    lane=lane,
                    # one decision a wait: two clicks that differ (Approve and Deny at once)
                    # both passed `judge` before either was applied, and both were taken
                    dedupe_key=f"decision:{lane}:{decision.wait_id}",
                    kind="decision",
                    payload=decision.model_dump(mode="json"),
                )
            )
        except Exception as exc:
            log.warning(event("inbox unavailable", error=type(exc).__name__))
            raise Unavailable(f"the inbox is unavailable ({type(exc).__name__})") from exc
        log.info(
            event(
                "decision accepted",
                session=session,
                lane=lane,
                item=appended.item.id,
                duplicate=appended.duplicate,
            )
        )
        first = None
        if appended.duplicate:
            try:
                first = DecisionInbound.model_validate(dict(appended.item.payload))
            except ValidationError:  # not a decision under that key: say nothing about it
                first = None
            if first is not None and first.slot != decision.slot:  # another decision came first
                raise DecisionRefused("closed", _taken_first(first))
        return Acceptance(
            item_id=appended.item.id,
            session=session,
            lane=lane,
            duplicate=appended.duplicate,
            first=first,
        )

    async def known(self, thread: ThreadRef) -> KnownThread | None:
        """See `InboundSink.known`."""
        session = self._session_of(thread)
        try:
            state = await self._broker.threads.get(session, thread.lane)
        except Exception as exc:
            raise Unavailable(f"the broker is unavailable ({type(exc).__name__})") from exc
        return None if state is None else _known(state)

    async def threads(self, channel: str, space: str) -> tuple[KnownThread, ...]:
        """See `InboundSink.threads`."""
        probe = ThreadRef(channel=channel, space=space, thread="-")
        session = self._session_of(probe)
        try:
            states = await self._broker.threads.list(session)
        except Exception as exc:
            raise Unavailable(f"the broker is unavailable ({type(exc).__name__})") from exc
        found = (_known(state) for state in states)
        return tuple(
            known
            for known in found
            if known is not None and known.thread.channel == channel and known.thread.space == space
        )

    async def read_file(self, channel: str, space: str, blob: str) -> bytes | None:
        """See `InboundSink.read_file`."""
        session = self._session_of(ThreadRef(channel=channel, space=space, thread="-"))
        try:
            return await self._broker.blobs.get(session, blob)
        except Exception as exc:
            raise Unavailable(f"the blob area is unavailable ({type(exc).__name__})") from exc

    async def authority(self, change: AuthorityChange) -> None:
        """See `InboundSink.authority` (scopes and effects: `gateway.authority`)."""
        scope = (
            Scope.of_channel(change.channel)
            if change.space is None
            else Scope.of_space(change.channel, change.space)
        )
        by = f"{change.channel}:{change.by}" if change.by else change.channel
        try:
            if not change.revoked:
                await restore(
                    self._broker,
                    scope,
                    by=by,
                    now_ms=change.at_ms,
                    why=change.why,
                    lifts=change.lifts,
                )
                return
            revocation, _ = await revoke(
                self._broker, scope, cause=change.cause, why=change.why, by=by, now_ms=change.at_ms
            )
            if revocation.active and change.space is not None:
                session = self._route(change.channel, change.space)
                if session is not None:  # its threads' runs end now (others' when next taken)
                    await wake(self._broker, session, revocation)
        except Exception as exc:  # not recorded: the channel must send it again
            log.warning(event("authority change unrecorded", error=type(exc).__name__))
            raise Unavailable(f"the broker is unavailable ({type(exc).__name__})") from exc
        if revocation.active and change.space is None and self._repo is not None:
            self._spawn(self._wake_all(revocation))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _wake_all(self, revocation: Revocation) -> None:
        """Wake every session (a whole channel's authority went), in the background.

        Best effort: a session it misses ends its revoked runs when it is next taken, and no
        thread of it is posted into meanwhile (the deliverer reads the revocation itself).
        """
        assert self._repo is not None
        try:
            for meta in await self._repo.list():
                await wake(self._broker, meta.id, revocation)
        except Exception as exc:
            log.warning(event("sessions not woken", error=type(exc).__name__))

    async def get_mark(self, name: str) -> str | None:
        """See `InboundSink.get_mark`."""
        try:
            return await self._broker.marks.get(name)
        except Exception as exc:
            raise Unavailable(f"the broker is unavailable ({type(exc).__name__})") from exc

    async def put_mark(self, name: str, value: str, *, expect: str | None) -> bool:
        """See `InboundSink.put_mark`."""
        try:
            return await self._broker.marks.put(name, value, expect=expect)
        except Exception as exc:
            raise Unavailable(f"the broker is unavailable ({type(exc).__name__})") from exc


def _reused(first: Mapping[str, Any], inbound: Inbound) -> bool:
    """Whether the inbox's `first` message under `inbound`'s key is another message (D382).

    Only two digests that differ say so: a message held before digests were recorded, or a
    channel that records none, is the same message sent again, so a take retried across an
    upgrade is never answered twice.
    """
    digest = first.get("content_digest")
    return None not in (digest, inbound.content_digest) and digest != inbound.content_digest


def _nobody_more(_: object) -> frozenset[str] | None:
    return None


def _known(state: ThreadState) -> KnownThread | None:
    try:
        thread = ThreadRef.model_validate(dict(state.thread))
    except ValidationError:
        return None
    return KnownThread(thread=thread, session=state.session, reply_context=state.reply_context)


def _taken_first(first: DecisionInbound) -> str:
    """Why a decision that came second is refused: who decided first, and how."""
    who = first.decided_by.name or first.decided_by.id
    if any(d.supplied is not None for d in first.decisions):
        how = "answered with the result of an action they did"
    elif all(d.approved for d in first.decisions):
        how = "approved"
    elif not any(d.approved for d in first.decisions):
        how = "denied"
    else:
        how = "decided (some calls approved, some denied)"
    return (
        f"This request was already {how} by {who}, just before your decision, which changed "
        "nothing. Nothing was recorded."
    )
