"""A local fake LLM HTTP server that speaks the OpenAI and Anthropic wire formats, for tests.

One aiohttp server on 127.0.0.1 (a free port) answers:

* OpenAI Chat Completions: ``POST /v1/chat/completions`` (JSON, or server-sent events for
  ``"stream": true``);
* OpenAI Responses: ``POST /v1/responses`` (JSON, SSE for ``"stream": true``, and ``"background":
  true`` jobs), ``GET /v1/responses/{id}`` (polls a job) and ``POST /v1/responses/{id}/cancel``;
* Anthropic Messages: ``POST /v1/messages`` (JSON, or SSE for ``"stream": true``; the SDK's beta
  endpoint ``/v1/messages?beta=true``, which pydantic-ai uses, is the same route).

A test scripts what the next model call answers, then makes the call with the real SDK over real
HTTP::

    async with FakeLLM() as fake:
        model = openai_chat_model(fake)     # or openai_responses_model / anthropic_model
        fake.reply(text="hi", input_tokens=12, output_tokens=3)
        fake.reply(tool_calls=[("deploy", {"build": 42})])
        fake.reply(text="cut", finish="length")
        fake.fail(status=429)               # `retry-after: 0` header
        fake.fail(status=400, code="context_length_exceeded")
        ...
        assert fake.requests[-1].body["max_completion_tokens"] == 512

Each ``POST`` that asks for a completion (``/v1/chat/completions``, ``/v1/responses``,
``/v1/messages``) takes the next scripted item off one FIFO queue shared by all endpoints, and the
same item is rendered in whichever wire format was asked for. Polls (``GET /v1/responses/{id}``)
and cancels don't take from the queue. When the queue is empty the server answers ``500`` with an
error body that says so, so an under-scripted test fails loudly; ``unscripted`` counts those
answers and :meth:`FakeLLM.assert_drained` checks nothing is left over and nothing was unscripted.

Every request (any path) is recorded in :attr:`FakeLLM.requests` before it is answered.

Recorded provider answers: ``fake.replay("chat/tool_call_stream.sse")`` queues a fixture from
``tests/support/provider_replays/`` (the shapes of pydantic-ai's recorded real exchanges; that
directory's README says which recording each follows). It is served byte for byte, an SSE stream
event by event, and only to the endpoint and mode it was recorded for (its directory: ``chat``,
``responses``, ``messages``; ``.sse`` streamed, ``.json`` not): anything else is answered ``500``
and counted in ``unscripted``, so a test cannot pass on a shape it did not ask for.

Background (Responses API) jobs: ``POST /v1/responses`` with ``"background": true`` takes the next
reply, answers ``status: "queued"`` at once and keeps the job. Each ``GET`` counts a poll: the
first ``reply.pending_polls`` polls answer ``"in_progress"``, the next one answers the terminal
status (``"completed"``, ``"incomplete"`` for ``finish="length"``, or ``"failed"`` with an
``error`` for ``background_outcome="failed"``), which later polls repeat. Cancelling answers
``"cancelled"`` (an already terminal job is answered unchanged); cancelling a foreground response
is a ``400`` and an unknown id a ``404``, as on the real API. Polls are counted, never timed.

Tool names are checked as the real APIs check them: a request whose tool definitions (or, a
little stricter than the providers, the tool calls in its history) name a tool outside
``^[a-zA-Z0-9_-]{1,64}$`` is answered ``400`` before the queue is touched, and counted in
``refused_tool_names``. Images are checked as the providers check them (`_invalid_image`): a
request carrying a base64 image whose bytes are no image, or (Anthropic) not the declared
type, or (Anthropic) more than 20 images with one over 2,000 pixels on a side, is answered
``400`` in the provider's words, and counted in ``refused_images``; with ``vision = False`` the
chat API refuses any image, as OpenAI refuses one for a model without image input.

Nothing here sleeps. :meth:`FakeLLM.hang` scripts a request that is held open until
:meth:`FakeLLM.release_hung` or :meth:`FakeLLM.stop`, and :meth:`FakeLLM.wait_for_requests` waits
until the server has seen a number of requests, for tests that need a model call to be in flight.

``pydantic_ai.models.ALLOW_MODEL_REQUESTS``: ``OpenAIChatModel``, ``OpenAIResponsesModel`` and
``AnthropicModel`` check it at the top of ``request()``/``request_stream()`` whatever their base
URL, so with the flag set to False (the usual "no real model calls in tests" guard) the models
wired to this fake raise ``RuntimeError: Model requests are not allowed, since ALLOW_MODEL_REQUESTS
is False`` before sending anything. Wrap such calls in :func:`allow_model_requests`.
(``cancel_suspended_response`` deliberately doesn't check the flag.)

The model helpers (:func:`openai_chat_model`, :func:`openai_responses_model`,
:func:`anthropic_model`) build SDK clients with ``max_retries=0`` (so a scripted 429/500 surfaces
at once instead of being retried by the SDK) and hand them to the fake, which closes them in
:meth:`FakeLLM.stop`. pydantic-ai is imported lazily, so importing this module stays cheap.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import struct
from collections import deque
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Protocol, Self, TypeAlias

from aiohttp import web

if TYPE_CHECKING:
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.settings import ModelSettings

__all__ = [
    "REPLAYS",
    "Api",
    "BackgroundJob",
    "Failure",
    "FakeLLM",
    "Finish",
    "Hang",
    "Recorded",
    "RecordedRequest",
    "Reply",
    "Scripted",
    "ToolCall",
    "allow_model_requests",
    "anthropic_model",
    "openai_chat_model",
    "openai_responses_model",
]

Finish = Literal["stop", "length", "tool_calls"]
"""A provider-neutral finish reason, rendered as chat ``stop|length|tool_calls``, Responses
``completed|incomplete (max_output_tokens)|completed`` and Anthropic
``end_turn|max_tokens|tool_use``."""

Api = Literal["chat", "responses", "responses.retrieve", "responses.cancel", "messages", "unknown"]
"""Which endpoint a recorded request hit."""

REPLAYS = Path(__file__).parent / "provider_replays"
"""The recorded provider answers :meth:`FakeLLM.replay` serves."""

CREATED = 1_700_000_000
"""The fixed ``created``/``created_at`` timestamp of every answer (deterministic)."""

_OPENAI_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    422: "invalid_request_error",
    429: "requests",
    500: "server_error",
    502: "server_error",
    503: "server_error",
}
_OPENAI_ERROR_CODES = {401: "invalid_api_key", 429: "rate_limit_exceeded"}
_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
_DEFAULT_MESSAGES = {
    400: "Invalid request (scripted by FakeLLM).",
    401: "Incorrect API key provided (scripted by FakeLLM).",
    404: "Not found (scripted by FakeLLM).",
    429: "Rate limit reached (scripted by FakeLLM).",
    500: "The server had an error while processing your request (scripted by FakeLLM).",
    503: "The service is temporarily unavailable (scripted by FakeLLM).",
    529: "Overloaded (scripted by FakeLLM).",
}
_CONTEXT_LENGTH = "context_length_exceeded"
_OPENAI_CONTEXT_MESSAGE = (
    "This model's maximum context length is 128000 tokens. However, your messages resulted in "
    "130000 tokens. Please reduce the length of the messages."
)
_ANTHROPIC_CONTEXT_MESSAGE = "prompt is too long: 210000 tokens > 200000 maximum"


# -------------------------------------------------------------------------------------------------
# What a test scripts


@dataclass(frozen=True)
class ToolCall:
    """One tool call of a scripted reply; ``arguments`` is the JSON text sent on the wire."""

    name: str
    arguments: str
    id: str | None = None
    """The call id on every wire format; None numbers it (``call_fake<N>`` / ``toolu_fake<N>``)."""


ToolCallSpec: TypeAlias = (
    ToolCall | tuple[str, Mapping[str, Any] | str] | tuple[str, Mapping[str, Any] | str, str]
)
"""``ToolCall``, ``(name, args)`` or ``(name, args, id)``; ``args`` is a mapping (dumped to JSON)
or raw JSON text (sent as is, so it can be malformed)."""


@dataclass(frozen=True)
class Reply:
    """A scripted successful answer, renderable to every wire format."""

    text: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    finish: Finish = "stop"
    input_tokens: int = 10
    """All prompt tokens, cache reads included (what pydantic-ai's ``RequestUsage.input_tokens``
    reports for every wire format; Anthropic's wire ``input_tokens`` is sent without the cache
    reads, as the real API does)."""
    output_tokens: int = 5
    cache_read_tokens: int = 0
    """Part of ``input_tokens`` read from the prompt cache (chat
    ``prompt_tokens_details.cached_tokens``, Responses ``input_tokens_details.cached_tokens``,
    Anthropic ``cache_read_input_tokens``)."""
    model: str | None = None
    """The model name to answer with; None echoes the request's ``model``."""
    stream_chunks: tuple[str, ...] | None = None
    """How streamed text is split into deltas; None splits it after each run of whitespace."""
    pending_polls: int = 0
    """Background jobs only: how many polls answer ``in_progress`` before the terminal status."""
    background_outcome: Literal["completed", "failed"] = "completed"
    """Background jobs only: ``"failed"`` ends the job ``status: "failed"`` with an ``error``."""
    background_error: str = "The background response failed (scripted by FakeLLM)."
    refusal: str | None = None
    """The model declines, in these words, instead of answering: chat's ``message.refusal``
    (``delta.refusal`` streamed) with no content, a Responses ``refusal`` content part, and
    Anthropic's ``stop_reason: "refusal"`` with its ``stop_details.explanation``."""


