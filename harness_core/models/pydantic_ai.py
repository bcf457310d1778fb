"""A `ModelClient` over pydantic-ai's direct API: every provider it supports, one request at a time.

No agent loop: the harness owns turns, tools, retries and durability; this sends one request and
settles it. Provider SDK retries are off (``max_retries=0``) so every attempt is a durable
`step_attempt` the harness counts. Failures come back in-band (`ModelError` with a kind and
whether a retry may help). A request marked ``deferred`` on a model that supports background
responses (OpenAI Responses) may come back suspended: that is a deferred handle the harness
parks on and `fetch_deferred` polls once per `resume()`.

Tool names go out as the providers accept them and the model's calls come back as the harness
names them (`harness_core.models.tool_names`, D209); a deferred handle keeps the names it
encoded, so the answer it fetches later is read back the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from pydantic_ai import exceptions as pai_errors
from pydantic_ai import messages as pai
from pydantic_ai.direct import model_request, model_request_stream
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.models.instrumented import InstrumentationSettings
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import ToolDefinition as PaiToolDefinition

from harness_core.frozen import thaw_json
from harness_core.messages import (
    AssistantMessage,
    DeferredHandle,
    ModelError,
    ModelErrorKind,
    TokenUsage,
)
from harness_core.models import DEFAULT_INFO, ModelInfo, ModelRef, ModelRequest
from harness_core.models.conversion import from_model_response, to_model_messages, token_usage
from harness_core.models.tool_names import ToolNameClash, ToolNames, wire_name

__all__ = ["ModelResolver", "PydanticAIModel"]

ModelResolver = Callable[[ModelRef], Model | None]
"""Builds the pydantic-ai model for a reference, or None if this deployment cannot serve it."""


_THINKING = {"off": False, "minimal": "minimal", "low": "low", "medium": "medium", "high": "high"}


class PydanticAIModel:
    """Send requests through pydantic-ai.

    Args:
        resolve: the pydantic-ai model for a `ModelRef` (see `gateway` for the configured
            providers); None means the model is not available here (a missing identity).
        info: limits per ``provider:model_id``; others get `default_info`.
        settings: model settings applied to every request (temperature, ...).
        stream: stream responses and report partial messages (``message_update`` events).
        provider_spans: also make pydantic-ai's own OpenTelemetry spans of each request (the
            global tracer provider's; never message content or binary data). They nest under
            the runtime's ``harness.model_request`` span, current while the request runs. Off by
            default: the runtime's span already has the model, attempt, tokens and outcome.
    """

    def __init__(
        self,
        resolve: ModelResolver,
        *,
        info: Mapping[str, ModelInfo] | None = None,
        default_info: ModelInfo = DEFAULT_INFO,
        settings: ModelSettings | None = None,
        stream: bool = True,
        provider_spans: bool = False,
    ) -> None:
        self._resolve = resolve
        self._instrument: InstrumentationSettings | bool = (
            InstrumentationSettings(include_content=False, include_binary_content=False)
            if provider_spans
            else False
        )
        self._info = dict(info or {})
        self._default_info = default_info
        self._settings: ModelSettings = settings or {}
        self._stream = stream
        self._models: dict[ModelRef, Model | None] = {}

    def _model(self, ref: ModelRef) -> Model | None:
        if ref not in self._models:
            try:
                self._models[ref] = self._resolve(ref)
            except Exception:  # a provider that cannot be built (no key, unknown name)
                self._models[ref] = None
        return self._models[ref]

    async def aclose(self) -> None:
        """Close the HTTP clients of the models this client built (call once, when done)."""
        for model in self._models.values():
            client = getattr(model, "client", None)
            close = getattr(client, "close", None)
            if close is not None:
                await close()
        self._models.clear()

    def model_info(self, model: ModelRef) -> ModelInfo | None:
        """Limits of `model`, or None when this client cannot serve it."""
        if self._model(model) is None:
            return None
        return self._info.get(str(model), self._default_info)

    def _settings_for(self, request: ModelRequest, model: Model) -> ModelSettings:
        settings: dict[str, Any] = {**self._settings, "max_retries": 0}
        if request.max_output_tokens is not None:
            settings["max_tokens"] = request.max_output_tokens
        thinking = _THINKING.get(request.thinking_level)
        if thinking is not None and request.thinking_level != "off":
            settings["thinking"] = thinking
        if request.deferred and _supports_background(model):
            settings["openai_background"] = True
        return settings  # type: ignore[return-value]

    async def request(
        self,
        request: ModelRequest,
        on_update: Callable[[AssistantMessage], None] | None = None,
    ) -> AssistantMessage:
        """Send one request and settle it (never raises for provider failures)."""
        model = self._model(request.model)
        if model is None:
            return _failure("invalid_request", f"model {request.model} is not available", False)
        try:
            names = ToolNames(tool.name for tool in request.tools)
        except ToolNameClash as exc:
            return _failure("invalid_request", str(exc), False)
        history = to_model_messages(request.messages, request.system_prompt, wire_names=True)
        parameters = ModelRequestParameters(
            function_tools=[
                PaiToolDefinition(
                    name=wire_name(tool.name),
                    description=tool.description,
                    # a deep, mutable copy: the providers' schema transformers edit it in place
                    parameters_json_schema=thaw_json(tool.parameters),
                )
                for tool in request.tools
            ],
            allow_text_output=True,
        )
        settings = self._settings_for(request, model)
        # the HTTP client's timeout bounds silence between bytes; a stream that sends only
        # keep-alives (an SSE comment every few seconds: OpenRouter, proxies) is bounded here,
        # between the parts of the answer
        limit = self._settings.get("timeout")
        gap = float(limit) if isinstance(limit, int | float) else None
        # from the request to the first part, then between parts; a second past the client's
        # own timeout, which says it better (the address) when nothing at all comes
        bound = gap + _STALL_MARGIN_S if gap is not None else None
        waiting = asyncio.timeout(bound)
        try:
            if self._stream and on_update is not None and not request.deferred:
                loop = asyncio.get_running_loop()
                async with (
                    waiting,
                    model_request_stream(
                        model,
                        history,
                        model_settings=settings,
                        model_request_parameters=parameters,
                        instrument=self._instrument,
                    ) as streamed,
                ):
                    async for _ in streamed:
                        if bound is not None:  # a part came: the next has as long again
                            waiting.reschedule(loop.time() + bound)
                        partial = streamed.get()
                        if partial.parts:
                            on_update(
                                from_model_response(
                                    partial, request.model.provider, tool_names=names
                                )
                            )
                    response = streamed.get()
                if response.finish_reason is None and response.state != "suspended":
                    return _cut_short(response)
            else:
                response = await model_request(
                    model,
                    history,
                    model_settings=settings,
                    model_request_parameters=parameters,
                    instrument=self._instrument,
                )
        except TimeoutError as exc:
            if not waiting.expired():
                return _from_exception(exc)
            said = f"the provider sent no part of the answer within {gap:g} s"
            return _failure("timeout", said, True)
        except Exception as exc:
            return _from_exception(exc)
        return self._settle(response, request.model, names)

    def _settle(
        self, response: pai.ModelResponse, ref: ModelRef, names: ToolNames
    ) -> AssistantMessage:
        if response.state == "suspended":
            if response.provider_response_id is None or not _supports_background(self._model(ref)):
                return _failure(
                    "unknown",
                    "the provider paused the response in a way this client cannot continue",
                    False,
                )
            dumped = pai.ModelMessagesTypeAdapter.dump_python([response], mode="json")[0]
            data: dict[str, Any] = {"response": dumped}
            if names.encoded:
                data["tool_names"] = names.encoded
            handle = DeferredHandle(
                provider=ref.provider,
                model=ref.model_id,
                id=response.provider_response_id,
                data=data,
            )
            return AssistantMessage(
                stop_reason="deferred",
                deferred=handle,
                provider=ref.provider,
                model=response.model_name,
                usage=TokenUsage(),
            )
        message = from_model_response(response, ref.provider, tool_names=names)
        if not message.content and message.stop_reason == "stop":
            # a 200 with no choices, or an empty turn (seen after tool results): nothing to
            # deliver but "(no answer)"; asked again, as pydantic-ai's own agents do (D312)
            empty = _failure("server", "the provider answered with nothing: no text, no call", True)
            return empty.model_copy(update={"usage": message.usage})
        cost = _cost(response)
        if cost is not None and message.usage is not None:
            usage = message.usage.model_copy(
                update={"cost": message.usage.cost.model_copy(update={"total": cost})}
            )
            message = message.model_copy(update={"usage": usage})
        return message

    async def fetch_deferred(self, handle: DeferredHandle) -> AssistantMessage:
        """Poll a background response once: the same handle (pending), the answer, or an error."""
        ref = ModelRef(provider=handle.provider, model_id=handle.model)
        model = self._model(ref)
        suspended = _suspended_response(handle)
        if model is None or suspended is None:
            return _failure("unknown", f"cannot fetch deferred request {handle.id}", False)
        try:
            response = await model_request(
                model, [suspended], model_settings={"max_retries": 0}, instrument=False
            )
        except pai_errors.SuspendedResponseExpired as exc:
            return _failure("expired", str(exc), False)
        except Exception as exc:
            return _from_exception(exc)
        return self._settle(response, ref, _handle_names(handle))

    async def cancel_deferred(self, handle: DeferredHandle) -> None:
        """Ask the provider to cancel a background response (best effort)."""
        model = self._model(ModelRef(provider=handle.provider, model_id=handle.model))
        suspended = _suspended_response(handle)
        if model is None or suspended is None:
            return
        cancel = getattr(model, "cancel_suspended_response", None)
        if cancel is not None:
            await cancel(suspended)


def _supports_background(model: Model | None) -> bool:
    return model is not None and hasattr(model, "cancel_suspended_response")


def _suspended_response(handle: DeferredHandle) -> pai.ModelResponse | None:
    data = handle.data
    if not isinstance(data, Mapping) or "response" not in data:
        return None
    restored = pai.ModelMessagesTypeAdapter.validate_python([thaw_json(data["response"])])[0]
    return restored if isinstance(restored, pai.ModelResponse) else None


def _handle_names(handle: DeferredHandle) -> ToolNames:
    """The names a deferred request encoded (a handle kept before D209 encoded none)."""
    data = handle.data
    kept = data.get("tool_names") if isinstance(data, Mapping) else None
    if not isinstance(kept, Mapping):
        return ToolNames(())
    return ToolNames.from_encoded({str(k): str(v) for k, v in kept.items()})


def _cost(response: pai.ModelResponse) -> float | None:
    try:
        price = response.cost()
    except Exception:  # unknown model or provider prices: the ledger keeps tokens only
        return None
    total = getattr(price, "total_price", None)
    return float(total) if total is not None else None


def _failure(
    kind: ModelErrorKind, message: str, retryable: bool, retry_after_ms: int | None = None
) -> AssistantMessage:
    return AssistantMessage(
        stop_reason="error",
        error=ModelError(
            kind=kind, message=message, retryable=retryable, retry_after_ms=retry_after_ms
        ),
        usage=TokenUsage(),
    )


_STALL_MARGIN_S = 1.0
"""How far past the HTTP client's timeout a stream without a new part is cut (see `request`)."""


