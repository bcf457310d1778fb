"""The configured model: settings -> a `ModelClient` and the `ModelRef` lanes use by default.

``scripted:echo`` needs no key (the demo and tests). Real providers go through pydantic-ai with
the key, base URL and request timeout from settings; provider SDKs are imported only when one is
configured. The configured model is built at once, so a missing key is one clear line at start
(not a run that fails later with "not available"), and a provider failure names its real cause:
the endpoint and why it was not reached, or the HTTP status and what the provider said.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from config import Settings
from config.fields import number
from gateway.errors import GatewayError
from harness_core import (
    DEFAULT_INFO,
    AssistantMessage,
    DeferredHandle,
    ModelClient,
    ModelInfo,
    ModelRef,
    ModelRequest,
    ScriptedModel,
)
from harness_core.backends.urls import without_password
from harness_core.models.scripted import echo_responder
from harness_core.texts import one_line

if TYPE_CHECKING:
    from pydantic_ai.exceptions import ModelAPIError
    from pydantic_ai.models import Model

__all__ = ["PROVIDERS", "ModelConfigError", "model_from_settings", "model_info"]

PROVIDERS = ("openai", "openai-responses", "anthropic", "openai-compatible", "scripted")

_KEY_VARIABLES = {
    "openai": "OPENAI_API_KEY",
    "openai-responses": "OPENAI_API_KEY",
    "openai-compatible": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
}
"""The variable each provider's SDK reads when ``GATEWAY_MODEL_API_KEY`` is unset."""


class ModelConfigError(GatewayError, ValueError):
    """``GATEWAY_MODEL`` does not name a model this gateway can use."""

    @property
    def exit_status(self) -> int:
        """2, as every setting that cannot be used: fix the configuration, then start again."""
        return 2


def model_from_settings(settings: Settings) -> tuple[ModelClient, ModelRef]:
    """The client and default model named by ``GATEWAY_MODEL``, serving the profiles' models too.

    ``GATEWAY_MODEL_API_KEY`` and ``GATEWAY_MODEL_BASE_URL`` are ``GATEWAY_MODEL``'s provider's:
    a profile's model of another provider reads its SDK's own variable (``ANTHROPIC_API_KEY``,
    ``OPENAI_API_KEY``) and endpoint, so one provider's key is never sent to another. Every
    model a profile names is built here, so a missing key is one line at start.

    Raises:
        ModelConfigError: an unknown provider, a malformed model name, or a provider that cannot
            be set up (no API key).
    """
    ref = _parse(settings.model, f"GATEWAY_MODEL={settings.model!r}")
    key = settings.model_api_key.get_secret_value() if settings.model_api_key else None
    base_url = settings.model_base_url
    timeout = settings.model_timeout_seconds

    def credentials(wanted: ModelRef) -> tuple[str | None, str | None]:
        return (key, base_url) if wanted.provider == ref.provider else (None, None)

    wanted = {f"GATEWAY_MODEL={settings.model!r}": ref}
    for profile in settings.profiles:
        if profile.model is not None:
            named = f"profile {profile.name}: model={profile.model!r}"
            wanted.setdefault(named, _parse(profile.model, named))
    built: dict[ModelRef, Any] = {}
    for named, model in wanted.items():
        if model.provider != "scripted" and model not in built:
            built[model] = _built(named, model, *credentials(model), timeout)
    scripted = ScriptedModel(responder=echo_responder)
    if not built:
        return scripted, ref
    from harness_core.models.pydantic_ai import PydanticAIModel

    def resolve(model: ModelRef) -> Any:
        if model in built:
            return built[model]
        return _pydantic_ai_model(model, *credentials(model), timeout)

    real = PydanticAIModel(
        resolve,
        info={
            str(model): model_info(model, settings.model_context_window if model == ref else None)
            for model in built
        },
        settings={"timeout": timeout},
        provider_spans=settings.provider_spans,
    )
    if all(model.provider != "scripted" for model in wanted.values()):
        return real, ref
    return _ByProvider(scripted, real), ref