@dataclass(frozen=True)
class Failure:
    """A scripted error: an HTTP error status with the provider's error JSON, or a stream event."""

    status: int
    message: str | None = None
    """None picks a default for the status (or a realistic context-window message for that code)."""
    error_type: str | None = None
    """OpenAI / Anthropic ``error.type``; None picks the provider's usual one for the status."""
    code: str | None = None
    """OpenAI ``error.code`` (Anthropic has none); None: ``rate_limit_exceeded`` for a 429."""
    retry_after: float | None = None
    """``retry-after`` header value; a 429 without one gets ``retry-after: 0``."""
    in_stream: bool = False
    """For a streamed request: answer 200, open the stream, then send the error as an event."""
    echo_key: bool = False
    """The message quotes the API key the request carried, whole (as some OpenAI-compatible
    servers and proxies do in a 401), after `message` or the status's default."""

    def openai_type(self) -> str:
        return self.error_type or _OPENAI_ERROR_TYPES.get(self.status, "api_error")

    def openai_code(self) -> str | None:
        return self.code if self.code is not None else _OPENAI_ERROR_CODES.get(self.status)

    def anthropic_type(self) -> str:
        if self.error_type is not None:
            return self.error_type
        if self.status in _ANTHROPIC_ERROR_TYPES:
            return _ANTHROPIC_ERROR_TYPES[self.status]
        return "invalid_request_error" if self.status < 500 else "api_error"

    def message_for(self, provider: Literal["openai", "anthropic"]) -> str:
        if self.message is not None:
            return self.message
        if self.code == _CONTEXT_LENGTH:
            return _OPENAI_CONTEXT_MESSAGE if provider == "openai" else _ANTHROPIC_CONTEXT_MESSAGE
        return _DEFAULT_MESSAGES.get(self.status, f"Error {self.status} (scripted by FakeLLM).")

    def headers(self) -> dict[str, str]:
        if self.retry_after is not None:
            return {"retry-after": _number(self.retry_after)}
        return {"retry-after": "0"} if self.status == 429 else {}


@dataclass(frozen=True)
class Hang:
    """A request held open until ``release_hung()`` or ``stop()``, then answered with ``then``."""

    then: Reply | Failure | None = None
    """What to answer once released; None answers a 503."""


