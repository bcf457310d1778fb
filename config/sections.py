"""A channel's settings section: the model its ``[name]`` TOML table and variables fill.

A channel (``adapters/<name>/``) declares one `Section` subclass; `load_settings` reads it from
the ``[<name>]`` table of the TOML file and from ``GATEWAY_<NAME>_<FIELD>`` variables (the
names the settings had before sections, so no deployment changes a variable), and
`Settings.channels` holds it by the channel's name. Every field has a default: a channel whose
section is not configured is off, or on with its defaults (the web channel).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from config.fields import accepted_in

__all__ = ["Section"]


class Section(BaseModel):
    """The base of a channel's settings: frozen, no unknown keys, no NaN, no booleans for numbers.

    `ACCEPTS` gives the words for what a field accepts where its type does not say it well
    (a field's ``json_schema_extra={"accepts": ...}`` does the same, one field at a time).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    ACCEPTS: ClassVar[dict[str, str]] = {}
    EXAMPLES: ClassVar[dict[str, Any]] = {}
    """What the example files show for each field that is unset (or empty) by default."""
    JSON_FIELDS: ClassVar[frozenset[str]] = frozenset()
    """Fields given as JSON in a variable (a table or list of tables in TOML)."""
    JSON_EXAMPLES: ClassVar[dict[str, str]] = {}
    """For each JSON field: what a variable holds, in words, for the error of bad JSON."""

    @classmethod
    def accepted(cls, name: str) -> str:
        """What field `name` accepts, in words."""
        return accepted_in(cls, name, cls.ACCEPTS)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic reads true as 1; a TOML `port = true` is a mistake, not port 1.
        name = info.field_name
        if isinstance(value, bool) and name is not None:
            annotation = cls.model_fields[name].annotation
            if annotation is not bool:
                raise ValueError(f"expected {cls.accepted(name)}, not true or false")
        return value