def model_info(ref: ModelRef, window: int | None = None) -> ModelInfo:
    """`ref`'s limits, its context window first (D310).

    `window` when given (``GATEWAY_MODEL_CONTEXT_WINDOW``), else the one genai-prices knows for
    an OpenAI or Anthropic model, else the harness's default. An ``openai-compatible`` model is
    never looked up: the same name served by vLLM or Ollama often has a smaller window than its
    maker's. The output cap stays the default's, at most half the window (room to answer).
    """
    window = window or _known_window(ref) or DEFAULT_INFO.context_window
    cap = min(DEFAULT_INFO.max_output_tokens, window // 2)
    return ModelInfo(context_window=window, max_output_tokens=cap)


_PRICE_PROVIDERS = {"openai": "openai", "openai-responses": "openai", "anthropic": "anthropic"}


def _known_window(ref: ModelRef) -> int | None:
    provider = _PRICE_PROVIDERS.get(ref.provider)
    if provider is None:
        return None
    from genai_prices import data_snapshot  # pydantic-ai's own price table (costs come from it)

    try:
        _, found = data_snapshot.get_snapshot().find_provider_model(
            ref.model_id, None, provider, None
        )
    except LookupError:
        return None
    window = found.context_window
    return window if isinstance(window, int) and window > 0 else None


def _parse(model: str, named: str) -> ModelRef:
    provider, _, model_id = model.partition(":")
    if provider not in PROVIDERS or not model_id:
        raise ModelConfigError(
            f"{named}: expected provider:model_id with a provider among {', '.join(PROVIDERS)}"
        )
    return ModelRef(provider=provider, model_id=model_id)


def _built(named: str, ref: ModelRef, key: str | None, base_url: str | None, timeout: float) -> Any:
    """`ref`'s pydantic-ai model, or `ModelConfigError` saying in one line why it cannot be."""
    if ref.provider == "openai-compatible" and base_url is None:
        raise ModelConfigError(
            f"{named} needs the server's URL: GATEWAY_MODEL_BASE_URL, with GATEWAY_MODEL of "
            "the same provider"
        )
    try:
        return _pydantic_ai_model(ref, key, base_url, timeout)
    except Exception as exc:
        variable = _KEY_VARIABLES[ref.provider]
        if key is None and not os.environ.get(variable):
            where = "GATEWAY_MODEL_API_KEY (or {v})" if named.startswith("GATEWAY_") else "{v}"
            raise ModelConfigError(
                f"{named} needs an API key: set {where.format(v=variable)}"
            ) from None
        raise ModelConfigError(
            f"{named}: the provider cannot be set up "
            f"({type(exc).__name__}: {_first_sentence(str(exc))})"
        ) from None


class _ByProvider:
    """A `ModelClient` sending scripted models' requests to one client and the rest to another.

    For a gateway whose ``GATEWAY_MODEL`` is scripted while a profile names a real model, or
    the other way round: each lane's model is served, none silently answered by the echo.
    """

    def __init__(self, scripted: ModelClient, real: Any) -> None:
        self._scripted = scripted
        self._real = real

    def _for(self, provider: str) -> Any:
        return self._scripted if provider == "scripted" else self._real

    def model_info(self, model: ModelRef) -> ModelInfo | None:
        """See `ModelClient.model_info`."""
        info: ModelInfo | None = self._for(model.provider).model_info(model)
        return info

    async def request(
        self,
        request: ModelRequest,
        on_update: Callable[[AssistantMessage], None] | None = None,
    ) -> AssistantMessage:
        """See `ModelClient.request`."""
        answer: AssistantMessage = await self._for(request.model.provider).request(
            request, on_update
        )
        return answer

    async def fetch_deferred(self, handle: DeferredHandle) -> AssistantMessage:
        """See `ModelClient.fetch_deferred`."""
        answer: AssistantMessage = await self._for(handle.provider).fetch_deferred(handle)
        return answer

    async def cancel_deferred(self, handle: DeferredHandle) -> None:
        """See `ModelClient.cancel_deferred`."""
        await self._for(handle.provider).cancel_deferred(handle)

    async def aclose(self) -> None:
        """Close the real client's HTTP connections."""
        await self._real.aclose()


def _pydantic_ai_model(ref: ModelRef, key: str | None, base_url: str | None, timeout: float) -> Any:
    classes = _explaining_models()
    if ref.provider in ("openai", "openai-compatible", "openai-responses"):
        from pydantic_ai.providers.openai import OpenAIProvider

        provider = OpenAIProvider(base_url=base_url, api_key=key)
        kind = "responses" if ref.provider == "openai-responses" else "chat"
        profile: Any = provider.model_profile(ref.model_id)
        if ref.provider == "openai" and isinstance(profile, dict):
            # OpenAI always ends a stream with a finish reason: a stream without one was cut
            # (retried), not a whole answer; `openai-compatible` servers may never send one
            profile = {**profile, "openai_chat_streaming_requires_finish_reason": True}
        model = classes[kind](ref.model_id, provider=provider, profile=profile)
    elif ref.provider == "anthropic":
        from pydantic_ai.providers.anthropic import AnthropicProvider

        provider_ = AnthropicProvider(api_key=key, base_url=base_url)
        model = classes["anthropic"](ref.model_id, provider=provider_)
    else:
        return None
    model.gateway_timeout = timeout  # for the message of a request that timed out
    return model


@functools.cache
def _explaining_models() -> Mapping[str, Any]:
    """pydantic-ai's provider models, each raising its failures with the real cause as message.

    pydantic-ai says "Connection error." for a refused connection and a status, model and raw
    body for an HTTP error; the harness keeps only the message, so it is rewritten here, where
    the exception and its causes are still at hand.
    """
    from pydantic_ai.exceptions import ModelAPIError
    from pydantic_ai.messages import ModelMessage, ModelResponse
    from pydantic_ai.models import Model, ModelRequestParameters, StreamedResponse
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.settings import ModelSettings
    from pydantic_ai.tools import RunContext

    from gateway.chat_usage import reporting_totals

    class Explaining(Model):
        async def request(
            self,
            messages: list[ModelMessage],
            model_settings: ModelSettings | None,
            model_request_parameters: ModelRequestParameters,
        ) -> ModelResponse:
            try:  # super() is the provider's model (this class is only ever mixed in first)
                return await super().request(  # type: ignore[safe-super]
                    messages, model_settings, model_request_parameters
                )
            except ModelAPIError as exc:
                _explain(exc, self)
                raise

        @asynccontextmanager
        async def request_stream(
            self,
            messages: list[ModelMessage],
            model_settings: ModelSettings | None,
            model_request_parameters: ModelRequestParameters,
            run_context: RunContext[Any] | None = None,
        ) -> AsyncIterator[StreamedResponse]:
            try:
                async with super().request_stream(
                    messages, model_settings, model_request_parameters, run_context
                ) as response:
                    yield response
            except ModelAPIError as exc:
                _explain(exc, self)
                raise

    class Chat(Explaining, reporting_totals(OpenAIChatModel)):  # type: ignore[misc]
        pass

    class Responses(Explaining, OpenAIResponsesModel):
        pass

    class Anthropic(Explaining, AnthropicModel):
        pass

    return {"chat": Chat, "responses": Responses, "anthropic": Anthropic}


def _explain(exc: ModelAPIError, model: Model) -> None:
    """Rewrite `exc`'s message (its type, and so its kind, stays) to say what went wrong."""
    from pydantic_ai.exceptions import ModelConnectionError, ModelHTTPError, ModelTimeoutError

    where = without_password(str(getattr(model, "base_url", None) or model.system)).rstrip("/")
    phase = getattr(exc, "phase", None)
    if isinstance(exc, ModelTimeoutError) and phase not in ("connect", "pool"):
        timeout = getattr(model, "gateway_timeout", None)
        within = f" within {number(timeout)} s (GATEWAY_MODEL_TIMEOUT_SECONDS)" if timeout else ""
        exc.message = f"no answer from {where}{within}"
    elif isinstance(exc, ModelConnectionError):
        verb = "lost the connection to" if phase in ("write", "read") else "cannot connect to"
        exc.message = f"{verb} {where} ({_root_cause(exc)})"
    elif isinstance(exc, ModelHTTPError):
        said = _provider_said(exc.body) or exc.message
        exc.message = f"HTTP {exc.status_code} from {where} for model {exc.model_name}: {said}"


def _root_cause(exc: BaseException) -> str:
    """The innermost cause in words: "Connection refused", "Name or service not known"."""
    said = "no detail"
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if not isinstance(current, Exception):
            pass  # a cancellation of the transport's own timeout: no cause in words
        elif isinstance(current, socket.gaierror) and current.strerror:
            said = current.strerror
        elif isinstance(current, OSError) and current.errno:
            said = os.strerror(current.errno)
        elif isinstance(current, TimeoutError):
            said = "timed out"
        elif str(current).strip():
            said = one_line(str(current))
        current = current.__cause__ or current.__context__
    return said


def _provider_said(body: object) -> str | None:
    """The human message in a provider's error body (OpenAI's or Anthropic's shape)."""
    if isinstance(body, str):
        return one_line(body) if body.strip() else None
    if not isinstance(body, Mapping):
        return None
    error = body.get("error")
    nested = error.get("message") if isinstance(error, Mapping) else None
    for found in (body.get("message"), nested):
        if isinstance(found, str) and found.strip():
            return one_line(found)
    return None


def _first_sentence(text: str) -> str:
    return one_line(text).split(". ")[0].rstrip(".")
