"""The gateway's Chat Completions model keeps the usage total a provider reported.

pydantic-ai keeps prompt and completion tokens only, and some providers count thinking tokens
in the total alone (Gemini's OpenAI-compatible endpoint answered 35 + 12 with a total of 109:
``tests/support/provider_replays/chat/empty_tool_call_id.json``). The total goes into
``RequestUsage.details["total_tokens"]``, where `harness_core.models.conversion.token_usage`
reads it, so the ledger records it as reported (D135). pydantic-ai's documented hooks are used:
``_map_usage`` and ``_streamed_response_cls``. The SDK is imported only when a provider is built.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["reporting_totals", "with_reported_total"]


def with_reported_total(mapped: Any, reported: Any) -> Any:
    """`mapped` (a pydantic-ai ``RequestUsage``) with the provider's ``total_tokens``, if any."""
    total = getattr(reported, "total_tokens", None)
    if isinstance(total, int) and not isinstance(total, bool) and total > 0:
        mapped.details = {**mapped.details, "total_tokens": total}
    return mapped


@functools.cache
def reporting_totals(base: type[Any]) -> type[Any]:
    """A subclass of `base` (an ``OpenAIChatModel``) whose usage keeps the reported total."""
    from dataclasses import dataclass

    from pydantic_ai.models.openai import OpenAIStreamedResponse

    @dataclass
    class Streamed(OpenAIStreamedResponse):
        def _map_usage(self, response: Any) -> Any:
            return with_reported_total(super()._map_usage(response), response.usage)

    class Chat(base):  # type: ignore[misc]
        @property
        def _streamed_response_cls(self) -> type[OpenAIStreamedResponse]:
            return Streamed

        def _map_usage(self, response: Any) -> Any:
            return with_reported_total(super()._map_usage(response), response.usage)

    return Chat
