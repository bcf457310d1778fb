"""The base of every durable pydantic type: frozen, closed and JSON-safe."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["Frozen", "invalid_reason", "revalidated"]

_M = TypeVar("_M", bound=BaseModel)


class Frozen(BaseModel):
    """Immutable, closed to unknown fields, finite floats only: the base of every durable type."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


def revalidated(value: _M) -> _M:
    """`value` checked again from its fields.

    A model built with `model_copy(update=...)` or `model_construct`, or nested into another
    model as an instance, skipped validation: a provider's cost can be NaN that way. Values
    that come from outside the harness (providers, tools, hooks, callers) pass here before
    they can reach a record or an entry.

    Raises:
        ValidationError: the value is not valid.
    """
    return type(value).model_validate(value.model_dump())


def invalid_reason(error: ValidationError) -> str:
    """One line naming the first invalid field (never the value: it may be content)."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "value"
    return f"{where}: {first['msg']}"