@dataclass(frozen=True)
class Recorded:
    """A recorded provider answer served byte for byte (see :meth:`FakeLLM.replay`)."""

    name: str
    api: Api
    stream: bool
    body: bytes

    @classmethod
    def load(cls, name: str) -> Recorded:
        """The fixture ``provider_replays/<name>``; its leading ``#`` lines say where it is from."""
        path = REPLAYS / name
        api = path.parent.name
        if api not in ("chat", "responses", "messages") or path.suffix not in (".sse", ".json"):
            raise ValueError(f"{name}: expected chat|responses|messages/<name>.sse|.json")
        lines = path.read_bytes().splitlines(keepends=True)
        while lines and lines[0].startswith(b"#"):
            lines.pop(0)
        return cls(name, api, path.suffix == ".sse", b"".join(lines))  # type: ignore[arg-type]

    def events(self) -> list[bytes]:
        """A stream's events, each with its blank line (an event is one network write)."""
        return [event + b"\n\n" for event in self.body.split(b"\n\n") if event.strip()]


Scripted: TypeAlias = Reply | Failure | Hang | Recorded


@dataclass
class RecordedRequest:
    """One request the server received, recorded before it was answered."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    """Header names lower-cased."""
    body: Any
    """The parsed JSON body, the raw text if it wasn't JSON, or None if empty."""
    api: Api
    answered_with: Scripted | None = None
    """The scripted item this request took off the queue, if any."""

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and self.body.get("stream") is True

    @property
    def json(self) -> dict[str, Any]:
        """The body as a JSON object (raises if it isn't one)."""
        if not isinstance(self.body, dict):
            raise AssertionError(
                f"{self.method} {self.path} has no JSON object body: {self.body!r}"
            )
        return self.body


@dataclass
class BackgroundJob:
    """A stored Responses API response (background or not), as ``GET /v1/responses/{id}``."""

    id: str
    model: str
    reply: Reply
    background: bool
    output: list[dict[str, Any]]
    request: dict[str, Any]
    status: str = "queued"
    polls: int = 0

    @property
    def terminal_status(self) -> str:
        if self.reply.background_outcome == "failed":
            return "failed"
        return "incomplete" if self.reply.finish == "length" else "completed"


# -------------------------------------------------------------------------------------------------
# The server


class _Closeable(Protocol):
    def close(self) -> Awaitable[None]: ...


