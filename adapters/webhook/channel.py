"""`WebhookChannel`: anything that can POST signed JSON talks to the agent and is answered so.

In: ``POST /webhook/events`` (payloads in `adapters.webhook.payloads`), signed per Standard
Webhooks. The signature headers and the timestamp are checked before the body is read (a
request without them, or older than the tolerance, is refused unread), the body is bounded,
then its signature is checked over the raw bytes, and only then is it parsed. A message is
handed to the sink and acknowledged (202) only once the sink holds it durably; a sender's
redelivery (the same ``message_id``; without one, the same ``webhook-id``) is acknowledged
again as a duplicate and taken once. A decision is taken only from a configured approver, then
judged by the gateway; one that can change nothing stores nothing. Without an
``idempotency_key`` its key derives from what it decides (`decision_key`): the same decision
sent again, under any ``webhook-id``, is one decision, as a double click is on the other
channels.

Every refusal is one JSON envelope ``{"error": {"code", "message"}}`` and stores nothing: 400
(``invalid_json``, ``invalid_request``, ``invalid_text``, ``empty_text``, ``text_too_long``),
401 (``unsigned``, ``invalid_webhook_id``, ``stale_timestamp``, ``bad_signature``), 403
``not_approver``, 404 ``not_routed``, 409 (``no_such_request``, ``not_the_request``,
``no_longer_waiting``), 413 ``too_large``, 415 ``unsupported_media_type``, 503 ``unavailable``
(with ``Retry-After``: send again; it is taken once).

Out: `deliver` and `reconcile` are `WebhookDelivery`'s (signed POSTs to the configured URL).
"""

from __future__ import annotations

import hashlib
import json
import logging
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from adapters.channel import (
    Acceptance,
    Author,
    Capabilities,
    DecisionInbound,
    DecisionItem,
    DecisionRefused,
    DeliveryError,
    DeliveryReceipt,
    Inbound,
    InboundSink,
    NotRouted,
    Outbound,
    Reconciled,
    ThreadRef,
    Unavailable,
)
from adapters.errors import AdapterError
from adapters.json_bodies import blank, body_problem, read_json, result_problem, text_problem
from adapters.webhook.delivery import WebhookDelivery
from adapters.webhook.payloads import (
    MAX_REPLY_CONTEXT_BYTES,
    AuthorIn,
    DecisionIn,
    DecisionItemIn,
    MessageIn,
)
from adapters.webhook.signing import SignatureRefused, check_headers, verify
from harness_core import Clock, SuppliedResult, SystemClock

__all__ = ["CHANNEL", "EVENTS_PATH", "WebhookChannel", "WebhookLimits", "decision_key"]

log = logging.getLogger("adapters.webhook")

CHANNEL = "webhook"
EVENTS_PATH = "/webhook/events"

WebhookRefusal = Literal[
    "invalid_json",
    "invalid_request",
    "invalid_text",
    "empty_text",
    "text_too_long",
    "unsigned",
    "invalid_webhook_id",
    "stale_timestamp",
    "bad_signature",
    "not_approver",
    "not_routed",
    "no_such_request",
    "not_the_request",
    "no_longer_waiting",
    "message_id_taken",
    "too_large",
    "unsupported_media_type",
    "unavailable",
]
"""The webhook channel's closed error codes (a sender branches on them)."""
_REFUSED_DECISION: dict[str, WebhookRefusal] = {
    "no_wait": "no_such_request",
    "mismatch": "not_the_request",
    "closed": "no_longer_waiting",
    "not_allowed": "not_approver",
}


@dataclass(frozen=True)
class WebhookLimits:
    """What the channel takes in."""

    max_body_bytes: int = 256 * 1024
    max_text_chars: int = 32_000
    tolerance_s: int = 300
    """How far a ``webhook-timestamp`` may be from the clock, either way."""
    retry_after_s: int = 2
    """``Retry-After`` of a 503."""