def _cut_short(response: pai.ModelResponse) -> AssistantMessage:
    """A stream that ended before the provider said the response was complete.

    Anthropic's ends with ``message_delta`` (its stop reason) and ``message_stop``, OpenAI's
    Responses with ``response.completed``; a body that ends cleanly before them was cut (a proxy,
    a dropped upstream), and what came may stop mid-sentence or mid-way through a tool call's
    arguments. It is a lost connection: tried again, its usage so far counted (D308).
    """
    failed = _failure(
        "network", "the provider's stream ended before the response was complete", True
    )
    return failed.model_copy(update={"usage": token_usage(response.usage)})


_KINDS: list[tuple[type[Exception], ModelErrorKind, bool]] = [
    (pai_errors.ModelContextWindowExceededError, "context_overflow", False),
    (pai_errors.ModelRateLimitError, "rate_limit", True),
    (pai_errors.ModelQuotaExceededError, "rate_limit", False),
    (pai_errors.ModelOverloadedError, "overloaded", True),
    (pai_errors.ModelUnavailableError, "overloaded", True),
    (pai_errors.ModelServerError, "server", True),
    (pai_errors.ModelTimeoutError, "timeout", True),
    (pai_errors.ModelConnectionError, "network", True),
    (pai_errors.ModelAuthenticationError, "auth", False),
    (pai_errors.ModelRequestRejectedError, "invalid_request", False),
    (pai_errors.ContentFilterError, "content_filter", False),
    (pai_errors.SuspendedResponseExpired, "expired", False),
]


def _from_exception(exc: Exception) -> AssistantMessage:
    """Classify a failure: what kind, and whether the same request may succeed later."""
    retry_after = getattr(exc, "retry_after", None)
    retry_ms = round(retry_after * 1000) if isinstance(retry_after, (int, float)) else None
    for kind_type, kind, retryable in _KINDS:
        if isinstance(exc, kind_type):
            return _failure(kind, _describe(exc), retryable, retry_ms)
    if isinstance(exc, pai_errors.ModelHTTPError):
        status = exc.status_code
        if status == 429:
            return _failure("rate_limit", _describe(exc), True, retry_ms)
        if status == 408:
            return _failure("timeout", _describe(exc), True, retry_ms)
        if status >= 500:
            return _failure("server", _describe(exc), True, retry_ms)
        return _failure("invalid_request", _describe(exc), False)
    if isinstance(exc, pai_errors.ModelAPIError):
        return _failure("network", _describe(exc), True, retry_ms)
    return _failure("unknown", _describe(exc), False)


def _describe(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]