class FakeLLM:
    """A scripted fake OpenAI/Anthropic API on ``127.0.0.1``; see the module docstring."""

    def __init__(self, *, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port: int | None = None
        self.requests: list[RecordedRequest] = []
        self.background_jobs: dict[str, BackgroundJob] = {}
        """Every stored Responses API response by id (background jobs and foreground ones)."""
        self.unscripted: int = 0
        """How many completion requests found the queue empty (and were answered 500)."""
        self.refused_tool_names: int = 0
        """How many completion requests named a tool as no provider accepts (answered 400)."""
        self.refused_images: int = 0
        """How many completion requests carried an image the provider refuses (answered 400)."""
        self.vision: bool = True
        """False: the model takes no image input (the chat API refuses a request with one)."""
        self._queue: deque[Scripted] = deque()
        self._ids = 0
        self._runner: web.AppRunner | None = None
        self._clients: list[_Closeable] = []
        self._release = asyncio.Event()
        self._seen = asyncio.Condition()
        self.app = web.Application()
        self.app.router.add_route("*", "/{tail:.*}", self._dispatch)

    # ---- lifecycle

    async def start(self) -> Self:
        """Bind a free port and start serving."""
        if self._runner is not None:
            raise RuntimeError("FakeLLM is already started")
        self._release = asyncio.Event()
        runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, 0)
        await site.start()
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        """Release held requests, close the adopted SDK clients, stop serving (idempotent)."""
        self._release.set()
        clients, self._clients = self._clients, []
        for client in clients:
            await client.close()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("FakeLLM is not started")
        return f"http://{self.host}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        """For the OpenAI SDK: it appends ``/chat/completions`` and ``/responses`` to this."""
        return f"{self.base_url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """For the Anthropic SDK: it appends ``/v1/messages`` to this."""
        return self.base_url

    def adopt_client(self, client: _Closeable) -> None:
        """Close ``client`` (an ``AsyncOpenAI``/``AsyncAnthropic``) when the fake stops."""
        self._clients.append(client)

    # ---- scripting

    def reply(
        self,
        text: str | None = None,
        *,
        tool_calls: Sequence[ToolCallSpec] = (),
        finish: Finish | None = None,
        input_tokens: int = 10,
        output_tokens: int = 5,
        cache_read_tokens: int = 0,
        model: str | None = None,
        stream_chunks: Sequence[str] | None = None,
        pending_polls: int = 0,
        background_outcome: Literal["completed", "failed"] = "completed",
        background_error: str | None = None,
        refusal: str | None = None,
    ) -> Reply:
        """Queue a success; ``finish`` defaults to ``tool_calls`` if any, else ``stop``."""
        if stream_chunks is not None:
            joined = "".join(stream_chunks)
            if text is not None and text != joined:
                raise ValueError("stream_chunks must join to text")
            text = joined
        scripted = Reply(
            text=text,
            tool_calls=tuple(_tool_call(spec) for spec in tool_calls),
            finish=finish or ("tool_calls" if tool_calls else "stop"),
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cache_read_tokens=cache_read_tokens,
            model=model,
            stream_chunks=tuple(stream_chunks) if stream_chunks is not None else None,
            pending_polls=pending_polls,
            background_outcome=background_outcome,
            background_error=background_error or Reply.background_error,
            refusal=refusal,
        )
        self._queue.append(scripted)
        return scripted

    def fail(
        self,
        status: int = 500,
        message: str | None = None,
        *,
        error_type: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
        in_stream: bool = False,
        echo_key: bool = False,
    ) -> Failure:
        """Queue an error answer (see :class:`Failure`)."""
        scripted = Failure(status, message, error_type, code, retry_after, in_stream, echo_key)
        self._queue.append(scripted)
        return scripted

    def replay(self, *names: str) -> list[Recorded]:
        """Queue recorded answers (``provider_replays/<api>/<name>``), in order."""
        items = [Recorded.load(name) for name in names]
        self._queue.extend(items)
        return items

    def push(self, *items: Scripted) -> None:
        """Queue already built ``Reply`` / ``Failure`` / ``Hang`` items, in order."""
        self._queue.extend(items)

    def fail_context_length(self) -> Failure:
        """Queue the provider's own "prompt too long" 400 (``ModelContextWindowExceededError``)."""
        return self.fail(400, code=_CONTEXT_LENGTH)

    def hang(self, then: Reply | Failure | None = None) -> Hang:
        """Queue a request that is held open until :meth:`release_hung` or :meth:`stop`."""
        scripted = Hang(then)
        self._queue.append(scripted)
        return scripted

    def release_hung(self) -> None:
        """Let every held request (now and later) answer."""
        self._release.set()

    @property
    def pending(self) -> list[Scripted]:
        """The scripted items not consumed yet."""
        return list(self._queue)

    def clear(self) -> None:
        """Drop the queue and the recorded requests and jobs."""
        self._queue.clear()
        self.requests.clear()
        self.background_jobs.clear()
        self.unscripted = 0

    def assert_drained(self) -> None:
        """Assert every scripted item was consumed and no request found the queue empty."""
        assert not self._queue, (
            f"FakeLLM: {len(self._queue)} scripted item(s) never requested: {self.pending}"
        )
        assert self.unscripted == 0, (
            f"FakeLLM: {self.unscripted} request(s) found no scripted reply"
        )

    # ---- inspection

    def requests_to(self, api: Api) -> list[RecordedRequest]:
        return [r for r in self.requests if r.api == api]

    @property
    def last_request(self) -> RecordedRequest:
        if not self.requests:
            raise AssertionError("FakeLLM received no request")
        return self.requests[-1]

    async def wait_for_requests(self, count: int) -> None:
        """Wait until the server has received at least ``count`` requests in all (no timeout)."""
        async with self._seen:
            await self._seen.wait_for(lambda: len(self.requests) >= count)

    # ---- serving

    def _next_id(self) -> int:
        self._ids += 1
        return self._ids

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")
        path = request.path
        method = request.method
        api = _api_for(method, path)
        recorded = RecordedRequest(
            method=method,
            path=path,
            query=dict(request.query),
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
            api=api,
        )
        self.requests.append(recorded)
        async with self._seen:
            self._seen.notify_all()

        if api == "responses.retrieve":
            return self._retrieve(request.match_info["tail"].split("/")[2], recorded)
        if api == "responses.cancel":
            return self._cancel(request.match_info["tail"].split("/")[2])
        if api == "unknown":
            return _openai_error_response(
                Failure(404, f"FakeLLM: no route for {method} {path}", code="unknown_url")
            )
        if not isinstance(body, dict):
            return _error_for(api, Failure(400, "FakeLLM: the request body is not a JSON object"))
        bad_name = _invalid_tool_name(api, body)
        if bad_name is not None:
            self.refused_tool_names += 1
            return _error_for(
                api,
                Failure(
                    400,
                    f"Invalid tool name {bad_name!r}: string does not match pattern "
                    "'^[a-zA-Z0-9_-]{1,64}$'.",
                    code="invalid_value",
                ),
            )

        bad_image = _invalid_image(api, body, vision=self.vision)
        if bad_image is not None:  # refused before any scripted answer is used, as a provider does
            self.refused_images += 1
            return _error_for(api, Failure(400, bad_image, code="invalid_image_format"))

        scripted = self._queue.popleft() if self._queue else None
        recorded.answered_with = scripted
        if isinstance(scripted, Hang):
            await self._release.wait()
            scripted = scripted.then or Failure(
                503, "FakeLLM: a held request was released without an answer"
            )
        if scripted is None:
            self.unscripted += 1
            return _error_for(
                api,
                Failure(
                    500,
                    f"FakeLLM: no scripted reply left for {method} {path} "
                    f"(request #{len(self.requests)}); script fake.reply(...) or fake.fail(...)",
                    error_type="fake_llm_unscripted",
                ),
            )
        stream = recorded.stream
        if isinstance(scripted, Failure) and scripted.echo_key:
            provider: Literal["openai", "anthropic"] = (
                "anthropic" if api == "messages" else "openai"
            )
            key = recorded.headers.get("x-api-key") or recorded.headers.get(
                "authorization", ""
            ).removeprefix("Bearer ")
            said = scripted.message_for(provider).rstrip(".")
            scripted = replace(scripted, message=f"{said}: {key}.", echo_key=False)
        if isinstance(scripted, Recorded):
            return await self._recorded(request, scripted, api, stream)
        if isinstance(scripted, Failure) and not (scripted.in_stream and stream):
            return _error_for(api, scripted)
        model = _model_of(body, scripted)
        if api == "chat":
            return await self._chat(request, body, scripted, model, stream)
        if api == "responses":
            return await self._responses(request, body, scripted, model, stream)
        return await self._messages(request, scripted, model, stream)

    async def _recorded(
        self, request: web.Request, recorded: Recorded, api: Api, stream: bool
    ) -> web.StreamResponse:
        if recorded.api != api or recorded.stream != stream:
            self.unscripted += 1
            mode = "streamed" if stream else "unstreamed"
            return _error_for(
                api,
                Failure(
                    500,
                    f"FakeLLM: the replay {recorded.name} does not answer a {mode} {api} request",
                    error_type="fake_llm_unscripted",
                ),
            )
        if not stream:
            return web.Response(body=recorded.body, content_type="application/json")
        response = web.StreamResponse(
            status=200, headers={"content-type": "text/event-stream", "cache-control": "no-cache"}
        )
        await response.prepare(request)
        for event in recorded.events():
            await response.write(event)
        await response.write_eof()
        return response

    # ---- OpenAI Chat Completions

    async def _chat(
        self,
        request: web.Request,
        body: dict[str, Any],
        scripted: Reply | Failure,
        model: str,
        stream: bool,
    ) -> web.StreamResponse:
        completion_id = f"chatcmpl-fake{self._next_id()}"
        if isinstance(scripted, Failure):
            first = _chat_chunk(completion_id, model, {"role": "assistant", "content": ""})
            error = {"error": _openai_error_body(scripted)}
            return await _sse(request, [(None, first), (None, error)], done=False)
        calls = self._ids_for(scripted.tool_calls, "call")
        if not stream:
            return web.json_response(_chat_completion(completion_id, model, scripted, calls))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        chunks = _chat_chunks(completion_id, model, scripted, calls, include_usage=include_usage)
        return await _sse(request, [(None, chunk) for chunk in chunks], done=True)

    # ---- OpenAI Responses

    async def _responses(
        self,
        request: web.Request,
        body: dict[str, Any],
        scripted: Reply | Failure,
        model: str,
        stream: bool,
    ) -> web.StreamResponse:
        response_id = f"resp_fake{self._next_id()}"
        background = body.get("background") is True
        if isinstance(scripted, Failure):
            start = _response_object(
                response_id, model, body, status="in_progress", background=background
            )
            events: list[tuple[str, dict[str, Any]]] = [
                ("response.created", {"type": "response.created", "response": start}),
                (
                    "error",
                    {
                        "type": "error",
                        "code": scripted.openai_code() or scripted.openai_type(),
                        "message": scripted.message_for("openai"),
                        "param": None,
                    },
                ),
            ]
            return await _sse(request, _numbered(events), done=False)
        output = self._responses_output(scripted)
        job = BackgroundJob(response_id, model, scripted, background, output, body)
        self.background_jobs[response_id] = job
        if background:
            if stream:
                return _openai_error_response(
                    Failure(
                        400,
                        "FakeLLM: background streaming is not supported",
                        code="fake_llm_unsupported",
                    )
                )
            return web.json_response(_job_object(job))
        job.status = job.terminal_status
        if not stream:
            return web.json_response(_job_object(job))
        return await _sse(request, _numbered(_responses_events(job)), done=False)

    def _responses_output(self, reply: Reply) -> list[dict[str, Any]]:
        output: list[dict[str, Any]] = []
        if reply.refusal is not None:
            output.append(
                {
                    "type": "message",
                    "id": f"msg_fake{self._next_id()}",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "refusal", "refusal": reply.refusal}],
                }
            )
        if reply.text is not None:
            output.append(
                {
                    "type": "message",
                    "id": f"msg_fake{self._next_id()}",
                    "status": "completed",
                    "role": "assistant",
                    "content": [_output_text(reply.text)],
                }
            )
        for call in self._ids_for(reply.tool_calls, "call"):
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_fake{self._next_id()}",
                    "call_id": call.id,
                    "name": call.name,
                    "arguments": call.arguments,
                    "status": "completed",
                }
            )
        return output

    def _retrieve(self, response_id: str, recorded: RecordedRequest) -> web.StreamResponse:
        job = self.background_jobs.get(response_id)
        if job is None:
            return _openai_error_response(
                Failure(404, f"Response with id '{response_id}' not found.", code="not_found")
            )
        if recorded.query.get("stream") == "true":
            return _openai_error_response(
                Failure(
                    400, "FakeLLM: streamed retrieve is not supported", code="fake_llm_unsupported"
                )
            )
        if job.status in ("queued", "in_progress"):
            job.polls += 1
            job.status = (
                "in_progress" if job.polls <= job.reply.pending_polls else job.terminal_status
            )
        return web.json_response(_job_object(job))

    def _cancel(self, response_id: str) -> web.StreamResponse:
        job = self.background_jobs.get(response_id)
        if job is None:
            return _openai_error_response(
                Failure(404, f"Response with id '{response_id}' not found.", code="not_found")
            )
        if not job.background:
            return _openai_error_response(
                Failure(400, "Only responses created with background=true can be cancelled.")
            )
        if job.status in ("queued", "in_progress"):
            job.status = "cancelled"
        return web.json_response(_job_object(job))

    # ---- Anthropic Messages

    async def _messages(
        self, request: web.Request, scripted: Reply | Failure, model: str, stream: bool
    ) -> web.StreamResponse:
        message_id = f"msg_fake{self._next_id()}"
        if isinstance(scripted, Failure):
            start = _anthropic_message(
                message_id, model, Reply(input_tokens=0, output_tokens=0), [], [], streaming=True
            )
            events = [
                ("message_start", {"type": "message_start", "message": start}),
                ("error", _anthropic_error_body(scripted)),
            ]
            return await _sse(request, events, done=False)
        calls = self._ids_for(scripted.tool_calls, "toolu")
        if not stream:
            try:
                inputs = [_json_object(call.arguments) for call in calls]
            except ValueError as e:
                return _anthropic_error_response(Failure(500, f"FakeLLM: {e}"))
            return web.json_response(
                _anthropic_message(message_id, model, scripted, calls, inputs, streaming=False)
            )
        return await _sse(
            request, _anthropic_events(message_id, model, scripted, calls), done=False
        )

    def _ids_for(self, calls: Sequence[ToolCall], prefix: str) -> list[ToolCall]:
        return [
            call
            if call.id is not None
            else ToolCall(call.name, call.arguments, f"{prefix}_fake{self._next_id()}")
            for call in calls
        ]


