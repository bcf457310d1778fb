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
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from config import Settings
from config.fields import number
from gateway.errors import GatewayError
from harness_core import (
    ModelClient,
    ModelRef,
    ScriptedModel,
)
from harness_core.backends.urls import without_password
from harness_core.models.scripted import echo_responder

if TYPE_CHECKING:
    from pydantic_ai.exceptions import ModelAPIError
    from pydantic_ai.models import Model

__all__ = ["PROVIDERS", "ModelConfigError", "model_from_settings"]

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


def model_from_settings(settings: Settings) -> tuple[ModelClient, ModelRef]:
    """The client and default model named by ``GATEWAY_MODEL``.

    Raises:
        ModelConfigError: an unknown provider, a malformed model name, or a provider that cannot
            be set up (no API key).
    """
    provider, _, model_id = settings.model.partition(":")
    if provider not in PROVIDERS or not model_id:
        raise ModelConfigError(
            f"GATEWAY_MODEL={settings.model!r}: expected provider:model_id with a provider "
            f"among {', '.join(PROVIDERS)}"
        )
    ref = ModelRef(provider=provider, model_id=model_id)
    if provider == "scripted":
        return ScriptedModel(responder=echo_responder), ref
    from harness_core.models.pydantic_ai import PydanticAIModel

    key = settings.model_api_key.get_secret_value() if settings.model_api_key else None
    base_url = settings.model_base_url
    timeout = settings.model_timeout_seconds
    try:
        configured = _pydantic_ai_model(ref, key, base_url, timeout)
    except Exception as exc:
        variable = _KEY_VARIABLES[provider]
        if key is None and not os.environ.get(variable):
            raise ModelConfigError(
                f"GATEWAY_MODEL={settings.model!r} needs an API key: set GATEWAY_MODEL_API_KEY "
                f"(or {variable})"
            ) from None
        raise ModelConfigError(
            f"GATEWAY_MODEL={settings.model!r}: the provider cannot be set up "
            f"({type(exc).__name__}: {_first_sentence(str(exc))})"
        ) from None

    def resolve(wanted: ModelRef) -> Any:
        if wanted == ref:
            return configured
        return _pydantic_ai_model(wanted, key, base_url, timeout)

    return (
        PydanticAIModel(
            resolve, settings={"timeout": timeout}, provider_spans=settings.provider_spans
        ),
        ref,
    )


def _pydantic_ai_model(ref: ModelRef, key: str | None, base_url: str | None, timeout: float) -> Any:
    classes = _explaining_models()
    if ref.provider in ("openai", "openai-compatible", "openai-responses"):
        from pydantic_ai.providers.openai import OpenAIProvider

        provider = OpenAIProvider(base_url=base_url, api_key=key)
        kind = "responses" if ref.provider == "openai-responses" else "chat"
        model = classes[kind](ref.model_id, provider=provider)
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
            said = _one_line(str(current))
        current = current.__cause__ or current.__context__
    return said


def _provider_said(body: object) -> str | None:
    """The human message in a provider's error body (OpenAI's or Anthropic's shape)."""
    if isinstance(body, str):
        return _one_line(body) if body.strip() else None
    if not isinstance(body, Mapping):
        return None
    error = body.get("error")
    nested = error.get("message") if isinstance(error, Mapping) else None
    for found in (body.get("message"), nested):
        if isinstance(found, str) and found.strip():
            return _one_line(found)
    return None


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _first_sentence(text: str) -> str:
    return _one_line(text).split(". ")[0].rstrip(".")
