"""The base of every durable pydantic type: frozen, closed and JSON-safe."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Frozen"]


class Frozen(BaseModel):
    """Immutable, closed to unknown fields, finite floats only: the base of every durable type."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