# -------------------------------------------------------------------------------------------------
# Rendering (pure functions)


def _tool_call(spec: ToolCallSpec) -> ToolCall:
    if isinstance(spec, ToolCall):
        return spec
    name, args, *rest = spec
    arguments = args if isinstance(args, str) else json.dumps(dict(args))
    return ToolCall(name, arguments, rest[0] if rest else None)


_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def _tool_names(api: Api, body: dict[str, Any]) -> Iterator[Any]:
    """Every tool name a completion request carries: its definitions' and its history's calls."""
    for tool in body.get("tools") or ():
        if not isinstance(tool, dict):
            continue
        if api == "chat" and isinstance(tool.get("function"), dict):
            yield tool["function"].get("name")
        elif api == "responses" and tool.get("type") == "function":
            yield tool.get("name")
        elif api == "messages" and "name" in tool:
            yield tool["name"]
    if api == "chat":
        for message in body.get("messages") or ():
            for call in (message.get("tool_calls") or ()) if isinstance(message, dict) else ():
                yield call.get("function", {}).get("name")
    elif api == "responses":
        items = body.get("input")
        for item in items if isinstance(items, list) else ():
            if isinstance(item, dict) and item.get("type") == "function_call":
                yield item.get("name")
    else:
        for message in body.get("messages") or ():
            content = message.get("content") if isinstance(message, dict) else None
            for block in content if isinstance(content, list) else ():
                if isinstance(block, dict) and block.get("type") == "tool_use":
                    yield block.get("name")