class _Refused(AdapterError):
    """A request refused with one status and one envelope (nothing was stored)."""

    def __init__(
        self, status: int, code: WebhookRefusal, message: str, retry_after_s: int | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code: WebhookRefusal = code
        self.message = message
        self.retry_after_s = retry_after_s

    def response(self) -> JSONResponse:
        headers = {"cache-control": "no-store"}
        if self.retry_after_s is not None:
            headers["retry-after"] = str(self.retry_after_s)
        return JSONResponse(
            {"error": {"code": self.code, "message": self.message}},
            status_code=self.status,
            headers=headers,
        )


_PATTERNS = {
    "space": "1-64 ASCII letters, digits and . _ @ + = - (a letter or digit first)",
    "thread": "1-200 ASCII letters, digits and . _ : @ + = / - (a letter or digit first)",
    "": "1-200 ASCII letters, digits and . _ : @ + = / -",
}
"""What each id of a body looks like (`payloads`' patterns), as a refusal says it."""


def _validation_refusal(exc: ValidationError) -> _Refused:
    """The clearest 400 for a body that does not fit: its most specific error, named plainly."""
    if any(e["type"] == "string_unicode" for e in exc.errors()):  # as the web channel says it
        return _Refused(400, "invalid_text", "a string is not valid Unicode text")
    message = body_problem(exc, pattern=_PATTERNS)
    return _Refused(400, "invalid_request", message)


def _check_text(value: str, what: str) -> None:
    """Refuse what no store should hold: NUL characters and unpaired surrogates."""
    if (problem := text_problem(value, what)) is not None:
        raise _Refused(400, "invalid_text", problem)


def _check_result(item: DecisionItemIn) -> None:
    """Refuse a supplied result that is empty, too long, or not for an approved call (D263)."""
    if (problem := result_problem(item)) is not None:
        raise _Refused(400, *problem)


def _digest(author: Author, text: str) -> str:
    """What a message sent again repeats besides its id: its author and its text (D385)."""
    return "w1:" + hashlib.sha256(json.dumps([author.id, text]).encode()).hexdigest()[:32]


def _taken(message_id: str, first: Acceptance) -> str:
    """Why a message whose id names another thread's message is refused."""
    return (
        f"'message_id' {message_id!r} already names a message of another thread "
        f"({first.lane}); give each message its own id"
    )


def decision_key(body: DecisionIn) -> str:
    """A decision's key when the sender names none: the same decision always has the same key.

    Not the ``webhook-id``: a person who sends their decision twice (two requests, two ids)
    decided once, and the second learns it is a duplicate instead of racing the first.
    """
    canonical = json.dumps(
        [body.space, body.thread, body.run_id, body.wait_id,
         [d.keyed() for d in body.decisions]],
        sort_keys=True,
        separators=(",", ":"),
    )  # fmt: skip
    return "webhook-" + hashlib.sha256(canonical.encode()).hexdigest()[:40]


_GATEWAY_NAMES = ("operator:", "gateway:")
"""How the gateway names who acted besides a channel's users (an operator, a worker)."""


def _author(value: AuthorIn | None) -> Author:
    if value is None:
        return Author(id="anonymous")
    _check_text(value.id, "'author.id'")
    _check_text(value.name or "", "'author.name'")
    # a sender relays ids its users may have typed: "[operator:alice] x" in the model's
    # transcript and the timeline read as an operator's (an outside probe); the web channel
    # refuses the same names
    folded = unicodedata.normalize("NFKC", value.id).strip().casefold()
    if folded.startswith(_GATEWAY_NAMES):
        raise _Refused(
            400,
            "invalid_request",
            f"'author.id' may not begin {folded.split(':')[0]}: (the gateway's own name for "
            "who acted)",
        )
    return Author(id=value.id, name=value.name)


class WebhookChannel:
    """The webhook channel: a `ChannelAdapter` named ``webhook`` (see the module docstring).

    `inbound_keys` are the HMAC keys requests are checked with (more than one while a secret
    is being rotated); `approvers` the author ids whose decisions are taken.
    """

    name = CHANNEL

    def __init__(
        self,
        *,
        delivery: WebhookDelivery,
        inbound_keys: tuple[bytes, ...],
        approvers: tuple[str, ...] = (),
        clock: Clock | None = None,
        limits: WebhookLimits | None = None,
    ) -> None:
        if not inbound_keys:
            raise ValueError("the webhook channel needs a key to check requests with")
        self.delivery = delivery
        self.clock = clock or SystemClock()
        self.limits = limits or WebhookLimits()
        self.approvers = frozenset(approvers)
        self._keys = inbound_keys
        self._sink: InboundSink | None = None
        self.router: APIRouter | None = self._build_router()
        self.body_limits: Mapping[str, int] = {"/webhook/": self.limits.max_body_bytes}
        """The bound of a request body under ``/webhook/`` (the app refuses more unread)."""
        self.capabilities = Capabilities(
            decisions=True, approvers=True, reconciles=delivery.status_url is not None
        )
        """Threads and decisions, from `approvers` only; a receiver edits nothing it was sent
        (a close is a POST); reconcile sees only through a status URL."""

    async def start(self, sink: InboundSink) -> None:
        """Take requests into `sink` from now on (nothing to connect to)."""
        self._sink = sink

    async def stop(self) -> None:
        """Refuse requests from now on (503: the sender retries); deliveries go on."""
        self._sink = None

    async def close(self) -> None:
        """Stop, and close the outbound connection pool."""
        await self.stop()
        await self.delivery.aclose()

    async def deliver(self, outbound: Outbound) -> DeliveryReceipt:
        """POST `outbound` to the receiver (`WebhookDelivery.deliver`).

        Raises:
            DeliveryError: not delivered, or with an unknown outcome (the retry reconciles);
                permanent for a thread of another channel.
        """
        if outbound.thread.channel != self.name:
            raise DeliveryError(
                f"not a webhook thread: channel {outbound.thread.channel!r}", permanent=True
            )
        return await self.delivery.deliver(outbound)

    async def reconcile(self, outbound: Outbound) -> Reconciled:
        """Whether an attempt of `outbound` arrived (`WebhookDelivery.reconcile`)."""
        return await self.delivery.reconcile(outbound)

    # -- inbound -------------------------------------------------------------------------------

    async def _signed_body(self, request: Request) -> tuple[str, bytes]:
        """The request's webhook-id and raw body, its signature checked; else a refusal."""
        try:
            msg_id, sent_s, signatures = check_headers(
                request.headers,
                now_s=self.clock.now_ms() // 1000,
                tolerance_s=self.limits.tolerance_s,
            )
        except SignatureRefused as exc:
            raise _Refused(401, exc.code, exc.message) from None
        media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media_type != "application/json":
            raise _Refused(
                415, "unsupported_media_type", "the request body must be application/json"
            )
        limit = self.limits.max_body_bytes
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _Refused(413, "too_large", f"the request body exceeds {limit} bytes")
            chunks.append(chunk)
        body = b"".join(chunks)
        try:
            verify(self._keys, msg_id, sent_s, signatures, body)
        except SignatureRefused as exc:
            raise _Refused(401, exc.code, exc.message) from None
        return msg_id, body

    async def events(self, request: Request) -> Response:
        """``POST /webhook/events``: a message or a decision, signed."""
        msg_id, body = await self._signed_body(request)
        if not body.strip():
            raise _Refused(400, "invalid_json", "the request body is empty")
        try:
            raw = read_json(body)
        except ValueError as exc:
            raise _Refused(400, "invalid_json", str(exc)) from None
        if not isinstance(raw, dict):
            raise _Refused(400, "invalid_request", "the request body must be a JSON object")
        kind = raw.get("type", "message")
        if kind == "message":
            return await self._message(msg_id, raw)
        if kind == "decision":
            return await self._decision(raw)
        raise _Refused(400, "invalid_request", '\'type\' must be "message" or "decision"')

    async def _message(self, msg_id: str, raw: dict[str, Any]) -> Response:
        try:
            body = MessageIn.model_validate(raw)
        except ValidationError as exc:
            raise _validation_refusal(exc) from None
        if blank(body.text):
            raise _Refused(400, "empty_text", "'text' is empty")
        if len(body.text) > self.limits.max_text_chars:
            raise _Refused(
                400,
                "text_too_long",
                f"'text' has {len(body.text)} characters; at most "
                f"{self.limits.max_text_chars} are taken",
            )
        _check_text(body.text, "'text'")
        context = self._reply_context(body.reply_context)
        author = _author(body.author)
        sink = self._sink_or_refuse()
        try:
            inbound = Inbound(
                thread=ThreadRef(channel=self.name, space=body.space, thread=body.thread),
                message_id=body.message_id or msg_id,
                author=author,
                text=body.text,
                received_at_ms=self.clock.now_ms(),
                reply_context=context,
                content_digest=_digest(author, body.text),
            )
        except ValidationError as exc:  # what the durable types refuse (a context too deep)
            raise _validation_refusal(exc) from None
        acceptance = await self._hold(sink.accept, inbound)
        if acceptance.lane != inbound.thread.lane:  # nothing new was stored
            raise _Refused(409, "message_id_taken", _taken(inbound.message_id, acceptance))
        if acceptance.reused:  # another text or author under the id: not it sent again (D385)
            raise _Refused(
                409,
                "message_id_taken",
                f"'message_id' {inbound.message_id!r} already names another message of this "
                "thread; give each message its own id",
            )
        return JSONResponse(
            {
                **acceptance.model_dump(mode="json", exclude={"first"}),
                "message_id": inbound.message_id,
                "space": body.space,
                "thread": body.thread,
            },
            status_code=202,
        )

    async def _decision(self, raw: dict[str, Any]) -> Response:
        try:
            body = DecisionIn.model_validate(raw)
        except ValidationError as exc:
            raise _validation_refusal(exc) from None
        for value in (body.run_id, body.wait_id, body.session or ""):
            _check_text(value, "an id")
        for d in body.decisions:
            _check_text(d.tool_call_id + d.args_digest + (d.reason or ""), "a decision")
            _check_result(d)
        ids = [d.tool_call_id for d in body.decisions]
        if len(set(ids)) != len(ids):
            raise _Refused(400, "invalid_request", "a call is decided twice in one request")
        author = _author(body.author)
        if author.id not in self.approvers:
            raise _Refused(
                403,
                "not_approver",
                f"{author.id!r} may not decide approval requests here (webhook_approvers)",
            )
        sink = self._sink_or_refuse()
        decision = DecisionInbound(
            thread=ThreadRef(channel=self.name, space=body.space, thread=body.thread),
            run_id=body.run_id,
            wait_id=body.wait_id,
            session=body.session,
            decisions=tuple(
                DecisionItem(
                    tool_call_id=d.tool_call_id,
                    args_digest=d.args_digest,
                    approved=d.approved,
                    reason=d.reason,
                    supplied=None
                    if d.result is None
                    else SuppliedResult(text=d.result, is_error=d.is_error),
                )
                for d in body.decisions
            ),
            decided_by=author,
            idempotency_key=body.idempotency_key or decision_key(body),
            received_at_ms=self.clock.now_ms(),
            identified=True,  # the sender signed it: it vouches for its author
        )
        acceptance = await self._hold(sink.decide, decision)
        answer: dict[str, Any] = {
            **acceptance.model_dump(mode="json", exclude={"first"}),
            "idempotency_key": decision.idempotency_key,
            "space": body.space,
            "thread": body.thread,
        }
        if acceptance.first is not None:  # a second decision: who took it, and how
            first = acceptance.first
            answer["decided_by"] = first.decided_by.model_dump(mode="json")
            answer["decisions"] = [d.model_dump(mode="json") for d in first.decisions]
        return JSONResponse(answer, status_code=202)

    def _reply_context(self, value: dict[str, Any]) -> dict[str, Any]:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        _check_text(text, "'reply_context'")
        size = len(text.encode())
        if size > MAX_REPLY_CONTEXT_BYTES:
            raise _Refused(
                400,
                "invalid_request",
                f"'reply_context' is {size} bytes of JSON; at most {MAX_REPLY_CONTEXT_BYTES}",
            )
        return value

    def _sink_or_refuse(self) -> InboundSink:
        if self._sink is None:
            raise _Refused(
                503,
                "unavailable",
                "the webhook channel is not running; send again later",
                self.limits.retry_after_s,
            )
        return self._sink

    async def _hold(self, call: Any, what: Inbound | DecisionInbound) -> Acceptance:
        try:
            acceptance: Acceptance = await call(what)
        except NotRouted as exc:
            raise _Refused(404, "not_routed", str(exc) or "no session serves this space") from None
        except DecisionRefused as exc:  # it could change nothing: nothing was stored
            status = 403 if exc.code == "not_allowed" else 409
            raise _Refused(status, _REFUSED_DECISION[exc.code], exc.message) from None
        except Unavailable as exc:
            raise _Refused(
                503,
                "unavailable",
                str(exc) or "the gateway cannot hold the message now; send it again",
                self.limits.retry_after_s,
            ) from None
        log.info(
            "webhook taken",
            extra={
                "lane": what.thread.lane,
                "item_id": acceptance.item_id,
                "duplicate": acceptance.duplicate,
            },
        )
        return acceptance

    def _build_router(self) -> APIRouter:
        router = APIRouter(tags=["webhook channel"])

        async def events(request: Request) -> Response:
            try:
                return await self.events(request)
            except _Refused as refused:
                # who sent it and under which id: the operator tracing a misbehaving sender
                # has nothing else (the id is clipped: it may be anything, when refused)
                client = request.client.host if request.client is not None else None
                sent_as = request.headers.get("webhook-id", "")[:100] or None
                log.info(
                    "webhook refused",
                    extra={"code": refused.code, "client": client, "webhook_id": sent_as},
                )
                return refused.response()

        router.add_api_route(
            EVENTS_PATH,
            events,
            methods=["POST"],
            status_code=202,
            name="webhook.events",
            summary="A message or a decision, signed (Standard Webhooks).",
            response_class=Response,
        )
        return router
