"""The configured model: settings -> a `ModelClient` and the `ModelRef` lanes use by default.

``scripted:echo`` needs no key (the demo and tests). Real providers go through pydantic-ai with
the key and base URL from settings; provider SDKs are imported only when one is configured.
"""

from __future__ import annotations

from typing import Any

from config import Settings
from harness_core import (
    ModelClient,
    ModelRef,
    ScriptedModel,
)
from harness_core.models.scripted import echo_responder

__all__ = ["PROVIDERS", "ModelConfigError", "model_from_settings"]

PROVIDERS = ("openai", "openai-responses", "anthropic", "openai-compatible", "scripted")


class ModelConfigError(ValueError):
    """``GATEWAY_MODEL`` does not name a model this gateway can use."""


def model_from_settings(settings: Settings) -> tuple[ModelClient, ModelRef]:
    """The client and default model named by ``GATEWAY_MODEL``.

    Raises:
        ModelConfigError: an unknown provider or a malformed model name.
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

    def resolve(wanted: ModelRef) -> Any:
        return _pydantic_ai_model(wanted, key, base_url)

    return PydanticAIModel(resolve), ref


def _pydantic_ai_model(ref: ModelRef, key: str | None, base_url: str | None) -> Any:
    if ref.provider in ("openai", "openai-compatible", "openai-responses"):
        from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
        from pydantic_ai.providers.openai import OpenAIProvider

        provider = OpenAIProvider(base_url=base_url, api_key=key)
        if ref.provider == "openai-responses":
            return OpenAIResponsesModel(ref.model_id, provider=provider)
        return OpenAIChatModel(ref.model_id, provider=provider)
    if ref.provider == "anthropic":
        from pydantic_ai.models.anthropic import AnthropicModel
        from pydantic_ai.providers.anthropic import AnthropicProvider

        return AnthropicModel(
            ref.model_id, provider=AnthropicProvider(api_key=key, base_url=base_url)
        )
    return None