_IMAGE_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def _image_is(data: bytes) -> str | None:
    for magic, media_type in _IMAGE_MAGIC:
        if data.startswith(magic):
            return media_type
    return "image/webp" if data[:4] == b"RIFF" and data[8:12] == b"WEBP" else None


def _blocks(value: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every JSON object in `value` with its path (``messages.0.content.1``), depth first."""
    if isinstance(value, dict):
        yield path, value
        for key, item in value.items():
            yield from _blocks(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for number, item in enumerate(value):
            yield from _blocks(item, f"{path}.{number}")


def _png_side(data: bytes) -> int:
    """A PNG's larger side in pixels, from its header (0 for anything else)."""
    if not data.startswith(b"\x89PNG\r\n\x1a\n") or len(data) < 24:
        return 0
    width, height = struct.unpack(">II", data[16:24])
    return int(max(width, height))


_MANY_IMAGES = 20
"""Anthropic: a request with more images than this takes none over 2,000 pixels on a side."""


def _invalid_image(api: Api, body: dict[str, Any], *, vision: bool = True) -> str | None:
    """What the provider says of an image it cannot take, in its words (None: all are fine).

    Anthropic checks every base64 image of a request, the thread's earlier ones included, and
    refuses the whole request for one whose bytes are no image or not the declared type, or,
    in a request of more than 20 images, one over 2,000 pixels on a side (the messages are the
    API's, as users report them); OpenAI refuses an image that is not one of its four formats,
    and any image for a model without image input (`vision` False).
    """
    blocks = list(_blocks(body.get("messages"), "messages"))
    if api == "messages":
        images = [
            (path, base64.b64decode((block.get("source") or {}).get("data", "")))
            for path, block in blocks
            if block.get("type") == "image" and (block.get("source") or {}).get("type") == "base64"
        ]
        for path, data in images if len(images) > _MANY_IMAGES else ():
            if _png_side(data) > 2000:
                return (
                    f"{path}.image.source.base64.data: At least one of the image dimensions "
                    "exceed max allowed size for many-image requests: 2000 pixels"
                )
    for path, block in blocks:
        if api == "chat" and block.get("type") == "image_url" and not vision:
            return "Invalid content type. image_url is only supported by certain models."
        if api == "messages" and block.get("type") == "image":
            source = block.get("source") or {}
            if source.get("type") != "base64":
                continue
            data = base64.b64decode(source.get("data", ""))
            declared = source.get("media_type")
            actual = _image_is(data)
            if actual is None:
                return f"{path}.image.source.base64.data: Could not process image"
            if actual != declared:
                return (
                    f"{path}.image.source.base64: The image was specified using the {declared} "
                    f"media type, but the image appears to be a {actual} image"
                )
        if api == "chat" and block.get("type") == "image_url":
            url = (block.get("image_url") or {}).get("url", "")
            encoded = url.split(",", 1)[1] if url.startswith("data:") else None
            if encoded is not None and _image_is(base64.b64decode(encoded)) is None:
                return (
                    "You uploaded an unsupported image. Please make sure your image has of one "
                    "the following formats: ['png', 'jpeg', 'gif', 'webp']."
                )
    return None


def _invalid_tool_name(api: Api, body: dict[str, Any]) -> str | None:
    for name in _tool_names(api, body):
        if not isinstance(name, str) or _TOOL_NAME.fullmatch(name) is None:
            return str(name)
    return None


def _api_for(method: str, path: str) -> Api:
    path = path.rstrip("/")
    if method == "POST" and path == "/v1/chat/completions":
        return "chat"
    if method == "POST" and path == "/v1/responses":
        return "responses"
    if method == "POST" and path == "/v1/messages":
        return "messages"
    if re.fullmatch(r"/v1/responses/[^/]+", path) and method == "GET":
        return "responses.retrieve"
    if re.fullmatch(r"/v1/responses/[^/]+/cancel", path) and method == "POST":
        return "responses.cancel"
    return "unknown"


def _model_of(body: dict[str, Any], scripted: Reply | Failure) -> str:
    if isinstance(scripted, Reply) and scripted.model is not None:
        return scripted.model
    model = body.get("model")
    return model if isinstance(model, str) else "fake-model"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _json_object(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ValueError(f"Anthropic tool_use input must be a JSON object, got {arguments!r}")
    return value


def _pieces(text: str, chunks: tuple[str, ...] | None) -> list[str]:
    if chunks is not None:
        return [c for c in chunks if c]
    return re.findall(r"\s*\S+\s*", text) or ([text] if text else [])


def _halves(text: str) -> list[str]:
    middle = len(text) // 2
    return [piece for piece in (text[:middle], text[middle:]) if piece]


def _openai_error_body(failure: Failure) -> dict[str, Any]:
    return {
        "message": failure.message_for("openai"),
        "type": failure.openai_type(),
        "param": None,
        "code": failure.openai_code(),
    }


def _anthropic_error_body(failure: Failure) -> dict[str, Any]:
    return {
        "type": "error",
        "error": {"type": failure.anthropic_type(), "message": failure.message_for("anthropic")},
    }


def _openai_error_response(failure: Failure) -> web.Response:
    return web.json_response(
        {"error": _openai_error_body(failure)},
        status=failure.status,
        headers={"x-request-id": "req_fake", **failure.headers()},
    )


def _anthropic_error_response(failure: Failure) -> web.Response:
    return web.json_response(
        {**_anthropic_error_body(failure), "request_id": "req_fake"},
        status=failure.status,
        headers={"request-id": "req_fake", **failure.headers()},
    )


def _error_for(api: Api, failure: Failure) -> web.Response:
    if api == "messages":
        return _anthropic_error_response(failure)
    return _openai_error_response(failure)


async def _sse(
    request: web.Request, events: Sequence[tuple[str | None, dict[str, Any]]], *, done: bool
) -> web.StreamResponse:
    response = web.StreamResponse(
        status=200, headers={"content-type": "text/event-stream", "cache-control": "no-cache"}
    )
    await response.prepare(request)
    for event, data in events:
        prefix = f"event: {event}\n" if event else ""
        await response.write(f"{prefix}data: {json.dumps(data)}\n\n".encode())
    if done:
        await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _numbered(
    events: Sequence[tuple[str, dict[str, Any]]],
) -> list[tuple[str | None, dict[str, Any]]]:
    return [(name, {**data, "sequence_number": n}) for n, (name, data) in enumerate(events)]


# ---- OpenAI Chat Completions


def _chat_usage(reply: Reply) -> dict[str, Any]:
    return {
        "prompt_tokens": reply.input_tokens,
        "completion_tokens": reply.output_tokens,
        "total_tokens": reply.input_tokens + reply.output_tokens,
        "prompt_tokens_details": {"cached_tokens": reply.cache_read_tokens, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    }


def _chat_completion(
    completion_id: str, model: str, reply: Reply, calls: Sequence[ToolCall]
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text, "refusal": reply.refusal}
    if calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": CREATED,
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": reply.finish}
        ],
        "usage": _chat_usage(reply),
    }


def _chat_chunk(
    completion_id: str,
    model: str,
    delta: dict[str, Any] | None,
    finish: str | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    choices = (
        []
        if delta is None
        else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    )
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": model,
        "system_fingerprint": None,
        "choices": choices,
        "usage": usage,
    }


def _chat_chunks(
    completion_id: str, model: str, reply: Reply, calls: Sequence[ToolCall], *, include_usage: bool
) -> list[dict[str, Any]]:
    chunks = [_chat_chunk(completion_id, model, {"role": "assistant", "content": ""})]
    if reply.refusal is not None:  # as OpenAI streams one: the words in deltas, no content
        chunks[0]["choices"][0]["delta"] = {"role": "assistant", "content": None, "refusal": ""}
        for piece in _pieces(reply.refusal, None):
            chunks.append(_chat_chunk(completion_id, model, {"refusal": piece}))
    for piece in _pieces(reply.text or "", reply.stream_chunks):
        chunks.append(_chat_chunk(completion_id, model, {"content": piece}))
    for index, call in enumerate(calls):
        opening = {
            "index": index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        chunks.append(_chat_chunk(completion_id, model, {"tool_calls": [opening]}))
        for piece in _halves(call.arguments):
            delta = {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
            chunks.append(_chat_chunk(completion_id, model, delta))
    chunks.append(_chat_chunk(completion_id, model, {}, finish=reply.finish))
    if include_usage:
        chunks.append(_chat_chunk(completion_id, model, None, usage=_chat_usage(reply)))
    return chunks


# ---- OpenAI Responses


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _responses_usage(reply: Reply) -> dict[str, Any]:
    return {
        "input_tokens": reply.input_tokens,
        "input_tokens_details": {"cached_tokens": reply.cache_read_tokens},
        "output_tokens": reply.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": reply.input_tokens + reply.output_tokens,
    }


def _response_object(
    response_id: str,
    model: str,
    request: Mapping[str, Any],
    *,
    status: str,
    background: bool,
    output: Sequence[dict[str, Any]] = (),
    usage: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    incomplete_reason: str | None = None,
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": CREATED,
        "status": status,
        "background": background,
        "error": error,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "model": model,
        "output": list(output),
        "parallel_tool_calls": True,
        "previous_response_id": request.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "store": request.get("store", True),
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "metadata": {},
    }


def _job_object(job: BackgroundJob) -> dict[str, Any]:
    terminal = job.status in ("completed", "incomplete")
    return _response_object(
        job.id,
        job.model,
        job.request,
        status=job.status,
        background=job.background,
        output=job.output if terminal else (),
        usage=_responses_usage(job.reply) if terminal or job.status == "failed" else None,
        error={"code": "server_error", "message": job.reply.background_error}
        if job.status == "failed"
        else None,
        incomplete_reason="max_output_tokens" if job.status == "incomplete" else None,
    )


def _responses_events(job: BackgroundJob) -> list[tuple[str, dict[str, Any]]]:
    start = _response_object(job.id, job.model, job.request, status="in_progress", background=False)
    events: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"type": "response.created", "response": start}),
        ("response.in_progress", {"type": "response.in_progress", "response": start}),
    ]

    def add(kind: str, **data: Any) -> None:
        events.append((kind, {"type": kind, **data}))

    for index, item in enumerate(job.output):
        item_id = item["id"]
        at = {"item_id": item_id, "output_index": index}
        if item["type"] == "message" and item["content"][0]["type"] == "refusal":
            said = item["content"][0]["refusal"]
            opening = {**item, "status": "in_progress", "content": []}
            add("response.output_item.added", output_index=index, item=opening)
            empty = {"type": "refusal", "refusal": ""}
            add("response.content_part.added", **at, content_index=0, part=empty)
            for piece in _pieces(said, None):
                add("response.refusal.delta", **at, content_index=0, delta=piece)
            add("response.refusal.done", **at, content_index=0, refusal=said)
            part = {"type": "refusal", "refusal": said}
            add("response.content_part.done", **at, content_index=0, part=part)
        elif item["type"] == "message":
            text = item["content"][0]["text"]
            opening = {**item, "status": "in_progress", "content": []}
            add("response.output_item.added", output_index=index, item=opening)
            add("response.content_part.added", **at, content_index=0, part=_output_text(""))
            for piece in _pieces(text, job.reply.stream_chunks):
                add("response.output_text.delta", **at, content_index=0, delta=piece, logprobs=[])
            add("response.output_text.done", **at, content_index=0, text=text, logprobs=[])
            add("response.content_part.done", **at, content_index=0, part=_output_text(text))
        else:
            opening = {**item, "arguments": "", "status": "in_progress"}
            add("response.output_item.added", output_index=index, item=opening)
            for piece in _halves(item["arguments"]):
                add("response.function_call_arguments.delta", **at, delta=piece)
            args = item["arguments"]
            add("response.function_call_arguments.done", **at, name=item["name"], arguments=args)
        add("response.output_item.done", output_index=index, item=item)
    final = _job_object(job)
    kind = "response.incomplete" if job.status == "incomplete" else "response.completed"
    add(kind, response=final)
    return events


# ---- Anthropic Messages

_ANTHROPIC_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _anthropic_usage(reply: Reply) -> dict[str, Any]:
    # Anthropic's `input_tokens` leaves out cache reads (pydantic-ai adds them back).
    return {
        "input_tokens": max(0, reply.input_tokens - reply.cache_read_tokens),
        "output_tokens": reply.output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": reply.cache_read_tokens,
    }


def _anthropic_message(
    message_id: str,
    model: str,
    reply: Reply,
    calls: Sequence[ToolCall],
    inputs: Sequence[dict[str, Any]],
    *,
    streaming: bool,
) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if not streaming:
        if reply.text is not None:
            content.append({"type": "text", "text": reply.text})
        for call, arguments in zip(calls, inputs, strict=True):
            content.append(
                {"type": "tool_use", "id": call.id, "name": call.name, "input": arguments}
            )
    usage = _anthropic_usage(reply)
    if streaming:
        usage["output_tokens"] = min(1, reply.output_tokens)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": None if streaming else _anthropic_stop(reply),
        "stop_sequence": None,
        "usage": usage,
        **({} if streaming else _anthropic_stop_details(reply)),
    }


def _anthropic_stop(reply: Reply) -> str:
    return "refusal" if reply.refusal is not None else _ANTHROPIC_STOP[reply.finish]


def _anthropic_stop_details(reply: Reply) -> dict[str, Any]:
    """A refusal's ``stop_details`` (its explanation), as the Messages API sends it."""
    if reply.refusal is None:
        return {}
    details = {"type": "refusal", "category": "cyber", "explanation": reply.refusal}
    return {"stop_details": details}


def _anthropic_events(
    message_id: str, model: str, reply: Reply, calls: Sequence[ToolCall]
) -> list[tuple[str | None, dict[str, Any]]]:
    events: list[tuple[str | None, dict[str, Any]]] = []

    def add(kind: str, **data: Any) -> None:
        events.append((kind, {"type": kind, **data}))

    add(
        "message_start",
        message=_anthropic_message(message_id, model, reply, [], [], streaming=True),
    )
    add("ping")
    index = 0
    if reply.text is not None:
        add("content_block_start", index=index, content_block={"type": "text", "text": ""})
        for piece in _pieces(reply.text, reply.stream_chunks):
            add("content_block_delta", index=index, delta={"type": "text_delta", "text": piece})
        add("content_block_stop", index=index)
        index += 1
    for call in calls:
        block: dict[str, Any] = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
        add("content_block_start", index=index, content_block=block)
        for piece in _halves(call.arguments):
            add(
                "content_block_delta",
                index=index,
                delta={"type": "input_json_delta", "partial_json": piece},
            )
        add("content_block_stop", index=index)
        index += 1
    add(
        "message_delta",
        delta={
            "stop_reason": _anthropic_stop(reply),
            "stop_sequence": None,
            **_anthropic_stop_details(reply),
        },
        usage=_anthropic_usage(reply),
    )
    add("message_stop")
    return events


# -------------------------------------------------------------------------------------------------
# pydantic-ai helpers (imported lazily)


@contextlib.contextmanager
def allow_model_requests() -> Iterator[None]:
    """Temporarily set ``pydantic_ai.models.ALLOW_MODEL_REQUESTS`` to True (see the module doc)."""
    from pydantic_ai.models import override_allow_model_requests

    with override_allow_model_requests(True):
        yield


def openai_chat_model(
    fake: FakeLLM, name: str = "gpt-test", *, settings: ModelSettings | None = None
) -> OpenAIChatModel:
    """An ``OpenAIChatModel`` on ``fake`` via an ``AsyncOpenAI(max_retries=0)`` client."""
    from openai import AsyncOpenAI
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    client = AsyncOpenAI(base_url=fake.openai_base_url, api_key="test", max_retries=0)
    fake.adopt_client(client)
    return OpenAIChatModel(name, provider=OpenAIProvider(openai_client=client), settings=settings)


def openai_responses_model(
    fake: FakeLLM, name: str = "gpt-test", *, settings: ModelSettings | None = None
) -> OpenAIResponsesModel:
    """An ``OpenAIResponsesModel`` on ``fake`` via an ``AsyncOpenAI(max_retries=0)`` client."""
    from openai import AsyncOpenAI
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    client = AsyncOpenAI(base_url=fake.openai_base_url, api_key="test", max_retries=0)
    fake.adopt_client(client)
    return OpenAIResponsesModel(
        name, provider=OpenAIProvider(openai_client=client), settings=settings
    )


def anthropic_model(
    fake: FakeLLM, name: str = "claude-test", *, settings: ModelSettings | None = None
) -> AnthropicModel:
    """An ``AnthropicModel`` on ``fake`` via an ``AsyncAnthropic(max_retries=0)`` client."""
    from anthropic import AsyncAnthropic
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.providers.anthropic import AnthropicProvider

    client = AsyncAnthropic(base_url=fake.anthropic_base_url, api_key="test", max_retries=0)
    fake.adopt_client(client)
    return AnthropicModel(
        name, provider=AnthropicProvider(anthropic_client=client), settings=settings
    )
